"""The models' own time in Pyodide, outside the browser: Python's part of a change, measured closely enough to
see a change of a few percent.

    python tests/benchmarks/bench_models.py --site build/site [--against OTHER_SITE] [--pages load-balancer]

In the page benchmark (bench_pages.py) a change's Python time drifts by a third between two runs of the same
site on this host, so a 5% speed-up of a model cannot be seen there. Here Node runs the site's own Pyodide and
model wheel with nothing else around them: each page is warmed up as the worker warms it (registry.warm_up_values),
then evaluated at the values bench_pages.py types (values_to_try), in rounds. With `--against`, a second Pyodide
runs the other site's wheel in the same Node process and the two take turns, round by round, so both see the
same drift; the figures to read are the median over rounds of B's time ÷ A's (A: --against, B: --site), and
the quickest round of B ÷ the quickest of A.
With `--idle-ms N`, each round instead runs every value twice in each Pyodide, with N ms before every change:
once asleep (a timer: the process idles, as a page does between a reader's changes) and once awake (a busy wait:
the CPU stays on this process), the two in turn. Same values, same code: their ratio is what waking from idle
costs a change on this host, a part of the page benchmark's round trips (which come after idle) that no model
change can remove.
Needs Node (18 or later). Not a test: these figures vary with the machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from kvx.explainers.registry import REGISTRY, warm_up_values

sys.path.insert(0, str(Path(__file__).parent))
from bench_pages import page_config, p95_rank, values_to_try  # noqa: E402  (the values the page benchmark types)

# One Pyodide per wheel; each round runs every page's values once in each, in alternating order.
RUNNER = """
import fs from "fs";
const job = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const { loadPyodide } = await import(job.pyodide + "pyodide.mjs");
const SETUP = `
import json, time
from kvx.explainers.registry import page_json
def warm(slug, changes):
    for c in changes:
        page_json(slug, json.dumps(c), packed=True)
def one(slug, name, v):
    t = time.perf_counter()
    page_json(slug, json.dumps({name: v}), packed=True)
    return (time.perf_counter() - t) * 1000
def one_round(slug, name, values):
    return json.dumps([one(slug, name, v) for v in values])
`;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const spin = (ms) => { const t = performance.now(); while (performance.now() - t < ms); };
// One value at a time from here, N ms of idle (a timer) or of busy waiting before each: --idle-ms.
async function paced(py, page, asleep) {
  const one = py.globals.get("one");
  const out = [];
  for (const v of page.values) {
    if (asleep) await sleep(job.idle_ms); else spin(job.idle_ms);
    out.push(one(page.slug, page.name, v));
  }
  one.destroy();
  return out;
}
// --idle-ms: {asleep, awake}, the first of the two alternating by round.
async function pacedPair(py, page, r) {
  const ms = {};
  for (const asleep of (r % 2 ? [false, true] : [true, false])) ms[asleep ? "asleep" : "awake"] = await paced(py, page, asleep);
  return ms;
}
const pys = [];
for (const wheel of job.wheels) {
  const py = await loadPyodide({ indexURL: job.pyodide });
  py.unpackArchive(new Uint8Array(fs.readFileSync(wheel)), "wheel");
  py.runPython(SETUP);
  pys.push(py);
}
const out = {};
for (const page of job.pages) {
  for (const py of pys) py.globals.get("warm")(page.slug, py.toPy(page.warm));
  out[page.slug] = pys.map(() => []);
  for (let r = 0; r < job.rounds; r++) {
    const order = r % 2 ? [...pys.keys()].reverse() : [...pys.keys()];
    for (const k of order) {
      out[page.slug][k].push(job.idle_ms ? await pacedPair(pys[k], page, r)
        : JSON.parse(pys[k].globals.get("one_round")(page.slug, page.name, pys[k].toPy(page.values))));
    }
  }
}
console.log(JSON.stringify(out));
"""


def site_files(site: Path, slug: str) -> tuple[Path, Path]:
    """The Pyodide folder and the model wheel a built page loads (from its config)."""
    cfg = page_config(site, slug)
    return (site / cfg["pyodide"]).resolve(), (site / cfg["wheel"]).resolve()


def summary(rounds: list[list[float]]) -> dict:
    every = sorted(ms for r in rounds for ms in r)
    return {"median_ms": round(statistics.median(every), 2), "p95_ms": round(every[p95_rank(len(every))], 2),
            "rounds": len(rounds), "changes": len(every)}


def idle_summary(rounds: list[dict]) -> dict:
    """--idle-ms: the same values after idling and after a busy wait, and what the idle added (the median over
    rounds of a round's sum asleep ÷ awake, the two run back to back; and the p95s' ratio)."""
    asleep, awake = summary([r["asleep"] for r in rounds]), summary([r["awake"] for r in rounds])
    ratios = sorted(sum(r["asleep"]) / sum(r["awake"]) for r in rounds)
    return {"asleep": asleep, "awake": awake, "asleep_over_awake_median": round(statistics.median(ratios), 3),
            "asleep_over_awake_range": [round(ratios[0], 3), round(ratios[-1], 3)],
            "p95_asleep_over_awake": round(asleep["p95_ms"] / awake["p95_ms"], 3)}


def print_idle(report: dict, idle_ms: int) -> None:
    print(f"{'page':16s}  {'site':24s}  asleep p50    p95  awake p50    p95  asleep/awake: median (range), p95s"
          f"   (ms of Python a change, {idle_ms} ms before each)")
    for slug, r in report.items():
        for site, e in zip(r["sites"], r["each"]):
            print(f"{slug:16s}  {site[-24:]:24s}  {e['asleep']['median_ms']:10.2f} {e['asleep']['p95_ms']:6.2f}  "
                  f"{e['awake']['median_ms']:9.2f} {e['awake']['p95_ms']:6.2f}  {e['asleep_over_awake_median']:.3f} "
                  f"({e['asleep_over_awake_range'][0]:.3f}-{e['asleep_over_awake_range'][1]:.3f}), "
                  f"{e['p95_asleep_over_awake']:.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", default="build/site")
    ap.add_argument("--against", default="", help="another built site: its wheel is A, --site's is B")
    ap.add_argument("--pages", default="", help="comma-separated slugs (default: every page)")
    ap.add_argument("--changes", type=int, default=20, help="values per round (bench_pages.py's values_to_try)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--idle-ms", type=int, default=0,
                    help="pause before every change, asleep and awake in turn (see above); 0: back to back")
    ap.add_argument("--out", default="test-results/bench-models")
    args = ap.parse_args()
    slugs = [s for s in args.pages.split(",") if s] or sorted(REGISTRY)
    sites = [Path(args.against), Path(args.site)] if args.against else [Path(args.site)]
    pyodide = site_files(sites[0], slugs[0])[0]
    pages = []
    for slug in slugs:
        name, values = values_to_try(slug, args.changes)
        pages.append({"slug": slug, "name": name, "values": values, "warm": warm_up_values(slug)})
    job = {"pyodide": f"{pyodide}/", "wheels": [str(site_files(s, slugs[0])[1]) for s in sites], "pages": pages,
           "rounds": args.rounds, "idle_ms": args.idle_ms}
    with tempfile.TemporaryDirectory() as tmp:
        runner, spec = Path(tmp) / "runner.mjs", Path(tmp) / "job.json"
        runner.write_text(RUNNER)
        spec.write_text(json.dumps(job))
        done = subprocess.run(["node", str(runner), str(spec)], capture_output=True, text=True, check=False)
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
        return 1
    times = json.loads(done.stdout.strip().splitlines()[-1])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.idle_ms:
        report = {slug: {"sites": [str(s) for s in sites], "idle_ms": args.idle_ms,
                         "each": [idle_summary(r) for r in per_wheel]} for slug, per_wheel in times.items()}
        (out / "bench-models-idle.json").write_text(json.dumps(report, indent=1) + "\n")
        print_idle(report, args.idle_ms)
        return 0
    report = {}
    for slug, per_wheel in times.items():
        report[slug] = {"sites": [str(s) for s in sites], "each": [summary(r) for r in per_wheel]}
        if len(per_wheel) == 2:
            ratios = sorted(sum(b) / sum(a) for a, b in zip(*per_wheel))
            report[slug]["b_over_a_median"] = round(statistics.median(ratios), 3)
            report[slug]["b_over_a_range"] = [round(ratios[0], 3), round(ratios[-1], 3)]
            # The quickest round of each: steal time on a shared host only ever adds, so on a noisy hour this is
            # the steadier of the two figures.
            report[slug]["b_over_a_quickest"] = round(min(map(sum, per_wheel[1])) / min(map(sum, per_wheel[0])), 3)
    (out / "bench-models.json").write_text(json.dumps(report, indent=1) + "\n")
    heads = ["A p50", "A p95", "B p50", "B p95", "B/A: median (range), quickest"] if len(sites) == 2 else ["p50", "p95"]
    print(f"{'page':16s}  " + "  ".join(f"{h:>6s}" for h in heads) + "   (ms of Python a change)")
    for slug, r in report.items():
        cells = "  ".join(f"{e['median_ms']:6.2f}  {e['p95_ms']:6.2f}" for e in r["each"])
        ratio = (f"   {r['b_over_a_median']:.3f} ({r['b_over_a_range'][0]:.3f}-{r['b_over_a_range'][1]:.3f}), "
                 f"{r['b_over_a_quickest']:.3f}") if "b_over_a_median" in r else ""
        print(f"{slug:16s}  {cells}{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
