"""A radix tree over token sequences, the data structure behind prefix caching (SGLang's RadixAttention).

Each edge holds a run of tokens; a path from the root spells a cached prefix. A request walks the
tree as far as its tokens match, reuses that much cached KV, and inserts the rest. When the cache is
full, leaves that no running request holds are evicted, least recently used first (or least often
used). A policy is just a sort key, as in SGLang's evict_policy. Standard library only, shared by
the explainers that need a prefix cache.

The rules follow SGLang 0.5.23's RadixCache (python/sglang/srt/mem_cache/radix_cache.py and
evict_policy.py, read from the released wheel), with a logical clock in place of time.monotonic():
- a walk (match or insert) marks every node it enters as used now, the unmatched tail of a split
  edge included (it is marked before the split); the new upper node of a split is created after
  that, so it is a tick younger, and it inherits the edge's hit count and locks;
- an insert counts one hit on every node it walks through and starts its new leaf at one hit;
- LRU evicts the smallest last-use time, LFU the smallest (hits, last-use time);
- a lock holds a node and all its ancestors; only unlocked leaves are evictable, and evicting a
  leaf can make its parent one.
As SGLang does, the tree keeps its evictable leaves in a set and the candidates in a heap keyed by
the policy, so an eviction costs O(log n) instead of a walk over the whole tree. Heap entries go
stale when a node's key or status changes; they are skipped when popped (lazy deletion).
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
from typing import Callable


@dataclasses.dataclass(eq=False, slots=True)
class Node:
    tokens: tuple = ()                               # the edge into this node
    parent: "Node | None" = None
    children: dict = dataclasses.field(default_factory=dict)   # first token -> child
    last_access: int = 0
    hits: int = 0                                    # inserts that walked through this node
    lock: int = 0                                    # running requests that still use it
    id: int = 0
    filed: int | None = None                         # the packed key of this node's live heap entry, if any

    def depth(self) -> int:
        """Tokens from the root to the end of this node."""
        n, node = 0, self
        while node.parent is not None:
            n += len(node.tokens)
            node = node.parent
        return n


# A policy maps a leaf to a sort key: the smallest key is evicted first. The id makes keys unique, so
# the order never depends on how a set or heap happens to be laid out (SGLang's clock makes ties
# vanishingly rare; a logical clock needs the id).
EVICTION_POLICIES: dict[str, Callable[[Node], tuple]] = {
    "lru": lambda n: (n.last_access, n.id),
    "lfu": lambda n: (n.hits, n.last_access, n.id),
}

# The same keys packed into one integer each, 40 bits a field, because a heap of plain integers compares
# several times faster than a heap of tuples; the order is the same while clock ticks and node ids stay
# under 2**40 (a million million operations).
_TIME_SHIFT, _HITS_SHIFT = 40, 80      # where last_access and hits sit in a packed key (RadixTree._file too)
_PACKED: dict[str, Callable[[Node], int]] = {
    "lru": lambda n: (n.last_access << _TIME_SHIFT) | n.id,
    "lfu": lambda n: (n.hits << _HITS_SHIFT) | (n.last_access << _TIME_SHIFT) | n.id,
}


class RadixTree:
    def __init__(self, capacity: int, policy: str = "lru"):
        if policy not in EVICTION_POLICIES:
            raise ValueError(f"policy must be one of {', '.join(EVICTION_POLICIES)}; got {policy!r}.")
        self.root = Node()
        self.capacity = capacity
        self.policy = policy
        self.size = 0                                # tokens cached
        self.clock = itertools.count(1)
        self.ids = itertools.count(1)
        self.evicted = 0
        self.on_evict: Callable[[Node], None] | None = None   # told of each evicted leaf (for tallies)
        self._key = _PACKED[policy]
        self._lfu = policy == "lfu"
        self._evictable: set[Node] = set()           # unlocked leaves
        self._heap: list[int] = []                   # packed keys; a key is stale unless it is its node's `filed`
        self._filed: dict[int, Node] = {}            # packed key -> node, for every key in the heap

    # ---- lookup -----------------------------------------------------------------------------------
    def match(self, tokens) -> tuple[int, list[Node]]:
        """Length of the longest cached prefix of `tokens`, and the nodes it runs through.

        A match that ends inside an edge splits that edge, so the matched part is a node of its own.
        """
        tokens = tuple(tokens)
        node, matched, path, total = self.root, 0, [], len(tokens)
        now = next(self.clock)
        while matched < total:
            child = node.children.get(tokens[matched])
            if child is None:
                break
            child.last_access = now                  # before a split: the tail counts as used too
            edge = child.tokens
            run = whole = len(edge)
            if tokens[matched:matched + run] != edge:    # the usual case, the whole edge, without a call
                run = common_prefix(edge, tokens, matched)
            matched += run
            if run < whole:
                self._refile(child)                  # the tail may be a leaf whose key just changed
                path.append(self._split(child, run))
                break
            path.append(child)
            node = child
        if path:
            self._refile(path[-1])
        return matched, path

    def peek(self, tokens) -> int:
        """Length of the longest cached prefix of `tokens`, read only: no edge is split and no recency
        changes. What a router asks of a replica's cache before it decides where a request goes."""
        tokens = tuple(tokens)
        node, matched, total = self.root, 0, len(tokens)
        while matched < total:
            child = node.children.get(tokens[matched])
            if child is None:
                break
            edge = child.tokens
            run = len(edge)
            if tokens[matched:matched + run] != edge:
                run = common_prefix(edge, tokens, matched)
            matched += run
            if run < len(edge):
                break
            node = child
        return matched

    def _split(self, node: Node, at: int) -> Node:
        """Cut node's edge after `at` tokens; returns the new upper node (created now, so a tick younger
        than the walk that split it, as SGLang's new TreeNode is; it inherits hits and locks)."""
        upper = Node(node.tokens[:at], node.parent, {}, next(self.clock), node.hits, node.lock, next(self.ids))
        node.parent.children[upper.tokens[0]] = upper
        node.tokens = node.tokens[at:]
        node.parent = upper
        upper.children[node.tokens[0]] = node
        return upper

    # ---- insertion and eviction -----------------------------------------------------------------------
    def insert(self, tokens) -> int:
        """Cache `tokens` (a request's prompt and answer); returns how many new tokens were stored.

        Makes room first by evicting unlocked leaves; if that is not enough, stores what fits.
        """
        return self.store(tokens)[1]

    def store(self, tokens) -> tuple[int, int]:
        """insert, returning (tokens found already cached, tokens newly stored): the new ones are
        tokens[found:found + stored]."""
        tokens = tuple(tokens)
        matched, path = self.match(tokens)
        for n in path:                               # SGLang's _insert_helper: a hit on every node walked
            n.hits += 1
        return self._grow(tokens, matched, path)

    def store_matched(self, tokens, matched: int, path: list[Node]) -> tuple[int, int]:
        """store(tokens) for tokens that match(tokens) returned (matched, path) for, with no insert, evict or
        other match in this tree since (locks may change): that walk would enter the same nodes again, so only
        its effect is repeated, every node on the path used now. What a replica does when a prefill it started
        ends: nothing else touches its cache in between."""
        now = next(self.clock)
        for n in path:                               # the walk's marks, and the insert's hits
            n.last_access = now
            n.hits += 1
        return self._grow(tuple(tokens), matched, path)

    def _grow(self, tokens: tuple, matched: int, path: list[Node]) -> tuple[int, int]:
        """The rest of store, after its walk and its hits: the unmatched tail as a new leaf. The path's last
        node is filed again at the end, whatever happens, so a key its walk changed is never left stale."""
        node = path[-1] if path else self.root
        rest = tokens[matched:]
        if not rest:
            self._refile(node)
            return matched, 0
        if self.size + len(rest) > self.capacity:
            node.lock += 1                           # do not evict the path we are extending
            self._evictable.discard(node)
            self.evict(len(rest))
            node.lock -= 1
            rest = rest[: max(0, self.capacity - self.size)]
        if rest:
            leaf = Node(rest, node, {}, next(self.clock), 1, 0, next(self.ids))
            node.children[rest[0]] = leaf
            self.size += len(rest)
            self._file(leaf)                         # a new leaf, unlocked: evictable (what _refile finds)
            self._evictable.discard(node)            # what _refile(node) does to a node with a child
        else:
            self._refile(node)
        return matched, len(rest)

    def leaves(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            if not n.children and n is not self.root:
                out.append(n)
            stack.extend(n.children.values())
        return out

    def evictable(self) -> set[Node]:
        """The unlocked leaves: what eviction may take (a copy)."""
        return set(self._evictable)

    def evict(self, need: int) -> int:
        """Evict unlocked leaves, by policy, until `need` more tokens fit. Returns tokens evicted."""
        freed = 0
        heap, filed, evictable, on_evict = self._heap, self._filed, self._evictable, self.on_evict
        limit = self.capacity - need
        victim = None
        while self.size > limit:
            while victim is None and heap:           # the smallest live entry of an evictable leaf
                key = heapq.heappop(heap)
                node = filed.pop(key)
                if key == node.filed:                # else superseded by a later entry
                    node.filed = None
                    if node in evictable:
                        victim = node
            if victim is None:
                break
            parent = victim.parent
            del parent.children[victim.tokens[0]]
            evictable.discard(victim)
            if on_evict is not None:
                on_evict(victim)
            self.size -= len(victim.tokens)
            freed += len(victim.tokens)
            victim = None
            if not parent.children:                  # the parent has become a leaf
                if (self.size > limit and parent.lock == 0 and parent is not self.root
                        and (not heap or self._key(parent) < heap[0])):
                    victim = parent                  # it sorts first: what a push and a pop would give
                else:
                    self._refile(parent)
        self.evicted += freed
        return freed

    def lock(self, path: list[Node], delta: int) -> None:
        """Lock (delta +1) or release (-1) a matched path: its last node and every ancestor, walked up
        through the parents as SGLang's inc_lock_ref/dec_lock_ref do, so an edge of the path that a later
        match split (the new upper node inherits the lock) is released too."""
        last = node = path[-1] if path else self.root
        while node is not self.root and node is not None:
            node.lock += delta
            node = node.parent
        if last is not self.root:
            self._refile(last)                       # its ancestors have children: never evictable

    def record_hit(self, path: list[Node]) -> None:
        """Count a hit on each node of `path` outside an insert (SGLang counts hits only in insert)."""
        for n in path:
            n.hits += 1
            self._refile(n)

    # ---- the evictable set and its heap ------------------------------------------------------------------
    def _refile(self, node: Node) -> None:
        """Put node in or out of the evictable set after a change to its children, lock, time or hits."""
        parent = node.parent                         # None for the root
        if node.children or node.lock > 0 or parent is None or parent.children.get(node.tokens[0]) is not node:
            self._evictable.discard(node)            # not a leaf, held, the root, or already evicted
            return
        self._file(node)

    def _file(self, node: Node) -> None:
        """Put an unlocked leaf in the evictable set, with a heap entry for its current key."""
        self._evictable.add(node)
        key = (node.last_access << _TIME_SHIFT) | node.id           # _PACKED, written out: a call less each time
        if self._lfu:
            key |= node.hits << _HITS_SHIFT
        if key != node.filed:                        # keys only grow, so an equal key is the live entry
            node.filed = key                         # ids make keys unique across nodes
            self._filed[key] = node
            heapq.heappush(self._heap, key)
            if len(self._heap) > 64 + 4 * len(self._evictable):
                self._compact()

    def _compact(self) -> None:
        for n in self._filed.values():
            n.filed = None
        self._heap, self._filed = [], {}
        for n in self._evictable:
            n.filed = self._key(n)
            self._filed[n.filed] = n
            self._heap.append(n.filed)
        heapq.heapify(self._heap)

    def clear(self) -> None:
        """Empty the tree. Nodes point both ways (parent and children), so a dropped tree is garbage in cycles
        that only the cycle collector frees (about 170 nodes and their dicts a change of the load-balancer page at
        32 sessions); unlinked, reference counting frees them at once, and the collector ran 65 times, not 81,
        over 80 changes."""
        stack = [self.root]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            n.children = {}
            n.parent = None
        self.root, self.size = Node(), 0
        self._evictable, self._heap, self._filed = set(), [], {}

    def sequences(self) -> list[tuple]:
        """Every root-to-leaf token sequence: what the cache holds, for tests and drawing."""
        out = []

        def walk(n, prefix):
            prefix = prefix + n.tokens
            if not n.children and n is not self.root:
                out.append(prefix)
            for c in n.children.values():
                walk(c, prefix)

        walk(self.root, ())
        return out

    def nodes(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out


def common_prefix(a: tuple, b: tuple, start: int = 0) -> int:
    """Length of the common prefix of a and b[start:], by slice comparisons (C speed) and bisection.
    Slices are taken at most len(a) long, so walking a long prompt down many edges stays linear."""
    n = len(a)
    if b[start:start + n] == a:        # the usual case in a walk: the whole edge matches
        return n
    n = min(n, len(b) - start)
    if a[:n] == b[start:start + n]:
        return n
    lo, hi = 0, n                      # a[:lo] == b[start:start+lo], a[:hi] != b[start:start+hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[start + lo:start + mid]:
            lo = mid
        else:
            hi = mid
    return lo
