"""Smaller weights run faster, a smaller cache does not (until the cache is what you read).

One decode step of a batch reads every weight once and every sequence's whole KV cache once. On a
GPU that step is almost always limited by memory bandwidth, so its time is bytes over bandwidth,
and a precision only speeds it up in proportion to the share of the bytes it shrinks.
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import dataclasses

from ..core.dtypes import DTYPE_BITS, dtype_bytes
from ..core.gpus import GPUS
from ..core.limits import gpus_needed
from ..core.models import MODELS
from ..core.params import Params, choice, integer, number
from ..core.summaries import listing, sig, summaries
from ..core.timing import decode_step, decode_weights_formula, weight_params_read
from ..core.units import bytes_si, thousands, tokens

DTYPES = tuple(DTYPE_BITS)
BASELINE = "bf16"
CURVE_CONTEXTS = [round(2 ** (7 + i / 2)) for i in range(0, 2 * 13 + 1)]     # 128 .. 1,048,576 tokens
CURVE_BATCHES = [2 ** i for i in range(0, 13)]                                # 1 .. 4,096


@dataclasses.dataclass(frozen=True)
class QuantizationParams(Params):
    model: str = choice("llama-3-8b", MODELS, help="Model preset (shapes from each model's config.json)")
    gpu: str = choice("h100-sxm", GPUS, help="Accelerator preset (datasheet bandwidth and dense BF16 FLOP/s)")
    weight_dtype: str = choice("int4", DTYPES, parse=dtype_bytes, unit="dtype or bits",
                               help="Weight precision: a dtype or an average bit-width such as 4.5")
    kv_dtype: str = choice("int4", DTYPES, parse=dtype_bytes, unit="dtype or bits",
                           help="KV cache precision: a dtype or an average bit-width such as 4.5")
    context: int = integer(2_000, unit="tokens", min=1, max=10_000_000, help="Tokens in each sequence's cache")
    batch: int = integer(1, unit="sequences", min=1, max=65_536, help="Sequences decoded together")
    bandwidth_efficiency: float = number(1.0, unit="share", min=0.05, max=1.0,
                                         help="Share of datasheet memory bandwidth a step reaches (1: the roofline)")
    mfu: float = number(1.0, unit="share", min=0.01, max=1.0,
                        help="Share of peak BF16 FLOP/s a step reaches (1: the roofline)")


def step(m, gpu, weight_dtype: str, kv_dtype: str, context: int, batch: int, bandwidth_efficiency: float = 1.0,
         mfu: float = 1.0) -> dict:
    """One decode step of `batch` sequences: the shared time model (core/timing.py), plus tokens per second.
    A mixture of experts reads the experts its batch touches, not only the active parameters."""
    s = decode_step(m, gpu, batch=batch, context=context, weight_bytes_per_param=dtype_bytes(weight_dtype),
                    kv_bytes_per_element=dtype_bytes(kv_dtype), bandwidth_efficiency=bandwidth_efficiency, mfu=mfu)
    return {
        **s, "memory_seconds": s["memory_s"], "compute_seconds": s["compute_s"],
        "intensity": s["flops"] / s["bytes"],
        "tokens_per_s_per_user": 1 / s["seconds"], "tokens_per_s_total": batch / s["seconds"],
    }


VARIANTS = ("neither quantized", "weights quantized", "cache quantized", "both quantized")


def variants(p: QuantizationParams) -> dict[str, tuple[str, str]]:
    """The four combinations the claim compares, as (weight dtype, cache dtype). The names are fixed
    (the plots' categories); the labels say which dtypes they are now."""
    return dict(zip(VARIANTS, [(BASELINE, BASELINE), (p.weight_dtype, BASELINE), (BASELINE, p.kv_dtype),
                               (p.weight_dtype, p.kv_dtype)]))


def crossover_context(m, weight_dtype: str, kv_dtype: str, batch: int) -> float:
    """The context at which the batch's cache is as many bytes as the weights the step reads."""
    return weight_params_read(m, batch) * dtype_bytes(weight_dtype) / (batch * m.kv_bytes_per_token(dtype_bytes(kv_dtype)))


def evaluate(p: QuantizationParams) -> dict:
    m, gpu = MODELS[p.model], GPUS[p.gpu]
    eff = (p.bandwidth_efficiency, p.mfu)
    chosen = step(m, gpu, p.weight_dtype, p.kv_dtype, p.context, p.batch, *eff)
    base = step(m, gpu, BASELINE, BASELINE, p.context, p.batch, *eff)
    weights_only = step(m, gpu, p.weight_dtype, BASELINE, p.context, p.batch, *eff)
    cache_only = step(m, gpu, BASELINE, p.kv_dtype, p.context, p.batch, *eff)
    memory_needed = (m.params * dtype_bytes(p.weight_dtype)
                     + p.batch * p.context * m.kv_bytes_per_token(dtype_bytes(p.kv_dtype)))
    return {
        **chosen,
        "cache_share": chosen["kv_bytes"] / chosen["bytes"],
        "speedup_from_weights": base["seconds"] / weights_only["seconds"],
        "speedup_from_cache": base["seconds"] / cache_only["seconds"],
        "speedup_from_both": base["seconds"] / chosen["seconds"],
        "crossover_context": crossover_context(m, p.weight_dtype, p.kv_dtype, p.batch),
        "memory_needed_bytes": memory_needed,
        "fits_one_gpu": memory_needed <= gpu.memory_bytes,
    }


def page_data(p: QuantizationParams) -> dict:
    m, gpu = MODELS[p.model], GPUS[p.gpu]
    r = evaluate(p)
    combos = variants(p)
    eff = (p.bandwidth_efficiency, p.mfu)
    steps = {name: step(m, gpu, w, kv, p.context, p.batch, *eff) for name, (w, kv) in combos.items()}
    names = list(steps)
    ridge = gpu.bf16_tflops * 1e12 / (gpu.bandwidth_gbs * 1e9)
    intensities = [10 ** (i / 4) for i in range(-4, 17)]                 # 0.1 .. 10,000 FLOP/byte
    curve = {name: [step(m, gpu, w, kv, c, p.batch, *eff)["tokens_per_s_per_user"] for c in CURVE_CONTEXTS]
             for name, (w, kv) in variants(p).items()}
    batches = sorted(set(CURVE_BATCHES + [p.batch]))
    sources = {
        "bytes": {"variant": names, "weights_gb": [s["weight_bytes"] / 1e9 for s in steps.values()],
                  "cache_gb": [s["kv_bytes"] / 1e9 for s in steps.values()],
                  "total_gb": [s["bytes"] / 1e9 for s in steps.values()],
                  "ms": [s["seconds"] * 1e3 for s in steps.values()],
                  "label": [f"{combos[n][0]} weights, {combos[n][1]} cache: {s['seconds'] * 1e3:.2f} ms/step, "
                            f"{s['tokens_per_s_per_user']:,.0f} tok/s per user" for n, s in steps.items()]},
        "roofline": {"intensity": intensities,
                     "tflops": [min(gpu.bf16_tflops, x * gpu.bandwidth_gbs / 1e3) for x in intensities]},
        "points": {"variant": [f"{n} ({w}/{kv})" for n, (w, kv) in combos.items()], "intensity": [s["intensity"] for s in steps.values()],
                   "tflops": [s["flops"] / s["seconds"] / 1e12 for s in steps.values()]},
        "speed": {"context": CURVE_CONTEXTS, **{f"v{i}": curve[n] for i, n in enumerate(names)}},
        "crossover": {"batch": batches,
                      "context": [crossover_context(m, p.weight_dtype, p.kv_dtype, b) for b in batches]},
        "here": {"batch": [p.batch], "context": [p.context],
                 "text": [f"you: cache is {r['cache_share']:.0%} of the bytes"]},
    }
    return {
        "sources": sources,
        "texts": plot_summaries(sources),
        "ranges": {},
        "formula": formula(p, r, ridge),
        "readouts": readouts(p, r),
        "notes": notes(p, r),
        "variants": names,
        "run": {"kernel": "decode", "request": run_request(p)},
    }


def plot_summaries(sources: dict) -> dict:
    """Each plot in words, from the columns it draws."""
    b, pts, roof = sources["bytes"], sources["points"], sources["roofline"]
    reads = listing([f"{bytes_si(gb * 1e9, 2)} {name} ({sig(ms)} ms)"
                     for name, gb, ms in zip(b["variant"], b["total_gb"], b["ms"])])
    bytes_text = (f"A decode step reads {reads}; the cache is {bytes_si(b['cache_gb'][0] * 1e9, 2)} of the step "
                  f"with neither quantized.")
    peak, slope = max(roof["tflops"]), roof["tflops"][0] / roof["intensity"][0]
    ridge = peak / slope
    under = sum(x < ridge for x in pts["intensity"])
    roof_text = (f"This GPU's roof rises with bandwidth to a peak of {sig(peak)} TFLOP/s at {sig(ridge)} FLOP per "
                 f"byte; the four variants sit at {sig(min(pts['intensity']))} to {sig(max(pts['intensity']))} FLOP "
                 f"per byte and attain {sig(min(pts['tflops']))} to {sig(max(pts['tflops']))} TFLOP/s, "
                 + ("all memory-bound." if under == len(pts["intensity"]) else
                    "all compute-bound." if not under else f"{under} of them memory-bound."))
    sp = sources["speed"]
    ends = [(name, sp[f"v{i}"][0], sp[f"v{i}"][-1]) for i, name in enumerate(b["variant"])]
    speed_text = (f"Tokens per second per user from {thousands(sp['context'][0])} to {thousands(sp['context'][-1])} "
                  f"tokens of context: " + listing([f"{name} {sig(a)} to {sig(z)}" for name, a, z in ends]) + ".")
    cross, here = sources["crossover"], sources["here"]
    at = cross["context"][cross["batch"].index(here["batch"][0])]
    cross_text = (f"The cache outweighs the weights above {thousands(cross['context'][0])} tokens of context at a batch "
                  f"of {thousands(cross['batch'][0])}, and above {thousands(cross['context'][-1])} at "
                  f"{thousands(cross['batch'][-1])}; your batch of {thousands(here['batch'][0])} at "
                  f"{thousands(here['context'][0])} tokens is {'above' if here['context'][0] > at else 'below'} the "
                  f"line ({thousands(at)}).")
    return summaries(bytes=bytes_text, roof=roof_text, speed=speed_text, cross=cross_text)


RUN_CAP_BYTES = 512e6           # the server reads at most this much per "run it here", scaled down evenly


def run_request(p: QuantizationParams) -> dict:
    """The compute server's decode kernel body: this step's weight and cache bytes, scaled to fit the cap."""
    r = evaluate(p)
    scale = min(1.0, RUN_CAP_BYTES / r["bytes"])
    return {"weight_mb": max(1.0, round(r["weight_bytes"] * scale / 1e6, 3)),
            "kv_mb": round(r["kv_bytes"] * scale / 1e6, 3), "repeats": 5}


def describe_run(p: QuantizationParams, reply: dict) -> str:
    """One paragraph comparing the server's measurement with the model's prediction for that machine."""
    res = reply["result"]
    bw = res["copy_bytes_per_s"]
    measured_bw = res["model_bytes"] / res["seconds"]
    share = res["kv_bytes"] / res["model_bytes"]
    return (f"Measured on {reply.get('device_name', reply['device'])} ({reply['device']}, torch {reply['torch']}): "
            f"{res['weight_bytes'] / 1e6:,.0f} MB of weights read in {res['weight_seconds'] * 1e3:.2f} ms and "
            f"{res['kv_bytes'] / 1e6:,.0f} MB of cache in {res['kv_seconds'] * 1e3:.2f} ms, "
            f"{res['seconds'] * 1e3:.2f} ms in all ({measured_bw / 1e9:.1f} GB/s). The model predicts "
            f"{res['predicted_seconds'] * 1e3:.2f} ms at this machine's copy bandwidth of {bw / 1e9:.1f} GB/s "
            f"(measured in the same run): {res['seconds'] / res['predicted_seconds']:.2f}× of prediction. "
            f"The cache was {share:.0%} of the bytes, as on the page.")


def formula(p: QuantizationParams, r: dict, ridge: float) -> list[dict]:
    m, gpu = MODELS[p.model], GPUS[p.gpu]
    per_token = m.kv_bytes_per_token(dtype_bytes(p.kv_dtype))
    return [
        {"name": "Weight bytes per step",
         "formula": ("(always-used params + MoE layers × E × (1 − (1 − k/E)^batch) × params per expert) "
                     "× weight bytes" if m.is_moe else "params × weight bytes"),
         "substituted": f"{decode_weights_formula(m, p.batch)} × {dtype_bytes(p.weight_dtype):g} B",
         "result": bytes_si(r["weight_bytes"], 2)},
        {"name": "Cache bytes per step", "formula": "batch × context × KV bytes per token",
         "substituted": f"{thousands(p.batch)} × {tokens(p.context)} × {thousands(per_token)} B",
         "result": bytes_si(r["kv_bytes"], 2)},
        {"name": "Memory time", "formula": "(weight bytes + cache bytes) ÷ (bandwidth × efficiency)",
         "substituted": f"{bytes_si(r['bytes'], 2)} ÷ ({gpu.bandwidth_gbs:,g} GB/s × {p.bandwidth_efficiency:g})",
         "result": f"{r['memory_seconds'] * 1e3:.3f} ms"},
        {"name": "Compute time", "formula": "(2 × active params × batch + batch × context × attention FLOPs/token) "
                                            "÷ (peak FLOP/s × MFU)",
         "substituted": f"{r['flops'] / 1e12:.4g} TFLOP ÷ ({gpu.bf16_tflops:,g} TFLOP/s × {p.mfu:g})",
         "result": f"{r['compute_seconds'] * 1e3:.3f} ms"},
        {"name": "Step time", "formula": "max(memory time, compute time)  (roofline)",
         "substituted": f"max({r['memory_seconds'] * 1e3:.3f}, {r['compute_seconds'] * 1e3:.3f}) ms; "
                        f"intensity {r['intensity']:.3g} FLOP/B vs ridge {ridge:.0f} FLOP/B",
         "result": f"{r['seconds'] * 1e3:.3f} ms, {r['bound']}-bound"},
        {"name": "Tokens per second", "formula": "per user: 1 ÷ step time; in total: batch ÷ step time",
         "substituted": f"1 ÷ {r['seconds'] * 1e3:.3f} ms; {thousands(p.batch)} ÷ {r['seconds'] * 1e3:.3f} ms",
         "result": f"{r['tokens_per_s_per_user']:,.0f} per user, {r['tokens_per_s_total']:,.0f} in total"},
        {"name": "Crossover context", "formula": "weight bytes ÷ (batch × KV bytes per token)",
         "substituted": f"{bytes_si(r['weight_bytes'], 2)} ÷ ({thousands(p.batch)} × {thousands(per_token)} B)",
         "result": f"{tokens(r['crossover_context'])} tokens"},
    ]


def readouts(p: QuantizationParams, r: dict) -> list[dict]:
    return [
        {"label": f"{p.weight_dtype} weights", "value": f"{r['speedup_from_weights']:.2f}×",
         "detail": f"{_than(r['speedup_from_weights'])} {BASELINE} weights (cache at {BASELINE})"},
        {"label": f"{p.kv_dtype} cache", "value": f"{r['speedup_from_cache']:.2f}×",
         "detail": f"{_than(r['speedup_from_cache'])} a {BASELINE} cache (weights at {BASELINE})"},
        {"label": "Cache share of bytes", "value": f"{r['cache_share']:.0%}",
         "detail": f"{bytes_si(r['kv_bytes'])} of {bytes_si(r['bytes'])} read per step"},
        {"label": "Per user", "value": f"{r['tokens_per_s_per_user']:,.0f} tok/s",
         "detail": f"{r['seconds'] * 1e3:.2f} ms per step, {r['bound']}-bound"},
        {"label": "In total", "value": f"{r['tokens_per_s_total']:,.0f} tok/s",
         "detail": f"batch of {thousands(p.batch)}"},
    ]


def _than(speedup: float) -> str:
    """A dtype wider than the baseline (fp32) slows the step: say so instead of "0.50× faster"."""
    return "faster than" if speedup >= 1 else "the speed of"


def notes(p: QuantizationParams, r: dict) -> list[str]:
    m, gpu = MODELS[p.model], GPUS[p.gpu]
    out = []
    if not r["fits_one_gpu"]:
        out.append(f"This does not fit one {gpu.title}: the weights and the batch's cache need "
                   f"{bytes_si(r['memory_needed_bytes'])}, at least {gpus_needed(r['memory_needed_bytes'], gpu):,} "
                   f"GPUs of {gpu.memory_gb:g} GB, and the step time here reads its bytes at one GPU's bandwidth as "
                   f"if one held them all.")
    if p.context > m.max_context:
        out.append(f"{m.title} was released for at most {tokens(m.max_context)} tokens; {tokens(p.context)} is past "
                   f"that, and the arithmetic does not know it.")
    if m.is_moe:
        out.append(f"{m.title} is a mixture of experts: a step reads only its {m.active_params / 1e9:g}B active "
                   f"parameters at batch 1, but a batch of {thousands(p.batch)} touches "
                   f"{r['experts_touched']:,.1f} of its {m.experts} routed experts per layer on average, so it reads "
                   f"{r['weight_params_read'] / 1e9:,.1f}B of its {m.params / 1e9:g}B parameters.")
    return out

