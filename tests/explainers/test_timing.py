"""The shared time model (explainers/core/timing.py) against closed forms worked out by hand."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.core.gpus import GPUS, GpuPreset
from kvx.explainers.core.models import MODELS, ModelPreset
from kvx.explainers.core.timing import (attention_flops, decode_step, expected_experts_touched, linear_flops,
                                        prefill_flops, prefill_formula, prefill_seconds, weight_params_read)

# Made-up shapes small enough to do by hand.
TINY = ModelPreset("tiny", "Tiny", "GQA", 2, 4, 2, 8, 1000, 4096, "made up")
# MLA + MoE: 3 layers, 2 of them MoE with 4 routed experts of 10 parameters, 2 picked per token.
TINY_MOE = ModelPreset("tiny-moe", "Tiny MoE", "MLA", 3, 2, 2, 4, 200, 4096, "made up", kv_latent=6, rope_dim=2,
                       active_params=150, v_head_dim=3, experts=4, experts_per_token=2, shared_experts=1,
                       moe_layers=2, expert_params=10)
GPU = GpuPreset("toy", "Toy", 1, 1, 1, "made up")            # 1 GB/s, 1 TFLOP/s


def test_prefill_flops_tiny_by_hand():
    # linear 2 × 1000 × n; attention 2 × 2 layers × 4 heads × (8 + 8) = 256 FLOPs per (query, key) pair.
    assert linear_flops(TINY, 10) == 20_000
    assert attention_flops(TINY, 10) == 256 * 50                      # 10²/2 pairs
    assert prefill_flops(TINY, 10) == 20_000 + 12_800
    assert attention_flops(TINY, 10, 5) == 256 * (10 * 5 + 50)       # each new token also sees 5 cached
    assert prefill_flops(TINY, 10, 5) == 20_000 + 25_600


def test_mla_attention_uses_qk_and_v_dims():
    """MLA scores over nope + rope (4 + 2 here), weights the v_head_dim (3): 2 × 3 × 2 × (6 + 3) per pair."""
    assert (TINY_MOE.attention_qk_dim, TINY_MOE.attention_v_dim) == (6, 3)
    assert attention_flops(TINY_MOE, 4) == 2 * 3 * 2 * 9 * 8
    assert linear_flops(TINY_MOE, 4) == 2 * 150 * 4                 # active parameters, not all 200
    v3 = MODELS["deepseek-v3"]
    assert (v3.attention_qk_dim, v3.attention_v_dim) == (192, 128)   # config.json: 128 nope + 64 rope; v 128


def test_standard_attention_keeps_the_old_closed_form():
    """At c = 0, MHA/GQA attention is 2 × L × H × d × n², the closed form the project used before."""
    m = MODELS["llama-3-8b"]
    for n in (1, 1000, 131_072):
        assert attention_flops(m, n) == 2 * 32 * 32 * 128 * n * n


def test_llama_3_8b_at_124k_attention_is_twice_the_linear_term():
    """The issue's figure: at 124K tokens causal attention is about 2× the weights' FLOPs, so a time
    model with only 2 × params × n is about 3× too fast."""
    m = MODELS["llama-3-8b"]
    n = 124 * 1024
    ratio = attention_flops(m, n) / linear_flops(m, n)
    assert ratio == pytest.approx(32 * 32 * 128 * n / 8.03e9) and 2.0 < ratio < 2.1
    assert prefill_flops(m, n) / linear_flops(m, n) == pytest.approx(1 + ratio)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6))
def test_chunked_prefill_costs_what_one_prefill_costs(c, n1, n2):
    """n·c + n²/2 is additive over chunks: prefilling n1 then n2 (seeing the first) is one prefill of n1 + n2."""
    m = MODELS["llama-3-8b"]
    assert prefill_flops(m, n1, c) + prefill_flops(m, n2, c + n1) == pytest.approx(prefill_flops(m, n1 + n2, c))


def test_prefill_seconds():
    h100 = GPUS["h100-sxm"]
    m = MODELS["llama-3-8b"]
    assert prefill_seconds(m, h100, 1000, 500, gpus=2, mfu=0.4) == prefill_flops(m, 1000, 500) / (2 * 989e12 * 0.4)
    assert prefill_seconds(TINY, GPU, 10, mfu=0.5) == 32_800 / 0.5e12
    row = prefill_formula(TINY, GPU, 10, 5, mfu=0.5)
    assert "(4 + 4)" not in row["substituted"] and "(8 + 8)" in row["substituted"] and "0.5" in row["substituted"]


def test_expected_experts_touched_by_hand():
    assert expected_experts_touched(4, 2, 1) == 2                       # one token: its k experts
    assert expected_experts_touched(4, 2, 2) == 4 * (1 - 0.5 ** 2) == 3
    assert expected_experts_touched(4, 4, 3) == 4                       # k = E: all of them
    assert expected_experts_touched(4, 2, 0) == 0


def test_expected_experts_touched_against_sampling():
    """E × (1 − (1 − k/E)^B) is the mean of distinct experts when each token picks k of E at random."""
    rng = random.Random(12)
    for experts, k, batch in [(256, 8, 1), (256, 8, 16), (256, 8, 64), (160, 6, 32), (8, 2, 3)]:
        trials = 2000
        mean = sum(len({e for _ in range(batch) for e in rng.sample(range(experts), k)})
                   for _ in range(trials)) / trials
        assert mean == pytest.approx(expected_experts_touched(experts, k, batch), rel=0.02)


def test_weights_read_tiny_moe_by_hand():
    # Always used: 150 active − 2 MoE layers × 2 picked × 10 = 110. Batch 2: 3 experts per layer expected.
    assert weight_params_read(TINY_MOE, 1) == 150
    assert weight_params_read(TINY_MOE, 2) == 110 + 2 * 3 * 10 == 170
    assert weight_params_read(TINY_MOE, 10**6) == 190                 # all routed experts: 110 + 2 × 4 × 10
    assert weight_params_read(TINY, 1) == weight_params_read(TINY, 64) == 1000   # dense: every weight, any batch


def test_decode_step_tiny_by_hand():
    # TINY, batch 2, context 3, 1 byte per weight, 2 per KV number: weights 1000 B; KV numbers per token
    # 2 × 2 layers × 2 kv heads × 8 = 64, so 2 × 3 × 64 × 2 = 768 B. FLOPs: 2 × 1000 × 2 = 4000 linear;
    # attention 2 sequences × 3 cached × 2 layers × 4 × 4 heads × 8 = 1536.
    s = decode_step(TINY, GPU, batch=2, context=3, weight_bytes_per_param=1, kv_bytes_per_element=2,
                    bandwidth_efficiency=0.5, mfu=0.25)
    assert (s["weight_bytes"], s["kv_bytes"], s["flops"]) == (1000, 768, 5536)
    assert s["memory_s"] == 1768 / 0.5e9 and s["compute_s"] == 5536 / 0.25e12
    assert s["seconds"] == s["memory_s"] and s["bound"] == "memory"
    # MLA decodes absorbed: per cached token 3 layers × (2 × 2 × (6 + 2) + 2 × 2 × 6) = 168 FLOPs.
    t = decode_step(TINY_MOE, GPU, batch=2, context=3)
    assert t["weight_bytes"] == 170 * 2 and t["kv_bytes"] == 2 * 3 * 3 * 8 * 2
    assert t["flops"] == 2 * 150 * 2 + 2 * 3 * 168 and t["experts_touched"] == 3


def test_deepseek_v3_reads_active_at_batch_1_and_nearly_all_at_256():
    v3 = MODELS["deepseek-v3"]
    assert v3.moe_layers == 61 - 3 and v3.expert_params == 3 * 7168 * 2048 == 44_040_192
    assert weight_params_read(v3, 1) == pytest.approx(37e9)
    touched = expected_experts_touched(256, 8, 256)
    assert 255.9 < touched < 256                                         # 256 × (1 − (31/32)^256)
    assert weight_params_read(v3, 256) / v3.params > 0.99
    # Consistency of the published counts: all experts give back the 671B total within 0.2%.
    assert weight_params_read(v3, 10**9) == pytest.approx(671e9, rel=2e-3)
    h100 = GPUS["h100-sxm"]
    one, many = (decode_step(v3, h100, batch=b, context=1000) for b in (1, 256))
    assert many["weight_bytes"] / one["weight_bytes"] > 18               # 670B vs 37B parameters


def test_deepseek_v2_moe_facts():
    v2 = MODELS["deepseek-v2"]
    assert (v2.experts, v2.experts_per_token, v2.shared_experts, v2.moe_layers) == (160, 6, 2, 59)
    assert v2.expert_params == 3 * 5120 * 1536
    assert weight_params_read(v2, 1) == pytest.approx(21e9)
    assert weight_params_read(v2, 10**9) == pytest.approx(236e9, rel=5e-3)


@given(st.sampled_from(["deepseek-v2", "deepseek-v3", "tiny-moe"]), st.integers(1, 5000))
def test_weights_read_grow_with_batch_up_to_all(slug, batch):
    m = TINY_MOE if slug == "tiny-moe" else MODELS[slug]
    a, b = weight_params_read(m, batch), weight_params_read(m, batch + 1)
    assert (m.active_params or m.params) <= a <= b <= m.params


def test_only_moe_presets_have_experts():
    assert {s for s, m in MODELS.items() if m.is_moe} == {"deepseek-v2", "deepseek-v3"}
    with pytest.raises(ValueError, match="mixture of experts"):
        ModelPreset("bad", "Bad", "GQA", 2, 4, 2, 8, 1000, 4096, "made up", experts=4, experts_per_token=5,
                    moe_layers=1, expert_params=1, active_params=10)
