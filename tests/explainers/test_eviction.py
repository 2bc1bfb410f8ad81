"""eviction: the page's numbers are the baked kernel results, budgets and frames follow the policies' rules,
and the StreamingLLM cache of the paper's Figure 4 is reproduced."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.core.params import ParamError
from kvx.explainers.eviction import model as m
from kvx.explainers.eviction.model import EvictionParams as P
from kvx.explainers.registry import page_json, run

ROOT = Path(__file__).parents[2]
PAGE = (ROOT / "explainers" / "eviction" / "page.md").read_text()
D = m.data()
POLICIES = list(m.POLICIES)


def idx(pct: int) -> int:
    return m.budget_percents().index(pct)


# ---- the baked data and the page agree ------------------------------------------------------------
def test_baked_data_is_the_shape_the_page_reads():
    assert D["policies"] == POLICIES and m.budget_percents() == [5, 10, 20, 35, 50, 100]
    assert (m.LAYERS, m.KV_HEADS) == (D["config"]["n_layers"], D["config"]["n_kv_heads"])
    card = json.loads((ROOT / "compute" / "lm" / "checkpoints" / "gqa-large.json").read_text())["config"]
    assert (card["n_layers"], card["n_kv_heads"], card["head_dim"]) == (m.LAYERS, m.KV_HEADS, D["config"]["head_dim"])
    assert D["config"]["cache_numbers_per_token"] == 2 * m.LAYERS * m.KV_HEADS * D["config"]["head_dim"] == 512
    for task in ("text", "recall"):
        for name in POLICIES:
            r = D[task]["results"][name]
            assert len(r["loss_bits"]) == len(r["top1"]) == len(D["budgets"])
            assert all(0 <= x <= 1 for x in r["top1"])
    p = D["provenance"]
    assert p["device"] and p["torch"] and p["baked_on"] and p["command"] == "kvx bake eviction"


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("pct", [5, 10, 20, 35, 50, 100])
def test_every_readout_is_a_baked_number(policy, pct):
    r = m.evaluate(P(policy=policy, budget=pct))
    i = idx(pct)
    text, recall = D["text"]["results"], D["recall"]["results"]
    assert r["text_loss_bits"] == text[policy]["loss_bits"][i]
    assert r["text_top1"] == text[policy]["top1"][i]
    assert r["recall_byte_acc"] == recall[policy]["recall_byte_acc"][i]
    assert r["text_loss_delta_bits"] == pytest.approx(text[policy]["loss_bits"][i] - text["full"]["loss_bits"][i])
    # the budget formula on the page is the kernel's rule, and gives the baked token counts
    f = D["budgets"][i]
    assert r["recall_budget_tokens"] == m.budget_tokens(f, D["recall"]["prefix"]) == recall[policy]["budget_tokens"][i]
    assert r["text_budget_tokens"] == m.budget_tokens(f, D["text"]["prefix"]) == text[policy]["budget_tokens"][i]
    assert r["cache_bytes_kept"] == r["kept_tokens"] * 512 * 2
    data = m.page_data(P(policy=policy, budget=pct))
    values = [x["value"] for x in data["readouts"]]
    assert f"{r['text_loss_bits']:.3f}" in values and f"{r['recall_byte_acc']:.1%}" in values
    assert data["sources"]["here"]["loss"] == [text[policy]["loss_bits"][i]]
    lines = {x["name"]: x for x in data["formula"]}
    assert lines["Loss change (text)"]["substituted"] == (f"{text[policy]['loss_bits'][i]:.4g} − "
                                                          f"{text['full']['loss_bits'][i]:.4g}")
    assert lines["Recall accuracy"]["substituted"].endswith(f"÷ {D['recall']['answer_bytes']}")


def test_curves_are_the_baked_sweep():
    c = m.page_data(P())["sources"]["curve"]
    assert c["budget"] == [5, 10, 20, 35, 50, 100]
    for name in POLICIES:
        assert c[f"loss_{name}"] == D["text"]["results"][name]["loss_bits"]
        assert c[f"recall_{name}"] == D["recall"]["results"][name]["recall_byte_acc"]
    ref = m.page_data(P())["sources"]["reference"]
    assert ref["loss"] == [D["text"]["full_loss_bits"]] * 2 == [D["text"]["results"]["full"]["loss_bits"][0]] * 2


def test_drawn_states_are_kept_but_never_outlive_the_baked_data():
    """page_data keeps what it draws per (policy, budget, layer, KV head); a re-bake (the site build's
    baked.override) must empty those caches, or the page would draw the old numbers."""
    import copy
    from kvx.explainers.core import baked
    first = m.page_data(P())
    assert m.page_data(P(budget=21.5))["sources"] == first["sources"]        # snapped to 20%: the same state
    fresh = copy.deepcopy(D)
    fresh["text"]["results"]["h2o"]["loss_bits"][0] = 9.875
    fresh["shown"]["map"][1][0] = 0.5
    fresh["decode"]["policies"]["h2o"]["loss_bits"][0] += 1.0
    found = baked.override(m.SLUG, fresh)
    try:
        d = m.page_data(P())
        assert d["sources"]["curve"]["loss_h2o"][0] == 9.875
        assert d["sources"]["map"]["mass"][0] == 0.5
        assert d["sources"]["steploss"]["policy"][0] == first["sources"]["steploss"]["policy"][0] + 1.0
        assert m.frame_data(P(), 1)["sources"]["steploss"]["policy"][0] == d["sources"]["steploss"]["policy"][0]
    finally:
        # back to what was in effect before: a site built earlier in the same run (the browser tests) leaves its
        # fresh bake as an override, whose numbers need not be the committed copy's
        baked.override(m.SLUG, found)
    assert m.page_data(P())["sources"] == first["sources"]


def test_budget_100_is_the_full_cache():
    full_t, full_r = D["text"]["results"]["full"], D["recall"]["results"]["full"]
    i = idx(100)
    for name in POLICIES:
        for key in ("loss_bits", "top1"):
            assert D["text"]["results"][name][key][i] == full_t[key][i]
            assert D["recall"]["results"][name][key][i] == full_r[key][i]
        r = m.evaluate(P(policy=name, budget=100))
        assert r["text_loss_delta_bits"] == 0 and r["text_top1"] == 1.0
        assert all(m.kept_mask(name, i, 1, 0))
    # the full cache is the same at every budget, and agrees with itself
    assert len(set(full_t["loss_bits"])) == 1 and set(full_t["top1"]) == {1.0}


def test_kept_masks_keep_exactly_the_budget_and_follow_the_rules():
    prefix = D["recall"]["prefix"]
    for name in POLICIES[1:]:
        for i, f in enumerate(D["budgets"]):
            b = m.budget_tokens(f, prefix)
            for layer in range(m.LAYERS):
                for h in range(m.KV_HEADS):
                    kept = m.kept_mask(name, i, layer, h)
                    assert len(kept) == prefix and sum(kept) == b, (name, f, layer, h)
                    where = [j for j, k in enumerate(kept) if k]
                    if name == "streaming_llm" and f < 1:
                        assert where == list(range(4)) + list(range(prefix - (b - 4), prefix))
                    if name == "no_sinks" and f < 1:
                        assert where == list(range(prefix - b, prefix))
                    if name == "h2o" and f < 1:                  # the recent half is always in
                        assert set(range(prefix - int(b * 0.5), prefix)) <= set(where)
                    window = D["settings"]["snapkv_window"]
                    if name == "snapkv" and f < 1 and b >= window:   # the observation window is always in
                        assert set(range(prefix - window, prefix)) <= set(where)
                    if name == "snapkv" and b < window:              # below it, only window tokens
                        assert min(where) >= prefix - window


def test_hex_masks_and_runs():
    assert m.unhex("f0", 8) == [True] * 4 + [False] * 4
    assert m.unhex("8", 3) == [True, False, False]
    assert m.runs([True, True, False, True]) == [(0, 2, True), (2, 3, False), (3, 4, True)]
    strip = m.strip(m.kept_mask("streaming_llm", idx(10), 0, 0))
    assert strip["state"] == ["kept", "evicted", "kept"] and strip["left"][0] == 0 and strip["right"][0] == 4


def test_the_evicted_band_hides_exactly_the_evicted_tokens_from_the_questions():
    data = m.page_data(P(policy="h2o", budget=10))
    band = data["sources"]["band"]
    kept = m.kept_mask("h2o", idx(10), 1, 0)
    hidden = {j for a, b in zip(band["left"], band["right"]) for j in range(a, b)}
    assert hidden == {j for j, k in enumerate(kept) if not k}
    assert set(band["bottom"]) == {D["shown"]["prefix"]} and set(band["top"]) == {D["config"]["seq_len"]}


def test_attention_map_cells_fill_the_lower_triangle():
    cells = m.attention_cells(2)
    b, n = D["shown"]["map_bin"], D["config"]["seq_len"] // D["shown"]["map_bin"]
    assert len(cells["x"]) == n * (n + 1) // 2
    assert all(x <= y for x, y in zip(cells["x"], cells["y"]))
    # each row of the map is a query bin's whole attention: its cells add up to one
    rows = {}
    for y, mass in zip(cells["y"], cells["mass"]):
        rows[y] = rows.get(y, 0) + mass
    assert all(abs(v - 1) < 0.01 for v in rows.values()), rows


# ---- the decoding animation -----------------------------------------------------------------------------
@pytest.mark.parametrize("policy", POLICIES)
def test_every_frame_keeps_exactly_the_budget(policy):
    dec = D["decode"]
    for layer in range(m.LAYERS):
        for h in range(m.KV_HEADS):
            state = m.decode_state(policy, layer, h)
            for k in range(m.frames()):
                cached = m.cached_at(state, k)
                t = dec["prompt"] + k - 1
                if policy == "full":
                    assert cached == list(range(dec["prompt"] + k))
                else:
                    assert len(cached) == dec["budget"], (policy, layer, h, k)
                    if k:
                        assert t in cached                         # the newest token is always cached
                if policy == "streaming_llm":                      # Figure 4's rolling cache, every frame
                    assert cached == m.streaming_cache(4, dec["budget"], dec["prompt"] + k)
                if policy == "no_sinks":
                    assert cached == m.streaming_cache(0, dec["budget"], dec["prompt"] + k)


def test_snapkv_never_evicts_its_selection_and_h2o_keeps_its_recent_half():
    dec = D["decode"]
    prompt, window, budget = dec["prompt"], dec["snapkv_window"], dec["budget"]
    for layer in range(m.LAYERS):
        for h in range(m.KV_HEADS):
            snap = m.decode_state("snapkv", layer, h)
            chosen = [j for j in range(prompt - window) if snap["cut"][j]]
            assert len(chosen) == budget - window
            for k in range(m.frames()):
                assert set(chosen) <= set(m.cached_at(snap, k))
            h2o = m.decode_state("h2o", layer, h)
            for k in range(1, m.frames()):
                t = prompt + k - 1
                assert set(range(t - dec["h2o_recent"] + 1, t + 1)) <= set(m.cached_at(h2o, k))


def test_streaming_cache_reproduces_figure_4():
    """Xiao et al., sec. 3.2, Figure 4: 4 sinks + 3 recent; token 4 goes when generating 8, token 5 at 9."""
    assert m.streaming_cache(4, 7, 7) == [0, 1, 2, 3, 4, 5, 6]
    assert m.streaming_cache(4, 7, 8) == [0, 1, 2, 3, 5, 6, 7]
    assert m.streaming_cache(4, 7, 9) == [0, 1, 2, 3, 6, 7, 8]
    assert m.streaming_cache(4, 7, 2) == [0, 1]


def test_frames_are_deterministic_and_json_ready():
    p = P(policy="random", layer=3, kv_head=1)
    for k in (0, 1, 64, m.frames() - 1):
        a, b = m.frame_data(p, k), m.frame_data(p, k)
        assert a == b and json.loads(json.dumps(a, allow_nan=False)) == a
        assert a["animation"] == {**a["animation"], "mode": "on_demand", "frames": 129, "frame": k}
    assert m.frame_data(p, -5)["animation"]["frame"] == 0 and m.frame_data(p, 10_000)["animation"]["frame"] == 128
    assert json.loads(page_json("eviction", json.dumps({"_frame": 7})))["data"]["animation"]["frame"] == 7


def test_frame_captions_say_what_happened():
    p = P(policy="h2o")
    st0 = m.frame_data(p, 0)["animation"]["caption"]
    assert st0.startswith("Step 0/128: the 64-byte prompt") and "keeps 32 of its 64 tokens" in st0
    state = m.decode_state("h2o", 1, 0)
    cap = m.frame_data(p, 5)["animation"]["caption"]
    assert f"evicts position {state['victims'][4]}" in cap and "attends to the 32 cached tokens" in cap
    loss = D["decode"]["policies"]["h2o"]["loss_bits"][:5]
    assert f"mean loss so far {sum(loss) / 5:.2f} bits/byte" in cap


def test_decode_text_escapes_and_marks_the_cache():
    text = m.frame_data(P(), 3)["texts"]["decode_text"]
    assert "<script" not in text and text.count("<span") == D["decode"]["prompt"] + 3
    assert "outline:2px" in text and ">BOS<" in text


# ---- words, run it here, bad input ---------------------------------------------------------------------
def test_findings_quote_the_baked_numbers():
    words = m.findings(P())
    t = D["text"]["results"]
    assert f"{t['no_sinks']['loss_bits'][1]:.3f}" in words and f"{t['streaming_llm']['loss_bits'][1]:.3f}" in words
    top = max(D["sinks"], key=lambda x: x["first_4"] / x["uniform_first_4"])
    assert f"{top['first_4']:.1%}" in words
    assert m.provenance_label().startswith(f"measured on {D['provenance']['device']} with torch")


def test_random_against_the_rules_is_worded_from_the_numbers():
    """Every rule and budget where random eviction recalls more (or has the lower text loss) is named, and
    nothing else; the page does not call random a floor where its own numbers say otherwise."""
    words = m.against_random()
    pcts = m.budget_percents()
    rec, txt = D["recall"]["results"], D["text"]["results"]
    for name in m.RULES:
        wins = [pcts[i] for i, f in enumerate(D["budgets"])
                if f < 1 and rec["random"]["recall_byte_acc"][i] > rec[name]["recall_byte_acc"][i]]
        if wins:
            assert f"{m.SHORT[name]} at {m._at(wins)}" in words, name
        else:
            assert f"{m.SHORT[name]} at" not in words.split("On recall")[1], name
        loses = [pcts[i] for i, f in enumerate(D["budgets"])
                 if f < 1 and txt[name]["loss_bits"][i] > txt["random"]["loss_bits"][i]]
        text_part = words.split("On recall")[0]
        assert (f"{m.SHORT[name]} at {m._at(loses)}" in text_part) if loses else f"{m.SHORT[name]} at" not in text_part
    assert "floor every rule" not in PAGE and "floor every rule" not in m.findings(P())
    assert ("not a floor" in words) == any(f"{m.SHORT[n]} at" in words.split("On recall")[1] for n in m.RULES)


def test_the_words_follow_a_rebake(monkeypatch):
    """With numbers where random never wins, the same code says so: the sentences are not typed in."""
    import copy
    d = copy.deepcopy(D)
    for name in m.RULES:
        d["recall"]["results"][name]["recall_byte_acc"] = [1.0] * len(d["budgets"])
        d["recall"]["coverage"]["secret_tokens_kept"][name] = [1.0] * len(d["budgets"])
    monkeypatch.setattr(m, "data", lambda: d)
    assert "every rule recalls at least as many answer bytes as random eviction" in m.against_random()
    assert "every rule keeps at least as many of the lines' tokens" in m.why_recall(2)
    assert "every rule recalls at least as many answer bytes" in m.rule_text(P(policy="random", budget=20))


def test_why_quotes_the_secret_line_shares():
    i = idx(20)
    cov = D["recall"]["coverage"]
    words = m.why_recall(i)
    assert f"keeps {cov['secret_tokens_kept']['random'][i]:.0%} of the lines' tokens" in words
    assert f"{cov['on_lines']['tokens']:.0%} of its tokens" in words
    assert f"{cov['on_lines']['questions']:.0%} of the attention the questions" in words
    for name in m.RULES:
        share = cov["secret_tokens_kept"][name][i]
        if share < cov["secret_tokens_kept"]["random"][i]:
            assert f"{m.SHORT[name]} keeps {share:.0%}" in words
    # random keeps about its budget of the lines, by construction (8 sequences × 4 layers × 2 heads)
    assert abs(cov["secret_tokens_kept"]["random"][i] - D["budgets"][i]) < 0.03


def test_h2o_and_observed_attention_are_two_policies_with_two_names():
    assert m.TITLES["h2o"] != m.TITLES["observed"] and "paper" in m.TITLES["h2o"]
    assert "ObservedAttentionPress" in m.TITLES["observed"] and "H2O" not in m.TITLES["observed"]
    assert "not kvpress's ObservedAttentionPress" in m.rule_text(P(policy="h2o")).replace("Not", "not")
    assert "different rule" in m.rule_text(P(policy="observed"))
    r = D["recall"]["results"]
    assert r["h2o"] != r["observed"]
    assert D["shown"]["kept"]["h2o"] != D["shown"]["kept"]["observed"]


def test_the_page_states_its_differences_from_kvpress():
    section = PAGE.split("### Where this page and kvpress differ")[1].split("###")[0]
    for words in ("StreamingLLMPress", "ObservedAttentionPress", "SnapKVPress", "RandomPress", "H2O",
                  "test_kvpress_parity.py"):
        assert words in section


def test_run_request_asks_for_the_baked_setting():
    assert m.run_request(P(policy="no_sinks", budget=12)) == {
        "model": "gqa-large", "policy": "streaming_llm", "budget_fraction": 0.1, "task": "recall",
        "sequences": D["recall"]["sequences"], "sinks": 0}
    assert m.run_request(P(policy="snapkv"))["sinks"] == 4


def test_describe_run_compares_with_the_baked_sweep():
    i = idx(10)
    b = D["recall"]["results"]["no_sinks"]
    reply = {"device": "cpu", "device_name": "CPU", "torch": "2.x", "wall_seconds": 1.25,
             "params": m.run_request(P(policy="no_sinks", budget=10)),
             "result": {"budget": b["budget_tokens"][i], "prefix": D["recall"]["prefix"],
                        "loss": b["loss_bits"][i] * math.log(2), "full_loss": 5 * math.log(2),
                        "top1_agreement": 0.5, "recall_byte_acc": 0.25, "recall_exact": 0.0}}
    text = m.describe_run(P(policy="no_sinks", budget=10), reply)
    assert text.startswith("Measured on CPU (cpu, torch 2.x): StreamingLLM with its sinks evicted keeping")
    assert f"Loss on the questions {b['loss_bits'][i]:.3f} bits/byte (full cache 5.000)" in text
    assert f"The baked sweep ({D['provenance']['device']}) has {b['loss_bits'][i]:.3f} bits/byte" in text
    assert "recall 25.0% of answer bytes" in text and "1.25 s" in text


@pytest.mark.parametrize("values,field,message", [
    ({"budget": "0"}, "budget", "budget must be between 5 and 100 % of the prompt; got 0."),
    ({"budget": "lots"}, "budget", "budget must be a number between 5 and 100 % of the prompt; got 'lots'."),
    ({"layer": "4"}, "layer", "layer must be between 0 and 3 layer; got 4."),
    ({"layer": "1.5"}, "layer", "layer must be a whole number between 0 and 3 layer; got 1.5."),
    ({"kv_head": "2"}, "kv_head", "kv_head must be between 0 and 1 KV head; got 2."),
    ({"policy": "lru"}, "policy", "policy must be one of full, random, streaming_llm, no_sinks, h2o, observed, snapkv; got 'lru'."),
])
def test_bad_input_is_one_sentence(values, field, message):
    with pytest.raises(ParamError) as err:
        P.from_mapping(values)
    assert err.value.field == field and str(err.value) == message
    reply = json.loads(page_json("eviction", json.dumps(values)))
    assert reply == {"ok": False, "field": field, "message": message}


def test_budget_snaps_to_the_nearest_measured_one():
    assert [m.budget_percents()[m.snapped(x)] for x in (5, 7, 7.5, 8, 14, 16, 27, 28, 70, 76, 100)] == \
        [5, 5, 5, 10, 10, 20, 20, 35, 50, 100, 100]
    assert m.page_data(P(budget=23))["notes"] == ["The budget 23% was snapped to the nearest measured one, 20%."]
    assert run("eviction", {"budget": "23"})["budget_percent"] == 20


def test_try_this_links_are_valid_parameters():
    links = re.findall(r"\]\(\?([^)]*)\)", PAGE)
    assert len(links) >= 6
    for query in links:
        P.from_mapping(dict(parse_qsl(query)))


@settings(max_examples=40, deadline=None)
@given(policy=st.sampled_from(POLICIES), budget=st.floats(5, 100), layer=st.integers(0, 3), head=st.integers(0, 1),
       frame=st.integers(0, 128))
def test_any_parameters_give_a_consistent_page(policy, budget, layer, head, frame):
    p = P(policy=policy, budget=budget, layer=layer, kv_head=head)
    data = m.page_data(p)
    json.dumps(data, allow_nan=False)
    r = m.evaluate(p)
    i = m.snapped(budget)
    assert abs(m.budget_percents()[i] - budget) == min(abs(x - budget) for x in m.budget_percents())
    strip = data["sources"]["strip"]
    kept = sum(b - a for a, b, s in zip(strip["left"], strip["right"], strip["state"]) if s == "kept")
    assert kept == r["shown_kept"] == (D["recall"]["prefix"] if policy == "full" else r["recall_budget_tokens"])
    assert 0 <= r["needle_tokens_kept"] <= r["needle_tokens"] and 0 <= r["recall_byte_acc"] <= 1
    assert data["sources"]["received"]["state"].count("kept") == kept
    f = m.frame_data(p, frame)
    life = f["sources"]["life"]
    assert all(b <= t <= frame + 1 for b, t in zip(life["bottom"], life["top"]))
    live = [j for j, s in zip(life["left"], life["state"]) if s != "evicted"]
    assert len(live) == (D["decode"]["prompt"] + frame if policy == "full" else D["decode"]["budget"])
