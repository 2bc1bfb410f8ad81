"""How the radix prefix cache's replay time grows with a trace, against a baseline timed in the same run.

    python tests/benchmarks/bench_radix.py [--requests 12000] [--out test-results/bench]

The trace: core.traces.conversation_like (deterministic, shaped like Mooncake's FAST'25 conversation trace:
about 12,000 requests, 24 blocks of 512 tokens a prompt on average). The replay: one replica's RadixTree
over hash ids (a 10,000,000-token cache is 19,531 blocks of 512), each request matched, held, inserted and
released, as the load balancer does. Reported: seconds at 10%, 30% and 100% of the trace, the growth
100% ÷ 10% (n log n allows about 13), the whole replay against a plain dict-insert loop over the same hash
ids (the baseline), the load-balancer's own replay of the whole trace at one replica (seconds), and, at 10%
and 30%, the eviction that walks the whole tree per evicted leaf (what the heap replaced). The first 10%
never evicts (the cache is still filling), so 100% ÷ 30% is also shown: the growth once both evict.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path

from kvx.explainers.core import traces
from kvx.explainers.core.radix import RadixTree

CACHE_TOKENS = 10_000_000


def replay(records, capacity_blocks: int, tree_class=RadixTree) -> tuple[int, int, int]:
    """Hit blocks, blocks asked for and blocks evicted: match, hold, insert, release, one request at a time."""
    tree, hit, asked = tree_class(capacity_blocks), 0, 0
    for r in records:
        ids = r["hash_ids"]
        found, path = tree.match(ids)
        tree.lock(path, +1)
        tree.insert(ids)
        tree.lock(path, -1)
        hit, asked = hit + found, asked + len(ids)
    return hit, asked, tree.evicted


def baseline(records) -> int:
    """The same hash ids, each stored in a dict: the cheapest pass over the trace's work."""
    d = {}
    for i, r in enumerate(records):
        for x in r["hash_ids"]:
            d[x] = i
    return len(d)


def best_of(n: int, fn, *args) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(n):
        t = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - t)
    return best, out


def load_balancer_seconds(records) -> float | None:
    """The load-balancer explainer's replay of the uploaded trace at one replica, one router."""
    try:
        from kvx.explainers.load_balancer import model as lb
        p = lb.LoadBalancerParams(replicas=1, capacity=CACHE_TOKENS, trace=traces.to_jsonl(records))
        t = time.perf_counter()
        lb.simulate(p, lb.ROUTERS[0])
        return time.perf_counter() - t
    except Exception as err:                       # the load balancer's API is its own; say why, go on
        print(f"load-balancer replay skipped: {type(err).__name__}: {err}")
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=12_000)
    ap.add_argument("--out", default="test-results/bench")
    ap.add_argument("--no-walk", action="store_true", help="skip the old whole-tree-walk eviction")
    a = ap.parse_args()
    records = traces.conversation_like(a.requests, seed=0)
    blocks = CACHE_TOKENS // traces.BLOCK_SIZE
    parts = {share: records[: round(len(records) * share)] for share in (0.1, 0.3, 1.0)}
    # Each replay is timed alone, from a collected heap, and each slice keeps its fastest: the machine is
    # shared, so a slow run is someone else's load. Smaller slices get more runs (1/share times 10, at most 50), so
    # every slice's fastest is picked from about the same span of time. CPU time (process_time) is
    # reported next to wall time for the same reason.
    best: dict = {}
    for rnd in range(50):
        for share, part in parts.items():
            if rnd >= 10 * round(1 / share):
                continue
            for name, fn in (("replay", replay), ("baseline", baseline)):
                gc.collect()
                w, c = time.perf_counter(), time.process_time()
                out = fn(part, blocks) if fn is replay else fn(part)
                w, c = time.perf_counter() - w, time.process_time() - c
                old = best.get((share, name))
                best[(share, name)] = (min(w, old[0]), min(c, old[1]), out) if old else (w, c, out)
    rows = []
    for share, part in parts.items():
        w, c, (hit, asked, evicted) = best[(share, "replay")]
        bw, bc, _ = best[(share, "baseline")]
        rows.append({"share": share, "requests": len(part), "blocks": asked, "seconds": w, "cpu_seconds": c,
                     "baseline_seconds": bw, "baseline_cpu_seconds": bc, "ratio_to_baseline": w / bw,
                     "hit_rate": hit / asked, "evicted_blocks": evicted})
    growth = rows[-1]["seconds"] / rows[0]["seconds"]
    growth_cpu = rows[-1]["cpu_seconds"] / rows[0]["cpu_seconds"]
    growth_base = rows[-1]["baseline_cpu_seconds"] / rows[0]["baseline_cpu_seconds"]
    growth_blocks = rows[-1]["blocks"] / rows[0]["blocks"]
    # The first 10% never evicts (the cache is still filling); 30% and 100% both do, about 1.3 leaves a
    # request: their ratio is the growth at a steady workload.
    steady_cpu = rows[-1]["cpu_seconds"] / rows[1]["cpu_seconds"]
    steady_blocks = rows[-1]["blocks"] / rows[1]["blocks"]
    nlogn = 10 * math.log(len(parts[1.0])) / math.log(len(parts[0.1]))
    report = {"cache_blocks": blocks, "rows": rows, "growth_100_over_10": growth, "growth_cpu": growth_cpu,
              "growth_baseline_cpu": growth_base, "growth_blocks": growth_blocks, "n_log_n": nlogn,
              "growth_100_over_30_cpu": steady_cpu, "blocks_100_over_30": steady_blocks,
              "load_balancer_seconds": load_balancer_seconds(records)}
    if not a.no_walk:
        sys.path.insert(0, str(Path(__file__).parents[1] / "explainers"))
        from test_radix import WalkTree            # the eviction before the heap, kept with its test
        report["walk"] = []
        for share in (0.1, 0.3):
            part = records[: round(len(records) * share)]
            seconds, _ = best_of(1, replay, part, blocks, WalkTree)
            report["walk"].append({"share": share, "seconds": seconds})

    print(f"radix replay, one replica, {CACHE_TOKENS:,}-token cache ({blocks:,} blocks of {traces.BLOCK_SIZE}):")
    print(f"{'share':>6} {'requests':>9} {'blocks':>10} {'seconds':>8} {'cpu s':>7} {'dict loop':>10} {'ratio':>7} "
          f"{'hit rate':>9}")
    for r in rows:
        print(f"{r['share']:>6.0%} {r['requests']:>9,} {r['blocks']:>10,} {r['seconds']:>8.3f} {r['cpu_seconds']:>7.3f} "
              f"{r['baseline_seconds']:>10.4f} {r['ratio_to_baseline']:>6.1f}x {r['hit_rate']:>9.1%}")
    print(f"growth 100% / 10%: {growth:.1f}x wall, {growth_cpu:.1f}x CPU, for {growth_blocks:.1f}x the blocks "
          f"(n log n: 10 x log {len(parts[1.0])} / log {len(parts[0.1])} = {nlogn:.1f}; "
          f"the dict loop grows {growth_base:.1f}x CPU)")
    print(f"growth 100% / 30% (both evicting): {steady_cpu:.2f}x CPU for {steady_blocks:.2f}x the blocks")
    if report["load_balancer_seconds"] is not None:
        print(f"load-balancer replay of the whole trace at one replica: {report['load_balancer_seconds']:.2f} s")
    for w in report.get("walk", []):
        print(f"old walk eviction at {w['share']:.0%}: {w['seconds']:.2f} s")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "radix.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
