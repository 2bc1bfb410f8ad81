"""mla: bytes per token of every attention kind, the paper's 93.3% and 2.25 groups, the step-through's
shapes and costs, and the kernel's bytes, all pinned to numbers worked out by hand."""
from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.core.dtypes import dtype_bytes
from kvx.explainers.core.gpus import GPUS
from kvx.explainers.core.models import MODELS
from kvx.explainers.core.params import ParamError
from kvx.explainers.mla.model import (FORMS, KERNEL_MAX_CONTEXT, KERNEL_SHAPE, MLAParams as P, all_steps,
                                      attention_seconds, boxes, bytes_per_token, decode_costs, describe_run,
                                      elements_per_token, equivalent_gqa_groups, evaluate, frame_data,
                                      mla_shape, page_data, paper_accounting, per_cached_token, run_request, steps)
from kvx.explainers.registry import page_json

PAGE = (Path(__file__).parents[2] / "explainers" / "mla" / "page.md").read_text()

# Bytes per token, all layers, worked out by hand: MHA 2 l n_h d_h b, GQA 2 l n_g d_h b, MQA 2 l d_h b,
# MLA l (d_c + d_h^R) b; a non-MLA shape gets DeepSeek-V2's ratios d_c = 4 d_h, d_h^R = d_h / 2.
BF16 = {
    "deepseek-v2": {"MHA": 2 * 60 * 128 * 128 * 2, "GQA": 2 * 60 * 8 * 128 * 2, "MQA": 2 * 60 * 128 * 2,
                    "MLA": 60 * 576 * 2},                                   # 3,932,160 / 245,760 / 30,720 / 69,120
    "deepseek-v3": {"MHA": 2 * 61 * 128 * 128 * 2, "GQA": 2 * 61 * 8 * 128 * 2, "MQA": 2 * 61 * 128 * 2,
                    "MLA": 61 * 576 * 2},
    "deepseek-67b": {"MHA": 3_112_960, "GQA": 389_120, "MQA": 48_640, "MLA": 95 * 576 * 2},
    "llama-3-70b": {"MHA": 2_621_440, "GQA": 327_680, "MQA": 40_960, "MLA": 92_160},
    "llama-2-7b": {"MHA": 524_288, "GQA": 2 * 32 * 8 * 128 * 2, "MQA": 16_384, "MLA": 32 * 576 * 2},
    "falcon-7b": {"MHA": 2 * 32 * 71 * 64 * 2, "GQA": 8_192, "MQA": 8_192, "MLA": 32 * (256 + 32) * 2},
}


@pytest.mark.parametrize("slug", sorted(BF16))
@pytest.mark.parametrize("dtype, scale", [("bf16", 1), ("fp8", 0.5), ("int4", 0.25)])
def test_bytes_per_token_of_every_kind(slug, dtype, scale):
    assert bytes_per_token(MODELS[slug], dtype) == {k: v * scale for k, v in BF16[slug].items()}


def test_the_defaults_by_hand():
    r = evaluate(P())
    assert r["bytes_per_token"] == {"MHA": 3_932_160, "GQA": 245_760, "MQA": 30_720, "MLA": 69_120}
    assert r["own_bytes_per_token"] == 69_120
    assert round(r["mla_vs_mha"], 4) == 0.0176                                    # 576 / 32,768
    t = r["per_cached_token_per_layer"]
    assert t["absorbed_bytes"] == 576 * 2 and t["naive_bytes"] == (576 + 4 * 128 * 128) * 2      # 1,152 and 132,224
    assert t["materialized_bytes"] == (2 * 128 * 128 + 64) * 2
    assert t["absorbed_flops"] == 2 * 128 * 576 + 2 * 128 * 512 == 278_528
    assert t["naive_flops"] == 2 * 512 * 2 * 128 * 128 + 2 * 128 * 192 + 2 * 128 * 128 == 33_636_352
    assert r["absorbed_query_width"] == 512


def test_the_papers_93_3_percent_under_its_own_assumptions():
    a = paper_accounting()
    assert a["baseline_bytes"] == 2 * 95 * 8 * 128 * 2 == 389_120                 # DeepSeek 67B, BF16
    assert a["v2_bf16_bytes"] == 60 * 576 * 2 == 69_120
    assert a["v2_deployed_bytes"] == 60 * 576 * 6 / 8 == 25_920                   # 6 bits per element (sec. 3.2.3)
    assert round(a["saving_deployed"], 4) == 0.9334 and round(a["saving_deployed"], 3) == 0.933
    assert round(a["saving_bf16"], 4) == 0.8224                                   # not 93.3% at BF16
    assert round(a["saving_vs_mha"], 4) == 0.9824 and a["saving_vs_gqa8"] == 1 - 576 / 2048
    assert a["v2_as_mqa_bytes"] * 2.25 == a["v2_bf16_bytes"]
    # Table 9 (App. D.2): 34.6K is DeepSeek-V2's cache; the "4%" and "14%" of the text.
    assert round(60 * 576 / 1000, 1) == a["table9_large"][1] / 1000
    assert round(a["table9_large"][1] / a["table9_large"][0], 2) == 0.04
    assert round(a["table9_small"][1] / a["table9_small"][0], 2) == 0.14
    # The page's bar for a 6-bit dtype is the same number.
    assert evaluate(P(kv_dtype="6"))["bytes_per_token"]["MLA"] == 25_920


def test_mla_equals_gqa_with_2_25_groups():
    d_h = 128
    assert equivalent_gqa_groups(4 * d_h, d_h // 2, d_h) == 2.25 == (4 * d_h + d_h / 2) / (2 * d_h)
    e = elements_per_token(MODELS["deepseek-v2"])
    assert e["MLA"] == 2 * 2.25 * d_h * 60 == 4.5 * d_h * 60
    assert evaluate(P())["equivalent_gqa_groups"] == 2.25
    assert evaluate(P(model="llama-3-70b"))["equivalent_gqa_groups"] == 2.25       # same ratios, by construction


def test_frames_are_deterministic_and_clamped():
    p = P()
    n = len(all_steps(p))
    assert n == 14 and page_data(p)["animation"]["frames"] == n
    assert frame_data(p, 5) == frame_data(p, 5)
    assert frame_data(p, -3)["animation"]["frame"] == 0 and frame_data(p, 99)["animation"]["frame"] == n - 1
    assert page_data(p)["animation"]["frame"] == n - 1                             # opens on the summary
    # Each frame outlines exactly the boxes of its stage (the cache in the summary).
    for k in range(n - 1):
        cols = frame_data(p, k)["sources"]["boxes"]
        outlined = {cols["step"][i] for i, w in enumerate(cols["line_width"]) if w == 4}
        assert outlined == {k}
        faint = [cols["alpha"][i] for i, s in enumerate(cols["step"]) if s > k]
        assert all(a < 0.1 for a in faint)


def test_shapes_are_consistent():
    for slug in ("deepseek-v2", "deepseek-v3"):
        s = mla_shape(slug)
        got = {b.key: b for b in boxes(s, 4_096)}
        assert got["q_t"].shape == f"[{s.heads} × {s.d_c}]"                      # absorbed query: d_c wide
        assert got["o_t"].shape == f"[{s.heads} × {s.d_c}]"                      # latent-space output
        assert got["k_c"].shape == f"4,096 × [{s.heads} × {s.d_h}]"
        assert got["cache_c"].shape == f"4,096 × [{s.d_c} | {s.d_r}]"
        assert got["u_a"].shape == got["u_n"].shape == got["h"].shape == f"[{s.d_model:,}]"
    assert mla_shape("deepseek-v2").d_model == 5120 and mla_shape("deepseek-v3").d_model == 7168
    # A GQA model's step-through shows DeepSeek-V2 and says so.
    assert evaluate(P(model="llama-3-70b"))["diagram_model"] == "deepseek-v2"
    assert "DeepSeek-V2" in page_data(P(model="llama-3-70b"))["notes"][0]


@pytest.mark.parametrize("slug", ["deepseek-v2", "deepseek-v3"])
def test_stage_costs_add_up_to_the_per_token_totals(slug):
    """The frames' per-cached-token bytes and FLOPs sum to the kernel formula's totals, path by path."""
    s = mla_shape(slug)
    t = per_cached_token(s, 2)
    st = steps(s, "bf16")
    naive = [x for x in st if x.path == "naive"]
    absorbed = [x for x in st if x.path == "absorbed"]
    assert sum(x.token_bytes[1] + x.token_written[1] for x in naive) == t["naive_bytes"]
    assert sum(x.token_flops[1] for x in naive) == t["naive_flops"]
    assert sum(x.token_bytes[1] for x in absorbed) == t["absorbed_bytes"]
    assert sum(x.token_flops[1] for x in absorbed) == t["absorbed_flops"]
    assert sum(x.token_flops[1] for x in st if x.path == "shared") == 0          # nothing per cached token


def test_step_costs_text_shows_formula_and_value():
    text = frame_data(P(), 10)["texts"]["step_costs"]
    assert "FLOPs per cached token: 2 × 128 × (512 + 64) = 147,456" in text
    assert "Bytes read per cached token: (512 + 64) × 2 B = 1,152 B" in text
    text = frame_data(P(), 5)["texts"]["step_costs"]
    assert "Bytes written per cached token: 128 × 128 × 2 B = 32,768 B" in text


def test_attention_time_on_the_roofline():
    r = evaluate(P(context=131_072))
    assert round(r["attention_seconds"]["absorbed"] * 1e3, 1) == 2.7                # the page's "Try this"
    assert round(r["attention_seconds"]["naive"] * 1e3) == 310
    # Absorbed, BF16, H100: 60 layers x 131,072 x 1,152 B / 3.35 TB/s (memory-bound, close to the ridge).
    assert r["attention_seconds"]["absorbed"] == pytest.approx(60 * 131_072 * 1_152 / 3.35e12)


def test_kernel_request_is_capped_and_said_so():
    assert run_request(P()) == {"batch": 1, "context": 4_096, "dtype": "float32", "repeats": 25}
    assert run_request(P(context=100_000))["context"] == KERNEL_MAX_CONTEXT
    assert "32,768" in page_data(P(context=100_000))["notes"][-1]


def fake_reply(context=1_000, batch=1, dtype="float32", bytes_override=None):
    c = decode_costs(KERNEL_SHAPE, context, batch, 4 if dtype == "float32" else 2)
    forms = {f: {"seconds": s, "bytes": c[f"{f}_bytes"], "flops": c[f"{f}_flops"], "max_error": e}
             for f, s, e in (("naive", 2e-3, 0.0), ("materialized", 4e-4, 0.0), ("absorbed", 1e-4, 3e-8))}
    if bytes_override:
        forms["absorbed"]["bytes"] = bytes_override
    return {"kernel": "mla", "params": {"batch": batch, "context": context, "dtype": dtype, "repeats": 25},
            "device": "cpu", "device_name": "CPU", "torch": "2.x", "threads": 2, "result": {"forms": forms}}


def test_describe_run_words_agreement_bytes_and_time():
    text = describe_run(P(), fake_reply())
    assert text.startswith("Measured on CPU (cpu, torch 2.x, 2 threads)")
    assert "1,000 cached tokens" in text and "6 heads of 32, a 48-number latent and a 16-number RoPE key" in text
    assert "absorbed differs from naive by at most 3.0e-08" in text and "at most 0 (identical)" in text
    # 1,000 tokens x (48 + 16) x 4 B = 256,000 B; naive adds the rebuilt K and V (1,000 x 6 x 64 x 4 B) twice.
    assert "absorbed 256.00 KB" in text and "naive 3.33 MB" in text and "the server counted" not in text
    assert "absorbed is 20.0× faster than naive" in text and "100 ns per cached token" in text
    assert "the server counted absorbed" in describe_run(P(), fake_reply(bytes_override=1.0))


def test_kernel_shape_and_bytes_match_the_server():
    torch = pytest.importorskip("torch")
    from kvx.compute.kernel_specs import _mla_layer, run_locally
    from kvx.compute.kernels import mla
    from kvx.compute.lm.train import CONFIGS
    card = json.loads((Path(__file__).parents[2] / "compute" / "lm" / "checkpoints" / "mla.json").read_text())
    for c in (CONFIGS["mla"], type("C", (), card["config"])):
        assert (c.n_heads, c.head_dim, c.rope_dim, c.kv_latent, c.d_model, c.n_layers) == (
            KERNEL_SHAPE.heads, KERNEL_SHAPE.d_h, KERNEL_SHAPE.d_r, KERNEL_SHAPE.d_c, KERNEL_SHAPE.d_model,
            KERNEL_SHAPE.layers)
    layer = _mla_layer()
    for context, batch, b in ((1, 1, 4), (4_096, 1, 4), (300, 3, 2)):
        server = mla.cost(layer, batch, context, b)
        assert decode_costs(KERNEL_SHAPE, context, batch, b) == {k: v for k, v in server.items()
                                                                 if k != "cache_bytes_per_token"}
    reply = run_locally("mla", {"context": 64, "repeats": 1})
    text = describe_run(P(), json.loads(json.dumps(reply)))
    assert "the server counted" not in text and "64 cached tokens" in text
    assert reply["result"]["forms"]["absorbed"]["max_error"] < 1e-4
    assert torch is not None


@pytest.mark.parametrize("values, field, message", [
    ({"model": "gpt-5"}, "model", "model must be one of "),
    ({"kv_dtype": "3x"}, "kv_dtype", "or a bit-width between 1 and 32; got '3x'."),
    ({"kv_dtype": "64"}, "kv_dtype", "or a bit-width between 1 and 32; got 64."),
    ({"context": "0"}, "context", "context must be between 1 and 1,000,000 tokens; got 0."),
    ({"context": "1.5"}, "context", "context must be a whole number between 1 and 1,000,000 tokens; got 1.5."),
    ({"gpu": "tpu"}, "gpu", "gpu must be one of "),
])
def test_bad_input_is_one_sentence(values, field, message):
    with pytest.raises(ParamError) as err:
        P.from_mapping(values)
    assert err.value.field == field and message in str(err.value)
    reply = json.loads(page_json("mla", json.dumps(values)))
    assert reply["ok"] is False and reply["field"] == field and "Traceback" not in reply["message"]


def test_try_this_links_are_valid_and_its_numbers_hold():
    for query in re.findall(r"\]\(\?([^)]*)\)", PAGE):
        P.from_mapping(dict(parse_qsl(query)))
    for number in ("69,120", "389,120", "25,920", "93.34%", "82.24%", "98.24%", "71.88%", "46,080", "163,840",
                   "278,528", "1,152"):
        assert number in PAGE
    r = evaluate(P(model="llama-3-70b"))
    assert r["elements_per_token"]["MLA"] == 46_080 and r["elements_per_token"]["GQA"] == 163_840


@settings(max_examples=60, deadline=None)
@given(slug=st.sampled_from(sorted(MODELS)), bits=st.floats(1, 32), context=st.integers(1, 1_000_000))
def test_invariants(slug, bits, context):
    m = MODELS[slug]
    b = dtype_bytes(str(bits))
    per = bytes_per_token(m, str(bits))
    assert per["MQA"] <= per["GQA"] <= per["MHA"]
    assert per["MHA"] == pytest.approx(2 * m.layers * m.q_heads * m.head_dim * b)
    if m.attention == "MLA":
        assert per["MLA"] == pytest.approx(m.kv_bytes_per_token(b))
    else:
        assert per[m.attention] == pytest.approx(m.kv_bytes_per_token(b))        # the preset's own kind
    s = mla_shape("deepseek-v2")
    c = decode_costs(s, context, 1, b)
    assert c["absorbed_bytes"] <= c["materialized_bytes"] <= c["naive_bytes"]
    assert c["materialized_flops"] < c["absorbed_flops"]
    # Absorbing costs two up-projections once per step; rebuilding costs them per cached token.
    assert (c["absorbed_flops"] < c["naive_flops"]) == (context >= 2)
    assert all(attention_seconds(s, f, context, str(bits), GPUS["h100-sxm"]) > 0 for f in FORMS)
    json.dumps(evaluate(P(model=slug, kv_dtype=str(bits), context=context)))


def test_decode_time_goes_through_the_shared_model():
    """Absorbed decode's FLOPs per cached token equal the shared time model's for MLA presets; efficiency and
    MFU stretch the roofline; the whole batch-1 step (weights included) is core/timing.py's decode_step."""
    from kvx.explainers.core.timing import attention_flops_per_cached_token, decode_step
    for slug in ("deepseek-v2", "deepseek-v3"):
        s = mla_shape(slug)
        assert s.layers * per_cached_token(s, 2)["absorbed_flops"] == attention_flops_per_cached_token(MODELS[slug])
    r, slow = evaluate(P()), evaluate(P(bandwidth_efficiency=0.5))
    assert slow["attention_seconds"]["absorbed"] == pytest.approx(2 * r["attention_seconds"]["absorbed"])
    st = r["decode_step"]
    assert st == decode_step(MODELS["deepseek-v2"], GPUS["h100-sxm"], batch=1, context=4_096)
    assert st["seconds"] == pytest.approx((21e9 * 2 + 4_096 * 69_120) / 3.35e12)      # memory-bound, by hand
    row = page_data(P(mfu=0.5))["formula"][-1]
    assert "× 0.5))" in row["substituted"] and "0.7% of the bytes" in row["result"]


def test_a_cache_or_weights_that_do_not_fit_are_said_not_to():
    # DeepSeek-V2: 236e9 x 2 B of weights + 4,096 tokens x 69,120 B (60 layers x (512 + 64) x 2 B) = 472.3 GB > 80 GB.
    notes = page_data(P())["notes"]
    assert any("this cache, 472.3 GB, do not fit one NVIDIA H100 SXM" in n for n in notes)
    assert any("need at least 6" in n for n in notes)                # 472.3 GB / 80 GB
    assert any("released for at most 4,096 tokens" in n for n in page_data(P(model="deepseek-67b", context=8_192))["notes"])
    assert not any("released" in n for n in page_data(P(model="deepseek-67b", context=4_096))["notes"])


@pytest.mark.parametrize("slug", ["deepseek-v2", "deepseek-v3"])
@pytest.mark.parametrize("context", [1, 4_096, 1_000_000])
def test_the_narrow_diagram_fits_a_phone(slug, context):
    """The phone's diagram (px units): every box of the wide one, rows no wider than the 300 px plot at the
    measured widths of its fonts, no two labels (name over shape, above each box) and no two boxes overlapping,
    and the same picture (rows, heights) whatever the context."""
    from kvx.explainers.mla.model import (N_LABEL, N_LIFT, N_NAME, N_SHAPE, N_WIDTH, _chars, narrow_boxes,
                                          narrow_sources)
    s = mla_shape(slug)
    placed, bands, low = narrow_boxes(s, context)
    assert {b.key for b in placed} == {b.key for b in boxes(s, context)}
    labels, shapes = [], []
    for b in placed:
        if not b.name:
            continue
        width = max(N_NAME * _chars(b.name), N_SHAPE * _chars(b.shape))
        assert b.x + width <= N_WIDTH, (b.name, b.shape)
        bottom = b.y + (2 * N_LIFT if b.stack else 0) + 2          # the view draws it from 2 px above label_y
        labels.append((b.x, b.x + width, bottom, bottom + N_LABEL - 2, b.name))
    cols = narrow_sources(s, context, 3, False)["boxes_narrow"]
    shapes = list(zip(cols["x0"], cols["x1"], cols["y0"], cols["y1"]))
    for group in (labels, shapes):
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                meet = min(a[1], b[1]) - max(a[0], b[0]) > 0 and min(a[3], b[3]) - max(a[2], b[2]) > 0
                stacked = abs((a[1] - b[1]) - (a[0] - b[0])) < 1e-9 and abs(a[0] - b[0]) <= 4   # a stack's copies
                assert not meet or stacked, (a, b)
    for x0, x1, y0, y1 in shapes:                                    # no box under a label
        for l0, l1, m0, m1, name in labels:
            assert not (min(x1, l1) - max(x0, l0) > 0 and min(y1, m1) - max(y0, m0) > 0.5), name
    assert narrow_boxes(s, 7)[1:] == (bands, low) and low < 0
    at = {b.key: (b.x, b.y) for b in placed}
    assert at == {b.key: (b.x, b.y) for b in narrow_boxes(s, 123_456)[0]}


def test_frames_outline_the_same_stage_in_both_diagrams():
    p = P()
    for k in range(len(all_steps(p))):
        src = frame_data(p, k)["sources"]
        for key in ("boxes", "boxes_narrow"):
            cols = src[key]
            assert sorted({s for s, w in zip(cols["step"], cols["line_width"]) if w == 4}) == \
                sorted({s for s, w in zip(src["boxes"]["step"], src["boxes"]["line_width"]) if w == 4})
        assert len(src["arrows_narrow"]["x0"]) == len(src["arrows"]["x0"])
