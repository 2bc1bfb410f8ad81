"""The radix tree against a brute-force longest-common-prefix reference, and its invariants."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.core.radix import RadixTree


def brute_force_match(cached: list[tuple], query: tuple) -> int:
    best = 0
    for seq in cached:
        n = 0
        while n < min(len(seq), len(query)) and seq[n] == query[n]:
            n += 1
        best = max(best, n)
    return best


sequences = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12).map(tuple), min_size=1, max_size=25)


@settings(max_examples=300, deadline=None)
@given(sequences, st.lists(st.integers(0, 3), max_size=12).map(tuple))
def test_match_equals_brute_force_without_eviction(seqs, query):
    tree = RadixTree(capacity=10**9)
    for s in seqs:
        tree.insert(s)
    assert tree.match(query)[0] == brute_force_match(seqs, query)
    # The tree stores each distinct prefix once.
    prefixes = {s[:i] for s in seqs for i in range(1, len(s) + 1)}
    assert tree.size == len(prefixes)


@settings(max_examples=300, deadline=None)
@given(sequences, st.integers(1, 30), st.sampled_from(["lru", "lfu"]))
def test_capacity_is_never_exceeded_and_hits_are_real(seqs, capacity, policy):
    tree = RadixTree(capacity=capacity, policy=policy)
    for s in seqs:
        matched, path = tree.match(s)
        # A hit never returns tokens that differ from the request's: the matched path spells s[:matched].
        assert sum((n.tokens for n in path), ()) == s[:matched]
        tree.insert(s)
        assert tree.size <= capacity
        assert tree.size == sum(len(n.tokens) for n in tree.nodes())
    # Whatever is cached is a prefix of something that was inserted.
    for cached in tree.sequences():
        assert any(s[:len(cached)] == cached for s in seqs)


def test_split_on_partial_match():
    tree = RadixTree(100)
    tree.insert((1, 2, 3, 4))
    assert tree.match((1, 2, 9))[0] == 2
    tree.insert((1, 2, 9))
    assert sorted(tree.sequences()) == [(1, 2, 3, 4), (1, 2, 9)]
    assert tree.size == 5


def test_lru_evicts_the_least_recently_used_leaf_and_never_a_locked_one():
    tree = RadixTree(8)
    tree.insert((1, 1, 1))
    tree.insert((2, 2, 2))
    tree.match((1, 1, 1))                    # touch the first: the second is now least recently used
    tree.insert((3, 3, 3))
    assert sorted(tree.sequences()) == [(1, 1, 1), (3, 3, 3)]
    _, path = tree.match((1, 1, 1))
    tree.lock(path, +1)
    tree.insert((4, 4, 4))                   # must evict (3,3,3), not the locked (1,1,1)
    assert sorted(tree.sequences()) == [(1, 1, 1), (4, 4, 4)]


def test_lfu_evicts_the_least_used():
    tree = RadixTree(6, policy="lfu")
    tree.insert((1, 1, 1))
    tree.insert((2, 2, 2))
    for _ in range(3):
        _, path = tree.match((2, 2, 2))
        tree.record_hit(path)
    tree.insert((3, 3, 3))
    assert sorted(tree.sequences()) == [(2, 2, 2), (3, 3, 3)]


def test_unknown_policy_is_a_sentence():
    with pytest.raises(ValueError, match="policy must be one of lru, lfu; got 'mru'"):
        RadixTree(10, "mru")
