"""Multi-head latent attention: cache a latent, not the heads.

MLA (DeepSeek-V2, sec. 2.1) caches, per token and layer, one compressed latent c_KV (d_c numbers)
and one RoPE key k^R (d_h^R numbers) shared by every head, instead of a key and a value per head.
At decode the up-projections are folded into the query and the output, so per-head keys and
values are never rebuilt. This model counts the bytes per token of MHA, GQA, MQA and MLA, accounts
for the paper's "93.3% smaller" figure, steps through the decode shapes, and counts the bytes and
FLOPs of the naive and the absorbed decode (the same formulas as the compute server's kernel).
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import textwrap
import unicodedata

from ..core.dtypes import DTYPE_BITS, dtype_bytes
from ..core.gpus import GPUS
from ..core.limits import gpus_needed
from ..core.models import MODELS, ModelPreset
from ..core.params import Params, choice, integer, number
from ..core.summaries import listing, sig, summaries
from ..core.timing import decode_step, roofline_seconds
from ..core.units import bytes_si, tokens

DTYPES = tuple(DTYPE_BITS)
KINDS = ("MHA", "GQA", "MQA", "MLA")

# ---- the paper's own numbers ------------------------------------------------------------------------
PAPER_BASELINE = "deepseek-67b"      # "Compared with DeepSeek 67B, ... reduces the KV cache by 93.3%" (abstract)
PAPER_MODEL = "deepseek-v2"
PAPER_BASELINE_BITS = 16             # assumed: DeepSeek 67B's cache in BF16 (the paper does not say)
PAPER_DEPLOYED_BITS = 6              # sec. 3.2.3: "each element in its KV cache into 6 bits on average"
PAPER_CLAIM = 0.933


@dataclasses.dataclass(frozen=True)
class MLAShape:
    """The dimensions one MLA layer works with (DeepSeek-V2 paper, sec. 2.1 and 3.1.2)."""
    title: str
    layers: int
    d_model: int        # d: the hidden state h_t
    heads: int          # n_h
    d_h: int            # per-head dim of the no-RoPE query/key and of the value
    d_r: int            # d_h^R: the decoupled RoPE query/key per head
    d_c: int            # the KV latent (kv_lora_rank)
    d_cq: int           # d_c': the query latent (q_lora_rank); 0 means the query is not compressed


# Hidden size and query latent are not in the shared presets (only MLA pages need them).
_MLA_EXTRA = {
    "deepseek-v2": (5120, 1536),     # paper sec. 3.1.2: hidden dimension 5120, d_c' = 1536
    "deepseek-v3": (7168, 1536),     # DeepSeek-V3 report sec. 4.2; config.json hidden_size, q_lora_rank
}

# The layer the compute server's `mla` kernel runs: the first attention layer of the project's own
# trained MLA model (compute/lm/checkpoints/mla.json). A test checks these against the checkpoint.
KERNEL_SHAPE = MLAShape("the project's trained MLA model (compute/lm/checkpoints/mla.json)", layers=4,
                        d_model=192, heads=6, d_h=32, d_r=16, d_c=48, d_cq=0)
KERNEL_MAX_CONTEXT = 32_768          # the server's MLARequest bound


def mla_shape(slug: str) -> MLAShape:
    m = MODELS[slug]
    d_model, d_cq = _MLA_EXTRA[slug]
    return MLAShape(m.title, m.layers, d_model, m.q_heads, m.head_dim, m.rope_dim, m.kv_latent, d_cq)


def diagram_model(slug: str) -> str:
    """The model the step-through shows: the chosen one if it is MLA, else DeepSeek-V2."""
    return slug if MODELS[slug].attention == "MLA" and slug in _MLA_EXTRA else PAPER_MODEL


@dataclasses.dataclass(frozen=True)
class MLAParams(Params):
    model: str = choice(PAPER_MODEL, MODELS, help="Model preset whose shape is compared four ways "
                                                  "(shapes from each model's config.json)")
    kv_dtype: str = choice("bf16", DTYPES, parse=dtype_bytes, unit="dtype or bits",
                           help="KV cache precision: a dtype or an average bit-width such as 6")
    context: int = integer(4_096, unit="tokens", min=1, max=1_000_000,
                           help="Cached tokens at one decode step (the kernel runs at most 32,768)")
    gpu: str = choice("h100-sxm", GPUS, help="Accelerator for the modelled attention time per decode step")
    bandwidth_efficiency: float = number(1.0, unit="share", min=0.05, max=1.0,
                                         help="Share of datasheet memory bandwidth a decode step reaches "
                                              "(1: the roofline)")
    mfu: float = number(1.0, unit="share", min=0.01, max=1.0,
                        help="Share of peak BF16 FLOP/s a decode step reaches (1: the roofline)")


# ---- bytes per token, four ways -----------------------------------------------------------------------
def gqa_groups(m: ModelPreset) -> int:
    """A GQA model's own KV heads; otherwise 8 groups (as DeepSeek 67B and the paper's ablation, App. D.1),
    or the largest head count up to 8 that divides the query heads."""
    if m.attention == "GQA":
        return m.kv_heads
    return max(g for g in range(1, 9) if m.q_heads % g == 0)


def mla_dims(m: ModelPreset) -> tuple[int, int]:
    """(d_c, d_h^R): the model's own for MLA; otherwise sized as DeepSeek-V2 sizes them from the head
    dimension, d_c = 4 d_h and d_h^R = d_h / 2 (Table 1's caption)."""
    if m.attention == "MLA":
        return m.kv_latent, m.rope_dim
    return 4 * m.head_dim, m.head_dim // 2


def elements_per_token(m: ModelPreset) -> dict[str, int]:
    """Numbers cached per token, all layers, if this shape used each attention kind (paper, Table 1)."""
    l, h, d = m.layers, m.q_heads, m.head_dim
    d_c, d_r = mla_dims(m)
    return {"MHA": 2 * l * h * d, "GQA": 2 * l * gqa_groups(m) * d, "MQA": 2 * l * d, "MLA": l * (d_c + d_r)}


def bytes_per_token(m: ModelPreset, dtype: str) -> dict[str, float]:
    return {k: n * dtype_bytes(dtype) for k, n in elements_per_token(m).items()}


def equivalent_gqa_groups(d_c: int, d_r: int, d_h: int) -> float:
    """How many GQA groups cache as much as MLA: (d_c + d_h^R) l = 2 n_g d_h l."""
    return (d_c + d_r) / (2 * d_h)


def paper_accounting() -> dict:
    """The abstract's "reduces the KV cache by 93.3%" against DeepSeek 67B, under stated assumptions.

    The paper gives no arithmetic. What reproduces it: DeepSeek-V2's MLA cache at 6 bits per element on
    average (sec. 3.2.3, the deployed model) against DeepSeek 67B's GQA cache at 16 bits (BF16, assumed).
    """
    v2, base = MODELS[PAPER_MODEL], MODELS[PAPER_BASELINE]
    base_bytes = base.kv_bytes_per_token(PAPER_BASELINE_BITS / 8)
    v2_bf16 = v2.kv_bytes_per_token(2)
    v2_deployed = v2.kv_bytes_per_token(PAPER_DEPLOYED_BITS / 8)
    mha = elements_per_token(v2)["MHA"] * 2
    gqa8 = 2 * v2.layers * 8 * v2.head_dim * 2
    return {
        "baseline_bytes": base_bytes, "v2_bf16_bytes": v2_bf16, "v2_deployed_bytes": v2_deployed,
        "saving_deployed": 1 - v2_deployed / base_bytes,           # 93.34%: the paper's figure
        "saving_bf16": 1 - v2_bf16 / base_bytes,                   # 82.24%: MLA and fewer layers only
        "v2_as_mha_bytes": mha, "saving_vs_mha": 1 - v2_bf16 / mha,            # 98.24%
        "v2_as_gqa8_bytes": gqa8, "saving_vs_gqa8": 1 - v2_bf16 / gqa8,        # 71.88%
        "v2_as_mqa_bytes": 2 * v2.layers * v2.head_dim * 2,
        "gqa_groups": equivalent_gqa_groups(v2.kv_latent, v2.rope_dim, v2.head_dim),   # 2.25
        # Appendix D.2, Table 9: elements per token of the paper's own MHA and MLA MoE models.
        "table9_large": (860_200, 34_600), "table9_small": (110_600, 15_600),
    }


# ---- decode: naive (rebuild K and V), materialized (an MHA cache), absorbed ---------------------------
FORMS = ("naive", "materialized", "absorbed")
FORM_TITLES = {"naive": "naive (rebuild K and V every step)", "materialized": "MHA cache (K and V stored)",
               "absorbed": "absorbed (attend over the latent)"}


def decode_costs(s: MLAShape, context: int, batch: int, bytes_per_number: float) -> dict:
    """Bytes each form moves and FLOPs it does for one decode step of one layer (weights excluded).

    The same accounting as the compute server's kernel (compute/kernels/mla.py `cost`), so the page's
    numbers and the server's agree: naive reads the cache and writes then reads back the rebuilt K
    and V; the MHA cache reads per-head K and V plus the shared RoPE key; absorbed reads the cache.
    """
    h, d, r, c, n = s.heads, s.d_h, s.d_r, s.d_c, context
    cache = batch * n * (c + r) * bytes_per_number
    rebuilt = batch * n * h * 2 * d * bytes_per_number
    attention_mha = 2 * n * h * (d + r) + 2 * n * h * d
    return {
        "cache_bytes": cache,
        "naive_bytes": cache + 2 * rebuilt,
        "materialized_bytes": batch * n * (h * 2 * d + r) * bytes_per_number,
        "absorbed_bytes": cache,
        "naive_flops": batch * (2 * n * c * 2 * h * d + attention_mha),
        "materialized_flops": batch * attention_mha,
        "absorbed_flops": batch * (2 * h * d * c + 2 * n * h * (c + r) + 2 * n * h * c + 2 * h * c * d),
    }


def per_cached_token(s: MLAShape, bytes_per_number: float) -> dict:
    """Bytes and FLOPs per cached token per layer for each form (the part that grows with context)."""
    one, two = decode_costs(s, 1, 1, bytes_per_number), decode_costs(s, 2, 1, bytes_per_number)
    return {f"{form}_{what}": two[f"{form}_{what}"] - one[f"{form}_{what}"]
            for form in FORMS for what in ("bytes", "flops")}


def attention_seconds(s: MLAShape, form: str, context: int, dtype: str, gpu, bandwidth_efficiency: float = 1.0,
                      mfu: float = 1.0) -> float:
    """One decode step's attention over all layers on the shared roofline (core/timing.py):
    max(bytes ÷ (bandwidth × efficiency), FLOPs ÷ (peak × MFU))."""
    c = decode_costs(s, context, 1, dtype_bytes(dtype))
    return roofline_seconds(s.layers * c[f"{form}_bytes"], s.layers * c[f"{form}_flops"], gpu,
                            bandwidth_efficiency=bandwidth_efficiency, mfu=mfu)["seconds"]


# ---- the step-through: one decode step of one MLA layer -------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Box:
    key: str
    name: str           # what it is, as the paper writes it
    shape: str          # its shape, in numbers
    rows: int           # heads (or 1 for a vector); 0 = the S cached tokens
    cols: int           # numbers per row; 0 = the S cached tokens
    x: float
    y: float            # top edge
    step: int           # the frame it appears in
    role: str           # cached, query, naive, absorbed, output
    stack: bool = False  # one per cached token: drawn as a stack


ROLE_COLORS = {"input": "#6b7280", "cached": "#059669", "query": "#2563eb", "naive": "#dc2626",
               "absorbed": "#7c3aed", "output": "#374151"}
S_SIZE = 24.0       # a side of S cached tokens, drawn at a fixed size


def num(x: float) -> str:
    """Whole numbers with thousands separators; fractions (sub-byte dtypes) with up to two decimals."""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}".rstrip("0").rstrip(".")


def dtype_name(dtype: str) -> str:
    """'bf16', or '6 bits' for a bit-width."""
    text = str(dtype).strip().lower()
    return text if text in DTYPE_BITS else f"{float(text):g} bits"


def _w(cols: int) -> float:
    """Box sides are proportional to the square root of each dimension, so 64 and 7,168 fit in one picture."""
    return S_SIZE if cols == 0 else 0.9 * math.sqrt(cols)


def _h(rows: int) -> float:
    return 18.0 if rows == 0 else max(3.0, 1.6 * math.sqrt(rows))


CHAR = 2.5         # diagram units one label character takes (15px bold type, a diagram about 1,000px wide)


def _room(bx_w: float, *labels: str) -> float:
    """Horizontal room a box needs: itself or its longest label, whichever is wider."""
    return max([bx_w] + [CHAR * len(t) for t in labels])


def boxes(s: MLAShape, context: int) -> list[Box]:
    S = tokens(context)
    n, d, r, c = s.heads, s.d_h, s.d_r, s.d_c
    dm, cq = num(s.d_model), s.d_cq
    cache_shape = f"{S} × [{c} | {r}]"
    kv_names = ("c_KV = W_DKV h_t", "k^R = RoPE(W_KR h_t)", "c_Q = W_DQ h_t")
    x_kv = _w(s.d_model) + 14
    x_cache = x_kv + _room(max(_w(cq), _w(c)), *kv_names) + 8
    x_q = x_cache + _room(_w(c) + 0.6 + _w(r), cache_shape, "cache: c_KV | k^R") + 10
    out = [
        Box("h", "h_t: the new token", f"[{dm}]", 1, s.d_model, 0, 0, 0, "input"),
        Box("c_kv", kv_names[0], f"[{c}]", 1, c, x_kv, 0, 1, "cached"),
        Box("k_r", kv_names[1], f"[{r}]", 1, r, x_kv, -13, 2, "cached"),
        Box("cache_c", "cache: c_KV | k^R", cache_shape, 0, c, x_cache, 0, 3, "cached"),
        Box("cache_r", "", "", 0, r, x_cache + _w(c) + 0.6, 0, 3, "cached"),
        Box("c_q", kv_names[2] if cq else "h_t (no query latent)", f"[{num(cq or s.d_model)}]", 1,
            cq or s.d_model, x_kv, -30, 4, "query"),
        Box("q_c", "q^C = W_UQ c_Q", f"[{n} × {d}]", n, d, x_q, -10, 4, "query"),
    ]
    out.append(Box("q_r", "q^R = RoPE(W_QR c_Q)", f"[{n} × {r}]", n, r,
                   x_q + _room(_w(d), out[-1].name, out[-1].shape) + 8, -10, 4, "query"))
    x = 0.0
    for key, name, shape, rows, cols, step, stack in [
            ("k_c", "k^C = W_UK c_KV", f"{S} × [{n} × {d}]", n, d, 5, True),
            ("v_c", "v^C = W_UV c_KV", f"{S} × [{n} × {d}]", n, d, 6, True),
            ("s_n", "scores, softmax", f"[{n} × {S}]", n, 0, 7, False),
            ("o_n", "o = Σ p v^C", f"[{n} × {d}]", n, d, 7, False),
            ("u_n", "u = W_O o", f"[{dm}]", 1, s.d_model, 8, False)]:
        out.append(Box(key, name, shape, rows, cols, x, -58, step, "naive" if step < 8 else "output", stack))
        x += _room(_w(cols) + (3 if stack else 0), name, shape) + 8
    x = 0.0
    for key, name, shape, rows, cols, step in [
            ("q_t", "q̃ = W_UKᵀ q^C", f"[{n} × {c}]", n, c, 9),
            ("s_a", "scores = q̃·c_KV + q^R·k^R", f"[{n} × {S}]", n, 0, 10),
            ("o_t", "õ = Σ p c_KV", f"[{n} × {c}]", n, c, 11),
            ("o_a", "o = W_UV õ", f"[{n} × {d}]", n, d, 12),
            ("u_a", "u = W_O o", f"[{dm}]", 1, s.d_model, 12)]:
        out.append(Box(key, name, shape, rows, cols, x, -98, step, "absorbed" if key != "u_a" else "output"))
        x += _room(_w(cols), name, shape) + 8
    return out


ARROWS = [("h", "c_kv"), ("h", "k_r"), ("h", "c_q"), ("c_kv", "cache_c"), ("k_r", "cache_c"), ("c_q", "q_c"),
          ("k_c", "v_c"), ("v_c", "s_n"), ("s_n", "o_n"), ("o_n", "u_n"),
          ("q_t", "s_a"), ("s_a", "o_t"), ("o_t", "o_a"), ("o_a", "u_a")]


@dataclasses.dataclass(frozen=True)
class Step:
    title: str
    caption: str
    shapes: str
    step_flops: tuple[str, int]          # (formula with values, FLOPs) once per decode step
    token_flops: tuple[str, int]         # per cached token
    token_bytes: tuple[str, float]       # read per cached token
    path: str = "shared"
    token_written: tuple[str, float] = ("0", 0)   # written per cached token (only the naive rebuild writes)


def steps(s: MLAShape, dtype: str) -> list[Step]:
    """The decode step of one layer, stage by stage, with each stage's costs (per layer)."""
    b = dtype_bytes(dtype)
    n, d, r, c, dm, cq = s.heads, s.d_h, s.d_r, s.d_c, s.d_model, s.d_cq
    T = num
    bs = f"{b:g} B"
    q_in = cq or dm
    q_flops = (2 * dm * cq if cq else 0) + 2 * q_in * n * d + 2 * q_in * n * r
    return [
        Step("The new token arrives",
             f"Decode, one layer of {s.title}: the new token's hidden state h_t ({T(dm)} numbers) comes in. The "
             f"frames that follow count what each stage costs this layer: once per step, and per cached token "
             f"(the part that grows with the context).",
             f"h_t [{T(dm)}]", ("nothing yet", 0), ("nothing yet", 0), ("nothing yet", 0)),
        Step("Compress keys and values into one latent",
             f"c_KV = W_DKV h_t squeezes h_t to a {c}-number latent that stands for every head's key and value "
             f"at once (paper eq. 9). This is what gets cached, instead of {n} keys and {n} values.",
             f"h_t [{T(dm)}] → W_DKV [{c} × {T(dm)}] → c_KV [{c}]",
             (f"2 × {T(dm)} × {c}", 2 * dm * c), ("0 (only the new token)", 0), ("0 (only the new token)", 0)),
        Step("Carry the position in a separate key",
             f"k^R = RoPE(W_KR h_t): a {r}-number key, rotated by the token's position and shared by all {n} heads "
             f"(eq. 15). Why not rotate the rebuilt keys instead? A score would then be q^T R(t_q)^T R(t_j) W_UK c_j, "
             f"and the rotation R(t_j) of each cached token j sits between the query and W_UK. Matrix products do "
             f"not commute, so W_UK could no longer be folded into the query once per step: every cached key "
             f"would have to be rebuilt and rotated again at every step (sec. 2.1.3). So position lives in k^R "
             f"and the latent stays position-free.",
             f"h_t [{T(dm)}] → W_KR [{r} × {T(dm)}] → RoPE → k^R [{r}]",
             (f"2 × {T(dm)} × {r}", 2 * dm * r), ("0 (only the new token)", 0), ("0 (only the new token)", 0)),
        Step("Append to the cache",
             f"The cache gains c_KV and k^R: {c} + {r} = {c + r} numbers per layer, {num((c + r) * b)} B at "
             f"{dtype}; over {s.layers} layers {num(s.layers * (c + r) * b)} B per token. MHA with these heads "
             f"would store 2 × {n} × {d} = {T(2 * n * d)} numbers per layer, {2 * n * d / (c + r):.1f}× more.",
             f"cache: S × [{c} | {r}]",
             ("0", 0), ("0 (written once)", 0), (f"0 (writes ({c} + {r}) × {bs})", 0)),
        Step("Build the query",
             f"The query goes through its own latent c_Q ({T(cq)} numbers; it saves training memory, not "
             f"cache, eq. 12-13), then up to q^C ({n} heads × {d}) and the rotated q^R ({n} heads × {r})."
             if cq else f"The query: q^C ({n} heads × {d}) and the rotated q^R ({n} heads × {r}).",
             (f"h_t [{T(dm)}] → c_Q [{T(cq)}] → " if cq else "") + f"q^C [{n} × {d}], q^R [{n} × {r}]",
             ((f"2 × {T(dm)} × {T(cq)} + " if cq else "") + f"2 × {T(q_in)} × {n} × ({d} + {r})", q_flops),
             ("0", 0), ("0", 0)),
        Step("Naive 1: rebuild every cached token's keys",
             f"Naively, each head's key is rebuilt from each cached latent, k^C_j = W_UK c_KV,j (eq. 10): "
             f"{n} × {d} numbers for every one of the S cached tokens, at every decode step.",
             f"S × c_KV [{c}] → W_UK [{T(n * d)} × {c}] → S × k^C [{n} × {d}]",
             ("0", 0), (f"2 × {c} × {n} × {d}", 2 * c * n * d), (f"{c} × {bs}", c * b), "naive",
             (f"{n} × {d} × {bs}", n * d * b)),
        Step("Naive 2: rebuild every cached token's values",
             f"And the values, v^C_j = W_UV c_KV,j (eq. 11): another {n} × {d} numbers per cached token. "
             f"The small cache is expanded back to the size of an MHA cache, every step.",
             f"S × c_KV [{c}] → W_UV [{T(n * d)} × {c}] → S × v^C [{n} × {d}]",
             ("0", 0), (f"2 × {c} × {n} × {d}", 2 * c * n * d), ("0 more (the same latent rows)", 0), "naive",
             (f"{n} × {d} × {bs}", n * d * b)),
        Step("Naive 3: attend as multi-head attention",
             f"Scores q_i·[k^C_i,j ; k^R_j] over {d} + {r} numbers per head, softmax, then the weighted sum of "
             f"values (eq. 18). This reads back the rebuilt keys and values.",
             f"q [{n} × {d + r}] · S × k [{n} × {d + r}] → p [{n} × S] → o [{n} × {d}]",
             ("0", 0), (f"2 × {n} × ({d} + {r}) + 2 × {n} × {d}", 2 * n * (d + r) + 2 * n * d),
             (f"(2 × {n} × {d} + {r}) × {bs}", (2 * n * d + r) * b), "naive"),
        Step("Naive 4: the output projection",
             f"u = W_O o (eq. 19): once per step, whatever the context.",
             f"o [{T(n * d)}] → W_O [{T(dm)} × {T(n * d)}] → u [{T(dm)}]",
             (f"2 × {T(n * d)} × {T(dm)}", 2 * n * d * dm), ("0", 0), ("0", 0), "naive"),
        Step("Absorbed 1: move the query into latent space",
             f"q_i·k^C_j = q_i·(W_UK,i c_KV,j) = (W_UK,iᵀ q_i)·c_KV,j. So fold W_UK into the query once per step: "
             f"q̃_i = W_UK,iᵀ q^C_i is {c} numbers per head, as wide as the latent (App. C). Nothing per cached "
             f"token is built.",
             f"q^C [{n} × {d}] → W_UK per head [{d} × {c}] → q̃ [{n} × {c}]",
             (f"2 × {n} × {d} × {c}", 2 * n * d * c), ("0", 0), ("0", 0), "absorbed"),
        Step("Absorbed 2: score against the cache itself",
             f"s_i,j = q̃_i·c_KV,j + q^R_i·k^R_j: every head reads the same {c + r} cached numbers per token, "
             f"the whole cache once (like MQA, but {c + r} wide).",
             f"q̃ [{n} × {c}] · S × c_KV [{c}] + q^R [{n} × {r}] · S × k^R [{r}] → p [{n} × S]",
             ("0", 0), (f"2 × {n} × ({c} + {r})", 2 * n * (c + r)), (f"({c} + {r}) × {bs}", (c + r) * b),
             "absorbed"),
        Step("Absorbed 3: weighted sum of latents",
             f"õ_i = Σ_j p_i,j c_KV,j: each head averages the cached latents, not values ({c} numbers per head). "
             f"The latents were just read for the scores, so a fused kernel reads nothing more.",
             f"p [{n} × S] · S × c_KV [{c}] → õ [{n} × {c}]",
             ("0", 0), (f"2 × {n} × {c}", 2 * n * c), ("0 more (already read)", 0), "absorbed"),
        Step("Absorbed 4: the value up-projection, once",
             f"o_i = W_UV,i õ_i, then u = W_O o: W_UV is applied once per step, after attention, instead of once per "
             f"cached token; the paper folds it into W_O (App. C).",
             f"õ [{n} × {c}] → W_UV per head [{d} × {c}] → o [{n} × {d}] → W_O → u [{T(dm)}]",
             (f"2 × {n} × {c} × {d} + 2 × {T(n * d)} × {T(dm)}", 2 * n * c * d + 2 * n * d * dm),
             ("0", 0), ("0", 0), "absorbed"),
    ]


def summary_step(s: MLAShape, dtype: str, context: int) -> Step:
    b = dtype_bytes(dtype)
    t = per_cached_token(s, b)
    T = num
    return Step(
        "Per cached token: naive against absorbed",
        f"Per cached token and layer, naive moves {T(t['naive_bytes'])} B and does {T(t['naive_flops'])} FLOPs; "
        f"absorbed reads {T(t['absorbed_bytes'])} B and does {T(t['absorbed_flops'])} FLOPs: "
        f"{t['naive_bytes'] / t['absorbed_bytes']:.0f}× fewer bytes and {t['naive_flops'] / t['absorbed_flops']:.0f}× "
        f"fewer FLOPs. At {tokens(context)} cached tokens and {s.layers} layers that is "
        f"{bytes_si(s.layers * context * t['naive_bytes'])} against "
        f"{bytes_si(s.layers * context * t['absorbed_bytes'])} per decode step.",
        f"naive: S × [{s.heads} × {s.d_h}] keys and values rebuilt; absorbed: S × [{s.d_c} | {s.d_r}] read once",
        ("see the frames before", 0),
        (f"naive {T(t['naive_flops'])}; absorbed {T(t['absorbed_flops'])}", t["absorbed_flops"]),
        (f"naive {T(t['naive_bytes'])} B moved (read and written); absorbed {T(t['absorbed_bytes'])} B",
         t["absorbed_bytes"]), "summary")


def all_steps(p: MLAParams) -> list[Step]:
    s = mla_shape(diagram_model(p.model))
    return steps(s, p.kv_dtype) + [summary_step(s, p.kv_dtype, p.context)]


def diagram_extent(s: MLAShape, context: int) -> float:
    """The rightmost point any box or its label reaches, so the diagram's x range fits it."""
    return max(b.x + _room(_w(b.cols) + (3 if b.stack else 0), b.name, b.shape) for b in boxes(s, context))


def _box_columns(drawn: list[tuple[Box, float, float]], k: int, final: bool, lift: float) -> dict:
    """The boxes source at frame k from (box, width, height): every box so far, the boxes of stage k outlined,
    later ones faint; one per cached token is drawn as three copies, each `lift` up and to the right."""
    cols = {c: [] for c in ("x0", "x1", "y0", "y1", "color", "alpha", "line_color", "line_width", "name", "shape",
                            "label_x", "label_y", "text_alpha", "step")}
    for bx, w, h in drawn:
        now = bx.step == k or (final and bx.key in ("cache_c", "cache_r"))
        seen = bx.step <= k
        copies = [(2 * lift, 2 * lift), (lift, lift), (0.0, 0.0)] if bx.stack else [(0.0, 0.0)]
        for i, (dx, dy) in enumerate(copies):
            front = i == len(copies) - 1
            cols["x0"].append(bx.x + dx)
            cols["x1"].append(bx.x + dx + w)
            cols["y0"].append(bx.y - h + dy)
            cols["y1"].append(bx.y + dy)
            cols["color"].append(ROLE_COLORS[bx.role])
            cols["alpha"].append((0.85 if front else 0.4) if seen else 0.07)
            cols["line_color"].append("#111827" if now else "#ffffff")
            cols["line_width"].append(4 if now and front else 1)
            cols["name"].append(bx.name if front else "")
            cols["shape"].append(bx.shape if front else "")
            cols["label_x"].append(bx.x)
            cols["label_y"].append(bx.y + (2 * lift if bx.stack else 0))
            cols["text_alpha"].append(1.0 if seen else 0.18)
            cols["step"].append(bx.step)
    return cols


# ---- the narrow diagram, for a phone: rows no wider than a 300 px plot, each box's name and shape above it ----
# Its units are pixels of the narrowest plot that shows it (the page draws it up to 560 px wide, with plot
# fonts at 0.8: 12 px bold names, 11 px shapes, 13 px bold headings). Box sides are ∝ √ of each dimension.
N_WIDTH = 300.0
N_SIDE = 1.3                # px per √ of a dimension
N_S = 36.0                  # a side of the S cached tokens
N_LIFT = 2.0                # one per cached token: copies drawn this far up and right
N_LABEL = 36.0              # the name and shape above a box (the view draws them 2 and 19 px above its top)
N_GAP = 18.0                # from a row's lowest box to the next row's labels: room for an arrow
N_NAME, N_SHAPE = 7.4, 5.3  # px per character, measured in Chromium (at most 7.0 and 5.0) with a margin
N_BAND_CHARS, N_LINE = 40, 17.0   # a heading wraps at 40 characters (6.4 px each); px per line
N_RAIL = -8.0               # where an arrow that skips rows runs down, left of every box
# The rows of each band, in reading order (the cache's k^R part sits beside its c_KV part).
N_ROWS = ((0, (("h",), ("c_kv", "k_r"), ("cache_c",), ("c_q",), ("q_c", "q_r"))),
          (1, (("k_c", "v_c"), ("s_n", "o_n"), ("u_n",))),
          (2, (("q_t",), ("s_a",), ("o_t", "o_a"), ("u_a",))))
N_TITLE = "One decode step of one MLA layer"
N_NOTE = "Box sides ∝ √ of each dimension;\nS = cached tokens."     # the wide title's second half


def _nw(cols: int) -> float:
    return N_S if cols == 0 else N_SIDE * math.sqrt(cols)


def _nh(rows: int) -> float:
    return N_S if rows == 0 else max(4.0, N_SIDE * math.sqrt(rows))


def _chars(text: str) -> int:
    """Characters as drawn: a combining mark (the tilde of q̃) takes no room of its own."""
    return sum(not unicodedata.combining(c) for c in text)


def _n_room(bx: Box) -> float:
    """What a box takes across in the narrow diagram: itself or its name or shape, whichever is wider."""
    return max(_nw(bx.cols) + (2 * N_LIFT if bx.stack else 0), N_NAME * _chars(bx.name), N_SHAPE * _chars(bx.shape))


def narrow_boxes(s: MLAShape, context: int) -> tuple[list[Box], list[dict], float]:
    """The boxes placed in rows for a phone (x right, y = top edge going down, in px), the bands' headings
    ({x, y, text}, top-aligned, wrapped) and the lowest y drawn. Rows are packed from the longest context's
    shapes, so the picture does not move when the context changes: only the boxes' shapes (S) do."""
    placed, bands, low = _narrow_layout(s)
    wide = {b.key: b for b in boxes(s, context)}
    return [dataclasses.replace(wide[b.key], x=b.x, y=b.y) for b in placed], [dict(b) for b in bands], low


@functools.lru_cache(maxsize=16)
def _narrow_layout(s: MLAShape) -> tuple[tuple[Box, ...], tuple[dict, ...], float]:
    """narrow_boxes' rows for this shape, at any context (the page asks for them on every change: half of
    its Python before they were kept)."""
    wide = {b.key: b for b in boxes(s, 1)}
    room = {b.key: _n_room(b) for b in boxes(s, 1_000_000)}
    out, bands, y = [], [], 0.0
    for band, rows in N_ROWS:
        heading = BANDS["text"][band] if band else f"{N_NOTE}\n{BANDS['text'][band]}"
        text = "\n".join(textwrap.fill(t, N_BAND_CHARS) for t in heading.split("\n"))
        bands.append({"x": 0.0, "y": y, "text": text})
        y -= N_LINE * (text.count("\n") + 1) + 8
        for keys in rows:
            stacked = any(wide[k].stack for k in keys)
            top = y - N_LABEL - (2 * N_LIFT if stacked else 0)
            x, low = 0.0, top
            for key in keys:
                bx = wide[key]
                out.append(dataclasses.replace(bx, x=x, y=top))
                low = min(low, top - _nh(bx.rows))
                if key == "cache_c":         # k^R's part of the cache, beside c_KV's
                    r = wide["cache_r"]
                    out.append(dataclasses.replace(r, x=x + _nw(bx.cols) + 1, y=top))
                x += room[key] + 16
            y = low - N_GAP
    return tuple(out), tuple(bands), y + N_GAP


def narrow_bands(s: MLAShape) -> dict:
    _, bands, _ = _narrow_layout(s)
    return {c: [b[c] for b in bands] for c in ("x", "y", "text")}


def narrow_y_range(s: MLAShape) -> list[float]:
    """The narrow diagram's y range: its height in px, as the view sizes the plot."""
    return [_narrow_layout(s)[2] - 6, 4.0]


def narrow_sources(s: MLAShape, context: int, k: int, final: bool) -> dict:
    """The narrow diagram's boxes and arrows at frame k. An arrow to the next row runs from the bottom of
    its box to the top of the next box's labels; one that skips rows runs down a rail left of every box."""
    placed, _, _ = narrow_boxes(s, context)
    cols = _box_columns([(bx, _nw(bx.cols), _nh(bx.rows)) for bx in placed], k, final, N_LIFT)
    at = {bx.key: bx for bx in placed}
    rows = [keys for _, band_rows in N_ROWS for keys in band_rows]
    row_index = {key: i for i, keys in enumerate(rows) for key in keys}
    arrows = {"x0": [], "y0": [], "x1": [], "y1": [], "alpha": []}
    rails = {"xs": [], "ys": [], "alpha": []}
    for a, b in ARROWS:
        A, B = at[a], at[b]
        aw, ah, bh = _nw(A.cols) + (2 * N_LIFT if A.stack else 0), _nh(A.rows), _nh(B.rows)
        alpha = 0.9 if B.step <= k else 0.08
        skip = row_index[b] - row_index[a]
        if skip == 0:                                  # side by side: a level arrow at the lower box's middle
            y0 = A.y - min(ah, bh) / 2
            seg = (A.x + aw + 2, y0, B.x - 3, y0)
        elif skip == 1:                                # down to the next row's labels
            x0 = min(max(B.x + 6, A.x + 2), A.x + aw - 2)
            seg = (x0, A.y - ah - 1, B.x + 6, B.y + N_LABEL + 1 + (2 * N_LIFT if B.stack else 0))
        else:                                          # along the rail, then into the box from its left
            ya, yb = A.y - ah / 2, B.y - bh / 2
            rails["xs"].append([A.x, N_RAIL, N_RAIL])
            rails["ys"].append([ya, ya, yb])
            rails["alpha"].append(alpha)
            seg = (N_RAIL, yb, B.x - 1, yb)
        for c, v in zip(("x0", "y0", "x1", "y1"), seg):
            arrows[c].append(v)
        arrows["alpha"].append(alpha)
    return {"boxes_narrow": cols, "arrows_narrow": arrows, "rails_narrow": rails}


def frame_data(p: MLAParams, frame: int) -> dict:
    """Frame k: every box so far, the boxes of stage k outlined, later ones faint; stage k's costs."""
    s = mla_shape(diagram_model(p.model))
    st = all_steps(p)
    k = max(0, min(len(st) - 1, int(frame)))
    final = k == len(st) - 1
    wide = boxes(s, p.context)
    placed = {bx.key: (bx.x, bx.y, _w(bx.cols), _h(bx.rows), bx.step) for bx in wide}
    cols = _box_columns([(bx, _w(bx.cols), _h(bx.rows)) for bx in wide], k, final, 1.5)
    arrows = {"x0": [], "y0": [], "x1": [], "y1": [], "alpha": []}
    for a, b in ARROWS:
        ax, ay, aw, ah, _ = placed[a]
        bx_, by, bw, bh, bstep = placed[b]
        lo, hi = max(ay - ah, by - bh), min(ay, by)          # the heights both boxes span
        y0 = y1 = (lo + hi) / 2 if lo < hi else None           # side by side: a level arrow
        if y0 is None:
            y0, y1 = ay - ah / 2, min(by - 1, max(by - bh + 1, ay - ah / 2))
        arrows["x0"].append(ax + aw + 0.8)
        arrows["y0"].append(y0)
        arrows["x1"].append(bx_ - 0.8)
        arrows["y1"].append(y1)
        arrows["alpha"].append(0.9 if bstep <= k else 0.08)
    now = st[k]
    return {
        "sources": {"boxes": cols, "arrows": arrows, **narrow_sources(s, p.context, k, final)},
        "animation": {"mode": "on_demand", "frames": len(st), "frame": k,
                      "caption": f"{k + 1}/{len(st)}. {now.title}. {now.caption}"},
        "texts": {"step_costs": step_costs_text(now, s),
                  **summaries(diagram=(said := diagram_summary(cols, k, len(st), now.title)), diagram_narrow=said)},
    }


def diagram_summary(cols: dict, k: int, steps: int, title: str) -> str:
    """The diagram at stage k in words, from its boxes: the ones outlined now, and how many are drawn so far."""
    named = [(n, s, w, a) for n, s, w, a in zip(cols["name"], cols["shape"], cols["line_width"], cols["alpha"]) if n]
    now = [f"{n} {s}" for n, s, w, _ in named if w >= 4]
    seen = sum(a >= 0.4 for *_, a in named)
    return (f"Stage {k + 1} of {steps}, “{title}”. Outlined now: " + (listing(now) or "nothing new") + f"; {seen} "
            f"of {len(named)} tensors drawn so far.")


def plot_summaries(sources: dict) -> dict:
    """The charts in words, from the columns they draw."""
    kd = sources["kinds"]
    kinds = ("Per token, all layers, this model's shape would cache "
             + listing([f"{sig(kb)} KB as {label}" for label, kb in zip(kd["label"], kd["kb"])]) + ".")
    acc = sources["accounting"]
    account = "; ".join(f"{what}: {text}" for what, text in zip(acc["what"], acc["text"])) + "."
    pr = sources["presets"]
    lo, hi = min(range(len(pr["kb"])), key=pr["kb"].__getitem__), max(range(len(pr["kb"])), key=pr["kb"].__getitem__)
    mla = [f"{m} {sig(kb)} KB" for m, kb, kind in zip(pr["model"], pr["kb"], pr["kind"]) if kind == "MLA"]
    every = (f"Of {len(pr['model'])} model presets, {pr['model'][lo]} caches the least per token "
             f"({sig(pr['kb'][lo])} KB, {pr['kind'][lo]}) and {pr['model'][hi]} the most ({sig(pr['kb'][hi])} KB, "
             f"{pr['kind'][hi]})" + (f"; the MLA models: {listing(mla)}." if mla else "."))
    d, here = sources["decode"], sources["here"]
    name = {f: FORM_TITLES[f].split(" (")[0] for f in FORMS}
    decode = (f"From {tokens(d['context'][0])} to {tokens(d['context'][-1])} cached tokens, attention per decode step "
              f"takes " + listing([f"{sig(d[f][0])} to {sig(d[f][-1])} ms {name[f]}" for f in FORMS])
              + f"; at {tokens(here['context'][0])} tokens, "
              + listing([f"{name[f]} {sig(x)} ms" for f, x in zip(FORMS, here["ms"])]) + ".")
    return summaries(kinds=kinds, account=account, every=every, decode=decode)


def step_costs_text(st: Step, s: MLAShape) -> str:
    """The stage's shapes and costs, one line each (per layer)."""
    def line(label, pair, unit):
        formula, value = pair
        if formula.startswith(("0", "nothing", "see", "naive")):
            return f"{label}: {formula}"
        return f"{label}: {formula} = {num(value)}{unit}"
    return "\n".join([
        f"Shapes: {st.shapes}",
        line("FLOPs once per step", st.step_flops, ""),
        line("FLOPs per cached token", st.token_flops, ""),
        line("Bytes read per cached token", st.token_bytes, " B"),
        *([line("Bytes written per cached token", st.token_written, " B")] if st.token_written[1] else []),
        f"(one layer of {s.title}; S = the cached tokens)",
    ])


BANDS = {"x": [0.0, 0.0, 0.0], "y": [9.0, -47.0, -87.0],
         "text": ["Every token, once: compute and cache the latent and the RoPE key; build the query",
                  "Naive decode: rebuild K and V for every cached token, then attend",
                  "Absorbed decode: fold W_UK into the query and W_UV into the output, attend over the latent"]}


# ---- results --------------------------------------------------------------------------------------------
CURVE_CONTEXTS = [2 ** k for k in range(8, 21)]         # 256 .. 1,048,576


def evaluate(p: MLAParams) -> dict:
    m = MODELS[p.model]
    b = dtype_bytes(p.kv_dtype)
    per = bytes_per_token(m, p.kv_dtype)
    d_c, d_r = mla_dims(m)
    s = mla_shape(diagram_model(p.model))
    t = per_cached_token(s, b)
    gpu = GPUS[p.gpu]
    return {
        "model_attention": m.attention,
        "bytes_per_token": per,
        "elements_per_token": elements_per_token(m),
        "own_bytes_per_token": m.kv_bytes_per_token(b),
        "gqa_groups": gqa_groups(m),
        "mla_dims": [d_c, d_r],
        "mla_vs_mha": per["MLA"] / per["MHA"],
        "equivalent_gqa_groups": equivalent_gqa_groups(d_c, d_r, m.head_dim),
        "presets_bytes_per_token": {slug: mm.kv_bytes_per_token(b) for slug, mm in MODELS.items()},
        "paper": paper_accounting(),
        "diagram_model": diagram_model(p.model),
        "per_cached_token_per_layer": t,
        "absorbed_query_width": s.d_c,
        "decode_bytes_per_step": {f: s.layers * decode_costs(s, p.context, 1, b)[f"{f}_bytes"] for f in FORMS},
        "decode_flops_per_step": {f: s.layers * decode_costs(s, p.context, 1, b)[f"{f}_flops"] for f in FORMS},
        "attention_seconds": {f: attention_seconds(s, f, p.context, p.kv_dtype, gpu, p.bandwidth_efficiency, p.mfu)
                              for f in FORMS},
        # The whole batch-1 step of the MLA model the plots show (absorbed), weights included: the shared model.
        "decode_step": decode_step(MODELS[diagram_model(p.model)], gpu, batch=1, context=p.context,
                                   kv_bytes_per_element=b, bandwidth_efficiency=p.bandwidth_efficiency, mfu=p.mfu),
    }


def page_data(p: MLAParams) -> dict:
    m = MODELS[p.model]
    r = evaluate(p)
    per = r["bytes_per_token"]
    acc = r["paper"]
    at = frame_data(p, len(all_steps(p)) - 1)
    s = mla_shape(r["diagram_model"])
    gpu = GPUS[p.gpu]
    g = r["gqa_groups"]
    kinds_label = {"MHA": f"MHA ({m.q_heads} KV heads)", "GQA": f"GQA ({g} KV head{'' if g == 1 else 's'})",
                   "MQA": "MQA (1 KV head)", "MLA": f"MLA ({r['mla_dims'][0]} + {r['mla_dims'][1]})"}
    order = sorted(MODELS, key=lambda k: r["presets_bytes_per_token"][k])
    contexts = sorted(set(CURVE_CONTEXTS + [p.context]))
    b = dtype_bytes(p.kv_dtype)
    sources = {
        **at["sources"],
        "bands": BANDS,
        "bands_narrow": narrow_bands(s),
        "kinds": {"kind": list(KINDS), "label": [kinds_label[k] for k in KINDS],
                  "kb": [per[k] / 1e3 for k in KINDS],
                  "text": [f"{kinds_label[k]}: {num(per[k])} B"
                           + ("" if k == "MLA" else f" = {per[k] / per['MLA']:.1f}× MLA") for k in KINDS],
                  "is_model": [k == m.attention for k in KINDS]},
        "presets": {"model": [MODELS[k].title for k in order], "kind": [MODELS[k].attention for k in order],
                    "kb": [r["presets_bytes_per_token"][k] / 1e3 for k in order],
                    "text": [f"{num(r['presets_bytes_per_token'][k])} B ({MODELS[k].attention})"
                             for k in order]},
        "accounting": {
            "what": ["DeepSeek 67B, GQA-8, BF16", "DeepSeek-V2, MLA, BF16", "DeepSeek-V2, MLA, 6 bits",
                     "DeepSeek-V2, MLA, your dtype"],
            "kb": [acc["baseline_bytes"] / 1e3, acc["v2_bf16_bytes"] / 1e3, acc["v2_deployed_bytes"] / 1e3,
                   MODELS[PAPER_MODEL].kv_bytes_per_token(b) / 1e3],
            "text": [f"{num(acc['baseline_bytes'])} B (the paper's baseline)",
                     f"{num(acc['v2_bf16_bytes'])} B: {acc['saving_bf16']:.2%} smaller",
                     f"{num(acc['v2_deployed_bytes'])} B: {acc['saving_deployed']:.2%} smaller",
                     f"{dtype_name(p.kv_dtype)}: {num(MODELS[PAPER_MODEL].kv_bytes_per_token(b))} B, "
                     f"{1 - MODELS[PAPER_MODEL].kv_bytes_per_token(b) / acc['baseline_bytes']:.2%} smaller"]},
        "decode": {"context": contexts,
                   **{f: [attention_seconds(s, f, c, p.kv_dtype, gpu, p.bandwidth_efficiency, p.mfu) * 1e3
                          for c in contexts] for f in FORMS}},
        "here": {"context": [p.context] * 3,
                 "ms": [r["attention_seconds"][f] * 1e3 for f in FORMS],
                 "text": [f"{r['attention_seconds'][f] * 1e3:.3g} ms" for f in FORMS]},
    }
    return {
        **at,
        "sources": sources,
        "texts": {**at["texts"], **plot_summaries(sources)},
        "ranges": {"diagram_x": [-2, diagram_extent(s, p.context) + 2], "diagram_narrow_y": narrow_y_range(s)},
        "formula": formula(p, r),
        "readouts": readouts(p, r),
        "notes": notes(p, r),
        "run": {"kernel": "mla", "request": run_request(p)},
    }


def run_request(p: MLAParams) -> dict:
    """The server's MLA decode on its trained tiny model, at this context (capped at the kernel's bound)."""
    return {"batch": 1, "context": min(p.context, KERNEL_MAX_CONTEXT), "dtype": "float32", "repeats": 25}


def describe_run(p: MLAParams, reply: dict) -> str:
    """Agreement, bytes (this page's formula) and time of each form, from the server's reply."""
    res, params = reply["result"], reply["params"]
    forms = res["forms"]
    bpn = {"float32": 4, "bfloat16": 2}[params["dtype"]]
    mine = decode_costs(KERNEL_SHAPE, params["context"], params["batch"], bpn)
    k = KERNEL_SHAPE
    t = {f: forms[f]["seconds"] for f in FORMS}
    mismatch = [f for f in FORMS if abs(mine[f"{f}_bytes"] - forms[f]["bytes"]) > 0.5]
    counted = ", ".join(f"{f} {bytes_si(forms[f]['bytes'], 2)}" for f in mismatch)
    agree = f" (the server counted {counted})" if mismatch else ""
    per_tok = {f: t[f] / (params["context"] * params["batch"]) * 1e9 for f in FORMS}
    return (
        f"Measured on {reply.get('device_name', reply['device'])} ({reply['device']}, torch {reply['torch']}"
        f"{', %d threads' % reply['threads'] if reply.get('threads') else ''}): one "
        f"decode step of the first attention layer of {k.title}: {k.heads} heads of {k.d_h}, a {k.d_c}-number "
        f"latent and a {k.d_r}-number RoPE key; {tokens(params['context'])} cached tokens, batch {params['batch']}, "
        f"{params['dtype']}, median of {params['repeats']}. "
        f"Outputs agree: absorbed differs from naive by at most {_err(forms['absorbed']['max_error'])}, the MHA "
        f"cache by at most {_err(forms['materialized']['max_error'])} (largest absolute difference). "
        f"Bytes each moves (this page's formula{agree}): naive {bytes_si(mine['naive_bytes'], 2)}, MHA cache "
        f"{bytes_si(mine['materialized_bytes'], 2)}, absorbed {bytes_si(mine['absorbed_bytes'], 2)}. "
        f"Time: naive {t['naive'] * 1e3:.3f} ms, MHA cache {t['materialized'] * 1e3:.3f} ms, absorbed "
        f"{t['absorbed'] * 1e3:.3f} ms ({num(round(per_tok['naive']))}, {num(round(per_tok['materialized']))} and "
        f"{num(round(per_tok['absorbed']))} ns per cached token): absorbed is {t['naive'] / t['absorbed']:.1f}× faster "
        f"than naive. Change the context and run it again to see each time grow with it.")


def _err(x: float) -> str:
    return "0 (identical)" if x == 0 else f"{x:.1e}"


def formula(p: MLAParams, r: dict) -> list[dict]:
    m = MODELS[p.model]
    b = dtype_bytes(p.kv_dtype)
    bs = f"{b:g} B"
    l, h, d = m.layers, m.q_heads, m.head_dim
    d_c, d_r = r["mla_dims"]
    g = r["gqa_groups"]
    per = r["bytes_per_token"]
    acc = r["paper"]
    base, v2 = MODELS[PAPER_BASELINE], MODELS[PAPER_MODEL]
    s = mla_shape(r["diagram_model"])
    t = r["per_cached_token_per_layer"]
    gpu = GPUS[p.gpu]
    c = decode_costs(s, p.context, 1, b)
    st = r["decode_step"]
    sized = "" if m.attention == "MLA" else f" (sized as DeepSeek-V2 does: d_c = 4 × {d}, d_h^R = {d} ÷ 2)"
    return [
        {"name": f"MHA, {m.title}'s shape", "formula": "2 × layers × heads × head_dim × bytes  (Table 1: 2 n_h d_h l)",
         "substituted": f"2 × {l} × {h} × {d} × {bs}", "result": f"{num(per['MHA'])} B per token"},
        {"name": "GQA", "formula": "2 × layers × groups × head_dim × bytes  (2 n_g d_h l)",
         "substituted": f"2 × {l} × {g} × {d} × {bs}", "result": f"{num(per['GQA'])} B per token"},
        {"name": "MQA", "formula": "2 × layers × head_dim × bytes  (2 d_h l)",
         "substituted": f"2 × {l} × {d} × {bs}", "result": f"{num(per['MQA'])} B per token"},
        {"name": "MLA" + sized, "formula": "layers × (d_c + d_h^R) × bytes  ((d_c + d_h^R) l)",
         "substituted": f"{l} × ({d_c} + {d_r}) × {bs}",
         "result": f"{num(per['MLA'])} B per token, {per['MLA'] / per['MHA']:.2%} of MHA"},
        {"name": "GQA groups with the same cache", "formula": "(d_c + d_h^R) ÷ (2 × d_h)",
         "substituted": f"({d_c} + {d_r}) ÷ (2 × {d})" + (" = (4 d_h + d_h/2) ÷ 2 d_h" if d_c == 4 * d and 2 * d_r == d
                                                          else ""),
         "result": f"{r['equivalent_gqa_groups']:g} groups"},
        {"name": "The paper's 93.3% (DeepSeek-V2 deployed vs DeepSeek 67B)",
         "formula": "1 − V2 layers × (d_c + d_h^R) × 6 bits ÷ (2 × 67B layers × KV heads × head_dim × 16 bits)",
         "substituted": f"1 − {v2.layers} × {v2.kv_latent + v2.rope_dim} × 6/8 B ÷ "
                        f"(2 × {base.layers} × {base.kv_heads} × {base.head_dim} × 2 B) = 1 − "
                        f"{num(acc['v2_deployed_bytes'])} ÷ {num(acc['baseline_bytes'])}",
         "result": f"{acc['saving_deployed']:.2%} smaller"},
        {"name": "The same two models, both at BF16", "formula": "1 − V2's MLA cache ÷ 67B's GQA cache",
         "substituted": f"1 − {num(acc['v2_bf16_bytes'])} ÷ {num(acc['baseline_bytes'])}",
         "result": f"{acc['saving_bf16']:.2%} smaller"},
        {"name": "DeepSeek-V2's MLA against its own shape as MHA, GQA-8, MQA",
         "formula": "1 − (d_c + d_h^R) ÷ (2 × n_kv × d_h)",
         "substituted": f"1 − 576 ÷ {2 * 128 * 128:,}; 1 − 576 ÷ {2 * 8 * 128:,}; 1 − 576 ÷ {2 * 128}",
         "result": f"{acc['saving_vs_mha']:.2%} smaller than MHA, {acc['saving_vs_gqa8']:.2%} than GQA-8, "
                   f"{576 / 256:.2f}× MQA"},
        {"name": f"Decode bytes per cached token, one layer of {s.title}",
         "formula": "naive: (d_c + d_h^R + 4 n_h d_h) × bytes (reads the latent, writes and reads K and V); "
                    "absorbed: (d_c + d_h^R) × bytes",
         "substituted": f"({s.d_c} + {s.d_r} + 4 × {s.heads} × {s.d_h}) × {bs}; ({s.d_c} + {s.d_r}) × {bs}",
         "result": f"{num(t['naive_bytes'])} B against {num(t['absorbed_bytes'])} B"},
        {"name": "Decode FLOPs per cached token, one layer",
         "formula": "naive: 2 d_c × 2 n_h d_h + 2 n_h (d_h + d_h^R) + 2 n_h d_h; "
                    "absorbed: 2 n_h (d_c + d_h^R) + 2 n_h d_c",
         "substituted": f"2 × {s.d_c} × 2 × {s.heads} × {s.d_h} + 2 × {s.heads} × ({s.d_h} + {s.d_r}) + "
                        f"2 × {s.heads} × {s.d_h}; 2 × {s.heads} × ({s.d_c} + {s.d_r}) + 2 × {s.heads} × {s.d_c}",
         "result": f"{num(t['naive_flops'])} against {num(t['absorbed_flops'])}"},
        *[{"name": f"Attention time per decode step, {FORM_TITLES[f]}",
           "formula": "layers × max(bytes ÷ (bandwidth × efficiency), FLOPs ÷ (peak BF16 FLOP/s × MFU))  "
                      "(roofline; weights excluded)",
           "substituted": f"{s.layers} × max({bytes_si(c[f + '_bytes'], 2)} ÷ ({gpu.bandwidth_gbs:,g} GB/s × "
                          f"{p.bandwidth_efficiency:g}), {c[f + '_flops'] / 1e9:,.3g} GFLOP ÷ "
                          f"({gpu.bf16_tflops:,g} TFLOP/s × {p.mfu:g})) at {tokens(p.context)} tokens on {gpu.title}",
           "result": f"{r['attention_seconds'][f] * 1e3:.3g} ms"} for f in ("naive", "absorbed")],
        {"name": f"The whole decode step of {MODELS[r['diagram_model']].title} (absorbed), weights included",
         "formula": "max((active weights × 2 B + cache) ÷ (bandwidth × efficiency), FLOPs ÷ (peak × MFU)), batch 1 "
                    "(the project's shared time model)",
         "substituted": f"max(({MODELS[r['diagram_model']].active_params / 1e9:g}e9 × 2 B + "
                        f"{bytes_si(st['kv_bytes'], 2)}) ÷ ({gpu.bandwidth_gbs:,g} GB/s × {p.bandwidth_efficiency:g}), "
                        f"{st['flops'] / 1e9:,.4g} GFLOP ÷ ({gpu.bf16_tflops:,g} TFLOP/s × {p.mfu:g}))",
         "result": f"{st['seconds'] * 1e3:.3g} ms, {st['bound']}-bound: the cache is "
                   f"{st['kv_bytes'] / st['bytes']:.1%} of the bytes at batch 1"},
    ]


def readouts(p: MLAParams, r: dict) -> list[dict]:
    m = MODELS[p.model]
    per = r["bytes_per_token"]
    acc = r["paper"]
    t = r["per_cached_token_per_layer"]
    d_c, d_r = r["mla_dims"]
    return [
        {"label": f"MLA cache per token ({dtype_name(p.kv_dtype)})", "value": f"{num(per['MLA'])} B",
         "detail": f"{m.layers} layers × ({d_c} + {d_r}) numbers" + ("" if m.attention == "MLA" else
                                                                     f"; {m.title} itself: "
                                                                     f"{num(r['own_bytes_per_token'])} B")},
        {"label": "Against MHA, same heads", "value": f"{per['MLA'] / per['MHA']:.2%}",
         "detail": f"{per['MHA'] / per['MLA']:.1f}× smaller than {m.q_heads} heads × {m.head_dim} dims"},
        {"label": "Same cache as GQA with", "value": f"{r['equivalent_gqa_groups']:g} groups",
         "detail": f"({d_c} + {d_r}) ÷ (2 × {m.head_dim})"},
        {"label": "The paper's 93.3%", "value": f"{acc['saving_deployed']:.2%}",
         "detail": f"6-bit MLA cache vs DeepSeek 67B at BF16; both BF16: {acc['saving_bf16']:.2%}"},
        {"label": "Absorbed decode reads", "value": f"{t['naive_bytes'] / t['absorbed_bytes']:.0f}× fewer bytes",
         "detail": f"and does {t['naive_flops'] / t['absorbed_flops']:.0f}× fewer FLOPs per cached token than naive"},
    ]


def notes(p: MLAParams, r: dict) -> list[str]:
    m = MODELS[p.model]
    out = []
    if m.attention != "MLA":
        d_c, d_r = r["mla_dims"]
        out.append(f"{m.title} uses {m.attention}; its MLA bar sizes a latent as DeepSeek-V2 does from the head "
                   f"dimension (d_c = {d_c}, d_h^R = {d_r}). The step-through and the decode plot show DeepSeek-V2.")
    if p.context > m.max_context:
        out.append(f"{m.title} was released for at most {tokens(m.max_context)} tokens; {tokens(p.context)} is past "
                   f"that, so its bars count a cache it never holds.")
    # The decode step is priced on one GPU's bandwidth; say so when its weights and cache do not fit one.
    d, gpu = MODELS[r["diagram_model"]], GPUS[p.gpu]
    held = d.params * 2 + p.context * d.kv_bytes_per_token(dtype_bytes(p.kv_dtype))
    if held > gpu.memory_bytes:
        out.append(f"{d.title}'s weights (bf16) and this cache, {bytes_si(held)}, do not fit one {gpu.title} "
                   f"({gpu.memory_gb:g} GB) but need at least {gpus_needed(held, gpu):,}; the decode step shown is "
                   f"priced at one GPU's bandwidth as if they did.")
    if p.context > KERNEL_MAX_CONTEXT:
        out.append(f"The server's kernel takes at most {tokens(KERNEL_MAX_CONTEXT)} cached tokens, so "
                   f"\"Run it here\" measures {tokens(KERNEL_MAX_CONTEXT)}.")
    return out
