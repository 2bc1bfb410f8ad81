"""prompt-caching: break-even and hit rates by formula, and the simulated timeline's invariants."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.prompt_caching.model import PromptCachingParams as P, cost_per_request, evaluate, page_data, simulate

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


def test_self_hosted_saving_by_hand():
    """A hit skips the prefix's prefill: (2 × 8.03e9 × n + 2 × 32 × 32 × 256 × n²/2) ÷ (989e12 × 0.5), the shared
    time model; ten times the prefix costs 22.6× the time because attention grows with n²."""
    flops = lambda n: 2 * 8.03e9 * n + 2 * 32 * 32 * 256 * n * n / 2
    r = evaluate(P())
    assert r["self_hosted_prefill_s_saved_per_hit"] == pytest.approx(flops(10_000) / (989e12 * 0.5))
    assert round(r["self_hosted_prefill_s_saved_per_hit"], 2) == 0.38                 # the page's figure
    long = evaluate(P(prefix_tokens=100_000))["self_hosted_prefill_s_saved_per_hit"]
    assert round(long, 2) == 8.55 and round(long / r["self_hosted_prefill_s_saved_per_hit"], 1) == 22.6
    two = evaluate(P(gpus=2, mfu=0.25))
    assert two["self_hosted_prefill_s_saved_per_hit"] == pytest.approx(r["self_hosted_prefill_s_saved_per_hit"])
    assert two["self_hosted_dollars_saved_per_hour"] == pytest.approx(2 * r["self_hosted_dollars_saved_per_hour"])
    assert r["self_hosted_dollars_saved_per_hour"] == pytest.approx(60 * r["hit_rate"] * flops(10_000) / 494.5e12 / 3600 * 3)
    rows = {f["name"]: f for f in page_data(P())["formula"]}
    assert "× 0.5)" in rows["Self-hosted: a hit skips the prefix's prefill (Llama 3 8B)"]["substituted"]


def test_self_hosted_model_must_fit_its_gpus():
    from kvx.explainers.core.params import ParamError
    with pytest.raises(ParamError, match="gpus must be at least"):
        P(model="llama-3-70b")
    P(model="llama-3-70b", gpus=2)


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
    assert 0 <= r["hit_rate"] <= 1
    assert (r["simulated_hit_rate"] is None) == (r["simulated_requests"] == 0)
    assert r["simulated_hit_rate"] is None or 0 <= r["simulated_hit_rate"] <= 1


def test_equal_multipliers_make_caching_change_nothing():
    """write = read = 1: the prefix costs 1x input whether it hits or not; no break-even, no crash."""
    p = P(write_multiplier=1, read_multiplier=1)
    r = evaluate(p)
    assert (r["break_even_kind"], r["break_even_hit_rate"], r["break_even_rate_per_min"]) == ("no difference", None, None)
    assert r["cost_with"] == pytest.approx(r["cost_without"]) and r["saving"] == pytest.approx(0, abs=1e-12)
    d = page_data(p)
    json.dumps(r, allow_nan=False), json.dumps(d, allow_nan=False)
    assert d["sources"]["break_even"] == {"reuses": [], "y": []}
    assert "costs the same as not caching" in [f for f in d["formula"] if f["name"] == "Break-even"][0]["result"]


def test_a_full_price_read_never_pays_back_the_write():
    """read = 1 < write: every hit costs what no caching costs and every write more, so caching never pays;
    the break-even is absent (it used to be Infinity, which is not JSON)."""
    p = P(read_multiplier=1, write_multiplier=1.25)
    r = evaluate(p)
    assert (r["break_even_kind"], r["break_even_hit_rate"], r["break_even_rate_per_min"]) == ("never", None, None)
    assert r["cost_with"] > r["cost_without"]
    d = page_data(p)
    json.dumps(d, allow_nan=False)
    assert [x for x in d["readouts"] if x["label"] == "Break-even"][0]["value"] == "none"


def test_a_write_at_input_price_pays_from_the_first_hit():
    r = evaluate(P(write_multiplier=1, read_multiplier=0.1))
    assert (r["break_even_kind"], r["break_even_hit_rate"], r["break_even_rate_per_min"]) == ("always", 0.0, 0.0)


def test_a_simulation_with_too_few_requests_says_so():
    p = P(rate_per_min=0.001, duration_min=1, seed=0)           # about 0.001 requests expected
    r = evaluate(p)
    assert r["simulated_requests"] == 0 and r["simulated_hit_rate"] is None
    assert "nothing to check" in [f for f in page_data(p)["formula"] if f["name"] == "Hit rate"][0]["result"]
    few = P(rate_per_min=0.1, duration_min=60)                  # about 6
    assert 0 < evaluate(few)["simulated_requests"] < 30
    assert "too few" in [f for f in page_data(few)["formula"] if f["name"] == "Hit rate"][0]["result"]


def test_simulated_hit_rate_converges_to_the_formula():
    r = evaluate(P(rate_per_min=2, lifetime_s=30, duration_min=5000))      # about 10,000 requests
    assert r["simulated_hit_rate"] == pytest.approx(1 - math.exp(-1), abs=0.02)
