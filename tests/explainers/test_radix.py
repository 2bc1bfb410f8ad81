"""The radix tree against a brute-force longest-common-prefix reference, and its invariants."""
from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings, strategies as st

from kvx.explainers.core.radix import EVICTION_POLICIES, RadixTree


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


# ---- parity with SGLang's RadixCache ------------------------------------------------------------------
# The reference: SGLang 0.5.23, python/sglang/srt/mem_cache/radix_cache.py (TreeNode, _match_prefix_helper,
# _split_node, _insert_helper, evict, inc_lock_ref/dec_lock_ref, _update_leaf_status) and evict_policy.py
# (LRUStrategy: last_access_time; LFUStrategy: (hit_count, last_access_time)), read from the released wheel
# sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl. SGLang stamps time.monotonic(); the oracle below
# uses a counter that ticks wherever SGLang calls the clock.

def test_sglang_case_a_match_inside_an_edge_marks_the_tail_as_used():
    """The issue's reproduction. SGLang's _match_prefix_helper sets the child's last_access_time before it
    splits the edge, so the unmatched tail [3, 4] is as recent as the match, and [5, 6, 7, 8] goes first."""
    tree, gone = RadixTree(8), []
    tree.on_evict = lambda leaf: gone.append(leaf.tokens)
    tree.insert((1, 2, 3, 4))
    tree.insert((5, 6, 7, 8))
    assert tree.match((1, 2, 9))[0] == 2
    assert tree.evict(2) == 4
    assert gone == [(5, 6, 7, 8)]
    assert sorted(tree.sequences()) == [(1, 2, 3, 4)]
    oracle = SGLangRadixCache("lru")
    oracle.insert((1, 2, 3, 4))
    oracle.insert((5, 6, 7, 8))
    oracle.match_prefix((1, 2, 9))
    assert oracle.evict(2) == [(5, 6, 7, 8)]


def test_sglang_eviction_order_after_a_split():
    """The walk that splits (1, 2, 3, 4) stamps both halves (the tail before the split; the upper half is a
    new TreeNode, stamped as it is made), so both outlive (7,), cached earlier; the tail goes before the
    upper half because a parent only becomes a leaf when its children are gone. The tree used to leave
    the tail at its insert time: (3, 4) first."""
    tree, gone = RadixTree(100), []
    tree.on_evict = lambda leaf: gone.append(spelled(leaf))
    tree.insert((1, 2, 3, 4))
    tree.insert((7,))
    tree.match((1, 2))
    tree.evict(100)
    assert gone == [(7,), (1, 2, 3, 4), (1, 2)]
    oracle = SGLangRadixCache("lru")
    oracle.insert((1, 2, 3, 4))
    oracle.insert((7,))
    oracle.match_prefix((1, 2))
    assert oracle.evict(100) == gone


def test_a_parent_left_childless_waits_its_turn():
    """Evicting (1, 2) leaves (1,) a leaf; (1,) was used after (7,), so (7,) goes next (SGLang pushes the
    parent onto the heap with its own key; the tree takes it at once only when it sorts first)."""
    tree, gone = RadixTree(3), []
    tree.on_evict = lambda leaf: gone.append(spelled(leaf))
    tree.insert((1,))
    tree.insert((1, 2))
    tree.insert((7,))
    tree.match((1,))
    tree.evict(2)
    assert gone == [(1, 2), (7,)]
    oracle = SGLangRadixCache("lru")
    for s in [(1,), (1, 2), (7,)]:
        oracle.insert(s)
    oracle.match_prefix((1,))
    assert oracle.evict(2) == gone
    tree.evict(3)                            # now (1,) sorts first and goes
    assert gone[-1] == (1,) and tree.size == 0


def test_sglang_lfu_counts_hits_at_insert_and_a_split_inherits_them():
    """_insert_helper adds one hit to every node it walks through and starts a new leaf at one;
    _split_node copies the count to the upper half. A match alone counts nothing."""
    tree = RadixTree(100, "lfu")
    tree.insert((1, 2, 3))
    tree.insert((1, 2, 3))
    tree.match((1, 2, 3))
    tree.match((1, 2, 3))
    assert [n.hits for n in tree.nodes()] == [2]
    tree.insert((1, 9))                      # splits (1, 2, 3): the upper (1,) inherits 2, plus this walk
    hits = {n.tokens: n.hits for n in tree.nodes()}
    assert hits == {(1,): 3, (2, 3): 2, (9,): 1}


def test_sglang_lfu_evicts_the_fewest_hits_then_the_oldest():
    tree, gone = RadixTree(6, "lfu"), []
    tree.on_evict = lambda leaf: gone.append(leaf.tokens)
    tree.insert((1, 1))
    tree.insert((2, 2))
    tree.insert((2, 2))                      # (2, 2) has 2 hits
    tree.insert((3, 3))                      # (1, 1) and (3, 3) have 1; (1, 1) is older
    tree.insert((4, 4))
    assert gone == [(1, 1)]
    tree.insert((5, 5))                      # (3, 3) and (4, 4) have 1; (3, 3) is older
    assert gone == [(1, 1), (3, 3)]


def test_sglang_re_inserting_a_cached_prefix_refreshes_it():
    """_insert_helper marks every node it walks as used even when it stores nothing."""
    tree, gone = RadixTree(6), []
    tree.on_evict = lambda leaf: gone.append(leaf.tokens)
    tree.insert((1, 1, 1))
    tree.insert((2, 2, 2))
    assert tree.insert((1, 1, 1)) == 0
    tree.insert((3, 3, 3))
    assert gone == [(2, 2, 2)]


def test_sglang_a_lock_outlives_a_split_of_the_locked_edge():
    """inc_lock_ref/dec_lock_ref walk from the request's last node up through the parents, and _split_node
    copies lock_ref to the new upper node; so releasing the request releases the upper half too. (The
    tree used to release only the nodes of the list it was given, which left the upper half locked.)"""
    tree = RadixTree(6)
    tree.insert((1, 2, 3))
    _, path = tree.match((1, 2, 3))
    tree.lock(path, +1)
    tree.match((1, 9))                       # splits the locked edge into (1,) and (2, 3)
    tree.lock(path, -1)
    assert all(n.lock == 0 for n in tree.nodes())
    tree.insert((7, 7, 7, 7, 7, 7))          # everything else must be evictable now
    assert tree.sequences() == [(7, 7, 7, 7, 7, 7)]


def test_locked_leaves_and_the_path_being_extended_are_never_evicted():
    tree = RadixTree(6)
    tree.insert((1, 1, 1))
    _, path = tree.match((1, 1, 1))
    tree.lock(path, +1)
    tree.insert((2, 2, 2))
    assert tree.insert((3, 3, 3)) == 3       # evicts (2, 2, 2), the only unlocked leaf
    assert sorted(tree.sequences()) == [(1, 1, 1), (3, 3, 3)]
    assert tree.insert((1, 1, 1, 4, 4)) == 2  # extends the locked path: evicts (3, 3, 3), stores what fits
    assert sorted(tree.sequences()) == [(1, 1, 1, 4, 4)]
    assert tree.evictable() == {tree.match((1, 1, 1, 4, 4))[1][-1]}


class SGLangRadixCache:
    """SGLang 0.5.23's RadixCache rules, written out plainly for page size 1, no priorities, no extra keys,
    the token ids standing in for KV indices. One tick of `clock` per time.monotonic() call in SGLang."""

    class TreeNode:
        def __init__(self, cache):
            self.children, self.parent, self.key = {}, None, ()
            self.lock_ref, self.hit_count = 0, 0
            self.last_access_time = cache.tick()    # TreeNode.__init__ reads the clock

        def __lt__(self, other):                    # what heapq falls back on when priorities tie
            return self.last_access_time < other.last_access_time

    def __init__(self, policy):
        self.clock, self.policy, self.size = 0, policy, 0
        self.root = self.TreeNode(self)
        self.root.lock_ref = 1
        self.evictable_leaves = set()

    def tick(self):
        self.clock += 1
        return self.clock

    def priority(self, node):
        return node.last_access_time if self.policy == "lru" else (node.hit_count, node.last_access_time)

    @staticmethod
    def common(a, b):
        i = 0
        while i < min(len(a), len(b)) and a[i] == b[i]:
            i += 1
        return i

    def match_prefix(self, key):
        key = tuple(key)
        t = self.tick()
        node, found = self.root, 0
        node.last_access_time = t
        while key and key[0] in node.children:
            child = node.children[key[0]]
            child.last_access_time = t
            n = self.common(child.key, key)
            found += n
            if n < len(child.key):
                node = self.split(child, n)
                break
            node, key = child, key[n:]
        return found, node

    def split(self, child, n):
        new = self.TreeNode(self)
        new.hit_count, new.lock_ref = child.hit_count, child.lock_ref
        new.key, new.parent = child.key[:n], child.parent
        new.children = {child.key[n]: child}
        child.parent, child.key = new, child.key[n:]
        new.parent.children[new.key[0]] = new
        return new

    def insert(self, key):
        key = tuple(key)
        t = self.tick()
        node, total = self.root, 0
        node.last_access_time = t
        while key and key[0] in node.children:
            node = node.children[key[0]]
            node.last_access_time = t
            n = self.common(node.key, key)
            total, key = total + n, key[n:]
            if n < len(node.key):
                node = self.split(node, n)
            node.hit_count += 1
        if key:
            new = self.TreeNode(self)
            new.parent, new.key, new.hit_count = node, key, 1
            node.children[key[0]] = new
            self.size += len(key)
            self.update_leaf_status(node)
            self.update_leaf_status(new)
        return total

    def evict(self, num_tokens):
        """Returns the evicted leaves, each spelled from the root."""
        heap = [(self.priority(n), n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        evicted, gone = 0, []
        while evicted < num_tokens and heap:
            _, x = heapq.heappop(heap)
            gone.append(self.spell(x))
            evicted += len(x.key)
            self.size -= len(x.key)
            del x.parent.children[x.key[0]]
            self.evictable_leaves.discard(x)
            self.update_leaf_status(x.parent)
            if not x.parent.children and x.parent.lock_ref == 0:
                heapq.heappush(heap, (self.priority(x.parent), x.parent))
        return gone

    def inc_lock_ref(self, node, delta=1):
        while node is not self.root:
            node.lock_ref += delta
            self.update_leaf_status(node)
            node = node.parent

    def update_leaf_status(self, node):
        if node.lock_ref > 0 or node.children:
            self.evictable_leaves.discard(node)
        else:
            self.evictable_leaves.add(node)

    def spell(self, node):
        out = ()
        while node is not self.root:
            out, node = node.key + out, node.parent
        return out

    def sequences(self):
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            if not n.children and n is not self.root:
                out.append(self.spell(n))
            stack.extend(n.children.values())
        return sorted(out)

    # What RadixTree.insert does, in SGLang's calls: find the cached prefix, hold it, evict the shortfall
    # (as allocator.evict_to_free_tokens does), release it, and insert what fits.
    def insert_within(self, capacity, tokens):
        tokens = tuple(tokens)
        found, last = self.match_prefix(tokens)
        gone = []
        if found < len(tokens):
            self.inc_lock_ref(last)
            gone = self.evict(self.size + len(tokens) - found - capacity)
            self.inc_lock_ref(last, -1)
        self.insert(tokens[: found + max(0, capacity - self.size)])
        return gone


def spelled(node) -> tuple:
    out = ()
    while node.parent is not None:
        out, node = node.tokens + out, node.parent
    return out


# A workload: requests that start (match their prompt and hold it) and later finish (insert prompt and
# answer, then release), interleaved, over a small alphabet so that prefixes are shared and edges split.
token_runs = st.lists(st.integers(0, 3), min_size=1, max_size=8).map(tuple)
workloads = st.lists(st.tuples(st.sampled_from(["start", "finish", "match", "insert"]), token_runs, token_runs),
                     min_size=1, max_size=40)


def replay(tree, oracle, capacity, ops):
    """Drives both; returns per-op (hit tokens, evicted sequences) for each."""
    ours, theirs, running = [], [], []
    gone = []
    tree.on_evict = lambda leaf: gone.append(spelled(leaf))
    for op, a, b in ops:
        gone.clear()
        if op == "start":
            (m, path), (m2, last) = tree.match(a), oracle.match_prefix(a)
            tree.lock(path, +1)
            oracle.inc_lock_ref(last)
            running.append((a + b, path, last))
            ours.append((m, ()))
            theirs.append((m2, ()))
        elif op == "finish" and running:
            tokens, path, last = running.pop(0)
            tree.insert(tokens)
            ours.append((0, tuple(gone)))
            theirs.append((0, tuple(oracle.insert_within(capacity, tokens))))
            tree.lock(path, -1)
            oracle.inc_lock_ref(last, -1)
        elif op == "match":
            ours.append((tree.match(a)[0], ()))
            theirs.append((oracle.match_prefix(a)[0], ()))
        elif op == "insert":
            tree.insert(a + b)
            ours.append((0, tuple(gone)))
            theirs.append((0, tuple(oracle.insert_within(capacity, a + b))))
    return ours, theirs


@settings(max_examples=200, deadline=None)
@given(workloads, st.integers(1, 24), st.sampled_from(["lru", "lfu"]))
def test_the_tree_agrees_with_sglang_on_random_workloads(ops, capacity, policy):
    """Hit tokens, which leaves are evicted and in what order, and what stays cached."""
    tree, oracle = RadixTree(capacity, policy), SGLangRadixCache(policy)
    ours, theirs = replay(tree, oracle, capacity, ops)
    assert ours == theirs
    assert sorted(tree.sequences()) == oracle.sequences()
    assert tree.size == oracle.size <= capacity


# ---- the heap against the walk it replaced --------------------------------------------------------------
class WalkTree(RadixTree):
    """The eviction this tree had before the heap (as of b5d4d7a): find the victim by walking every leaf,
    O(leaves) per evicted leaf. Everything else is the tree's own."""

    def evict(self, need: int) -> int:
        freed = 0
        key = EVICTION_POLICIES[self.policy]
        while self.size + need > self.capacity:
            candidates = [n for n in self.leaves() if n.lock == 0]
            if not candidates:
                break
            victim = min(candidates, key=key)
            del victim.parent.children[victim.tokens[0]]
            if self.on_evict is not None:
                self.on_evict(victim)
            self.size -= len(victim.tokens)
            freed += len(victim.tokens)
        self.evicted += freed
        return freed


@settings(max_examples=200, deadline=None)
@given(workloads, st.integers(1, 24), st.sampled_from(["lru", "lfu"]))
def test_the_heap_evicts_exactly_what_the_walk_did(ops, capacity, policy):
    a, b = RadixTree(capacity, policy), WalkTree(capacity, policy)
    gone_a, gone_b = [], []
    a.on_evict = lambda leaf: gone_a.append(spelled(leaf))
    b.on_evict = lambda leaf: gone_b.append(spelled(leaf))
    paths_a, paths_b = [], []
    for op, x, y in ops:
        if op == "start":
            ma, pa = a.match(x)
            mb, pb = b.match(x)
            assert ma == mb
            a.lock(pa, +1)
            b.lock(pb, +1)
            paths_a.append((x + y, pa))
            paths_b.append((x + y, pb))
        elif op == "finish" and paths_a:
            (t, pa), (_, pb) = paths_a.pop(0), paths_b.pop(0)
            assert a.insert(t) == b.insert(t)
            a.lock(pa, -1)
            b.lock(pb, -1)
        elif op == "match":
            assert a.match(x)[0] == b.match(x)[0]
        elif op == "insert":
            assert a.insert(x + y) == b.insert(x + y)
        assert gone_a == gone_b
        assert a.evictable() == {n for n in a.leaves() if n.lock == 0}
    assert sorted(a.sequences()) == sorted(b.sequences())


def state(tree) -> list[tuple]:
    """Every node as (spelled, last use, hits, lock, id), for comparing two trees exactly."""
    return sorted((spelled(n), n.last_access, n.hits, n.lock, n.id) for n in tree.nodes())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(token_runs, token_runs, token_runs), min_size=1, max_size=30), st.integers(1, 24),
       st.sampled_from(["lru", "lfu"]))
def test_store_after_a_match_is_store(requests, capacity, policy):
    """A replica's prefill: match and lock a prompt, peek other prompts (read only), then store it and unlock.
    store_matched, which reuses the match instead of walking again, leaves the same tree and evicts the same."""
    a, b = RadixTree(capacity, policy), RadixTree(capacity, policy)
    gone_a, gone_b = [], []
    a.on_evict = lambda leaf: gone_a.append(spelled(leaf))
    b.on_evict = lambda leaf: gone_b.append(spelled(leaf))
    for prompt, more, other in requests:
        tokens = prompt + more
        (ma, pa), (mb, pb) = a.match(tokens), b.match(tokens)
        a.lock(pa, +1)
        b.lock(pb, +1)
        assert a.peek(other) == b.peek(other)
        assert a.store(tokens) == b.store_matched(tokens, mb, pb)
        a.lock(pa, -1)
        b.lock(pb, -1)
        assert gone_a == gone_b and state(a) == state(b)
        assert sorted(map(spelled, a.evictable())) == sorted(map(spelled, b.evictable()))


def test_clear_empties_the_tree_and_leaves_no_cycles():
    """A cleared tree is empty and usable, and its old nodes hold no links, so reference counting frees them
    at once: with the cycle collector off, they are gone from the interpreter's objects."""
    import gc
    from kvx.explainers.core.radix import Node
    tree = RadixTree(10)
    for seq in [(1, 2, 3), (1, 2, 4), (5, 6), (1, 7)]:
        tree.insert(seq)
    old = tree.nodes()
    assert len(old) == 6 and tree.size == 7
    nodes = lambda: sum(type(o) is Node for o in gc.get_objects())     # no isinstance: it wakes lazy modules
    gc.collect()
    gc.disable()                      # only reference counting frees anything from here
    try:
        before = nodes()
        tree.clear()
        assert tree.size == 0 and tree.sequences() == [] and tree.match((1, 2, 3))[0] == 0
        assert all(n.parent is None and not n.children for n in old)
        del old
        assert before - nodes() == 6  # the six nodes gone (and the old root, for the new one)
    finally:
        gc.enable()
    assert tree.insert((1, 2)) == 2 and tree.match((1, 2, 9))[0] == 2
