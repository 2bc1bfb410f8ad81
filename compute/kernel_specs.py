"""The kernel endpoints: for each, its request (pydantic, with bounds), its cost estimate, and its run.

Every response carries the device, the dtype, the median time after warm-up, the bytes the explainer
model says must move, and the error against the naive reference, so a page can show a measured
number next to the formula that predicts it.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import os
import random
from typing import Callable, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvx.compute.kernels import crosslayer, crossmodel, eviction, mla, paged, quant
from kvx.compute.kernels.timing import clock_name, copy_bandwidth, device, median_seconds
from kvx.compute.lm import data
from kvx.compute.lm.model import TinyLM, next_token_loss
from kvx.compute.lm.train import CHECKPOINTS, SEQ_LEN, load

TrainedModel = Literal["gqa-large", "gqa-small", "mla"]
MAX_WORK = 2e11          # FLOP-equivalents one request may cost (Settings.kernel_max_work); ~a minute on 2 cores


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)     # strict: "2" and true are not numbers


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
                         "max_error": _max_error(mla.absorbed(layer, inp), reference),
                         "implementation": mla.absorbed_implementation(layer, inp)},
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
    dtype: Literal["float32", "bfloat16"] = "float32"
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
    dev, dt, g = device(), _dtype(r.dtype), torch.Generator().manual_seed(0)
    lens = [max(1, r.context - 7 * i) for i in range(r.batch)]          # host ints: no device sync while timing
    # Drawn on the CPU (the same numbers on every device), then moved.
    k = torch.randn(r.batch, r.context, r.kv_heads, r.head_dim, generator=g).to(dev, dt)
    v = torch.randn(r.batch, r.context, r.kv_heads, r.head_dim, generator=g).to(dev, dt)
    q = torch.randn(r.batch, r.heads, r.head_dim, generator=g).to(dev, dt)
    blocks = sum(math.ceil(n / r.block_size) for n in lens) + 1
    k_pool, table = paged.scatter_to_blocks(k, lens, r.block_size, blocks, torch.Generator().manual_seed(1))
    v_pool, _ = paged.scatter_to_blocks(v, lens, r.block_size, blocks, torch.Generator().manual_seed(1))
    lens_d = torch.tensor(lens, device=dev)
    progress(0.2, "float64 reference")
    reference = paged.loop_decode(q, k, v, lens, dtype=torch.float64)
    progress(0.4, "contiguous (batched SDPA)")
    t_ref = median_seconds(lambda: paged.contiguous_decode(q, k, v, lens_d), dev, r.repeats)
    contiguous_error = _max_error(paged.contiguous_decode(q, k, v, lens_d), reference)
    progress(0.7, "paged")
    out = paged.paged_decode(q, k_pool, v_pool, table, lens)
    t_paged = median_seconds(lambda: paged.paged_decode(q, k_pool, v_pool, table, lens), dev, r.repeats)
    stored = sum(lens) * r.kv_heads * r.head_dim * 2 * k.element_size()
    return {"paged_seconds": t_paged, "contiguous_seconds": t_ref, "max_error": _max_error(out, reference),
            "contiguous_max_error": contiguous_error, "blocks_used": blocks - 1, "model_bytes": stored,
            "wasted_slots": int((blocks - 1) * r.block_size - sum(lens)),
            "reference": "float64 attention, one sequence at a time; unused block slots hold NaN; the contiguous "
                         "time is one batched SDPA call over a plain cache"}


# ---- eviction ---------------------------------------------------------------------------------------
class EvictionRequest(Request):
    model: TrainedModel = "gqa-large"
    policy: Literal["full", "random", "streaming_llm", "h2o", "observed", "snapkv"] = "snapkv"
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


# ---- peak memory of each request, from its parameters ------------------------------------------------
# Each estimate adds the tensors that are alive together at the request's peak (inputs, caches, the
# reference's and the kernel's temporaries), in bytes, and says which are on the host (CPU) and which on
# the device; on a CPU-only server both are host memory. tests/compute/test_kernel_api.py checks each
# against the peak resident memory measured on the CPU for a few sizes.
F32 = 4
SLACK = 1.25                         # the allocator's rounding and fragmentation, measured at most ~20% here
MODEL_OVERHEAD = 16 * 2 ** 20        # a trained checkpoint (1-3 MB) and PyTorch's workspaces for its forward


def _peak(host: float, device_bytes: float) -> dict:
    return {"host": int(SLACK * host), "device": int(SLACK * device_bytes)}


def _moved(nbytes: float, same_dtype: bool) -> float:
    """Bytes a tensor drawn on the CPU in float32 adds when moved to the device: none if it stays put."""
    return 0 if device().type == "cpu" and same_dtype else nbytes


def mla_memory(r: MLARequest) -> dict:
    c = _mla_layer().c
    elt = torch.finfo(_dtype(r.dtype)).bits // 8
    b, s, h = r.batch, r.context, c.n_heads
    x_ctx = b * s * c.d_model * F32                                   # drawn on the CPU, then moved
    # building the cache: x on the device, its two token-shifted copies, the latent and RoPE key
    inputs = _moved(x_ctx, elt == F32) + b * s * (2 * c.d_model + 2 * (c.kv_latent + c.rope_dim)) * max(elt, F32)
    cache = b * s * (c.kv_latent + c.rope_dim) * elt
    mha = 2 * b * h * s * c.head_dim * elt                            # the materialized per-head K and V
    naive = 2 * b * h * s * c.head_dim * elt + 3 * b * h * s * elt    # naive rebuilds K and V, then scores
    return _peak(x_ctx, max(inputs, cache + mha + naive))


def paged_memory(r: PagedRequest) -> dict:
    elt = torch.finfo(_dtype(r.dtype)).bits // 8
    tokens = r.batch * r.context
    kv = 2 * tokens * r.kv_heads * r.head_dim
    drawn = kv * F32                                                  # k and v drawn on the CPU in float32
    blocks = tokens + r.batch * r.block_size                          # the pool has at most a block more each
    pools = 2 * blocks * r.kv_heads * r.head_dim * elt
    # the float64 reference, one sequence at a time: K and V, and their copies repeated for each query group
    reference = 2 * r.context * (r.kv_heads + r.heads) * r.head_dim * 8 + 2 * r.heads * r.context * 8
    sdpa = r.batch * r.heads * r.context * 4 * F32                    # SDPA's mask and scores
    return _peak(drawn, _moved(kv * elt, elt == F32) + pools + reference + sdpa)


def _forward_bytes(name: str, sequences: int, weights: bool = True) -> float:
    """A trained model's forward over `sequences` of SEQ_LEN tokens: one layer's activations and the logits
    (layers run one after another without gradients) and, with need_weights, every layer's attention weights
    [B, H, T, T] kept at once."""
    from kvx.compute.lm.train import CONFIGS
    c = CONFIGS[name]
    t = SEQ_LEN
    acts = sequences * t * (12 * c.d_model + 3 * c.vocab) * F32
    return acts + (sequences * c.n_layers * c.n_heads * t * t * F32 if weights else 0)


def eviction_memory(r: EvictionRequest) -> dict:
    from kvx.compute.lm.train import CONFIGS
    c = CONFIGS[r.model]
    masks = r.sequences * c.n_layers * c.n_heads * SEQ_LEN ** 2            # one bool per weight
    return _peak(0, _forward_bytes(r.model, r.sequences) + masks + _forward_bytes(r.model, r.sequences, False)
                 + MODEL_OVERHEAD)


def quant_memory(r: QuantRequest) -> dict:
    return _peak(0, _forward_bytes(r.model, r.sequences, weights=False) + MODEL_OVERHEAD)


def crosslayer_memory(r: CrossLayerRequest) -> dict:
    return _peak(0, _forward_bytes(r.model, r.sequences) + _forward_bytes(r.model, r.sequences, False)
                 + MODEL_OVERHEAD)


def crossmodel_memory(r: CrossModelRequest) -> dict:
    from kvx.compute.lm.train import CONFIGS
    fin = CONFIGS["gqa-small"].cache_numbers_per_token() + 1
    fout = CONFIGS["gqa-large"].cache_numbers_per_token()
    features = r.fit_sequences * SEQ_LEN * (fin + fout) * 8 * 3       # float64 features, with the bias, and x.T
    solve = 4 * fin * (fin + fout) * 8
    return _peak(0, features + solve + _forward_bytes("gqa-large", max(r.fit_sequences, r.eval_sequences))
                 + MODEL_OVERHEAD)


def decode_memory(r: DecodeRequest) -> dict:
    copy_test = 2 * 256 * 2 ** 20                                      # the copy-bandwidth measurement's buffers
    return _peak(0, (r.weight_mb + max(r.kv_mb, 0.02)) * 1e6 + copy_test + MODEL_OVERHEAD)


def memory_budget(device_type: str | None = None) -> dict:
    """What one request may use when the settings leave it open: half the host's RAM, and on a GPU 80% of
    its memory (the rest is for other requests' caches, PyTorch's allocator and the server itself)."""
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    budget = {"host": int(0.5 * host), "device": int(0.5 * host)}
    if (device_type or device().type) == "cuda":
        budget["device"] = int(0.8 * torch.cuda.get_device_properties(0).total_memory)
    return budget


def _size(nbytes: float) -> str:
    """Bytes in decimal units (1 GB = 10^9 bytes), as the pages count them."""
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


def memory_refusal(k: "Kernel", request: Request, max_bytes: float | None = None) -> str | None:
    """A sentence refusing the request if its estimated peak memory is over the budget, else None.

    max_bytes (Settings.kernel_max_bytes) caps host and device alike; None takes `memory_budget()`. On the
    CPU the device is the host, so the two estimates are added and compared with the host budget.
    """
    need = k.memory(request)
    budget = memory_budget()
    if max_bytes is not None:
        budget = {"host": int(max_bytes), "device": int(max_bytes)}
    on_cpu = device().type != "cuda"
    checks = [("host memory", need["host"] + (need["device"] if on_cpu else 0), budget["host"])]
    if not on_cpu:
        checks.append(("GPU memory", need["device"], budget["device"]))
    for what, est, limit in checks:
        if est > limit:
            return (f"This request would need about {_size(est)} of {what} at its peak; the server's limit is "
                    f"{_size(limit)} per request. Ask for less (a shorter context, a smaller batch, "
                    f"fewer sequences).")
    return None


# ---- CPU threads ----------------------------------------------------------------------------------------
def kernel_threads() -> int:
    """CPU threads a kernel runs with: KVX_KERNEL_THREADS, else 1.

    One, as the server's job processes run (kvx.compute.jobs), so the benchmark, a baked result and "run it
    here" time the same thing. With one thread the CPU timer is the thread's own CPU time (timing.timer_for),
    so a job at lower priority on a busy machine still reports the kernel's speed: served at nice +10 with a
    two-thread OpenMP team on a loaded two-core machine, absorbed MLA decode at 8K read 2.8 ms against the
    benchmark's 0.28 ms, because an OpenMP team whose thread is descheduled waits at every barrier.
    """
    env = os.environ.get("KVX_KERNEL_THREADS")
    return max(1, int(env)) if env else 1


@contextlib.contextmanager
def threads(n: int | None = None):
    """Run the block with `n` (default `kernel_threads()`) intra-op threads in this thread, then restore."""
    before = torch.get_num_threads()
    torch.set_num_threads(n or kernel_threads())
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _with_threads(run: Callable[[Request, Callable], dict]) -> Callable[[Request, Callable], dict]:
    @functools.wraps(run)
    def wrapped(request: Request, progress) -> dict:
        n = kernel_threads()
        with threads(n):
            return {**run(request, progress), "threads": n, "timer": clock_name(device())}
    return wrapped


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    summary: str
    request: type[Request]
    cost: Callable[[Request], float]
    run: Callable[[Request, Callable], dict]
    memory: Callable[[Request], dict] = lambda r: {"host": 0, "device": 0}

    def __post_init__(self):
        object.__setattr__(self, "run", _with_threads(self.run))


KERNELS: dict[str, Kernel] = {k.name: k for k in [
    Kernel("mla", "MLA decode: naive, plain-MHA cache and absorbed, timed against context", MLARequest, mla_cost,
           mla_run, mla_memory),
    Kernel("paged", "Paged attention through a block table against contiguous attention", PagedRequest, paged_cost,
           paged_run, paged_memory),
    Kernel("eviction", "An eviction policy at a budget, on a trained model: loss, agreement, recall",
           EvictionRequest, eviction_cost, eviction_run, eviction_memory),
    Kernel("quantization", "A KV quantization scheme on a trained model: error and loss", QuantRequest, quant_cost,
           quant_run, quant_memory),
    Kernel("cross-layer", "Similarity of KV between layers (CKA) and the loss of sharing it", CrossLayerRequest,
           crosslayer_cost, crosslayer_run, crosslayer_memory),
    Kernel("cross-model", "Map the small model's KV into the large one's: loss against re-prefill",
           CrossModelRequest, crossmodel_cost, crossmodel_run, crossmodel_memory),
    Kernel("decode", "A decode-shaped read: the weights once and the cache once, in their dtypes", DecodeRequest,
           decode_cost, decode_run, decode_memory),
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
            "torch": torch.__version__, "threads": kernel_threads()}

