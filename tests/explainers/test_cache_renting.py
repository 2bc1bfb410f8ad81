"""cache-renting: the seed figures, the arithmetic on small configs, and invariants."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.cache_renting.model import (CacheRentingParams as P, evaluate, memory_picture, page_data,
                                                 replication, sessions_that_fit)
from kvx.explainers.core.gpus import GPUS
from kvx.explainers.core.models import MODELS


def test_seed_llama_70b_fp16_per_token_and_128k_session():
    r = evaluate(P(model="llama-3-70b", kv_dtype="fp16", context=128_000))
    assert r["kv_bytes_per_token"] == 327_680                         # 320 KiB
    assert r["kv_bytes_per_token"] == 320 * 1024
    assert r["session_bytes"] == 41_943_040_000                       # "about 41.9 GB"
    assert round(r["session_bytes"] / 1e9, 1) == 41.9


def test_seed_sessions_on_450_gb():
    """About 340 sessions at 4K and about 10 at 128K: a 97% collapse."""
    r = evaluate(P(model="llama-3-70b", kv_dtype="fp16", context=4_000, kv_memory_gb=450))
    assert r["max_sessions"] == 343
    assert (r["sessions_at_4k"], r["sessions_at_128k"]) == (343, 10)
    assert round((1 - 10 / 343) * 100) == 97
    assert evaluate(P(context=4096, kv_memory_gb=450))["max_sessions"] == 335      # "4K" read as 4,096


def test_defaults_derive_the_seeds_450_gb():
    """8 x 80 GB - 70.55e9 params x 2 B - 8 x 6 GB = 450.9 GB, the page's stated assumptions."""
    r = evaluate(P())
    assert r["total_memory_bytes"] == 640e9
    assert r["weights_bytes"] == pytest.approx(141.1e9)
    assert r["kv_memory_bytes"] == pytest.approx(450.9e9)
    assert r["max_sessions"] == 344


def test_small_config_by_hand():
    # Llama 2 7B (MHA) on one RTX 4090: 24 - 6.74 * 2 - 2 = 8.52 GB; 524,288 B x 4,000 = 2.097 GB -> 4 sessions.
    r = evaluate(P(model="llama-2-7b", gpu="rtx-4090", gpu_count=1, reserve_gb_per_gpu=2))
    assert r["kv_memory_bytes"] == pytest.approx(8.52e9)
    assert r["session_bytes"] == 524_288 * 4_000
    assert r["max_sessions"] == 4


def test_weights_that_do_not_fit_leave_no_sessions():
    r = evaluate(P(model="llama-3-405b", gpu="rtx-4090", gpu_count=1))
    assert r["kv_memory_bytes"] < 0 and r["max_sessions"] == 0 and r["token_capacity"] == 0
    assert "no session fits" in memory_picture(P(model="llama-3-405b", gpu="rtx-4090", gpu_count=1), r)["captions"][-1]


@pytest.mark.parametrize("model,gpus,parallelism,copies", [
    ("llama-3-70b", 8, "tensor", 1),      # 8 KV heads over 8 GPUs: one each
    ("llama-3-70b", 16, "tensor", 2),     # 8 KV heads over 16 GPUs: each kept twice
    ("llama-3-70b", 16, "pipeline", 1),   # layers split: nothing kept twice
    ("qwen2.5-7b", 8, "tensor", 2),       # 4 KV heads over 8 GPUs
    ("llama-3-70b", 3, "tensor", 9 / 8),  # uneven: 3 heads per GPU, 9 stored for 8
    ("falcon-7b", 4, "tensor", 4),        # MQA: the one head on every GPU
    ("deepseek-v3", 8, "tensor", 8),      # MLA: the latent on every GPU
    ("deepseek-v3", 8, "pipeline", 1),
    ("deepseek-v3", 1, "tensor", 1),
])
def test_replication_under_parallelism(model, gpus, parallelism, copies):
    p = P(model=model, gpu_count=gpus, parallelism=parallelism)
    assert replication(p) == copies
    assert evaluate(p)["kv_bytes_per_token"] == MODELS[model].kv_bytes_per_token(2) * copies


def test_try_this_numbers_follow_from_the_model():
    """Every "?query" link on the page is a scenario; the numbers the text promises must be the model's."""
    text = (Path(__file__).parents[2] / "explainers" / "cache_renting" / "page.md").read_text()
    scenarios = {q: evaluate(P.from_mapping(dict(parse_qsl(q))))["max_sessions"]
                 for q in re.findall(r"\]\(\?([^)]*)\)", text)}
    assert scenarios["context=128000"] == 10
    assert scenarios["kv_dtype=fp8"] == 688
    assert scenarios["model=llama-2-7b&gpu=rtx-4090&gpu_count=1&reserve_gb_per_gpu=2"] == 4
    assert scenarios["model=llama-3-8b&gpu=rtx-4090&gpu_count=1&reserve_gb_per_gpu=2"] == 11
    assert scenarios["model=deepseek-v3&gpu=h200&weight_dtype=fp8"] == 181
    assert scenarios["model=deepseek-v3&gpu=h200&weight_dtype=fp8&parallelism=pipeline"] == 1455
    assert scenarios["kv_memory_gb=495.07"] == 377
    assert scenarios["kv_memory_gb=450"] == 343
    assert evaluate(P())["max_sessions"] == 344 and evaluate(P(kv_dtype="fp8"))["max_sessions"] == 688


params_strategy = st.builds(
    P,
    model=st.sampled_from(sorted(MODELS)),
    gpu=st.sampled_from(sorted(GPUS)),
    gpu_count=st.integers(1, 64),
    parallelism=st.sampled_from(["tensor", "pipeline"]),
    weight_dtype=st.sampled_from(["bf16", "fp8", "int4", "4.5"]),
    kv_dtype=st.sampled_from(["fp32", "fp16", "fp8", "int4", "3.25"]),
    context=st.integers(1, 10_000_000),
    reserve_gb_per_gpu=st.floats(0, 20),
    kv_memory_gb=st.one_of(st.none(), st.floats(0.001, 5000)),
)


@settings(max_examples=300, deadline=None)
@given(params_strategy)
def test_sessions_fit_and_one_more_does_not(p):
    r = evaluate(p)
    n, session = r["max_sessions"], r["session_bytes"]
    assert n >= 0
    assert n * session <= r["kv_memory_bytes"] * (1 + 1e-9) or n == 0       # memory never oversubscribed
    assert (n + 1) * session > r["kv_memory_bytes"] * (1 - 1e-9)            # and the next one does not fit


@settings(max_examples=150, deadline=None)
@given(params_strategy, st.integers(2, 64))
def test_longer_context_never_fits_more_sessions(p, factor):
    longer = P(**{**p.as_dict(), "context": min(10_000_000, p.context * factor)})
    assert evaluate(longer)["max_sessions"] <= evaluate(p)["max_sessions"]


@settings(max_examples=150, deadline=None)
@given(params_strategy)
def test_page_data_agrees_with_evaluate(p):
    r, d = evaluate(p), page_data(p)
    mem = d["sources"]["memory"]
    assert d["sources"]["point"]["sessions"] == [r["max_sessions"]]
    i = d["sources"]["curve"]["context"].index(p.context)
    assert d["sources"]["curve"]["sessions"][i] == r["max_sessions"]
    # The animation: at most 200 frames, one caption per frame, frames only grow, and the sessions
    # drawn add up to exactly the sessions that fit.
    frames = d["animation"]["frames"]
    assert frames == len(d["animation"]["captions"]) <= 200
    assert mem["frame"] == sorted(mem["frame"]) and mem["frame"][-1] == frames - 1
    drawn = sum(right - left for right, left, kind in zip(mem["right"], mem["left"], mem["kind"]) if kind == "session")
    assert drawn == pytest.approx(r["max_sessions"] * r["session_bytes"] / 1e9, rel=1e-9, abs=1e-9)
    assert mem["kind"][-1] == "rejected"


def test_sessions_that_fit_is_exact_at_the_boundary():
    assert sessions_that_fit(10.0, 2.0) == 5
    assert sessions_that_fit(9.999, 2.0) == 4
    assert sessions_that_fit(-1.0, 2.0) == 0
