"""Configurations that cannot exist, refused the same way on every page.

Each check raises ParamError with one sentence that names the field, the limit and the value given,
so a page shows it next to the control and the CLI and the API print it. The rules are the serving
systems' own, not ours:

- Tensor parallelism splits attention heads across GPUs, so the degree must divide the query heads,
  and either divide the KV heads or be a multiple of them (then each KV head is replicated). vLLM
  refuses anything else: `ModelConfig.verify_with_parallel_config` ("Total number of attention heads
  must be divisible by tensor parallel size") and `QKVParallelLinear` (`divide(total_num_kv_heads,
  tp_size)` or `divide(tp_size, total_num_kv_heads)`), vllm/model_executor/layers/linear.py.
- Pipeline parallelism gives each GPU at least one whole layer.
- The weights must fit in the GPUs that hold them.
- A model takes at most its released context (vLLM refuses a prompt longer than max_model_len).

Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import math

from .params import ParamError
from .units import bytes_si, tokens


def tensor_parallel_problem(m, tp: int) -> str | None:
    """Why `tp` GPUs cannot split `m`'s heads, or None if they can."""
    if tp <= 1:
        return None
    if m.q_heads % tp:
        return f"divide {m.title}'s {m.q_heads} query heads"
    if m.attention != "MLA":                      # MLA's one latent is kept whole on every GPU
        kv = m.kv_heads
        if (tp < kv and kv % tp) or (tp > kv and tp % kv):
            return f"divide {m.title}'s {kv} KV heads or be a multiple of them"
    return None


def tensor_parallel_degrees(m, most: int) -> list[int]:
    """The degrees from 1 to `most` that split `m`'s heads."""
    return [tp for tp in range(1, most + 1) if tensor_parallel_problem(m, tp) is None]


def check_tensor_parallel(field: str, m, tp: int, most: int = 64) -> None:
    """Refuse a tensor-parallel degree that does not split the model's heads."""
    why = tensor_parallel_problem(m, tp)
    if why is not None:
        ok = [str(d) for d in tensor_parallel_degrees(m, most)]
        ok = ok[0] if len(ok) == 1 else ", ".join(ok[:-1]) + " or " + ok[-1]
        raise ParamError(field, f"{field} (tensor parallel) must {why}, as {ok} {'does' if ' ' not in ok else 'do'}; "
                                f"got {tp}.")


def check_pipeline_parallel(field: str, m, stages: int) -> None:
    """Refuse more pipeline stages than the model has layers."""
    if stages > m.layers:
        raise ParamError(field, f"{field} (pipeline parallel) must be at most {m.title}'s {m.layers} layers, one "
                                f"or more per GPU; got {stages}.")


def gpus_needed(need_bytes: float, gpu, reserve_bytes_per_gpu: float = 0.0) -> int | None:
    """The fewest GPUs whose memory, less a reserve each, holds `need_bytes`; None if no number does."""
    usable = gpu.memory_bytes - reserve_bytes_per_gpu
    if usable <= 0:
        return None
    return max(1, math.ceil(need_bytes / usable * (1 - 1e-12)))


def check_weights_fit(field: str, m, gpu, gpus: int, weight_bytes_per_param: float, dtype: str = "",
                      reserve_bytes_per_gpu: float = 0.0) -> None:
    """Refuse `gpus` GPUs whose memory (less a reserve each) cannot hold the model's weights.

    `field` names the control to change: the GPU count where the page has one, else the model.
    """
    weights = m.params * weight_bytes_per_param
    usable = gpu.memory_bytes - reserve_bytes_per_gpu
    if weights <= gpus * usable:
        return
    what = f"{m.title}'s {bytes_si(weights)} of {dtype + ' ' if dtype else ''}weights"
    each = (f"{gpu.memory_gb:g} GB {gpu.title}" + (f" ({bytes_si(usable)} after {bytes_si(reserve_bytes_per_gpu)} "
                                                    f"held back)" if reserve_bytes_per_gpu else ""))
    least = gpus_needed(weights, gpu, reserve_bytes_per_gpu)
    if field == "model" or least is None:
        raise ParamError(field, f"{field} must fit in {gpus} × {each}; got {what}.")
    raise ParamError(field, f"{field} must be at least {least:,} to hold {what} in {each}s; got {gpus}.")


def check_context(field: str, m, n: int, what: str = "") -> None:
    """Refuse a prompt longer than the model was released for."""
    if n > m.max_context:
        raise ParamError(field, f"{field} must keep {what or 'the context'} within {m.title}'s "
                                f"{tokens(m.max_context)}-token context; got {tokens(n)} tokens.")


def kept_tokens(fraction: float, n: int) -> int:
    """Tokens a cache keeps when it keeps `fraction` of `n`: whole tokens, floored, at least one.

    kvpress's `compute_n_kept` with compression ratio 1 − fraction, computed as it computes it, which is
    also the eviction kernel's rule (compute/kernels/eviction.py kept_count).
    """
    return max(1, int(n * (1 - (1 - fraction)))) if n > 0 else 0


def check_split(field: str, m, gpus: int) -> None:
    """Refuse a GPU count that no tensor × pipeline split of the model uses: some tensor-parallel degree
    that divides `gpus` must split the heads, with at most one pipeline stage per layer."""
    if any(gpus % tp == 0 and gpus // tp <= m.layers for tp in tensor_parallel_degrees(m, gpus)):
        return
    raise ParamError(field, f"{field} must be a tensor-parallel degree that splits {m.title}'s heads "
                            f"({', '.join(map(str, tensor_parallel_degrees(m, 64)))}) times at most {m.layers} "
                            f"pipeline stages (its layers); got {gpus}.")
