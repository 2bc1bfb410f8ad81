"""core/limits.py: the configurations every page refuses, against the serving systems' own rules."""
from __future__ import annotations

import pytest

from kvx.explainers.core.gpus import GPUS
from kvx.explainers.core.limits import (check_context, check_pipeline_parallel, check_split, check_tensor_parallel,
                                        check_weights_fit, gpus_needed, kept_tokens, tensor_parallel_degrees)
from kvx.explainers.core.models import MODELS
from kvx.explainers.core.params import ParamError


def vllm_accepts(total_heads: int, total_kv_heads: int, tp: int) -> bool:
    """vLLM's rule, transcribed for this test: ModelConfig.verify_with_parallel_config refuses heads that the
    tensor-parallel size does not divide, and QKVParallelLinear.__init__ (vllm/model_executor/layers/linear.py)
    calls divide(total_num_kv_heads, tp_size) when tp < kv heads, else divide(tp_size, total_num_kv_heads);
    vllm.distributed.utils.divide asserts the division is exact."""
    def divide(a, b):
        if a % b:
            raise AssertionError(f"{a} is not divisible by {b}")
        return a // b
    try:
        if total_heads % tp:
            raise ValueError("Total number of attention heads must be divisible by tensor parallel size.")
        divide(total_heads, tp)
        if tp >= total_kv_heads:
            divide(tp, total_kv_heads)
        else:
            divide(total_kv_heads, tp)
    except (AssertionError, ValueError):
        return False
    return True


@pytest.mark.parametrize("slug", sorted(slug for slug, m in MODELS.items() if m.attention != "MLA"))
def test_tensor_parallel_rule_is_vllms(slug):
    m = MODELS[slug]
    assert tensor_parallel_degrees(m, 128) == [tp for tp in range(1, 129) if vllm_accepts(m.q_heads, m.kv_heads, tp)]


def test_tensor_parallel_degrees_of_known_models():
    assert tensor_parallel_degrees(MODELS["llama-3-70b"], 64) == [1, 2, 4, 8, 16, 32, 64]
    assert tensor_parallel_degrees(MODELS["qwen2.5-7b"], 64) == [1, 2, 4, 28]        # 28 heads, 4 KV heads
    assert tensor_parallel_degrees(MODELS["falcon-7b"], 64) == [1]                   # 71 heads
    assert tensor_parallel_degrees(MODELS["deepseek-v3"], 64) == [1, 2, 4, 8, 16, 32, 64]   # MLA: 128 heads
    with pytest.raises(ParamError, match=r"^tp \(tensor parallel\) must divide Qwen2\.5 7B's 28 query heads, as 1, 2, "
                                         r"4 or 28 do; got 8\.$") as err:
        check_tensor_parallel("tp", MODELS["qwen2.5-7b"], 8)
    assert err.value.field == "tp"
    with pytest.raises(ParamError, match="as 1 does; got 2"):
        check_tensor_parallel("tp", MODELS["falcon-7b"], 2)


def test_pipeline_and_mixed_splits():
    check_pipeline_parallel("n", MODELS["qwen2.5-7b"], 28)
    with pytest.raises(ParamError, match="at most Qwen2.5 7B's 28 layers.*got 29"):
        check_pipeline_parallel("n", MODELS["qwen2.5-7b"], 29)
    check_split("gpus", MODELS["opt-175b"], 9)            # DistServe's OPT-175B: tensor 3 x pipeline 3
    check_split("gpus", MODELS["falcon-7b"], 32)          # 32 pipeline stages of one layer each
    with pytest.raises(ParamError, match="^gpus must be .*got 33"):
        check_split("gpus", MODELS["falcon-7b"], 33)


def test_weights_fit_and_the_gpus_they_need():
    h100 = GPUS["h100-sxm"]
    assert gpus_needed(811.7e9, h100) == 11 and gpus_needed(800e9, h100) == 10          # exactly 10 x 80 GB
    assert gpus_needed(74e9, h100, reserve_bytes_per_gpu=6e9) == 1 and gpus_needed(1, h100, 80e9) is None
    check_weights_fit("gpus", MODELS["llama-3-70b"], h100, 2, 2)                        # 141.1 GB in 160 GB
    with pytest.raises(ParamError, match=r"^gpus must be at least 2 to hold Llama 3 70B's 141\.1 GB of bf16 weights "
                                         r"in 80 GB NVIDIA H100 SXMs; got 1\.$"):
        check_weights_fit("gpus", MODELS["llama-3-70b"], h100, 1, 2, "bf16")
    with pytest.raises(ParamError, match=r"^model must fit in 1 × 80 GB NVIDIA H100 SXM \(74\.0 GB after 6\.0 GB held "
                                         r"back\); got Llama 3 70B's 141\.1 GB of bf16 weights\.$"):
        check_weights_fit("model", MODELS["llama-3-70b"], h100, 1, 2, "bf16", reserve_bytes_per_gpu=6e9)


def test_context_and_kept_tokens():
    check_context("context", MODELS["llama-2-7b"], 4_096)
    with pytest.raises(ParamError, match=r"^context must keep the context within Llama 2 7B's 4,096-token context; "
                                         r"got 4,097 tokens\.$"):
        check_context("context", MODELS["llama-2-7b"], 4_097)
    # kvpress's compute_n_kept: int(n * (1 - compression_ratio)), at least one; 20% of 423 keeps 84.
    assert [kept_tokens(f, n) for f, n in [(0.2, 423), (0.01, 150), (0.01, 1), (1.0, 7), (0.3, 10)]] == [84, 1, 1, 7, 3]
    assert kept_tokens(0.5, 0) == 0
