"""Page speed, measured in headless Chromium against a baseline taken in the same run.

    python tests/benchmarks/bench_pages.py --site build/site [--changes 40] [--pages paging,eviction] [--out test-results/bench]

For each explainer page, in a fresh persistent browser profile (a disk cache, as a reader's browser has):
time to the first screen drawn (the page draws the plots below it once Python is ready: kvx-page.js,
firstScreenFirst) and to every plot drawn; time to Python-ready, cold; the first control change (1 s after ready, as a reader's
comes) against the median of the rest and against its twin, the same change once more at the end (the page's
opening value back, then the first value again, each after the same second of reading: the warm-up should make
first and twin equal; values the model refuses are skipped, and pages whose values repeat hit the model's caches
in "the rest"); the round trip of a control change (median and
p95, from the change sent to its reply applied to the plots' sources, and on to the end of the frame that shows it,
"on screen"; with Python's part; by default each change comes once the previous one is on screen, `--pace
read` a second after that (as the first comes after ready), `--pace back-to-back` as soon as the previous reply is
applied); around the changes, how fast the host was
(host_probe: round trips are absolute, and this host's speed drifts); a reload ("warm"); then another page in the same profile ("second page"), with the bytes each load
took on the wire (counted at the server: the page's and its worker's requests, compressed as sent;
cache hits count 0). The baseline is a bare page whose module worker only loads Pyodide core, served with
the same cache and compression rules, loaded cold in its own fresh profile right before each page (the
machine's load drifts), so "ready / baseline" is our overhead over (or saving under) the floor. One such pair says
little on a host whose speed drifts by half between minutes, so `--cold-pairs N` (default 3) loads each page cold N
times, each right after its own bare boot, and reports the median of the N ratios, the median of the N first
changes (one per cold load) against the rest, and the round trips of all N loads' changes together (each load's p95
beside them). Writes bench.json and prints a table.
Not a test: these figures vary with the machine; the ratios are what to compare.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import uvicorn
from playwright.sync_api import TimeoutError as PlaywrightTimeout, sync_playwright

from kvx.compute.app import create_app
from kvx.compute.serving import BytesSent as Wire      # bytes sent, counted at the server
from kvx.compute.settings import Settings
from kvx.explainers.registry import REGISTRY, page_json

sys.path.insert(0, str(Path(__file__).parents[1] / "browser"))
from pagehooks import set_control  # noqa: E402  (the browser tests' reader-like typing)

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

BASELINE_HTML = """<!doctype html><html><body><script type="module">
const t0 = performance.now();
const w = new Worker(new URL("bench-baseline-worker.mjs", location.href), {type: "module"});
w.onmessage = () => { document.documentElement.dataset.pyReadyMs = String(Math.round(performance.now()));
                      document.documentElement.setAttribute("data-py-ready", ""); };
</script></body></html>"""
BASELINE_WORKER = """const dir = new URL("./PYODIDE/", import.meta.url).href;
const { loadPyodide } = await import(dir + "pyodide.mjs");
await loadPyodide({indexURL: dir});
self.postMessage("ready");"""


def serve(site: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    wire = Wire(create_app(Settings(site_dir=site)))
    server = uvicorn.Server(uvicorn.Config(wire, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}", wire


# Between the typed value and its Enter, as between a reader's keys: a fast typist's come about 100 ms apart,
# and this is faster. With none (Playwright's fill and press, 2-5 ms apart), the browser took in the focus, the
# typing and the Enter in one burst, and the page's first change paid for the first time of all three: 6.1 against
# 3.7 ms for the rest on prompt-caching (on screen 37.0 against 23.7), 4.5 against 3.9 (28.6 against 26.9) with
# this gap, over seven cold loads each. The keys are typed this far apart too (pagehooks.set_control), after a click
# into the box: filled at once, the Enter was the page's first keydown, whose restyling of the focused box put a
# frame into the first change's round trip alone.
KEY_GAP_MS = 60
READING_MS = 1000      # a reader's moment between seeing a value and changing the next (settle, the "read" pace)

TIMEOUTS: list[dict] = []      # loads that never became ready: counted in the report, then retried once


def ready_ms(page, url: str, retry: bool = True) -> dict:
    page.goto(url)
    try:
        page.wait_for_selector("html[data-py-ready]", state="attached", timeout=90_000)
    except PlaywrightTimeout:
        TIMEOUTS.append({"url": url, "status": page.locator("#kvx-status").inner_text() if page.locator(
            "#kvx-status").count() else ""})
        if not retry:
            raise
        return ready_ms(page, url, retry=False)
    drawn = page.evaluate("Number(document.documentElement.getAttribute('data-kvx-drawn')) || null")
    return {"first_screen_ms": drawn, "py_ready_ms": int(page.evaluate("Number(document.documentElement.dataset.pyReadyMs)")),
            "boot": page.evaluate("document.documentElement.dataset.kvxBoot || null")}


def all_plots_ms(page) -> int:
    """When the page had drawn every plot, the ones below its first screen too (ms since navigation)."""
    page.wait_for_selector("html[data-kvx-all-drawn]", state="attached", timeout=30_000)
    return int(page.evaluate("Number(document.documentElement.dataset.kvxAllDrawn)"))


def _spread(spec: dict, changes: int) -> list[str]:
    """Distinct values from just above the default to four times it (or the maximum), spread out."""
    lo = spec["default"]
    hi = min(spec["max"], lo * 4) if lo > 0 else spec["max"]
    if spec["kind"] == "integer":
        hi = max(lo + 2, hi)
        raw = [str(lo + 1 + i * 997 % (hi - lo)) for i in range(changes)]
    else:
        raw = [repr(round(lo + (hi - lo) * (0.05 + 0.95 * (i * 0.6180339887 % 1)), 3)) for i in range(changes)]
    return list(dict.fromkeys(raw))


def values_to_try(slug: str, changes: int) -> tuple[str, list[str]]:
    """A parameter and a new value for each change, all different where the page allows it: a repeated value
    would be answered from the model's caches, and a value equal to the last fires no change event.

    The first integer parameter with `changes` distinct values the model accepts (CPython's page_json decides,
    the same model the page runs); else the integer or number parameter with the most; else a choice."""
    specs = REGISTRY[slug].params.describe()
    best = ("", [])
    for spec in specs:
        if spec["kind"] not in ("integer", "number") or spec["default"] is None or spec["default"] < 0:
            continue
        ok = [v for v in _spread(spec, changes) if json.loads(page_json(slug, json.dumps({spec["name"]: v})))["ok"]]
        if len(ok) >= changes and spec["kind"] == "integer":
            return spec["name"], ok[:changes]
        if len(ok) > len(best[1]):
            best = (spec["name"], ok)
    name, ok = best
    if len(ok) >= 2:
        return name, [ok[i % len(ok)] for i in range(changes)]
    spec = next(s for s in specs if s["choices"])
    ring = [c for c in spec["choices"] if c != spec["default"]] + [spec["default"]]
    ring = [c for c in ring if json.loads(page_json(slug, json.dumps({spec["name"]: c})))["ok"]]
    return spec["name"], [ring[i % len(ring)] for i in range(changes)]


def opening_value(slug: str, name: str) -> str:
    """The parameter's value as the page opens with it, typed as values_to_try types its values."""
    spec = next(s for s in REGISTRY[slug].params.describe() if s["name"] == name)
    return repr(spec["default"]) if spec["kind"] == "number" else str(spec["default"])


def round_trips(page, slug: str, changes: int, pace: str = "settled", twin: bool = False,
                before_twin=None) -> dict:
    """Each change's round trip, ms, from the change the page sends: to its reply applied to the plots' sources
    ("applied": the round trip as issue 16 counts it, before BokehJS takes the data in and repaints), and to the
    end of the frame that shows it ("painted": what a reader waits for; kvx-page.js, afterNextFrame); and
    Python's part (the model's time in the worker, as it reports). Each change is typed into its box as a reader
    types it (click, type, a pause of KEY_GAP_MS, Enter).

    "settled": each change comes once the previous one is on screen, as a reader's next typed value does.
    "back-to-back": each change comes as soon as the previous reply is applied, while the page is still drawing
    it, so the two compete: a measure of throughput more than latency.
    "read": each change comes READING_MS after the previous one is on screen, as the first comes after ready
    (settle): the rest then wake the page and its worker from the same idle as the first, so first against rest
    compares cold code against warm code, not idle against busy.

    `twin`: the first change made once more at the end, kept apart ("twin": applied, painted, python, parts):
    the page's opening value back, then the first value, each READING_MS after the last is on screen, as the first
    came. It is the one like-for-like of a first change, warm: the same value from the same plots, so the same
    Python and the same drawing. A first value costs what it costs (on mla, 4097 from 4096 took 5.4 ms warm, the
    rest's values 4.65), which "the rest" cannot tell from a cost of being first; first less twin can. Where the
    model keeps its answers, the twin's Python is answered from them: compare the parts outside Python.
    `before_twin(page)`: called right before the twin's change (after_collection.py puts a collection there)."""
    name, values = values_to_try(slug, changes)
    opening = opening_value(slug, name)
    twin = twin and values[0] != opening
    page.evaluate("window.kvx.timings.length = 0; window.kvx.parts.length = 0; window.kvx.painted.length = 0")
    python = []

    def change(value: str, pace: str) -> None:
        before = page.evaluate("[Number(document.documentElement.dataset.kvxApplied || 0), "
                               "Number(document.documentElement.dataset.kvxPainted || 0)]")
        set_control(page, name, value, slug, pause_ms=KEY_GAP_MS)     # as a reader does: type, then Enter
        page.wait_for_function(f"Number(document.documentElement.dataset.kvxApplied || 0) > {before[0]}")
        python.append(page.evaluate("window.kvx.state.pythonMs"))
        if pace in ("settled", "read"):
            page.wait_for_function(f"Number(document.documentElement.dataset.kvxPainted || 0) > {before[1]}")
        if pace == "read":
            page.wait_for_timeout(READING_MS)

    for value in values:
        change(value, pace)
    if pace == "back-to-back":
        page.wait_for_function(f"window.kvx.painted.length >= {len(values)}")
        page.wait_for_timeout(READING_MS)
    if twin:
        if values[-1] != opening:              # an equal value fires no change
            change(opening, "read")
        if before_twin:
            before_twin(page)
        change(values[0], "read")
    out = {"painted": page.evaluate("Array.from(window.kvx.painted)"),
           "applied": page.evaluate("Array.from(window.kvx.timings)"), "python": python,
           "parts": page.evaluate("Array.from(window.kvx.parts)"),
           "control": name, "values": values}
    if twin:
        out["twin"] = {kind: out[kind][-1] for kind in ("applied", "painted", "python", "parts")}
        for kind in ("applied", "painted", "python", "parts"):
            del out[kind][len(values):]            # the opening value's change and the twin: kept out of the rest
    return out


def frame_trips(page, steps: int) -> list[float] | None:
    """Round trip of one animation step, ms: for on-demand frames, from the step asked for to the end of the frame
    that shows it; for the others, the step's own drawing (the page draws it at once, from data it holds)."""
    mode = page.evaluate("window.kvx.state.data.animation && window.kvx.state.data.animation.mode")
    if mode is None:
        return None
    page.evaluate("window.kvx.anim.reset()")
    page.wait_for_timeout(500)
    out = []
    for _ in range(steps):
        if mode == "on_demand":
            before = page.evaluate("Number(document.documentElement.dataset.kvxFramePainted || 0)")
            t0 = page.evaluate("performance.now()")
            page.evaluate("window.kvx.anim.step()")
            page.wait_for_function(f"Number(document.documentElement.dataset.kvxFramePainted || 0) > {before}")
            out.append(page.evaluate("window.kvx.state.framePaintedAt") - t0)
            continue
        else:
            t0 = page.evaluate("performance.now()")
            page.evaluate("window.kvx.anim.step()")
        out.append(page.evaluate("performance.now()") - t0)
    return out


def page_config(site: Path, slug: str) -> dict:
    """The runtime's config a built page carries (its kvx-config script): the assets it loads, among the rest."""
    return json.loads((site / f"{slug}.html").read_text().split('id="kvx-config">', 1)[1].split("</script>", 1)[0])


def first_load_bytes(site: Path, slug: str) -> int:
    """What a first visit downloads before compression: the page and every asset it names."""
    html, cfg = site / f"{slug}.html", page_config(site, slug)
    assets = [p for p in (site / "assets").rglob("*") if p.is_file() and p.suffix not in {".gz", ".br"}]
    return html.stat().st_size + sum(p.stat().st_size for p in assets
                                     if cfg["snapshot"] or ".snapshot" not in p.name)


def host_probe() -> float:
    """This machine's speed right now, ms: the median of nine CPython replays of the load balancer's heaviest
    synthetic trace (64 sessions) under the cache-aware router, the work behind the slowest changes, after one
    to fill the model's caches. Round trips are absolute and this host's speed drifts (the same replay took
    3.4-5.8 ms within four seconds), so a page's changes are bracketed by a probe before and one after."""
    from kvx.explainers.load_balancer import model
    p = model.LoadBalancerParams(sessions=64)
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        model.simulate(p, model.BY_KEY["cache_aware"])
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times[1:]) * 1000, 2)


def p95_rank(n: int) -> int:
    """Where the p95 of n times sorted quickest first is (the benchmarks' one definition of it)."""
    return int(0.95 * (n - 1))


def stats(trips: list[float]) -> dict:
    trips = sorted(trips)
    return {"median": round(statistics.median(trips), 2), "p95": round(trips[p95_rank(len(trips))], 2),
            "n": len(trips)}


def launch(p, profile: Path):
    return p.chromium.launch_persistent_context(str(profile), executable_path="/usr/bin/chromium", args=ARGS,
                                                headless=True)


def settle(page) -> None:
    """What comes before a reader's first change: a moment of reading (1 s after ready, not milliseconds), and
    here also Playwright's own helpers (its selector engine, its polling of a predicate), which are compiled in the
    page on their first use, on the page's main thread, where they held up the first change's reply (2.6-8.9 ms in
    four loads of six): they run once on something read-only, since a reader's page has no harness to pay for."""
    page.wait_for_timeout(READING_MS)
    page.locator(".bk-input-group input").first.input_value()
    page.wait_for_function("Number(document.documentElement.dataset.kvxApplied || 0) >= 0")


def measure(p, base: str, slug: str, other: str, changes: int, profile: Path, wire: Wire, pace: str) -> dict:
    ctx = launch(p, profile)
    page = ctx.pages[0] if ctx.pages else ctx.new_page()
    wire.take()
    cold = ready_ms(page, f"{base}/{slug}.html")
    cold_bytes = wire.take()
    settle(page)
    probe = [host_probe()]
    trips = round_trips(page, slug, changes, pace, twin=True)
    probe.append(host_probe())
    cold["all_plots_ms"] = all_plots_ms(page)
    frames = frame_trips(page, 30)
    wire.take()
    warm = ready_ms(page, f"{base}/{slug}.html")
    warm_bytes = wire.take()
    # A second first change, after the reload: one sample per load says little against the median of the rest.
    settle(page)
    reload_first = round_trips(page, slug, 1, pace)["applied"]
    wire.take()
    second = ready_ms(page, f"{base}/{other}.html")
    second_bytes = wire.take()
    ctx.close()
    return {
        "cold": cold, "warm": warm, "second_page": {**second, "page": other, "wire_bytes": second_bytes},
        "wire_bytes": {"cold": cold_bytes, "warm": warm_bytes, "second_page": second_bytes},
        "host_probe_ms": probe,
        "first_change_after_reload_ms": round(reload_first[0], 2),
        "frame_step_ms": None if not frames else stats(frames),
        "trips": trips,                             # their figures and first change: pooled(), with the other loads'
    }


def cold_again(p, base: str, slug: str, profile: Path, pace: str, changes: int) -> tuple[dict, dict]:
    """One more cold load of the page in a fresh profile, and its changes (after the same settling), the same as
    the first load's: its first change is one more sample of the first change, and all of them more samples of the
    round trip."""
    ctx = launch(p, profile)
    page = ctx.pages[0] if ctx.pages else ctx.new_page()
    cold = ready_ms(page, f"{base}/{slug}.html")
    settle(page)
    trips = round_trips(page, slug, changes, pace, twin=True)
    cold["all_plots_ms"] = all_plots_ms(page)
    ctx.close()
    return cold, trips


def first_against_twin(differences: list[float]) -> dict:
    """Is a first change slower than its twin? One difference a cold load (first less twin, ms). The sign test,
    one-sided: the chance of at least this many loads' firsts above their twins if first and twin were alike
    (ties dropped). The issue's "no slower than the rest" is met when that chance is not small (p ≥ 0.05): with
    8 loads, 7 firsts above their twins would fail it. Under 5 loads not even all of them above could, so there
    the answer is None: too few loads to tell. The median difference says by how much, and `upper_95_ms` how
    much slower the first could be: the 95% upper confidence bound of the median difference, distribution-free
    (the k-th smallest difference, k the least with P(Binomial(n, 1/2) < k) ≥ 0.95; for 6 loads the largest)."""
    above = sum(d > 0 for d in differences)
    n = sum(d != 0 for d in differences)
    p = sum(math.comb(n, k) for k in range(above, n + 1)) / 2 ** n if n else 1.0
    total, k = len(differences), 0
    below = 0.0                       # P(Binomial(total, 1/2) < k)
    while k < total and below < 0.95:
        below += math.comb(total, k) / 2 ** total
        k += 1
    upper = sorted(differences)[k - 1] if below >= 0.95 else None
    return {"median_ms": round(statistics.median(differences), 2), "loads": len(differences), "above": above,
            "sign_test_p": round(p, 3), "no_slower": p >= 0.05 if n >= 5 else None,
            "upper_95_ms": None if upper is None else round(upper, 2)}


def pooled(r: dict, more: list[dict]) -> None:
    """The round trips of every cold load together: one load's 40 changes give a p95 that is their second slowest,
    which moved by a quarter between identical runs on this host; three loads' 120 give their seventh slowest. Each
    load's own p95 is kept beside it. The first change is one sample a load: each load's, and their median."""
    loads = [r.pop("trips")] + more
    for each, median, kind in (("first_changes_cold_ms", "first_change_ms", "applied"),
                               ("first_changes_cold_painted_ms", "first_change_painted_ms", "painted"),
                               ("first_changes_cold_python_ms", "first_change_python_ms", "python")):
        r[each] = [round(load[kind][0], 2) for load in loads]
        r[median] = round(statistics.median(r[each]), 2)
    twins = [(load["applied"][0], load["twin"]) for load in loads if "twin" in load]
    if twins:                                    # the first change once more, at the end of each load
        r["twin_ms"] = round(statistics.median(t["applied"] for _, t in twins), 2)
        r["twin_painted_ms"] = round(statistics.median(t["painted"] for _, t in twins), 2)
        r["first_less_twin_ms"] = [round(first - t["applied"], 2) for first, t in twins]
        r["first_less_twin"] = first_against_twin(r["first_less_twin_ms"])
        # The same less Python's part: where the model keeps its answers, the twin's Python is a lookup.
        r["first_less_twin_page_ms"] = [round((load["applied"][0] - load["python"][0])
                                              - (load["twin"]["applied"] - load["twin"]["python"]), 2)
                                        for load in loads if "twin" in load]
        r["first_less_twin_page"] = first_against_twin(r["first_less_twin_page_ms"])
        r["first_less_twin_parts_ms"] = {
            name: round(statistics.median(load["parts"][0][name] - load["twin"]["parts"][name]
                                          for load in loads if "twin" in load), 2)
            for name in loads[0]["parts"][0]}
    for key, kind in (("round_trip_ms", "applied"), ("painted_ms", "painted"), ("python_ms", "python")):
        r[key] = stats([t for load in loads for t in load[kind]])
    r["round_trip_p95_by_load_ms"] = [stats(load["applied"])["p95"] for load in loads]
    # The changes at and above the p95, with their values: is the tail the model's largest inputs (the same values
    # in every load) or the host's hiccups (any value)?
    every = sorted(((t, py, v) for load in loads for t, py, v in zip(load["applied"], load["python"], load["values"])),
                   reverse=True)
    r["slowest_changes"] = {"control": loads[0]["control"],
                            "changes": [{"value": v, "applied_ms": round(t, 2), "python_ms": round(py, 2)}
                                        for t, py, v in every[:len(every) - p95_rank(len(every))]]}
    # all but the firsts; Python's part of each beside it: is a first change's extra time in the worker or the page?
    for key, kind in (("rest_median_ms", "applied"), ("rest_painted_median_ms", "painted"),
                      ("rest_python_median_ms", "python")):
        r[key] = round(statistics.median([t for load in loads for t in load[kind][1:]]), 2)
    # The page's part (the round trip less Python's): the first change's, each load's, and the rest's median.
    page_parts = [[t - py for t, py in zip(load["applied"], load["python"])] for load in loads]
    r["first_changes_cold_page_ms"] = [round(part[0], 2) for part in page_parts]
    r["first_change_page_ms"] = round(statistics.median(r["first_changes_cold_page_ms"]), 2)
    r["rest_page_median_ms"] = round(statistics.median([t for part in page_parts for t in part[1:]]), 2)
    # Where a first change's extra goes (kvx-page.js, parts): each part of it less the same part's median over that
    # load's other changes, the median over cold loads.
    r["first_change_parts_over_rest_ms"] = {
        name: round(statistics.median(load["parts"][0][name] - statistics.median(p[name] for p in load["parts"][1:])
                                      for load in loads), 2)
        for name in loads[0]["parts"][0]} if all(len(load["parts"]) > 1 for load in loads) else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--site", default="build/site")
    ap.add_argument("--changes", type=int, default=40)
    ap.add_argument("--pages", default="", help="comma-separated slugs (default: every page)")
    ap.add_argument("--out", default="test-results/bench")
    ap.add_argument("--cold-pairs", type=int, default=3,
                    help="cold loads per page, each right after a bare boot: the ratio and first change are their medians")
    ap.add_argument("--pace", choices=("settled", "read", "back-to-back"), default="settled",
                    help="when the next change comes: once the last is drawn (a reader), 1 s after that (a reader who "
                         "reads it first: the first change's like-for-like), or as soon as it is applied")
    a = ap.parse_args()
    slugs = [s for s in a.pages.split(",") if s] or list(REGISTRY)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        shutil.copytree(a.site, site)
        pyodide = next((site / "assets").glob("pyodide-*")).relative_to(site).as_posix()
        (site / "bench-baseline.html").write_text(BASELINE_HTML)
        (site / "bench-baseline-worker.mjs").write_text(BASELINE_WORKER.replace("PYODIDE", pyodide))
        server, base, wire = serve(site)
        report = {"pages": {}, "subset": slugs != list(REGISTRY), "pace": a.pace}
        with sync_playwright() as p:
            def bare(name: str) -> int:
                ctx = launch(p, Path(tmp) / f"profile-baseline-{name}")
                ms = ready_ms(ctx.pages[0] if ctx.pages else ctx.new_page(), f"{base}/bench-baseline.html")
                ctx.close()
                return ms["py_ready_ms"]

            bare("warm-up")                        # Chromium's own first start is not the baseline's cost
            baselines = []
            for i, slug in enumerate(slugs):
                # A cold bare boot right before each page (a fresh profile too): this machine's load drifts.
                baselines.append(bare(slug))
                other = slugs[(i + 1) % len(slugs)] if len(slugs) > 1 else next(s for s in REGISTRY if s != slug)
                r = measure(p, base, slug, other, a.changes, Path(tmp) / f"profile-{slug}", wire, a.pace)
                r["baseline_py_ready_ms"] = baselines[-1]
                ratios = [r["cold"]["py_ready_ms"] / baselines[-1]]
                colds, more = [r["cold"]], []
                for k in range(1, a.cold_pairs):
                    floor = bare(f"{slug}-{k}")
                    cold, trips = cold_again(p, base, slug, Path(tmp) / f"profile-{slug}-{k}", a.pace, a.changes)
                    ratios.append(cold["py_ready_ms"] / floor)
                    colds.append(cold)
                    more.append(trips)
                pooled(r, more)
                r["cold_loads"] = [{**c, "over_baseline": round(x, 2)} for c, x in zip(colds, ratios)]
                r["cold_ready_over_baseline"] = round(statistics.median(ratios), 2)
                r["first_load_bytes_uncompressed"] = first_load_bytes(site, slug)
                report["pages"][slug] = r
                print(slug, json.dumps({k: r[k] for k in ("cold", "cold_ready_over_baseline", "round_trip_ms",
                                                         "painted_ms", "python_ms", "host_probe_ms", "first_change_ms",
                                                         "first_change_after_reload_ms", "rest_median_ms",
                                                         "twin_ms", "first_less_twin",
                                                         "wire_bytes")}),
                      flush=True)
            report["baseline_py_ready_ms"] = int(statistics.median(baselines))
        server.should_exit = True
    report["timeouts"] = TIMEOUTS
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    for t in TIMEOUTS:
        print(f"TIMED OUT (then retried): {t['url']}: {t['status']}")
    print(f"baseline (bare Pyodide core in a module worker, cold, before each page): median ready in "
          f"{report['baseline_py_ready_ms']} ms; x base and 1st chg: medians of {a.cold_pairs} cold loads a page; round trips: their changes together")
    print("p50, p95: to the reply applied; scr: to the end of the frame that shows it; probe: host_probe, ms "
          "(the slower of the two around the changes)")
    print(f"{'page':16} {'screen':>7} {'ready':>8} {'x base':>6} {'boot':>8} {'1st chg':>8} {'twin':>6} {'reload':>7} {'rest':>7} {'p50':>7} "
          f"{'p95':>7} {'scr p50':>7} {'scr p95':>7} {'py p50':>7} {'py p95':>7} {'probe':>6} {'cold MB':>7} {'2nd MB':>6}")
    for slug, r in report["pages"].items():
        print(f"{slug:16} {r['cold']['first_screen_ms']:>7} {r['cold']['py_ready_ms']:>8} "
              f"{r['cold_ready_over_baseline']:>6} {r['cold']['boot'] or '-':>8} {r['first_change_ms']:>8} "
              f"{r.get('twin_ms', '-'):>6} {r['first_change_after_reload_ms']:>7} "
              f"{r['rest_median_ms']:>7} {r['round_trip_ms']['median']:>7} {r['round_trip_ms']['p95']:>7} "
              f"{r['painted_ms']['median']:>7} {r['painted_ms']['p95']:>7} "
              f"{r['python_ms']['median']:>7} {r['python_ms']['p95']:>7} {max(r['host_probe_ms']):>6} "
              f"{r['wire_bytes']['cold'] / 1e6:>7.2f} {r['wire_bytes']['second_page'] / 1e6:>6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
