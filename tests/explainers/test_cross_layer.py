"""cross-layer: bytes per token along the four axes by hand, the paper's Table 1 and 5 bytes reproduced,
composition invariants, bad input, the page's measured numbers read from the baked kernel results, and the
baker itself on tiny random models and on the committed checkpoints."""
from __future__ import annotations

import copy
import json
import math
import re
from fractions import Fraction
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.core import baked
from kvx.explainers.core.dtypes import DTYPE_BITS, dtype_bits
from kvx.explainers.core.params import ParamError
from kvx.explainers.cross_layer import model as cl
from kvx.explainers.cross_layer.model import (PRESETS, RUN_REQUEST, SLUG, TABLE1, TABLE1_LAYERS, TABLE5,
                                              TABLE5_LAYERS, CrossLayerParams as P, cached_layers, describe_run,
                                              evaluate, heat_color, page_data, stages, table1)

ROOT = Path(__file__).parents[2]
PAGE = (ROOT / "explainers" / "cross_layer" / "page.md").read_text()
CHECKPOINTS = ROOT / "compute" / "lm" / "checkpoints"


# ---- the arithmetic ---------------------------------------------------------------------------------
def test_defaults_by_hand():
    """Llama 3 70B: MHA 2 x 80 x 64 x 128 x 2 B; GQA-8 1/8 of that; pairs halve it; int4 quarters it."""
    r = evaluate(P())
    st_ = [s["bytes"] for s in stages(PRESETS["llama-3-70b"], 2, "int4", 100)]
    assert st_ == [2_621_440, 327_680, 163_840, 40_960, 40_960]
    assert r["bytes_per_token"] == 40_960 and r["cached_layers"] == 40 and r["sharing_factor"] == 2
    assert r["total_bytes"] == 40_960 * 128_000 * 16 == 83_886_080_000             # 83.9 GB = 78.1 GiB
    assert r["own_total_bytes"] == 327_680 * 128_000 * 16                          # 671.1 GB = 625.0 GiB
    assert r["vs_own"] == 1 / 8 and r["vs_mha"] == 1 / 64
    f = {line["name"]: line for line in page_data(P())["formula"]}
    assert f["All sessions' caches"]["result"].startswith("83.9 GB = 78.1 GiB")
    assert "671.1 GB = 625.0 GiB" in f["All sessions' caches"]["result"]
    assert f["Shared across layers, 1:2"]["substituted"] == "327,680 B × ⌈80 ÷ 2⌉ ÷ 80 = 327,680 B × 40 ÷ 80"
    assert f["The axes multiply"]["result"].startswith("40,960 B: 1/8 of Llama 3 70B's bf16 cache, 1/64 of MHA's")


def test_try_this_numbers():
    assert evaluate(P(share=4))["bytes_per_token"] == 20_480
    three = evaluate(P(share=3))
    assert three["cached_layers"] == 27 and three["bytes_per_token"] == 27_648
    assert f"{three['sharing_factor']:.2f}" == "2.96"
    assert "does not divide 80 layers" in " ".join(page_data(P(share=3))["notes"])
    paper = {s: evaluate(P(model="cla-paper-1b", kv_dtype="bf16", share=s))["bytes_per_token"] for s in (1, 2, 3, 4)}
    assert paper == {1: 10_240, 2: 5_120, 3: 3_584, 4: 2_560}
    for query in re.findall(r"\]\(\?([^)]*)\)", PAGE):
        P.from_mapping(dict(parse_qsl(query)))


def test_the_papers_bytes_per_token_are_reproduced():
    """Brandon et al. 2024, Table 1 (1B, 20 layers) and Table 5 (3B, 32 layers): 2 x KV heads x d_head x
    ⌈layers ÷ share⌉ x 2 bytes equals the reported column, for every uniform-sharing row."""
    for row in table1():
        assert row["bytes"] == row["reported_bytes"], row["model"]
    assert {r["model"]: r["kv_layers"] for r in table1()}["H128-MQA-CLA3"] == 7           # ⌈20 ÷ 3⌉
    for name, d, q, kv, s, rep, _ in TABLE5:
        assert 2 * kv * d * cached_layers(TABLE5_LAYERS, s) * 2 == rep, name
    three_b = {s: evaluate(P(model="cla-paper-3b", kv_dtype="bf16", share=s))["bytes_per_token"] for s in (1, 2)}
    assert three_b == {1: 16_384, 2: 8_192}
    # the presets' query heads are d_model ÷ d_head (Table 2: 2,048 and 3,072)
    assert PRESETS["cla-paper-1b"].q_heads * 128 == 2_048 and PRESETS["cla-paper-3b"].q_heads * 128 == 3_072
    assert len(TABLE1) == 17 and TABLE1_LAYERS == 20


def test_cached_layers_rounds_up_as_the_paper_groups_them():
    """Figure 2: a 10-layer CLA3 model keeps 4 caches (layer 0 alone, then groups of three)."""
    assert [cached_layers(10, s) for s in (1, 2, 3, 4)] == [10, 5, 4, 3]
    assert cached_layers(80, 3) == 27 and cached_layers(20, 3) == 7 and cached_layers(61, 2) == 31


def test_mla_and_mqa_presets():
    v2 = evaluate(P(model="deepseek-v2", kv_dtype="bf16", share=1))
    assert v2["own_bytes_per_token"] == 60 * (512 + 64) * 2 == 69_120
    assert evaluate(P(model="deepseek-v2"))["bytes_per_token"] == 69_120 / 2 / 4 == 8_640
    assert "not MLA" in " ".join(page_data(P(model="deepseek-v2"))["notes"])
    falcon = stages(PRESETS["falcon-7b"], 1, "bf16", 100)
    assert falcon[0]["bytes"] == 2 * 32 * 71 * 64 * 2 and falcon[1]["bytes"] == 2 * 32 * 1 * 64 * 2


def test_bad_input_is_one_sentence():
    cases = {"share": (0, "share must be between 1 and 8 layers per cache; got 0."),
             "keep": (0.5, "keep must be between 1 and 100 % of tokens; got 0.5."),
             "context": (0, "context must be between 1 and 10,000,000 tokens; got 0."),
             "sessions": (100_001, "sessions must be between 1 and 100,000 sessions; got 100,001."),
             "measure": ("pearson", "measure must be one of cka, cosine; got 'pearson'."),
             "model": ("gpt-9", None)}
    for field, (value, message) in cases.items():
        with pytest.raises(ParamError) as err:
            P.from_mapping({field: value})
        assert err.value.field == field
        if message:
            assert str(err.value) == message
    with pytest.raises(ParamError, match="or a bit-width between 1 and 32; got 'int3'"):
        P(kv_dtype="int3")
    with pytest.raises(ParamError, match="share must be a whole number between 1 and 8"):
        P.from_mapping({"share": "1.5"})


strategy = st.builds(P, model=st.sampled_from(sorted(PRESETS)), share=st.integers(1, 8),
                     kv_dtype=st.sampled_from([*DTYPE_BITS, "4.5", "6", "1"]), keep=st.floats(1, 100),
                     context=st.integers(1, 10_000_000), sessions=st.integers(1, 100_000),
                     measure=st.sampled_from(["cka", "cosine"]))


@settings(max_examples=200, deadline=None)
@given(strategy)
def test_the_axes_compose_in_any_order(p):
    """The product of the four factors, taken in any order, is the page's bytes per token; 1:1 sharing,
    bf16 and keeping every token change nothing; more sharing never caches more."""
    m = PRESETS[p.model]
    own = Fraction(m.kv_bytes_per_token(2))
    factors = [Fraction(cached_layers(m.layers, p.share), m.layers), Fraction(dtype_bits(p.kv_dtype)) / 16,
               Fraction(p.keep) / 100]
    want = float(own * factors[0] * factors[1] * factors[2])
    r = evaluate(p)
    assert math.isclose(r["bytes_per_token"], want, rel_tol=1e-12)
    for order in ([2, 1, 0], [1, 2, 0], [0, 2, 1]):
        x = own
        for i in order:
            x *= factors[i]
        assert math.isclose(float(x), want, rel_tol=1e-12)
    same = [s["bytes"] for s in stages(m, 1, "bf16", 100)]
    assert same[1] == same[2] == same[3] == same[4]
    assert r["bytes_per_token"] <= r["own_bytes_per_token"] * max(1, dtype_bits(p.kv_dtype) / 16)
    if p.share < 8:
        assert evaluate(P(**{**p.as_dict(), "share": p.share + 1}))["bytes_per_token"] <= r["bytes_per_token"]
    assert m.layers / p.share <= r["cached_layers"] < m.layers / p.share + 1
    ratio = 1 - p.keep / 100                                      # kvpress's compression ratio, computed as it does
    assert r["kept_tokens"] == max(1, int(p.context * (1 - ratio))) and isinstance(r["kept_tokens"], int)
    assert math.isclose(r["total_bytes"], r["typed_bytes_per_token"] * r["kept_tokens"] * p.sessions, rel_tol=1e-12)
    assert json.dumps(page_data(p), allow_nan=False)


def test_heat_colors():
    assert heat_color(0) == "#f8fafc" and heat_color(1) == "#1e3a8a" and heat_color(-1) == "#9a3412"
    assert heat_color(3) == heat_color(1)


# ---- the page's measured numbers come from the baked kernel results ---------------------------------------
def synthetic(trained_in: bool = True) -> dict:
    """A baked result with numbers no real run gives, to see them travel to the page."""
    k = [[1.0, 0.4321, 0.2], [0.4321, 1.0, 0.3], [0.2, 0.3, 1.0]]
    v = [[1.0, 0.1234, 0.5], [0.1234, 1.0, 0.6], [0.5, 0.6, 1.0]]
    cos = [[1.0, -0.0555, 0.01], [-0.0555, 1.0, 0.02], [0.01, 0.02, 1.0]]
    row = lambda r, bits, acc: {"ratio": r, "cached_layers": -(-3 // r), "memory_fraction": -(-3 // r) / 3,
                                "bits_per_byte": bits, "recall_byte_acc": acc, "recall_value_acc": acc / 2}
    return {
        "model": "gqa-large",
        "config": {"layers": 3, "q_heads": 4, "kv_heads": 2, "head_dim": 16, "d_model": 64, "kv_share": 1,
                   "cached_layers": 3, "cache_numbers_per_token": 192, "params": 1000},
        "data": {"seq_len": 512, "text_sequences": 24, "recall_sequences": 48, "similarity_sequences": 8,
                 "recall_chance": 0.015625, "answers_per_value": 6},
        "similarity": {"k": {"cka": k, "cosine": cos, "random_cka": 0.0077},
                       "v": {"cka": v, "cosine": cos, "random_cka": 0.0066}},
        "sharing": [row(1, 1.1111, 0.97), row(2, 2.2222, 0.25)],
        "aligned": {**row(2, 1.5555, 0.5), "fit_sequences": 8, "fit_recall_share": 0.3, "ridge": 1e-3,
                    "map_numbers": 1234},
        "trained_in": ({"model": "gqa-cla2", "config": {}, "ratio": 2, **{k_: v_ for k_, v_ in row(2, 1.1999, 0.9).items()
                                                                         if k_ != "ratio"}} if trained_in else None),
        "provenance": {"device": "Imaginary GPU", "device_type": "cuda", "torch": "9.9", "baked_on": "2001-02-03",
                       "command": "kvx bake cross-layer", "models": ["gqa-large"]},
    }


@pytest.fixture
def override():
    found = []                   # what was in effect before: a site built earlier in the run leaves its fresh bake

    def use(data):
        replaced = baked.override(SLUG, data)
        if not found:
            found.append(replaced)
    yield use
    if found:
        baked.override(SLUG, found[0])


def test_page_numbers_come_from_the_baked_results(override):
    override(synthetic())
    d = page_data(P())
    heat = d["sources"]["heat_k"]
    assert heat["value"][1] == 0.4321 and heat["label"][1] == "0.43" and len(heat["x"]) == 9
    assert d["sources"]["heat_v"]["value"][1] == 0.1234
    assert page_data(P(measure="cosine"))["sources"]["heat_k"]["value"][1] == -0.0555
    loss = d["sources"]["loss"]
    assert loss["label"] == ["gqa-large, own cache", "gqa-large, 1:2 imposed", "gqa-large, 1:2 + fitted maps",
                             "gqa-cla2, 1:2 trained in"]
    assert loss["bits"] == [1.1111, 2.2222, 1.5555, 1.1999] and loss["recall"] == [0.97, 0.25, 0.5, 0.9]
    assert loss["alpha"] == [0.45, 1.0, 1.0, 1.0]
    text = d["texts"]["measured"]
    assert "1.111 bits per byte" in text and "2.222 bits per byte (+1.111)" in text and "(+0.089)" in text
    assert "Imposed 1:2 takes recall from 97% to 25%." in text
    assert "Imaginary GPU (cuda) with torch 9.9, baked 2001-02-03" in text
    assert "random baseline, a layer against noise of its shape, is 0.008 for K and 0.007 for V" in \
        d["texts"]["similarity"]
    readouts = {r["label"]: r for r in d["readouts"]}
    assert readouts["Measured 1:2, imposed"]["value"] == "+1.111"
    assert readouts["Measured 1:2, trained in"]["value"] == "+0.089"
    f = {line["name"]: line for line in d["formula"]}
    assert f["Measured: 1:2 imposed on the trained tiny model"]["substituted"] == "2.222 − 1.111"
    assert d["baked_label"].startswith("Measured on Imaginary GPU")
    # 1:4 was not measured on this (3-layer) result: the page says the number is arithmetic only
    assert "arithmetic here" in " ".join(page_data(P(share=4))["notes"])


def test_without_the_trained_in_model_the_page_says_so(override):
    override(synthetic(trained_in=False))
    d = page_data(P())
    assert d["sources"]["loss"]["label"][-1] == "gqa-large, 1:2 + fitted maps"
    assert "gqa-cla2) was not in this build's checkpoints" in d["texts"]["measured"]
    assert all(r["label"] != "Measured 1:2, trained in" for r in d["readouts"])
    kept = synthetic(trained_in=False)
    kept["sharing"][1]["recall_byte_acc"] = 0.96
    override(kept)
    assert "leaves the recall of planted values where it was (1:2: 96%)" in page_data(P())["texts"]["measured"]


def _reply(data):
    sim = {part: {"cka": [[1, 0.7, 0.6, 0.5]] * 4, "cosine": [[1, -0.1, 0, 0]] * 4, "random_cka": 0.008}
           for part in ("k", "v")}
    sharing = [{"ratio": r, "loss": own, "own_loss": 1.0, "cached_layers": 4 // r, "memory_fraction": 1 / r}
               for r, own in ((1, 1.0), (2, 2.0), (4, 3.0))]
    return {"device": "cpu", "device_name": "CPU", "torch": "2.x", "params": dict(data),
            "result": {"similarity": sim, "sharing": sharing, "model_bytes": 524_288, "reference": "own"}}


def test_describe_run_words_the_kernels_reply():
    text = describe_run(P(), _reply(RUN_REQUEST))
    assert text.startswith("Measured on CPU (cpu, torch 2.x): gqa-large over 4,096 held-out tokens.")
    assert "K 0.700 (the baked heat map: " in text and "random baseline 0.008" in text
    assert f"own cache {1 / math.log(2):.3f}" in text and f"1:2 {2 / math.log(2):.3f} (+{1 / math.log(2):.3f}, 50% " \
                                                          f"of the cache)" in text
    assert "524,288 bytes per 512-token sequence" in text
    other = describe_run(P(), _reply({"model": "gqa-small", "sequences": 4}))
    assert "the baked heat map" not in other and "2,048 held-out tokens" in other


def test_page_md_quotes_no_trained_model_number():
    """Numbers that depend on the trained models come from baked.json through texts and readouts."""
    b = baked.load(SLUG)
    measured = [r["bits_per_byte"] for r in b["sharing"]] + [b["aligned"]["bits_per_byte"]]
    for x in measured:
        assert f"{x:.3f}" not in PAGE and f"{x:.2f}" not in PAGE


# ---- the committed bake: what any sensible trained model must show ---------------------------------------
def test_committed_bake_relations():
    b = baked.load(SLUG)
    n = b["config"]["layers"]
    for part in ("k", "v"):
        s = b["similarity"][part]
        for measure in ("cka", "cosine"):
            m = s[measure]
            assert len(m) == n and all(abs(m[i][i] - 1) < 1e-3 for i in range(n))
            assert all(abs(m[i][j] - m[j][i]) < 1e-3 for i in range(n) for j in range(n))
        assert all(-1e-9 <= x <= 1 + 1e-9 for row in s["cka"] for x in row)
        assert 0 < s["random_cka"] < 0.05
        assert all(s["cka"][i][i + 1] > 10 * s["random_cka"] for i in range(n - 1))
    # the page's point: the keys' CKA finds shared information where raw cosine, coordinate by coordinate, does not
    k = b["similarity"]["k"]
    assert all(k["cka"][i][i + 1] > 0.3 and abs(k["cosine"][i][i + 1]) < 0.3 for i in range(n - 1))
    rows = {r["ratio"]: r for r in b["sharing"]}
    assert [rows[r]["memory_fraction"] for r in (1, 2, 4)] == [1, 0.5, 0.25]
    assert rows[1]["bits_per_byte"] < rows[2]["bits_per_byte"] < rows[4]["bits_per_byte"]
    assert rows[1]["bits_per_byte"] < b["aligned"]["bits_per_byte"] < rows[2]["bits_per_byte"]
    assert b["aligned"]["map_numbers"] == (n // 2) * (2 * b["config"]["kv_heads"] * b["config"]["head_dim"] + 1) \
        * 2 * b["config"]["kv_heads"] * b["config"]["head_dim"]
    assert b["data"]["recall_chance"] == 1 / 64
    t = b["trained_in"]
    if t is not None:
        assert t["model"] == "gqa-cla2" and t["memory_fraction"] == 0.5 and t["config"]["cached_layers"] == n // 2
        own = rows[1]["bits_per_byte"]
        # the claim: trained in, the sharing keeps most of the quality that imposing it afterwards loses
        assert t["bits_per_byte"] - own < 0.5 * (rows[2]["bits_per_byte"] - own)
    assert len(json.dumps(b)) < 300_000


def test_committed_bake_matches_the_checkpoints_cards():
    """Scored on the cards' own held-out sets, so the 1:1 row is each card's "full" figure."""
    b = baked.load(SLUG)
    card = json.loads((CHECKPOINTS / f"{b['model']}.json").read_text())
    assert b["sharing"][0]["bits_per_byte"] == pytest.approx(card["full"]["bits_per_byte"], abs=2e-3)
    assert b["sharing"][0]["recall_byte_acc"] == pytest.approx(card["full"]["recall_byte_acc"], abs=2e-3)
    assert b["config"]["cache_numbers_per_token"] == 2 * card["config"]["n_layers"] * card["config"]["n_kv_heads"] \
        * card["config"]["head_dim"]
    if (CHECKPOINTS / "gqa-cla2.pt").exists():                  # a stale bake from before it was trained fails here
        assert b["trained_in"] is not None, "gqa-cla2 exists: run `kvx bake cross-layer`"
        cla = json.loads((CHECKPOINTS / "gqa-cla2.json").read_text())
        assert b["trained_in"]["bits_per_byte"] == pytest.approx(cla["full"]["bits_per_byte"], abs=2e-3)


# ---- the baker on tiny random models (exact relations between its paths) --------------------------------
@pytest.fixture(scope="module")
def tiny():
    torch = pytest.importorskip("torch")
    import dataclasses
    from kvx.compute.lm.model import LMConfig, TinyLM
    torch.manual_seed(0)
    plain = TinyLM(LMConfig("t-plain", "gqa", d_model=64, n_layers=4, n_heads=4, head_dim=16, n_kv_heads=2,
                            mlp_mult=2, max_len=256, kv_shift=True)).eval()
    shared = TinyLM(dataclasses.replace(plain.c, name="t-cla2", kv_share=2)).eval()
    shared.load_state_dict(plain.state_dict(), strict=False)          # the same weights, followers' K/V dropped
    return plain, shared


def _small_bake(tiny):
    from kvx.compute.bakers.crosslayer import bake_for
    plain, shared = tiny
    return bake_for(plain, shared, seq_len=256, text_sequences=3, recall_sequences=4, similarity_sequences=2,
                    fit_sequences=2, names=("t-plain", "t-cla2"))


def test_baker_on_tiny_models(tiny):
    import torch
    from kvx.compute.kernels import crosslayer
    from kvx.compute.lm import data
    out = _small_bake(tiny)
    assert json.loads(json.dumps(out)) == out
    rows = {r["ratio"]: r for r in out["sharing"]}
    assert [rows[r]["cached_layers"] for r in (1, 2, 4)] == [4, 2, 1]
    # imposed 1:2 through the kernel's own loss
    text = data.text_set(3, 256)
    with torch.no_grad():
        k2 = crosslayer.sharing_loss(tiny[0], text, 2)
    assert rows[1]["bits_per_byte"] == pytest.approx(k2["own_loss"] / math.log(2), rel=1e-4)
    assert rows[2]["bits_per_byte"] == pytest.approx(k2["loss"] / math.log(2), rel=1e-4)
    # the model with sharing built in and the same weights is exactly the imposed 1:2
    t = out["trained_in"]
    assert t["model"] == "t-cla2" and t["ratio"] == 2 and t["memory_fraction"] == 0.5
    for key in ("bits_per_byte", "recall_byte_acc", "recall_value_acc"):
        assert t[key] == rows[2][key]
    assert out["aligned"]["map_numbers"] == 2 * (2 * 2 * 16 + 1) * (2 * 2 * 16)
    assert out["provenance"]["models"] == ["t-plain", "t-cla2"]
    sim = out["similarity"]["k"]["cka"]
    assert all(sim[i][i] == 1 for i in range(4))


def test_shared_layers_never_read_their_own_projections(tiny):
    """Plain and aligned sharing store only the anchors' caches: changing a follower's K/V weights changes
    nothing the model outputs."""
    import torch
    from kvx.compute.bakers.crosslayer import aligned_transform, fit_alignment
    from kvx.compute.kernels import crosslayer
    plain = copy.deepcopy(tiny[0])
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(1))
    maps = fit_alignment(plain, ids, 2)
    assert sorted(maps) == [1, 3] and maps[1].shape == (2 * 2 * 16 + 1, 2 * 2 * 16)
    with torch.no_grad():
        before = [plain(ids, kv_transform=crosslayer.sharing_transform(2)),
                  plain(ids, kv_transform=aligned_transform(plain, maps, 2))]
        for layer in (1, 3):
            plain.blocks[layer].attn.wk.weight.normal_()
            plain.blocks[layer].attn.wv.weight.normal_()
        after = [plain(ids, kv_transform=crosslayer.sharing_transform(2)),
                 plain(ids, kv_transform=aligned_transform(plain, maps, 2))]
        changed = plain(ids)
    for a, b in zip(before, after):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert not torch.equal(changed, before[0])


def test_alignment_is_at_least_as_close_as_plain_reuse_on_its_fit_data(tiny):
    """Least squares over maps that include the identity (plain reuse): on the data it was fitted on, each
    follower's mapped cache is no further from its own cache than the anchor's cache as it is."""
    import torch
    from kvx.compute.bakers.crosslayer import _features, fit_alignment
    m = tiny[0]
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(2))
    maps = fit_alignment(m, ids, 2, ridge=1e-9)
    caches = {}
    with torch.no_grad():
        m(ids, kv_transform=lambda layer, cache: caches.setdefault(layer, cache))
    for follower, anchor in ((1, 0), (3, 2)):
        x, y = _features(m, caches[anchor]), _features(m, caches[follower])
        mapped = torch.cat([x, torch.ones(*x.shape[:2], 1)], dim=-1) @ maps[follower]
        assert (mapped - y).pow(2).mean() <= (x - y).pow(2).mean() * (1 + 1e-4)
        assert (mapped - y).pow(2).mean() < (x - y).pow(2).mean() * 0.9         # and strictly better here


def test_missing_trained_in_model_is_a_clear_error_only_when_asked(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    from kvx.compute.bakers import crosslayer as baker
    monkeypatch.setattr(baker, "CHECKPOINTS", tmp_path)
    assert baker.trained_in_model() is None
    with pytest.raises(FileNotFoundError, match="kvx train gqa-cla2"):
        baker.trained_in_model(required=True)


def test_the_cache_keeps_whole_tokens():
    """1% of a 150-token context is 1.5 tokens on paper; a cache keeps 1 (kvpress's compute_n_kept floors, as the
    eviction kernel does), 20% of 423 keeps 84, and never fewer than one."""
    r = evaluate(P(keep=1, context=150, sessions=1, share=1, kv_dtype="bf16", model="llama-3-8b"))
    assert r["kept_tokens"] == 1 and r["total_bytes"] == 131_072
    assert evaluate(P(keep=20, context=423))["kept_tokens"] == 84
    assert evaluate(P(keep=1, context=1, sessions=3))["kept_tokens"] == 1
    d = page_data(P(keep=1, context=150, sessions=1, share=1, kv_dtype="bf16", model="llama-3-8b"))
    i = d["sources"]["memory"]["context"].index(150)
    assert d["sources"]["memory"]["s1"][i] * 1e9 == pytest.approx(131_072)
