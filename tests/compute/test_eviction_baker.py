"""The eviction page's baker on a tiny random model: its shortcuts equal the kernel, its budgets and
decode frames follow the policies' rules, and "run it here" reproduces the committed bake."""
from __future__ import annotations

import json

import pytest
import torch

from kvx.compute.bakers import eviction as baker
from kvx.compute.kernels import eviction
from kvx.compute.lm import data
from kvx.compute.lm.model import LMConfig, TinyLM

LENGTH = 256


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return TinyLM(LMConfig("t-evict", "gqa", d_model=32, n_layers=2, n_heads=4, head_dim=8, n_kv_heads=2,
                           max_len=LENGTH, kv_shift=True)).eval()


@pytest.fixture(scope="module")
def baked(tiny):
    return baker.bake_for(tiny, seq_len=LENGTH, text_sequences=2, recall_sequences=2, decode_length=80,
                          decode_prompt=32, decode_budget=8)


def test_reusing_the_full_forward_changes_nothing(tiny):
    ids, pos = data.recall_set(2, LENGTH)
    prefix = data.query_start(pos[0].tolist())
    with torch.no_grad():
        logits, weights, _ = tiny(ids, need_weights=True)
    for policy in baker.policies().values():
        a = eviction.evaluate(tiny, ids, prefix, policy, 0.2, answer_positions=pos)
        b = eviction.evaluate(tiny, ids, prefix, policy, 0.2, answer_positions=pos, full=(logits, weights))
        assert a == b


@pytest.mark.parametrize("name", ["random", "streaming_llm", "no_sinks", "h2o", "snapkv"])
def test_at_100_percent_every_policy_is_the_full_cache(tiny, name):
    """The sweep writes the full cache's row at 100% for every policy: the kernel agrees."""
    ids = data.text_set(2, LENGTH)
    with torch.no_grad():
        full = eviction.evaluate(tiny, ids, LENGTH - 64, eviction.FullCache(), 1.0)
        cut = eviction.evaluate(tiny, ids, LENGTH - 64, baker.policies()[name], 1.0)
    assert cut["loss"] == pytest.approx(full["loss"], abs=1e-5) and cut["top1_agreement"] == 1.0


def test_sweep_shape_and_invariants(baked):
    assert baked["policies"] == ["full", "random", "streaming_llm", "no_sinks", "h2o", "observed", "snapkv"]
    for task in ("text", "recall"):
        prefix = baked[task]["prefix"]
        for name, r in baked[task]["results"].items():
            assert r["budget_tokens"] == [max(1, int(prefix * (1 - (1 - f)))) for f in baker.BUDGETS]
            assert r["loss_bits"][-1] == baked[task]["results"]["full"]["loss_bits"][0]
            assert r["top1"][-1] == 1.0 and all(0 <= x <= 1 for x in r["top1"])
        assert set(baked[task]["results"]["full"]["top1"]) == {1.0}
    assert baked["recall"]["answer_bytes"] == 2 * 24
    json.dumps(baked, allow_nan=False)


@pytest.mark.parametrize("prompt", [1, 5, 21, 100, 167, 423, 448, 450, 511])
def test_the_page_counts_kept_tokens_as_the_kernel_does(prompt):
    from kvx.explainers.eviction import model
    for fraction in (0.01, 0.05, 0.1, 0.2, 0.3, 0.35, 0.5, 0.7, 0.9, 1.0):
        n = eviction.kept_count(prompt, fraction)
        assert model.budget_tokens(fraction, prompt) == n and isinstance(n, int) and 1 <= n <= prompt


def test_recall_coverage_counts_the_secret_lines(tiny, baked):
    """The why-numbers: StreamingLLM without sinks keeps exactly the lines' tokens in its recent window (the
    same count in every layer and head), every policy keeps all of them at 100%, and the shares are shares."""
    ids, pos = data.recall_set(2, LENGTH)
    prefix = baked["recall"]["prefix"]
    lines = [[j for s, e in baker.needles(ids[r].tolist(), prefix) for j in range(s, e)] for r in range(2)]
    cov = baked["recall"]["coverage"]
    assert cov["on_lines"]["tokens"] == pytest.approx(sum(map(len, lines)) / (2 * prefix), rel=1e-3)
    assert 0 <= cov["on_lines"]["questions"] <= 1
    for i, f in enumerate(baker.BUDGETS):
        b = eviction.kept_count(prefix, f)
        recent = sum(j >= prefix - b for row in lines for j in row) / sum(map(len, lines))
        assert cov["secret_tokens_kept"]["no_sinks"][i] == pytest.approx(recent, rel=1e-3, abs=1e-6)
    for name, shares in cov["secret_tokens_kept"].items():
        assert shares[-1] == 1.0 and all(0 <= x <= 1 for x in shares), name


def test_kept_masks_hold_the_budget(baked):
    prefix = baked["shown"]["prefix"]
    for name, per_budget in baked["shown"]["kept"].items():
        for f, layers in zip(baker.BUDGETS, per_budget):
            for heads in layers:
                for mask in heads:
                    bits = "".join(f"{int(c, 16):04b}" for c in mask)[:prefix]
                    assert bits.count("1") == max(1, int(prefix * (1 - (1 - f)))), (name, f)
                    if name == "streaming_llm" and f < 1:
                        assert bits.startswith("1111")


def test_attention_map_rows_are_whole_queries(baked):
    n = LENGTH // baked["shown"]["map_bin"]
    for cells in baked["shown"]["map"]:
        assert len(cells) == n * (n + 1) // 2
        k = 0
        for i in range(n):
            assert sum(cells[k:k + i + 1]) == pytest.approx(1, abs=2e-3)
            k += i + 1
    for s in baked["sinks"]:
        assert 0 <= s["first_token"] <= s["first_4"] <= 1 and 0 < s["uniform_first_4"] < 1


def _cache(dec, name, layer, head, k):
    prompt = dec["prompt"]
    pol = dec["policies"][name]
    kept = "".join(f"{int(c, 16):04b}" for c in pol["cut"][layer][head])[:prompt]
    cached = {j for j in range(prompt) if kept[j] == "1"}
    victims = pol["victims"][layer][head]
    for step in range(1, k + 1):
        cached.add(prompt + step - 1)
        v = int(victims[2 * step - 2:2 * step], 16)
        if v != 0xFF:
            cached.remove(v)
    return sorted(cached)


def test_decode_frames_keep_the_budget_and_the_rules(baked):
    dec = baked["decode"]
    prompt, budget, steps = dec["prompt"], dec["budget"], dec["length"] - dec["prompt"]
    for name in baked["policies"]:
        pol = dec["policies"][name]
        assert len(pol["loss_bits"]) == len(pol["top1"]) == len(pol["predicted"]) == steps - 1
        for layer in range(2):
            for head in range(2):
                for k in range(steps + 1):
                    cached = _cache(dec, name, layer, head, k)
                    if name == "full":
                        assert cached == list(range(prompt + k))
                        continue
                    assert len(cached) == budget
                    t = prompt + k - 1
                    if name == "streaming_llm":
                        assert cached == [0, 1, 2, 3] + list(range(t + 1 - (budget - 4), t + 1)) if k else \
                            cached == [0, 1, 2, 3] + list(range(prompt - (budget - 4), prompt))
                    if name == "no_sinks":
                        assert cached == list(range(max(t, prompt - 1) + 1 - budget, max(t, prompt - 1) + 1))
                    if name == "h2o" and k:
                        assert set(range(t + 1 - budget // 2, t + 1)) <= set(cached)
    assert dec["policies"]["full"]["top1"] == [1] * (steps - 1)


def test_bake_is_deterministic(tiny, baked):
    again = baker.bake_for(tiny, seq_len=LENGTH, text_sequences=2, recall_sequences=2, decode_length=80,
                           decode_prompt=32, decode_budget=8)
    assert again == baked


def test_run_it_here_reproduces_the_committed_bake():
    """The page's request for StreamingLLM without sinks, through the server's runner, gives the baked row."""
    from kvx.compute.kernel_specs import EvictionRequest, eviction_run
    from kvx.explainers.eviction import model
    d = model.data()
    p = model.EvictionParams(policy="no_sinks", budget=10)
    req = EvictionRequest(**model.run_request(p))
    with torch.no_grad():
        out = eviction_run(req, lambda *a: None)
    i = d["budgets"].index(0.1)
    want = d["recall"]["results"]["no_sinks"]
    assert out["budget"] == want["budget_tokens"][i] and out["prefix"] == d["recall"]["prefix"]
    assert out["loss"] / 0.6931471805599453 == pytest.approx(want["loss_bits"][i], rel=2e-3)
    assert out["recall_byte_acc"] == pytest.approx(want["recall_byte_acc"][i], abs=1e-3)
    assert out["kept_per_head"] == [want["budget_tokens"][i]] * d["config"]["n_layers"]
