"""The kernel endpoints: for each, its request (pydantic, with bounds), its cost estimate, and its run.

Every response carries the device, the dtype, the median time after warm-up, the bytes the explainer
model says must move, and the error against the naive reference, so a page can show a measured
number next to the formula that predicts it.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
import random
from typing import Callable, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvx.compute.kernels import crosslayer, crossmodel, eviction, mla, paged, quant
from kvx.compute.kernels.timing import copy_bandwidth, device, median_seconds
from kvx.compute.lm import data
from kvx.compute.lm.model import TinyLM, next_token_loss
from kvx.compute.lm.train import CHECKPOINTS, SEQ_LEN, load

TrainedModel = Literal["gqa-large", "gqa-small", "mla"]
MAX_WORK = 2e11          # FLOP-equivalents one request may cost (Settings.kernel_max_work); ~a minute on 2 cores


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


@functools.cache
def trained(name: str) -> TinyLM:
    if not (CHECKPOINTS / f"{name}.pt").exists():
        raise FileNotFoundError(f"the trained model {name!r} is not in {CHECKPOINTS}; run `kvx train {name}`.")
    return load(name).to(device())


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def _max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


# ---- MLA decode -------------------------------------------------------------------------------------
class MLARequest(Request):
    batch: int = Field(1, ge=1, le=16, description="sequences decoded together")
    context: int = Field(1024, ge=1, le=32768, description="tokens already cached (tokens)")
    dtype: Literal["float32", "bfloat16"] = "float32"
    repeats: int = Field(7, ge=1, le=25, description="timed repeats after two warm-ups (median reported)")


def mla_cost(r: MLARequest) -> float:
    layer = _mla_layer()
    return mla.cost(layer, r.batch, r.context, 4)["naive_flops"] * (r.repeats + 2) * 3


@functools.cache
def _mla_layer():
    """The trained MLA model's first layer when present, else a random layer of the same shape."""
    try:
        return trained("mla").blocks[0].attn
    except FileNotFoundError:
        from kvx.compute.lm.train import CONFIGS
        torch.manual_seed(0)
        return TinyLM(CONFIGS["mla"]).to(device()).eval().blocks[0].attn


def mla_run(r: MLARequest, progress) -> dict:
    dev, dt = device(), _dtype(r.dtype)
    layer = copy.deepcopy(_mla_layer()).to(dt)
    inp = mla.decode_inputs(layer, r.batch, r.context, torch.Generator().manual_seed(0), dtype=dt)
    inp = {k: v.to(dev) for k, v in inp.items()}
    mha_cache = mla.materialize(layer, inp)
    reference = mla.naive(layer, inp)
    progress(0.2, "naive")
    t_naive = median_seconds(lambda: mla.naive(layer, inp), dev, r.repeats)
    progress(0.5, "materialized (plain MHA cache)")
    t_mat = median_seconds(lambda: mla.materialized(layer, inp, mha_cache), dev, r.repeats)
    progress(0.8, "absorbed")
    t_abs = median_seconds(lambda: mla.absorbed(layer, inp), dev, r.repeats)
    c = mla.cost(layer, r.batch, r.context, torch.finfo(dt).bits / 8)
    return {
        "forms": {
            "naive": {"seconds": t_naive, "bytes": c["naive_bytes"], "flops": c["naive_flops"], "max_error": 0.0},
            "materialized": {"seconds": t_mat, "bytes": c["materialized_bytes"], "flops": c["materialized_flops"],
                             "max_error": _max_error(mla.materialized(layer, inp, mha_cache), reference)},
            "absorbed": {"seconds": t_abs, "bytes": c["absorbed_bytes"], "flops": c["absorbed_flops"],
                         "max_error": _max_error(mla.absorbed(layer, inp), reference)},
        },
        "cache_bytes_per_token_per_layer": c["cache_bytes_per_token"],
        "model_bytes": c["absorbed_bytes"],
        "reference": "naive (per-head K and V rebuilt from the latent)",
    }


# ---- paged attention --------------------------------------------------------------------------------
class PagedRequest(Request):
    batch: int = Field(4, ge=1, le=64)
    context: int = Field(1024, ge=1, le=16384, description="tokens per sequence (tokens)")
    block_size: int = Field(16, ge=1, le=256, description="tokens per block (tokens)")
    heads: int = Field(8, ge=1, le=64)
    kv_heads: int = Field(2, ge=1, le=64, validate_default=True)   # checked against heads even when left out
    head_dim: int = Field(64, ge=8, le=256)
    repeats: int = Field(7, ge=1, le=25)

    @field_validator("kv_heads")
    @classmethod
    def _divides_heads(cls, kv_heads: int, info):
        heads = info.data.get("heads")
        if heads is not None and heads % kv_heads:
            raise ValueError(f"kv_heads must divide heads ({heads}); got {kv_heads}.")
        return kv_heads


def paged_cost(r: PagedRequest) -> float:
    return 4 * r.batch * r.context * r.heads * r.head_dim * (r.repeats + 2) * 2


def paged_run(r: PagedRequest, progress) -> dict:
    dev, g = device(), torch.Generator().manual_seed(0)
    lens = torch.tensor([max(1, r.context - 7 * i) for i in range(r.batch)])
    k = torch.randn(r.batch, r.context, r.kv_heads, r.head_dim, generator=g)
    v = torch.randn(r.batch, r.context, r.kv_heads, r.head_dim, generator=g)
    q = torch.randn(r.batch, r.heads, r.head_dim, generator=g).to(dev)
    blocks = int(sum(math.ceil(int(n) / r.block_size) for n in lens)) + 1
    k_pool, table = paged.scatter_to_blocks(k, lens, r.block_size, blocks, torch.Generator().manual_seed(1))
    v_pool, _ = paged.scatter_to_blocks(v, lens, r.block_size, blocks, torch.Generator().manual_seed(1))
    k_pool, v_pool, table, lens_d, k, v = (t.to(dev) for t in (k_pool, v_pool, table, lens, k, v))
    progress(0.3, "contiguous reference")
    reference = paged.contiguous_decode(q, k, v, lens_d)
    t_ref = median_seconds(lambda: paged.contiguous_decode(q, k, v, lens_d), dev, r.repeats)
    progress(0.6, "paged")
    out = paged.paged_decode(q, k_pool, v_pool, table, lens_d)
    t_paged = median_seconds(lambda: paged.paged_decode(q, k_pool, v_pool, table, lens_d), dev, r.repeats)
    stored = int(lens.sum()) * r.kv_heads * r.head_dim * 2 * 4
    return {"paged_seconds": t_paged, "contiguous_seconds": t_ref, "max_error": _max_error(out, reference),
            "blocks_used": blocks - 1, "model_bytes": stored,
            "wasted_slots": int((blocks - 1) * r.block_size - lens.sum()),
            "reference": "contiguous attention, one sequence at a time; unused block slots hold NaN"}


# ---- eviction ---------------------------------------------------------------------------------------
class EvictionRequest(Request):
    model: TrainedModel = "gqa-large"
    policy: Literal["full", "random", "streaming_llm", "h2o", "snapkv"] = "snapkv"
    budget_fraction: float = Field(0.25, ge=0.05, le=1.0, description="share of the prompt's tokens kept")
    task: Literal["text", "recall"] = "recall"
    sequences: int = Field(16, ge=1, le=64)
    sinks: int = Field(4, ge=0, le=64, description="StreamingLLM's sink tokens (streaming_llm only; 0 evicts them)")


def eviction_cost(r: EvictionRequest) -> float:
    return 3 * 2 * 1.5e6 * SEQ_LEN * r.sequences * 2


def eviction_run(r: EvictionRequest, progress) -> dict:
    model = trained(r.model)
    if r.task == "recall":
        ids, pos = data.recall_set(r.sequences, SEQ_LEN)
        prefix = data.query_start(pos[0].tolist())   # the prompt ends where the asserts begin
    else:
        ids, pos, prefix = data.text_set(r.sequences, SEQ_LEN), None, SEQ_LEN - 64
    ids = ids.to(device())
    progress(0.1, "prefill with the full cache")
    policy = eviction.POLICIES[r.policy]
    if r.policy == "streaming_llm":
        policy = dataclasses.replace(policy, sinks=r.sinks)
    out = eviction.evaluate(model, ids, prefix, policy, r.budget_fraction,
                            answer_positions=None if pos is None else pos.to(device()))
    c = model.c
    return {**out, "model_bytes": c.cache_numbers_per_token() * 2 * out["budget"],
            "full_bytes": c.cache_numbers_per_token() * 2 * prefix,
            "reference": "the full cache (loss and top-1 agreement against it)"}


# ---- quantization -----------------------------------------------------------------------------------
class QuantRequest(Request):
    model: TrainedModel = "gqa-large"
    scheme: Literal["int8-token", "int8-channel", "int4-token", "int4-channel", "fp8"] = "int4-token"
    sequences: int = Field(8, ge=1, le=32)


def quant_cost(r: QuantRequest) -> float:
    return 2 * 2 * 1.5e6 * SEQ_LEN * r.sequences


def quant_run(r: QuantRequest, progress) -> dict:
    model = trained(r.model)
    ids = data.text_set(r.sequences, SEQ_LEN).to(device())
    errors = []

    def transform(layer, cache):
        out = {}
        for part, x in cache.items():
            y = quant.quantize_dequantize(x, r.scheme)
            errors.append({"layer": layer, "part": part, "relative_error": ((x - y).norm() / x.norm()).item()})
            out[part] = y
        return out

    with torch.no_grad():
        own = next_token_loss(model(ids), ids).item()
        progress(0.5, "quantized cache")
        quantized = next_token_loss(model(ids, kv_transform=transform), ids).item()
    c = model.c
    channels = c.head_dim if c.attention == "gqa" else c.kv_latent
    bits = quant.bits_per_number(r.scheme, SEQ_LEN, channels)
    return {"scheme": r.scheme, "bits_per_number": bits, "loss": quantized, "own_loss": own, "errors": errors,
            "model_bytes": c.cache_numbers_per_token() * bits / 8 * SEQ_LEN,
            "reference": "the model's own float32 cache"}


# ---- cross-layer ------------------------------------------------------------------------------------
class CrossLayerRequest(Request):
    model: TrainedModel = "gqa-large"
    sequences: int = Field(8, ge=1, le=32)


def crosslayer_cost(r: CrossLayerRequest) -> float:
    return 4 * 2 * 1.5e6 * SEQ_LEN * r.sequences


def crosslayer_run(r: CrossLayerRequest, progress) -> dict:
    model = trained(r.model)
    ids = data.text_set(r.sequences, SEQ_LEN).to(device())
    sim = crosslayer.similarity(model, ids)
    progress(0.5, "sharing")
    shares = [crosslayer.sharing_loss(model, ids, ratio) for ratio in (1, 2, 4) if ratio <= model.c.n_layers]
    return {"similarity": sim, "sharing": shares,
            "model_bytes": model.c.cache_numbers_per_token() * 2 * SEQ_LEN,
            "reference": "each layer's own cache"}


# ---- cross-model ------------------------------------------------------------------------------------
class CrossModelRequest(Request):
    fit_sequences: int = Field(32, ge=4, le=128)
    eval_sequences: int = Field(8, ge=1, le=32)
    ridge: float = Field(1e-2, ge=1e-8, le=10.0)


def crossmodel_cost(r: CrossModelRequest) -> float:
    return 2 * 2 * 1.5e6 * SEQ_LEN * (r.fit_sequences + 2 * r.eval_sequences)


def crossmodel_run(r: CrossModelRequest, progress) -> dict:
    small, large = trained("gqa-small"), trained("gqa-large")
    rng_ids = data.batch("train", r.fit_sequences, SEQ_LEN, random.Random(7), 0.0).to(device())
    fitted = crossmodel.fit(small, large, rng_ids, r.ridge)
    progress(0.6, "evaluate")
    out = crossmodel.evaluate(small, large, fitted, data.text_set(r.eval_sequences, SEQ_LEN).to(device()))
    return {**out, "model_bytes": large.c.cache_numbers_per_token() * 2 * SEQ_LEN * r.eval_sequences,
            "reference": "the large model's own cache"}


# ---- a decode-shaped step, for the quantization page ---------------------------------------------------


class DecodeRequest(Request):
    """Bytes as the explainer's model counts them (its dtypes already applied), read once each."""
    weight_mb: float = Field(256.0, ge=1, le=1024, description="weight bytes to read (MB)")
    kv_mb: float = Field(16.0, ge=0, le=1024, description="cache bytes to read (MB)")
    repeats: int = Field(5, ge=1, le=15)


def decode_cost(r: DecodeRequest) -> float:
    return 4 * (r.weight_mb + r.kv_mb) * 1e6 * (r.repeats + 2)


def _stored(mb: float, gen: torch.Generator, row_bytes: int = 16384) -> torch.Tensor:
    """`mb` MB of a weight matrix or cache (its dtype already in the byte count), as float32 rows.

    Every dtype is then read by the same float32 matrix-vector kernel, so only the number of bytes
    differs, which is exactly what the explainer's model assumes. Real 8- and 4-bit kernels must also
    dequantize; PyTorch has no CPU kernel for packed 4-bit codes, and this does not pretend to.
    """
    rows = max(1, round(mb * 1e6 / row_bytes))
    return torch.randint(-100, 100, (rows, row_bytes), generator=gen, dtype=torch.int8).view(torch.float32)


def _read(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return t @ x


def decode_run(r: DecodeRequest, progress) -> dict:
    dev, gen = device(), torch.Generator().manual_seed(0)
    w = _stored(r.weight_mb, gen).to(dev)
    kv = _stored(max(r.kv_mb, 0.02), gen).to(dev)
    x = torch.randn(w.shape[1], generator=gen).to(dev)
    progress(0.2, "measuring copy bandwidth")
    copy_bps = _copy_bandwidth(dev)
    progress(0.5, "reading the weights")
    t_w = median_seconds(lambda: _read(w, x), dev, r.repeats)
    progress(0.8, "reading the cache")
    t_kv = median_seconds(lambda: _read(kv, x), dev, r.repeats) if r.kv_mb > 0 else 0.0
    wb, kb = w.numel() * w.element_size(), (kv.numel() * kv.element_size() if r.kv_mb > 0 else 0)
    return {"weight_bytes": wb, "kv_bytes": kb, "weight_seconds": t_w, "kv_seconds": t_kv,
            "seconds": t_w + t_kv, "copy_bytes_per_s": copy_bps, "model_bytes": wb + kb,
            "predicted_seconds": (wb + kb) / copy_bps,
            "reference": "bytes ÷ this machine's copy bandwidth, measured in the same run"}


@functools.cache
def _copy_bandwidth(dev) -> float:
    """Measured once per process: it takes a second and the machine does not change."""
    return copy_bandwidth(dev)


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    summary: str
    request: type[Request]
    cost: Callable[[Request], float]
    run: Callable[[Request, Callable], dict]


KERNELS: dict[str, Kernel] = {k.name: k for k in [
    Kernel("mla", "MLA decode: naive, plain-MHA cache and absorbed, timed against context", MLARequest, mla_cost,
           mla_run),
    Kernel("paged", "Paged attention through a block table against contiguous attention", PagedRequest, paged_cost,
           paged_run),
    Kernel("eviction", "An eviction policy at a budget, on a trained model: loss, agreement, recall",
           EvictionRequest, eviction_cost, eviction_run),
    Kernel("quantization", "A KV quantization scheme on a trained model: error and loss", QuantRequest, quant_cost,
           quant_run),
    Kernel("cross-layer", "Similarity of KV between layers (CKA) and the loss of sharing it", CrossLayerRequest,
           crosslayer_cost, crosslayer_run),
    Kernel("cross-model", "Map the small model's KV into the large one's: loss against re-prefill",
           CrossModelRequest, crossmodel_cost, crossmodel_run),
    Kernel("decode", "A decode-shaped read: the weights once and the cache once, in their dtypes", DecodeRequest,
           decode_cost, decode_run),
]}


def envelope(kernel: str, params: dict, result: dict, cached: bool, seconds: float) -> dict:
    """Every kernel answer: which kernel, its parameters, where it ran, and what it measured."""
    return {"kernel": kernel, "params": params, **describe_device(), "cached": cached,
            "wall_seconds": round(seconds, 4), "result": result}


def run_locally(kernel: str, body: dict) -> dict:
    """Run a kernel in this process (the site build bakes results this way), answered as the server would."""
    import time
    k = KERNELS[kernel]
    started = time.perf_counter()
    request = k.request(**body)
    return envelope(kernel, request.model_dump(), k.run(request, lambda *a: None), False,
                    time.perf_counter() - started)


def describe_device() -> dict:
    dev = device()
    return {"device": dev.type, "device_name": torch.cuda.get_device_name(0) if dev.type == "cuda" else "CPU",
            "torch": torch.__version__, "threads": torch.get_num_threads()}

