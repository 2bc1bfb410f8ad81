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
