"""paging: the allocators' invariants under hypothesis, exact small traces, parity with nano-vllm's block
accounting (a test-only transcription of its rules), the fast path against plain stepping, and the paper's figure."""
from __future__ import annotations

import collections
import dataclasses
import json
import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.core.params import ParamError
from kvx.explainers.paging import model
from kvx.explainers.paging.model import (MAX_STEPS, PagedAllocator, PagingParams as P, Request, ReserveAllocator,
                                         Simulation, busiest_frame, evaluate, frame_data, frame_steps, page_data,
                                         state_at, workload)

PAGE = (Path(__file__).parents[2] / "explainers" / "paging" / "page.md").read_text()


def check_invariants(sim: Simulation) -> None:
    p = sim.p
    if sim.kind == "paged":
        owned = [b for table in sim.alloc.tables.values() for b in table]
        assert len(owned) == len(set(owned)), "a block is in two block tables"
        assert not set(owned) & set(sim.alloc.free_blocks), "a block is both owned and free"
        assert len(owned) + len(sim.alloc.free_blocks) == p.memory_slots // p.block_size
        assert set(sim.alloc.tables) == {r.id for r in sim.running}
        for r in sim.running:
            assert len(sim.alloc.tables[r.id]) == -(-sim.stored(r) // p.block_size), "blocks are not on demand"
    else:
        chunks = sorted(sim.alloc.chunks.values())
        for (s1, n1), (s2, _) in zip(chunks, chunks[1:]):
            assert s1 + n1 <= s2, "two reservations overlap"
        for r in sim.running:
            assert sim.stored(r) <= sim.alloc.chunks[r.id][1]
    assert sim.alloc.reserved() <= p.memory_slots, "memory oversubscribed"
    assert sim.stored_total == sum(sim.stored(r) for r in sim.running) <= sim.alloc.reserved()
    for r in sim.running:     # a running request stores every token it has except the one it sampled last
        assert sim.stored(r) == r.prompt + sim.generated[r.id] - 1


def valid(**kw):
    try:
        return P(**kw)
    except ParamError:
        return None


params = st.builds(valid, requests=st.integers(2, 25), prompt_mean=st.integers(1, 400),
                   output_mean=st.integers(1, 400), max_len=st.sampled_from([64, 256, 1024]),
                   block_size=st.sampled_from([1, 4, 16, 64]), memory_slots=st.sampled_from([1024, 2048, 4096]),
                   arrival_gap=st.integers(0, 10), reserve=st.sampled_from(["max", "pow2", "oracle"]),
                   on_full=st.sampled_from(["recompute", "swap", "wait"]), seed=st.integers(0, 100)).filter(bool)


@settings(max_examples=60, deadline=None)
@given(params)
def test_allocator_invariants_every_step_and_every_token_stored_once(p):
    for kind in ("reserve", "paged"):
        sim = Simulation(p, kind)
        while not sim.finished:
            sim.step()
            check_invariants(sim)
            assert sim.now < 20_000, "the run does not finish"
        # Every request finished, having sampled exactly its output (preempted tokens are recomputed or
        # swapped back, never sampled twice), and left no memory behind.
        assert all(sim.generated[r.id] == r.output for r in sim.reqs)
        assert sim.alloc.reserved() == 0 and sim.stored_total == 0
        if p.on_full != "swap" or kind == "reserve":
            assert sim.swapped == 0
        if p.on_full == "wait" or kind == "reserve":
            assert sim.preemptions == 0 and sim.recomputed == 0


@settings(max_examples=40, deadline=None)
@given(params)
def test_paged_waste_is_under_one_block_per_request(p):
    r = evaluate(p)
    assert r["paged"]["max_waste_per_request_slots"] < p.block_size
    for kind in ("reserve", "paged"):
        for share in (r[kind]["token_state_share_busy"], r[kind]["token_state_share_of_allocated"]):
            assert share is None or 0 <= share <= 1
        assert (r[kind]["token_state_share_busy"] is None) == (r[kind]["steps_memory_short"] == 0)


def test_workload_is_seeded_and_bounded():
    a = workload(P())
    fields = [dataclasses.astuple(r) for r in a]       # requests compare by identity; their fields by value
    assert fields == [dataclasses.astuple(r) for r in workload(P())]
    assert fields != [dataclasses.astuple(r) for r in workload(P(seed=1))]
    assert all(1 <= r.prompt and 1 <= r.output and r.total <= 2048 for r in a)


def test_allocators_by_hand():
    """Blocks of 8 in a memory of 64 slots (8 blocks); two requests with 30-token prompts."""
    p = P(requests=2, max_len=64, block_size=8, memory_slots=64, arrival_gap=0, reserve="oracle")
    reqs = [Request(0, 0, 30, 4), Request(1, 0, 30, 2)]
    paged = PagedAllocator(p)
    assert paged.fits(reqs[0], 30, 0) == 0
    paged.admit(reqs[0], 30, 0)
    assert paged.tables[0] == [0, 1, 2, 3]                                # ceil(30/8) = 4 blocks
    assert paged.fits(reqs[1], 30, 1) == 0                                # 4 more fit: no watermark (nano-vllm)
    assert paged.append(reqs[0], 31) and len(paged.tables[0]) == 4        # the 32nd token still fits in 4 blocks
    assert paged.append(reqs[0], 32) and paged.tables[0] == [0, 1, 2, 3, 4]   # the 33rd takes a fifth
    paged.release(reqs[0])
    assert list(paged.free_blocks) == [5, 6, 7, 4, 3, 2, 1, 0]            # freed to the back, last block first
    reserve = ReserveAllocator(p)
    reserve.admit(reqs[0], 30, 0)
    assert reserve.chunks[0] == (0, 34)                                   # oracle: prompt + output
    assert reserve.fits(reqs[1], 30, 1) is None                           # 32 more slots do not fit in 30
    assert ReserveAllocator(P(requests=2, max_len=64, memory_slots=64)).fits(reqs[0], 30, 0) == 0   # max: 64


def tiny(**values) -> P:
    """Parameters for a hand-sized memory, below the page's bounds (64 slots at least): only tests build these."""
    p = object.__new__(P)
    for field in dataclasses.fields(P):
        object.__setattr__(p, field.name, values.get(field.name, field.default))
    return p


def trace(p: P, reqs: list[Request], kind: str = "paged") -> Simulation:
    sim = Simulation(p, kind, record=True, reqs=reqs)
    while not sim.finished:
        sim.step()
    return sim


def test_exact_trace_no_preemption():
    """Blocks of 4, 4 blocks. A: 5-token prompt, 4 out; B: 3 in, 6 out; both at step 0.
    Step 0 prefills both (A 2 blocks, B 1) and samples a token each. Decode steps then write the token sampled
    the step before: B's 4th token fills its block, so its 5th (step 2) takes block 3. A's 4th token is sampled
    in step 3 and never stored: A ends holding 8 tokens and frees blocks 1, 0 (last first); B ends in step 5."""
    p = tiny(requests=2, max_len=16, block_size=4, memory_slots=16, arrival_gap=0)
    sim = trace(p, [Request(0, 0, 5, 4), Request(1, 0, 3, 6)])
    assert sim.cols["stored"] == [8, 10, 12, 6, 7, 0]
    assert sim.cols["in_use"] == [12, 12, 16, 8, 8, 0]
    assert sim.cols["running"] == [2, 2, 2, 1, 1, 0]
    assert sim.cols["short"] == [False] * 6
    assert list(sim.alloc.free_blocks) == [1, 0, 3, 2]


def test_exact_trace_preemption_re_finds_its_own_cached_block():
    """Blocks of 2, 4 blocks; A and B each 2 in, 5 out, at step 0 (hand-derived, nano-vllm's rules).
    0: prefill A→[0], B→[1]. 1: both cross into a second block (A 2, B 3). 2: both fill it.
    3: A needs a fifth block: none free, so B (the latest) is preempted; B's blocks go back [3, 1] and A takes 3,
       which held B's second block: only B's first block (in 1) stays cached. 4: B (5 tokens, 3 blocks) does not
       fit in 1 free block; A writes its 6th token, samples its 5th and ends, freeing [0, 2, 3] (last first).
    5: B is prefilled again: it re-finds its first block (2 tokens) and computes 5 - 2 = 3, of which the last
       was never computed before: 2 recomputed, 2 re-found. 6: B ends."""
    p = tiny(requests=2, max_len=8, block_size=2, memory_slots=8, arrival_gap=0)
    sim = trace(p, [Request(0, 0, 2, 5), Request(1, 0, 2, 5)])
    assert sim.cols["stored"] == [4, 6, 8, 5, 0, 5, 0]
    assert sim.cols["in_use"] == [4, 8, 8, 6, 0, 6, 0]
    assert sim.cols["preemptions"] == [0, 0, 0, 1, 1, 1, 1]
    assert sim.cols["short"] == [False, False, False, True, True, False, False]
    assert (sim.recomputed, sim.refound, sim.swapped) == (2, 2, 0)
    swap = trace(tiny(requests=2, max_len=8, block_size=2, memory_slots=8, arrival_gap=0, on_full="swap"), [Request(0, 0, 2, 5), Request(1, 0, 2, 5)])
    assert (swap.recomputed, swap.refound, swap.swapped) == (0, 0, 8)      # 4 tokens out, the same 4 back in


def test_wait_never_preempts_and_runs_as_many_as_reserving_for_max_len():
    """on_full=wait admits a request only when all running ones could reach max_len, so it runs at most
    blocks ÷ blocks per max_len at once, as reserving max_len does, and nobody is preempted."""
    p = P(on_full="wait")
    r = evaluate(p)
    assert r["paged"]["preemptions"] == 0 and r["paged"]["peak_running"] <= 8192 // 2048
    assert r["paged"]["mean_running"] == pytest.approx(r["reserve"]["mean_running"])
    assert evaluate(P())["paged"]["preemptions"] > 0


# ---- nano-vllm's rules, transcribed for this test only -----------------------------------------------------------
# GeeeekExplorer/nano-vllm, commit bb823b3e06983d71485a8e1f23715ebd87d98ef8: nanovllm/engine/block_manager.py
# (BlockManager: can_allocate, allocate, deallocate, can_append, may_append, hash_blocks) and
# nanovllm/engine/scheduler.py (Scheduler.schedule, preempt, postprocess). Written from its rules with real token
# ids and a hash chain over block contents, so that it shares nothing with the model but the rules. Arrivals over
# time are ours (nano-vllm adds every request up front). Its can_append tests len % block_size == 1, which is
# never true for blocks of one token (nano-vllm requires multiples of 256), so block sizes here start at 2.
class NanoSeq:
    def __init__(self, r: Request):
        self.rid, self.tokens, self.prompt, self.max_tokens = r.id, [(r.id, i) for i in range(r.prompt)], r.prompt, r.output
        self.cached = self.scheduled = 0
        self.table: list[int] = []


class NanoEngine:
    def __init__(self, blocks: int, bs: int, budget: int):
        self.bs, self.budget = bs, budget
        self.ref, self.hash, self.content = [0] * blocks, [None] * blocks, [None] * blocks
        self.by_hash: dict = {}
        self.free = collections.deque(range(blocks))
        self.used: set[int] = set()
        self.waiting: collections.deque[NanoSeq] = collections.deque()
        self.running: collections.deque[NanoSeq] = collections.deque()
        self.preemptions = 0

    def block_tokens(self, seq, i):
        return tuple(seq.tokens[i * self.bs:(i + 1) * self.bs])

    def n_blocks(self, seq):
        return -(-len(seq.tokens) // self.bs)

    def fresh(self):
        b = self.free.popleft()
        if self.hash[b] is not None and self.by_hash.get(self.hash[b]) == b:
            del self.by_hash[self.hash[b]]
        self.ref[b], self.hash[b], self.content[b] = 1, None, None
        self.used.add(b)
        return b

    def can_allocate(self, seq):
        h, hits, new = None, 0, self.n_blocks(seq)
        for i in range(self.n_blocks(seq) - 1):
            toks = self.block_tokens(seq, i)
            h = hash((h, toks))
            b = self.by_hash.get(h)
            if b is None or self.content[b] != toks:
                break
            hits += 1
            new -= b in self.used
        return hits if len(self.free) >= new else -1

    def allocate(self, seq, hits):
        h = None
        for i in range(hits):
            h = hash((h, self.block_tokens(seq, i)))
            b = self.by_hash[h]
            if b in self.used:
                self.ref[b] += 1
            else:
                self.ref[b] = 1
                self.free.remove(b)
                self.used.add(b)
            seq.table.append(b)
        seq.table += [self.fresh() for _ in range(self.n_blocks(seq) - hits)]
        seq.cached = hits * self.bs

    def deallocate(self, seq):
        for b in reversed(seq.table):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.used.remove(b)
                self.free.append(b)
        seq.cached, seq.table = 0, []

    def hash_blocks(self, seq):
        start, end = seq.cached // self.bs, (seq.cached + seq.scheduled) // self.bs
        h = self.hash[seq.table[start - 1]] if start > 0 else None
        for i in range(start, end):
            toks = self.block_tokens(seq, i)
            h = hash((h, toks))
            b = seq.table[i]
            self.hash[b], self.content[b] = h, toks
            self.by_hash[h] = b

    def preempt(self, seq):
        self.deallocate(seq)
        self.waiting.appendleft(seq)
        self.preemptions += 1

    def step(self):
        batch, batched = [], 0
        while self.waiting:                                 # prefill (max_num_seqs 512 > any test's requests)
            seq, remaining = self.waiting[0], self.budget - batched
            if remaining == 0:
                break
            if not seq.table:
                hits = self.can_allocate(seq)
                if hits == -1:
                    break
                n = len(seq.tokens) - hits * self.bs
            else:
                n = len(seq.tokens) - seq.cached
            if remaining < n and batch:
                break
            assert remaining >= n, "chunked prefill: not modelled, keep the budget above max_len"
            if not seq.table:
                self.allocate(seq, hits)
            seq.scheduled = n
            batched += n
            self.waiting.popleft()
            self.running.append(seq)
            batch.append(seq)
        prefill = bool(batch)
        if not prefill:                                     # decode
            while self.running:
                seq = self.running.popleft()
                while len(self.free) < (len(seq.tokens) % self.bs == 1):
                    if self.running:
                        self.preempt(self.running.pop())
                    else:
                        self.preempt(seq)
                        break
                else:
                    seq.scheduled = 1
                    if len(seq.tokens) % self.bs == 1:
                        seq.table.append(self.fresh())
                    batch.append(seq)
            self.running.extendleft(reversed(batch))
        for seq in batch:                                   # postprocess
            self.hash_blocks(seq)
            seq.cached += seq.scheduled
            seq.scheduled = 0
            seq.tokens.append((seq.rid, len(seq.tokens)))
            if len(seq.tokens) - seq.prompt == seq.max_tokens:
                self.deallocate(seq)
                self.running.remove(seq)


def same_state(sim: Simulation, nano: NanoEngine) -> None:
    assert [r.id for r in sim.running] == [s.rid for s in nano.running]
    assert [r.id for r in sim.waiting] == [s.rid for s in nano.waiting]
    assert sim.alloc.tables == {s.rid: s.table for s in nano.running}
    assert list(sim.alloc.free_blocks) == list(nano.free)
    assert {r.id: sim.written[r.id] for r in sim.running} == {s.rid: s.cached for s in nano.running}
    assert sim.preemptions == nano.preemptions


@st.composite
def small_workloads(draw):
    bs = draw(st.integers(2, 6))
    n = draw(st.integers(2, 7))
    lengths = [(draw(st.integers(1, 14)), draw(st.integers(1, 14))) for _ in range(n)]
    gaps = [draw(st.integers(0, 4)) for _ in range(n)]
    max_len = max(max(a + b for a, b in lengths), 16)
    blocks = draw(st.integers(-(-max_len // bs), -(-max_len // bs) + 8))
    t, reqs = 0, []
    for i, ((prompt, output), gap) in enumerate(zip(lengths, gaps)):
        t += gap if i else 0
        reqs.append(Request(i, t, prompt, output))
    return tiny(requests=n, max_len=max_len, block_size=bs, memory_slots=blocks * bs, on_full="recompute"), reqs


@settings(max_examples=300, deadline=None)
@given(small_workloads())
def test_block_accounting_equals_nano_vllm_step_by_step(case):
    """Every step: the same running and waiting queues, block tables, free list order, tokens stored and
    preemptions as nano-vllm's rules, including a preempted request re-finding its own cached blocks."""
    p, reqs = case
    budget = p.max_len            # small enough that the prefill budget binds, large enough never to chunk
    original, model.PREFILL_TOKENS = model.PREFILL_TOKENS, budget
    try:
        sim = Simulation(p, "paged", reqs=reqs)
        nano = NanoEngine(p.memory_slots // p.block_size, p.block_size, budget)
        pending = collections.deque(reqs)
        while not sim.finished:
            while pending and pending[0].arrival <= sim.now + 1:
                nano.waiting.append(NanoSeq(pending.popleft()))
            if nano.waiting or nano.running:
                nano.step()
            sim.step()
            same_state(sim, nano)
        assert not nano.waiting and not nano.running and not pending
    finally:
        model.PREFILL_TOKENS = original


# ---- the fast path (plain steps taken together) against stepping one at a time ---------------------------------
def findable(alloc: PagedAllocator) -> dict:
    return {rid: alloc.findable(rid) for rid in alloc.cached if alloc.findable(rid)}


def stepped(p: P, kind: str) -> Simulation:
    """The simulator as it was before plain steps were taken together: one step() per step."""
    sim = Simulation(p, kind, record=True)
    while sim.now < MAX_STEPS - 1 and not sim.finished:
        sim.step()
    return sim


@settings(max_examples=80, deadline=None)
@given(params, st.integers(0, 10**6))
def test_fast_path_gives_identical_runs_and_frames(p, at):
    model.clear_caches()
    every, model.CHECKPOINT_STEPS = model.CHECKPOINT_STEPS, 1 + at % 37    # frames resume from checkpoints
    try:
        for kind in ("reserve", "paged"):
            _compare_fast_and_stepped(p, kind, at)
    finally:
        model.CHECKPOINT_STEPS = every


def summary_from_rows(cols: dict, p: P) -> dict:
    """The run's summary computed row by row (as the model did before it kept segments), for comparison."""
    stored, running, in_use = cols["stored"], cols["running"], cols["in_use"]
    busy = [s for s, short in zip(stored, cols["short"]) if short]
    waste = [(u - s) / n for u, s, n in zip(in_use, stored, running) if n] or [0.0]
    return {"steps": len(stored), "finished_requests": cols["done"][-1],
            "stopped_early": cols["done"][-1] < p.requests, "steps_memory_short": len(busy),
            "token_state_share_busy": sum(busy) / len(busy) / p.memory_slots if busy else None,
            "token_state_share_mean": sum(stored) / len(stored) / p.memory_slots,
            "token_state_share_of_allocated": sum(stored) / sum(in_use) if sum(in_use) else 0.0,
            "peak_running": max(running), "mean_running": sum(running) / len(stored),
            "preemptions": cols["preemptions"][-1], "recomputed_tokens": cols["recomputed"][-1],
            "refound_tokens": cols["refound"][-1], "swapped_tokens": cols["swapped"][-1],
            "mean_waste_per_request_slots": sum(waste) / len(waste), "max_waste_per_request_slots": max(waste)}


def _compare_fast_and_stepped(p, kind, at):
    """A run taken in plain stretches equals one stepped; a frame (from a checkpoint) equals stepping to it."""
    slow = stepped(p, kind)
    rows = slow.cols
    record = model.run(p, kind)
    assert record.columns() == rows
    # what the page reads from the segments (sums over every step, the series at the frames) equals the rows'
    got, want = model.summarize(record, p), summary_from_rows(rows, p)
    mean = "mean_waste_per_request_slots"            # summed per segment, not per step: rounding may differ
    assert got.pop(mean) == pytest.approx(want.pop(mean), rel=1e-12) and got == want
    last = len(rows["stored"]) - 1
    steps = list(range(last + 3))
    assert record.at(steps) == {name: [rows[name][min(i, last)] for i in steps]
                                for name in ("stored", "running", "waiting", "preemptions")}
    k = at % len(rows["stored"])
    fast, ref = state_at(p, kind, k), Simulation(p, kind)
    while ref.now < k:
        ref.step()
    assert (fast.now, fast.written, fast.generated, fast.layout()) == (ref.now, ref.written, ref.generated,
                                                                       ref.layout())
    assert ([r.id for r in fast.running], [r.id for r in fast.waiting]) == \
           ([r.id for r in ref.running], [r.id for r in ref.waiting])
    if kind == "paged":
        assert list(fast.alloc.free_blocks) == list(ref.alloc.free_blocks)
        assert findable(fast.alloc) == findable(ref.alloc)


def test_each_allocator_is_cached_on_the_parameters_it_depends_on():
    model.clear_caches()
    p = P()
    history = model.history(p)
    assert model.history(dataclasses.replace(p, inspect=3))["paged"] is history["paged"]
    assert model.history(dataclasses.replace(p, reserve="pow2"))["paged"] is history["paged"]
    assert model.history(dataclasses.replace(p, on_full="swap"))["reserve"] is history["reserve"]
    assert model.history(dataclasses.replace(p, block_size=32))["reserve"] is history["reserve"]
    assert model.history(dataclasses.replace(p, seed=1))["reserve"] is not history["reserve"]


# ---- the page's figures, under the page's assumptions ---------------------------------------------------------
def test_reproduces_the_papers_band_under_the_pages_assumptions():
    """PagedAttention Fig. 2: reservation keeps 20-40% of memory in token states; paging ~96%."""
    shares = {mode: evaluate(P(reserve=mode))["reserve_token_state_share"] for mode in ("max", "pow2", "oracle")}
    assert 0.20 <= shares["max"] <= 0.40 and 0.20 <= shares["pow2"] <= 0.40
    assert shares["max"] < shares["pow2"] < shares["oracle"]
    # The figures the page quotes:
    assert [round(shares[m] * 100) for m in ("max", "pow2", "oracle")] == [26, 37, 50]
    r = evaluate(P())
    assert round(r["paged_token_state_share"] * 100) == 96
    assert (r["paged"]["preemptions"], r["paged"]["recomputed_tokens"], r["paged"]["refound_tokens"]) == (29, 4557, 3312)
    assert round(r["paged"]["mean_waste_per_request_slots"], 1) == 7.5
    assert round(evaluate(P(block_size=256))["paged"]["mean_waste_per_request_slots"]) == 126
    assert round(evaluate(P(block_size=256))["paged_token_state_share"] * 100) == 77
    alpaca = evaluate(P(prompt_mean=19, output_mean=58))
    assert round(alpaca["reserve_token_state_share"] * 100) == 4
    assert alpaca["paged_token_state_share"] is None and alpaca["paged"]["preemptions"] == 0
    assert round(alpaca["paged"]["token_state_share_of_allocated"] * 100) == 91
    assert f"{evaluate(P(block_size=1))['paged_token_state_share']:.0%}" == "98%"
    assert evaluate(P(on_full="swap"))["paged"]["swapped_tokens"] == 15_738
    wait = evaluate(P(on_full="wait"))
    assert round(wait["paged_token_state_share"] * 100) == 26 and wait["paged"]["peak_running"] == 4
    for figure in ("26% to 37%", "to 50%", "Paging holds 96%", "126 slots", "falls to 77%", "(98%)", "29 times",
                   "4,557 tokens", "3,312 more", "15,738 tokens", "same 26%", "4% of memory", "(91%)"):
        assert figure in PAGE, figure


def test_frames_are_deterministic_and_bounded():
    p = P()
    steps = frame_steps(p)
    assert len(steps) <= 301 and steps[0] == 0
    assert frame_data(p, 37) == frame_data(P(), 37)
    model.clear_caches()
    assert frame_data(p, 37) == frame_data(P(), 37)
    assert frame_data(p, 10**6)["animation"]["frame"] == len(steps) - 1
    full = page_data(p)
    opening = busiest_frame(p)
    assert full["animation"]["frame"] == opening
    assert full["sources"]["paged_map"] == frame_data(p, opening)["sources"]["paged_map"]
    assert full["sources"]["paged_map"]["x0"], "the page opens on a full memory map, not the empty end"


def test_cross_field_checks():
    with pytest.raises(ParamError, match="max_len must be at most memory_slots"):
        P(max_len=4096, memory_slots=2048)
    with pytest.raises(ParamError, match="inspect must be between 0 and 9 request; got 10"):
        P(requests=10, inspect=10)
    # 100 tokens in blocks of 16 take 7 blocks, 112 slots: a memory of 100 slots cannot hold one request.
    with pytest.raises(ParamError, match=r"^memory_slots must hold one request of max_len \(100 tokens\) in whole "
                                         r"blocks of 16, at least 112 token slots; got 100\.$"):
        P(max_len=100, memory_slots=100)
    with pytest.raises(ParamError, match=r"^arrival_gap must be at most 251 steps with 200 requests, so that the "
                                         r"last arrives within the 50,000 steps simulated; got 1,000\.$"):
        P(requests=200, arrival_gap=1000)
    with pytest.raises(ParamError, match="requests must be between 2 and 200"):
        P(requests=1)


@pytest.mark.parametrize("values", [
    {"prompt_mean": 1}, {"requests": 2}, {"memory_slots": 131072}, {"arrival_gap": 1000, "requests": 30},
    {"prompt_mean": 19, "output_mean": 58}, {"requests": 3, "seed": 7},
])
def test_runs_where_memory_never_fills_give_finite_truthful_results(values):
    """The crash the fuzzer found (a None share formatted as a number): a run where memory never runs short."""
    p = P.from_mapping(values)
    data = page_data(p)
    json.dumps(data, allow_nan=False)
    json.dumps(evaluate(p), allow_nan=False)
    r = evaluate(p)
    if r["paged"]["token_state_share_busy"] is None:
        assert any("never ran short" in note for note in data["notes"])
        assert "of what it allocated" in data["readouts"][1]["detail"]


def test_a_run_that_hits_the_step_limit_says_so():
    p = P(requests=200, prompt_mean=1, output_mean=4096, max_len=16384, memory_slots=16384, block_size=256)
    r = evaluate(p)
    assert r["reserve"]["stopped_early"] and r["reserve"]["steps"] == MAX_STEPS
    assert any(note.startswith("The reserve run was stopped after 50,000 steps") for note in page_data(p)["notes"])


def test_try_this_links_are_valid_and_run():
    links = re.findall(r"\]\(\?([^)]*)\)", PAGE)
    assert len(links) >= 5
    for query in links:
        json.dumps(page_data(P.from_mapping(dict(parse_qsl(query)))), allow_nan=False)


def test_a_checkpoint_copies_every_field_and_shares_nothing_that_changes():
    """Simulation.clone copies field by field (copy.copy would slow the run it copies): a field added later
    and not copied would make frames resumed from a checkpoint wrong, so compare the fields themselves."""
    for kind in ("reserve", "paged"):
        sim = Simulation(P(), kind)
        sim.run_to(300)
        c = sim.clone()
        assert vars(c).keys() == vars(sim).keys() and vars(c.alloc).keys() == vars(sim.alloc).keys()
        c.run_to(900)
        ref = Simulation(P(), kind)
        ref.run_to(900)
        assert (c.now, c.written, c.layout()) == (ref.now, ref.written, ref.layout())
        assert sim.now == 300 and sim.layout() != c.layout()     # the original did not move with its copy
