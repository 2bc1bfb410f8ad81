"""Cross-model KV cache transfer: price the handoff when a cascade escalates to the larger sibling.

A cascade answers with a small model and escalates hard requests to a larger one from the same
family. The large model then needs its own KV cache of the context. Two ways to get it: prefill the
whole context again on the large model, or map the small model's cache (which the cascade already
computed) across with learned linear maps, one per large layer, KV head, and K or V, fitted by ridge
regression with RoPE taken out of the keys so that a map does not depend on position. This model
counts the FLOPs, time and memory of both ways. How much quality the map keeps is not arithmetic: it
is measured (the project's own models, "run it here") or reported (published work, on the page).
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import dataclasses
import math

from ..core.dtypes import DTYPE_BITS, dtype_bytes
from ..core.timing import attention_flops, flops_per_second, linear_flops as dense_flops
from ..core.gpus import GPUS
from ..core.links import LINKS
from ..core.models import MODELS
from ..core.limits import check_split, check_weights_fit
from ..core.params import ParamError, Params, choice, integer, number
from ..core.summaries import listing, pct, sig, summaries, times
from ..core.units import bytes_both, bytes_si, thousands, tokens

DTYPES = tuple(DTYPE_BITS)
CACHE_BYTES = 2                       # caches and weights are BF16 when the maps read and write them
WEIGHT_BYTES = 2
HOST_LINK = LINKS["pcie-5-x16"]       # maps kept in host memory stream over this for every handoff
ROPE_FLOPS_PER_NUMBER = 3             # rotating a pair: 4 multiplies and 2 adds, 3 per number
MAX_CONTEXT = 10_000_000
CURVE_CONTEXTS = [round(2 ** (4 + i / 2)) for i in range(0, 2 * 19 + 1)]       # 16 .. 8,388,608 tokens
# Models with a per-head cache; MLA caches one latent per layer, which these per-head maps do not fit.
FAMILY = tuple(slug for slug, m in MODELS.items() if m.attention != "MLA")
MAP_INPUTS = {
    "head": "one small-model KV head",
    "layer": "every KV head of one small-model layer",
    "all-layers": "every layer's K and V of the small model (what the project's kernel fits)",
}
# The project's own trained pair (compute/lm/train.py CONFIGS; a test checks them against the checkpoints).
TINY = {
    "gqa-small": {"layers": 3, "kv_heads": 2, "head_dim": 32},
    "gqa-large": {"layers": 4, "kv_heads": 2, "head_dim": 32},
}
RUN_REQUEST = {"fit_sequences": 8, "eval_sequences": 2, "ridge": 1e-2}
SEQ_LEN = 512                         # tokens per sequence in the kernel (compute/lm/train.py)


@dataclasses.dataclass(frozen=True)
class CrossModelParams(Params):
    small: str = choice("qwen2.5-14b", FAMILY, help="The cascade's small model, whose cache exists already")
    large: str = choice("qwen2.5-32b", FAMILY, help="The larger sibling the request escalates to")
    context: int = integer(8_000, unit="tokens", min=1, max=MAX_CONTEXT, help="Tokens of context handed over")
    map_input: str = choice("head", tuple(MAP_INPUTS),
                            help="What each large-model head's map reads: one small head, a whole small "
                                 "layer, or all small layers (as the project's kernel does)")
    map_dtype: str = choice("bf16", DTYPES, parse=dtype_bytes, unit="dtype or bits",
                            help="Precision the maps are stored in")
    gpu: str = choice("h100-sxm", GPUS, help="GPU the large model runs on (datasheet FLOP/s and bandwidth)")
    gpus: int = integer(1, unit="GPUs", min=1, max=64, help="GPUs the large model is split over")
    mfu: float = number(0.5, unit="share", min=0.01, max=1.0, help="Share of peak FLOP/s reached")
    bandwidth_efficiency: float = number(1.0, unit="share", min=0.05, max=1.0,
                                         help="Share of datasheet memory bandwidth reached (1: the datasheet)")
    maps_in: str = choice("gpu-memory", ("gpu-memory", "host-memory"),
                          help="Where the maps wait between handoffs; host memory streams them over "
                               "PCIe 5.0 x16 every time")
    small_prefill: str = choice("already-paid", ("already-paid", "counted"),
                                help="Whether the small model's prefill is charged to the handoff "
                                     "(a cascade has already paid it)")

    def __post_init__(self):
        super().__post_init__()
        s, l_ = MODELS[self.small], MODELS[self.large]
        if s.params >= l_.params:
            raise ParamError("large", f"large must have more parameters than small ({s.title}, "
                                      f"{s.params / 1e9:g}B); got {l_.title} ({l_.params / 1e9:g}B).")
        gpu = GPUS[self.gpu]
        check_split("gpus", l_, self.gpus)
        check_weights_fit("gpus", l_, gpu, self.gpus, WEIGHT_BYTES, "bf16")
        # The large model's GPUs hold its weights, the maps (unless they wait in host memory) and its new cache.
        maps = (map_shape(_shape(s), _shape(l_), self.map_input)["numbers"] * dtype_bytes(self.map_dtype)
                if self.maps_in == "gpu-memory" else 0.0)
        room = self.gpus * gpu.memory_bytes - l_.params * WEIGHT_BYTES - maps
        per_token = l_.kv_bytes_per_token(CACHE_BYTES)
        if self.context * per_token > room:
            raise ParamError("context", f"context must be at most {max(0, int(room // per_token)):,} tokens for "
                                        f"{l_.title}'s cache ({per_token:,.0f} B each) to fit in {self.gpus} × "
                                        f"{gpu.memory_gb:g} GB beside its weights{' and the maps' if maps else ''}; "
                                        f"got {self.context:,}.")


# ---- the shapes of the maps ---------------------------------------------------------------------------
def source_layer(j: int, small_layers: int, large_layers: int) -> int:
    """Large layer j reads small layer ⌊j × L_small / L_large⌋: in order, each small layer feeding about
    L_large / L_small consecutive large layers."""
    return j * small_layers // large_layers


def source_head(h: int, small_heads: int, large_heads: int) -> int:
    return h * small_heads // large_heads


def map_shape(small: dict, large: dict, map_input: str) -> dict:
    """Maps: one per large layer × large KV head × (K, V); each (d_in + 1) × d_out numbers (+1: a bias)."""
    d_in = {"head": small["head_dim"],
            "layer": small["kv_heads"] * small["head_dim"],
            "all-layers": 2 * small["layers"] * small["kv_heads"] * small["head_dim"]}[map_input]
    count = large["layers"] * large["kv_heads"] * 2
    d_out = large["head_dim"]
    return {"d_in": d_in, "d_out": d_out, "count": count, "numbers": count * (d_in + 1) * d_out}


def _shape(m) -> dict:
    return {"layers": m.layers, "kv_heads": m.kv_heads, "head_dim": m.head_dim}


def map_flops_per_token(shape: dict) -> float:
    """2 FLOPs per map number per token (a multiply and an add)."""
    return 2 * shape["numbers"]


def rope_flops_per_token(small: dict, large: dict) -> float:
    """Undo RoPE on every small key, redo it on every large key."""
    return ROPE_FLOPS_PER_NUMBER * (small["layers"] * small["kv_heads"] * small["head_dim"]
                                    + large["layers"] * large["kv_heads"] * large["head_dim"])


# ---- the two ways, at one context -------------------------------------------------------------------
def costs(p: CrossModelParams, n: float) -> dict:
    s, l_, gpu = MODELS[p.small], MODELS[p.large], GPUS[p.gpu]
    shape = map_shape(_shape(s), _shape(l_), p.map_input)
    flops_per_s = flops_per_second(gpu, p.gpus, p.mfu)          # the shared time model (core/timing.py)
    bytes_per_s = p.gpus * gpu.bandwidth_gbs * 1e9 * p.bandwidth_efficiency
    kv_small, kv_large = s.kv_bytes_per_token(CACHE_BYTES), l_.kv_bytes_per_token(CACHE_BYTES)
    map_bytes = shape["numbers"] * dtype_bytes(p.map_dtype)
    # Re-prefill: the weights' and attention FLOPs; reads the weights once and writes the large cache.
    re_flops = dense_flops(l_, n) + attention_flops(l_, n)
    re_bytes = (l_.active_params or l_.params) * WEIGHT_BYTES + n * kv_large
    re_s = max(re_flops / flops_per_s, re_bytes / bytes_per_s)
    # Map: every map over every token, RoPE out and in; reads the maps and the small cache, writes the large.
    map_f = n * (map_flops_per_token(shape) + rope_flops_per_token(_shape(s), _shape(l_)))
    map_b = map_bytes + n * (kv_small + kv_large)
    small_f = small_s = 0.0
    if p.small_prefill == "counted":
        small_f = dense_flops(s, n) + attention_flops(s, n)
        small_s = max(small_f / flops_per_s, ((s.active_params or s.params) * WEIGHT_BYTES + n * kv_small) / bytes_per_s)
    host_s = map_bytes / HOST_LINK.bytes_per_s if p.maps_in == "host-memory" else 0.0
    map_s = small_s + max(map_f / flops_per_s, map_b / bytes_per_s) + host_s
    return {"reprefill_flops": re_flops, "reprefill_bytes": re_bytes, "reprefill_seconds": re_s,
            "map_flops": map_f + small_f, "map_only_flops": map_f, "small_prefill_flops": small_f,
            "map_bytes_moved": map_b, "map_seconds": map_s, "host_seconds": host_s, "small_prefill_seconds": small_s}


def break_even(p: CrossModelParams) -> dict:
    """The context at which mapping becomes as fast as re-prefilling, if there is one below 10M tokens.

    Re-prefill time grows at least linearly and its attention term quadratically; the map's is linear plus a
    fixed cost (reading, or streaming, the maps). So re-prefill can win only at short contexts.
    """
    def gap(n):
        c = costs(p, n)
        return c["map_seconds"] - c["reprefill_seconds"]

    if gap(1) <= 0:
        return {"kind": "map-always", "tokens": None}
    if gap(MAX_CONTEXT) > 0:
        return {"kind": "reprefill-always", "tokens": None}
    lo, hi = 1.0, float(MAX_CONTEXT)
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if gap(mid) > 0:
            lo = mid
        else:
            hi = mid
        if hi - lo < 0.01:
            break
    n = math.ceil(lo)                           # contexts are whole tokens: the first one at which mapping wins
    return {"kind": "crossing", "tokens": n if gap(n) <= 0 else n + 1}


def flops_break_even(p: CrossModelParams) -> dict:
    """FLOPs alone: the map path costs c·n (+ the small prefill's a_small·n² if counted), re-prefill
    2P·n + a·n². They are equal at n = (c − 2P) ÷ (a − a_small) when c > 2P."""
    s, l_ = MODELS[p.small], MODELS[p.large]
    a_small = attention_flops(s, 1.0) if p.small_prefill == "counted" else 0.0
    c = costs(p, 1.0)["map_flops"] - a_small
    two_p, a = dense_flops(l_, 1.0), attention_flops(l_, 1.0) - a_small
    if c <= two_p:
        return {"kind": "map-fewer", "tokens": None}
    if a <= 0:
        return {"kind": "map-more", "tokens": None}
    return {"kind": "crossing", "tokens": math.ceil((c - two_p) / a)}     # the first whole context past it


def evaluate(p: CrossModelParams) -> dict:
    s, l_ = MODELS[p.small], MODELS[p.large]
    shape = map_shape(_shape(s), _shape(l_), p.map_input)
    c = costs(p, p.context)
    be, fbe = break_even(p), flops_break_even(p)
    map_bytes = shape["numbers"] * dtype_bytes(p.map_dtype)
    large_weights = l_.params * WEIGHT_BYTES
    return {
        **c,
        "map_count": shape["count"], "map_d_in": shape["d_in"], "map_d_out": shape["d_out"],
        "map_numbers": shape["numbers"], "map_memory_bytes": map_bytes,
        "map_memory_share_of_weights": map_bytes / large_weights,
        "large_weight_bytes": large_weights,
        "small_cache_bytes": p.context * s.kv_bytes_per_token(CACHE_BYTES),
        "large_cache_bytes": p.context * l_.kv_bytes_per_token(CACHE_BYTES),
        "flops_ratio": c["map_flops"] / c["reprefill_flops"],
        "time_ratio": c["map_seconds"] / c["reprefill_seconds"],
        "break_even_kind": be["kind"], "break_even_tokens": be["tokens"],
        "flops_break_even_kind": fbe["kind"], "flops_break_even_tokens": fbe["tokens"],
        "layer_map": [source_layer(j, s.layers, l_.layers) for j in range(l_.layers)],
    }


# ---- "run it here": the real fit on the project's own pair -------------------------------------------
def tiny_map_flops_per_token() -> float:
    """This page's all-layers formula for the project's gqa-small → gqa-large pair."""
    return map_flops_per_token(map_shape(TINY["gqa-small"], TINY["gqa-large"], "all-layers"))


def describe_run(p: CrossModelParams, reply: dict) -> str:
    """The server's fit on the project's own models, in words, with the quality it kept."""
    res, req = reply["result"], reply["params"]
    bits = 1 / math.log(2)
    own, mapped, small = (res["large_own_loss"] * bits, res["large_mapped_loss"] * bits, res["small_loss"] * bits)
    eval_tokens = req["eval_sequences"] * SEQ_LEN
    gain = small - own
    kept = (small - mapped) / gain if gain > 0 else float("nan")
    if gain <= 0:
        verdict = "The large model is no better than the small one on this text, so there is nothing to keep."
    elif mapped >= small:
        verdict = ("The mapped cache is worse than the small model alone: on this pair the map keeps none of the "
                   "large model's advantage, and the handoff would lose quality.")
    else:
        verdict = f"The map keeps {kept:.0%} of the large model's advantage over the small one."
    formula_flops = tiny_map_flops_per_token() * eval_tokens
    return (f"Measured on {reply.get('device_name', reply['device'])} ({reply['device']}, torch {reply['torch']}): "
            f"a ridge map (λ = {req['ridge']:g}) from every layer and KV head of the project's gqa-small "
            f"(3 layers × 2 KV heads × 32) to each of gqa-large's (4 layers × 2 KV heads × 32), RoPE taken out of "
            f"the keys, fitted on {thousands(req['fit_sequences'] * SEQ_LEN)} tokens of training text and scored "
            f"on {thousands(eval_tokens)} held-out tokens. Large model with its own cache: {own:.3f} bits per "
            f"byte; with the mapped cache: {mapped:.3f}; the small model alone: {small:.3f}. {verdict} "
            f"The map took {res['map_flops'] / res['reprefill_flops']:.1%} of re-prefill's FLOPs "
            f"({res['map_flops']:.4g} against {res['reprefill_flops']:.4g}, which counts only 2 × weights × tokens); "
            f"this page's all-layers formula gives {formula_flops:.4g} for the same shapes.")


# ---- what the page draws ----------------------------------------------------------------------------
def _t(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:,.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:,.2f} ms"
    return f"{seconds * 1e6:,.1f} µs"


def _f(flops: float) -> str:
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if flops >= size:
            return f"{flops / size:,.3g} {unit}"
    return f"{flops:,.0f} FLOP"


def _share(x: float) -> str:
    return f"{x:.3%}" if x < 0.01 else f"{x:.1%}"


def break_even_text(r: dict) -> str:
    if r["break_even_kind"] == "map-always":
        return "none: mapping is faster at every context"
    if r["break_even_kind"] == "reprefill-always":
        return f"none: re-prefill is faster up to {tokens(MAX_CONTEXT)} tokens"
    return f"{tokens(r['break_even_tokens'])} tokens (re-prefill is faster below)"


def curves(p: CrossModelParams) -> dict:
    contexts = sorted(set(CURVE_CONTEXTS + [p.context]))
    cs = [costs(p, n) for n in contexts]
    return {"context": contexts,
            "reprefill_flops": [c["reprefill_flops"] for c in cs], "map_flops": [c["map_flops"] for c in cs],
            "reprefill_ms": [c["reprefill_seconds"] * 1e3 for c in cs], "map_ms": [c["map_seconds"] * 1e3 for c in cs]}


def formula(p: CrossModelParams, r: dict) -> list[dict]:
    s, l_, gpu = MODELS[p.small], MODELS[p.large], GPUS[p.gpu]
    mb = dtype_bytes(p.map_dtype)
    last = l_.layers - 1
    d_in_sub = {"head": f"head_dim_small = {s.head_dim}",
                "layer": f"kv_heads_small × head_dim_small = {s.kv_heads} × {s.head_dim}",
                "all-layers": f"2 × layers_small × kv_heads_small × head_dim_small = 2 × {s.layers} × {s.kv_heads} × "
                              f"{s.head_dim}"}[p.map_input]
    n = p.context
    fps = f"{p.gpus} × {gpu.bf16_tflops:,g} TFLOP/s × {p.mfu:g}"
    bps = f"{p.gpus} × {gpu.bandwidth_gbs:,g} GB/s × {p.bandwidth_efficiency:g}"
    lines = [
        {"name": "Which small layer feeds large layer j", "formula": "⌊ j × layers_small ÷ layers_large ⌋",
         "substituted": f"j = {last}: ⌊ {last} × {s.layers} ÷ {l_.layers} ⌋",
         "result": f"small layer {r['layer_map'][-1]} (each small layer feeds about "
                   f"{l_.layers / s.layers:.2g} large layers)"},
        {"name": "Input of one map", "formula": f"d_in for '{p.map_input}' ({MAP_INPUTS[p.map_input]})",
         "substituted": d_in_sub, "result": f"{thousands(r['map_d_in'])} numbers → {r['map_d_out']}"},
        {"name": "Maps", "formula": "layers_large × kv_heads_large × 2 (K and V), each (d_in + 1) × head_dim_large "
                                    "(+1: a bias)",
         "substituted": f"{l_.layers} × {l_.kv_heads} × 2 maps of ({thousands(r['map_d_in'])} + 1) × {l_.head_dim}",
         "result": f"{thousands(r['map_count'])} maps, {thousands(r['map_numbers'])} numbers"},
        {"name": "Maps' memory", "formula": "numbers × bytes per number",
         "substituted": f"{thousands(r['map_numbers'])} × {mb:g} B",
         "result": f"{bytes_both(r['map_memory_bytes'])} ({_share(r['map_memory_share_of_weights'])} of the large "
                   f"model's {bytes_si(r['large_weight_bytes'])} of weights)"},
        {"name": "Map FLOPs", "formula": "n × (2 × map numbers + 3 × (small keys + large keys) for RoPE out and in)",
         "substituted": f"{tokens(n)} × (2 × {thousands(r['map_numbers'])} + 3 × ({s.layers * s.kv_heads * s.head_dim:,}"
                        f" + {l_.layers * l_.kv_heads * l_.head_dim:,}))",
         "result": _f(r["map_only_flops"])},
        {"name": "Re-prefill FLOPs", "formula": "2 × params_large × n + 2 × layers × q_heads × (d_qk + d_v) × n²/2 "
                                                "(causal)",
         "substituted": f"2 × {l_.params / 1e9:g}e9 × {tokens(n)} + 2 × {l_.layers} × {l_.q_heads} × "
                        f"({l_.attention_qk_dim} + {l_.attention_v_dim}) × {tokens(n)}²/2",
         "result": _f(r["reprefill_flops"])},
    ]
    if p.small_prefill == "counted":
        lines.append({"name": "Small model's prefill (counted)",
                      "formula": "2 × params_small × n + 2 × layers × q_heads × (d_qk + d_v) × n²/2",
                      "substituted": f"2 × {s.params / 1e9:g}e9 × {tokens(n)} + 2 × {s.layers} × {s.q_heads} × "
                                     f"({s.attention_qk_dim} + {s.attention_v_dim}) × {tokens(n)}²/2",
                      "result": f"{_f(r['small_prefill_flops'])}, {_t(r['small_prefill_seconds'])}"})
    lines += [
        {"name": "Re-prefill time", "formula": "max(FLOPs ÷ (GPUs × peak × MFU), (weights + large cache) ÷ "
                                               "(GPUs × bandwidth × efficiency))",
         "substituted": f"max({_f(r['reprefill_flops'])} ÷ ({fps}), {bytes_si(r['reprefill_bytes'])} ÷ ({bps}))",
         "result": _t(r["reprefill_seconds"])},
        {"name": "Map time", "formula": "max(FLOPs ÷ (GPUs × peak × MFU), (maps + small cache + large cache) ÷ "
                                        "(GPUs × bandwidth × efficiency))" + (" + maps ÷ PCIe" if p.maps_in == "host-memory" else "")
                                        + (" + small prefill" if p.small_prefill == "counted" else ""),
         "substituted": f"max({_f(r['map_only_flops'])} ÷ ({fps}), {bytes_si(r['map_bytes_moved'])} ÷ ({bps}))"
                        + (f" + {bytes_si(r['map_memory_bytes'])} ÷ {HOST_LINK.gbyte_each_way:g} GB/s"
                           if p.maps_in == "host-memory" else "")
                        + (f" + {_t(r['small_prefill_seconds'])}" if p.small_prefill == "counted" else ""),
         "result": _t(r["map_seconds"])},
        {"name": "Ratio", "formula": "map ÷ re-prefill", "substituted":
            f"{_f(r['map_flops'])} ÷ {_f(r['reprefill_flops'])};  {_t(r['map_seconds'])} ÷ {_t(r['reprefill_seconds'])}",
         "result": f"{_share(r['flops_ratio'])} of the FLOPs, {_share(r['time_ratio'])} of the time"},
        {"name": "Break-even context", "formula": "the n where map time = re-prefill time (bisection); "
                                                  "FLOPs alone: n = (map FLOPs per token − 2 × params) ÷ attention "
                                                  "coefficient, if positive",
         "substituted": "time: " + break_even_text(r) + ";  FLOPs: "
                        + {"map-fewer": "none (the map costs fewer FLOPs per token than 2 × params)",
                           "map-more": "none (the map costs more FLOPs at every context)"}.get(
                               r["flops_break_even_kind"], f"{tokens(r['flops_break_even_tokens'] or 0)} tokens"),
         "result": break_even_text(r)},
    ]
    return lines


def readouts(p: CrossModelParams, r: dict) -> list[dict]:
    return [
        {"label": "Re-prefill", "value": _t(r["reprefill_seconds"]),
         "detail": f"{_f(r['reprefill_flops'])} on {MODELS[p.large].title}, {tokens(p.context)} tokens"},
        {"label": "Map the cache", "value": _t(r["map_seconds"]),
         "detail": f"{_f(r['map_flops'])}: {_share(r['flops_ratio'])} of the FLOPs"},
        {"label": "Break-even", "value": (tokens(r["break_even_tokens"]) if r["break_even_tokens"] else "none"),
         "detail": break_even_text(r)},
        {"label": "Maps' memory", "value": bytes_si(r["map_memory_bytes"]),
         "detail": f"{thousands(r['map_count'])} maps at {p.map_dtype}; {_share(r['map_memory_share_of_weights'])} of "
                   f"the weights"},
    ]


def notes(p: CrossModelParams, r: dict) -> list[str]:
    s, l_ = MODELS[p.small], MODELS[p.large]
    out = []
    if s.slug.rsplit("-", 1)[0] != l_.slug.rsplit("-", 1)[0]:        # "qwen2.5-14b" -> "qwen2.5"
        out.append(f"{s.title} and {l_.title} are not from the same family: they do not share a tokenizer, so "
                   f"their caches are not even over the same tokens. The arithmetic still runs.")
    if p.context > min(s.max_context, l_.max_context):
        out.append(f"{tokens(p.context)} tokens is past what one of these models was released for.")
    return out


def plot_summaries(sources: dict) -> dict:
    """Each plot in words, from the columns it draws."""
    c, here = sources["curve"], sources["here"]
    n, first, last = thousands(here["context"][0]), thousands(c["context"][0]), thousands(c["context"][-1])
    ratio = [a / b for a, b in zip(c["reprefill_flops"], c["map_flops"])]
    flops = (f"Re-prefilling the large model costs {times(min(ratio))} to {times(max(ratio))} the FLOPs of mapping the "
             f"small model's cache, from {first} to {last} tokens; at {n} tokens, {sig(here['flops'][0] / 1e12)} "
             f"TFLOP against {sig(here['flops'][1] / 1e12)} TFLOP.")
    faster = [m < r_ for m, r_ in zip(c["map_ms"], c["reprefill_ms"])]
    be = sources["breakeven"]["context"]
    when = (f"mapping is faster above {thousands(be[0])} tokens" if be else
            f"mapping is faster at every context from {first} to {last} tokens" if all(faster) else
            f"re-prefill is faster at every context from {first} to {last} tokens" if not any(faster) else
            "the two cross more than once")
    time = (f"At {n} tokens re-prefill takes {sig(here['ms'][0])} ms and mapping {sig(here['ms'][1])} ms; {when}.")
    m = dict(zip(sources["memory"]["what"], sources["memory"]["text"]))
    maps = m.pop("maps")
    memory = f"The maps take {maps}, next to " + listing([f"the {k} ({v})" for k, v in m.items()]) + "."
    lay = sources["layers"]
    small = sorted(set(lay["small"]))
    layers = (f"Each of the large model's {len(lay['large'])} layers reads one of the small model's layers "
              f"{small[0]} to {small[-1]}, {sig(len(lay['large']) / len(small), 2)} large layers per small layer on "
              f"average; the last large layer reads small layer {lay['small'][-1]}.")
    return summaries(flops=flops, time=time, memory=memory, layers=layers)


def page_data(p: CrossModelParams) -> dict:
    r = evaluate(p)
    s, l_ = MODELS[p.small], MODELS[p.large]
    be = r["break_even_tokens"]
    c = curves(p)
    be_row = ({"context": [be, be], "flops": [min(c["map_flops"]), max(c["reprefill_flops"])],
               "ms": [min(c["map_ms"] + c["reprefill_ms"]), max(c["map_ms"] + c["reprefill_ms"])]}
              if be else {"context": [], "flops": [], "ms": []})
    memory = [("large model's weights", r["large_weight_bytes"]), ("maps", r["map_memory_bytes"]),
              ("small model's cache", r["small_cache_bytes"]), ("large model's cache", r["large_cache_bytes"])]
    sources = {
        "curve": c,
        "here": {"context": [p.context, p.context], "flops": [r["reprefill_flops"], r["map_flops"]],
                 "ms": [r["reprefill_seconds"] * 1e3, r["map_seconds"] * 1e3],
                 "text": [f"re-prefill {_t(r['reprefill_seconds'])}", f"map {_t(r['map_seconds'])}"],
                 "dy": [4, -20]},                                  # labels above and below, never on top
        "breakeven": be_row,
        "memory": {"what": [m for m, _ in memory], "gb": [b / 1e9 for _, b in memory],
                   "text": [bytes_si(b) for _, b in memory]},
        "layers": {"large": list(range(l_.layers)), "small": r["layer_map"]},
    }
    return {
        "sources": sources,
        "texts": plot_summaries(sources),
        "ranges": {"layers_x": [-1, l_.layers], "layers_y": [-1, s.layers]},
        "formula": formula(p, r),
        "readouts": readouts(p, r),
        "notes": notes(p, r),
        "run": {"kernel": "cross-model", "request": dict(RUN_REQUEST)},
    }
