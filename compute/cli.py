"""The `kvx` command: list and run explainer models, build the site, serve it with the API.

    kvx list [--json]
    kvx run SLUG name=value ... [--json] [--trace FILE]
    kvx bake [SLUG ...]
    kvx build [OUT]
    kvx serve [--host 127.0.0.1] [--port 8000] [--site build/site]
    kvx train NAME [--steps N] [--threads N] [--seed N] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvx.explainers.core.params import ParamError
from kvx.explainers.registry import REGISTRY, run

DEFAULT_SITE = Path("build/site")


def cmd_list(args) -> int:
    described = [e.describe() for e in REGISTRY.values()]
    if args.json:
        print(json.dumps(described, indent=2))
        return 0
    for e in described:
        print(f"{e['slug']}  ({e['level']})  {e['title']}")
        for p in e["parameters"]:
            bounds = f"one of {', '.join(p['choices'])}" if p["choices"] else f"{p['min']:g} to {p['max']:g}"
            print(f"    {p['name']} = {p['default']}  [{p['unit'] or '-'}; {bounds}]  {p['help']}")
    return 0


def _pairs(items: list[str]) -> dict[str, str]:
    values = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ParamError(item, f"Parameters are given as name=value; got {item!r}.")
        values[name.strip()] = value.strip()
    return values


def cmd_run(args) -> int:
    if args.slug not in REGISTRY:
        print(f"kvx: there is no explainer {args.slug!r}; the explainers are {', '.join(REGISTRY)}.", file=sys.stderr)
        return 2
    try:
        values = _pairs(args.params)
        if args.trace is not None:
            if "trace" not in REGISTRY[args.slug].uploads:
                print(f"kvx: {args.slug} takes no trace file.", file=sys.stderr)
                return 2
            try:
                values["_trace"] = Path(args.trace).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                print(f"kvx: cannot read the trace {args.trace}: {err}", file=sys.stderr)
                return 2
        out = run(args.slug, values)
    except ParamError as err:
        print(f"kvx: {err}", file=sys.stderr)
        return 2
    if args.json:
        try:
            text = json.dumps(out, indent=2, allow_nan=False)      # strict JSON, as the API and the page send
        except ValueError:
            print(f"kvx: the {args.slug} model returned a number that is not finite (NaN or infinity) for these "
                  f"parameters; this is a bug in the model, please report it with the parameters.", file=sys.stderr)
            return 1
        print(text)
        return 0
    width = max(len(k) for k in out)
    for key, value in out.items():
        shown = f"{value:,.6g}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else value
        print(f"{key:<{width}}  {shown}")
    return 0


def cmd_build(args) -> int:
    from kvx.site.build import build   # imports bokeh: only when building
    out = build(Path(args.out))
    print(f"built {out}")
    return 0


def cmd_serve(args) -> int:
    import uvicorn

    from kvx.compute.app import create_app
    from kvx.compute.serving import server_config
    from kvx.compute.settings import Settings

    settings = Settings(site_dir=Path(args.site)) if args.site else Settings()
    config = server_config(create_app(settings), host=args.host, port=args.port)   # timeouts, caps: see serving.py
    print(f"kvx: serving {settings.site_dir} and the API on http://{args.host}:{args.port}/ (docs at /docs)")
    uvicorn.Server(config).run()
    return 0


def cmd_train(args) -> int:
    import dataclasses

    from kvx.compute.lm.train import CHECKPOINTS, CONFIGS, STEPS, TrainSettings, train
    if args.name not in CONFIGS:
        print(f"kvx: there is no model {args.name!r}; the models are {', '.join(CONFIGS)}.", file=sys.stderr)
        return 2
    overrides = {k: v for k, v in (("steps", args.steps or STEPS[args.name]), ("threads", args.threads),
                                   ("seed", args.seed)) if v is not None}
    train(args.name, dataclasses.replace(TrainSettings(), **overrides), Path(args.out or CHECKPOINTS))
    return 0


def cmd_bake(args) -> int:
    from kvx.compute.bake import BAKERS, write
    unknown = [s for s in args.slugs if s not in BAKERS]
    if unknown:
        print(f"kvx: nothing to bake for {', '.join(unknown)}; the pages with kernel results are "
              f"{', '.join(BAKERS)}.", file=sys.stderr)
        return 2
    for slug in args.slugs or BAKERS:
        print(f"baked {slug} -> {write(slug)}")
    return 0


def cmd_build_kernels(args) -> int:
    """Compile the fused CPU kernels the server loads (it never compiles them itself). A shape that cannot be
    built is said and skipped: the server then runs the PyTorch kernel."""
    try:
        from kvx.site.native import build_all
    except ImportError as err:                    # PyTorch absent: there is nothing to build for
        print(f"no kernels to build: {err}")
        return 0
    for (latent, rope), where in build_all([tuple(w) for w in args.mla]).items():
        print(f"mla latent {latent}, rope {rope}: {where}")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kvx", description="KV-cache explainers you can run.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="list the explainers and their parameters")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("run", help="evaluate an explainer's model: kvx run SLUG name=value ...")
    p.add_argument("slug")
    p.add_argument("params", nargs="*", metavar="name=value")
    p.add_argument("--json", action="store_true")
    p.add_argument("--trace", metavar="FILE", help="a Mooncake-format trace (JSONL) for explainers that replay one")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("bake", help="run the real kernels for the pages that draw their results")
    p.add_argument("slugs", nargs="*", metavar="SLUG")
    p.set_defaults(func=cmd_bake)
    p = sub.add_parser("build", help="build the static site")
    p.add_argument("out", nargs="?", default=str(DEFAULT_SITE))
    p.set_defaults(func=cmd_build)
    p = sub.add_parser("serve", help="serve the built site at / and the API at /api/v1")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--site", default=None, help="the built site (default: $KVX_SITE_DIR or build/site)")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("build-kernels", help="compile the server's fused CPU kernels for this machine (needs cc)")
    p.add_argument("--mla", nargs=2, type=int, action="append", default=[], metavar=("LATENT", "ROPE"),
                   help="also build the MLA kernel for this latent and RoPE width")
    p.set_defaults(func=cmd_build_kernels)
    p = sub.add_parser("train", help="train one of the project's tiny models (deterministic; needs torch)")
    p.add_argument("name")
    p.add_argument("--steps", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--out", default=None, help="checkpoint folder (default compute/lm/checkpoints)")
    p.set_defaults(func=cmd_train)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
