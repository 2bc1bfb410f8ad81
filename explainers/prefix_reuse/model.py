"""Compute the system prompt once.

Users share one system prompt and take several turns each. Every request walks a radix tree of
cached token sequences as far as its prompt matches, reuses that cached KV, computes only the rest,
and then caches its prompt and answer for the next turn. Tokens become seconds through the shared
time model (core.timing): a request computes n new tokens that attend to the c cached ones.
Deterministic for a given seed. Standard library only: this module runs in the browser.

An uploaded Mooncake-format trace (core/traces.py) replaces the synthetic users: the tree then holds the
trace's hash ids, one entry per 512-token block (core/trace_replay.py), and tokens = blocks × 512, capped
at each prompt's length.
"""
from __future__ import annotations

import dataclasses
import functools
import random

from ..core import trace_replay, traces
from ..core.gpus import GPUS
from ..core.limits import check_context, check_weights_fit
from ..core.models import MODELS
from ..core.params import ParamError, Params, choice, integer, number
from ..core.radix import EVICTION_POLICIES, RadixTree
from ..core.summaries import pct, summaries
from ..core.timing import prefill_formula, prefill_seconds
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
    model: str = choice("llama-3-8b", MODELS, help="Model preset, for the prefill time")
    gpu: str = choice("h100-sxm", GPUS, help="GPU preset, for the prefill time")
    mfu: float = number(0.5, unit="share", min=0.01, max=1.0, help="Share of peak FLOP/s prefill reaches")
    seed: int = integer(0, unit="seed", min=0, max=10_000, help="Seed for the order users arrive in each turn")
    # An uploaded trace: data, not a parameter (no control, not in the URL). Empty: the synthetic users.
    trace: str = dataclasses.field(default="", repr=False, metadata={})

    def __post_init__(self):
        super().__post_init__()
        m = MODELS[self.model]
        check_weights_fit("model", m, GPUS[self.gpu], 1, 2, "bf16")       # the time is for one GPU
        if self.trace:
            traces.parse_trace(self.trace)            # a bad line is refused here, naming its line and field
            return                                    # the synthetic users' controls do not apply to a trace
        longest = self.system_prompt + self.turns * (self.message + self.answer)
        check_context("turns", m, longest, "the longest conversation (system prompt, then every turn's message "
                                           "and answer)")
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


def trace_requests(text: str) -> tuple:
    """The trace's requests in arrival order, each with a session inferred from its hash ids (the
    load-balancer's rule), for the captions only: the replay does not use the sessions."""
    return traces.requests_with_sessions(text)


@functools.lru_cache(maxsize=8)
def requests(p: PrefixParams) -> tuple[Req, ...]:
    """Turn by turn, users in a seeded order; each prompt is the system prompt, the history, the message.
    With a trace: its requests, each prompt its hash ids (one per block) and no answer (a trace names the
    answer's blocks only when a later prompt holds them)."""
    if p.trace:
        return tuple(Req(q.index, q.session, q.turn, q.blocks, ()) for q in trace_requests(p.trace))
    rng = random.Random(p.seed)
    system = tuple(range(p.system_prompt))
    history = [system] * p.users                     # each user's prompt so far, less the new message
    out = []
    for t in range(p.turns):
        order = list(range(p.users))
        rng.shuffle(order)
        for u in order:
            message = _message(u, t, p.message)
            out.append(Req(len(out), u, t, history[u] + message, _answer(u, t, p.answer)))
            history[u] = history[u] + message + out[-1].answer
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Outcome:
    requested: int
    matched: int
    computed: int
    evicted: int
    size: int


def serve(tree: RadixTree, r: Req) -> Outcome:
    """One request: match, lock the matched path while it runs, then cache prompt and answer (the insert
    counts the hits, as SGLang's does)."""
    before = tree.evicted
    matched, path = tree.match(r.prompt)
    tree.lock(path, +1)
    tree.insert(r.prompt + r.answer)
    tree.lock(path, -1)
    return Outcome(len(r.prompt), matched, len(r.prompt) - matched, tree.evicted - before, tree.size)


def serve_like_sglang(tree: RadixTree, r: Req) -> Outcome:
    """The same request under SGLang 0.5.23's scheduler rules, for the page's comparison: a match stops at
    prompt length − 1 (Req._compute_max_prefix_len: one token must be computed for the logits), the last
    answer token is never cached (its KV was never computed), and the prompt ends a node of its own, so
    the answer is a leaf that can be evicted without it (RadixCache._insert_cache, split_prompt)."""
    before = tree.evicted
    matched, path = tree.match(r.prompt[:-1])
    tree.lock(path, +1)
    tree.insert(r.prompt + r.answer[:-1])
    tree.match(r.prompt)                         # splits at the prompt's end, as SGLang's second insert does
    tree.lock(path, -1)
    return Outcome(len(r.prompt), matched, len(r.prompt) - matched, tree.evicted - before, tree.size)


@functools.lru_cache(maxsize=8)
def history(p: PrefixParams, rules=serve) -> tuple[Outcome, ...]:
    if p.trace:
        return trace_history(p)
    if rules is serve:                           # the held replay: drawing the last frame has served all but one
        return tuple(_replay(p, len(requests(p)))[2])
    tree = RadixTree(p.capacity, p.policy)
    try:
        return tuple(rules(tree, r) for r in requests(p))
    finally:
        tree.clear()                             # its nodes freed now, not by the cycle collector


B = traces.BLOCK_SIZE


@functools.lru_cache(maxsize=4)
def _served(text: str, blocks: int, policy: str) -> tuple:
    """The replay by what it depends on alone: a change of model, GPU or MFU reprices it, not reruns it."""
    return trace_replay.replay(trace_requests(text), blocks, policy)


def trace_history(p: PrefixParams) -> tuple[Outcome, ...]:
    """The trace replayed through a tree of ⌊capacity ÷ 512⌋ blocks; every figure in tokens."""
    reqs = trace_requests(p.trace)
    served = _served(p.trace, p.capacity // B, p.policy)
    return tuple(Outcome(q.input_length, s.cached, q.input_length - s.cached, s.evicted_blocks * B,
                         s.size_blocks * B) for q, s in zip(reqs, served))


def seconds(p: PrefixParams, new: int, cached: int) -> float:
    """Prefill time of `new` tokens that attend to `cached` ones (core.timing: linear + causal attention)."""
    return prefill_seconds(MODELS[p.model], GPUS[p.gpu], new, cached, mfu=p.mfu)


# One cache kept at the last frame drawn, so stepping or playing forward serves one request a frame instead of
# replaying from the start (a step back replays from the start). Frames read it and never change it (a match
# would split edges and change recency), so the page's last frame and the history share one replay.
_held: dict = {}


def _drop_held() -> None:
    """Forget the held cache, emptying it first: a radix tree's nodes point both ways, and a dropped one left to
    Python's cycle collector cost single pauses of 60-150 ms a few changes in eighty (Pyodide, under Node)."""
    for held in _held.values():
        held[1].clear()
    _held.clear()


def _replay(p: PrefixParams, k: int) -> list:
    """The synthetic requests before k served in order by the held tree: [k, tree, their outcomes]."""
    key = ("synthetic", p)
    held = _held.get(key)
    if held is None or held[0] > k:
        _drop_held()
        held = _held[key] = [0, RadixTree(p.capacity, p.policy), []]
    for r in requests(p)[held[0]:k]:
        held[2].append(serve(held[1], r))
    held[0] = k
    return held


def _outcome(p: PrefixParams, k: int) -> Outcome:
    """Request k's outcome: from the held replay if it has served request k, else by serving up to it."""
    if p.trace:
        return history(p)[k]
    held = _held.get(("synthetic", p))
    return held[2][k] if held is not None and len(held[2]) > k else _replay(p, k + 1)[2][k]


def tree_after(p: PrefixParams, k: int) -> RadixTree:
    """The cache after the first k requests (k = 0: empty). With a trace its entries are blocks, and the tree
    is the held one: read it, never change it (a match would change its recency)."""
    if p.trace:
        key = (p.trace, p.capacity // B, p.policy)
        held = _held.get(key)
        if held is None or held[0] > k:
            _drop_held()
            held = _held[key] = [0, trace_replay.TraceCache(p.capacity // B, p.policy)]
        for q in trace_requests(p.trace)[held[0]:k]:
            held[1].serve(q.blocks, q.input_length)
        held[0] = k
        return held[1].tree
    return _replay(p, k)[1]


def evaluate(p: PrefixParams) -> dict:
    h = history(p)
    requested = sum(o.requested for o in h)
    matched = sum(o.matched for o in h)
    without = sum(seconds(p, o.requested, 0) for o in h)
    with_cache = sum(seconds(p, o.computed, o.matched) for o in h)
    if p.trace:
        found, _ = traces.unlimited_cache_hits(traces.parse_trace(p.trace))
        reqs = trace_requests(p.trace)
        cap = p.capacity // B * B
        trace = {"trace": "uploaded", "sessions": len({q.session for q in reqs}),
                 "unlimited_cache_tokens": found, "unlimited_cache_hit_rate": found / requested, "capacity_blocks": p.capacity // B,
                 "requests_over_capacity": sum(q.input_length > cap for q in reqs)}
    sglang = history(p, serve_like_sglang) if not p.trace else None
    return {
        **({"trace": "synthetic"} if not p.trace else trace),
        "requests": len(h),
        "tokens_requested": requested,
        "tokens_reused": matched,
        "tokens_computed": requested - matched,
        "hit_rate": matched / requested if requested else 0.0,
        "prefill_seconds_without": without,
        "prefill_seconds_with": with_cache,
        "prefill_seconds_saved": without - with_cache,
        # SGLang's token-level rules (a match stops one token short, ...) do not apply to whole blocks.
        "hit_rate_sglang_rules": sum(o.matched for o in sglang) / requested if sglang is not None else None,
        "tokens_evicted": sum(o.evicted for o in h),
        "peak_cache_tokens": max(o.size for o in h),
    }


# ---- what the page draws -------------------------------------------------------------------------------
def icicle(tree: RadixTree, highlight: set, new_tokens_from: int | None = None, unit: int = 1,
           partial: tuple | None = None) -> dict:
    """Each node as a bar: x from its start to its end (tokens from the root), rows spanning its leaves.
    `unit`: tokens per tree entry (a trace's tree holds 512-token blocks). `partial` = (node id, entries):
    a match that ends inside that node, drawn as its matched part and the rest."""
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
        cut = partial[1] if partial and partial[0] == id(node) else 0
        pieces = [(0, cut, "matched now"), (cut, len(node.tokens), "cached")] if cut else \
            [(0, len(node.tokens), "matched now" if id(node) in highlight else "cached")]
        for a, b, state in pieces:
            cols["x0"].append((start + a) * unit)
            cols["x1"].append((start + b) * unit)
            cols["y0"].append(first - 0.42)
            cols["y1"].append(row[0] - 1 + 0.42)
            cols["hits"].append(node.hits)
            cols["tokens"].append((b - a) * unit)
            cols["state"].append(state)

    walk(tree.root, 0)
    del walk              # a function that calls itself holds itself (a cycle): let it go now
    return cols


def frame_data(p: PrefixParams, frame: int) -> dict:
    """Frame k shows the tree as request k found it, with the part it matched highlighted."""
    reqs = requests(p)
    k = max(0, min(len(reqs) - 1, frame))
    tree = tree_after(p, k)
    r = reqs[k]
    path, partial = _read_match(tree, r.prompt)  # read only: the held tree goes on to the next frame
    drawn = icicle(tree, {id(n) for n in path}, unit=B if p.trace else 1, partial=partial)
    o = _outcome(p, k)                           # may serve request k: after the tree is drawn
    top = max(len(q.prompt) for q in reqs) if not p.trace else max(o.requested for o in history(p))
    sources = {"tree": drawn, "cursor": {"request": [k], "top": [top]},
               "current": {"x0": [o.matched], "x1": [o.requested], "y": [-1.2],
                           "label": [f"request {k} computes {thousands(o.computed)} new tokens"]}}
    return {
        "sources": sources,
        "animation": {"mode": "on_demand", "frames": len(reqs), "frame": k,
                      "caption": f"Request {k}: {'session' if p.trace else 'user'} {r.user}, turn {r.turn + 1}. Its prompt is "
                                 f"{thousands(o.requested)} tokens; {thousands(o.matched)} are already cached "
                                 f"(highlighted) and {thousands(o.computed)} are computed, saving "
                                 f"{_ms(seconds(p, o.requested, 0) - seconds(p, o.computed, o.matched))} "
                                 f"of prefill."},
        "texts": summaries(tree=tree_summary(sources)),
    }


def tree_summary(sources: dict) -> str:
    """The tree plot in words, from its bars and the current request's line."""
    t, cur = sources["tree"], sources["current"]
    k, matched, prompt = sources["cursor"]["request"][0], cur["x0"][0], cur["x1"][0]
    lit = sum(n for n, s in zip(t["tokens"], t["state"]) if s == "matched now")
    return (f"When request {k} arrives the tree holds {thousands(sum(t['tokens']))} cached tokens in "
            f"{thousands(len(t['tokens']))} runs; its prompt of {thousands(prompt)} tokens finds "
            f"{thousands(matched)} of them cached ({thousands(lit)} highlighted) and computes "
            f"{thousands(prompt - matched)} new.")


def plot_summaries(sources: dict) -> dict:
    """The whole run's plots in words, from the columns they draw."""
    per, cum = sources["per_request"], sources["cumulative"]
    reused, computed = sum(per["matched"]), sum(per["computed"])
    total = reused + computed
    n = len(per["request"])
    each = (f"Of {thousands(n)} requests' {thousands(total)} prompt tokens, {thousands(reused)} "
            f"({pct(reused / total if total else 0)}) were reused from the cache and {thousands(computed)} computed; "
            f"the most any one request reused was {thousands(max(per['matched']))}.")
    with_, without = cum["with_cache"][-1], cum["without_cache"][-1]
    so_far = (f"By the last request prefill has computed {thousands(with_)} tokens with prefix caching "
              f"against {thousands(without)} without, {pct(1 - with_ / without if without else 0)} fewer.")
    return summaries(per=each, cum=so_far)


def _read_match(tree: RadixTree, tokens: tuple) -> tuple[list, tuple | None]:
    """The nodes a match of `tokens` runs through, without splitting an edge or touching recency: the whole
    nodes, and (node id, entries matched) for one the match ends inside."""
    node, at, path = tree.root, 0, []
    while at < len(tokens):
        child = node.children.get(tokens[at])
        if child is None:
            break
        run = 0
        while run < len(child.tokens) and at + run < len(tokens) and child.tokens[run] == tokens[at + run]:
            run += 1
        at += run
        if run < len(child.tokens):
            return path, (id(child), run)
        path.append(child)
        node = child
    return path, None


def page_data(p: PrefixParams) -> dict:
    at = frame_data(p, len(requests(p)) - 1)    # first: its replay then gives the history one request later
    h = history(p)
    r = evaluate(p)
    cum_with, cum_without, a, b = [], [], 0, 0
    for o in h:
        a += o.computed
        b += o.requested
        cum_with.append(a)
        cum_without.append(b)
    sources = {**at["sources"],
               "per_request": {"request": list(range(len(h))), "matched": [o.matched for o in h],
                               "computed": [o.computed for o in h]},
               "cumulative": {"request": list(range(len(h))), "with_cache": cum_with,
                              "without_cache": cum_without}}
    return {
        **at,
        "sources": sources,
        "ranges": {},
        "formula": formula(p, r) if not p.trace else formula_trace(p, r),
        "readouts": readouts(p, r) if not p.trace else readouts_trace(p, r),
        "notes": [] if not p.trace else notes_trace(p, r),
        "texts": {**at["texts"], **plot_summaries(sources), "trace": trace_text(p, r)},
    }


def trace_text(p: PrefixParams, r: dict) -> str:
    if not p.trace:
        return (f"Workload: the synthetic users ({p.users} users × {p.turns} turns). Upload a Mooncake-format "
                f"trace above to replay its requests instead.")
    span = trace_requests(p.trace)[-1].arrival - trace_requests(p.trace)[0].arrival
    return (f"Workload: your trace, {r['requests']:,} requests ({thousands(r['tokens_requested'])} prompt tokens "
            f"over {span:,.1f} s). The users, system prompt, turns, message, answer and seed controls do not apply "
            f"to it, and a link reproduces only the synthetic workload.")


def notes_trace(p: PrefixParams, r: dict) -> list[str]:
    out = ["The tree holds the trace's hash ids, one entry per 512-token block, so a prompt is matched block by "
           "block and tokens = blocks × 512, capped at the prompt's length (its last block may be partial). A "
           "trace names no tokens and no answers: each prompt is cached when it arrives, and the next turn finds "
           "the answer only as blocks of its own prompt. Set capacity to your GPU's KV memory (the cache-renting "
           "page gives it); the sessions in the captions are inferred from prefix chains."]
    if r["requests_over_capacity"]:
        out.append(f"{r['requests_over_capacity']:,} of the trace's prompts are longer than the cache's "
                   f"{thousands(r['capacity_blocks'] * B)} tokens: only their first blocks are cached.")
    return out


def formula_trace(p: PrefixParams, r: dict) -> list[dict]:
    m, g, h = MODELS[p.model], GPUS[p.gpu], history(p)
    last = h[-1]
    found = r["unlimited_cache_tokens"]
    return [
        {"name": "Cache in blocks", "formula": "⌊capacity ÷ 512 tokens per hash id⌋",
         "substituted": f"⌊{thousands(p.capacity)} ÷ 512⌋", "result": f"{thousands(r['capacity_blocks'])} blocks"},
        {"name": "Tokens reused", "formula": "Σ over requests of min(cached prefix in blocks × 512, prompt)",
         "substituted": "found by walking the radix tree of hash ids", "result": thousands(r["tokens_reused"])},
        {"name": "Hit rate", "formula": "tokens reused ÷ tokens requested",
         "substituted": f"{thousands(r['tokens_reused'])} ÷ {thousands(r['tokens_requested'])}",
         "result": f"{r['hit_rate']:.1%}"},
        {"name": "Reference: an unlimited cache",
         "formula": "Σ min(longest prefix of hash ids seen before × 512, prompt) ÷ tokens requested "
                    "(core.traces.unlimited_cache_hits)",
         "substituted": f"{thousands(found)} ÷ {thousands(r['tokens_requested'])}",
         "result": f"{r['unlimited_cache_hit_rate']:.1%}"},
        {**prefill_formula(m, g, last.computed, last.matched, mfu=p.mfu),
         "name": f"Prefill time of the last request (n = {thousands(last.computed)} computed, "
                 f"c = {thousands(last.matched)} cached)"},
        {"name": "Prefill time, all requests",
         "formula": "Σ over requests of prefill(n = computed, c = reused); without the cache prefill(n = prompt, c = 0)",
         "substituted": f"{len(h):,} requests, {p.model} on {p.gpu} at MFU {p.mfu:g}",
         "result": f"{_ms(r['prefill_seconds_with'])} instead of {_ms(r['prefill_seconds_without'])}"},
    ]


def readouts_trace(p: PrefixParams, r: dict) -> list[dict]:
    return [
        {"label": "Hit rate", "value": f"{r['hit_rate']:.0%}",
         "detail": f"of prompt tokens came from the cache; an unlimited cache: {r['unlimited_cache_hit_rate']:.0%}"},
        {"label": "Workload", "value": f"your trace: {r['requests']:,} requests",
         "detail": f"{thousands(r['tokens_requested'])} prompt tokens"},
        {"label": "Prefill time saved", "value": _ms(r["prefill_seconds_saved"]),
         "detail": f"{_ms(r['prefill_seconds_with'])} instead of {_ms(r['prefill_seconds_without'])}, "
                   f"{p.model} on one {p.gpu} at MFU {p.mfu:g}"},
        {"label": "Cache", "value": f"{thousands(r['peak_cache_tokens'])}",
         "detail": f"tokens at most, of {thousands(r['capacity_blocks'] * B)} (whole blocks); "
                   f"{thousands(r['tokens_evicted'])} evicted"},
    ]


def formula(p: PrefixParams, r: dict) -> list[dict]:
    per_user = p.message + p.answer
    m, g, h = MODELS[p.model], GPUS[p.gpu], history(p)
    last = h[-1]
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
        {"name": "Hit rate under SGLang's scheduler rules",
         "formula": "the same workload, matches capped at prompt − 1, the last answer token not cached, "
                    "each answer a leaf of its own (SGLang 0.5.23)",
         "substituted": "found by replaying it on a second tree", "result": f"{r['hit_rate_sglang_rules']:.1%}"},
        {**prefill_formula(m, g, last.computed, last.matched, mfu=p.mfu),
         "name": f"Prefill time of the last request (n = {thousands(last.computed)} computed, "
                 f"c = {thousands(last.matched)} cached)"},
        {"name": "Prefill time, all requests",
         "formula": "Σ over requests of prefill(n = computed, c = reused); without the cache prefill(n = prompt, c = 0)",
         "substituted": f"{len(h)} requests, {p.model} on {p.gpu} at MFU {p.mfu:g}",
         "result": f"{r['prefill_seconds_with']:.3g} s instead of {r['prefill_seconds_without']:.3g} s"},
    ]


def readouts(p: PrefixParams, r: dict) -> list[dict]:
    return [
        {"label": "Hit rate", "value": f"{r['hit_rate']:.0%}", "detail": "of prompt tokens came from the cache"},
        {"label": "Prefill computed", "value": thousands(r["tokens_computed"]),
         "detail": f"tokens, instead of {thousands(r['tokens_requested'])}"},
        {"label": "Prefill time saved", "value": _ms(r["prefill_seconds_saved"]),
         "detail": f"{_ms(r['prefill_seconds_with'])} instead of {_ms(r['prefill_seconds_without'])}, "
                   f"{p.model} on one {p.gpu} at MFU {p.mfu:g}"},
        {"label": "Cache", "value": f"{thousands(r['peak_cache_tokens'])}",
         "detail": f"tokens at most, of {thousands(p.capacity)}; {thousands(r['tokens_evicted'])} evicted"},
    ]


def _ms(s: float) -> str:
    return f"{s * 1000:,.1f} ms" if s < 1 else f"{s:,.2f} s"
