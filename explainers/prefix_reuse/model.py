"""Compute the system prompt once.

Users share one system prompt and take several turns each. Every request walks a radix tree of
cached token sequences as far as its prompt matches, reuses that cached KV, computes only the rest,
and then caches its prompt and answer for the next turn. Deterministic for a given seed.
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import dataclasses
import functools
import random

from ..core.params import ParamError, Params, choice, integer
from ..core.radix import EVICTION_POLICIES, RadixTree
from ..core.units import thousands

MESSAGE_BASE, ANSWER_OFFSET = 1_000_000, 5_000
MAX_TOKENS = 5_000_000


@dataclasses.dataclass(frozen=True)
class PrefixParams(Params):
    users: int = integer(8, unit="users", min=1, max=64, help="Users sharing the system prompt")
    system_prompt: int = integer(1_000, unit="tokens", min=0, max=32_000, help="Tokens in the shared system prompt")
    turns: int = integer(4, unit="turns", min=1, max=20, help="Turns each user takes")
    message: int = integer(100, unit="tokens", min=1, max=4_000, help="Tokens in each user message")
    answer: int = integer(200, unit="tokens", min=1, max=4_000, help="Tokens in each answer")
    capacity: int = integer(100_000, unit="tokens", min=100, max=10_000_000, help="Prefix cache capacity")
    policy: str = choice("lru", tuple(EVICTION_POLICIES), help="Which unused leaf is evicted first")
    prefill_rate: int = integer(10_000, unit="tokens/s", min=1, max=10_000_000,
                                help="Prefill throughput, to turn tokens into time")
    seed: int = integer(0, unit="seed", min=0, max=10_000, help="Seed for the order users arrive in each turn")

    def __post_init__(self):
        super().__post_init__()
        if self.total_tokens() > MAX_TOKENS:
            raise ParamError("turns", f"turns × users × prompt length must stay under {MAX_TOKENS:,} tokens so the "
                                      f"browser can simulate it; this workload has {self.total_tokens():,}.")

    def total_tokens(self) -> int:
        per_turn = self.message + self.answer
        return self.users * sum(self.system_prompt + t * per_turn + self.message for t in range(self.turns))


@dataclasses.dataclass(frozen=True)
class Req:
    index: int
    user: int
    turn: int
    prompt: tuple
    answer: tuple


def _message(u: int, t: int, n: int) -> tuple:
    base = MESSAGE_BASE + (u * 100 + t) * 10_000
    return tuple(range(base, base + n))


def _answer(u: int, t: int, n: int) -> tuple:
    base = MESSAGE_BASE + (u * 100 + t) * 10_000 + ANSWER_OFFSET
    return tuple(range(base, base + n))


def requests(p: PrefixParams) -> list[Req]:
    """Turn by turn, users in a seeded order; each prompt is the system prompt, the history, the message."""
    rng = random.Random(p.seed)
    system = tuple(range(p.system_prompt))
    out = []
    for t in range(p.turns):
        order = list(range(p.users))
        rng.shuffle(order)
        for u in order:
            history = [tok for s in range(t) for tok in _message(u, s, p.message) + _answer(u, s, p.answer)]
            out.append(Req(len(out), u, t, system + tuple(history) + _message(u, t, p.message),
                           _answer(u, t, p.answer)))
    return out


@dataclasses.dataclass(frozen=True)
class Outcome:
    requested: int
    matched: int
    computed: int
    evicted: int
    size: int


def serve(tree: RadixTree, r: Req) -> Outcome:
    """One request: match, lock the matched path while it runs, then cache prompt and answer."""
    before = tree.evicted
    matched, path = tree.match(r.prompt)
    tree.record_hit(path)
    tree.lock(path, +1)
    tree.insert(r.prompt + r.answer)
    tree.lock(path, -1)
    return Outcome(len(r.prompt), matched, len(r.prompt) - matched, tree.evicted - before, tree.size)


@functools.lru_cache(maxsize=8)
def history(p: PrefixParams) -> tuple[Outcome, ...]:
    tree = RadixTree(p.capacity, p.policy)
    return tuple(serve(tree, r) for r in requests(p))


def tree_after(p: PrefixParams, k: int) -> RadixTree:
    """The cache after the first k requests (k = 0: empty)."""
    tree = RadixTree(p.capacity, p.policy)
    for r in requests(p)[:k]:
        serve(tree, r)
    return tree


def evaluate(p: PrefixParams) -> dict:
    h = history(p)
    requested = sum(o.requested for o in h)
    matched = sum(o.matched for o in h)
    return {
        "requests": len(h),
        "tokens_requested": requested,
        "tokens_reused": matched,
        "tokens_computed": requested - matched,
        "hit_rate": matched / requested if requested else 0.0,
        "prefill_seconds_without": requested / p.prefill_rate,
        "prefill_seconds_with": (requested - matched) / p.prefill_rate,
        "prefill_seconds_saved": matched / p.prefill_rate,
        "tokens_evicted": sum(o.evicted for o in h),
        "peak_cache_tokens": max(o.size for o in h),
    }


# ---- what the page draws -------------------------------------------------------------------------------
def icicle(tree: RadixTree, highlight: set, new_tokens_from: int | None = None) -> dict:
    """Each node as a bar: x from its start to its end (tokens from the root), rows spanning its leaves."""
    cols = {"x0": [], "x1": [], "y0": [], "y1": [], "hits": [], "tokens": [], "state": []}
    row = [0]

    def walk(node, start):
        first = row[0]
        kids = sorted(node.children.values(), key=lambda n: n.tokens[0])
        if not kids:
            row[0] += 1
        for child in kids:
            walk(child, start + len(node.tokens))
        if node is tree.root:
            return
        cols["x0"].append(start)
        cols["x1"].append(start + len(node.tokens))
        cols["y0"].append(first - 0.42)
        cols["y1"].append(row[0] - 1 + 0.42)
        cols["hits"].append(node.hits)
        cols["tokens"].append(len(node.tokens))
        cols["state"].append("matched now" if id(node) in highlight else "cached")

    walk(tree.root, 0)
    return cols


def frame_data(p: PrefixParams, frame: int) -> dict:
    """Frame k shows the tree as request k found it, with the part it matched highlighted."""
    reqs = requests(p)
    k = max(0, min(len(reqs) - 1, frame))
    tree = tree_after(p, k)
    r = reqs[k]
    matched, path = tree.match(r.prompt)
    o = history(p)[k]
    return {
        "sources": {"tree": icicle(tree, {id(n) for n in path}),
                    "cursor": {"request": [k], "top": [max(o.requested for o in history(p))]},
                    "current": {"x0": [matched], "x1": [len(r.prompt)], "y": [-1.2],
                                "label": [f"request {k} computes {thousands(o.computed)} new tokens"]}},
        "animation": {"mode": "on_demand", "frames": len(reqs), "frame": k,
                      "caption": f"Request {k}: user {r.user}, turn {r.turn + 1}. Its prompt is "
                                 f"{thousands(o.requested)} tokens; {thousands(o.matched)} are already cached "
                                 f"(highlighted) and {thousands(o.computed)} are computed, saving "
                                 f"{o.matched / p.prefill_rate:.2f} s of prefill."},
        "texts": {},
    }


def page_data(p: PrefixParams) -> dict:
    h = history(p)
    r = evaluate(p)
    cum_with, cum_without, a, b = [], [], 0, 0
    for o in h:
        a += o.computed
        b += o.requested
        cum_with.append(a)
        cum_without.append(b)
    at = frame_data(p, len(h) - 1)
    return {
        **at,
        "sources": {**at["sources"],
                    "per_request": {"request": list(range(len(h))), "matched": [o.matched for o in h],
                                    "computed": [o.computed for o in h]},
                    "cumulative": {"request": list(range(len(h))), "with_cache": cum_with,
                                   "without_cache": cum_without}},
        "ranges": {},
        "formula": formula(p, r),
        "readouts": readouts(p, r),
        "notes": [],
    }


def formula(p: PrefixParams, r: dict) -> list[dict]:
    per_user = p.message + p.answer
    return [
        {"name": "Tokens requested", "formula": "Σ over requests of (system prompt + history + message)",
         "substituted": f"{p.users} users × Σ_turn ({thousands(p.system_prompt)} + turn × {thousands(per_user)} "
                        f"+ {thousands(p.message)}) over {p.turns} turns",
         "result": thousands(r["tokens_requested"])},
        {"name": "Tokens reused", "formula": "Σ over requests of the longest cached prefix",
         "substituted": "found by walking the radix tree", "result": thousands(r["tokens_reused"])},
        {"name": "Hit rate", "formula": "tokens reused ÷ tokens requested",
         "substituted": f"{thousands(r['tokens_reused'])} ÷ {thousands(r['tokens_requested'])}",
         "result": f"{r['hit_rate']:.1%}"},
        {"name": "Prefill time", "formula": "tokens computed ÷ prefill rate",
         "substituted": f"{thousands(r['tokens_computed'])} ÷ {thousands(p.prefill_rate)} tokens/s "
                        f"(without the cache: {thousands(r['tokens_requested'])} ÷ {thousands(p.prefill_rate)})",
         "result": f"{r['prefill_seconds_with']:.1f} s instead of {r['prefill_seconds_without']:.1f} s"},
    ]


def readouts(p: PrefixParams, r: dict) -> list[dict]:
    return [
        {"label": "Hit rate", "value": f"{r['hit_rate']:.0%}", "detail": "of prompt tokens came from the cache"},
        {"label": "Prefill computed", "value": thousands(r["tokens_computed"]),
         "detail": f"tokens, instead of {thousands(r['tokens_requested'])}"},
        {"label": "Prefill time saved", "value": f"{r['prefill_seconds_saved']:.1f} s",
         "detail": f"at {thousands(p.prefill_rate)} tokens/s"},
        {"label": "Cache", "value": f"{thousands(r['peak_cache_tokens'])}",
         "detail": f"tokens at most, of {thousands(p.capacity)}; {thousands(r['tokens_evicted'])} evicted"},
    ]
