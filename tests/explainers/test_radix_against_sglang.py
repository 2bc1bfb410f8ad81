"""The radix tree against SGLang's own RadixCache code, run side by side on random workloads.

Needs SGLang 0.5.23's source, which is not a dependency (its wheel is 39 MB and pulls CUDA packages):
    pip download sglang==0.5.23 --no-deps -d /tmp/sgl && unzip -q /tmp/sgl/sglang-0.5.23-*.whl -d /tmp/sglx
    KVX_SGLANG_SRC=/tmp/sglx .venv/bin/python -m pytest tests/explainers/test_radix_against_sglang.py
`make test` unpacks those sources into .cache/ and sets KVX_SGLANG_SRC; run alone, it is skipped without it. The files radix_cache.py, base_prefix_cache.py, cache_init_params.py,
evict_policy.py and mem_cache/utils.py run as released; every other sglang module they import (KV events,
metrics, allocators, kernels) is an inert stand-in, the allocator's frees do nothing, and time.monotonic
is a counter, so the run is deterministic (SGLang's clock only orders events).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import os
import random
import sys
import time
import types
from array import array
from pathlib import Path

import pytest

from kvx.explainers.core.radix import RadixTree

SRC = os.environ.get("KVX_SGLANG_SRC", "")
REAL = {"sglang.srt.mem_cache." + m for m in ("radix_cache", "base_prefix_cache", "cache_init_params",
                                              "evict_policy", "utils")}
pytestmark = pytest.mark.skipif(not (Path(SRC) / "sglang/srt/mem_cache/radix_cache.py").is_file(),
                                reason="set KVX_SGLANG_SRC to an unpacked sglang 0.5.23 wheel (see the docstring)")


class Inert:
    """Stands in for any sglang object the tree does not need: accepts anything, does nothing."""

    def __init__(self, *a, **k):
        pass

    def __getattr__(self, name):
        return lambda *a, **k: None


def _stand_in(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    if attr[:1].islower():
        return lambda *a, **k: Inert()
    return type(attr, (Inert,), {})


class _SGLangFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if not name.startswith("sglang"):
            return None
        if name in REAL:
            return importlib.util.spec_from_file_location(name, f"{SRC}/{name.replace('.', '/')}.py")
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = _stand_in
        return m

    def exec_module(self, module):
        pass


@pytest.fixture(scope="module")
def sgl():
    finder = _SGLangFinder()
    sys.meta_path.insert(0, finder)
    try:
        sys.modules.setdefault("sglang.srt.utils.common", importlib.import_module("sglang.srt.utils.common"))
        sys.modules["sglang.srt.utils.common"].ceil_align = lambda x, n: (x + n - 1) // n * n
        rc = importlib.import_module("sglang.srt.mem_cache.radix_cache")
        base = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
        policies = importlib.import_module("sglang.srt.mem_cache.evict_policy")
        ticks = itertools.count(1)
        rc.time = types.SimpleNamespace(monotonic=lambda: float(next(ticks)), perf_counter=time.perf_counter)
        yield types.SimpleNamespace(rc=rc, base=base, policies=policies)
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
            del sys.modules[name]


class Side:
    """SGLang's RadixCache driven through its public calls, as RadixTree.insert would drive it."""

    def __init__(self, sgl, policy, capacity):
        self.sgl, self.capacity = sgl, capacity
        self.cache = sgl.rc.RadixCache.create_simulated(mock_allocator=Inert())
        self.cache.eviction_strategy = {"lru": sgl.policies.LRUStrategy, "lfu": sgl.policies.LFUStrategy}[policy]()

    def key(self, tokens):
        return self.sgl.rc.RadixKey(array("q", tokens))

    def spell(self, node):
        out = []
        while node is not self.cache.root_node:
            out, node = list(node.key.token_ids) + out, node.parent
        return tuple(out)

    def nodes(self):
        out, stack = [], list(self.cache.root_node.children.values())
        while stack:
            out.append(stack.pop())
            stack.extend(out[-1].children.values())
        return out

    def size(self):
        return sum(len(n.key) for n in self.nodes())

    def match(self, tokens):
        r = self.cache.match_prefix(self.sgl.base.MatchPrefixParams(key=self.key(tokens)))
        return r.device_prefix_len, r.last_device_node

    def evict(self, n):
        gone, delete = [], self.cache._delete_leaf
        self.cache._delete_leaf = lambda node: (gone.append(self.spell(node)), delete(node))
        self.cache.evict(self.sgl.base.EvictParams(num_tokens=n))
        del self.cache._delete_leaf
        return gone

    def insert_within(self, tokens):
        """Hold the cached prefix, evict the shortfall (allocator.evict_to_free_tokens), insert what fits."""
        found, last = self.match(tokens)
        gone = []
        if found < len(tokens):
            self.cache.inc_lock_ref(last)
            gone = self.evict(self.size() + len(tokens) - found - self.capacity)
            self.cache.dec_lock_ref(last)
        room = max(0, self.capacity - self.size())
        self.cache.insert(self.sgl.base.InsertParams(key=self.key(tokens[: found + room])))
        return gone


def spelled(node) -> tuple:
    out = ()
    while node.parent is not None:
        out, node = node.tokens + out, node.parent
    return out


@pytest.mark.parametrize("seed", range(300))
def test_the_tree_agrees_with_sglangs_own_code(sgl, seed):
    """Every match length, every evicted leaf in order, and the final contents, under LRU and LFU, with
    requests that hold their prefix while others come and go."""
    rng = random.Random(seed)
    policy, capacity = rng.choice(["lru", "lfu"]), rng.randint(1, 24)
    tree, theirs = RadixTree(capacity, policy), Side(sgl, policy, capacity)
    gone, running = [], []
    tree.on_evict = lambda leaf: gone.append(spelled(leaf))
    for _ in range(rng.randint(1, 40)):
        op = rng.choice(["start", "finish", "match", "insert"])
        a, b = (tuple(rng.randint(0, 3) for _ in range(rng.randint(1, 8))) for _ in range(2))
        gone.clear()
        if op == "start":
            (m, path), (m2, last) = tree.match(a), theirs.match(a)
            assert m == m2
            tree.lock(path, +1)
            theirs.cache.inc_lock_ref(last)
            running.append((a + b, path, last))
        elif op == "finish" and running:
            tokens, path, last = running.pop(0)
            tree.insert(tokens)
            assert gone == theirs.insert_within(tokens)
            tree.lock(path, -1)
            theirs.cache.dec_lock_ref(last)
        elif op == "match":
            assert tree.match(a)[0] == theirs.match(a)[0]
        elif op == "insert":
            tree.insert(a + b)
            assert gone == theirs.insert_within(a + b)
    assert sorted(tree.sequences()) == sorted(theirs.spell(n) for n in theirs.nodes() if not n.children)
    assert tree.size == theirs.size()
