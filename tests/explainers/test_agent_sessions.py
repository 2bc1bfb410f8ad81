"""agent-sessions: the capacity and prefill arithmetic, the cliff, and the simulation's invariants."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.agent_sessions.model import AgentParams as P, evaluate, page_data, simulate

PAGE = (Path(__file__).parents[2] / "explainers" / "agent_sessions" / "page.md").read_text()


def test_capacity_and_prefill_by_hand():
    r = evaluate(P())
    assert r["capacity_tokens"] == int((80e9 - 8.03e9 * 2 - 6e9) // 131_072) == 442_047
    # The last turn that misses prefills 124,000 tokens: weights 2 × 8.03e9 × n, causal attention
    # 2 × 32 layers × 32 heads × (128 + 128) × n²/2, at 0.5 × 989 TFLOP/s. Attention is 2.02× the weights.
    n = 52_000 + 9 * 8_000
    linear, attention = 2 * 8.03e9 * n, 2 * 32 * 32 * 256 * n * n / 2
    assert r["miss_turn_seconds"] == pytest.approx((linear + attention) / (0.5 * 989e12)) == pytest.approx(12.178, abs=1e-3)
    assert attention / linear == pytest.approx(2.024, abs=1e-3)
    # A last turn that hits computes 8,000 new tokens, each seeing the 116,000 before it and the new ones up to itself.
    c = n - 8_000
    assert r["hit_turn_seconds"] == pytest.approx((2 * 8.03e9 * 8_000 + 2 * 32 * 32 * 256 * (8_000 * c + 8_000 ** 2 / 2))
                                                  / (0.5 * 989e12))
    assert r["sessions_that_fit"] == 442_047 // (52_000 + 9 * 8_000 + 413) == 3
    assert 52_000 + 4.5 * 8_000 == 88_000                               # the preset's mean prompt


def test_the_pages_figures():
    assert evaluate(P(sessions=4))["hit_rate"] == 1.0
    hits = [t.seconds for t in simulate(P(sessions=4)) if t.kind == "hit"]
    assert (round(min(hits), 2), round(max(hits), 2)) == (0.73, 1.28)
    r = evaluate(P())
    assert round(r["hit_rate"], 2) == 0.51 and round(r["recompute_seconds"]) == 246
    assert round(r["max_turn_seconds"], 2) == 12.18 and round(r["hit_turn_seconds"], 2) == 1.28
    aware = evaluate(P(policy="return-aware"))
    assert round(aware["hit_rate"], 2) == 0.78 and round(aware["recompute_seconds"]) == 112
    assert round(evaluate(P(policy="lfu"))["hit_rate"], 2) == 0.58
    dram, ssd = evaluate(P(offload="host-dram")), evaluate(P(offload="ssd"))
    assert (round(dram["reload_seconds"]), round(ssd["reload_seconds"]), dram["recomputed_tokens"]) == (6, 39, 0)
    assert round(max(t.seconds for t in simulate(P(offload="host-dram")) if t.kind == "reload"), 2) == 1.58
    for query in re.findall(r"\]\(\?([^)]*)\)", PAGE):
        P.from_mapping(dict(parse_qsl(query)))


# Within Llama 3 8B's 131,072-token context at the last turn (60,000 + 7 × 8,000 + 413), and past its
# 442,000-token KV memory with a few sessions.
params = st.builds(P, sessions=st.integers(1, 12), turns=st.integers(1, 8), initial_tokens=st.integers(1, 60_000),
                   growth_tokens=st.integers(1, 8_000), pause_mean_s=st.floats(0.5, 120),
                   policy=st.sampled_from(["lru", "lfu", "return-aware"]),
                   offload=st.sampled_from(["none", "host-dram", "ssd"]), seed=st.integers(0, 100))


@settings(max_examples=100, deadline=None)
@given(params)
def test_every_history_token_is_found_reloaded_or_recomputed(p):
    turns = simulate(p)
    assert len(turns) == p.sessions * p.turns
    assert [t.start for t in turns] == sorted(t.start for t in turns)
    for t in turns:
        history = t.prompt - (p.initial_tokens if t.turn == 0 else p.growth_tokens)
        assert t.cached + t.reloaded + t.recomputed == history
        assert min(t.cached, t.reloaded, t.recomputed) >= 0
        if p.offload == "none":
            assert t.reloaded == 0
    r = evaluate(p)
    assert r["hit_rate"] is None if p.turns == 1 else 0 <= r["hit_rate"] <= 1
    # A turn's time splits into its parts, and the run's totals are their sums.
    assert r["recompute_seconds"] + r["reload_seconds"] + r["new_token_seconds"] == pytest.approx(
        sum(t.seconds for t in turns))


def test_recompute_is_priced_with_attention_over_the_history_before_it():
    """A returning session that lost everything recomputes its history from token 0 and then its new tokens:
    the same FLOPs as one prefill of the whole prompt (chunks add up), by hand on a tiny made-up run."""
    from kvx.explainers.core.gpus import GPUS
    from kvx.explainers.core.models import MODELS
    from kvx.explainers.core.timing import prefill_seconds
    # Four 121,001-token histories in about 442,000 tokens of KV: returning sessions find theirs evicted.
    p = P(sessions=4, turns=2, initial_tokens=120_000, growth_tokens=1_000, output_tokens=1, pause_mean_s=1)
    turns = simulate(p)
    m, g = MODELS[p.model], GPUS[p.gpu]
    for t in turns:
        if t.kind == "recompute":
            assert t.cached == 0 and t.recomputed == 120_000
            assert t.recompute_seconds == pytest.approx(prefill_seconds(m, g, 120_000, 0, mfu=0.5))
            assert t.seconds == pytest.approx(prefill_seconds(m, g, 121_000, 0, mfu=0.5))
    assert any(t.kind == "recompute" for t in turns)


def test_one_turn_has_no_hit_rate():
    """With one turn per session nobody returns: no hit rate (not 100%), an empty cliff and a note saying why."""
    import json
    r, d = evaluate(P(turns=1)), page_data(P(turns=1))
    assert r["hit_rate"] is None and r["returning_turns"] == 0 and r["hit_turn_seconds"] is None
    assert d["sources"]["cliff"]["hit_rate"] == [] and d["notes"] and "no hit rate" in d["notes"][0]
    assert [x["value"] for x in d["readouts"] if x["label"] == "Hit rate"] == ["none"]
    json.dumps(d, allow_nan=False)


def test_more_sessions_never_raise_the_hit_rate_much():
    rates = [evaluate(P(sessions=n))["hit_rate"] for n in (1, 4, 8, 16, 32)]
    assert rates[0] == rates[1] == 1.0 and rates[-1] < 0.3 and rates == sorted(rates, reverse=True)


def test_animation_frames_reveal_turns_in_time_order():
    d = page_data(P())
    frames = d["sources"]["turns"]["frame"]
    assert frames == sorted(frames) and frames[0] == 0
    assert d["animation"]["frames"] == len(d["animation"]["captions"]) == frames[-1] + 1 <= 120
    assert d["sources"]["turns"]["start"] == sorted(d["sources"]["turns"]["start"])


def test_sessions_that_fit_never_exceed_the_sessions():
    d = page_data(P(sessions=1, turns=2))
    assert [x["value"] for x in d["readouts"] if x["label"] == "Sessions that fit"] == ["1 of 1"]
    assert [f["result"] for f in d["formula"] if f["name"] == "Sessions at full length"] == ["room for 7; 1 run"]
