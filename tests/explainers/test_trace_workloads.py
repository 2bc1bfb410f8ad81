"""agent-sessions and prefix-reuse replaying a Mooncake-format trace: the block cache by hand, invariants on random
chained traces, the two pages agreeing with each other and with an unlimited cache, and a trace past the old limits
(8,500 requests, 2 MB) through page_json, the CLI and the API."""
from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.agent_sessions.model import AgentParams, capacity_tokens, evaluate as agent_evaluate, \
    page_data as agent_page, replay_trace
from kvx.explainers.core import traces
from kvx.explainers.core.gpus import GPUS
from kvx.explainers.core.models import MODELS
from kvx.explainers.core.params import ParamError
from kvx.explainers.core.timing import prefill_seconds
from kvx.explainers.core.trace_replay import Served, TraceCache, replay
from kvx.explainers.prefix_reuse.model import PrefixParams, evaluate as prefix_evaluate, frame_data, history, \
    page_data as prefix_page
from kvx.explainers.registry import page_json


def line(ts, n_in, ids, n_out=10) -> str:
    return json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids})


# Four prompts over 512-token blocks; the second line arrives last. In arrival order:
#   A (0, 1, 2)        1,300 tokens (3 blocks, the last partial)
#   B (0, 1, 3, 4)     2,000 tokens: shares blocks 0-1 with A
#   C (0, 1, 2)        1,536 tokens: A's blocks again, whole
#   D (0, 1, 3, 4, 5)  2,500 tokens: B's blocks and one more
TINY = "\n".join([line(0, 1_300, [0, 1, 2]), line(9_000, 2_500, [0, 1, 3, 4, 5]),
                  line(1_000, 2_000, [0, 1, 3, 4]), line(2_000, 1_536, [0, 1, 2])]) + "\n"
IN_ORDER = [((0, 1, 2), 1_300), ((0, 1, 3, 4), 2_000), ((0, 1, 2), 1_536), ((0, 1, 3, 4, 5), 2_500)]


def serve_all(capacity_blocks, offload, policy="lru"):
    cache = TraceCache(capacity_blocks, policy, offload)
    return [cache.serve(ids, n) for ids, n in IN_ORDER], cache


def test_a_four_block_cache_by_hand():
    """A 4-block LRU cache. B finds A's blocks 0-1 and evicts A's leaf (block 2) to store 3-4. C finds 0-1, needs
    block 2 back (offloaded: reloaded, else recomputed) and evicts B's leaf 3-4 (0-1 is locked: C is using it).
    D finds 0-1, needs 3-4 back, and evicting C's block 2 leaves room for only 3-4 of 3-4-5 (block 0-1 is held):
    block 5 is new and not cached."""
    with_tier, cache = serve_all(4, offload=True)
    assert with_tier == [Served(0, 0, 0, 1_300, 0, 3), Served(1_024, 0, 0, 976, 1, 4),
                         Served(1_024, 512, 0, 0, 2, 3), Served(1_024, 1_024, 0, 452, 1, 4)]
    assert sorted(cache.tree.sequences()) == [(0, 1, 3, 4)] and cache.offloaded == {2, 3, 4}
    dropped, _ = serve_all(4, offload=False)
    assert dropped == [Served(0, 0, 0, 1_300, 0, 3), Served(1_024, 0, 0, 976, 1, 4),
                       Served(1_024, 0, 512, 0, 2, 3), Served(1_024, 0, 1_024, 452, 1, 4)]
    # Unlimited: nothing evicted, so C finds all of A (1,536) and D all of B's four blocks (2,048).
    big, _ = serve_all(1_000, offload=False)
    assert [s.cached for s in big] == [0, 1_024, 1_536, 2_048] and sum(s.new for s in big) == 1_300 + 976 + 452
    recs = traces.parse_trace(TINY)
    assert traces.unlimited_cache_hits(recs) == (1_024 + 1_536 + 2_048, 7_336)
    assert sum(s.history for s in dropped) == sum(s.history for s in with_tier) == 4_608


@pytest.mark.parametrize("offload", [False, True])
def test_a_replay_leaves_no_garbage_in_cycles(offload):
    """replay empties its cache when done, and the offload hook holds the tier's set, not the cache: its tree
    is freed by reference counting, never left to the cycle collector (test_registry: why that matters)."""
    import gc
    reqs = [traces.Request(i, float(i), n, 10, ids, 0, i) for i, (ids, n) in enumerate(IN_ORDER)]
    gc.collect()
    gc.disable()
    try:
        served = replay(reqs, 4, "lru", offload)
        left = gc.collect()
    finally:
        gc.enable()
    assert [s.cached for s in served] == [0, 1_024, 1_024, 1_024] and left == 0


def test_agent_sessions_on_the_tiny_trace_by_hand():
    """One H100's 863 blocks hold the whole trace: every history token is found; a request's time is the prefill
    of its new tokens after what it found (core.timing), and C, found whole, computes nothing."""
    p = AgentParams(trace=TINY)
    r = agent_evaluate(p)
    assert r["trace"] == "uploaded" and r["requests"] == 4 and r["capacity_blocks"] == 442_047 // 512 == 863
    assert r["hit_rate"] == 1.0 and r["returning_turns"] == 3
    assert (r["prompt_tokens"], r["cached_tokens"], r["history_tokens"]) == (7_336, 4_608, 4_608)
    assert r["prompt_hit_rate"] == r["unlimited_cache_hit_rate"] == 4_608 / 7_336
    m, g = MODELS[p.model], GPUS[p.gpu]
    want = [prefill_seconds(m, g, 1_300, 0, mfu=0.5), prefill_seconds(m, g, 976, 1_024, mfu=0.5), 0.0,
            prefill_seconds(m, g, 452, 2_048, mfu=0.5)]
    turns = replay_trace(p)
    assert [t.seconds for t in turns] == pytest.approx(want)
    assert [t.start for t in turns] == [0, 1, 2, 9] and [t.kind for t in turns] == ["first turn", "hit", "hit", "hit"]
    assert r["new_token_seconds"] == pytest.approx(sum(want)) and r["recompute_seconds"] == 0


def test_prefix_reuse_on_the_tiny_trace_by_hand():
    """A 2,048-token cache is 4 blocks: the replay of test_a_four_block_cache_by_hand, in tokens."""
    r = prefix_evaluate(PrefixParams(trace=TINY, capacity=2_048 + 100))
    assert r["capacity_blocks"] == 4 and r["tokens_requested"] == 7_336
    assert r["tokens_reused"] == 3 * 1_024 and r["hit_rate"] == 3_072 / 7_336
    assert r["unlimited_cache_hit_rate"] == 4_608 / 7_336 and r["hit_rate_sglang_rules"] is None
    assert [o.matched for o in history(PrefixParams(trace=TINY, capacity=2_148))] == [0, 1_024, 1_024, 1_024]
    assert r["peak_cache_tokens"] == 4 * 512 and r["tokens_evicted"] == 4 * 512
    # The last frame shows the tree as D found it (C's blocks 0-1-2: tokens 0-1,536) and what D computes.
    f = frame_data(PrefixParams(trace=TINY, capacity=2_148), 3)
    assert f["sources"]["current"]["x0"] == [1_024] and f["sources"]["current"]["x1"] == [2_500]
    assert sorted(zip(f["sources"]["tree"]["x0"], f["sources"]["tree"]["x1"])) == [(0, 1_024), (1_024, 1_536)]


# ---- random chained traces --------------------------------------------------------------------------------
@st.composite
def chained_traces(draw):
    """Prompts that extend an earlier prompt's prefix (chained ids, as Mooncake's are) or start afresh."""
    prompts, next_id, rows, t = [], 0, [], 0
    for _ in range(draw(st.integers(1, 25))):
        ids = []
        if prompts and draw(st.booleans()):
            parent = prompts[draw(st.integers(0, len(prompts) - 1))]
            ids = list(parent[: draw(st.integers(1, len(parent)))])
        for _ in range(draw(st.integers(0 if ids else 1, 6))):
            ids.append(next_id)
            next_id += 1
        prompts.append(ids)
        t += draw(st.integers(0, 5_000))
        n_in = len(ids) * 512 - draw(st.integers(0, 511))
        rows.append(line(t, n_in, ids))
    return "\n".join(rows)


@settings(max_examples=60, deadline=None)
@given(chained_traces(), st.integers(0, 30), st.sampled_from(["lru", "lfu"]), st.booleans())
def test_every_prompt_token_is_found_reloaded_recomputed_or_new(text, blocks, policy, offload):
    recs = traces.parse_trace(text)
    from kvx.explainers.agent_sessions.model import trace_requests
    reqs = trace_requests(text)
    served = replay(reqs, blocks, policy, offload)
    for q, s in zip(reqs, served):
        assert s.cached + s.reloaded + s.recomputed + s.new == q.input_length
        assert min(s.cached, s.reloaded, s.recomputed, s.new) >= 0
        assert s.size_blocks <= blocks                               # capacity never exceeded
        assert offload or s.reloaded == 0
    assert sum(s.history for s in served) == traces.unlimited_cache_hits(recs)[0]
    assert traces.unlimited_prefix_hits(reqs, chained=True) == traces.unlimited_cache_hits(recs)   # by bisection
    unlimited = replay(reqs, 10 ** 6, policy, offload)
    assert all(s.cached == s.history for s in unlimited)             # a cache that never fills finds everything


@settings(max_examples=25, deadline=None)
@given(chained_traces(), st.sampled_from(["llama-3-8b", "llama-3-70b"]), st.sampled_from(["h100-sxm", "h200"]),
       st.sampled_from(["lru", "lfu"]), st.sampled_from(["none", "host-dram", "ssd"]))
def test_the_pages_agree_on_a_trace(text, model, gpu, policy, offload):
    try:
        a = AgentParams(trace=text, model=model, gpu=gpu, policy=policy, offload=offload)
    except ParamError:
        return                                                       # the weights do not fit this GPU
    r = agent_evaluate(a)
    assert r["hit_rate"] is None or 0 <= r["hit_rate"] <= 1
    assert 0 <= r["prompt_hit_rate"] <= r["unlimited_cache_hit_rate"] <= 1
    assert r["cached_tokens"] + r["reloaded_tokens"] + r["recomputed_tokens"] == r["history_tokens"]
    assert r["recompute_seconds"] + r["reload_seconds"] + r["new_token_seconds"] == pytest.approx(
        sum(t.seconds for t in replay_trace(a)))
    # prefix-reuse with the same cache finds the same tokens (the offload tier only turns recompute into reload).
    pr = prefix_evaluate(PrefixParams(trace=text, model=model, gpu=gpu, policy=policy,
                                      capacity=min(capacity_tokens(a), 10_000_000)))
    assert pr["tokens_reused"] == r["cached_tokens"] and pr["unlimited_cache_hit_rate"] == r["unlimited_cache_hit_rate"]
    assert pr["tokens_computed"] + pr["tokens_reused"] == pr["tokens_requested"] == r["prompt_tokens"]
    assert 0 <= pr["prefill_seconds_with"] <= pr["prefill_seconds_without"]
    json.dumps(agent_page(a), allow_nan=False)


def test_a_trace_is_refused_line_by_line_and_return_aware_needs_sessions():
    for slug in ("agent-sessions", "prefix-reuse"):
        bad = json.loads(page_json(slug, json.dumps({"_trace": line(0, 512, [0]) + "\n" + line(0, 0, [0]) + "\n"})))
        assert bad == {"ok": False, "field": "trace",
                       "message": "The trace's line 2: input_length must be a whole number ≥ 1; got 0."}
    with pytest.raises(ParamError, match=r"^policy return-aware needs to know when each session returns.*"
                                         r"choose lru or lfu; got return-aware\.$") as err:
        AgentParams(trace=TINY, policy="return-aware")
    assert err.value.field == "policy"


def test_the_page_says_which_workload_it_runs():
    for slug, page in (("agent-sessions", agent_page), ("prefix-reuse", prefix_page)):
        ok = json.loads(page_json(slug, json.dumps({"_trace": TINY})))
        assert ok["ok"] and "trace" not in ok["params"]                 # never in the params, so never in a URL
        assert ok["data"]["texts"]["trace"].startswith("Workload: your trace, 4 requests")
        assert any(x["value"] == "your trace: 4 requests" for x in ok["data"]["readouts"])
        synthetic = json.loads(page_json(slug, "{}"))["data"]["texts"]["trace"]
        assert synthetic.startswith("Workload: the synthetic")
    d = agent_page(AgentParams(trace=TINY))
    assert d["sources"]["cliff"] == {"sessions": [], "hit_rate": []}
    assert "does not say which requests belong to one session" in d["notes"][0]


# ---- a trace past the old limits: the CLI and the API ----------------------------------------------------------
@functools.lru_cache(maxsize=1)
def big_trace() -> str:
    """The load-balancer's fixture: conversation-shaped, 8,500 requests, past the old 5,000-request and 2 MB caps."""
    return traces.to_jsonl(traces.conversation_like(8_500, seed=1))


def test_the_pages_trace_figures():
    """Try-this 6 (agent-sessions) and 5 (prefix-reuse) on the fixture."""
    text = big_trace()
    r = agent_evaluate(AgentParams(trace=text))
    assert r["capacity_blocks"] == 863 and r["requests"] == 8_500
    assert (round(r["prompt_hit_rate"], 3), round(r["unlimited_cache_hit_rate"], 3), round(r["hit_rate"], 3)) == \
        (0.463, 0.551, 0.839)
    h200 = agent_evaluate(AgentParams(trace=text, gpu="h200"))
    assert h200["capacity_blocks"] == 1_772 and round(h200["prompt_hit_rate"], 3) == 0.550
    assert round(agent_evaluate(AgentParams(trace=text, policy="lfu"))["prompt_hit_rate"], 3) == 0.178
    rates = [prefix_evaluate(PrefixParams(trace=text, capacity=c))["hit_rate"] for c in (100_000, 442_047)]
    assert [round(x, 3) for x in rates] == [0.212, 0.463]
    big = prefix_evaluate(PrefixParams(trace=text, capacity=10_000_000))
    assert big["hit_rate"] == big["unlimited_cache_hit_rate"] and round(big["hit_rate"], 3) == 0.551
    assert (round(big["prefill_seconds_saved"]), round(big["prefill_seconds_without"])) == (2_444, 4_543)


def kvx(*args):
    return subprocess.run([sys.executable, "-m", "kvx.compute.cli", *args], capture_output=True, text=True)


def test_the_big_trace_through_the_cli(tmp_path):
    text = big_trace()
    assert text.count("\n") == 8_500 and len(text.encode()) > 2_000_000
    path = tmp_path / "big.jsonl"
    path.write_text(text)
    out = kvx("run", "agent-sessions", "offload=host-dram", "--trace", str(path), "--json")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    want = json.loads(json.dumps(agent_evaluate(AgentParams(trace=text, offload="host-dram"))))
    assert {k: body[k] for k in want} == want and body["requests"] == 8_500 and "trace" not in body["params"]
    assert 0 < body["prompt_hit_rate"] < body["unlimited_cache_hit_rate"] < 1 and body["reloaded_tokens"] > 0
    out = kvx("run", "prefix-reuse", "capacity=442047", "--trace", str(path), "--json")
    assert out.returncode == 0, out.stderr
    pr = json.loads(out.stdout)
    # The same GPU's blocks under LRU: the same tokens found as agent-sessions, with or without a tier.
    assert pr["tokens_reused"] == body["cached_tokens"] and pr["requests"] == 8_500


def test_the_big_trace_through_the_api(tmp_path):
    from fastapi.testclient import TestClient

    from kvx.compute.app import create_app
    from kvx.compute.settings import Settings
    client = TestClient(create_app(Settings(site_dir=tmp_path)))
    for slug, params, evaluate in (("agent-sessions", AgentParams, agent_evaluate),
                                   ("prefix-reuse", PrefixParams, prefix_evaluate)):
        r = client.post(f"/api/v1/explainers/{slug}", json={"trace": big_trace(), "policy": "lfu"})
        assert r.status_code == 200, r.text
        want = json.loads(json.dumps(evaluate(params(trace=big_trace(), policy="lfu"))))
        assert {k: r.json()[k] for k in want} == want and r.json()["requests"] == 8_500
        bad = client.post(f"/api/v1/explainers/{slug}", json={"trace": line(0, 1000, [0, 1], n_out=-3)})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "trace"]
        assert bad.json()["detail"][0]["msg"] == "The trace's line 1: output_length must be a whole number ≥ 0; got -3."


@settings(max_examples=30, deadline=None)
@given(chained_traces(), st.integers(512, 8_000), st.lists(st.integers(0, 30), min_size=1, max_size=6))
def test_trace_frames_equal_a_fresh_replay_in_any_order(text, capacity, frames):
    """prefix-reuse keeps one trace cache at the last frame drawn (stepping forward serves one request) and reads
    the current match without splitting an edge: each frame equals a replay from the start with a real match."""
    from kvx.explainers.prefix_reuse.model import icicle, trace_requests
    p = PrefixParams(trace=text, capacity=capacity)
    reqs = trace_requests(text)
    for k in frames:
        k = min(k, len(reqs) - 1)
        cache = TraceCache(capacity // 512, "lru")
        for q in reqs[:k]:
            cache.serve(q.blocks, q.input_length)
        _, path = cache.tree.match(reqs[k].blocks)
        want = icicle(cache.tree, {id(n) for n in path}, unit=512)
        got = frame_data(p, k)["sources"]["tree"]
        assert sorted(zip(*got.values())) == sorted(zip(*want.values())), k
    assert [o.matched for o in history(p)] == [s.cached for s in replay(reqs, capacity // 512)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.lists(st.integers(0, 40), min_size=1, max_size=8)), max_size=30))
def test_block_owners_is_the_one_session_holding_a_block_else_shared(prompts):
    """traces.block_owners against its definition, block by block: the sessions whose prompts hold the block, one
    of them or SHARED."""
    requests = [traces.Request(i, float(i), 512, 0, tuple(ids), session, 0) for i, (session, ids) in enumerate(prompts)]
    holders: dict = {}
    for q in requests:
        for b in q.blocks:
            holders.setdefault(b, set()).add(q.session)
    expected = {b: next(iter(s)) if len(s) == 1 else traces.SHARED for b, s in holders.items()}
    assert traces.block_owners(requests) == expected
