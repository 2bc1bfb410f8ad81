"""prompt-caching: break-even and hit rates by formula, and the simulated timeline's invariants."""
from __future__ import annotations

import math
import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.prompt_caching.model import PromptCachingParams as P, cost_per_request, evaluate, simulate

PAGE = (Path(__file__).parents[2] / "explainers" / "prompt_caching" / "page.md").read_text()


def test_break_even_by_hand():
    assert evaluate(P())["break_even_hit_rate"] == pytest.approx(0.25 / 1.15)          # 21.7%
    assert evaluate(P(write_multiplier=2))["break_even_hit_rate"] == pytest.approx(1 / 1.9)   # 52.6%
    # At exactly the break-even hit rate, caching costs the same as not caching.
    p = P()
    assert cost_per_request(p, evaluate(p)["break_even_hit_rate"]) == pytest.approx(cost_per_request(p, None))


def test_costs_by_hand():
    p = P()
    assert cost_per_request(p, None) == pytest.approx((10_500 * 3 + 300 * 15) / 1e6)    # $0.036
    assert cost_per_request(p, 1.0) == pytest.approx((10_000 * 0.3 + 500 * 3 + 300 * 15) / 1e6)
    assert cost_per_request(p, 0.0) == pytest.approx((10_000 * 3.75 + 500 * 3 + 300 * 15) / 1e6)


def test_the_pages_figures():
    r = evaluate(P())
    assert round(r["hit_rate"], 2) == 0.99 and round(r["saving"], 2) == 0.74
    assert round(evaluate(P(rate_per_min=0.05))["hit_rate"], 2) == 0.22
    assert round(evaluate(P(rate_per_min=0.02))["saving"], 2) == -0.12
    hour = evaluate(P(rate_per_min=0.02, lifetime_s=3600, write_multiplier=2))
    assert (round(hour["hit_rate"], 2), round(hour["saving"], 2)) == (0.70, 0.27)
    assert round(hour["break_even_rate_per_min"], 4) == 0.0125
    for query in re.findall(r"\]\(\?([^)]*)\)", PAGE):
        P.from_mapping(dict(parse_qsl(query)))


@settings(max_examples=150, deadline=None)
@given(st.floats(0.01, 20), st.floats(1, 3600), st.floats(1, 300), st.integers(0, 1000))
def test_timeline_invariants(rate, lifetime, duration, seed):
    p = P(rate_per_min=rate, lifetime_s=lifetime, duration_min=duration, seed=seed)
    events = simulate(p)
    last_use = None
    for e in sorted(events, key=lambda e: (e["t"], e["kind"] != "expiry")):
        if e["kind"] == "expiry":
            assert last_use is not None and e["t"] == pytest.approx(last_use + lifetime)
        elif e["kind"] == "hit":
            assert last_use is not None and e["t"] - last_use <= lifetime       # a hit is within the lifetime
            last_use = e["t"]
        else:
            assert last_use is None or e["t"] - last_use > lifetime             # a write only after expiry
            last_use = e["t"]
    r = evaluate(p)
    assert 0 <= r["simulated_hit_rate"] <= 1 and 0 <= r["hit_rate"] <= 1


def test_simulated_hit_rate_converges_to_the_formula():
    r = evaluate(P(rate_per_min=2, lifetime_s=30, duration_min=5000))      # about 10,000 requests
    assert r["simulated_hit_rate"] == pytest.approx(1 - math.exp(-1), abs=0.02)
