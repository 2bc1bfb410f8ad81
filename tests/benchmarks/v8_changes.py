"""What the JavaScript engine does in each control change: V8's own account of the first change against the rest.

    python tests/benchmarks/v8_changes.py --site build/site [--pages load-balancer,mla] [--changes 6] [--like 8]
        [--out DIR]

A first change's extra over its twin is about a millisecond, on a host whose speed drifts by more than that
between minutes; V8's account of its work does not drift. Chromium is started by hand with V8 tracing its
optimising (--trace-opt, --trace-deopt) into its standard output, which goes to a file, and is driven over CDP.
Before each change the benchmark prints a mark into the same stream (%DebugPrint, allowed by
--allow-natives-syntax), so each line of the trace falls to the change whose window it is in: from its mark to the
next change's, its reading time included, where compiles it set off finish. Per change:
  bailouts       optimised code left mid-run, for a type or a value it was not compiled for;
  invalidated    optimised code marked to be thrown away (a map deprecated, a prototype changed);
  compiles       optimising compiles finished (Maglev and TurboFan), mostly to replace what was thrown away.
The changes are bench_pages' (values_to_try at the "read" pace, then the twin: the opening value back, then the
first value again), typed as a reader types them, through the browser's input events alone (type_as_a_reader).
The trace is the renderer's, the page and its worker together; the worker's bailouts in WebAssembly (Pyodide)
are left out.
Not a test: a diagnosis, for the first change's extra (issue 16). Writes v8-<page>.log and prints a table.
"""
from __future__ import annotations

import argparse
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).parent))
import bench_pages as B  # noqa: E402  (its server, typing, values and pace)

V8_FLAGS = "--trace-opt --trace-deopt --allow-natives-syntax"
# The benchmark's pages are 1280 x 720 (Playwright's viewport); headless Chromium started by hand is 800 x 600,
# where the box was below the first screen and the page scrolled to it before the first change alone.
WINDOW = "--window-size=1280,720"
MARK = re.compile(r"KVXMARK (-?\d+)")
BAILOUT = re.compile(r"\[bailout \(kind: [\w-]+, reason: (.*?)\): begin\. deoptimizing \S+ <JSFunction ?([^ >(]*)")


def counts(lines: list[str]) -> dict:
    """One window's bailouts (each as "function: reason"), invalidations and compiles."""
    bailouts = [f"{m.group(2) or '(anonymous)'}: {m.group(1)}" for x in lines
                if "wasm-function" not in x and (m := BAILOUT.search(x))]
    return {"bailouts": bailouts,
            "invalidated": sum("[marking dependent code" in x for x in lines),
            "compiles": sum("[completed compiling" in x for x in lines)}


def windows(log: str) -> dict[int, dict]:
    """The trace cut at the marks: change number -> its window's counts (lines before the first mark dropped;
    mark -1 ends the last window)."""
    out, current, lines = {}, None, []
    for line in log.splitlines() + ["KVXMARK -1"]:
        if "KVXMARK" in line:
            if current is not None and current >= 0:
                out[current] = counts(lines)
            m = MARK.search(line)
            current, lines = (int(m.group(1)) if m else None), []
        else:
            lines.append(line)
    return out


# The box's centre, found once, with the box scrolled into view if it is not (as the benchmark's click does, and a
# reader: the controls are on the first screen, and centring one scrolled the page before the first change alone):
# the typing below then runs no Playwright code in the page (its locators' helpers are compiled and optimised in
# the page's own engine, and their bailouts on a first use would count as the first change's).
BOX_CENTRE = """(name) => {
  const doc = Bokeh.documents[0];
  const input = Bokeh.index.find_one(doc.get_model_by_name(`param:${name}`)).input_el;
  input.scrollIntoView({ block: "nearest" });
  const r = input.getBoundingClientRect();
  return [r.x + r.width / 2, r.y + r.height / 2];
}"""


def type_as_a_reader(page, x: float, y: float, value: str) -> None:
    """pagehooks.set_control's reader, through the browser's input events alone: a click into the box, its text
    selected, the value typed KEY_GAP_MS a key, a pause, then Enter."""
    page.mouse.click(x, y)
    page.keyboard.press("Control+A")
    page.keyboard.type(value, delay=B.KEY_GAP_MS)
    page.wait_for_timeout(B.KEY_GAP_MS)
    page.keyboard.press("Enter")


def amount(window: dict | None, kind: str) -> int | None:
    """How many of a kind in a window (None: no such window)."""
    if window is None:
        return None
    return len(window[kind]) if kind == "bailouts" else window[kind]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The changes per load of the benchmark run these tools diagnose (the report's: bench_pages.py --changes 8).
# values_to_try picks its box by how many distinct values it needs (the first integer box with that many), so a
# tool that asked it for its own count typed another box than the run's (cross-layer: "share" for 6, "context"
# for 8).
BENCH_CHANGES = 8


def add_like_option(ap: argparse.ArgumentParser) -> None:
    """--like, for both diagnosis tools: the changes a load of the benchmark run they diagnose."""
    ap.add_argument("--like", type=int, default=BENCH_CHANGES, help="the changes a load of the benchmark run "
                    "diagnosed (bench_pages.py --changes): the box is the one that run types in")


def change_plan(slug: str, changes: int, first: int = 0, like: int = BENCH_CHANGES) -> tuple[str, list[str]]:
    """The box and the values typed into it: bench_pages' values_to_try for a run of `like` changes a load, its
    first `changes` values, then the twin (the opening value back, then the first value again). `first`: which of
    those values comes first (the rest follow in turn), for a first value other than the benchmark's."""
    name, values = B.values_to_try(slug, max(like, changes))
    values = values[:changes]
    values = values[first:] + values[:first]
    opening = B.opening_value(slug, name)
    return name, values + ([opening, values[0]] if values[0] != opening else [])


def trace_page(base: str, slug: str, changes: int, log_path: Path, more_flags: str = "",
               first: int = 0, like: int = BENCH_CHANGES) -> tuple[list[str], dict[int, dict]]:
    """One cold load of the page in a fresh profile, its changes made (change_plan), V8's trace written to
    log_path and cut."""
    name, plan = change_plan(slug, changes, first, like)
    port = free_port()
    # ignore_cleanup_errors: Chromium's helper processes can still be writing into the profile as it is removed
    with open(log_path, "wb") as log, tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        chromium = subprocess.Popen(["/usr/bin/chromium", "--headless", *B.ARGS, WINDOW, f"--user-data-dir={profile}",
                                     f"--remote-debugging-port={port}", f"--js-flags={V8_FLAGS} {more_flags}".strip(),
                                     "about:blank"], stdout=log, stderr=subprocess.DEVNULL)
        try:
            with sync_playwright() as p:
                for _ in range(50):
                    try:
                        browser = p.chromium.connect_over_cdp(f"http://127.0.0.1:{port}")
                        break
                    except Exception:      # noqa: BLE001  (not listening yet)
                        time.sleep(0.2)
                else:
                    raise RuntimeError(f"Chromium did not listen on port {port} within 10 s")
                page = browser.contexts[0].pages[0]
                B.ready_ms(page, f"{base}/{slug}.html")
                B.settle(page)
                # the warm-up's passes over (the trace slows them): a first change's window is the change's alone
                page.wait_for_selector("html[data-kvx-drawing-warmed]", state="attached", timeout=60_000)
                x, y = page.evaluate(BOX_CENTRE, name)
                for i, value in enumerate(plan):
                    painted = int(page.evaluate("Number(document.documentElement.dataset.kvxPainted || 0)"))
                    page.evaluate(f'%DebugPrint("KVXMARK {i}")')
                    type_as_a_reader(page, x, y, value)
                    page.wait_for_function(f"Number(document.documentElement.dataset.kvxPainted || 0) > {painted}")
                    page.wait_for_timeout(B.READING_MS)
                page.evaluate('%DebugPrint("KVXMARK -1")')
                browser.close()
        finally:
            chromium.terminate()
            chromium.wait()
    return plan, windows(log_path.read_text(errors="replace"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--site", type=Path, default=Path("build/site"))
    ap.add_argument("--pages", default="load-balancer,prompt-caching,prefix-reuse,quantization,mla")
    ap.add_argument("--changes", type=int, default=6)
    ap.add_argument("--out", type=Path, default=Path("test-results/v8"))
    add_like_option(ap)
    ap.add_argument("--first", type=int, default=0, help="which of the benchmark's values comes first "
                    "(0: its own first value, one above the default where it can be)")
    ap.add_argument("--v8-flags", default="", help="more V8 flags, e.g. --trace-deopt-verbose (each bailout's "
                    "position in the source and the values it had)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    server, base, _ = B.serve(args.site)
    print(f"{'page':16s} {'':12s} first  rest (median)  twin")
    for slug in args.pages.split(","):
        plan, per = trace_page(base, slug, args.changes, args.out / f"v8-{slug}.log", args.v8_flags,
                                 args.first, args.like)
        twin = per.get(len(plan) - 1) if len(plan) > args.changes else None
        for kind in ("bailouts", "invalidated", "compiles"):
            rest = statistics.median(amount(per.get(i, counts([])), kind) for i in range(1, args.changes))
            print(f"{slug:16s} {kind:12s} {amount(per.get(0), kind)!s:>5s}  {rest:>13}  {amount(twin, kind)!s:>4s}")
        print(f"{'':16s} first change's bailouts: {'; '.join(per.get(0, counts([]))['bailouts']) or 'none'}")
    server.should_exit = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
