"""Builds the static site: index (the reading path), glossary, and one page per explainer.

Each explainer page is its view's Bokeh layout, filled with data baked from the model's defaults so
the plot draws before Python starts, plus the narrative from its page.md and a JSON config that
tells the page runtime (static/kvx-page.js) which worker and wheel to load.
"""
from __future__ import annotations

import datetime
import importlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import jinja2
import markdown

from kvx.compute import VERSION
from kvx.explainers.core import baked
from kvx.explainers.registry import LEVELS, REGISTRY, Explainer
from kvx.compute.security import headers_file
from kvx.site import assets
from kvx.site.dom_layout import embed
from kvx.site.model_wheel import build_model_wheel
from kvx.site import widgets
from kvx.site.snapshot import make_snapshot
from kvx.site.vendor import PYODIDE_VERSION, vendor_bokeh, vendor_pyodide

SITE_DIR = Path(__file__).parent
STATIC_DIR = SITE_DIR.parent / "static"
RUNTIME = ("kvx-page.js", "kvx-worker.mjs", "kvx.css")     # loaded by every page: content-hashed
_MD_EXTENSIONS = ["attr_list", "tables"]


@dataclass(frozen=True)
class Term:
    id: str
    title: str
    html: str
    used_in: tuple


def explainer_dir(e: Explainer) -> Path:
    return SITE_DIR.parent / "explainers" / e.slug.replace("-", "_")


def sections(md_text: str) -> dict[str, str]:
    """page.md split at its `## ` headings: {lowercased heading: rendered HTML}."""
    parts = re.split(r"^## +(.+)$", md_text, flags=re.M)
    return {title.strip().lower(): markdown.markdown(body, extensions=_MD_EXTENSIONS)
            for title, body in zip(parts[1::2], parts[2::2])}


def glossary_terms() -> list[Term]:
    text = (SITE_DIR / "glossary.md").read_text()
    terms = []
    for title, anchor, body in re.findall(r"^## +(.+?) \{#([\w-]+)\}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S):
        used = tuple(e for e in REGISTRY.values() if anchor in e.glossary)
        terms.append(Term(anchor, title, markdown.markdown(body.strip()), used))
    return terms


def _json_for_script(obj) -> str:
    return json.dumps(obj, separators=(",", ":")).replace("</", "<\\/")


def bake_measurement(e: Explainer, params, data: dict) -> None:
    """Pages with "run it here" show a measurement made at build time until a server is reachable."""
    if "run" not in data or e.describe_run is None:
        return
    try:
        from kvx.compute.kernel_specs import run_locally
    except ImportError:            # PyTorch absent: say so rather than show nothing
        data["texts"] = {**data.get("texts", {}), "run_result":
                         "No measurement was baked into this build (PyTorch was not installed when it was built)."}
        return
    reply = run_locally(data["run"]["kernel"], data["run"]["request"])
    when = datetime.date.today().isoformat()
    data["texts"] = {**data.get("texts", {}),
                     "run_result": f"Baked when the site was built ({when}), for the default settings. "
                                   + e.describe_run(params, reply)}


def fresh_bakes() -> dict[str, str]:
    """Run the real kernels for every page that draws their results; the fresh results replace the
    committed copies in this build's wheel and baked page data. Without PyTorch, the committed copies
    (each labelled with the device and date it was baked on) are used as they are."""
    try:
        from kvx.compute.bake import BAKERS, bake
    except ImportError:
        return {}
    out = {}
    for slug in BAKERS:
        data = bake(slug)
        baked.override(slug, data)
        out[baked.wheel_path(slug)] = json.dumps(data, sort_keys=True)
    return out


def render_explainer(env: jinja2.Environment, e: Explainer, bokeh_js: list[str], paths: dict[str, str],
                     terms: dict[str, Term]) -> str:
    """paths: site-relative URLs of the hashed assets: the runtime's files by name, "wheel", "pyodide"."""
    params = e.params()
    data = e.page_data(params)
    bake_measurement(e, params, data)
    view = importlib.import_module(f"kvx.explainers.{e.slug.replace('-', '_')}.view")
    script, div = embed(widgets.calm_plots(view.layout(e.params, params.as_dict(), data)), data.get("texts", {}))
    config = {
        "slug": e.slug,
        "defaults": params.as_dict(),
        "params": e.params.describe(),       # the controls' specs: labels, bounds, which may be left empty
        "baked": data,
        "worker": paths["kvx-worker.mjs"],
        "pyodide": paths["pyodide"],
        "wheel": paths["wheel"],
        "snapshot": paths.get("snapshot"),      # None: the build could not make one; the worker boots normally
        "api": "api/v1",                     # same origin: `kvx serve` puts the API beside the site
    }
    return env.get_template("explainer.html").render(
        e=e, version=VERSION, bokeh_js=bokeh_js, bokeh_script=script, bokeh_div=div, baked=data,
        config_json=_json_for_script(config), sections=sections((explainer_dir(e) / "page.md").read_text()),
        glossary_terms=[terms[t] for t in e.glossary])


def build(out: Path) -> Path:
    out = Path(out)
    for name in ("vendor", "static", "wheels", "api", assets.ASSETS):
        shutil.rmtree(out / name, ignore_errors=True)
    for old in out.glob("*.html"):
        old.unlink()
    out.mkdir(parents=True, exist_ok=True)
    vendor_pyodide(out / "vendor" / "pyodide")
    paths = {"pyodide": assets.hashed_dir(out / "vendor" / "pyodide", out, f"pyodide-{PYODIDE_VERSION}") + "/"}
    names = vendor_bokeh(out / "vendor" / "bokeh")
    bokeh_dir = assets.hashed_dir(out / "vendor" / "bokeh", out, "bokeh")
    bokeh_js = [f"{bokeh_dir}/{name}" for name in names]
    (out / "vendor").rmdir()
    wheel = build_model_wheel(out / "wheels", VERSION, fresh_bakes())
    paths["wheel"] = f"{assets.hashed_dir(out / 'wheels', out, 'models')}/{wheel.name}"
    for name in RUNTIME:
        paths[name] = assets.hashed_file(STATIC_DIR / name, out)
    snapshot = make_snapshot(out / paths["pyodide"], out / paths["wheel"], out / "python.snapshot")
    if snapshot is not None:
        paths["snapshot"] = assets.hashed_file(snapshot, out)
        snapshot.unlink()
    shutil.copytree(STATIC_DIR, out / "static")          # the favicon and images, by name (short-lived cache)
    # On a plain static host the pages' probe for a compute server finds this file instead of a 404
    # (which the browser would log as an error); under `kvx serve` the real endpoint answers first.
    health = out / "api" / "v1" / "health"
    health.parent.mkdir(parents=True, exist_ok=True)
    health.write_text(json.dumps({"status": "static", "message": "This copy of the site has no kvx compute "
                                  "server; pages show the measurements baked when it was built."}))

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(SITE_DIR / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.globals["asset"] = paths
    terms = glossary_terms()
    by_id = {t.id: t for t in terms}
    for e in REGISTRY.values():
        (out / f"{e.slug}.html").write_text(render_explainer(env, e, bokeh_js, paths, by_id))
    path = [(level, [e for e in REGISTRY.values() if e.level == level]) for level in LEVELS]
    (out / "index.html").write_text(env.get_template("index.html").render(path=path, version=VERSION))
    (out / "glossary.html").write_text(env.get_template("glossary.html").render(terms=terms, version=VERSION))
    made = assets.precompress(out)
    if not made["br"]:
        print("kvx build: brotli is not installed, so the site has gzip copies only (pip install brotli)")
    # One file for static hosts: each page's Content-Security-Policy and every path's caching.
    (out / "_headers").write_text(headers_file(out) + assets.cache_rules(out))
    return out
