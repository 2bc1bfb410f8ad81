"""Sharing KV across layers: the depth axis of KV-cache compression, counted and measured.

The cache can shrink along four axes that multiply: tokens (eviction keeps a share of them), heads
(GQA and MQA cache fewer KV heads than query heads), the feature dimension (MLA caches a latent) and
depth. Along depth, follower layers attend with an anchor layer's cached K and V instead of their
own, so with a sharing factor s only ⌈layers ÷ s⌉ layers cache anything (cross-layer attention,
Brandon et al. 2024, sec. 2.2-2.3). This module counts bytes per token along all four axes for a
model preset, and reads what the real kernels measured on the project's own trained models
(`kvx bake cross-layer`: how alike the layers' caches are, and what sharing costs when it is imposed
after training or trained in) from the baked results, so every control stays a fast lookup.
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import dataclasses
import math

from ..core import baked
from ..core.dtypes import DTYPE_BITS, dtype_bits, dtype_bytes
from ..core.limits import kept_tokens
from ..core.models import MODELS, ModelPreset
from ..core.params import Params, choice, integer, number
from ..core.summaries import listing, pct, sig, summaries
from ..core.units import bytes_both, bytes_iec, bytes_si, thousands, tokens

SLUG = "cross-layer"
DTYPES = tuple(DTYPE_BITS)
BASE_DTYPE = "bf16"                # every preset's released cache precision, and the MHA baseline's
MEASURES = ("cka", "cosine")
MEASURE_TITLES = {"cka": "linear CKA", "cosine": "raw cosine"}
CURVE_CONTEXTS = [round(2 ** (7 + i / 2)) for i in range(0, 2 * 16 + 1)]     # 128 .. 8,388,608 tokens
CURVE_SHARES = (1, 2, 4)
RUN_REQUEST = {"model": "gqa-large", "sequences": 8}      # the compute server's `cross-layer` kernel
SEQ_LEN = 512                                             # bytes per sequence in the kernels (compute/lm/train.py)

# ---- Brandon et al. 2024: the paper's own shapes ------------------------------------------------------
# Table 2: the 1B models have d_model 2,048 and 20 layers, the 3B models 3,072 and 32; query heads are
# d_model ÷ d_head (sec. 3.1). Their cache is 16-bit (Tables 1, 3, 5 count "KV bytes per token (16-bit)").
_PAPER = "W. Brandon et al., Reducing Transformer Key-Value Cache Size with Cross-Layer Attention, arXiv 2405.12981"
PAPER_PRESETS = {p.slug: p for p in [
    ModelPreset("cla-paper-1b", "Brandon et al. 1B, H128-MQA", "MQA", 20, 16, 1, 128, 1e9, 2048,
                _PAPER + ", Tables 1 and 2 (about 1B parameters)"),
    ModelPreset("cla-paper-3b", "Brandon et al. 3B, H128-MQA", "MQA", 32, 24, 1, 128, 3e9, 2048,
                _PAPER + ", Tables 2 and 5 (about 3B parameters)"),
]}
PRESETS: dict[str, ModelPreset] = {**MODELS, **PAPER_PRESETS}

# Table 1 (1B scale, 20 layers, 16-bit cache): model, d_head, query heads, KV heads, sharing factor, and what
# the paper reports: KV bytes per token and validation perplexity. The uniform sharing patterns only (the
# paper's KeepEnds/DenseFront/DenseBack rows group layers unevenly).
TABLE1_LAYERS = 20
TABLE1_LABELLED = {"H128-MHA", "H128-MQA", "H64-MQA", "H32-MQA", "H128-MQA-CLA2", "H128-MQA-CLA3", "H128-MQA-CLA4"}
TABLE1 = [
    ("H128-MHA", 128, 16, 16, 1, 163_840, 13.15),
    ("H128-GQA4", 128, 16, 4, 1, 40_960, 13.36),
    ("H128-GQA2", 128, 16, 2, 1, 20_480, 13.52),
    ("H128-MQA", 128, 16, 1, 1, 10_240, 13.54),
    ("H64-MQA", 64, 32, 1, 1, 5_120, 13.81),
    ("H46-MQA", 46, 45, 1, 1, 3_680, 13.96),
    ("H32-MQA", 32, 64, 1, 1, 2_560, 14.37),
    ("H512-MQA-CLA2", 512, 4, 1, 2, 20_480, 13.49),
    ("H256-MQA-CLA2", 256, 8, 1, 2, 10_240, 13.51),
    ("H128-MQA-CLA2", 128, 16, 1, 2, 5_120, 13.60),
    ("H90-MQA-CLA2", 90, 22, 1, 2, 3_600, 13.73),
    ("H64-MQA-CLA2", 64, 32, 1, 2, 2_560, 13.89),
    ("H256-GQA4-CLA2", 256, 8, 4, 2, 40_960, 13.38),
    ("H128-GQA4-CLA2", 128, 16, 4, 2, 20_480, 13.48),
    ("H128-GQA2-CLA2", 128, 16, 2, 2, 10_240, 13.59),
    ("H128-MQA-CLA3", 128, 16, 1, 3, 3_584, 13.77),
    ("H128-MQA-CLA4", 128, 16, 1, 4, 2_560, 13.95),
]
# Table 5 (3B scale, 32 layers, learning rates tuned): KV bytes per token and validation perplexity.
TABLE5_LAYERS = 32
TABLE5 = [("H128-MQA", 128, 24, 1, 1, 16_384, 9.52), ("H128-MQA-CLA2", 128, 24, 1, 2, 8_192, 9.34),
          ("H64-MQA", 64, 48, 1, 1, 8_192, 9.48)]


@dataclasses.dataclass(frozen=True)
class CrossLayerParams(Params):
    model: str = choice("llama-3-70b", PRESETS, help="Model preset (shapes from each model's config.json, or "
                                                     "the cross-layer attention paper's own 1B and 3B models)")
    share: int = integer(2, unit="layers per cache", min=1, max=8,
                         help="Layers that attend with one cached K and V: 1 = no sharing, 2 = pairs (CLA2), "
                              "4 = groups of four")
    kv_dtype: str = choice("int4", DTYPES, parse=dtype_bytes, unit="dtype or bits",
                           help="Cache precision: a dtype or an average bit-width such as 4.5")
    keep: float = number(100.0, unit="% of tokens", min=1, max=100,
                         help="Share of the context's tokens the cache keeps (eviction); 100 keeps all")
    context: int = integer(128_000, unit="tokens", min=1, max=10_000_000, help="Tokens of context per session")
    sessions: int = integer(16, unit="sessions", min=1, max=100_000, help="Sessions whose caches are held at once")
    measure: str = choice("cka", MEASURES, help="What the heat maps show for the trained model: linear CKA "
                                                "(basis-free) or raw cosine (coordinate by coordinate)")


# ---- bytes per token along the four axes ----------------------------------------------------------
def cached_layers(layers: int, share: int) -> int:
    """Layers that store K and V when groups of `share` consecutive layers use their first layer's:
    ⌈layers ÷ share⌉ (the last group is shorter when share does not divide layers; sec. 2.3, Figure 2)."""
    return -(-layers // share)


def mha_bytes_per_token(m: ModelPreset, bytes_per_number: float) -> float:
    """Every query head caching its own key and value: 2 × layers × q_heads × head_dim (sec. 2.1)."""
    return 2 * m.layers * m.q_heads * m.head_dim * bytes_per_number


def stages(m: ModelPreset, share: int, kv_dtype: str, keep: float) -> list[dict]:
    """Bytes per token of context after each axis, in order: heads/latent, depth, precision, tokens."""
    base = dtype_bytes(BASE_DTYPE)
    mha = mha_bytes_per_token(m, base)
    own = m.kv_bytes_per_token(base)
    cached = cached_layers(m.layers, share)
    shared = own * cached / m.layers
    typed = shared * dtype_bytes(kv_dtype) / base
    kept = typed * keep / 100
    kind = {"MHA": "MHA: every head", "GQA": f"GQA: {m.kv_heads} KV heads", "MQA": "MQA: one KV head",
            "MLA": f"MLA: {m.kv_latent} + {m.rope_dim} latent"}[m.attention]
    return [
        {"stage": "1. every head (MHA), bf16", "bytes": mha, "factor": 1.0, "what": f"{m.q_heads} heads × {m.head_dim}"},
        {"stage": "2. its own attention", "bytes": own, "factor": own / mha, "what": kind},
        {"stage": "3. shared across layers", "bytes": shared, "factor": cached / m.layers,
         "what": f"1:{share}, {cached} of {m.layers} layers cache"},
        {"stage": "4. cache precision", "bytes": typed, "factor": dtype_bytes(kv_dtype) / base,
         "what": f"{_dtype(kv_dtype)} instead of bf16"},
        {"stage": "5. tokens kept", "bytes": kept, "factor": keep / 100, "what": f"{keep:g}% of the context"},
    ]


def per_token(m: ModelPreset, share: int, kv_dtype: str, keep: float) -> float:
    return stages(m, share, kv_dtype, keep)[-1]["bytes"]


def _dtype(dtype: str) -> str:
    name = str(dtype).strip().lower()
    return name if name in DTYPE_BITS else f"{dtype_bits(dtype):g}-bit"


def table1() -> list[dict]:
    """The paper's Table 1 rows, with this page's formula next to the bytes the paper reports."""
    return [{"model": name, "share": s, "kv_heads": kv, "d_head": d, "kv_layers": cached_layers(TABLE1_LAYERS, s),
             "bytes": 2 * kv * d * cached_layers(TABLE1_LAYERS, s) * 2, "reported_bytes": rep, "perplexity": ppl}
            for name, d, _q, kv, s, rep, ppl in TABLE1]


def evaluate(p: CrossLayerParams) -> dict:
    m = PRESETS[p.model]
    st = stages(m, p.share, p.kv_dtype, p.keep)
    final = st[-1]["bytes"]
    own = st[1]["bytes"]
    kept = kept_tokens(p.keep / 100, p.context)           # whole tokens: a cache keeps no fraction of one
    total = st[3]["bytes"] * kept * p.sessions
    return {
        "mha_bytes_per_token": st[0]["bytes"], "own_bytes_per_token": own,
        "shared_bytes_per_token": st[2]["bytes"], "typed_bytes_per_token": st[3]["bytes"],
        "bytes_per_token": final, "cached_layers": cached_layers(m.layers, p.share), "layers": m.layers,
        "sharing_factor": m.layers / cached_layers(m.layers, p.share),
        "kept_tokens": kept, "total_bytes": total, "own_total_bytes": own * p.context * p.sessions,
        "vs_own": final / own, "vs_mha": final / st[0]["bytes"],
        "measured": measured_summary(p.share),
    }


# ---- what the kernels measured (baked) --------------------------------------------------------------
def results() -> dict:
    return baked.load(SLUG)


def provenance_label(b: dict | None = None) -> str:
    b = b or results()
    p = b["provenance"]
    device = p["device"] if p.get("device_type", "cpu") == "cpu" else f"{p['device']} ({p['device_type']})"
    return f"measured on {device} with torch {p['torch']}, baked {p['baked_on']} (`{p['command']}`)"


def bars(b: dict | None = None) -> list[dict]:
    """The measured rows, in the order the page draws them: own cache, imposed sharing, the fitted maps,
    and the model trained with sharing (when it was baked)."""
    b = b or results()
    name = b["model"]
    rows = []
    for s in b["sharing"]:
        label = f"{name}, own cache" if s["ratio"] == 1 else f"{name}, 1:{s['ratio']} imposed"
        rows.append({"key": f"imposed-{s['ratio']}", "label": label, "ratio": s["ratio"], **_metrics(s)})
    a = b["aligned"]
    rows.append({"key": "aligned-2", "label": f"{name}, 1:2 + fitted maps", "ratio": a["ratio"], **_metrics(a)})
    t = b["trained_in"]
    if t is not None:
        rows.append({"key": "trained-in", "label": f"{t['model']}, 1:{t['ratio']} trained in", "ratio": t["ratio"],
                     **_metrics(t)})
    return rows


def _metrics(s: dict) -> dict:
    return {"bits_per_byte": s["bits_per_byte"], "recall_byte_acc": s["recall_byte_acc"],
            "recall_value_acc": s["recall_value_acc"], "memory_fraction": s["memory_fraction"]}


def measured_summary(share: int) -> dict:
    """The measured rows at this sharing factor (empty when the tiny models were not measured at it)."""
    b = results()
    rows = {r["key"]: r for r in bars(b)}
    own = rows["imposed-1"]
    out = {"own": own, "imposed": rows.get(f"imposed-{share}") if share > 1 else None,
           "aligned": rows["aligned-2"] if share == 2 else None,
           "trained_in": rows.get("trained-in") if share == 2 else None}
    return out


def heat(b: dict, part: str, measure: str) -> dict:
    """One part's layer-by-layer matrix as rect rows: layer i (y) against layer j (x), colour and label."""
    m = b["similarity"][part][measure]
    n = len(m)
    cells = [(i, j, m[i][j]) for i in range(n) for j in range(n)]
    return {"x": [j for _, j, _ in cells], "y": [i for i, _, _ in cells], "value": [v for *_, v in cells],
            "label": [f"{v:.2f}" for *_, v in cells], "color": [heat_color(v) for *_, v in cells],
            "text_color": ["#ffffff" if abs(v) > 0.55 else "#111827" for *_, v in cells]}


def heat_color(v: float) -> str:
    """White at 0, dark blue at +1, dark orange at −1 (linear in each channel)."""
    v = max(-1.0, min(1.0, v))
    lo, hi = (248, 250, 252), ((30, 58, 138) if v >= 0 else (154, 52, 18))
    t = abs(v)
    return "#" + "".join(f"{round(a + (b - a) * t):02x}" for a, b in zip(lo, hi))


def _pct(x: float) -> str:
    """0.5 -> '50%', 0.0026 -> '0.3%'."""
    return f"{x:.0%}" if abs(x * 100 - round(x * 100)) < 1e-9 or x >= 0.995 else f"{x:.1%}"


def similarity_text(b: dict, measure: str) -> str:
    k, v = b["similarity"]["k"], b["similarity"]["v"]
    n = len(k["cka"])
    adj = ", ".join(f"{i}–{i + 1}" for i in range(n - 1))
    def pairs(part):
        return ", ".join(f"{part[measure][i][i + 1]:.2f}" for i in range(n - 1))
    if measure == "cka":
        return (f"Linear CKA of {b['model']}'s cached keys and values between layers (1 = the same information up "
                f"to a rotation and a scale; the random baseline, a layer against noise of its shape, is "
                f"{k['random_cka']:.3f} for K and {v['random_cka']:.3f} for V). Adjacent pairs ({adj}): K {pairs(k)}; "
                f"V {pairs(v)}. Over {thousands(b['data']['similarity_sequences'] * b['data']['seq_len'])} held-out "
                f"tokens, {provenance_label(b)}.")
    return (f"Raw cosine of {b['model']}'s cached keys and values between layers, token by token and averaged: it "
            f"compares coordinates, and each layer projects into its own basis, so it reads near 0 even where CKA "
            f"finds the same information. Adjacent pairs ({adj}): K {pairs(k)}; V {pairs(v)}. "
            f"{provenance_label(b)[0].upper()}{provenance_label(b)[1:]}.")


def measured_text(b: dict, share: int) -> str:
    rows = {r["key"]: r for r in bars(b)}
    own = rows["imposed-1"]
    c = b["config"]
    d = b["data"]
    head = (f"{b['model']} ({c['layers']} layers × {c['kv_heads']} KV heads × {c['head_dim']}, "
            f"{thousands(c['cache_numbers_per_token'])} cached numbers per token) with its own cache: "
            f"{own['bits_per_byte']:.3f} bits per byte on {thousands(d['text_sequences'] * d['seq_len'])} held-out "
            f"bytes, recall {_pct(own['recall_byte_acc'])} of value bytes (chance {_pct(d['recall_chance'])}). ")
    parts = []
    for key in ("imposed-2", "imposed-4", "aligned-2", "trained-in"):
        r = rows.get(key)
        if r is None:
            continue
        parts.append(f"{r['label']} ({_pct(r['memory_fraction'])} of the cache): {r['bits_per_byte']:.3f} bits per "
                     f"byte ({r['bits_per_byte'] - own['bits_per_byte']:+.3f}), recall {_pct(r['recall_byte_acc'])}")
    imposed = [r for k, r in rows.items() if k.startswith("imposed-") and r["ratio"] > 1]
    if imposed and all(r["recall_byte_acc"] >= own["recall_byte_acc"] - 0.02 for r in imposed):
        recall = (" Imposed sharing leaves the recall of planted values where it was ("
                  + ", ".join(f"1:{r['ratio']}: {_pct(r['recall_byte_acc'])}" for r in imposed)
                  + "): what it costs here is the prediction of ordinary text.")
    else:
        recall = "".join(f" Imposed 1:{r['ratio']} takes recall from {_pct(own['recall_byte_acc'])} to "
                         f"{_pct(r['recall_byte_acc'])}." for r in imposed)
    t = b["trained_in"]
    if t is not None and t["config"]:
        parts[-1] += (f" (it caches {thousands(t['config']['cache_numbers_per_token'])} numbers per token: "
                      f"{t['config']['cached_layers']} of its {t['config']['layers']} layers have K/V projections)")
    missing = "" if "trained-in" in rows else (" The model trained with sharing built in (gqa-cla2) was not in this "
                                               "build's checkpoints, so it is not shown.")
    return (head + "; ".join(parts) + "." + recall + f" {provenance_label(b)[0].upper()}{provenance_label(b)[1:]}."
            + missing)


# ---- the page ---------------------------------------------------------------------------------------
def curves(p: CrossLayerParams) -> dict:
    m = PRESETS[p.model]
    per = {s: per_token(m, s, p.kv_dtype, 100) for s in CURVE_SHARES}      # per token kept
    raw = m.kv_bytes_per_token(dtype_bytes(BASE_DTYPE))
    contexts = sorted(set(CURVE_CONTEXTS + [p.context]))
    kept = [kept_tokens(p.keep / 100, n) for n in contexts]
    return {"context": contexts,
            "raw": [raw * n * p.sessions / 1e9 for n in contexts],
            **{f"s{s}": [per[s] * k * p.sessions / 1e9 for k in kept] for s in CURVE_SHARES}}


def page_data(p: CrossLayerParams) -> dict:
    m = PRESETS[p.model]
    r = evaluate(p)
    b = results()
    st = stages(m, p.share, p.kv_dtype, p.keep)
    prev = [st[0]["bytes"]] + [s["bytes"] for s in st[:-1]]
    rows = bars(b)
    t1 = table1()
    highlight = {"imposed-1": p.share == 1, "imposed-2": p.share == 2, "imposed-4": p.share == 4,
                 "aligned-2": p.share == 2, "trained-in": p.share == 2}
    sources = {
        "stages": {"stage": [s["stage"] for s in st], "bytes": [s["bytes"] for s in st], "before": prev,
                   "one": [1.0] * len(st),
                   "label": [f"{thousands(s['bytes'], 0 if s['bytes'] >= 100 else 2)} B"
                             + ("" if s["factor"] == 1 else f"  (×{_factor(s['factor'])})") + f"  {s['what']}"
                             for s in st]},
        "memory": curves(p),
        "here": {"context": [p.context], "gb": [r["total_bytes"] / 1e9],
                 "text": [f"{bytes_si(r['total_bytes'])} = {bytes_iec(r['total_bytes'])}"]},
        "heat_k": heat(b, "k", p.measure),
        "heat_v": heat(b, "v", p.measure),
        "loss": {"label": [x["label"] for x in rows], "bits": [x["bits_per_byte"] for x in rows],
                 "recall": [x["recall_byte_acc"] for x in rows],
                 "alpha": [1.0 if highlight[x["key"]] else 0.45 for x in rows],
                 "text": [f"{x['bits_per_byte']:.3f} bits/byte, {_pct(x['memory_fraction'])} of the cache"
                          for x in rows],
                 "recall_text": [f"{_pct(x['recall_byte_acc'])} of bytes, {_pct(x['recall_value_acc'])} of values"
                                 for x in rows]},
        "paper": {"bytes": [row["bytes"] for row in t1], "perplexity": [row["perplexity"] for row in t1],
                  "model": [row["model"] for row in t1],
                  "label": [row["model"] if row["model"] in TABLE1_LABELLED else "" for row in t1],
                  "color": ["#dc2626" if row["share"] > 1 else "#2563eb" for row in t1],
                  "group": ["with CLA (reported)" if row["share"] > 1 else "without CLA (reported)" for row in t1]},
    }
    return {
        "sources": sources,
        "ranges": {"stages_x": [1, 10 ** (math.log10(max(s["bytes"] for s in st)) / 0.6)]},
        "formula": formula(p, r, st),
        "readouts": readouts(p, r),
        "notes": notes(p, r),
        "texts": {"similarity": similarity_text(b, p.measure), "measured": measured_text(b, p.share),
                  **plot_summaries(sources, MEASURE_TITLES[p.measure])},
        "run": {"kernel": "cross-layer", "request": dict(RUN_REQUEST)},
        "baked_label": provenance_label(b)[0].upper() + provenance_label(b)[1:],
        "recall_chance": b["data"]["recall_chance"],
    }


CURVE_WORDS = {"raw": "its own attention in bf16", "s1": "the chosen precision and kept tokens",
               "s2": "with 1:2 sharing", "s4": "with 1:4 sharing"}


def plot_summaries(sources: dict, measure: str) -> dict:
    """Each plot in words, from the columns it draws."""
    st = sources["stages"]
    names = [name.split(". ", 1)[-1] for name in st["stage"]]
    stages = (f"Bytes cached per token of context: {thousands(st['bytes'][0])} B with {names[0]}, then "
              + listing([f"{thousands(b, 0 if b >= 100 else 2)} B after {n}"
                         for n, b in zip(names[1:], st["bytes"][1:])]) + ".")
    m, here = sources["memory"], sources["here"]
    memory = (f"All sessions' caches at {thousands(here['context'][0])} tokens of context: {here['text'][0]} (the dot). "
              f"At {thousands(m['context'][-1])} tokens: " + listing([f"{sig(m[k][-1])} GB {w}"
                                                                      for k, w in CURVE_WORDS.items()]) + ".")
    pp = sources["paper"]
    groups = {}
    for b, ppl, model, group in zip(pp["bytes"], pp["perplexity"], pp["model"], pp["group"]):
        groups.setdefault(group, []).append((b, ppl, model))
    paper = ("Brandon et al.'s 1B models, bytes per token against perplexity: " + "; ".join(
        f"{len(rows)} {g.replace(' (reported)', '')}, from {thousands(max(rows)[0])} B ({max(rows)[2]}, perplexity "
        f"{max(rows)[1]:.2f}) down to {thousands(min(rows)[0])} B ({min(rows)[2]}, {min(rows)[1]:.2f})"
        for g, rows in groups.items()) + ".")

    def heat_text(part: str, h: dict) -> str:
        off = [(v, y, x) for x, y, v in zip(h["x"], h["y"], h["value"]) if x < y]
        hi, lo = max(off), min(off)
        return (f"{part} of the {max(h['x']) + 1} layers compared by {measure}: off the diagonal from {lo[0]:.2f} "
                f"(layers {lo[2]} and {lo[1]}) to {hi[0]:.2f} (layers {hi[2]} and {hi[1]}).")
    loss = sources["loss"]
    solid = [lab for lab, a in zip(loss["label"], loss["alpha"]) if a == 1.0]
    chosen = f" Solid, for the chosen sharing: {'; '.join(solid)}." if solid else ""
    bits = ("Held-out bits per byte: " + "; ".join(f"{lab}: {b:.3f}" for lab, b in zip(loss["label"], loss["bits"]))
            + "." + chosen)
    recall = ("Planted value bytes recalled: " + "; ".join(f"{lab}: {pct(r)}" for lab, r in
                                                           zip(loss["label"], loss["recall"])) + "." + chosen)
    return summaries(stages=stages, memory=memory, paper=paper, heat_k=heat_text("Keys", sources["heat_k"]),
                     heat_v=heat_text("Values", sources["heat_v"]), loss=bits, recall=recall)


def _factor(f: float) -> str:
    return f"1/{1 / f:,.4g}" if f < 1 else f"{f:g}"


def formula(p: CrossLayerParams, r: dict, st: list[dict]) -> list[dict]:
    m = PRESETS[p.model]
    b2 = dtype_bytes(BASE_DTYPE)
    cached = r["cached_layers"]
    own_formula = {"MLA": "layers × (latent + rope_dim) × 2 B",
                   "MHA": "2 × layers × heads × head_dim × 2 B"}.get(m.attention, "2 × layers × kv_heads × head_dim × 2 B")
    own_sub = (f"{m.layers} × ({m.kv_latent} + {m.rope_dim}) × {b2:g} B" if m.attention == "MLA"
               else f"2 × {m.layers} × {m.kv_heads} × {m.head_dim} × {b2:g} B")
    lines = [
        {"name": "Every head caches (MHA), bf16", "formula": "2 (K and V) × layers × q_heads × head_dim × 2 B",
         "substituted": f"2 × {m.layers} × {m.q_heads} × {m.head_dim} × {b2:g} B",
         "result": f"{thousands(st[0]['bytes'])} B per token"},
        {"name": f"{m.title}'s own attention ({m.attention}), bf16", "formula": own_formula, "substituted": own_sub,
         "result": f"{thousands(st[1]['bytes'])} B per token (×{_factor(st[1]['factor'])})"},
        {"name": f"Shared across layers, 1:{p.share}", "formula": "bytes × ⌈layers ÷ share⌉ ÷ layers",
         "substituted": f"{thousands(st[1]['bytes'])} B × ⌈{m.layers} ÷ {p.share}⌉ ÷ {m.layers} = "
                        f"{thousands(st[1]['bytes'])} B × {cached} ÷ {m.layers}",
         "result": f"{_num(st[2]['bytes'])} B per token"},
        {"name": f"Cache in {_dtype(p.kv_dtype)}", "formula": "bytes × cache bits ÷ 16",
         "substituted": f"{_num(st[2]['bytes'])} B × {dtype_bits(p.kv_dtype):g} ÷ 16",
         "result": f"{_num(st[3]['bytes'])} B per token"},
        {"name": f"Eviction keeps {p.keep:g}% of tokens", "formula": "bytes × kept share",
         "substituted": f"{_num(st[3]['bytes'])} B × {p.keep / 100:g}",
         "result": f"{_num(st[4]['bytes'])} B per token of context"},
        {"name": "The axes multiply", "formula": "own bf16 bytes × (cached layers ÷ layers) × (bits ÷ 16) × kept",
         "substituted": f"{thousands(st[1]['bytes'])} B × {cached}/{m.layers} × {dtype_bits(p.kv_dtype):g}/16 × "
                        f"{p.keep / 100:g}",
         "result": f"{_num(r['bytes_per_token'])} B: 1/{1 / r['vs_own']:,.4g} of {m.title}'s bf16 cache, "
                   f"1/{1 / r['vs_mha']:,.4g} of MHA's"},
        {"name": "All sessions' caches", "formula": "bytes per cached token × tokens kept × sessions, where tokens "
                                                    "kept = max(1, ⌊kept share × context⌋) (kvpress's rule)",
         "substituted": f"{_num(st[3]['bytes'])} B × {tokens(r['kept_tokens'])} × {thousands(p.sessions)}",
         "result": f"{bytes_both(r['total_bytes'])} (without compression beyond its own attention: "
                   f"{bytes_both(r['own_total_bytes'])})"},
    ]
    ms = r["measured"]
    own = ms["own"]
    if ms["imposed"] is not None:
        im = ms["imposed"]
        lines.append({"name": f"Measured: 1:{p.share} imposed on the trained tiny model",
                      "formula": "bits per byte with followers reading their anchor's cache − with their own",
                      "substituted": f"{im['bits_per_byte']:.3f} − {own['bits_per_byte']:.3f}",
                      "result": f"{im['bits_per_byte'] - own['bits_per_byte']:+.3f} bits per byte at "
                                f"{_pct(im['memory_fraction'])} of its cache"})
    if ms["trained_in"] is not None:
        t = ms["trained_in"]
        lines.append({"name": "Measured: 1:2 trained in (gqa-cla2) against the unshared model",
                      "formula": "bits per byte of the sharing model − of the unshared model's own cache",
                      "substituted": f"{t['bits_per_byte']:.3f} − {own['bits_per_byte']:.3f}",
                      "result": f"{t['bits_per_byte'] - own['bits_per_byte']:+.3f} bits per byte at "
                                f"{_pct(t['memory_fraction'])} of the cache"})
    return lines


def _num(x: float) -> str:
    return thousands(x) if float(x).is_integer() else f"{x:,.2f}"


def readouts(p: CrossLayerParams, r: dict) -> list[dict]:
    m = PRESETS[p.model]
    ms = r["measured"]
    out = [
        {"label": "Bytes per token", "value": f"{_num(r['bytes_per_token'])} B",
         "detail": f"{m.title}: 1/{1 / r['vs_own']:,.4g} of its own bf16 cache ({thousands(r['own_bytes_per_token'])} B)"},
        {"label": f"Sharing 1:{p.share}", "value": f"÷{r['sharing_factor']:,.3g}",
         "detail": f"{r['cached_layers']} of {r['layers']} layers cache K and V"},
        {"label": "All sessions", "value": bytes_si(r["total_bytes"]),
         "detail": f"= {bytes_iec(r['total_bytes'])}: {thousands(p.sessions)} × {tokens(p.context)} tokens"
                   + ("" if r["kept_tokens"] == p.context else f", {tokens(r['kept_tokens'])} of them kept")},
    ]
    own = ms["own"]
    if ms["imposed"] is not None:
        im = ms["imposed"]
        out.append({"label": f"Measured 1:{p.share}, imposed", "value": f"{im['bits_per_byte'] - own['bits_per_byte']:+.3f}",
                    "detail": f"bits/byte on the tiny model; recall {_pct(own['recall_byte_acc'])} → "
                              f"{_pct(im['recall_byte_acc'])}"})
    if ms["trained_in"] is not None:
        t = ms["trained_in"]
        out.append({"label": "Measured 1:2, trained in", "value": f"{t['bits_per_byte'] - own['bits_per_byte']:+.3f}",
                    "detail": f"bits/byte against the unshared model; recall {_pct(t['recall_byte_acc'])}"})
    return out


def notes(p: CrossLayerParams, r: dict) -> list[str]:
    m = PRESETS[p.model]
    out = []
    if m.layers % p.share:
        out.append(f"1:{p.share} does not divide {m.layers} layers: the last group is shorter, so {r['cached_layers']} "
                   f"layers cache and the saving is ÷{r['sharing_factor']:.3g}, slightly less than {p.share} (as the "
                   f"paper's sec. 2.3 notes).")
    if p.share > 1 and r["measured"]["imposed"] is None:
        out.append(f"The tiny models were measured at 1:1, 1:2 and 1:4 only; 1:{p.share} is arithmetic here.")
    if m.attention == "MLA" and p.share > 1:
        out.append("Sharing MLA's latent across layers is arithmetic here: the cross-layer attention paper trains "
                   "MQA and GQA models with it, not MLA.")
    if p.context > m.max_context:
        out.append(f"{tokens(p.context)} tokens is past the {tokens(m.max_context)} {m.title} was released for.")
    return out


# ---- "run it here": the server's cross-layer kernel on gqa-large --------------------------------------
def describe_run(p: CrossLayerParams, reply: dict) -> str:
    res, req = reply["result"], reply["params"]
    sim = res["similarity"]
    n = len(sim["k"]["cka"])
    b = results()
    same = req["model"] == b["model"] and req["sequences"] == b["data"]["similarity_sequences"]
    bits = 1 / math.log(2)
    share = ", ".join(f"1:{s['ratio']} {s['loss'] * bits:.3f} ({(s['loss'] - s['own_loss']) * bits:+.3f}, "
                      f"{_pct(s['memory_fraction'])} of the cache)" for s in res["sharing"] if s["ratio"] > 1)
    own = res["sharing"][0]["own_loss"] * bits
    k01, v01 = sim["k"]["cka"][0][1], sim["v"]["cka"][0][1]
    baked_k01 = b["similarity"]["k"]["cka"][0][1]
    compare = (f" (the baked heat map: {baked_k01:.3f}, from the same {req['sequences']} sequences)" if same else "")
    scored = f" (the bars above score {b['data']['text_sequences']} sequences)" if req["model"] == b["model"] else ""
    return (f"Measured on {reply.get('device_name', reply['device'])} ({reply['device']}, torch {reply['torch']}): "
            f"{req['model']} over {thousands(req['sequences'] * SEQ_LEN)} held-out tokens. Linear CKA between layers "
            f"0 and 1: K {k01:.3f}{compare}, V {v01:.3f}; raw cosine K {sim['k']['cosine'][0][1]:.3f}, "
            f"V {sim['v']['cosine'][0][1]:.3f}; random baseline {sim['k']['random_cka']:.3f}. Bits per byte on "
            f"these sequences with its own cache {own:.3f}; with followers reusing their anchor's cache: {share}"
            f"{scored}. "
            f"Its {n} layers cache {thousands(res['model_bytes'])} bytes per {SEQ_LEN}-token sequence in fp16.")
