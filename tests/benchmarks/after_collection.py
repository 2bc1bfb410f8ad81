"""A control change drawn just after a major garbage collection, against the same change drawn without one.

    python tests/benchmarks/after_collection.py --site build/site [--pages mla,cross-layer] [--loads 6] [--changes 8]

Each cold load makes the page benchmark's changes (bench_pages.round_trips: the read pace, then the first change's
twin), and before the twin either a full collection (DevTools' HeapProfiler.collectGarbage) and a second of
reading, or the same second alone; the two kinds of load take turns. Per page and kind: the twin's "taken into
the plots" less the median of the rest's, and the first change's less the twin's (medians over the loads, with
how many were above), and what the page said of its pass after its first major collection (kvx-page.js,
afterMajorCollection). The page draws that pass once, after its first major collection only: a collection made
before the twin finds no pass after it, so "collected" shows what a change drawn just after one costs.
Not a test: these figures vary with the machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_pages as B  # noqa: E402  (scripts beside this one, not a package)
from pagehooks import collect_garbage  # noqa: E402  (on the path bench_pages puts tests/browser on)
from v8_changes import BENCH_CHANGES  # noqa: E402

KINDS = ("read", "collected")


def before_twin(kind: str):
    def run(page) -> None:
        if kind == "collected":
            collect_garbage(page)
        page.wait_for_timeout(B.READING_MS)
    return run


def one_load(p, base: str, slug: str, kind: str, changes: int) -> dict:
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        ctx = B.launch(p, Path(profile))
        try:
            page = ctx.pages[0]
            B.ready_ms(page, f"{base}/{slug}.html")
            B.settle(page)
            t = B.round_trips(page, slug, changes, "read", twin=True, before_twin=before_twin(kind))
            said = page.evaluate("document.documentElement.dataset.kvxPassAfterCollection || 'nothing yet'")
        finally:
            ctx.close()
    drawing = [part["drawing"] for part in t["parts"]]
    twin = t["twin"]["parts"]["drawing"]
    return {"twin_less_rest_ms": round(twin - statistics.median(drawing[1:]), 2),
            "first_less_twin_ms": round(drawing[0] - twin, 2), "pass_after_collection": said}


def summary(loads: list[dict]) -> dict:
    """Medians over the loads, with how many were above 0, and what the pages said of their pass."""
    out = {}
    for key in ("twin_less_rest_ms", "first_less_twin_ms"):
        values = [load[key] for load in loads]
        out[key] = (round(statistics.median(values), 2), sum(v > 0 for v in values))
    said = [load["pass_after_collection"] for load in loads]
    out["pass_after_collection"] = {s: said.count(s) for s in sorted(set(said))}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--site", default="build/site")
    ap.add_argument("--pages", default="mla,cross-layer")
    ap.add_argument("--loads", type=int, default=6)
    ap.add_argument("--changes", type=int, default=BENCH_CHANGES, help="a load's changes before the twin (the "
                    "report's run: 8)")
    ap.add_argument("--out", default=None, help="a JSON file for every load's figures")
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright
    server, base, _ = B.serve(Path(a.site))
    pages = a.pages.split(",")
    got = {slug: {kind: [] for kind in KINDS} for slug in pages}
    with sync_playwright() as p:
        for load in range(a.loads):
            for slug in pages:
                for kind in KINDS:
                    got[slug][kind].append(one_load(p, base, slug, kind, a.changes))
                    print(load, slug, kind, got[slug][kind][-1], flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(got, indent=1) + "\n")
    print(f"\n{'page':14} {'kind':10} twin less the rest (above)  first less twin (above)  the page's pass after "
          "its first major collection")
    for slug in pages:
        for kind in KINDS:
            s = summary(got[slug][kind])
            print(f"{slug:14} {kind:10} {s['twin_less_rest_ms'][0]:+6.2f} ms ({s['twin_less_rest_ms'][1]} of "
                  f"{a.loads}){'':8} {s['first_less_twin_ms'][0]:+6.2f} ms ({s['first_less_twin_ms'][1]} of {a.loads})"
                  f"{'':6} {s['pass_after_collection']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
