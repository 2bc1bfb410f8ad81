"""disaggregation: exact bytes and times by hand, the recurrence against its closed form, the papers'
figures under their own assumptions, and invariants of the timeline."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, reject, settings, strategies as st

from kvx.explainers.core.gpus import GPUS
from kvx.explainers.core.links import LINKS
from kvx.explainers.core.models import MODELS
from kvx.explainers.core.params import ParamError
from kvx.explainers.disaggregation.model import (DisaggregationParams as P, evaluate, exposed_layer_by_layer,
                                                 gantt, page_data, simulate)

PAGE = (Path(__file__).parents[2] / "explainers" / "disaggregation" / "page.md").read_text()


def test_defaults_by_hand():
    """Llama 3 70B, 8,000 tokens, 8 x H100 at MFU 0.5, 8 x 400 Gb/s, 20 us per transfer."""
    r = evaluate(P())
    assert r["kv_bytes"] == 8_000 * 327_680 == 2_621_440_000
    assert r["layer_bytes"] == 32_768_000
    assert r["dense_flops"] == 2 * 70.55e9 * 8_000
    assert r["attention_flops"] == 2 * 80 * 64 * 128 * 8_000 ** 2
    assert r["prefill_seconds"] == pytest.approx((1_128.8e12 + 83.88608e12) / (8 * 989e12 * 0.5))
    assert r["link_bytes_per_s"] == 8 * 50e9
    assert r["exposed_seconds_after"] == pytest.approx(20e-6 + 2_621_440_000 / 400e9)        # 6.5736 ms
    assert r["exposed_seconds_layerwise"] == pytest.approx(20e-6 + 32_768_000 / 400e9)       # 0.10192 ms
    assert r["tpot_seconds"] == pytest.approx((70.55e9 * 2 + 2_621_440_000) / (8 * 3_350e9))
    assert round(r["share_of_ttft_after"] * 100, 2) == 2.14
    assert round(r["share_of_second_token_after"] * 100, 1) == 122.6
    assert round(r["share_of_e2e_after"] * 100, 2) == 0.39
    assert round(r["share_of_e2e_layerwise"] * 100, 3) == 0.006


def test_times_come_from_the_shared_model_and_name_their_efficiencies():
    """Prefill and TPOT are core/timing.py's; MLA attention uses d_qk = 128 + 64 and d_v = 128 per head, and
    a lower bandwidth efficiency stretches the batch-1 decode step in proportion."""
    from kvx.explainers.core.gpus import GPUS
    from kvx.explainers.core.models import MODELS
    from kvx.explainers.core.timing import decode_step, prefill_seconds
    r = evaluate(P())
    assert r["prefill_seconds"] == pytest.approx(prefill_seconds(MODELS["llama-3-70b"], GPUS["h100-sxm"], 8_000,
                                                                 gpus=8, mfu=0.5))
    half = evaluate(P(bandwidth_efficiency=0.5))
    assert half["tpot_seconds"] == pytest.approx(2 * r["tpot_seconds"]) and half["prefill_seconds"] == r["prefill_seconds"]
    v3 = evaluate(P(model="deepseek-v3", context=1_000, gpus=32))     # 1.34 TB of bf16 weights: 17 H100s at least
    assert v3["attention_flops"] == 2 * 61 * 128 * (192 + 128) * 1_000 ** 2 / 2
    assert v3["dense_flops"] == 2 * 37e9 * 1_000
    assert v3["tpot_seconds"] == pytest.approx(decode_step(MODELS["deepseek-v3"], GPUS["h100-sxm"], batch=1, context=1_000,
                                                           gpus=32)["seconds"])
    assert v3["tpot_seconds"] == pytest.approx((37e9 * 2 + 1_000 * 70_272) / (32 * 3_350e9))
    rows = {f["name"]: f for f in page_data(P(bandwidth_efficiency=0.8))["formula"]}
    assert "× 0.8)" in rows["Decode time per token (TPOT)"]["substituted"]
    assert "(128 + 128)" in rows["Prefill FLOPs"]["substituted"]


def test_tiny_timeline_exactly():
    """Two layers of 1 ms each and a link that takes 1.5 ms a layer: the second send waits for the first."""
    sim = simulate(P(), {"layers": 2, "layer_seconds": 1e-3, "transfer_seconds_per_layer": 1.5e-3})
    assert sim["prefill"] == [(0.0, 1e-3), (1e-3, 2e-3)]
    assert sim["sends"] == [(1e-3, 2.5e-3), (2.5e-3, 4e-3)]
    assert sim["exposed_layerwise"] == pytest.approx(2e-3) == exposed_layer_by_layer(1e-3, 1.5e-3, 2)


def test_splitwise_serialized_transfer_under_its_assumptions():
    """BLOOM-176B, the median coding request (1,500 prompt and 13 output tokens, sec. 3.1), a decode step of
    a sixth of the prefill (sec. 3.3), 8 x 400 Gb/s. Reported (sec. 6.1, Fig. 15): 64% of the second
    token and up to 3% of end to end for the serialized transfer."""
    base = P(model="bloom-176b", context=1_500, output_tokens=13)
    tpot_ms = round(evaluate(base)["prefill_seconds"] * 1e3 / 6, 2)
    assert tpot_ms == 22.47                                    # the value the page's link uses
    r = evaluate(P(model="bloom-176b", context=1_500, output_tokens=13, tpot_ms=tpot_ms))
    assert r["kv_bytes"] == 1_500 * 2 * 70 * 14_336 * 2 == 6_021_120_000
    assert round(r["exposed_seconds_after"] * 1e3, 2) == 15.07
    assert round(r["share_of_second_token_after"] * 100, 1) == 67.1     # reported: 64%
    assert round(r["share_of_e2e_after"] * 100, 2) == 3.73              # reported: up to 3%
    # The 200 Gb/s A100 machines take twice as long (sec. 6.1).
    slow = evaluate(P(model="bloom-176b", context=1_500, output_tokens=13, tpot_ms=tpot_ms, link="ib-hdr-200g"))
    assert slow["exposed_seconds_after"] - 20e-6 == pytest.approx(2 * (r["exposed_seconds_after"] - 20e-6))
    # The ~5 ms non-overlapped layer-wise time does not follow from the bandwidth: the last layer is 0.2 ms.
    assert round(r["layer_bytes"] / r["link_bytes_per_s"] * 1e3, 3) == 0.215


def test_splitwise_figures_agree_with_each_other():
    """64%/3% and 16.5%/0.8% both mean a request of about 21 decode steps; the median coding request on
    BLOOM-176B is 6 + 12 = 18 steps, which turns 64% and 16.5% of a step into 3.6% and 0.9%."""
    assert round(0.64 / 0.03) == 21 and round(0.165 / 0.008) == 21
    steps = 6 + (13 - 1)
    assert round(0.64 / steps * 100, 1) == 3.6 and round(0.165 / steps * 100, 1) == 0.9


def test_distserve_opt66b_figures():
    """Sec. 3.3: "approximately 1.13GB" per 512-token request, "11.3 GB" a second at 10 rps, "90Gbps"."""
    per_request = MODELS["opt-66b"].kv_bytes_per_token(2) * 512
    assert per_request == 2 * 64 * 9_216 * 2 * 512 == 1_207_959_552
    assert round(per_request / 2 ** 30, 3) == 1.125          # the paper's 1.13 is GiB
    assert round(per_request / 1e9, 2) == 1.21
    assert round(per_request * 10 * 8 / 1e9, 1) == 96.6      # Gb/s that follows, not 90
    assert round(1.13 * 10 * 8, 1) == 90.4                   # the paper's step: GiB times 8 as if GB
    r = evaluate(P(model="opt-66b", context=512, prefill_gpu="a100-80gb", decode_gpu="a100-80gb", links=1,
                   link="eth-25g"))
    assert round(r["exposed_seconds_after"] * 1e3, 1) == 386.6   # over the testbed's 25 Gbps


def test_distserve_nvlink_figures():
    """Sec. 3.3 quotes NVLink as 600 GB/s, which is both directions; one way is 300 GB/s."""
    assert LINKS["nvlink-3"].bytes_per_s == 300e9
    one = evaluate(P(model="opt-175b", context=2_048, prefill_gpu="a100-80gb", decode_gpu="a100-80gb", gpus=9,
                     links=1, link="nvlink-3"))
    assert one["kv_bytes"] == 2_048 * 4_718_592
    assert round(one["exposed_seconds_after"] * 1e3, 1) == 32.2
    nine = evaluate(P(model="opt-175b", context=2_048, prefill_gpu="a100-80gb", decode_gpu="a100-80gb", gpus=9,
                      links=9, link="nvlink-3"))
    assert round(nine["exposed_seconds_after"] * 1e3, 1) == 3.6


def test_long_prompts_hide_their_cache_better():
    """DistServe sec. 7: the cache grows linearly, prefill quadratically."""
    short, long_ = evaluate(P()), evaluate(P(context=128_000))
    assert round(short["share_of_ttft_after"] * 100, 2) == 2.14
    assert round(long_["share_of_ttft_after"] * 100, 2) == 1.05
    assert round(long_["exposed_seconds_after"] * 1e3) == 105


def test_layer_by_layer_hides_again_once_prefill_outgrows_the_link():
    """Per layer, prefill grows with n^2 and the transfer with n: one 25 Gb/s link catches up at 208,853 tokens."""
    behind, caught_up = evaluate(P(link="eth-25g", links=1, context=208_852)), evaluate(P(link="eth-25g", links=1,
                                                                                          context=208_853))
    assert not behind["link_keeps_up"] and caught_up["link_keeps_up"]
    assert caught_up["exposed_seconds_layerwise"] == caught_up["transfer_seconds_per_layer"]


def test_try_this_numbers():
    slow = evaluate(P(link="eth-25g", links=1))
    assert round(slow["exposed_seconds_after"] * 1e3) == 839
    assert round(slow["exposed_seconds_layerwise"] * 1e3) == 538
    assert round(slow["transfer_seconds_per_layer"] * 1e3, 1) == 10.5
    small = evaluate(P(context=256, latency_us=200))
    assert round(small["exposed_seconds_layerwise"] * 1e3, 2) == 7.17
    assert round(small["exposed_seconds_after"] * 1e3, 2) == 0.41
    assert not small["layerwise_beats_after"]


def test_try_this_links_are_valid_scenarios():
    links = re.findall(r"\]\(\?([^)]*)\)", PAGE)
    assert len(links) >= 6
    for query in links:
        P.from_mapping(dict(parse_qsl(query)))


@pytest.mark.parametrize("kwargs,message", [
    (dict(context=0), "context must be between 1 and 2,000,000 tokens; got 0."),
    (dict(links=0), "links must be between 1 and 64 links; got 0."),
    (dict(layers=2.5), "layers must be a whole number between 1 and 512 layers; got 2.5."),
    (dict(link="wifi"), "link must be one of"),
    (dict(mfu=0), "mfu must be between 0.01 and 1 share; got 0."),
])
def test_bad_values_name_field_range_and_value(kwargs, message):
    with pytest.raises(ParamError) as err:
        P(**kwargs)
    assert str(err.value).startswith(message)


def test_gantt_frames_and_captions():
    p = P()
    r = evaluate(p)
    rows, captions = gantt(p, r)
    assert len(captions) == 40 + 2                       # 80 layers two at a time, then the transfer, then decode
    assert max(rows["frame"]) == len(captions) - 1
    assert rows["frame"] == sorted(rows["frame"])
    assert len(rows["lane"]) == 3 * 80 + 1 + 2
    assert "Prefill ends at 306.54 ms" in captions[-2]
    d = page_data(p)
    assert d["animation"]["frames"] == 42 and d["ranges"]["gantt_x"][1] >= max(rows["end"])


def _possible(**kwargs):
    """Only configurations that can exist (the weights and the cache fit the pools, the GPUs split the model)."""
    try:
        return P(**kwargs)
    except ParamError:
        reject()


strategy = st.builds(
    _possible, model=st.sampled_from(sorted(MODELS)), context=st.integers(1, 2_000_000),
    output_tokens=st.integers(1, 5_000), kv_dtype=st.sampled_from(["bf16", "fp8", "4.5"]),
    prefill_gpu=st.sampled_from(sorted(GPUS)), gpus=st.integers(16, 64), mfu=st.floats(0.01, 1.0),
    link=st.sampled_from(sorted(LINKS)), links=st.integers(1, 64), latency_us=st.floats(0, 10_000),
    layers=st.one_of(st.none(), st.integers(1, 512)))


@settings(max_examples=200, deadline=None)
@given(strategy)
def test_invariants(p):
    r = evaluate(p)
    sim = simulate(p, r)
    # The recurrence and its closed form agree.
    scale = r["prefill_seconds"] + r["layers"] * r["transfer_seconds_per_layer"]   # the simulation's clock
    assert sim["exposed_layerwise"] == pytest.approx(r["exposed_seconds_layerwise"], rel=1e-9, abs=1e-12 * scale)
    # A layer's send never starts before its layer is computed, and sends never overlap on the link.
    for (_, ready), (s, e) in zip(sim["prefill"], sim["sends"]):
        assert s >= ready - 1e-15 and e > s
    for (_, e0), (s1, _) in zip(sim["sends"], sim["sends"][1:]):
        assert s1 >= e0 - 1e-15
    # Layer by layer wins exactly when one transfer's latency is no longer than one layer's prefill
    # (or the link keeps up anyway).
    lat = p.latency_us * 1e-6
    if lat <= r["layer_seconds"] or r["link_keeps_up"]:
        assert r["exposed_seconds_layerwise"] <= r["exposed_seconds_after"] * (1 + 1e-9) + 1e-15
    # Never less than one layer's transfer, never more than sending everything after all the layers.
    assert r["exposed_seconds_layerwise"] >= r["transfer_seconds_per_layer"] * (1 - 1e-9)
    assert r["exposed_seconds_layerwise"] <= r["layers"] * r["transfer_seconds_per_layer"] * (1 + 1e-9)
    for key in ("after", "layerwise"):
        assert r[f"share_of_e2e_{key}"] <= r[f"share_of_ttft_{key}"] * (1 + 1e-12)


@settings(max_examples=100, deadline=None)
@given(strategy, st.integers(2, 16))
def test_more_links_never_expose_more(p, factor):
    wider = P(**{**p.as_dict(), "links": min(64, p.links * factor)})
    assert evaluate(wider)["exposed_seconds_after"] <= evaluate(p)["exposed_seconds_after"]
    assert evaluate(wider)["exposed_seconds_layerwise"] <= evaluate(p)["exposed_seconds_layerwise"] * (1 + 1e-12)


def test_pools_that_cannot_hold_the_model_or_its_cache_are_refused():
    # Llama 3.1 405B in bf16: 811.7 GB, so 11 H100s per pool at least.
    with pytest.raises(ParamError, match=r"^gpus must be at least 11 .*811\.7 GB.*; got 8\.$"):
        P(model="llama-3-405b")
    # The decode pool: 8 x 80 GB - 141.1 GB of weights = 498.9 GB, at 327,680 B per token.
    most = int((640e9 - 70.55e9 * 2) // 327_680) - 256
    P(context=most)
    with pytest.raises(ParamError, match=f"^context must be at most {most:,} tokens .*; got {most + 1:,}\\.$"):
        P(context=most + 1)
    # 64 GPUs of Falcon 7B: its 71 heads allow no tensor parallelism, and 64 stages exceed its 32 layers.
    with pytest.raises(ParamError, match="^gpus must be a tensor-parallel degree .*got 64"):
        P(model="falcon-7b", gpus=64)
    P(model="opt-175b", prefill_gpu="a100-80gb", decode_gpu="a100-80gb", gpus=9, context=2_048)   # DistServe: 3 x 3
