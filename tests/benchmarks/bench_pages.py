"""Page speed, measured in headless Chromium against a baseline taken in the same run.

    python tests/benchmarks/bench_pages.py --site build/site [--changes 40] [--out test-results/bench]

For each explainer page: time to first plot, time to Python-ready (cold: a fresh browser context;
warm: a reload with the HTTP cache), and the round trip of one control change (median and p95 over
many changes). The baseline is a bare page whose module worker only loads Pyodide core, so
"ready / baseline" is our overhead over the floor. Writes bench.json and prints a table.
Not a test: these figures vary with the machine; the ratios are what to compare.
"""
from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import uvicorn
from playwright.sync_api import TimeoutError as PlaywrightTimeout, sync_playwright

from kvx.compute.app import create_app
from kvx.compute.settings import Settings
from kvx.explainers.registry import REGISTRY

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

BASELINE_HTML = """<!doctype html><html><body><script type="module">
const t0 = performance.now();
const w = new Worker(new URL("bench-baseline-worker.mjs", location.href), {type: "module"});
w.onmessage = () => { document.documentElement.dataset.pyReadyMs = String(Math.round(performance.now()));
                      document.documentElement.setAttribute("data-py-ready", ""); };
</script></body></html>"""
BASELINE_WORKER = """import { loadPyodide } from "./vendor/pyodide/pyodide.mjs";
await loadPyodide({indexURL: new URL("./vendor/pyodide/", import.meta.url).href});
self.postMessage("ready");"""


def serve(site: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(Settings(site_dir=site)), host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}"


TIMEOUTS: list[dict] = []      # loads that never became ready: counted in the report, then retried once


def ready_ms(page, url: str, retry: bool = True) -> dict:
    page.goto(url)
    try:
        page.wait_for_selector("html[data-py-ready]", state="attached", timeout=60_000)
    except PlaywrightTimeout:
        TIMEOUTS.append({"url": url, "status": page.locator("#kvx-status").inner_text() if page.locator(
            "#kvx-status").count() else ""})
        if not retry:
            raise
        return ready_ms(page, url, retry=False)
    drawn = page.evaluate("Number(document.documentElement.getAttribute('data-kvx-drawn')) || null")
    return {"first_plot_ms": drawn, "py_ready_ms": int(page.evaluate("Number(document.documentElement.dataset.pyReadyMs)"))}


def values_to_try(slug: str, changes: int) -> tuple[str, list[str]]:
    """A parameter and a new value for each change (a repeated value fires no change event)."""
    specs = REGISTRY[slug].params.describe()
    spec = next((s for s in specs if s["kind"] == "integer" and s["default"] is not None and s["default"] > 0), None)
    if spec is not None:
        lo, hi = spec["default"], max(spec["default"] + 2, min(spec["max"], spec["default"] * 4))
        return spec["name"], [str(lo + 1 + i * 997 % (hi - lo)) for i in range(changes)]
    spec = next(s for s in specs if s["choices"])
    ring = [c for c in spec["choices"] if c != spec["default"]] + [spec["default"]]
    return spec["name"], [ring[i % len(ring)] for i in range(changes)]


def round_trips(page, slug: str, changes: int) -> list[float]:
    name, values = values_to_try(slug, changes)
    page.evaluate("window.kvx.timings.length = 0")
    for value in values:
        before = page.evaluate("Number(document.documentElement.dataset.kvxApplied || 0)")
        page.evaluate(f"Bokeh.documents[0].get_model_by_name('param:{name}').value = '{value}'")
        page.wait_for_function(f"Number(document.documentElement.dataset.kvxApplied || 0) > {before}")
    return page.evaluate("Array.from(window.kvx.timings)")


def frame_trips(page, steps: int) -> list[float] | None:
    """Round trip of one animation step, ms: for on-demand frames, from the key press to the drawn frame."""
    mode = page.evaluate("window.kvx.state.data.animation && window.kvx.state.data.animation.mode")
    if mode is None:
        return None
    page.evaluate("window.kvx.anim.reset()")
    page.wait_for_timeout(500)
    out = []
    for _ in range(steps):
        if mode == "on_demand":
            before = page.evaluate("Number(document.documentElement.dataset.kvxFrameApplied || 0)")
            t0 = page.evaluate("performance.now()")
            page.evaluate("window.kvx.anim.step()")
            page.wait_for_function(f"Number(document.documentElement.dataset.kvxFrameApplied || 0) > {before}")
        else:
            t0 = page.evaluate("performance.now()")
            page.evaluate("window.kvx.anim.step()")
        out.append(page.evaluate("performance.now()") - t0)
    return out


def page_weight(site: Path, slug: str) -> int:
    html = site / f"{slug}.html"
    parts = [html, *site.glob("vendor/bokeh/*.js"), *site.glob("vendor/pyodide/*"), *site.glob("wheels/*.whl"),
             *site.glob("static/*")]
    return sum(p.stat().st_size for p in parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--site", default="build/site")
    ap.add_argument("--changes", type=int, default=40)
    ap.add_argument("--out", default="test-results/bench")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        shutil.copytree(a.site, site)
        (site / "bench-baseline.html").write_text(BASELINE_HTML)
        (site / "bench-baseline-worker.mjs").write_text(BASELINE_WORKER)
        server, base = serve(site)
        report = {"pages": {}}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            ctx = browser.new_context()
            baseline = ready_ms(ctx.new_page(), f"{base}/bench-baseline.html")["py_ready_ms"]
            ctx.close()
            report["baseline_py_ready_ms"] = baseline
            for slug in REGISTRY:
                ctx = browser.new_context()
                page = ctx.new_page()
                cold = ready_ms(page, f"{base}/{slug}.html")
                warm = ready_ms(page, f"{base}/{slug}.html")
                trips = sorted(round_trips(page, slug, a.changes))
                frames = frame_trips(page, 30)
                frames = sorted(frames) if frames else None
                report["pages"][slug] = {
                    "cold": cold, "warm": warm, "cold_ready_over_baseline": round(cold["py_ready_ms"] / baseline, 2),
                    "round_trip_ms": {"median": round(statistics.median(trips), 2),
                                      "p95": round(trips[int(0.95 * (len(trips) - 1))], 2), "n": len(trips)},
                    "page_weight_bytes": page_weight(site, slug),
                    "frame_step_ms": None if not frames else {"median": round(statistics.median(frames), 2),
                                                              "p95": round(frames[int(0.95 * (len(frames) - 1))], 2)},
                }
                ctx.close()
            browser.close()
        server.should_exit = True
    report["timeouts"] = TIMEOUTS
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    for t in TIMEOUTS:
        print(f"TIMED OUT (then retried): {t['url']}: {t['status']}")
    print(f"baseline (bare Pyodide core in a module worker): ready in {baseline} ms")
    print(f"{'page':18} {'first plot':>10} {'ready cold':>10} {'x base':>7} {'ready warm':>10} "
          f"{'trip p50':>9} {'trip p95':>9} {'weight MB':>9} {'frame p50':>9}")
    for slug, r in report["pages"].items():
        print(f"{slug:18} {r['cold']['first_plot_ms']:>8} ms {r['cold']['py_ready_ms']:>7} ms "
              f"{r['cold_ready_over_baseline']:>7} {r['warm']['py_ready_ms']:>7} ms "
              f"{r['round_trip_ms']['median']:>6} ms {r['round_trip_ms']['p95']:>6} ms "
              f"{r['page_weight_bytes'] / 1e6:>9.1f} "
              f"{'-' if not r['frame_step_ms'] else str(r['frame_step_ms']['median']) + ' ms':>9}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
