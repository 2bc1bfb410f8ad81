"""cross-model: the maps' shapes, memory and FLOPs by hand, the break-even, agreement with the project's
kernel, and the kernel's own verdict on the project's pair."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.core.gpus import GPUS
from kvx.explainers.core.models import MODELS
from kvx.explainers.core.params import ParamError
from kvx.explainers.cross_model.model import (FAMILY, MAP_INPUTS, RUN_REQUEST, TINY, CrossModelParams as P, costs,
                                              describe_run, evaluate, map_shape, page_data, source_layer,
                                              tiny_map_flops_per_token)

ROOT = Path(__file__).parents[2]
PAGE = (ROOT / "explainers" / "cross_model" / "page.md").read_text()


def test_default_maps_by_hand():
    """Qwen2.5 14B -> 32B: 64 layers x 8 KV heads x (K, V) maps of (128 + 1) x 128 numbers, in BF16."""
    r = evaluate(P())
    assert (r["map_count"], r["map_d_in"], r["map_d_out"]) == (64 * 8 * 2, 128, 128)
    assert r["map_numbers"] == 1_024 * 129 * 128 == 16_908_288
    assert r["map_memory_bytes"] == 33_816_576                    # 33.8 MB = 32.2 MiB
    rope = 3 * (48 * 8 * 128 + 64 * 8 * 128)
    assert r["map_only_flops"] == 8_000 * (2 * 16_908_288 + rope)
    assert r["reprefill_flops"] == 2 * 32.5e9 * 8_000 + 2 * 64 * 40 * 128 * 8_000 ** 2
    assert r["reprefill_seconds"] == pytest.approx(r["reprefill_flops"] / (989e12 * 0.5))        # compute-bound
    assert r["map_seconds"] == pytest.approx((33_816_576 + 8_000 * (196_608 + 262_144)) / 3_350e9)  # memory-bound
    assert round(r["flops_ratio"] * 100, 3) == 0.049
    assert r["break_even_kind"] == "map-always" and r["break_even_tokens"] is None
    assert r["flops_break_even_kind"] == "map-fewer"


def test_bandwidth_efficiency_slows_the_memory_bound_map_only():
    """The map is memory-bound and re-prefill compute-bound at the defaults: half the bandwidth doubles only
    the map's time. Re-prefill's FLOPs are the shared model's (core/timing.py)."""
    from kvx.explainers.core.models import MODELS
    from kvx.explainers.core.timing import prefill_flops
    r, half = evaluate(P()), evaluate(P(bandwidth_efficiency=0.5))
    assert half["map_seconds"] == pytest.approx(2 * r["map_seconds"])
    assert half["reprefill_seconds"] == r["reprefill_seconds"]
    assert r["reprefill_flops"] == prefill_flops(MODELS["qwen2.5-32b"], 8_000)
    rows = {f["name"]: f for f in page_data(P(bandwidth_efficiency=0.5))["formula"]}
    assert "3,350 GB/s × 0.5" in rows["Map time"]["substituted"] and "(128 + 128)" in rows["Re-prefill FLOPs"]["substituted"]


def test_layer_and_input_widths():
    assert [source_layer(j, 48, 64) for j in (0, 1, 2, 3, 63)] == [0, 0, 1, 2, 47]
    assert [source_layer(j, 3, 4) for j in range(4)] == [0, 0, 1, 2]
    s, l_ = {"layers": 48, "kv_heads": 8, "head_dim": 128}, {"layers": 64, "kv_heads": 8, "head_dim": 128}
    assert map_shape(s, l_, "layer")["d_in"] == 1_024
    assert map_shape(s, l_, "all-layers")["d_in"] == 98_304
    assert evaluate(P(map_input="all-layers", gpus=2))["map_memory_bytes"] == 1_024 * 98_305 * 128 * 2     # 25.8 GB


def test_break_even_with_dense_maps_streamed_from_host():
    p = P(map_input="all-layers", maps_in="host-memory")
    r = evaluate(p)
    assert r["break_even_kind"] == "crossing" and r["break_even_tokens"] == 4_776     # crossing at 4,775.2 tokens
    assert round(r["host_seconds"], 2) == 0.41                    # 25.8 GB over PCIe 5.0 x16 at 63 GB/s
    at, before = costs(p, 4_776), costs(p, 4_775)                 # the first whole context at which mapping wins
    assert at["map_seconds"] <= at["reprefill_seconds"] and before["map_seconds"] > before["reprefill_seconds"]
    below, above = costs(p, 4_000), costs(p, 6_000)
    assert below["map_seconds"] > below["reprefill_seconds"] and above["map_seconds"] < above["reprefill_seconds"]
    assert evaluate(P(map_input="all-layers", gpus=2))["break_even_kind"] == "map-always"


def test_try_this_numbers():
    assert round(evaluate(P(small_prefill="counted"))["flops_ratio"] * 100, 1) == 47.5
    short = evaluate(P(context=100))
    assert round(short["reprefill_seconds"] * 1e3, 1) == 19.4 and round(short["map_seconds"] * 1e6, 1) == 23.8
    for query in re.findall(r"\]\(\?([^)]*)\)", PAGE):
        P.from_mapping(dict(parse_qsl(query)))


def test_tiny_pair_matches_the_checkpoints_and_the_kernels_count():
    """The page's all-layers formula for the project's pair is the kernel's map: (384 + 1) x 512 numbers."""
    for name, shape in TINY.items():
        card = json.loads((ROOT / "compute" / "lm" / "checkpoints" / f"{name}.json").read_text())["config"]
        assert shape == {"layers": card["n_layers"], "kv_heads": card["n_kv_heads"], "head_dim": card["head_dim"]}
    shape = map_shape(TINY["gqa-small"], TINY["gqa-large"], "all-layers")
    assert shape["d_in"] == 384 and shape["count"] * shape["d_out"] == 512
    assert tiny_map_flops_per_token() == 2 * 385 * 512 == 394_240
    assert tiny_map_flops_per_token() * 2 * 512 == 403_701_760


def test_the_large_model_must_be_larger():
    with pytest.raises(ParamError) as err:
        P(small="qwen2.5-32b", large="qwen2.5-14b")
    assert err.value.field == "large"
    assert str(err.value) == ("large must have more parameters than small (Qwen2.5 32B, 32.5B); "
                              "got Qwen2.5 14B (14.7B).")
    with pytest.raises(ParamError, match="context must be between 1 and 10,000,000 tokens; got 0."):
        P(context=0)


def _reply(own, mapped, small):
    return {"device": "cpu", "device_name": "CPU", "torch": "2.x", "params": dict(RUN_REQUEST),
            "result": {"large_own_loss": own, "large_mapped_loss": mapped, "small_loss": small,
                       "reprefill_flops": 2_620_784_640, "map_flops": 403_701_760}}


def test_describe_run_words_the_verdict():
    bad = describe_run(P(), _reply(1.18, 1.35, 1.26))
    assert bad.startswith("Measured on CPU (cpu, torch 2.x)") and "worse than the small model alone" in bad
    assert f"{1.18 / math.log(2):.3f} bits per byte" in bad and "4,096 tokens" in bad and "1,024 held-out" in bad
    assert "15.4% of re-prefill's FLOPs" in bad and "4.037e+08" in bad
    good = describe_run(P(), _reply(1.0, 1.05, 1.2))
    assert "keeps 75% of the large model's advantage" in good


def test_page_data_asks_the_kernel_for_a_cheap_run():
    d = page_data(P())
    assert d["run"] == {"kernel": "cross-model", "request": {"fit_sequences": 8, "eval_sequences": 2, "ridge": 0.01}}


def test_the_kernel_on_the_projects_pair():
    """The real fit (about 10 s on two CPU cores): the mapped cache is worse than the small model alone."""
    torch = pytest.importorskip("torch")
    from kvx.compute.kernel_specs import run_locally
    torch.manual_seed(0)
    reply = run_locally("cross-model", dict(RUN_REQUEST))
    res = reply["result"]
    assert res["large_own_loss"] < res["small_loss"] < res["large_mapped_loss"]
    assert res["map_flops"] == tiny_map_flops_per_token() * RUN_REQUEST["eval_sequences"] * 512
    assert "worse than the small model alone" in describe_run(P(), reply)


strategy = st.builds(P, small=st.sampled_from(FAMILY), large=st.sampled_from(FAMILY),
                     context=st.integers(1, 10_000_000), map_input=st.sampled_from(sorted(MAP_INPUTS)),
                     map_dtype=st.sampled_from(["bf16", "fp8", "fp32", "4"]), gpu=st.sampled_from(sorted(GPUS)),
                     gpus=st.integers(1, 64), mfu=st.floats(0.01, 1.0),
                     maps_in=st.sampled_from(["gpu-memory", "host-memory"]),
                     small_prefill=st.sampled_from(["already-paid", "counted"]))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_invariants(data):
    try:
        p = data.draw(strategy)
    except ParamError:
        return                                                     # small not smaller than large
    r = evaluate(p)
    assert r["map_memory_bytes"] > 0 and r["map_seconds"] > 0 and r["reprefill_seconds"] > 0
    assert all(0 <= s < MODELS[p.small].layers for s in r["layer_map"])
    assert r["layer_map"] == sorted(r["layer_map"]) and r["layer_map"][0] == 0
    if r["break_even_kind"] == "crossing":
        n = r["break_even_tokens"]
        lo, hi = costs(p, max(1.0, n / 2)), costs(p, min(10_000_000, n * 2))
        assert lo["map_seconds"] >= lo["reprefill_seconds"] * (1 - 1e-9)
        assert hi["map_seconds"] <= hi["reprefill_seconds"] * (1 + 1e-9)
    # Per-head maps cost fewer FLOPs than the large model's weights alone, at any context.
    if p.map_input == "head" and p.small_prefill == "already-paid":
        assert r["flops_ratio"] < 1
    assert json.dumps(page_data(p), allow_nan=False)


def test_a_large_model_that_cannot_hold_its_weights_maps_and_cache_is_refused():
    # 25.8 GB of all-layers maps beside Qwen2.5-32B's 65 GB of weights do not fit one 80 GB H100; two do.
    with pytest.raises(ParamError, match=r"^context must be at most 0 tokens .*and the maps; got 8,000\.$"):
        P(map_input="all-layers")
    P(map_input="all-layers", gpus=2)
    P(map_input="all-layers", maps_in="host-memory")
    # 80 GB - 65 GB - 33.8 MB of maps at 262,144 B per token (64 layers x 8 KV heads x 128 x 2 x 2 B).
    most = int((80e9 - 32.5e9 * 2 - 1_024 * 129 * 128 * 2) // 262_144)
    P(context=most)
    with pytest.raises(ParamError, match=f"^context must be at most {most:,} tokens"):
        P(context=most + 1)
    with pytest.raises(ParamError, match=r"^gpus must be at least 2 to hold Qwen2.5 72B's 145.4 GB"):
        P(large="qwen2.5-72b")
