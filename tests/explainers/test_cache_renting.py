"""cache-renting: the seed figures, the arithmetic on small configs, and invariants."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import assume, given, settings, strategies as st

from kvx.explainers.cache_renting.model import (CacheRentingParams as P, evaluate, memory_picture, page_data,
                                                 replication, sessions_that_fit)
from kvx.explainers.core.dtypes import dtype_bytes
from kvx.explainers.core.gpus import GPUS
from kvx.explainers.core.limits import tensor_parallel_degrees
from kvx.explainers.core.params import ParamError
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


def test_weights_that_do_not_fit_are_refused_with_the_gpus_they_need():
    # 405.85e9 x 2 B = 811.7 GB over 80 GB cards: 11 GPUs; 10 hold 800 GB.
    with pytest.raises(ParamError, match=r"^gpu_count must be at least 11 .*811\.7 GB.*; got 1\.$"):
        P(model="llama-3-405b", gpu="h100-sxm", gpu_count=1)
    with pytest.raises(ParamError, match="got 8"):
        P(model="llama-3-405b", gpu="h100-sxm", gpu_count=8)
    P(model="llama-3-405b", gpu="h100-sxm", gpu_count=16, reserve_gb_per_gpu=0)      # 1,280 GB holds it


def test_a_workspace_larger_than_what_the_weights_leave_is_refused():
    # Llama 3 70B on 8 x 80 GB: (640 - 141.1) / 8 = 62.36 GB per GPU after the weights.
    with pytest.raises(ParamError, match=r"^reserve_gb_per_gpu must be at most 62\.36 GB.*; got 63\.$"):
        P(reserve_gb_per_gpu=63)
    r = evaluate(P(reserve_gb_per_gpu=62.36))
    assert r["kv_memory_bytes"] >= 0 and r["max_sessions"] == 0
    assert "no session fits" not in memory_picture(P(reserve_gb_per_gpu=62.36), r)["captions"][-1]


@pytest.mark.parametrize("model,gpus,why", [
    ("llama-3-70b", 3, "64 query heads"),            # vLLM: heads must be divisible by the TP size
    ("qwen2.5-7b", 8, "28 query heads"),
    ("falcon-7b", 4, "71 query heads"),
    ("llama-3-70b", 12, "64 query heads"),
])
def test_tensor_parallel_must_split_the_heads(model, gpus, why):
    with pytest.raises(ParamError, match=f"^gpu_count \\(tensor parallel\\) must divide .*{why}.*; got {gpus}\\.$"):
        P(model=model, gpu_count=gpus, weight_dtype="int4")
    P(model=model, gpu_count=gpus, weight_dtype="int4", parallelism="pipeline")    # by layers it splits


def test_kv_memory_set_by_hand_is_at_most_what_the_weights_leave():
    # 8 x 80 GiB (HBM is built in binary sizes) - 141.1 GB of weights = 546.1 GB; the page's 495.07 GB is within.
    most = (8 * 80 * 2 ** 30 - 70.55e9 * 2) / 1e9
    assert evaluate(P(kv_memory_gb=495.07))["max_sessions"] == 377
    P(kv_memory_gb=round(most, 1) - 0.1)
    with pytest.raises(ParamError, match=r"^kv_memory_gb must be at most 546\.1 GB, .*; got 1,000\.$"):
        P(kv_memory_gb=1000)


def test_pipeline_stages_at_most_the_layers():
    with pytest.raises(ParamError, match="at most Qwen2.5 7B's 28 layers.*got 29"):
        P(model="qwen2.5-7b", gpu_count=29, parallelism="pipeline")
    P(model="qwen2.5-7b", gpu_count=28, parallelism="pipeline")


@pytest.mark.parametrize("model,gpus,parallelism,copies", [
    ("llama-3-70b", 8, "tensor", 1),      # 8 KV heads over 8 GPUs: one each
    ("llama-3-70b", 16, "tensor", 2),     # 8 KV heads over 16 GPUs: each kept twice
    ("llama-3-70b", 16, "pipeline", 1),   # layers split: nothing kept twice
    ("qwen2.5-7b", 28, "tensor", 7),      # 4 KV heads over 28 GPUs: each kept 7 times
    ("llama-3-70b", 32, "tensor", 4),     # 8 KV heads over 32 GPUs
    ("falcon-7b", 1, "tensor", 1),        # MQA: 71 query heads, so tensor parallel only on one GPU
    ("deepseek-v3", 8, "tensor", 8),      # MLA: the latent on every GPU
    ("deepseek-v3", 8, "pipeline", 1),
    ("mistral-7b", 1, "tensor", 1),
])
def test_replication_under_parallelism(model, gpus, parallelism, copies):
    p = P(model=model, gpu_count=gpus, parallelism=parallelism, weight_dtype="int4")      # int4: the weights fit
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


@st.composite
def params_strategy(draw):
    """Configurations that can exist: a parallel degree that splits the model, weights that fit."""
    model = draw(st.sampled_from(sorted(MODELS)))
    parallelism = draw(st.sampled_from(["tensor", "pipeline"]))
    m = MODELS[model]
    counts = tensor_parallel_degrees(m, 64) if parallelism == "tensor" else list(range(1, min(64, m.layers) + 1))
    gpu, weight_dtype = draw(st.sampled_from(sorted(GPUS))), draw(st.sampled_from(["bf16", "fp8", "int4", "4.5"]))
    fits = [n for n in counts if m.params * dtype_bytes(weight_dtype) <= n * GPUS[gpu].memory_bytes]
    assume(fits)
    n = draw(st.sampled_from(fits))
    room = (n * GPUS[gpu].memory_bytes - m.params * dtype_bytes(weight_dtype)) / n / 1e9
    return P(model=model, gpu=gpu, gpu_count=n, parallelism=parallelism, weight_dtype=weight_dtype,
             kv_dtype=draw(st.sampled_from(["fp32", "fp16", "fp8", "int4", "3.25"])),
             context=draw(st.integers(1, 10_000_000)), reserve_gb_per_gpu=draw(st.floats(0, min(20, room))),
             kv_memory_gb=draw(st.one_of(st.none(), st.floats(0.001, max(0.001, min(5000, room * n))))))


params_strategy = params_strategy()


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
