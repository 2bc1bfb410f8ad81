"""Replay a Mooncake-format trace against one prefix cache of 512-token blocks, with an optional offload tier.

The cache is a radix tree whose entries are the trace's hash ids, one per block (so its granularity is the
block: `tokens = blocks × block size`, capped at the prompt's length, because a prompt's last block may be
partial). Each request, in arrival order, walks the tree as far as its hash ids match, locks that path while it
runs, and then caches its whole prompt; the answer's blocks have no ids until a later prompt carries them.

A request's prompt splits into four runs, in this order (hash ids are chained, so each run is a prefix of
what is left):
- cached: found in GPU memory (the tree);
- reloaded: evicted earlier to the offload tier and loaded back (only with a tier);
- recomputed: computed before by some request, but evicted and dropped: prefilled again;
- new: never seen before in the trace.
cached + reloaded + recomputed is exactly what one cache that never evicts would find
(core.traces.unlimited_cache_hits). Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Iterable

from .radix import RadixTree
from .traces import report


@dataclasses.dataclass(frozen=True)
class Served:
    """What one request of the trace found, in tokens."""
    cached: int
    reloaded: int
    recomputed: int
    new: int
    evicted_blocks: int          # blocks this request's insert pushed out of GPU memory
    size_blocks: int             # blocks in GPU memory after it

    @property
    def history(self) -> int:
        """Prompt tokens some earlier request had computed: what an unlimited cache would have found."""
        return self.cached + self.reloaded + self.recomputed


def _offload(offloaded: set, node) -> None:
    offloaded.update(node.tokens)


class TraceCache:
    """One GPU's prefix cache over hash ids: `capacity_blocks` blocks, evicted by `policy` (the radix tree's
    lru or lfu); with `offload`, every evicted block is kept in a tier of unlimited size."""

    def __init__(self, capacity_blocks: int, policy: str = "lru", offload: bool = False, block_size: int = 512):
        self.tree = RadixTree(capacity_blocks, policy)
        self.block_size = block_size
        self.seen: set = set()                    # every block any request has computed
        self.offloaded: set = set()
        if offload:                               # the set alone, not self: no cycle through the tree
            self.tree.on_evict = functools.partial(_offload, self.offloaded)

    def clear(self) -> None:
        """Empty the cache (RadixTree.clear: why), offloaded tier and all."""
        self.tree.clear()
        self.seen.clear()
        self.offloaded.clear()

    def serve(self, blocks: tuple, input_length: int) -> Served:
        tree, b = self.tree, self.block_size
        before = tree.evicted
        found, path = tree.match(blocks)
        tokens = lambda n: min(n * b, input_length)     # the last block may be partial
        reload_end = found
        while reload_end < len(blocks) and blocks[reload_end] in self.offloaded:
            reload_end += 1
        seen_end = reload_end
        while seen_end < len(blocks) and blocks[seen_end] in self.seen:
            seen_end += 1
        self.seen.update(blocks)
        tree.lock(path, +1)
        tree.insert(blocks)
        tree.lock(path, -1)
        return Served(tokens(found), tokens(reload_end) - tokens(found), tokens(seen_end) - tokens(reload_end),
                      input_length - tokens(seen_end), tree.evicted - before, tree.size)


def replay(requests: Iterable, capacity_blocks: int, policy: str = "lru", offload: bool = False,
           block_size: int = 512) -> tuple[Served, ...]:
    """Each request (with `.blocks` and `.input_length`, in arrival order) served by one TraceCache; the
    browser's progress bar hears how far it is every 2,000 requests."""
    cache, requests, out = TraceCache(capacity_blocks, policy, offload, block_size), list(requests), []
    for i, q in enumerate(requests):
        if i % 2_000 == 0 and i:
            report(i / len(requests), f"replaying request {i:,} of {len(requests):,}")
        out.append(cache.serve(q.blocks, q.input_length))
    cache.clear()
    return tuple(out)
