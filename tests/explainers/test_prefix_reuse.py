"""prefix-reuse: exact token counts by hand, conservation, and the page's figures."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.core.params import ParamError
from kvx.explainers.prefix_reuse.model import PrefixParams as P, evaluate, frame_data, history, requests

PAGE = (Path(__file__).parents[2] / "explainers" / "prefix_reuse" / "page.md").read_text()


def test_defaults_by_hand():
    """8 users x 4 turns; request t of a user asks for 1,000 + t x 300 + 100 tokens and computes 100,
    except the first request of all, which also computes the system prompt."""
    r = evaluate(P())
    assert r["tokens_requested"] == 8 * sum(1_000 + t * 300 + 100 for t in range(4)) == 49_600
    assert r["tokens_computed"] == 1_000 + 32 * 100 == 4_200
    assert round(r["hit_rate"], 3) == 0.915
    assert (r["prefill_seconds_without"], r["prefill_seconds_with"]) == (4.96, 0.42)


def test_the_pages_figures():
    assert round(evaluate(P(capacity=5_000))["hit_rate"], 3) == 0.722
    assert round(evaluate(P(capacity=5_000, policy="lfu"))["hit_rate"], 3) == 0.746
    for query in re.findall(r"\]\(\?([^)]*)\)", PAGE):
        P.from_mapping(dict(parse_qsl(query)))


params = st.builds(P, users=st.integers(1, 6), system_prompt=st.integers(0, 300), turns=st.integers(1, 4),
                   message=st.integers(1, 60), answer=st.integers(1, 60), capacity=st.integers(100, 3000),
                   policy=st.sampled_from(["lru", "lfu"]), seed=st.integers(0, 50))


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
