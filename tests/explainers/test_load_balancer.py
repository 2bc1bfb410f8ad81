"""load-balancer: exact event traces by hand, simulation invariants, Mooncake parsing, and the page's figures."""
from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import assume, given, settings, strategies as st

from kvx.explainers.core import traces
from kvx.explainers.core.radix import RadixTree
from kvx.explainers.core.params import ParamError
from kvx.explainers.load_balancer.model import (BY_KEY, MAX_TRACE_REQUESTS, ROUTERS, SHARED, WALKED_TALLIES,
                                                 LoadBalancerParams as P, evaluate, frame_data, frame_requests,
                                                 frame_run, page_data, parse_trace, percentile, replay_cache_blind,
                                                 ring, run, session_turns, simulate, sticky_replica,
                                                 synthetic_records, to_jsonl, workload)
from kvx.explainers.registry import page_json

FOLDER = Path(__file__).parents[2] / "explainers" / "load_balancer"
PAGE = (FOLDER / "page.md").read_text()
SAMPLE = FOLDER / "sample_trace.jsonl"
# The shipped sample: the synthetic trace of these settings, without its session ids.
SAMPLE_PARAMS = dict(sessions=12, turns=3, skew=0.8, seed=7, arrival_rate=8.0, system_prompt=1024, message=512,
                     answer=512)


def line(ts, n_in, ids, session=None, n_out=10) -> str:
    row = {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids}
    if session is not None:
        row["session_id"] = session
    return json.dumps(row)


# Two sessions of two turns on two replicas, 100-token blocks prefilled at 100 tokens/s (1 s a block).
# Block 0 is the shared system prompt. Session 1's second turn arrives before session 0's.
TINY = "\n".join([line(0, 300, [0, 1, 2], 0), line(100, 300, [0, 3, 4], 1),
                  line(2000, 500, [0, 3, 4, 7, 8], 1), line(2100, 500, [0, 1, 2, 5, 6], 0)])
TINY_P = P(trace=TINY, replicas=2, block_size=100, capacity=1_000, prefill_rate=100)


def trace_of(r):
    """(arrival s, request, replica, tokens found in the cache) for every request."""
    return [(round(s.arrival, 6), s.request, s.replica, s.matched) for s in r.served]


def test_tiny_event_traces_by_hand():
    # Round-robin alternates, so each second turn lands where the *other* session's history is: only the
    # system block (100 tokens) is found. Both second turns wait for the first turns to finish (3.0 s, 3.1 s).
    assert trace_of(run(TINY_P, "round_robin")) == [(0.0, 0, 0, 0), (0.1, 1, 1, 0), (2.0, 2, 0, 100), (2.1, 3, 1, 100)]
    # Least-loaded: at 2.0 s replica 0 has 100 tokens left to prefill and replica 1 has 110, so the same split.
    assert trace_of(run(TINY_P, "least_loaded")) == trace_of(run(TINY_P, "round_robin"))
    # crc32 puts both sessions on replica 1: every turn queues behind the others there.
    assert sticky_replica(0, 2) == sticky_replica(1, 2) == 1
    assert trace_of(run(TINY_P, "sticky")) == [(0.0, 0, 1, 0), (0.1, 1, 1, 100), (2.0, 2, 1, 300), (2.1, 3, 1, 300)]
    # Cache-aware (load weight 2): at 2.0 s replica 1 scores 300 − 2 × 110 = 80 against 100 − 2 × 100 = −100;
    # at 2.1 s replica 0 scores 300 − 2 × 90 = 120 against 100 − 2 × 300 = −500.
    assert trace_of(run(TINY_P, "cache_aware")) == [(0.0, 0, 0, 0), (0.1, 1, 1, 0), (2.0, 2, 1, 300), (2.1, 3, 0, 300)]


def test_tiny_times_hit_rates_and_imbalance_by_hand():
    sticky = run(TINY_P, "sticky")
    assert [round(s.start, 6) for s in sticky.served] == [0.0, 3.0, 5.0, 7.0]
    assert [round(s.ttft, 6) for s in sticky.served] == [3.0, 4.9, 5.0, 6.9]
    assert [round(b, 6) for b in sticky.busy] == [0.0, 9.0]
    aware = run(TINY_P, "cache_aware")
    assert [round(s.end, 6) for s in aware.served] == [3.0, 3.1, 5.1, 5.0]
    r = evaluate(TINY_P)
    assert (r["round_robin_hit_rate"], r["sticky_hit_rate"], r["cache_aware_hit_rate"]) == (200 / 1600, 700 / 1600,
                                                                                            600 / 1600)
    assert r["sticky_imbalance"] == 2.0                    # one replica did everything: 9 ÷ 4.5
    assert round(r["cache_aware_imbalance"], 6) == 1.0     # 5 s each
    assert round(r["sticky_ttft_p99_s"], 6) == 6.9 and round(r["cache_aware_ttft_p99_s"], 6) == 3.1


def test_tiny_events_in_order():
    events = simulate(TINY_P, BY_KEY["cache_aware"], with_events=True).events
    assert [(round(t, 6), kind, k, rep) for t, kind, k, rep, _ in events] == [
        (0.0, "arrive", 0, 0), (0.0, "start", 0, 0), (0.1, "arrive", 1, 1), (0.1, "start", 1, 1),
        (2.0, "arrive", 2, 1), (2.1, "arrive", 3, 0), (3.0, "end", 0, 0), (3.0, "start", 3, 0),
        (3.1, "end", 1, 1), (3.1, "start", 2, 1), (5.0, "end", 3, 0), (5.1, "end", 2, 1)]


def test_the_defaults_numbers():
    r = evaluate(P())
    assert (r["requests"], r["sessions"], r["tokens_requested"]) == (64, 16, 318_464)
    got = {k: tuple(round(r[f"{k}_{m}"], 4) for m in ("hit_rate", "ttft_p50_s", "ttft_p99_s", "imbalance"))
           for k in BY_KEY}
    assert got == {"round_robin": (0.5482, 0.6439, 3.2226, 1.1311),
                   "least_loaded": (0.5579, 0.4508, 1.8979, 1.0337),
                   "sticky": (0.7203, 0.2977, 5.5608, 2.8132),
                   "cache_aware": (0.7219, 0.2285, 0.8807, 1.3217)}
    # Llama 3 70B on 2 × H100 SXM: (160 GB − 141.1 GB of BF16 weights − 12 GB) ÷ 327,680 bytes a token.
    assert (r["capacity_tokens"], r["capacity_source"], r["requests_over_cache"]) == (21_057, "derived", 0)
    assert r["capacity_tokens"] == int((2 * 80e9 - 70.55e9 * 2 - 2 * 6e9) // (80 * 8 * 128 * 2 * 2))


def test_the_ordering_the_page_claims():
    r = evaluate(P())
    hit = {k: r[f"{k}_hit_rate"] for k in BY_KEY}
    imb = {k: r[f"{k}_imbalance"] for k in BY_KEY}
    p99 = {k: r[f"{k}_ttft_p99_s"] for k in BY_KEY}
    assert min(hit, key=hit.get) == "round_robin"                     # it throws the prefix cache away
    assert hit["sticky"] > hit["least_loaded"] + 0.1                  # sticky keeps it...
    assert max(imb, key=imb.get) == "sticky" and max(p99, key=p99.get) == "sticky"   # ...but overloads a replica
    assert hit["cache_aware"] >= hit["sticky"] - 0.02                 # cache-aware: sticky's hit rate
    assert imb["cache_aware"] < 1.5 < imb["sticky"]                   # with far less imbalance than sticky
    assert min(p99, key=p99.get) == "cache_aware"
    sticky_run = run(P(), "sticky")
    assert sticky_run.evicted_blocks == (0, 99, 0, 0)                  # only the hot replica evicts
    assert session_turns(16, 4, 1.0)[0] == 15


def test_the_pages_figures():
    def fig(**values):
        r = evaluate(P(**values))
        return {k: (round(r[f"{k}_hit_rate"] * 100, 1), round(r[f"{k}_ttft_p99_s"], 2), round(r[f"{k}_imbalance"], 2))
                for k in BY_KEY}
    assert fig() == {"round_robin": (54.8, 3.22, 1.13), "least_loaded": (55.8, 1.9, 1.03),
                     "sticky": (72.0, 5.56, 2.81), "cache_aware": (72.2, 0.88, 1.32)}
    assert [round(b, 2) for b in evaluate(P())["sticky_busy_s"]] == [1.16, 9.77, 2.06, 0.91]
    assert fig(skew=0)["sticky"] == (72.3, 0.53, 1.45) and fig(skew=0)["cache_aware"] == (66.1, 0.65, 1.11)
    assert fig(skew=0)["round_robin"][0] == 50.4
    assert fig(load_weight=0)["cache_aware"] == (68.3, 11.0, 4.0)
    assert fig(load_weight=100)["cache_aware"][::2] == (59.2, 1.09)
    assert fig(gpus_per_replica=4)["sticky"][::2] == (80.1, 2.32) and fig(gpus_per_replica=4)["cache_aware"] == \
        (78.6, 0.27, 1.61)
    assert round(evaluate(P())["unlimited_cache_hit_rate"] * 100, 1) == 81.5
    for query in re.findall(r"\]\(\?([^)]*)\)", PAGE):
        P.from_mapping(dict(parse_qsl(query)))


def test_one_replica_with_room_for_everything_by_hand():
    """Each session's 4 prompts are 2,048 + 1,024 t tokens (14,336); with its history cached a session
    computes 2,048 + 3 × 1,024 of them, and the very first request also computes the system prompt."""
    r = evaluate(P(replicas=1, skew=0, capacity=1_000_000))
    for k in BY_KEY:
        assert r[f"{k}_hit_rate"] == (16 * 10_752 - 1_536) / (16 * 14_336)


def test_synthetic_trace_is_mooncake_shaped_and_chained():
    p = P()
    recs = synthetic_records(p)
    assert set(recs[0]) == {"timestamp", "input_length", "output_length", "hash_ids", "session_id"}
    assert [r["timestamp"] for r in recs] == sorted(r["timestamp"] for r in recs)
    by_session = collections.defaultdict(list)
    for r in recs:
        assert len(r["hash_ids"]) == -(-r["input_length"] // 512)
        by_session[r["session_id"]].append(r)
    for turns in by_session.values():
        for a, b in zip(turns, turns[1:]):                 # each turn repeats the previous prompt
            assert b["hash_ids"][:len(a["hash_ids"])] == a["hash_ids"]
    firsts = [t[0]["hash_ids"] for t in by_session.values()]
    assert all(ids[:3] == [0, 1, 2] for ids in firsts) and len({ids[3] for ids in firsts}) == len(firsts)
    owners = workload(p).owners
    assert owners[0] == owners[2] == SHARED and owners[firsts[0][3]] != SHARED
    # the replay takes the synthetic ids as chained without counting: every id always follows the same id
    for q in (p, P(block_size=100, message=150, answer=0, system_prompt=7), P(block_size=4_096, sessions=3, turns=9)):
        assert workload(q).chained and traces.chained(workload(q).requests)


def test_shipped_sample_is_the_synthetic_trace_without_sessions():
    recs = synthetic_records(P(**SAMPLE_PARAMS))
    for r in recs:
        del r["session_id"]
    assert SAMPLE.read_text() == to_jsonl(recs)
    w = workload(P(trace=SAMPLE.read_text()))
    assert w.uploaded and not w.sessions_given and len(w.requests) == 36


def partition(labels):
    groups = collections.defaultdict(list)
    for i, x in enumerate(labels):
        groups[x].append(i)
    return sorted(groups.values())


@pytest.mark.parametrize("values", [{}, {"system_prompt": 1000, "message": 300, "answer": 200}, {"system_prompt": 0},
                                    SAMPLE_PARAMS])
def test_sessions_are_inferred_from_hash_ids(values):
    recs = synthetic_records(P(**values))
    given = [r.pop("session_id") for r in recs]
    w = workload(P(trace=to_jsonl(recs), **values))
    assert partition([q.session for q in w.requests]) == partition(given)


def test_an_uploaded_trace_equals_the_synthetic_one():
    text = to_jsonl(synthetic_records(P()))
    up, syn = evaluate(P(trace=text)), evaluate(P())
    assert up["trace"] == "uploaded" and syn["trace"] == "synthetic"
    assert {k: v for k, v in up.items() if k != "trace"} == {k: v for k, v in syn.items() if k != "trace"}


# ---- parsing: each kind of bad line names its line and field --------------------------------------------
GOOD = line(0, 1000, [0, 1])


@pytest.mark.parametrize("bad, message", [
    ("not json", "The trace's line 2: is not JSON"),
    ("[1, 2]", "The trace's line 2: must be a JSON object"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1}', "The trace's line 2: hash_ids is missing."),
    (line(-1, 1000, [0, 1]), "The trace's line 2: timestamp must be a number of milliseconds ≥ 0; got -1."),
    (line("soon", 1000, [0, 1]), 'timestamp must be a number of milliseconds ≥ 0; got "soon".'),
    (line(0, 0, [0]), "The trace's line 2: input_length must be a whole number ≥ 1; got 0."),
    (line(0, 10.5, [0]), "input_length must be a whole number ≥ 1; got 10.5."),
    (line(0, 1000, [0, 1], n_out=-3), "The trace's line 2: output_length must be a whole number ≥ 0; got -3."),
    (line(0, 1000, []), "The trace's line 2: hash_ids must be a non-empty list of block ids; got []."),
    (line(0, 1000, [0, "x"]), 'The trace\'s line 2: hash_ids must be a whole number ≥ 0; got "x".'),
    (line(0, 1000, [0, 1, 2, 3]), "The trace's line 2: hash_ids has 4 blocks, but input_length 1,000 at 512 tokens "
                                  "per block needs 2 (or 1); set block_size to the trace's block size."),
    (line(0, 1000, [0, 1], session=[1]), "The trace's line 2: session_id must be a string or a whole number; got [1]."),
])
def test_bad_lines_name_the_line_and_field(bad, message):
    with pytest.raises(ParamError) as err:
        P(trace=GOOD + "\n" + bad + "\n")
    assert err.value.field == "trace" and message in str(err.value)
    assert "Traceback" not in str(err.value)


def test_trace_limits():
    # Here (the CLI and the API): 100,000 requests, 50 MB, 5,000,000 hash ids; each refusal is one sentence.
    assert (MAX_TRACE_REQUESTS, traces.CPYTHON.bytes, traces.CPYTHON.blocks) == (100_000, 50_000_000, 5_000_000)
    with pytest.raises(ParamError, match=r"^A trace may hold at most 100,000 requests; line 100,001 is one more "
                                         r"\(keep its first lines: "
                                         r"head -n 100000\)\.$"):
        P(trace="\n".join([GOOD] * (MAX_TRACE_REQUESTS + 1)))
    with pytest.raises(ParamError, match=r"^A trace may hold at most 50,000,000 bytes; this one passes that at "
                                         r"line 2\.$"):
        P(trace=GOOD + "\n" + " " * 50_000_000)
    small = traces.Limits(requests=3, bytes=10_000, blocks=5, where=" in the browser (use `kvx run` for more)")
    with pytest.raises(ParamError, match=r"at most 3 requests in the browser \(use `kvx run` for more\); line 4 is"):
        traces.read_trace([line(0, 512, [0])] * 4, 512, small)
    with pytest.raises(ParamError, match=r"at most 5 hash ids in all in the browser .*; line 3 passes that, so "
                                         r"keep its first 2 lines\.$"):
        traces.read_trace([GOOD, GOOD, GOOD], 512, small)
    assert traces.limits() is traces.CPYTHON                    # Pyodide reports sys.platform "emscripten"
    with pytest.raises(ParamError, match="holds no requests"):
        P(trace="\n\n")
    # Blank lines are skipped, lines out of time order are sorted, unknown fields are ignored.
    extra = json.dumps({"timestamp": 500, "input_length": 600, "output_length": 1, "hash_ids": [0, 1], "note": "x"})
    reqs = workload(P(trace="\n".join(["", extra, line(100, 600, [0, 2])]))).requests
    assert [q.arrival for q in reqs] == [0.1, 0.5]
    assert parse_trace(line(0, 1024, [0, 1]), 512)[0]["hash_ids"] == (0, 1)


def test_bad_parameters_are_one_sentence():
    with pytest.raises(ParamError, match="capacity must hold at least one block of 512 tokens; got 100."):
        P(capacity=100)
    with pytest.raises(ParamError, match="replicas must be between 1 and 16 replicas; got 0."):
        P(replicas=0)


def test_page_json_takes_an_uploaded_trace():
    ok = json.loads(page_json("load-balancer", json.dumps({"_trace": SAMPLE.read_text(), "replicas": "3"})))
    assert ok["ok"] and ok["params"]["replicas"] == 3 and "trace" not in ok["params"]
    want = page_data(P(trace=SAMPLE.read_text(), replicas=3))
    assert ok["data"]["sources"]["running"] == json.loads(json.dumps(want["sources"]["running"]))
    assert ok["data"]["texts"]["trace"].startswith("Replaying the uploaded trace: 36 requests")
    bad = json.loads(page_json("load-balancer", json.dumps({"_trace": "oops"})))
    assert bad == {"ok": False, "field": "trace", "message": "The trace's line 1: is not JSON (Expecting value)."}
    frame = json.loads(page_json("load-balancer", json.dumps({"_trace": SAMPLE.read_text(), "_frame": 5})))
    assert frame["ok"] and frame["data"]["animation"]["frame"] == 5


def kvx(*args):
    return subprocess.run([sys.executable, "-m", "kvx.compute.cli", *args], capture_output=True, text=True)


def test_cli_replays_a_trace_file(tmp_path):
    out = kvx("run", "load-balancer", "replicas=3", "--trace", str(SAMPLE), "--json")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    want = evaluate(P(trace=SAMPLE.read_text(), replicas=3))
    assert body["trace"] == "uploaded" and body["requests"] == 36
    assert body["cache_aware_hit_rate"] == want["cache_aware_hit_rate"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(GOOD + "\n" + line(0, 1000, [0, 1], n_out=-3) + "\n")
    out = kvx("run", "load-balancer", "--trace", str(bad))
    assert out.returncode == 2
    assert out.stderr.strip() == "kvx: The trace's line 2: output_length must be a whole number ≥ 0; got -3."
    out = kvx("run", "load-balancer", "--trace", str(tmp_path / "missing.jsonl"))
    assert out.returncode == 2 and "cannot read the trace" in out.stderr
    out = kvx("run", "paging", "--trace", str(SAMPLE))
    assert out.returncode == 2 and out.stderr.strip() == "kvx: paging takes no trace file."


# ---- invariants over random workloads -------------------------------------------------------------------
params = st.builds(P, replicas=st.integers(1, 5), sessions=st.integers(1, 8), turns=st.integers(1, 4),
                   system_prompt=st.integers(0, 1_500), message=st.integers(1, 700), answer=st.integers(0, 700),
                   arrival_rate=st.floats(0.5, 50), skew=st.floats(0, 2), capacity=st.integers(512, 8_000),
                   prefill_rate=st.integers(1_000, 50_000), load_weight=st.floats(0, 5),
                   block_size=st.sampled_from([16, 128, 512]), seed=st.integers(0, 100))


@settings(max_examples=40, deadline=None)
@given(params, st.data())
def test_a_few_snapshots_count_their_tallies_as_the_running_tally_does(p, data):
    """A replay that snapshots a few arrivals counts each snapshot's by-session tally from its tree
    (WALKED_TALLIES); one that snapshots many keeps a running tally. They must agree, and the rest of the replay
    must not depend on which; nor on a snapshot taken only where the longest queue is first at its highest."""
    n = len(workload(p).requests)
    assume(n > WALKED_TALLIES)
    few = frozenset(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3)))
    for router in ROUTERS:
        many, walked = simulate(p, router, frozenset(range(n))), simulate(p, router, few)
        assert {k: many.snapshots[k] for k in few} == walked.snapshots
        assert (many.served, many.busy, many.queue_at_arrival, many.evicted_blocks) == \
            (walked.served, walked.busy, walked.queue_at_arrival, walked.evicted_blocks)
        peaks = simulate(p, router, peaks_at=frozenset(range(n)))      # a snapshot where the queue is longest first
        top = many.queue_at_arrival.index(max(many.queue_at_arrival))
        assert peaks.snapshots == {top: many.snapshots[top]}


@settings(max_examples=40, deadline=None)
@given(params)
def test_synthetic_workload_is_what_its_records_read_as(p):
    """The synthetic workload is built straight from its generator; read back from its Mooncake-format records
    as an uploaded trace with session ids is read (traces.with_sessions), it is the same requests, owners and
    unlimited-cache hits."""
    recs = synthetic_records(p)
    requests, owners, given = traces.with_sessions([dict(r, hash_ids=tuple(r["hash_ids"])) for r in recs],
                                                   p.block_size)
    w = workload(p)
    assert (w.requests, w.owners, w.sessions_given) == (requests, owners, given)
    assert (w.unlimited_found, w.prompt_tokens) == traces.unlimited_cache_hits(recs, p.block_size)


def _same_replay(blind, simulated) -> None:
    assert blind.served == simulated.served
    assert (blind.busy, blind.queue_at_arrival, blind.evicted_blocks) == \
        (simulated.busy, simulated.queue_at_arrival, simulated.evicted_blocks)
    assert blind.snapshots == simulated.snapshots


def _cache_blind_routers_agree(p, some: frozenset) -> None:
    """Both cache-blind routers, replayed both ways: snapshots at `some` arrivals, then where the queue peaks."""
    every = frozenset(range(len(workload(p).requests)))
    for key in ("round_robin", "sticky"):
        router = BY_KEY[key]
        _same_replay(replay_cache_blind(p, router, some), simulate(p, router, some))
        _same_replay(replay_cache_blind(p, router, peaks_at=every), simulate(p, router, peaks_at=every))


@settings(max_examples=60, deadline=None)
@given(params, st.data())
def test_cache_blind_replay_is_the_simulation(p, data):
    """Round-robin and sticky replay each replica on its own (replay_cache_blind, what the page runs); the
    event-driven simulation is the reference: the same requests served at the same times with the same hits, the
    same longest queues and the same snapshots, taken at given arrivals or where the queue peaks anew."""
    some = frozenset(data.draw(st.lists(st.integers(0, len(workload(p).requests) - 1), max_size=12)))
    _cache_blind_routers_agree(p, some)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 0, 1, 5, 300]), st.integers(0, 3), st.integers(0, 2)),
                min_size=1, max_size=40),
       st.integers(1, 4), st.sampled_from([16, 48, 100, 1_000]), st.sampled_from([None, 1, 100]), st.data())
def test_cache_blind_replay_is_the_simulation_on_ties_and_prompts_found_whole(rows, replicas, capacity, rate,
                                                                            data):
    """Uploaded traces where requests arrive together and repeat a prompt already cached whole, so a prefill can
    take no time at all (flat prefill rate): the order of equal times is where the two replays could part."""
    prompts = [[0, 1, 2], [0, 1, 2, 3], [7, 8], [0, 1]]
    t, text = 0, []
    for gap, which, short in rows:
        t += gap
        ids = prompts[which]
        text.append(line(t, len(ids) * 16 - short, ids))
    p = P(trace="\n".join(text), block_size=16, replicas=replicas, capacity=capacity, prefill_rate=rate)
    some = frozenset(data.draw(st.lists(st.integers(0, len(workload(p).requests) - 1), max_size=8)))
    _cache_blind_routers_agree(p, some)


def test_a_prompt_found_whole_takes_no_time_and_both_replays_agree():
    """The case the strategy above is for, pinned: the same prompt twice at the same moment on one replica, the
    second found whole once the first is stored (0 s of prefill at a flat rate), a third arriving as it ends."""
    text = "\n".join([line(0, 48, [0, 1, 2]), line(3000, 48, [0, 1, 2]), line(3000, 48, [0, 1, 2]),
                      line(3000, 32, [0, 1])])
    p = P(trace=text, block_size=16, replicas=1, capacity=100, prefill_rate=16)
    r = simulate(p, BY_KEY["round_robin"], frozenset(range(4)))
    assert [(s.start, s.end, s.matched) for s in r.served] == [(0, 3, 0), (3, 3, 48), (3, 3, 48), (3, 3, 32)]
    assert r.queue_at_arrival == (1, 1, 1, 1)          # a whole hit is in its queue as its own arrival is counted,
    #                                                    and gone by the next one's, at the same moment
    _same_replay(replay_cache_blind(p, BY_KEY["round_robin"], frozenset(range(4))), r)


def test_the_page_opens_on_the_frame_a_full_replay_draws():
    """A change replays three routers with one snapshot (the opening frame's); scrubbing the animation replays
    them with all. The opening frame must be the same drawn either way, and other frames must still come."""
    p = P(sessions=24, seed=3)
    opening = page_data(p)
    f = opening["animation"]["frame"]
    stops = frame_requests(len(workload(p).requests))
    assert all(list(run(p, r.key).snapshots) == [stops[f]] for r in ROUTERS)
    queues = run(p, "sticky").queue_at_arrival                # sticky's: the first frame at its longest queue
    assert stops[f] == next(x for x in stops if queues[x] == max(queues[y] for y in stops))
    g = f - 1 if f else f + 1                        # a frame the change did not snapshot: full replays
    other = frame_data(p, g)
    assert other["animation"]["frame"] == g and other["sources"]["cache"]["x0"]
    for r in ROUTERS:                                # and those full replays hold the same opening frame
        assert frame_run(p, r.key, stops[g]).snapshots[stops[f]] == run(p, r.key).snapshots[stops[f]]


@settings(max_examples=60, deadline=None)
@given(params)
def test_simulation_invariants(p):
    w = workload(p)
    n = len(w.requests)
    for router in ROUTERS:
        r = simulate(p, router, frozenset(range(n)), with_events=True)
        assert [s.request for s in r.served] == list(range(n))            # every request served exactly once
        for snap in r.snapshots.values():                                 # the by-session tally adds up
            for rep in snap:
                assert sum(blocks for _, blocks in rep.cache) == rep.size <= p.capacity // p.block_size
                assert all(blocks > 0 for _, blocks in rep.cache)
        kinds = collections.Counter((kind, k) for _, kind, k, _, _ in r.events)
        assert all(kinds[(kind, k)] == 1 for kind in ("arrive", "start", "end") for k in range(n))
        times = [e[0] for e in r.events]
        assert times == sorted(times)                                     # time never runs backwards
        assert all(e[4] <= p.capacity // p.block_size for e in r.events)  # no cache over capacity, ever
        for s in r.served:
            q = w.requests[s.request]
            assert s.matched + s.computed == q.input_length and 0 <= s.matched
            assert q.arrival <= s.start <= s.end
        for rep in range(p.replicas):                                     # FIFO, one prefill at a time
            arrived = [k for _, kind, k, x, _ in r.events if kind == "arrive" and x == rep]
            started = [k for _, kind, k, x, _ in r.events if kind == "start" and x == rep]
            assert arrived == started
            mine = sorted((s for s in r.served if s.replica == rep), key=lambda s: s.start)
            assert all(a.end <= b.start + 1e-12 for a, b in zip(mine, mine[1:]))
        assert sum(r.busy) == pytest.approx(sum(s.computed for s in r.served) / p.prefill_rate)
    out = evaluate(p)
    for router in ROUTERS:
        assert 0 <= out[f"{router.key}_hit_rate"] <= 1
        assert out[f"{router.key}_imbalance"] >= 1 - 1e-12
        assert out[f"{router.key}_ttft_p50_s"] <= out[f"{router.key}_ttft_p99_s"]


@settings(max_examples=60, deadline=None)
@given(params)
def test_chained_ids_are_read_off_the_queue_with_the_same_outcome(p):
    """With chained ids a replica finds what it holds or has on its way by bisection over the prompt's ids (in its
    set of cached ids, or in a prompt sent here and not yet stored); walking its tree and counting every block
    of every prompt routed in and out (what any other trace gets) decides the same, run for run."""
    import dataclasses
    from kvx.explainers.load_balancer import model
    w = workload(p)
    assert w.chained
    frames = frozenset(frame_requests(len(w.requests)))
    queue_read = {r.key: simulate(p, r, frames, with_events=True) for r in ROUTERS}
    original = model.workload
    model.workload = lambda q: dataclasses.replace(original(q), chained=False)
    try:
        counted = {r.key: simulate(p, r, frames, with_events=True) for r in ROUTERS}
    finally:
        model.workload = original
    assert queue_read == counted


class LockingTree(RadixTree):
    """The replay as SGLang runs a request: its matched path is locked from the moment its prefill starts
    (inc_lock_ref) until its prompt is stored and the lock is let go (dec_lock_ref)."""

    def match(self, tokens):
        matched, path = super().match(tokens)
        self.lock(path, +1)
        return matched, path

    def store_matched(self, tokens, matched, path):
        out = super().store_matched(tokens, matched, path)
        self.lock(path, -1)
        return out


@settings(max_examples=60, deadline=None)
@given(params, st.booleans())
def test_replay_without_locks_is_the_replay_with_them(p, uploaded):
    """simulate takes no lock on a running prefill's path (a replica runs one at a time, so only read-only
    peeks come in between): every run, event, snapshot and score is what locking gives, for the synthetic
    trace and for an uploaded one (the shipped sample, its sessions inferred from its hash ids)."""
    from kvx.explainers.load_balancer import model
    if uploaded:
        p = P(trace=SAMPLE.read_text(), replicas=p.replicas, capacity=p.capacity, prefill_rate=p.prefill_rate,
              load_weight=p.load_weight)
    frames = frozenset(frame_requests(len(workload(p).requests)))
    plain = {r.key: simulate(p, r, frames, with_events=True) for r in ROUTERS}
    original, model.RadixTree = model.RadixTree, LockingTree
    try:
        locking = {r.key: simulate(p, r, frames, with_events=True) for r in ROUTERS}
    finally:
        model.RadixTree = original
    assert plain == locking


def test_chained_ids_by_hand():
    req = lambda *ids: traces.Request(0, 0.0, 100 * len(ids), 1, ids, 0, 0)
    assert traces.chained([req(0, 1, 2), req(0, 1, 3), req(4, 5)])
    assert not traces.chained([req(0, 1, 2), req(3, 1)])        # id 1 after 0 and after 3
    assert not traces.chained([req(0, 1), req(1, 2)])           # id 1 opens one prompt and follows 0 in another
    assert not traces.chained([req(0, 0)])


@settings(max_examples=25, deadline=None)
@given(params, st.integers(0, 300))
def test_frames_show_the_state_the_run_recorded(p, f):
    frames = frame_requests(len(workload(p).requests))
    d = frame_data(p, f)
    k = frames[d["animation"]["frame"]]
    assert d["animation"]["frames"] == len(frames) and f"request {k} " in d["animation"]["caption"]
    cap = p.capacity // p.block_size * p.block_size
    per_lane = collections.Counter()
    for x0, x1, y in zip(d["sources"]["cache"]["x0"], d["sources"]["cache"]["x1"], d["sources"]["cache"]["y"]):
        per_lane[y] += x1 - x0
    assert all(v <= cap for v in per_lane.values())
    assert d["sources"]["here"]["y"] == [-(g * (p.replicas + 1) + run(p, key).served[k].replica)
                                         for g, key in enumerate(BY_KEY)]


def test_routers_are_one_family():
    assert [r.key for r in ROUTERS] == ["round_robin", "least_loaded", "sticky", "cache_aware"]
    assert len(set(ROUTERS)) == 4
    hashes, owners = ring(4)
    assert len(hashes) == 4 * 64 and hashes == tuple(sorted(hashes)) and set(owners) == {0, 1, 2, 3}
    assert percentile([3, 1, 2, 4], 0.5) == 2 and percentile(list(range(1, 65)), 0.99) == 64


def test_a_frame_is_quick_and_the_page_opens_on_stickys_busiest_moment():
    d = page_data(P())
    assert d["animation"]["mode"] == "on_demand" and d["animation"]["frames"] == 64
    k = frame_requests(64)[d["animation"]["frame"]]
    queues = run(P(), "sticky").queue_at_arrival
    assert queues[k] == max(queues)
    assert len(d["formula"]) >= 3 and d["formula"][-1]["name"].startswith("Cache-aware score")


# ---- traces at real scale: streamed, checked, and what an unlimited cache would reuse ---------------------
def test_a_trace_is_read_line_by_line(tmp_path):
    text = traces.to_jsonl(traces.conversation_like(200, seed=3))
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    with path.open() as f:
        assert traces.read_trace(f) == parse_trace(text)

    def lines():                                  # a bad line stops the reading there: nothing after it is read
        yield GOOD
        yield line(0, 0, [0])
        raise AssertionError("read past the bad line")
    with pytest.raises(ParamError, match=r"^The trace's line 2: input_length must be a whole number ≥ 1; got 0\.$"):
        traces.read_trace(lines())


def test_unlimited_cache_hits_by_hand():
    recs = [{"timestamp": 5, "input_length": 1000, "hash_ids": (0, 1)},
            {"timestamp": 0, "input_length": 1500, "hash_ids": (0, 2, 3)},
            {"timestamp": 9, "input_length": 700, "hash_ids": (0, 2)}]
    # In time order: [0, 2, 3] finds nothing; [0, 1] finds block 0 (512 tokens); [0, 2] finds both, capped at 700.
    assert traces.unlimited_cache_hits(recs, 512) == (512 + 700, 3_200)


def big_trace() -> str:
    """The fixture: a conversation-shaped trace past the old limits (5,000 requests, 2,000,000 bytes)."""
    return traces.to_jsonl(traces.conversation_like(8_500, seed=1))


def test_the_big_fixture_is_past_the_old_limits_and_deterministic():
    text = big_trace()
    assert text == big_trace() and text.count("\n") == 8_500 and len(text.encode()) > 2_000_000
    recs = parse_trace(text)
    assert len(recs) == 8_500 and all(len(r["hash_ids"]) == -(-r["input_length"] // 512) for r in recs)


def test_the_big_fixture_through_the_cli(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text(big_trace())
    out = kvx("run", "load-balancer", "gpus_per_replica=4", "--trace", str(path), "--json")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    want = evaluate(P(trace=big_trace(), gpus_per_replica=4))
    assert body["requests"] == 8_500 and body["trace"] == "uploaded"
    assert {k: body[k] for k in want} == json.loads(json.dumps(want))
    assert 0 < body["cache_aware_hit_rate"] <= body["unlimited_cache_hit_rate"] < 1


def test_the_big_fixture_through_the_api(tmp_path):
    """The API takes a trace as a JSON string field past the general 64 KiB body limit (its own 64 MiB), keys
    jobs and answers by its digest, and answers what the model answers; a body past the limit is a 413 and a
    bad line a 422 naming the line, each one sentence."""
    from fastapi.testclient import TestClient

    from kvx.compute.app import create_app
    from kvx.compute.settings import Settings
    client = TestClient(create_app(Settings(site_dir=tmp_path)))
    url = "/api/v1/explainers/load-balancer"
    r = client.post(url, json={"trace": big_trace(), "gpus_per_replica": 4})
    assert r.status_code == 200, r.text
    want = json.loads(json.dumps(evaluate(P(trace=big_trace(), gpus_per_replica=4))))
    assert {k: r.json()[k] for k in want} == want and r.json()["requests"] == 8_500
    again = client.post(url, json={"trace": big_trace(), "gpus_per_replica": 4})     # the cached answer
    assert again.status_code == 200 and again.json() == r.json()
    bad = client.post(url, json={"trace": GOOD + "\n" + line(0, 1000, [0, 1], n_out=-3)})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["msg"] == "The trace's line 2: output_length must be a whole number ≥ 0; got -3."
    assert bad.json()["detail"][0]["loc"] == ["body", "trace"]
    small = TestClient(create_app(Settings(site_dir=tmp_path, max_trace_body_bytes=1_000_000)))
    big = small.post(url, json={"trace": big_trace()})
    assert big.status_code == 413 and big.json()["detail"].startswith("The request body may be at most 1000000 bytes")
    other = small.post("/api/v1/explainers/cache-renting", content=b"{" + b" " * 70_000 + b"}",
                       headers={"content-type": "application/json"})
    assert other.status_code == 413                       # the other routes keep the general limit
    assert small.post("/api/v1/explainers/paging", json={"trace": "x"}).status_code == 422   # no trace there


MOONCAKE = Path(os.environ.get("KVX_MOONCAKE_TRACES", "/nonexistent"))   # FAST25-release/traces of kvcache-ai/Mooncake


@pytest.mark.skipif(not (MOONCAKE / "conversation_trace.jsonl").exists(),
                    reason="set KVX_MOONCAKE_TRACES to the released traces (not shipped: 3 MB)")
def test_the_released_conversation_trace_against_the_paper():
    """Mooncake (FAST '25) Table 2 gives a cache ratio of 40% for its conversation trace and 66% for its synthetic
    one; an unlimited cache here finds 37.4% and 65.1% of their prompt tokens (sessions and time order as given)."""
    text = (MOONCAKE / "conversation_trace.jsonl").read_text()
    r = evaluate(P(trace=text, gpus_per_replica=8))
    assert (r["requests"], round(r["unlimited_cache_hit_rate"], 3)) == (12_031, 0.374)
    assert abs(r["unlimited_cache_hit_rate"] - 0.40) < 0.03
    assert {k: round(r[f"{k}_hit_rate"], 3) for k in BY_KEY} == {"round_robin": 0.094, "least_loaded": 0.091,
                                                                  "sticky": 0.193, "cache_aware": 0.172}
    assert evaluate(P(trace=text))["requests_over_cache"] == 1_861          # of prompts up to 126,195 tokens
    synthetic = traces.parse_trace((MOONCAKE / "synthetic_trace.jsonl").read_text())
    found, total = traces.unlimited_cache_hits(synthetic)
    assert round(found / total, 3) == 0.651 and abs(found / total - 0.66) < 0.03
