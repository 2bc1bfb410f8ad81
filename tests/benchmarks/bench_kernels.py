"""Kernel speed, as ratios against this machine's copy bandwidth measured in the same run.

    python tests/benchmarks/bench_kernels.py [--out test-results/bench] [--max-context 32768]

Reports: the device copy bandwidth (the ceiling for a memory-bound kernel); MLA decode (naive,
plain-MHA cache, absorbed) at 1K to 32K context, each with its time, the bytes the model says it
must read and the achieved share of copy bandwidth; paged against contiguous decode; and the
eviction evaluation's throughput. Writes kernels.json and prints tables. Runs on CUDA when present.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kvx.compute.kernel_specs import (EvictionRequest, MLARequest, PagedRequest, describe_device, eviction_run,
                                      mla_run, paged_run)
from kvx.compute.kernels.timing import copy_bandwidth, device


def quiet(fraction, message=""):
    pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="test-results/bench")
    ap.add_argument("--max-context", type=int, default=32768)
    a = ap.parse_args()
    dev = device()
    copy_bps = copy_bandwidth(dev)
    report = {"device": describe_device(), "copy_bytes_per_s": copy_bps, "mla": [], "paged": [], "eviction": []}

    contexts = [c for c in (1024, 2048, 4096, 8192, 16384, 32768) if c <= a.max_context]
    for context in contexts:
        forms = mla_run(MLARequest(context=context, repeats=7), quiet)["forms"]
        row = {"context": context}
        for name, f in forms.items():
            row[name] = {"seconds": f["seconds"], "bytes": f["bytes"], "flops": f["flops"],
                         "bandwidth_share": f["bytes"] / f["seconds"] / copy_bps, "max_error": f["max_error"]}
        report["mla"].append(row)

    for context in (1024, 8192):
        r = paged_run(PagedRequest(context=context, batch=8, repeats=5), quiet)
        report["paged"].append({"context": context, **{k: r[k] for k in
                                ("paged_seconds", "contiguous_seconds", "max_error", "model_bytes")},
                                "paged_bandwidth_share": r["model_bytes"] / r["paged_seconds"] / copy_bps})

    try:
        for policy in ("streaming_llm", "snapkv"):
            t0 = time.perf_counter()
            r = eviction_run(EvictionRequest(policy=policy, budget_fraction=0.25, sequences=8), quiet)
            seconds = time.perf_counter() - t0
            report["eviction"].append({"policy": policy, "seconds": seconds, "tokens_per_s": 8 * 512 / seconds,
                                       "loss": r["loss"], "recall_byte_acc": r.get("recall_byte_acc")})
    except FileNotFoundError as err:
        report["eviction"] = [{"skipped": str(err)}]

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.json").write_text(json.dumps(report, indent=2))
    d = report["device"]
    print(f"device {d['device']} ({d['device_name']}, torch {d['torch']}, {d['threads']} threads); "
          f"copy bandwidth {copy_bps / 1e9:.1f} GB/s")
    print("\nMLA decode, one layer of the trained MLA model, batch 1, float32 (time; share of copy bandwidth)")
    print(f"{'context':>8} {'naive':>18} {'plain MHA cache':>18} {'absorbed':>18} {'absorbed/MHA':>13}")
    for row in report["mla"]:
        cells = [f"{row[f]['seconds'] * 1e3:8.3f} ms {row[f]['bandwidth_share']:5.1%}"
                 for f in ("naive", "materialized", "absorbed")]
        ratio = row["absorbed"]["seconds"] / row["materialized"]["seconds"]
        print(f"{row['context']:>8} " + " ".join(f"{c:>18}" for c in cells) + f" {ratio:>12.2f}x")
    print("\npaged vs contiguous decode, batch 8")
    for row in report["paged"]:
        print(f"  context {row['context']:>6}: paged {row['paged_seconds'] * 1e3:.2f} ms, contiguous "
              f"{row['contiguous_seconds'] * 1e3:.2f} ms, max error {row['max_error']:.1e}, "
              f"{row['paged_bandwidth_share']:.1%} of copy bandwidth")
    print("\neviction evaluation (8 recall sequences of 512 tokens, budget 25%)")
    for row in report["eviction"]:
        print("  " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
