"""Which of the page's JavaScript runs for the first time in a control change: precise coverage over CDP.

    python tests/benchmarks/first_run_code.py --site build/site [--pages mla,cross-model] [--changes 4] [--like 8]

The warm-up's passes (kvx-page.js, warmDrawingAgain) are there so that a reader's first change runs nothing the
engine has not run before. V8's account (v8_changes.py) says how much it compiled in a change, not which code
was new. This loads a page cold with V8's precise coverage on (call counts per function), waits for the passes
to end, then makes bench_pages' changes as a reader types them (v8_changes.type_as_a_reader) and, after each, takes
the counts: the functions with calls in that change and none before it, with the first characters of each.
What is left in a first change is then the reader's own path (the click, the keys, the address), or a path of
BokehJS that the passes never take. Not a test: a diagnosis, for the first change's extra (issue 16).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Callable

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).parent))
import bench_pages as B  # noqa: E402  (its server, values and pace)
from pagehooks import functions_called  # noqa: E402  (on the path bench_pages puts tests/browser on)
from v8_changes import BENCH_CHANGES, BOX_CENTRE, add_like_option, change_plan, type_as_a_reader  # noqa: E402


def first_runs(before: dict, changes: list[dict]) -> list[dict]:
    """Per change, the functions it called that nothing before it had (the load, the passes, earlier changes)."""
    seen, out = dict(before), []
    for window in changes:
        out.append({key: n for key, n in window.items() if key not in seen})
        seen.update(window)
    return out


def trace_page(base: str, slug: str, changes: int, like: int = BENCH_CHANGES
               ) -> tuple[list[str], list[dict], list[dict], Callable]:
    """One cold load of the page, its changes made (v8_changes.change_plan): each change's functions called, those
    called for the first time, and an excerpt of a function's source by its key."""
    name, plan = change_plan(slug, changes, like=like)
    with sync_playwright() as p, tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        ctx = B.launch(p, Path(profile))
        page = ctx.pages[0]
        cdp = ctx.new_cdp_session(page)
        cdp.send("Debugger.enable")                  # for the functions' source (Debugger.getScriptSource)
        cdp.send("Profiler.enable")
        cdp.send("Profiler.startPreciseCoverage", {"callCount": True, "detailed": False})
        take = lambda: functions_called(cdp.send("Profiler.takePreciseCoverage")["result"])  # noqa: E731
        B.ready_ms(page, f"{base}/{slug}.html")
        B.settle(page)
        page.wait_for_selector("html[data-kvx-drawing-warmed]", state="attached", timeout=60_000)
        x, y = page.evaluate(BOX_CENTRE, name)
        before, windows = take(), []
        for value in plan:
            painted = int(page.evaluate("Number(document.documentElement.dataset.kvxPainted || 0)"))
            type_as_a_reader(page, x, y, value)
            page.wait_for_function(f"Number(document.documentElement.dataset.kvxPainted || 0) > {painted}")
            page.wait_for_timeout(B.READING_MS)
            windows.append(take())
        new = first_runs(before, windows)
        sources = {script_id: cdp.send("Debugger.getScriptSource", {"scriptId": script_id})["scriptSource"]
                   for script_id in {key[0] for fresh in new for key in fresh}}
        ctx.close()
    # V8's offsets count UTF-16 units; the excerpt is Python's, which differs after any character beyond them
    excerpt = lambda key: sources.get(key[0], "")[key[2]:key[2] + 70].replace("\n", " ")  # noqa: E731
    return plan, windows, new, excerpt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--site", type=Path, default=Path("build/site"))
    ap.add_argument("--pages", default="mla,cross-model,cross-layer")
    ap.add_argument("--changes", type=int, default=4)
    add_like_option(ap)
    args = ap.parse_args()
    server, base, _ = B.serve(args.site)
    for slug in args.pages.split(","):
        plan, windows, new, excerpt = trace_page(base, slug, args.changes, args.like)
        print(f"== {slug}")
        for value, window, fresh in zip(plan, windows, new):
            print(f"  change to {value}: {len(window)} functions called, {len(fresh)} of them for the first time")
        for key, n in sorted(new[0].items(), key=lambda kv: -kv[1]):
            print(f"    {n:3d} x  {excerpt(key)}")
    server.should_exit = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
