"""prefix-reuse: exact token counts by hand, conservation, and the page's figures."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.core.params import ParamError
from kvx.explainers.core.radix import RadixTree
from kvx.explainers.prefix_reuse.model import (PrefixParams as P, evaluate, frame_data, history, requests,
                                             serve_like_sglang)

PAGE = (Path(__file__).parents[2] / "explainers" / "prefix_reuse" / "page.md").read_text()


def test_defaults_by_hand():
    """8 users x 4 turns; request t of a user asks for 1,000 + t x 300 + 100 tokens and computes 100,
    except the first request of all, which also computes the system prompt."""
    r = evaluate(P())
    assert r["tokens_requested"] == 8 * sum(1_000 + t * 300 + 100 for t in range(4)) == 49_600
    assert r["tokens_computed"] == 1_000 + 32 * 100 == 4_200
    assert round(r["hit_rate"], 3) == 0.915


def test_prefill_seconds_against_the_closed_form():
    """Llama 3 8B (8.03B parameters, 32 layers, 32 query heads of 128) on an H100 SXM (989 TFLOP/s BF16) at
    MFU 0.5: n new tokens after c cached cost 2·8.03e9·n + 2·32·32·(128 + 128)·(n·c + n²/2) FLOPs."""
    def flops(n, c):
        return 2 * 8.03e9 * n + 2 * 32 * 32 * 256 * (n * c + n * n / 2)
    rate = 989e12 * 0.5
    without = 8 * sum(flops(1_100 + 300 * t, 0) for t in range(4)) / rate
    with_cache = (flops(1_100, 0) + 7 * flops(100, 1_000)
                  + 8 * sum(flops(100, 1_000 + 300 * t) for t in range(1, 4))) / rate
    r = evaluate(P())
    assert r["prefill_seconds_without"] == pytest.approx(without, rel=1e-12)
    assert r["prefill_seconds_with"] == pytest.approx(with_cache, rel=1e-12)
    assert round(r["prefill_seconds_with"], 3) == 0.142 and round(r["prefill_seconds_without"], 2) == 1.65
    # Not linear in tokens: the computed tokens still attend to the cached ones (the n·c term), so the share
    # of time saved (91.4%) is below the share of tokens reused (91.5%).
    assert round(r["prefill_seconds_saved"] / r["prefill_seconds_without"], 3) == 0.914 < round(r["hit_rate"], 3)
    # Twice the MFU, half the time.
    assert evaluate(P(mfu=1.0))["prefill_seconds_with"] == pytest.approx(with_cache / 2, rel=1e-12)


def test_sglang_scheduler_rules_on_a_tiny_case():
    """One user, two turns, 2-token messages and answers, no system prompt. Turn 2's prompt is turn 1's
    message and answer, then a new message. SGLang caches turn 1's message and the answer's first token
    (the last token's KV was never computed), so turn 2 finds 3 tokens; this model caches all 4."""
    p = P(users=1, turns=2, system_prompt=0, message=2, answer=2)
    assert [o.matched for o in history(p)] == [0, 4]
    assert [o.matched for o in history(p, serve_like_sglang)] == [0, 3]
    tree = RadixTree(100)
    serve_like_sglang(tree, requests(p)[0])
    assert sorted(n.tokens for n in tree.nodes()) == sorted([requests(p)[0].prompt, requests(p)[0].answer[:1]])


def test_the_pages_figures():
    assert round(evaluate(P(capacity=5_000))["hit_rate"], 3) == 0.722
    assert round(evaluate(P(capacity=5_000, policy="lfu"))["hit_rate"], 3) == 0.746
    # What the model leaves out: the same workloads under SGLang's scheduler rules.
    assert round(evaluate(P())["hit_rate_sglang_rules"], 3) == 0.915
    assert round(evaluate(P(capacity=5_000))["hit_rate_sglang_rules"], 3) == 0.740
    assert round(evaluate(P(capacity=5_000, policy="lfu"))["hit_rate_sglang_rules"], 3) == 0.752
    flat = " ".join(PAGE.split())
    for figure in ("91.5% against 91.5%", "74.0% against 72.2%", "of the 1.8 points", "75.2% against 74.6%",
                   "142 ms of prefill instead of 1.65 s", "91.4% of the time is saved for 91.5% of the tokens"):
        assert figure in flat, figure


params = st.builds(P, users=st.integers(1, 6), system_prompt=st.integers(0, 300), turns=st.integers(1, 4),
                   message=st.integers(1, 60), answer=st.integers(1, 60), capacity=st.integers(100, 3000),
                   policy=st.sampled_from(["lru", "lfu"]), seed=st.integers(0, 50),
                   mfu=st.floats(0.01, 1.0))


@settings(max_examples=80, deadline=None)
@given(params)
def test_tokens_are_conserved_and_the_cache_stays_within_capacity(p):
    h = history(p)
    for o, req in zip(h, requests(p)):
        assert o.computed + o.matched == o.requested == len(req.prompt)
        assert o.size <= p.capacity
    r = evaluate(p)
    assert r["tokens_computed"] + r["tokens_reused"] == r["tokens_requested"]
    assert 0 <= r["hit_rate"] <= 1
    assert 0 <= r["prefill_seconds_with"] <= r["prefill_seconds_without"]
    assert 0 <= r["hit_rate_sglang_rules"] <= 1


@settings(max_examples=30, deadline=None)
@given(params, st.integers(0, 30))
def test_frames_show_the_match_the_history_recorded(p, k):
    k = min(k, len(requests(p)) - 1)
    d = frame_data(p, k)
    assert d["sources"]["current"]["x0"] == [history(p)[k].matched]
    assert d["animation"]["frame"] == k


def test_workloads_too_big_for_the_browser_are_refused():
    with pytest.raises(ParamError, match="must stay under 5,000,000 tokens"):
        P(users=64, turns=20, system_prompt=32_000)


def test_impossible_configurations_are_refused():
    with pytest.raises(ParamError, match="model must fit in 1 × 80 GB NVIDIA H100 SXM; got Llama 3.1 405B's"):
        P(model="llama-3-405b")
    with pytest.raises(ParamError, match="turns must keep the longest conversation .* 131,072-token context"):
        P(users=1, turns=20, system_prompt=32_000, message=4_000, answer=4_000)


def test_each_prompt_is_the_system_prompt_then_the_users_history_then_the_message():
    from kvx.explainers.prefix_reuse.model import _answer, _message
    p = P(users=3, turns=4, system_prompt=5, message=2, answer=3, seed=7)
    for r in requests(p):
        history = sum((_message(r.user, s, 2) + _answer(r.user, s, 3) for s in range(r.turn)), ())
        assert r.prompt == tuple(range(5)) + history + _message(r.user, r.turn, 2)
        assert r.answer == _answer(r.user, r.turn, 3)
    assert sorted((r.turn, r.user) for r in requests(p)) == [(t, u) for t in range(4) for u in range(3)]
