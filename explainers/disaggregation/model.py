"""Split the phases, and the cache has to travel.

Disaggregated serving runs prefill on one pool of GPUs and decode on another, so the prompt's whole
KV cache crosses a link between them before decoding can start. Two ways to send it: all of it once
prefill has finished, or each layer's part as soon as that layer is computed, overlapped with the
layers still to come. This model lays both out on one timeline, layer by layer, and reports the
transfer time that prefill does not hide ("exposed"), against the time to first token, the second
token and the whole request. Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import dataclasses
import math

from ..core.dtypes import DTYPE_BITS, dtype_bytes
from ..core.timing import attention_flops, decode_step, flops_per_second, linear_flops as dense_flops
from ..core.gpus import GPUS
from ..core.links import LINKS
from ..core.models import MODELS
from ..core.limits import check_split, check_weights_fit
from ..core.params import ParamError, Params, choice, integer, number
from ..core.summaries import sig, summaries
from ..core.units import bytes_both, bytes_si, thousands, tokens

DTYPES = tuple(DTYPE_BITS)
WEIGHT_BYTES = 2                      # BF16 weights, for the decode step's bytes
MAX_LAYER_FRAMES = 40                 # the animation shows layers in groups beyond this
CURVE_CONTEXTS = [round(2 ** (7 + i / 2)) for i in range(0, 2 * 14 + 1)]   # 128 .. 2,097,152 tokens
MODES = ("after prefill", "layer by layer")


@dataclasses.dataclass(frozen=True)
class DisaggregationParams(Params):
    model: str = choice("llama-3-70b", MODELS, help="Model preset (shapes from each model's config.json)")
    context: int = integer(8_000, unit="tokens", min=1, max=2_000_000,
                           help="Prompt tokens prefilled, whose cache then crosses the link")
    output_tokens: int = integer(256, unit="tokens", min=1, max=100_000,
                                 help="Tokens generated: the first by prefill, the rest by decode")
    kv_dtype: str = choice("bf16", DTYPES, parse=dtype_bytes, unit="dtype or bits",
                           help="KV cache precision: a dtype or an average bit-width such as 4.5")
    prefill_gpu: str = choice("h100-sxm", GPUS, help="Prefill pool's GPU (datasheet dense BF16 FLOP/s)")
    decode_gpu: str = choice("h100-sxm", GPUS, help="Decode pool's GPU (datasheet memory bandwidth)")
    gpus: int = integer(8, unit="GPUs", min=1, max=64, help="GPUs in each pool, splitting the model (tensor parallel)")
    mfu: float = number(0.5, unit="share", min=0.01, max=1.0, help="Share of peak FLOP/s that prefill reaches")
    bandwidth_efficiency: float = number(1.0, unit="share", min=0.05, max=1.0,
                                         help="Share of the decode GPUs' datasheet memory bandwidth a decode step "
                                              "reaches (1: the datasheet, a lower bound on TPOT)")
    tpot_ms: float | None = number(None, unit="ms", min=0.001, max=100_000, optional=True,
                                   help="Decode time per output token (empty: weights and cache read once "
                                        "at the decode GPUs' datasheet bandwidth, a lower bound)")
    link: str = choice("ib-ndr-400g", LINKS, help="Link preset between the pools (rate each way, with its source)")
    link_gbps: float | None = number(None, unit="Gb/s", min=0.001, max=100_000, optional=True,
                                     help="Override: one link's rate in Gb/s (bits), each way (empty: the preset's)")
    links: int = integer(8, unit="links", min=1, max=64,
                         help="Links used at once; each GPU sends its part of the cache over its own "
                              "(Splitwise's machines: one InfiniBand link per GPU pair, so 8)")
    latency_us: float = number(20.0, unit="µs", min=0, max=1_000_000,
                               help="Fixed cost of each transfer: setup, synchronization, wire latency")
    layers: int | None = integer(None, unit="layers", min=1, max=512, optional=True,
                                 help="Override: layers, i.e. how many pieces layer-by-layer sending uses "
                                      "(empty: the model's); total FLOPs and bytes stay the same")

    def __post_init__(self):
        super().__post_init__()
        m = MODELS[self.model]
        check_split("gpus", m, self.gpus)
        for pool in (self.prefill_gpu, self.decode_gpu):
            check_weights_fit("gpus", m, GPUS[pool], self.gpus, WEIGHT_BYTES, "bf16")
        # The decode pool receives the whole prompt's cache and grows it by every output token, beside the weights.
        room = self.gpus * GPUS[self.decode_gpu].memory_bytes - m.params * WEIGHT_BYTES
        per_token = m.kv_bytes_per_token(dtype_bytes(self.kv_dtype))
        if (self.context + self.output_tokens) * per_token > room:
            most = int(room // per_token) - self.output_tokens
            raise ParamError("context", f"context must be at most {max(0, most):,} tokens for its cache and "
                                        f"{self.output_tokens:,} output tokens ({per_token:,.0f} B each) to fit in "
                                        f"the decode pool's {bytes_si(room)} beside the weights; got "
                                        f"{self.context:,}.")


# ---- the arithmetic ---------------------------------------------------------------------------------
def link_bytes_per_s(p: DisaggregationParams) -> float:
    """All links together, one way, in bytes per second."""
    one = LINKS[p.link].bytes_per_s if p.link_gbps is None else p.link_gbps * 1e9 / 8
    return p.links * one


def n_layers(p: DisaggregationParams) -> int:
    return p.layers or MODELS[p.model].layers


def exposed_layer_by_layer(layer_s: float, transfer_s: float, layers: int) -> float:
    """Closed form of the recurrence: τ + (L − 1) × max(0, τ − t).

    If one layer's transfer τ is no longer than one layer's prefill t, each transfer ends before the
    next layer's cache is ready, and only the last one is exposed. If it is longer, the link falls
    behind by τ − t at every layer.
    """
    return transfer_s + (layers - 1) * max(0.0, transfer_s - layer_s)


def evaluate(p: DisaggregationParams, context: int | None = None) -> dict:
    """The named results `kvx run` prints: seconds and bytes, and the shares of each latency."""
    m, gpu, dgpu = MODELS[p.model], GPUS[p.prefill_gpu], GPUS[p.decode_gpu]
    n = p.context if context is None else context
    L = n_layers(p)
    per_token = m.kv_bytes_per_token(dtype_bytes(p.kv_dtype))
    kv_bytes = n * per_token
    dense, attention = dense_flops(m, n), attention_flops(m, n)
    prefill_s = (dense + attention) / flops_per_second(gpu, p.gpus, p.mfu)      # the shared time model
    layer_s = prefill_s / L
    bw = link_bytes_per_s(p)
    latency = p.latency_us * 1e-6
    layer_bytes = kv_bytes / L
    transfer_s = latency + layer_bytes / bw
    after = latency + kv_bytes / bw
    layerwise = exposed_layer_by_layer(layer_s, transfer_s, L)
    # One batch-1 decode step on the shared roofline: weights (active ones for MoE) and this cache, read once.
    step = decode_step(m, dgpu, batch=1, context=n, weight_bytes_per_param=WEIGHT_BYTES,
                       kv_bytes_per_element=dtype_bytes(p.kv_dtype), gpus=p.gpus,
                       bandwidth_efficiency=p.bandwidth_efficiency)
    auto_tpot = step["seconds"]
    tpot = auto_tpot if p.tpot_ms is None else p.tpot_ms / 1e3
    e2e = prefill_s + (p.output_tokens - 1) * tpot
    out = {
        "layers": L, "kv_bytes_per_token": per_token, "kv_bytes": kv_bytes, "layer_bytes": layer_bytes,
        "dense_flops": dense, "attention_flops": attention, "prefill_seconds": prefill_s,
        "layer_seconds": layer_s, "link_bytes_per_s": bw, "transfer_seconds_per_layer": transfer_s,
        "tpot_seconds": tpot, "tpot_source": "auto" if p.tpot_ms is None else "set", "tpot_bound": step["bound"],
        "e2e_seconds_colocated": e2e,
        "link_keeps_up": transfer_s <= layer_s,
        "layerwise_beats_after": layerwise <= after,
    }
    for key, x in (("after", after), ("layerwise", layerwise)):
        out[f"exposed_seconds_{key}"] = x
        out[f"share_of_ttft_{key}"] = x / prefill_s
        out[f"share_of_second_token_{key}"] = x / tpot
        out[f"share_of_e2e_{key}"] = x / e2e
    return out


def simulate(p: DisaggregationParams, r: dict) -> dict:
    """Every layer's prefill and, for the layer-by-layer mode, its transfer: end_i = max(ready_i, end_{i−1}) + τ."""
    L, t, tau = r["layers"], r["layer_seconds"], r["transfer_seconds_per_layer"]
    prefill = [(i * t, (i + 1) * t) for i in range(L)]
    sends, free = [], 0.0
    for _, ready in prefill:
        start = max(ready, free)
        free = start + tau
        sends.append((start, free))
    return {"prefill": prefill, "sends": sends, "exposed_layerwise": sends[-1][1] - prefill[-1][1]}


# ---- what the page draws ----------------------------------------------------------------------------
LANES = [f"{mode} · {what}" for mode in MODES for what in ("prefill", "link", "decode")]


def gantt(p: DisaggregationParams, r: dict) -> tuple[dict, list[str]]:
    """Bars for both modes, each with the animation frame at which it appears, and one caption a frame."""
    sim = simulate(p, r)
    L = r["layers"]
    group = max(1, math.ceil(L / MAX_LAYER_FRAMES))
    frames = math.ceil(L / group)
    rows = {"lane": [], "start": [], "end": [], "style": [], "label": [], "frame": []}

    def add(lane, start, end, style, label, frame):
        rows["lane"].append(lane)
        rows["start"].append(start * 1e3)
        rows["end"].append(end * 1e3)
        rows["style"].append(style)
        rows["label"].append(label)
        rows["frame"].append(frame)

    per_layer = bytes_si(r["layer_bytes"])
    for i, ((a, b), (s, e)) in enumerate(zip(sim["prefill"], sim["sends"])):
        f = i // group
        shade = "a" if i % 2 == 0 else "b"
        for mode in MODES:
            add(f"{mode} · prefill", a, b, f"prefill-{shade}", f"prefill of layer {i + 1}: {(b - a) * 1e3:.3f} ms", f)
        add(f"{MODES[1]} · link", s, e, f"link-{shade}",
            f"layer {i + 1}'s cache ({per_layer}): {s * 1e3:.3f} → {e * 1e3:.3f} ms", f)
    T, tpot = r["prefill_seconds"], r["tpot_seconds"]
    xa, xb = r["exposed_seconds_after"], r["exposed_seconds_layerwise"]
    add(f"{MODES[0]} · link", T, T + xa, "link-a",
        f"the whole cache ({bytes_si(r['kv_bytes'])}): {T * 1e3:.2f} → {(T + xa) * 1e3:.2f} ms", frames)
    for mode, x in zip(MODES, (xa, xb)):
        add(f"{mode} · decode", T + x, T + x + tpot, "decode",
            f"first decode step: {(T + x) * 1e3:.2f} → {(T + x + tpot) * 1e3:.2f} ms", frames + 1)

    captions = []
    for f in range(frames):
        first, last = f * group, min(L, (f + 1) * group) - 1
        who = f"Layer {last + 1}" if first == last else f"Layers {first + 1}–{last + 1}"
        s, e = sim["sends"][last]
        ready = sim["prefill"][last][1]
        wait = s - ready
        lag = (f" It waits {wait * 1e3:.3f} ms for the link, which is still sending earlier layers."
               if wait > 1e-12 else " The link is free, so it starts at once.")
        captions.append(f"{who} of {L} computed by {ready * 1e3:.2f} ms. Layer by layer: layer {last + 1}'s cache "
                        f"({per_layer}) is sent from {s * 1e3:.3f} to {e * 1e3:.3f} ms.{lag} After prefill: "
                        f"nothing is sent yet.")
    captions.append(f"Prefill ends at {T * 1e3:.2f} ms. After prefill: the whole cache ({bytes_si(r['kv_bytes'])}) "
                    f"only now starts across the link and takes {xa * 1e3:.2f} ms. Layer by layer: "
                    f"{xb * 1e3:.3f} ms of sending is left.")
    captions.append(f"First decode step starts at {(T + xb) * 1e3:.2f} ms layer by layer and at "
                    f"{(T + xa) * 1e3:.2f} ms after prefill: the transfer adds {xb * 1e3:.3f} ms or "
                    f"{xa * 1e3:.2f} ms before the second token.")
    return rows, captions


def overhead_curve(p: DisaggregationParams) -> dict:
    """Prefill time and both exposed times against context, everything else held."""
    contexts = sorted(set(CURVE_CONTEXTS + [p.context]))
    rs = [evaluate(p, c) for c in contexts]
    return {"context": contexts, "prefill_ms": [r["prefill_seconds"] * 1e3 for r in rs],
            "after_ms": [r["exposed_seconds_after"] * 1e3 for r in rs],
            "layerwise_ms": [r["exposed_seconds_layerwise"] * 1e3 for r in rs]}


def by_link(p: DisaggregationParams) -> dict:
    """Both exposed times for every link preset, at the current settings (the override ignored)."""
    names, after, layerwise = [], [], []
    for slug, link in LINKS.items():
        r = evaluate(dataclasses.replace(p, link=slug, link_gbps=None))
        names.append(link.title)
        after.append(r["exposed_seconds_after"] * 1e3)
        layerwise.append(r["exposed_seconds_layerwise"] * 1e3)
    return {"link": names, "after_ms": after, "layerwise_ms": layerwise, "links": [p.links] * len(names),
            "after_text": [f"{x:,.3g} ms" for x in after], "layerwise_text": [f"{x:,.3g} ms" for x in layerwise]}


def _ms(x: float) -> str:
    return f"{x * 1e3:,.3f} ms" if x < 0.1 else f"{x * 1e3:,.2f} ms"


def _pct(x: float) -> str:
    return f"{x:.2%}" if x < 0.1 else f"{x:.1%}" if x < 10 else f"{x:,.0%}"


def formula(p: DisaggregationParams, r: dict) -> list[dict]:
    m, gpu, dgpu, link = MODELS[p.model], GPUS[p.prefill_gpu], GPUS[p.decode_gpu], LINKS[p.link]
    L = r["layers"]
    kvb = dtype_bytes(p.kv_dtype)
    per_token_sub = (f"{m.layers} × ({m.kv_latent} + {m.rope_dim}) × {kvb:g} B" if m.attention == "MLA"
                     else f"2 × {m.layers} × {m.kv_heads} × {m.head_dim} × {kvb:g} B")
    one_link = (f"{p.link_gbps:,g} Gb/s (set)" if p.link_gbps is not None
                else f"{link.gbit_each_way:,g} Gb/s ({link.title}, each way)")
    active = m.active_params or m.params
    lines = [
        {"name": "Cache to send", "formula": f"context × KV bytes per token ({m.kv_formula()})",
         "substituted": f"{tokens(p.context)} × ({per_token_sub})",
         "result": f"{bytes_both(r['kv_bytes'])}; {bytes_si(r['layer_bytes'])} per layer"},
        {"name": "Prefill FLOPs",
         "formula": "2 × active params × n  +  2 × layers × q_heads × (d_qk + d_v) × n²/2  (causal)",
         "substituted": f"2 × {active / 1e9:g}e9 × {tokens(p.context)}  +  2 × {m.layers} × {m.q_heads} × "
                        f"({m.attention_qk_dim} + {m.attention_v_dim}) × {tokens(p.context)}²/2",
         "result": f"{r['dense_flops'] / 1e12:,.1f} + {r['attention_flops'] / 1e12:,.1f} TFLOP"},
        {"name": "Prefill time (TTFT)", "formula": "FLOPs ÷ (GPUs × peak FLOP/s × MFU); per layer: ÷ layers",
         "substituted": f"{(r['dense_flops'] + r['attention_flops']) / 1e12:,.1f} TFLOP ÷ ({p.gpus} × "
                        f"{gpu.bf16_tflops:,g} TFLOP/s × {p.mfu:g}); ÷ {L}",
         "result": f"{_ms(r['prefill_seconds'])}; {_ms(r['layer_seconds'])} per layer"},
        {"name": "Link bandwidth", "formula": "links × one link's rate each way ÷ 8 bits per byte",
         "substituted": f"{p.links} × {one_link} ÷ 8",
         "result": f"{r['link_bytes_per_s'] / 1e9:,.4g} GB/s"},
        {"name": "One layer's transfer τ", "formula": "latency + bytes per layer ÷ bandwidth",
         "substituted": f"{p.latency_us:g} µs + {bytes_si(r['layer_bytes'])} ÷ {r['link_bytes_per_s'] / 1e9:,.4g} GB/s",
         "result": f"{_ms(r['transfer_seconds_per_layer'])} "
                   f"({'≤' if r['link_keeps_up'] else '>'} {_ms(r['layer_seconds'])} of prefill per layer)"},
        {"name": "Exposed, after prefill", "formula": "latency + all bytes ÷ bandwidth",
         "substituted": f"{p.latency_us:g} µs + {bytes_si(r['kv_bytes'])} ÷ {r['link_bytes_per_s'] / 1e9:,.4g} GB/s",
         "result": _ms(r["exposed_seconds_after"])},
        {"name": "Exposed, layer by layer",
         "formula": "end_i = max(prefill_end_i, end_(i−1)) + τ;  exposed = end_L − TTFT = τ + (L − 1) × max(0, τ − t)",
         "substituted": f"{_ms(r['transfer_seconds_per_layer'])} + {L - 1} × max(0, "
                        f"{_ms(r['transfer_seconds_per_layer'])} − {_ms(r['layer_seconds'])})",
         "result": _ms(r["exposed_seconds_layerwise"])},
    ]
    if r["tpot_source"] == "auto":
        lines.append({"name": "Decode time per token (TPOT)",
                      "formula": "(weights × 2 B + cache) ÷ (GPUs × memory bandwidth × efficiency): one batch-1 "
                                 "step, a lower bound",
                      "substituted": f"({active / 1e9:g}e9 × 2 B + {bytes_si(r['kv_bytes'])}) ÷ ({p.gpus} × "
                                     f"{dgpu.bandwidth_gbs:,g} GB/s × {p.bandwidth_efficiency:g})"
                                     + ("" if r["tpot_bound"] == "memory" else "; compute takes longer here, "
                                        "so TPOT is FLOPs ÷ (GPUs × peak FLOP/s)"),
                      "result": _ms(r["tpot_seconds"])})
    else:
        lines.append({"name": "Decode time per token (TPOT)", "formula": "set by hand (tpot_ms)",
                      "substituted": f"{p.tpot_ms:g} ms", "result": _ms(r["tpot_seconds"])})
    lines.append({"name": "End to end, not split", "formula": "TTFT + (output tokens − 1) × TPOT",
                  "substituted": f"{_ms(r['prefill_seconds'])} + {thousands(p.output_tokens - 1)} × "
                                 f"{_ms(r['tpot_seconds'])}",
                  "result": _ms(r["e2e_seconds_colocated"])})
    for key, mode in (("after", "after prefill"), ("layerwise", "layer by layer")):
        x = r[f"exposed_seconds_{key}"]
        lines.append({"name": f"Shares, {mode}", "formula": "exposed ÷ TTFT;  ÷ TPOT (the second token);  ÷ end to end",
                      "substituted": f"{_ms(x)} ÷ {_ms(r['prefill_seconds'])};  ÷ {_ms(r['tpot_seconds'])};  "
                                     f"÷ {_ms(r['e2e_seconds_colocated'])}",
                      "result": f"{_pct(r[f'share_of_ttft_{key}'])} of TTFT, "
                                f"{_pct(r[f'share_of_second_token_{key}'])} of the second token, "
                                f"{_pct(r[f'share_of_e2e_{key}'])} of end to end"})
    if not r["layerwise_beats_after"]:
        lines.append({"name": "Why layer by layer loses here",
                      "formula": "layer by layer − after prefill = (L − 1) × (latency − t) when the link is behind",
                      "substituted": f"{L - 1} × ({p.latency_us:g} µs − {_ms(r['layer_seconds'])})",
                      "result": _ms(r["exposed_seconds_layerwise"] - r["exposed_seconds_after"]) + " more"})
    return lines


def readouts(p: DisaggregationParams, r: dict) -> list[dict]:
    return [
        {"label": "Cache to send", "value": bytes_si(r["kv_bytes"]),
         "detail": f"{tokens(p.context)} tokens; {bytes_si(r['layer_bytes'])} per layer"},
        {"label": "Prefill (TTFT)", "value": _ms(r["prefill_seconds"]),
         "detail": f"{_ms(r['layer_seconds'])} per layer, {r['layers']} layers"},
        {"label": "Exposed, after prefill", "value": _ms(r["exposed_seconds_after"]),
         "detail": f"{_pct(r['share_of_ttft_after'])} of TTFT, {_pct(r['share_of_e2e_after'])} of end to end"},
        {"label": "Exposed, layer by layer", "value": _ms(r["exposed_seconds_layerwise"]),
         "detail": f"{_pct(r['share_of_ttft_layerwise'])} of TTFT, {_pct(r['share_of_e2e_layerwise'])} of end to end"},
        {"label": "Second token", "value": f"+{_pct(r['share_of_second_token_after'])} / "
                                           f"+{_pct(r['share_of_second_token_layerwise'])}",
         "detail": f"after prefill / layer by layer, on a {_ms(r['tpot_seconds'])} TPOT"},
    ]


def notes(p: DisaggregationParams, r: dict) -> list[str]:
    m = MODELS[p.model]
    out = []
    if p.context > m.max_context:
        out.append(f"{m.title} was released for at most {tokens(m.max_context)} tokens; "
                   f"{tokens(p.context)} is past that, and the arithmetic does not know it.")
    if not r["layerwise_beats_after"]:
        out.append("Layer by layer loses here: each transfer's fixed latency is longer than one layer's prefill, "
                   "so paying it once per layer costs more than it hides. Splitwise sends small prompts whole for "
                   "this reason (sec. 4.3).")
    elif not r["link_keeps_up"]:
        out.append("The link is slower than prefill: layer-by-layer transfers fall behind at every layer, and the "
                   "exposed time grows with the number of layers.")
    if m.attention == "MLA":
        out.append("For MLA the attention FLOPs use q_heads × head_dim, an approximation.")
    return out


def plot_summaries(sources: dict, ranges: dict) -> dict:
    """Each plot in words, from the bars and lines it draws (the timeline as it stands at the last frame)."""
    g = sources["gantt"]
    bars = {lane: [(a, b) for ln, a, b in zip(g["lane"], g["start"], g["end"]) if ln == lane] for lane in LANES}
    after, layerwise = MODES
    layers = len(bars[f"{after} · prefill"])
    prefill_end = max(b for _, b in bars[f"{after} · prefill"])
    whole = bars[f"{after} · link"][0]
    sends = bars[f"{layerwise} · link"]
    decode = {mode: bars[f"{mode} · decode"][0][0] for mode in MODES}
    gantt_text = (f"Prefill of {layers} layers ends at {sig(prefill_end, 4)} ms in both modes. Sent after prefill, "
                  f"the whole cache crosses the link from {sig(whole[0], 4)} to {sig(whole[1], 4)} ms; sent layer by "
                  f"layer, the last layer arrives at {sig(sends[-1][1], 4)} ms. The first decode step starts at "
                  f"{sig(decode[after], 4)} ms after prefill and at {sig(decode[layerwise], 4)} ms layer by layer.")
    z0, z1 = ranges["zoom_x"]
    zoom_text = (f"Between {sig(z0)} and {sig(z1)} ms: after prefill the link is busy for {sig(whole[1] - whole[0])} ms "
                 f"once prefill ends; layer by layer each layer's transfer takes {sig(sends[-1][1] - sends[-1][0])} ms "
                 f"and decoding waits {sig(decode[layerwise] - prefill_end)} ms after prefill, against "
                 f"{sig(decode[after] - prefill_end)} ms.")
    c, here = sources["curve"], sources["here"]
    curve_text = (f"From {thousands(c['context'][0])} to {thousands(c['context'][-1])} prompt tokens, prefill grows "
                  f"from {sig(c['prefill_ms'][0])} to {sig(c['prefill_ms'][-1])} ms; the exposed transfer grows from "
                  f"{sig(c['after_ms'][0])} to {sig(c['after_ms'][-1])} ms after prefill and from "
                  f"{sig(c['layerwise_ms'][0])} to {sig(c['layerwise_ms'][-1])} ms layer by layer. At "
                  f"{thousands(here['context'][0])} tokens: {sig(here['ms'][0])} and {sig(here['ms'][1])} ms.")
    ln = sources["links"]
    lo_a, hi_a = min(zip(ln["after_ms"], ln["link"])), max(zip(ln["after_ms"], ln["link"]))
    lo_b, hi_b = min(zip(ln["layerwise_ms"], ln["link"])), max(zip(ln["layerwise_ms"], ln["link"]))
    links_text = (f"Over {len(ln['link'])} link presets ({ln['links'][0]} links each), the exposed time after prefill "
                  f"runs from {sig(lo_a[0])} ms ({lo_a[1]}) to {sig(hi_a[0])} ms ({hi_a[1]}), and layer by layer from "
                  f"{sig(lo_b[0])} ms ({lo_b[1]}) to {sig(hi_b[0])} ms ({hi_b[1]}).")
    return summaries(gantt=gantt_text, zoom=zoom_text, curve=curve_text, links=links_text)


def page_data(p: DisaggregationParams) -> dict:
    r = evaluate(p)
    rows, captions = gantt(p, r)
    end = max(rows["end"]) * 1.03
    after_prefill = max(r["exposed_seconds_after"], r["exposed_seconds_layerwise"]) + r["tpot_seconds"]
    zoom = [max(0.0, r["prefill_seconds"] - 0.3 * after_prefill - r["layer_seconds"]) * 1e3,
            (r["prefill_seconds"] + 1.05 * after_prefill) * 1e3]
    curve = overhead_curve(p)
    sources = {
        "gantt": rows,
        "curve": curve,
        "here": {"context": [p.context, p.context],
                 "ms": [r["exposed_seconds_after"] * 1e3, r["exposed_seconds_layerwise"] * 1e3],
                 "text": [f"after prefill: {_ms(r['exposed_seconds_after'])}",
                          f"layer by layer: {_ms(r['exposed_seconds_layerwise'])}"],
                 "dy": [4, -20]},                                  # labels above and below, never on top
        "links": by_link(p),
    }
    ranges = {"gantt_x": [0, end], "zoom_x": zoom}      # fixed while animating
    return {
        "sources": sources,
        "texts": plot_summaries(sources, ranges),
        "animation": {"source": "gantt", "frames": len(captions), "captions": captions},
        "ranges": ranges,
        "formula": formula(p, r),
        "readouts": readouts(p, r),
        "notes": notes(p, r),
    }
