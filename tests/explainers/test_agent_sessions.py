"""agent-sessions: the capacity and prefill arithmetic, the cliff, and the simulation's invariants."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.agent_sessions.model import AgentParams as P, evaluate, simulate

PAGE = (Path(__file__).parents[2] / "explainers" / "agent_sessions" / "page.md").read_text()


def test_capacity_and_prefill_by_hand():
    r = evaluate(P())
    assert r["capacity_tokens"] == int((80e9 - 8.03e9 * 2 - 6e9) // 131_072) == 442_047
    assert r["prefill_tokens_per_s"] == pytest.approx(0.5 * 989e12 / (2 * 8.03e9))
    assert r["sessions_that_fit"] == 442_047 // (52_000 + 9 * 8_000 + 413) == 3
    assert 52_000 + 4.5 * 8_000 == 88_000                               # the preset's mean prompt


def test_the_pages_figures():
    assert evaluate(P(sessions=4))["hit_rate"] == 1.0
    r = evaluate(P())
    assert round(r["hit_rate"], 2) == 0.61 and round(r["recompute_seconds"]) == 76
    assert round(r["max_turn_seconds"], 2) == 4.03 and round(r["hit_turn_seconds"], 2) == 0.26
    assert round(evaluate(P(policy="return-aware"))["hit_rate"], 2) == 0.81
    assert round(evaluate(P(policy="lfu"))["hit_rate"], 2) == 0.58
    dram, ssd = evaluate(P(offload="host-dram")), evaluate(P(offload="ssd"))
    assert (round(dram["reload_seconds"]), round(ssd["reload_seconds"]), dram["recomputed_tokens"]) == (5, 35, 0)
    assert round(dram["max_turn_seconds"], 2) == 1.69
    for query in re.findall(r"\]\(\?([^)]*)\)", PAGE):
        P.from_mapping(dict(parse_qsl(query)))


params = st.builds(P, sessions=st.integers(1, 12), turns=st.integers(1, 8), initial_tokens=st.integers(1, 200_000),
                   growth_tokens=st.integers(1, 50_000), pause_mean_s=st.floats(0.5, 120),
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
    assert 0 <= evaluate(p)["hit_rate"] <= 1


def test_more_sessions_never_raise_the_hit_rate_much():
    rates = [evaluate(P(sessions=n))["hit_rate"] for n in (1, 4, 8, 16, 32)]
    assert rates[0] == rates[1] == 1.0 and rates[-1] < 0.3 and rates == sorted(rates, reverse=True)


def test_animation_frames_reveal_turns_in_time_order():
    from kvx.explainers.agent_sessions.model import page_data
    d = page_data(P())
    frames = d["sources"]["turns"]["frame"]
    assert frames == sorted(frames) and frames[0] == 0
    assert d["animation"]["frames"] == len(d["animation"]["captions"]) == frames[-1] + 1 <= 120
    assert d["sources"]["turns"]["start"] == sorted(d["sources"]["turns"]["start"])
