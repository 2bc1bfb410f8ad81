"""The KV cache is the thing you are actually renting.

Fill a GPU (or a node of several) with the model's weights, hold back a workspace, and count how
many sessions of a given context length fit in what is left. The weights are paid once; every
session pays for its own cache, so the cache, not the model, sets how many users a node serves.
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import dataclasses
import math

from ..core.dtypes import DTYPE_BITS, dtype_bytes, dtype_label
from ..core.gpus import GPUS
from ..core.models import MODELS
from ..core.limits import check_pipeline_parallel, check_tensor_parallel, check_weights_fit
from ..core.params import ParamError, Params, choice, integer, number
from ..core.summaries import summaries
from ..core.units import GB, GiB, bytes_both, bytes_iec, bytes_si, thousands, tokens

DTYPES = tuple(DTYPE_BITS)
MAX_FRAMES = 200          # animation frames at most; large counts add sessions in groups
CURVE_CONTEXTS = [round(2 ** (8 + i / 4)) for i in range(0, 12 * 4 + 1)]   # 256 .. 1,048,576 tokens
SEED_SHORT, SEED_LONG = 4_000, 128_000   # the contexts the claim compares


@dataclasses.dataclass(frozen=True)
class CacheRentingParams(Params):
    model: str = choice("llama-3-70b", MODELS, help="Model preset (shapes from each model's config.json)")
    gpu: str = choice("h100-sxm", GPUS, help="Accelerator preset (datasheet memory)")
    gpu_count: int = integer(8, unit="GPUs", min=1, max=64, help="GPUs that hold one copy of the model")
    parallelism: str = choice("tensor", ("tensor", "pipeline"),
                              help="How the model is split: tensor (heads across GPUs) or pipeline (layers)")
    weight_dtype: str = choice("bf16", DTYPES, parse=dtype_bytes, unit="dtype or bits",
                               help="Weight precision: a dtype or an average bit-width such as 4.5")
    kv_dtype: str = choice("fp16", DTYPES, parse=dtype_bytes, unit="dtype or bits",
                           help="KV cache precision: a dtype or an average bit-width such as 4.5")
    context: int = integer(4_000, unit="tokens", min=1, max=10_000_000, help="Tokens each session keeps cached")
    reserve_gb_per_gpu: float = number(6.0, unit="GB", min=0, max=1000,
                                       help="Memory each GPU holds back for activations, CUDA graphs, NCCL")
    kv_memory_gb: float | None = number(None, unit="GB", min=0.001, max=1_000_000, optional=True,
                                        help="Override: memory left for the KV cache (empty: derive it)")

    def __post_init__(self):
        super().__post_init__()
        m, gpu = MODELS[self.model], GPUS[self.gpu]
        if self.parallelism == "tensor":
            check_tensor_parallel("gpu_count", m, self.gpu_count)
        else:
            check_pipeline_parallel("gpu_count", m, self.gpu_count)
        check_weights_fit("gpu_count", m, gpu, self.gpu_count, dtype_bytes(self.weight_dtype), self.weight_dtype)
        if self.kv_memory_gb is not None:
            # At most what the weights leave of the GPUs, even reading the datasheet's GB as the GiB HBM is built in.
            most = (self.gpu_count * gpu.memory_gb * GiB - m.params * dtype_bytes(self.weight_dtype)) / GB
            if self.kv_memory_gb > most:
                raise ParamError("kv_memory_gb", f"kv_memory_gb must be at most {most:,.1f} GB, what {self.gpu_count} × "
                                                 f"{gpu.memory_gb:g} GiB leave after the weights; got "
                                                 f"{self.kv_memory_gb:,g}.")
        if self.kv_memory_gb is None:
            # The workspace comes out of what the weights leave; more than that leaves negative memory for KV.
            room = (gpu.memory_bytes * self.gpu_count - m.params * dtype_bytes(self.weight_dtype)) / self.gpu_count
            if self.reserve_gb_per_gpu * GB > room:
                raise ParamError("reserve_gb_per_gpu", f"reserve_gb_per_gpu must be at most {room / GB:,.2f} GB, "
                                                       f"what each GPU has left after the weights; got "
                                                       f"{self.reserve_gb_per_gpu:g}.")


def replication(p: CacheRentingParams) -> float:
    """How many copies of each token's cache the node stores.

    Tensor parallelism splits KV heads across GPUs. With fewer KV heads than GPUs each head is stored
    on several GPUs, and MLA's latent is shared by all heads, so every GPU stores all of it.
    Pipeline parallelism splits layers, so nothing is stored twice.
    """
    m, g = MODELS[p.model], p.gpu_count
    if p.parallelism == "pipeline" or g == 1:
        return 1.0
    if m.attention == "MLA":
        return float(g)
    heads_per_gpu = math.ceil(m.kv_heads / g)
    return g * heads_per_gpu / m.kv_heads


def evaluate(p: CacheRentingParams) -> dict:
    """The named results `kvx run` prints, in bytes and sessions."""
    m, gpu = MODELS[p.model], GPUS[p.gpu]
    model_bytes_per_token = m.kv_bytes_per_token(dtype_bytes(p.kv_dtype))
    rep = replication(p)
    per_token = model_bytes_per_token * rep
    total = gpu.memory_bytes * p.gpu_count
    weights = m.params * dtype_bytes(p.weight_dtype)
    reserve = p.reserve_gb_per_gpu * GB * p.gpu_count
    derived_kv = total - weights - reserve
    kv_memory = derived_kv if p.kv_memory_gb is None else p.kv_memory_gb * GB
    session = per_token * p.context
    return {
        "kv_bytes_per_token": per_token,
        "model_kv_bytes_per_token": model_bytes_per_token,
        "replication": rep,
        "session_bytes": session,
        "total_memory_bytes": total,
        "weights_bytes": weights,
        "reserve_bytes": reserve,
        "derived_kv_memory_bytes": derived_kv,
        "kv_memory_bytes": kv_memory,
        "kv_memory_source": "derived" if p.kv_memory_gb is None else "override",
        "max_sessions": sessions_that_fit(kv_memory, session),
        "token_capacity": max(0, math.floor(kv_memory / per_token)),
        "sessions_at_4k": sessions_that_fit(kv_memory, per_token * SEED_SHORT),
        "sessions_at_128k": sessions_that_fit(kv_memory, per_token * SEED_LONG),
    }


def sessions_that_fit(kv_memory: float, session_bytes: float) -> int:
    # A small relative tolerance so that memory equal to n sessions on paper holds n, despite rounding.
    return max(0, math.floor(kv_memory / session_bytes * (1 + 1e-12)))


def memory_picture(p: CacheRentingParams, r: dict) -> dict:
    """Segments of the node's memory and the frame at which each appears, for the animation.

    Frame 0 shows weights and reserve; each later frame admits more sessions; the last frame shows
    the next session that does not fit. At most MAX_FRAMES frames: big counts admit sessions in groups.
    """
    rows = {"left": [], "right": [], "kind": [], "label": [], "frame": []}

    def add(left, right, kind, label, frame):
        rows["left"].append(left / GB)
        rows["right"].append(right / GB)
        rows["kind"].append(kind)
        rows["label"].append(label)
        rows["frame"].append(frame)

    weights, reserve = r["weights_bytes"], r["reserve_bytes"]
    add(0, weights, "weights", f"weights {bytes_si(weights)}", 0)
    add(weights, weights + reserve, "reserve", f"workspace {bytes_si(reserve)}", 0)
    start, session, n = weights + reserve, r["session_bytes"], r["max_sessions"]
    per_frame = max(1, math.ceil(n / (MAX_FRAMES - 2)))
    frames = math.ceil(n / per_frame)
    captions = [f"Weights ({bytes_si(weights)}) and workspace ({bytes_si(reserve)}) are paid once, "
                f"before any user arrives."]
    for f in range(1, frames + 1):
        first, last = (f - 1) * per_frame + 1, min(n, f * per_frame)
        who = f"session {thousands(first)}" if first == last else f"sessions {thousands(first)}–{thousands(last)}"
        add(start + (first - 1) * session, start + last * session, "session",
            f"{who}: {bytes_si(session * (last - first + 1))}", f)
        captions.append(f"{who.capitalize()} admitted: {bytes_si(session * last)} of "
                        f"{bytes_si(r['kv_memory_bytes'])} KV memory in use.")
    # The one that does not fit, drawn past the end of KV memory.
    end = start + n * session
    add(end, end + session, "rejected", f"session {thousands(n + 1)} does not fit", frames + 1)
    free = start + r["kv_memory_bytes"] - end
    if r["kv_memory_bytes"] <= 0:
        captions.append(f"The weights and workspace alone need {bytes_si(weights + reserve - r['total_memory_bytes'])} "
                        f"more than the {bytes_si(r['total_memory_bytes'])} there is: no session fits.")
    else:
        captions.append(f"Session {thousands(n + 1)} needs {bytes_si(session)} but only {bytes_si(free)} is free: "
                        f"the node is full at {thousands(n)} sessions.")
    return {"rows": rows, "captions": captions, "kv_end_gb": (start + r["kv_memory_bytes"]) / GB}


def sessions_curve(p: CacheRentingParams, r: dict) -> dict:
    """Maximum concurrent sessions against context length, with everything else held."""
    contexts = sorted(set(CURVE_CONTEXTS + [p.context]))
    sessions = [sessions_that_fit(r["kv_memory_bytes"], r["kv_bytes_per_token"] * c) for c in contexts]
    return {"context": contexts, "sessions": sessions}


def formula(p: CacheRentingParams, r: dict) -> list[dict]:
    """Each figure on the page, as its formula with the current values substituted."""
    m, gpu = MODELS[p.model], GPUS[p.gpu]
    kvb = dtype_bytes(p.kv_dtype)
    if m.attention == "MLA":
        per_token_sub = f"{m.layers} × ({m.kv_latent} + {m.rope_dim}) × {kvb:g} B"
    else:
        per_token_sub = f"2 × {m.layers} × {m.kv_heads} × {m.head_dim} × {kvb:g} B"
    lines = [{
        "name": "KV bytes per token",
        "formula": f"{m.attention}: {m.kv_formula()}",
        "substituted": per_token_sub,
        "result": f"{thousands(r['model_kv_bytes_per_token'])} B ({bytes_iec(r['model_kv_bytes_per_token'])})",
    }]
    if r["replication"] != 1:
        why = ("MLA's latent is shared by all heads, so every GPU keeps all of it" if m.attention == "MLA"
               else f"{m.kv_heads} KV heads over {p.gpu_count} GPUs: each head is kept on several")
        lines.append({
            "name": "Stored per token on the node",
            "formula": f"bytes per token × copies ({p.parallelism} parallel; {why})",
            "substituted": f"{thousands(r['model_kv_bytes_per_token'])} B × {r['replication']:g}",
            "result": f"{thousands(r['kv_bytes_per_token'])} B",
        })
    lines.append({
        "name": "KV bytes per session",
        "formula": "bytes per token × context",
        "substituted": f"{thousands(r['kv_bytes_per_token'])} B × {tokens(p.context)}",
        "result": bytes_both(r["session_bytes"]),
    })
    if r["kv_memory_source"] == "override":
        lines.append({
            "name": "Memory left for KV",
            "formula": "set by hand (kv_memory_gb)",
            "substituted": f"{p.kv_memory_gb:g} GB",
            "result": f"{bytes_both(r['kv_memory_bytes'])} (the presets would leave "
                      f"{bytes_si(r['derived_kv_memory_bytes'])})",
        })
    else:
        lines.append({
            "name": "Memory left for KV",
            "formula": "GPUs × memory − params × weight bytes − GPUs × reserve",
            "substituted": f"{p.gpu_count} × {gpu.memory_gb:g} GB − {m.params / 1e9:g}e9 × "
                           f"{dtype_bytes(p.weight_dtype):g} B − {p.gpu_count} × {p.reserve_gb_per_gpu:g} GB",
            "result": bytes_both(r["kv_memory_bytes"]),
        })
    lines.append({
        "name": "Sessions that fit",
        "formula": "⌊ memory left for KV ÷ KV bytes per session ⌋",
        "substituted": f"⌊ {bytes_si(r['kv_memory_bytes'], 2)} ÷ {bytes_si(r['session_bytes'], 3)} ⌋",
        "result": thousands(r["max_sessions"]),
    })
    return lines


def readouts(p: CacheRentingParams, r: dict) -> list[dict]:
    short, long_ = r["sessions_at_4k"], r["sessions_at_128k"]
    drop = f"−{(1 - long_ / short) * 100:.0f}%" if short else "none fit"
    return [
        {"label": "KV per token", "value": bytes_iec(r["kv_bytes_per_token"]),
         "detail": f"{thousands(r['kv_bytes_per_token'])} bytes at {dtype_label(p.kv_dtype)}"},
        {"label": "KV per session", "value": bytes_si(r["session_bytes"]),
         "detail": f"{tokens(p.context)} tokens = {bytes_iec(r['session_bytes'])}"},
        {"label": "Memory for KV", "value": bytes_si(r["kv_memory_bytes"]),
         "detail": "set by hand" if r["kv_memory_source"] == "override"
         else f"of {bytes_si(r['total_memory_bytes'])} on {p.gpu_count} × {GPUS[p.gpu].title}"},
        {"label": "Sessions that fit", "value": thousands(r["max_sessions"]),
         "detail": f"at {tokens(p.context)} tokens each"},
        {"label": "4K → 128K tokens", "value": f"{thousands(short)} → {thousands(long_)}",
         "detail": f"sessions at 4,000 and 128,000 tokens: {drop}"},
    ]


def page_data(p: CacheRentingParams) -> dict:
    """Everything the page draws, as JSON-ready data: plot sources, frames, formula and readouts."""
    r = evaluate(p)
    picture = memory_picture(p, r)
    curve = sessions_curve(p, r)
    total_gb = r["total_memory_bytes"] / GB
    limits = {"x": [total_gb], "label": [f"{p.gpu_count} × {GPUS[p.gpu].memory_gb:g} GB"]}
    if r["kv_memory_source"] == "override":
        limits["x"].append(picture["kv_end_gb"])
        limits["label"].append(f"KV set to {p.kv_memory_gb:g} GB")
    x_end = max([total_gb, picture["kv_end_gb"]] + picture["rows"]["right"]) * 1.02
    sources = {
        "memory": picture["rows"],
        "limits": limits,
        "curve": curve,
        "point": {"context": [p.context], "sessions": [r["max_sessions"]],
                  "text": [f"{thousands(r['max_sessions'])} at {tokens(p.context)} tokens"]},
    }
    return {
        "sources": sources,
        "texts": plot_summaries(sources),
        "animation": {"source": "memory", "frames": len(picture["captions"]), "captions": picture["captions"]},
        "ranges": {"memory_x": [0, x_end]},
        "formula": formula(p, r),
        "readouts": readouts(p, r),
        "notes": notes(p),
    }


def plot_summaries(sources: dict) -> dict:
    """Each plot in words, from the columns it draws (the memory picture as it stands at the last frame)."""
    rows, point, curve = sources["memory"], sources["point"], sources["curve"]

    def span(kind):
        return sum(r - l for l, r, k in zip(rows["left"], rows["right"], rows["kind"]) if k == kind) * GB

    n, context = point["sessions"][0], point["context"][0]
    memory = (f"The node's memory is {bytes_si(sources['limits']['x'][0] * GB)} "
              f"({sources['limits']['label'][0]}): the weights take {bytes_si(span('weights'))} and the "
              f"workspace {bytes_si(span('reserve'))}; ")
    memory += (f"{thousands(n)} sessions of {tokens(context)} tokens fill {bytes_si(span('session'))}, "
               f"and one more ({bytes_si(span('rejected'))}) does not fit." if n else
               f"no session of {tokens(context)} tokens ({bytes_si(span('rejected'))}) fits.")
    c, s = curve["context"], curve["sessions"]
    sessions = (f"Sessions that fit fall from {thousands(s[0])} at {tokens(c[0])} tokens of context to "
                f"{thousands(s[-1])} at {tokens(c[-1])} tokens; at {tokens(context)} tokens, {thousands(n)} fit."
                if s[0] else f"No session fits at any context from {tokens(c[0])} to {tokens(c[-1])} tokens: "
                f"the weights and workspace leave no memory for the cache.")
    return summaries(memory=memory, curve=sessions)


def notes(p: CacheRentingParams) -> list[str]:
    m = MODELS[p.model]
    out = []
    if p.context > m.max_context:
        out.append(f"{m.title} was released for at most {tokens(m.max_context)} tokens; "
                   f"{tokens(p.context)} is past that, and the arithmetic does not know it.")
    return out
