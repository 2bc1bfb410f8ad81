"""paging: the allocators' invariants under hypothesis, exact small runs, and the paper's figure."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.core.params import ParamError
from kvx.explainers.paging.model import (PagedAllocator, PagingParams as P, Request, ReserveAllocator, Simulation,
                                         busiest_frame, evaluate, frame_data, frame_steps, page_data, workload)

PAGE = (Path(__file__).parents[2] / "explainers" / "paging" / "page.md").read_text()


def check_invariants(sim: Simulation) -> None:
    p = sim.p
    if sim.kind == "paged":
        owned = [b for table in sim.alloc.tables.values() for b in table]
        assert len(owned) == len(set(owned)), "a block is in two block tables"
        assert not set(owned) & set(sim.alloc.free_blocks), "a block is both owned and free"
        assert len(owned) + len(sim.alloc.free_blocks) == p.memory_slots // p.block_size
        for r in sim.running:
            assert len(sim.alloc.tables[r.id]) == -(-sim.stored(r) // p.block_size), "blocks are not on demand"
    else:
        chunks = sorted(sim.alloc.chunks.values())
        for (s1, n1), (s2, _) in zip(chunks, chunks[1:]):
            assert s1 + n1 <= s2, "two reservations overlap"
        for r in sim.running:
            assert sim.stored(r) <= sim.alloc.chunks[r.id][1]
    assert sim.alloc.reserved() <= p.memory_slots, "memory oversubscribed"
    assert sum(sim.stored(r) for r in sim.running) <= sim.alloc.reserved()


params = st.builds(P, requests=st.integers(1, 25), prompt_mean=st.integers(1, 400), output_mean=st.integers(1, 400),
                   max_len=st.sampled_from([64, 256, 1024]), block_size=st.sampled_from([1, 4, 16, 64]),
                   memory_slots=st.sampled_from([1024, 2048, 4096]), arrival_gap=st.integers(0, 10),
                   reserve=st.sampled_from(["max", "pow2", "oracle"]),
                   on_full=st.sampled_from(["recompute", "swap", "wait"]), seed=st.integers(0, 100))


@settings(max_examples=60, deadline=None)
@given(params)
def test_allocator_invariants_every_step_and_every_token_stored_once(p):
    for kind in ("reserve", "paged"):
        sim = Simulation(p, kind)
        while not sim.finished:
            sim.step()
            check_invariants(sim)
            assert sim.now < 20_000, "the run does not finish"
        # Every request finished, having generated exactly its output: each token stored exactly once
        # (preempted tokens are recomputed or swapped back, not generated twice).
        assert all(sim.generated[r.id] == r.output for r in sim.reqs)
        assert sim.done == {r.id for r in sim.reqs}
        if p.on_full != "swap" or kind == "reserve":
            assert sim.swapped == 0


@settings(max_examples=40, deadline=None)
@given(params)
def test_paged_waste_is_under_one_block_per_request(p):
    r = evaluate(p)
    assert r["paged"]["max_waste_per_request_slots"] < p.block_size
    for share in (r["reserve_token_state_share"], r["paged_token_state_share"]):
        assert share is None or 0 <= share <= 1


def test_workload_is_seeded_and_bounded():
    a = workload(P())
    fields = [dataclasses.astuple(r) for r in a]       # requests compare by identity; their fields by value
    assert fields == [dataclasses.astuple(r) for r in workload(P())]
    assert fields != [dataclasses.astuple(r) for r in workload(P(seed=1))]
    assert all(1 <= r.prompt and 1 <= r.output and r.total <= 2048 for r in a)


def test_small_run_by_hand():
    """Blocks of 8 in a memory of 64 slots (8 blocks); two requests with 30-token prompts."""
    p = P(requests=2, max_len=64, block_size=8, memory_slots=64, arrival_gap=0, reserve="oracle")
    reqs = [Request(0, 0, 30, 4), Request(1, 0, 30, 2)]
    paged = PagedAllocator(p)
    assert paged.admit(reqs[0], 30) and paged.tables[0] == [0, 1, 2, 3]   # ceil(30/8) = 4 blocks
    assert paged.admit(reqs[1], 30) is False                              # 4 blocks + a 1-block watermark > 4 free
    assert paged.grow(reqs[0], 32) and len(paged.tables[0]) == 4          # 32 tokens still fit in 4 blocks
    assert paged.grow(reqs[0], 33) and paged.tables[0] == [0, 1, 2, 3, 4]  # the 33rd takes a fifth
    paged.free(0)
    assert sorted(paged.free_blocks) == list(range(8))
    reserve = ReserveAllocator(p)
    assert reserve.admit(reqs[0], 30) and reserve.chunks[0] == (0, 34)    # oracle: prompt + output
    assert reserve.admit(reqs[1], 30) is False                            # 32 more slots do not fit in 30
    assert ReserveAllocator(P(requests=2, max_len=64, memory_slots=64)).admit(reqs[0], 30)   # max: 64 slots
    assert P(reserve="pow2").reserve == "pow2"


def test_reproduces_the_papers_band_under_the_pages_assumptions():
    """PagedAttention Fig. 2: reservation keeps 20-40% of memory in token states; paging ~96%."""
    shares = {mode: evaluate(P(reserve=mode))["reserve_token_state_share"] for mode in ("max", "pow2", "oracle")}
    assert 0.20 <= shares["max"] <= 0.40 and 0.20 <= shares["pow2"] <= 0.40
    assert shares["max"] < shares["pow2"] < shares["oracle"]
    assert evaluate(P())["paged_token_state_share"] > 0.9
    # The figures the page quotes:
    assert [round(shares[m] * 100) for m in ("max", "pow2", "oracle")] == [26, 37, 52]
    r = evaluate(P())
    assert round(r["paged_token_state_share"] * 100) == 95 and r["paged"]["recomputed_tokens"] == 6235
    assert round(r["paged"]["mean_waste_per_request_slots"], 1) == 7.5
    assert round(evaluate(P(block_size=256))["paged"]["mean_waste_per_request_slots"]) == 126
    assert round(evaluate(P(block_size=256))["paged_token_state_share"] * 100) == 76
    assert round(evaluate(P(prompt_mean=19, output_mean=58))["reserve_token_state_share"] * 100) == 4
    assert evaluate(P(prompt_mean=19, output_mean=58))["paged_token_state_share"] is None


def test_frames_are_deterministic_and_bounded():
    p = P()
    steps = frame_steps(p)
    assert len(steps) <= 301 and steps[0] == 0
    assert frame_data(p, 37) == frame_data(P(), 37)
    assert frame_data(p, 10**6)["animation"]["frame"] == len(steps) - 1
    full = page_data(p)
    opening = busiest_frame(p)
    assert full["animation"]["frame"] == opening and steps[opening] == 168
    assert full["sources"]["paged_map"] == frame_data(p, opening)["sources"]["paged_map"]
    assert full["sources"]["paged_map"]["x0"], "the page opens on a full memory map, not the empty end"


def test_cross_field_checks():
    with pytest.raises(ParamError, match="max_len must be at most memory_slots"):
        P(max_len=4096, memory_slots=2048)
    with pytest.raises(ParamError, match="inspect must be between 0 and 9 request; got 10"):
        P(requests=10, inspect=10)


def test_try_this_links_are_valid():
    for query in re.findall(r"\]\(\?([^)]*)\)", PAGE):
        P.from_mapping(dict(parse_qsl(query)))
