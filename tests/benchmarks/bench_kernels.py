"""Kernel speed, as ratios against baselines measured in the same run, with the previous kernels beside the new.

    python tests/benchmarks/bench_kernels.py [--out test-results/bench] [--max-context 32768] [--smoke]
                                             [--dtype float32|bfloat16] [--flush]

Reports:
- copy bandwidth twice: a 256 MiB copy (DRAM, or HBM on a GPU) and, per row, a copy as large as that row's
  cache (these caches fit in the CPU's L3, so the DRAM figure alone flatters a kernel);
- MLA decode on one layer of the trained MLA model, batch 1: naive, the plain-MHA cache, absorbed (what the
  server runs: on the CPU in float32 the fused one-pass C kernel, kernels/mla_cpu.py), on a CPU with AVX-512
  the same kernel built without it (8-float vectors), and the previous absorbed
  kernel (PyTorch ops, heads as the rows of one matmul; what runs on CUDA), each with its time and the bytes
  the formula says it reads (the cache: latent + RoPE key per token, at the model's widths) ÷ time as a share
  of both copy bandwidths;
- paged decode, batch 8: the new kernel against one batched SDPA call over a contiguous cache, and the
  previous kernel against the previous contiguous reference (a loop over sequences), errors against a
  float64 reference with NaN in the unused block slots; on a GPU also SDPA with only the flash backend
  over the same tokens (equal lengths, no mask), the fastest thing torch has for this;
- the eviction evaluation's throughput.
Every kernel runs with the server's thread count (kernel_specs.kernel_threads(), 1 unless KVX_KERNEL_THREADS)
and is timed by kernels/timing.py (CUDA events on a GPU; on one CPU thread, the thread's CPU time).
Measurements of one row alternate between the forms for three rounds and keep each form's median, so a
burst of load on this shared machine hits all forms alike. Writes kernels.json and prints tables.
On CUDA the default dtype is bfloat16: the pages' formulas count 2-byte elements.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

from kvx.compute.kernel_specs import (EvictionRequest, _mla_layer, describe_device, eviction_run, kernel_threads,
                                      threads)
from kvx.compute.kernels import mla, mla_cpu, paged
from kvx.compute.kernels.timing import cache_flusher, clock_name, copy_bandwidth, device, median_seconds

ROUNDS = 3


def quiet(fraction, message=""):
    pass


def timed(forms: dict, dev, repeats: int, flush=None) -> dict:
    """Median seconds of each form, alternating between forms for ROUNDS rounds."""
    seen = {name: [] for name in forms}
    for _ in range(ROUNDS):
        for name, fn in forms.items():
            seen[name].append(median_seconds(fn, dev, repeats=repeats, warmup=2, flush=flush))
    return {name: statistics.median(ts) for name, ts in seen.items()}


def cache_copy_bandwidth(dev, nbytes: float) -> float:
    """Copy bandwidth of a buffer as large as a kernel's cache (read + write counted)."""
    return copy_bandwidth(dev, mib=max(nbytes, 4096) / 2 ** 20, repeats=15)


def narrow_kernel(latent: int, rope: int):
    """The fused kernel built as the server's is but without AVX-512 (8-float vectors), in a temporary directory,
    to time beside the 16-float build on the same CPU in the same run; None where the server's build is 8-float
    already or this does not compile. (A benchmark may run a compiler; the server never does.)"""
    import tempfile
    from kvx.site.native import compile_source
    if mla_cpu.vector_width(latent, rope) != 16:
        return None
    cc, flags, _ = mla_cpu.plans(latent, rope)[0]
    lib = Path(tempfile.mkdtemp(prefix="kvx-bench-")) / "mla_narrow.so"
    if compile_source(cc, [*flags, "-mno-avx512f"], lib) is not None:
        return None
    fn, width = mla_cpu.load(lib)
    return fn if width == 8 else None


def with_kernel(fn, layer, inp):
    """mla.absorbed with the fused kernel `fn` in place of the loaded one, for this call."""
    key = (layer.c.kv_latent, layer.c.rope_dim)
    loaded, mla_cpu._libs[key] = mla_cpu._libs[key], fn
    try:
        return mla.absorbed(layer, inp)
    finally:
        mla_cpu._libs[key] = loaded


def bench_mla(dev, dtype, contexts, dram_bps: float, repeats: int, flush=None) -> list[dict]:
    import copy
    layer = copy.deepcopy(_mla_layer()).to(dev, dtype)
    narrow = narrow_kernel(layer.c.kv_latent, layer.c.rope_dim) if dev.type == "cpu" and dtype == torch.float32 else None
    rows = []
    for context in contexts:
        inp = mla.decode_inputs(layer, 1, context, torch.Generator().manual_seed(0), dtype=dtype)
        mha_cache = mla.materialize(layer, inp)
        cost = mla.cost(layer, 1, context, torch.finfo(dtype).bits / 8)
        cache_bps = cache_copy_bandwidth(dev, cost["cache_bytes"])
        with torch.no_grad():
            reference = mla.naive(copy.deepcopy(layer).double(), {k: v.double() for k, v in inp.items()})
        forms = {"naive": lambda: mla.naive(layer, inp),
                 "materialized": lambda: mla.materialized(layer, inp, mha_cache),
                 "absorbed": lambda: mla.absorbed(layer, inp),
                 "absorbed_old": lambda: mla.absorbed_matmul(layer, inp)}
        if narrow is not None:
            forms["absorbed_narrow"] = lambda: with_kernel(narrow, layer, inp)
        seconds = timed(forms, dev, repeats, flush)
        row = {"context": context, "cache_bytes": cost["cache_bytes"], "cache_copy_bytes_per_s": cache_bps,
               "absorbed_implementation": mla.absorbed_implementation(layer, inp),
               "absorbed_old_implementation": "PyTorch ops (heads as the rows of one matmul)"}
        for name, fn in forms.items():
            nbytes = cost[("absorbed" if name.startswith("absorbed") else name) + "_bytes"]
            row[name] = {"seconds": seconds[name], "bytes": nbytes,
                         "bandwidth_share": nbytes / seconds[name] / dram_bps,
                         "cache_copy_share": nbytes / seconds[name] / cache_bps,
                         "max_error": (fn().double() - reference).abs().max().item()}
        row["absorbed_over_mha"] = seconds["absorbed"] / seconds["materialized"]
        row["absorbed_old_over_mha"] = seconds["absorbed_old"] / seconds["materialized"]
        row["absorbed_new_over_old"] = seconds["absorbed"] / seconds["absorbed_old"]
        if narrow is not None:
            row["absorbed_over_narrow"] = seconds["absorbed"] / seconds["absorbed_narrow"]
        rows.append(row)
    return rows


def paged_inputs(dev, dtype, batch: int, context: int, heads=8, kv_heads=2, head_dim=64, block_size=16):
    g = torch.Generator().manual_seed(0)
    lens = [max(1, context - 7 * i) for i in range(batch)]
    k = torch.randn(batch, context, kv_heads, head_dim, generator=g).to(dev, dtype)
    v = torch.randn(batch, context, kv_heads, head_dim, generator=g).to(dev, dtype)
    q = torch.randn(batch, heads, head_dim, generator=g).to(dev, dtype)
    blocks = sum(math.ceil(n / block_size) for n in lens) + 1
    k_pool, table = paged.scatter_to_blocks(k, lens, block_size, blocks, torch.Generator().manual_seed(1))
    v_pool, _ = paged.scatter_to_blocks(v, lens, block_size, blocks, torch.Generator().manual_seed(1))
    return {"q": q, "k": k, "v": v, "k_pool": k_pool, "v_pool": v_pool, "table": table, "lens": lens,
            "lens_d": torch.tensor(lens, device=dev)}


def flash_full(q, k, v):
    """SDPA with only the flash backend, every sequence at full length (flash takes no mask)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q[:, :, None, :], k.transpose(1, 2),
                                                                v.transpose(1, 2), enable_gqa=True)


def bench_paged(dev, dtype, contexts, dram_bps: float, repeats: int, batch: int = 8, flush=None) -> list[dict]:
    rows = []
    for context in contexts:
        x = paged_inputs(dev, dtype, batch, context)
        q, k, v, kp, vp, table, lens, lens_d = (x[n] for n in ("q", "k", "v", "k_pool", "v_pool", "table", "lens",
                                                              "lens_d"))
        reference = paged.loop_decode(q, k, v, lens, dtype=torch.float64)
        forms = {"paged": lambda: paged.paged_decode(q, kp, vp, table, lens),
                 "contiguous": lambda: paged.contiguous_decode(q, k, v, lens_d),
                 "paged_old": lambda: paged.gather_repeat_decode(q, kp, vp, table, lens_d),
                 "contiguous_old": lambda: paged.loop_decode(q, k, v, lens)}
        try:
            flash_full(q, k, v)
            forms["sdpa_flash_full_length"] = lambda: flash_full(q, k, v)
        except RuntimeError:              # no flash kernel for this device or dtype
            pass
        seconds = timed(forms, dev, repeats, flush)
        stored = sum(lens) * k.shape[2] * k.shape[3] * 2 * k.element_size()
        errors = {name: (forms[name]().double() - reference).abs().max().item()
                  for name in ("paged", "contiguous", "paged_old")}
        rows.append({"context": context, "batch": batch, "model_bytes": stored,
                     **{f"{name}_seconds": s for name, s in seconds.items()},
                     "paged_seconds": seconds["paged"], "contiguous_seconds": seconds["contiguous"],
                     "max_error": errors["paged"], "errors": errors,
                     "paged_bandwidth_share": stored / seconds["paged"] / dram_bps,
                     "paged_over_contiguous": seconds["paged"] / seconds["contiguous"],
                     "old_paged_over_old_contiguous": seconds["paged_old"] / seconds["contiguous_old"],
                     "paged_new_over_old": seconds["paged"] / seconds["paged_old"]})
    return rows


def run(smoke: bool = False, max_context: int = 32768, dtype_name: str | None = None, flush: bool = False,
        eviction: bool = True, dev=None) -> dict:
    dev = dev or device()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[
        dtype_name or ("bfloat16" if dev.type == "cuda" else "float32")]
    with threads(kernel_threads()):
        dram_bps = copy_bandwidth(dev, mib=16 if smoke else (1024 if dev.type == "cuda" else 256))
        flusher = cache_flusher(dev) if flush else None
        repeats = 3 if smoke else 9
        mla_contexts = [64, 256] if smoke else [c for c in (1024, 4096, 8192, 16384, 32768) if c <= max_context]
        paged_contexts = [64, 256] if smoke else [c for c in (1024, 8192, 16384) if c <= max_context]
        report = {"device": describe_device(), "dtype": str(dtype).removeprefix("torch."), "timer": clock_name(dev),
                  "threads": torch.get_num_threads(), "flush": flush, "smoke": smoke,
                  "copy_bytes_per_s": dram_bps,
                  "mla": bench_mla(dev, dtype, mla_contexts, dram_bps, repeats, flusher),
                  "paged": bench_paged(dev, dtype, paged_contexts, dram_bps, repeats, batch=2 if smoke else 8,
                                       flush=flusher),
                  "eviction": []}
        if eviction:
            try:
                for policy in ("streaming_llm", "snapkv"):
                    n = 1 if smoke else 8
                    t0 = time.perf_counter()
                    r = eviction_run(EvictionRequest(policy=policy, budget_fraction=0.25, sequences=n), quiet)
                    seconds = time.perf_counter() - t0
                    report["eviction"].append({"policy": policy, "seconds": seconds, "tokens_per_s": n * 512 / seconds,
                                               "loss": r["loss"], "recall_byte_acc": r.get("recall_byte_acc")})
            except FileNotFoundError as err:
                report["eviction"] = [{"skipped": str(err)}]
    return report


def print_report(report: dict) -> None:
    d = report["device"]
    print(f"device {d['device']} ({d['device_name']}, torch {d['torch']}), {report['threads']} thread(s), "
          f"{report['dtype']}, timer: {report['timer']}, cache flush between repeats: {report['flush']}; "
          f"copy bandwidth (large buffer) {report['copy_bytes_per_s'] / 1e9:.1f} GB/s")
    print("\nMLA decode, one layer of the trained MLA model, batch 1 (time; formula bytes ÷ time as a share of the "
          "large-buffer copy bandwidth / of a cache-sized copy)")
    if report["mla"]:
        print(f"absorbed: {report['mla'][0]['absorbed_implementation']}; "
              f"old: {report['mla'][0]['absorbed_old_implementation']}")
    print(f"{'context':>8} {'naive':>24} {'plain MHA cache':>24} {'absorbed':>24} {'absorbed (old)':>24} "
          f"{'abs/MHA':>8} {'old/MHA':>8} {'new/old':>8}")
    for row in report["mla"]:
        cells = [f"{row[f]['seconds'] * 1e3:7.3f} ms {row[f]['bandwidth_share']:5.0%}/{row[f]['cache_copy_share']:4.0%}"
                 for f in ("naive", "materialized", "absorbed", "absorbed_old")]
        narrow = (f"; 8-float build {row['absorbed_narrow']['seconds'] * 1e3:.3f} ms, this build "
                  f"{row['absorbed_over_narrow']:.3f}x its time" if "absorbed_narrow" in row else "")
        print(f"{row['context']:>8} " + " ".join(f"{c:>24}" for c in cells) +
              f" {row['absorbed_over_mha']:>7.2f}x {row['absorbed_old_over_mha']:>7.2f}x "
              f"{row['absorbed_new_over_old']:>7.2f}x{narrow}")
    print("\npaged decode against contiguous decode, the new pair and the old pair (errors against float64)")
    for row in report["paged"]:
        flash = row.get("sdpa_flash_full_length_seconds")
        extra = f", SDPA flash full length {flash * 1e3:.2f} ms" if flash else ""
        print(f"  batch {row['batch']} context {row['context']:>6}: paged {row['paged_seconds'] * 1e3:.2f} ms vs SDPA "
              f"contiguous {row['contiguous_seconds'] * 1e3:.2f} ms = {row['paged_over_contiguous']:.2f}x "
              f"(old: {row['paged_old_seconds'] * 1e3:.2f} ms vs loop {row['contiguous_old_seconds'] * 1e3:.2f} ms "
              f"= {row['old_paged_over_old_contiguous']:.2f}x; new/old paged {row['paged_new_over_old']:.3f}x){extra}; "
              f"max error {row['max_error']:.1e}, {row['paged_bandwidth_share']:.1%} of copy bandwidth")
    if report["eviction"]:
        print("\neviction evaluation (recall sequences of 512 tokens, budget 25%)")
        for row in report["eviction"]:
            print("  " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="test-results/bench")
    ap.add_argument("--max-context", type=int, default=32768)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script, measures nothing")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)
    ap.add_argument("--flush", action="store_true", help="overwrite the last-level cache between repeats")
    a = ap.parse_args()
    report = run(a.smoke, a.max_context, a.dtype, a.flush)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.json").write_text(json.dumps(report, indent=2))
    print_report(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
