"""A radix tree over token sequences, the data structure behind prefix caching (SGLang's RadixAttention).

Each edge holds a run of tokens; a path from the root spells a cached prefix. A request walks the
tree as far as its tokens match, reuses that much cached KV, and inserts the rest. When the cache is
full, leaves that no running request holds are evicted, least recently used first (or least often
used). A policy is just a sort key, as in SGLang's evict_policy. Standard library only, shared by
the explainers that need a prefix cache.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Callable


@dataclasses.dataclass(eq=False)
class Node:
    tokens: tuple = ()                               # the edge into this node
    parent: "Node | None" = None
    children: dict = dataclasses.field(default_factory=dict)   # first token -> child
    last_access: int = 0
    hits: int = 0                                    # requests whose match ran through this node
    lock: int = 0                                    # running requests that still use it
    id: int = 0

    def depth(self) -> int:
        """Tokens from the root to the end of this node."""
        n, node = 0, self
        while node.parent is not None:
            n += len(node.tokens)
            node = node.parent
        return n


# A policy maps a leaf to a sort key: the smallest key is evicted first.
EVICTION_POLICIES: dict[str, Callable[[Node], tuple]] = {
    "lru": lambda n: (n.last_access, n.id),
    "lfu": lambda n: (n.hits, n.last_access, n.id),
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

    # ---- lookup -----------------------------------------------------------------------------------
    def match(self, tokens) -> tuple[int, list[Node]]:
        """Length of the longest cached prefix of `tokens`, and the nodes it runs through.

        A match that ends inside an edge splits that edge, so the matched part is a node of its own.
        """
        tokens = tuple(tokens)
        node, matched, path = self.root, 0, []
        now = next(self.clock)
        while matched < len(tokens):
            child = node.children.get(tokens[matched])
            if child is None:
                break
            run = _common(child.tokens, tokens[matched:])
            if run < len(child.tokens):
                child = self._split(child, run)
            matched += run
            child.last_access = now
            path.append(child)
            node = child
        return matched, path

    def peek(self, tokens) -> int:
        """Length of the longest cached prefix of `tokens`, read only: no edge is split and no recency
        changes. What a router asks of a replica's cache before it decides where a request goes."""
        tokens = tuple(tokens)
        node, matched = self.root, 0
        while matched < len(tokens):
            child = node.children.get(tokens[matched])
            if child is None:
                break
            run = _common(child.tokens, tokens[matched:])
            matched += run
            if run < len(child.tokens):
                break
            node = child
        return matched

    def _split(self, node: Node, at: int) -> Node:
        """Cut node's edge after `at` tokens; returns the new upper node."""
        upper = Node(node.tokens[:at], node.parent, {}, node.last_access, node.hits, node.lock, next(self.ids))
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
        tokens = tuple(tokens)
        matched, path = self.match(tokens)
        node = path[-1] if path else self.root
        rest = tokens[matched:]
        if not rest:
            return 0
        node.lock += 1                               # do not evict the path we are extending
        self.evict(len(rest))
        node.lock -= 1
        rest = rest[: max(0, self.capacity - self.size)]
        if not rest:
            return 0
        leaf = Node(rest, node, {}, next(self.clock), 0, 0, next(self.ids))
        node.children[rest[0]] = leaf
        self.size += len(rest)
        return len(rest)

    def leaves(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            if not n.children and n is not self.root:
                out.append(n)
            stack.extend(n.children.values())
        return out

    def evict(self, need: int) -> int:
        """Evict unlocked leaves, by policy, until `need` more tokens fit. Returns tokens evicted."""
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

    def lock(self, path: list[Node], delta: int) -> None:
        for n in path:
            n.lock += delta

    def record_hit(self, path: list[Node]) -> None:
        for n in path:
            n.hits += 1

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


def _common(a: tuple, b: tuple) -> int:
    """Length of the common prefix of a and b, by slice comparisons (C speed) and bisection."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n                      # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
