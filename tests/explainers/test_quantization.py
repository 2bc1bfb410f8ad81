"""quantization: the claim's two halves under the page's assumptions, exact bytes, and invariants."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.core.gpus import GPUS
from kvx.explainers.core.models import MODELS
from kvx.explainers.quantization.model import QuantizationParams as P, crossover_context, evaluate, page_data, step

PAGE = (Path(__file__).parents[2] / "explainers" / "quantization" / "page.md").read_text()


def test_bytes_per_step_by_hand():
    # Llama 3 8B: 8.03e9 params x 0.5 B; cache 2,000 x 131,072 B x 0.25 (int4 of 16 bits) = 65.5 MB.
    r = evaluate(P())
    assert r["weight_bytes"] == pytest.approx(4.015e9)
    assert r["kv_bytes"] == 2_000 * 131_072 / 4
    assert r["memory_seconds"] == pytest.approx((4.015e9 + 65_536_000) / 3.35e12)
    assert r["bound"] == "memory"


def test_short_context_small_batch_weights_matter_and_cache_does_not():
    r = evaluate(P())
    assert round(r["speedup_from_weights"], 2) == 3.82
    assert round(r["speedup_from_cache"], 2) == 1.01
    assert round(evaluate(P(weight_dtype="4.5"))["speedup_from_weights"], 2) == 3.42   # with group scales
    assert 3 <= evaluate(P(weight_dtype="4.5"))["speedup_from_weights"] <= 4           # "about 3x"


def test_long_context_or_large_batch_the_cache_is_what_moves_the_clock():
    r = evaluate(P(context=128_000, batch=16))
    assert round(r["cache_share"], 3) == 0.944
    assert round(r["speedup_from_weights"], 2) == 1.04 and round(r["speedup_from_cache"], 2) == 3.42
    assert round(evaluate(P(context=4_000, batch=256))["cache_share"], 3) == 0.893


def test_crossover_is_where_cache_bytes_equal_weight_bytes():
    m = MODELS["llama-3-8b"]
    for batch, expected in ((1, 122_528), (16, 7_658), (256, 479)):
        c = crossover_context(m, "int4", "int4", batch)
        assert round(c) == expected
        s = step(m, GPUS["h100-sxm"], "int4", "int4", c, batch)
        assert s["kv_bytes"] == pytest.approx(s["weight_bytes"])
    assert round(evaluate(P(model="llama-2-7b"))["crossover_context"]) == 25_711


def test_decode_is_memory_bound_until_the_batch_is_large():
    """Intensity is about 2 FLOPs per weight byte x batch at bf16; H100's ridge is 989e12/3.35e12 = 295."""
    assert evaluate(P(weight_dtype="bf16", kv_dtype="bf16", context=1, batch=1))["bound"] == "memory"
    assert evaluate(P(weight_dtype="bf16", kv_dtype="bf16", context=1, batch=1024))["bound"] == "compute"


def test_try_this_links_are_valid_scenarios():
    for query in re.findall(r"\]\(\?([^)]*)\)", PAGE):
        P.from_mapping(dict(parse_qsl(query)))


strategy = st.builds(P, model=st.sampled_from(sorted(MODELS)), gpu=st.sampled_from(sorted(GPUS)),
                     weight_dtype=st.sampled_from(["bf16", "fp8", "int4", "4.5", "2"]),
                     kv_dtype=st.sampled_from(["fp16", "fp8", "int4", "3", "16"]),
                     context=st.integers(1, 10_000_000), batch=st.integers(1, 65_536))


@settings(max_examples=300, deadline=None)
@given(strategy)
def test_invariants(p):
    r = evaluate(p)
    assert 0 <= r["cache_share"] <= 1
    assert r["seconds"] == max(r["memory_seconds"], r["compute_seconds"]) > 0
    assert r["tokens_per_s_total"] == pytest.approx(p.batch * r["tokens_per_s_per_user"])
    # Fewer bits never slow a step, and quantizing both is at least as good as either alone.
    assert r["speedup_from_weights"] >= 1 - 1e-12 and r["speedup_from_cache"] >= 1 - 1e-12
    assert r["speedup_from_both"] >= max(r["speedup_from_weights"], r["speedup_from_cache"]) - 1e-9
    d = page_data(p)
    assert d["sources"]["bytes"]["ms"][-1] == pytest.approx(r["seconds"] * 1e3)


@settings(max_examples=100, deadline=None)
@given(strategy, st.integers(2, 100))
def test_more_context_means_a_larger_cache_share(p, factor):
    longer = P(**{**p.as_dict(), "context": min(10_000_000, p.context * factor)})
    assert evaluate(longer)["cache_share"] >= evaluate(p)["cache_share"]


def test_moe_step_reads_the_experts_its_batch_touches():
    """DeepSeek-V3: 37B parameters at batch 1; at batch 256 the expected distinct experts, 256 × (1 − (31/32)^256)
    = 255.9 per MoE layer, so 16.57B always used + 58 × 255.92 × 44.04M = 670.3B parameters."""
    one = evaluate(P(model="deepseek-v3", weight_dtype="bf16", kv_dtype="bf16"))
    many = evaluate(P(model="deepseek-v3", weight_dtype="bf16", kv_dtype="bf16", batch=256))
    assert one["weight_bytes"] == pytest.approx(37e9 * 2)
    always = 37e9 - 58 * 8 * 3 * 7168 * 2048
    assert many["weight_bytes"] == pytest.approx(2 * (always + 58 * 256 * (1 - (1 - 8 / 256) ** 256) * 3 * 7168 * 2048))
    assert round(many["weight_bytes"] / 1e9) == 1341 and round(many["experts_touched"], 1) == 255.9
    # The crossover compares the cache with the weights the batch reads, so a MoE batch crosses later.
    m = MODELS["deepseek-v3"]
    assert crossover_context(m, "bf16", "bf16", 256) == pytest.approx(many["weight_bytes"] / (256 * m.kv_bytes_per_token(2)))
    d = page_data(P(model="deepseek-v3", batch=256))
    assert "255.9 experts" in d["formula"][0]["substituted"] and any("255.9 of its 256" in n for n in d["notes"])


def test_bandwidth_efficiency_and_mfu_scale_the_times():
    base, slow = evaluate(P()), evaluate(P(bandwidth_efficiency=0.8, mfu=0.5))
    assert slow["memory_seconds"] == pytest.approx(base["memory_seconds"] / 0.8)
    assert slow["compute_seconds"] == pytest.approx(base["compute_seconds"] / 0.5)
    assert slow["speedup_from_weights"] == pytest.approx(base["speedup_from_weights"])   # memory-bound: a ratio


def test_the_speedup_claim_is_a_bound_next_to_measurements():
    """The roofline gives a bound ('up to'); the page shows the published end-to-end figures next to it."""
    from kvx.explainers.registry import REGISTRY
    claim = REGISTRY["quantization"].claim
    assert "up to three to four times" in claim and "2.8" in claim
    assert "up to 3.82×" in PAGE and "up to 2.8×" in PAGE and "Hugging Face FP16" in PAGE and "PPoPP 2025" in PAGE
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "up to 3-4×" in readme and "about 3-4×" not in readme


def test_a_wider_dtype_is_not_called_faster():
    r = page_data(P(weight_dtype="fp32", kv_dtype="fp32"))["readouts"]
    assert r[0]["value"] == "0.50×" and r[0]["detail"].startswith("the speed of")
    assert page_data(P())["readouts"][0]["detail"].startswith("faster than")


def test_what_does_not_fit_one_gpu_is_said_not_to():
    # Llama 3.1 405B at int4: 202.9 GB of weights + 2,000 tokens x 129,024 B of int4 cache = 203.2 GB: 3 H100s at least.
    notes = page_data(P(model="llama-3-405b"))["notes"]
    assert any(n.startswith("This does not fit one NVIDIA H100 SXM") and "203.2 GB, at least 3 GPUs" in n for n in notes)
    assert not any("does not fit" in n for n in page_data(P())["notes"])
    assert any("released for at most 4,096 tokens" in n for n in page_data(P(model="llama-2-7b", context=8_000))["notes"])
