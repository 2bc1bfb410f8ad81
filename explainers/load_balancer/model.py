"""The load balancer decides the hit rate.

The same multi-turn sessions go to the same fleet of replicas under four routers, side by side:
round-robin, least-loaded, sticky sessions (consistent hashing of the session id) and a cache-aware
router that scores each replica by the prefix it already holds, less its queued work. Each replica
has a prefix cache of limited size (the radix tree of `core.radix`, over 512-token blocks) and
serves its queue first come, first served, one prefill at a time.

The workload is a trace in the Mooncake format (one request per line: `timestamp` in ms,
`input_length`, `output_length`, `hash_ids` of the prompt's blocks), either generated here from a
seeded session model or uploaded by the reader. A deterministic discrete-event simulation (a heap
ordered by time, priority and a counter; no wall clock) replays it under each router; the two routers that never
look at the fleet are replayed a replica at a time instead, with the same results (replay_cache_blind).
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import heapq
import itertools
import math
import random
import typing
import zlib

from ..cache_renting.model import CacheRentingParams, evaluate as cache_renting
from ..core import timing, traces
from ..core.gpus import GPUS
from ..core.limits import check_tensor_parallel, check_weights_fit
from ..core.models import MODELS
from ..core.params import ParamError, Params, choice, integer, number
from ..core.radix import RadixTree
from ..core.summaries import listing, pct, sig, summaries
from ..core.traces import SHARED, Request, parse_trace, to_jsonl
from ..core.traces import with_sessions as _requests
from ..core.units import GB, thousands

MAX_TRACE_BYTES = traces.CPYTHON.bytes          # an uploaded trace: limits set in core.traces, by the work
MAX_TRACE_REQUESTS = traces.CPYTHON.requests
MAX_BLOCKS = 30_000                # prompt blocks of the synthetic trace: the worst change replays in under 0.5 s of CPU
MAX_FRAMES = 200
RING_POINTS = 64                   # virtual nodes per replica on the consistent-hashing ring
QUEUE_SHOWN = 8                    # queued requests drawn per replica; the rest are counted
# A replay keeps a running by-session tally of each cache (every block stored or evicted counted once) only when
# it snapshots more arrivals than this; for fewer, each snapshot counts its tree (what it holds, once), which is
# cheaper: a change of the page snapshots one arrival in three of its four replays.
WALKED_TALLIES = 8


@dataclasses.dataclass(frozen=True)
class LoadBalancerParams(Params):
    replicas: int = integer(4, unit="replicas", min=1, max=16, help="Replicas behind the load balancer")
    sessions: int = integer(16, unit="sessions", min=1, max=64, help="Conversations (synthetic trace)")
    turns: int = integer(4, unit="turns", min=1, max=30,
                         help="Turns per session on average; requests = sessions × turns (synthetic trace)")
    system_prompt: int = integer(1_536, unit="tokens", min=0, max=32_768,
                                 help="Shared system prompt at the start of every prompt (synthetic trace)")
    message: int = integer(512, unit="tokens", min=1, max=16_384, help="Each user message (synthetic trace)")
    answer: int = integer(512, unit="tokens", min=0, max=16_384,
                          help="Each answer, which the next turn's prompt repeats (synthetic trace)")
    arrival_rate: float = number(12.0, unit="requests/s", min=0.01, max=1_000,
                                 help="Mean arrival rate, Poisson (synthetic trace)")
    skew: float = number(1.0, unit="Zipf exponent", min=0, max=3,
                         help="How unevenly turns fall on sessions: 0 even, 1 the first session gets most")
    model: str = choice("llama-3-70b", MODELS, help="Model every replica serves (shapes from its config.json)")
    gpu: str = choice("h100-sxm", GPUS, help="GPU preset (datasheet memory and BF16 FLOP/s)")
    gpus_per_replica: int = integer(2, unit="GPUs", min=1, max=8,
                                    help="GPUs per replica (tensor parallel): they hold its weights and its cache")
    mfu: float = number(0.5, unit="share", min=0.01, max=1.0, help="Share of peak FLOP/s prefill reaches")
    capacity: int | None = integer(None, unit="tokens", min=1, max=100_000_000, optional=True,
                                   help="Override: prefix cache per replica (empty: what its GPUs hold after the "
                                        "weights and a 6 GB reserve each)")
    prefill_rate: int | None = integer(None, unit="tokens/s", min=1, max=10_000_000, optional=True,
                                       help="Override: a flat prefill rate per replica (empty: the time model, "
                                            "linear FLOPs plus attention to the cached prefix)")
    load_weight: float = number(2.0, unit="tokens/token", min=0, max=100,
                                help="Cache-aware router: how much a token of queued work weighs against "
                                     "a token of cached prefix")
    block_size: int = integer(512, unit="tokens", min=1, max=4_096,
                              help="Tokens per hash id (Mooncake's released traces use 512)")
    seed: int = integer(0, unit="seed", min=0, max=10_000, help="Seed for arrivals and the order of turns")
    # An uploaded trace: data, not a parameter (no control, not in the URL). Empty: the synthetic trace.
    trace: str = dataclasses.field(default="", repr=False, metadata={})

    def __post_init__(self):
        super().__post_init__()
        m, g = MODELS[self.model], GPUS[self.gpu]
        check_tensor_parallel("gpus_per_replica", m, self.gpus_per_replica, most=8)
        check_weights_fit("gpus_per_replica", m, g, self.gpus_per_replica, 2, "bf16",
                          reserve_bytes_per_gpu=RESERVE_GB * 1e9)
        cap = capacity_tokens(self)
        if cap < self.block_size and self.capacity is not None:
            raise ParamError("capacity", f"capacity must hold at least one block of {self.block_size:,} tokens; "
                                         f"got {self.capacity:,}.")
        if cap < self.block_size:
            r = hardware(self)
            raise ParamError("gpus_per_replica",
                             f"gpus_per_replica is too few: {m.title}'s weights ({r['weights_bytes'] / GB:,.0f} GB in BF16) and the reserve leave "
                             f"{max(0, r['derived_kv_memory_bytes']) / GB:,.1f} GB for the cache on "
                             f"{self.gpus_per_replica} × {g.title} ({g.memory_gb:g} GB each), not one block of "
                             f"{self.block_size:,} tokens; use more GPUs per replica, a larger GPU, a smaller "
                             f"model, or set capacity.")
        if self.trace:
            parse_trace(self.trace, self.block_size)
            return
        blocks = synthetic_blocks(self)
        if blocks > MAX_BLOCKS:
            raise ParamError("turns", f"sessions × turns may make at most {MAX_BLOCKS:,} prompt blocks in the "
                                      f"synthetic trace (Σ over its requests of prompt ÷ block size), so that a "
                                      f"change replays in well under a second; these settings make {blocks:,}, so "
                                      f"use fewer sessions, turns or tokens, or larger blocks.")

    def _prompt(self, turn: int) -> int:
        return self.system_prompt + turn * (self.message + self.answer) + self.message

    def _longest(self) -> int:
        return max(session_turns(self.sessions, self.turns, self.skew))


# ---- the hardware: how much each replica caches, how fast it prefills ------------------------------------
RESERVE_GB = 6.0        # per GPU, for activations, CUDA graphs and NCCL: the cache-renting page's default


def hardware(p: LoadBalancerParams) -> dict:
    """The cache-renting arithmetic for one replica: (GPUs × memory − weights − reserve) ÷ KV bytes per token."""
    return _hardware(p.model, p.gpu, p.gpus_per_replica)


@functools.lru_cache(maxsize=64)
def _hardware(model: str, gpu: str, gpus: int) -> dict:
    return cache_renting(CacheRentingParams(model=model, gpu=gpu, gpu_count=gpus, weight_dtype="bf16",
                                            kv_dtype="bf16", reserve_gb_per_gpu=RESERVE_GB))


def capacity_tokens(p: LoadBalancerParams) -> int:
    """Prefix cache per replica in tokens: the override, or what the replica's GPUs hold."""
    return p.capacity if p.capacity is not None else hardware(p)["token_capacity"]


def whole_block_tokens(p: LoadBalancerParams) -> int:
    """The prefix cache per replica in whole blocks, as tokens: what it can hold of prompts (the tree stores
    blocks), and the length the page draws each replica's cache."""
    return capacity_tokens(p) // p.block_size * p.block_size


def prefill_seconds(p: LoadBalancerParams, new: int, cached: int) -> float:
    """Prefill of `new` tokens after `cached` ones: the flat override, or the shared time model (linear FLOPs
    of the active parameters + causal attention to the cached prefix and the new tokens) at the given MFU."""
    if p.prefill_rate is not None:
        return new / p.prefill_rate
    return _modelled_prefill(p.model, p.gpu, p.gpus_per_replica, p.mfu, new, cached)


# Kept across replays and changes: a synthetic trace's prompts have the same few lengths whatever its sessions
# and seed, and each of the four routers' replays asks for about sixty of them.
@functools.lru_cache(maxsize=4_096)
def _modelled_prefill(model: str, gpu: str, gpus: int, mfu: float, new: int, cached: int) -> float:
    return timing.prefill_seconds(MODELS[model], GPUS[gpu], new, cached, gpus=gpus, mfu=mfu)


# ---- the workload: a Mooncake-format trace --------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Workload:
    requests: tuple
    owners: dict          # hash id -> session, or SHARED
    uploaded: bool
    sessions_given: bool  # sessions came from the trace's session_id (else inferred from the hash ids)
    unlimited_found: int  # prompt tokens one cache that never evicts would find (core.traces.unlimited_cache_hits)
    chained: bool         # every hash id stands for its whole prefix (core.traces.chained)
    prompt_tokens: int    # Σ input_length over the requests


def synthetic_blocks(p: LoadBalancerParams) -> int:
    """Prompt blocks of the whole synthetic trace: Σ over sessions and their turns of ⌈prompt ÷ block size⌉."""
    per_turn = [math.ceil(p._prompt(t) / p.block_size) for t in range(p._longest())]
    prefix = list(itertools.accumulate(per_turn))
    return sum(prefix[n - 1] for n in session_turns(p.sessions, p.turns, p.skew))


def session_turns(sessions: int, turns: int, skew: float) -> list[int]:
    """Turns per session: sessions × turns in all, each session at least one, the rest split in
    proportion to 1/(rank)^skew (Zipf) by largest remainder. Session 0 is the hottest."""
    total, weights = sessions * turns, [1 / (i + 1) ** skew for i in range(sessions)]
    spare, w = total - sessions, sum(weights)
    shares = [spare * x / w for x in weights]
    out = [1 + int(s) for s in shares]
    left = total - sum(out)
    for i in sorted(range(sessions), key=lambda i: (-(shares[i] - int(shares[i])), i))[:left]:
        out[i] += 1
    return out


def _new_segments(p: LoadBalancerParams, session: int, turn: int) -> list[tuple]:
    """What turn `turn` adds to the session's last prompt, as runs of distinct tokens: the system prompt and
    the first message, or the last answer and the new message. A prompt is the last one extended."""
    if turn == 0:
        return ([("system", 0, p.system_prompt)] if p.system_prompt else []) + [("message", session, 0, p.message)]
    return ([("answer", session, turn - 1, p.answer)] if p.answer else []) + [("message", session, turn, p.message)]


@dataclasses.dataclass
class _Chain:
    """A session's prompt so far, cut into blocks: the ids of its full blocks and the tokens of the partial one."""
    full: list
    block: list
    room: int
    prev: int = -1


def _extend(chain: _Chain, segments: list[tuple], block_size: int, ids: dict) -> tuple:
    """Mooncake-style hash ids of the chain's prompt once `segments` are appended: a block's id depends on its
    tokens and on every block before it (chained), and each new block gets the next integer. Only the new
    tokens are walked, so a long session costs what it adds, not the square of its length."""
    block, room, prev, full = chain.block, chain.room, chain.prev, chain.full     # locals: read on every block
    for seg in segments:
        key, n, at = seg[:-1], seg[-1], 0
        while at < n:
            take = room if room < n - at else n - at
            block.append((key, at, at + take))
            at += take
            room -= take
            if room == 0:
                prev = ids.setdefault((prev, tuple(block)), len(ids))
                full.append(prev)
                block, room = [], block_size
    chain.block, chain.room, chain.prev = block, room, prev
    if block:
        return (*full, ids.setdefault((prev, tuple(block)), len(ids)))
    return tuple(full)


def synthetic_prompts(p: LoadBalancerParams) -> typing.Iterator[tuple]:
    """The default trace, a request at a time in arrival order: (timestamp in ms, input length, output length, hash
    ids, session, turn). sessions × turns requests, Poisson arrivals, turns shuffled over time."""
    rng = random.Random(p.seed)
    order = [s for s, n in enumerate(session_turns(p.sessions, p.turns, p.skew)) for _ in range(n)]
    rng.shuffle(order)
    t, seen, ids, chains = 0.0, collections.Counter(), {}, {}
    for s in order:
        t += rng.expovariate(p.arrival_rate)
        turn = seen[s]
        seen[s] += 1
        chain = chains.get(s)
        if chain is None:
            chain = chains[s] = _Chain([], [], p.block_size)
        yield (round(t * 1000), p._prompt(turn), p.answer, _extend(chain, _new_segments(p, s, turn), p.block_size, ids),
               s, turn)


def synthetic_records(p: LoadBalancerParams) -> list[dict]:
    """The default trace as Mooncake-format records (what the page offers to download)."""
    return [{"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": list(ids), "session_id": s}
            for ts, n, out, ids, s, _ in synthetic_prompts(p)]


@functools.lru_cache(maxsize=2)
def _uploaded(trace: str, block_size: int) -> Workload:
    records = parse_trace(trace, block_size)
    reqs, owners, given = _requests(records, block_size)
    found, total = traces.unlimited_cache_hits(records, block_size)
    return Workload(reqs, owners, True, given, found, traces.chained(reqs), total)


@functools.lru_cache(maxsize=8)
def workload(p: LoadBalancerParams) -> Workload:
    if p.trace:                      # by the text alone: the synthetic trace's controls do not change it
        return _uploaded(p.trace, p.block_size)
    return _synthetic(tuple(getattr(p, n) for n in SYNTHETIC_ONLY), p.block_size)


@functools.lru_cache(maxsize=8)
def _synthetic(values: tuple, block_size: int) -> Workload:
    """By the synthetic trace's own controls alone: the fleet's controls do not change it."""
    p = LoadBalancerParams(**dict(zip(SYNTHETIC_ONLY, values)), block_size=block_size, capacity=block_size)
    # The requests straight from the generator, as with_sessions would make them from its records (they come in
    # time order, with their sessions and turns), without making the records and reading them back (in Pyodide at
    # 64 sessions: 4.3 against 4.7 ms). test_synthetic_workload_is_what_its_records_read_as: the two agree.
    reqs = tuple([Request(i, ts / 1000, n, out, ids, s, turn)
                  for i, (ts, n, out, ids, s, turn) in enumerate(synthetic_prompts(p))])
    # Chained by construction (_extend numbers a block by the id before it and its tokens), so not counted;
    # test_synthetic_trace_is_mooncake_shaped_and_chained checks it with traces.chained.
    found, total = traces.unlimited_prefix_hits(reqs, p.block_size, chained=True)
    return Workload(reqs, traces.block_owners(reqs), False, True, found, True, total)


# ---- the fleet -----------------------------------------------------------------------------------------
class Job:
    """A request routed to a replica. A plain class with slots, not a dataclass: one is made per request and
    router on every change, and the generated __init__ set seven fields where two are known yet."""
    __slots__ = ("request", "estimate", "start", "end", "matched", "blocks", "path")

    def __init__(self, request: Request, estimate: int):
        self.request = request
        self.estimate = estimate    # uncached tokens the router expected on this replica
        # Set when its prefill starts: start and end (s), the tokens found in the replica's cache (matched), the
        # blocks they fill, and the nodes matched (path).


@dataclasses.dataclass(eq=False, slots=True)
class Replica:
    index: int
    tree: RadixTree
    chained: bool = False       # the workload's ids are chained: an id on its way here stands for its prefix
    waiting: collections.deque = dataclasses.field(default_factory=collections.deque)
    running: Job | None = None
    routed: int = 0
    order: list = dataclasses.field(default_factory=list)    # request indices routed here, in order
    started: int = 0            # of them, how many have started (a replica serves its queue in order)
    busy: float = 0.0           # seconds of prefill served
    queued: int = 0             # tokens of prefill waiting (the routers' estimates)
    promised: dict = dataclasses.field(default_factory=dict)   # not chained: block id -> prompts sent here that hold it
    latest: dict = dataclasses.field(default_factory=dict)     # chained: block id -> where in `order` the latest
    #                                                            prompt sent here that holds it is
    cached: set = dataclasses.field(default_factory=set)       # chained: the block ids in its cache (each one
    #                                                            has one place in the tree: the end of its prefix)
    tally: dict = dataclasses.field(default_factory=dict)   # owner (session or SHARED) -> blocks cached, if any

    def send(self, job: "Job", sign: int) -> None:
        """Note a routed prompt's blocks as on their way into this cache (sign +1), or done (−1). With chained ids
        a prompt is noted once, when routed (it is the last one here, at the end of `order`): the queue is served
        in order, so its blocks are on their way for as long as it has not been stored. Else each block is
        counted in and out."""
        if self.chained:
            if sign > 0:                             # in C: one dict.update over (id, place) pairs
                self.latest.update(zip(job.request.blocks, itertools.repeat(len(self.order) - 1)))
            return
        promised = self.promised
        for b in job.request.blocks:
            promised[b] = promised.get(b, 0) + sign


# What the routers read of the fleet, for every replica in one call: a change replays about a thousand routings
# a router, and a method call per replica and quantity made nine Python calls a cache-aware routing, now two (in
# CPython, a change at 58 and 62 sessions makes 11% fewer calls, for 0.7% more bytecodes).
def fleet_loads(fleet: list[Replica], now: float) -> list[float]:
    """Tokens of prefill still to do at each replica: the waiting prompts' uncached parts and the part of the
    running one not yet done (its time left as a share of its time)."""
    out = []
    for r in fleet:
        j = r.running
        if j is None or j.end <= now:
            out.append(float(r.queued))
        else:
            out.append(r.queued + (j.request.input_length - j.matched) * (j.end - now) / (j.end - j.start))
    return out


def fleet_expected_blocks(fleet: typing.Sequence[Replica], blocks: tuple) -> list[int]:
    """Blocks of this prompt each replica holds or will hold once its queue is served: the longest prefix found
    in its cache, or made of block ids of prompts already sent there (as SGLang's router counts a prompt as soon
    as it routes it; hash ids are chained, so an id stands for its prefix).

    With chained ids (every id always follows the same id, as Mooncake's do) an id of a prompt on its way to a
    replica stands for that prompt's whole prefix up to it, so the prefixes made of such ids are closed under
    taking a shorter one, and the longest is found by bisection: an id is on its way if the latest prompt sent
    there that holds it (`latest`) has not been stored yet, that is, comes at or after the prompt running or first
    waiting in the queue. A few lookups, where comparing the prompt with every prompt queued there took one step
    each (a saturated replica queues dozens).

    The cache's own prefix (what tree.peek walks to) is found the same way, by the ids it holds (`cached`): an id
    in the tree ends the only path to it. Both kinds of prefix are closed under taking a shorter one, so together
    they are too, and one bisection finds the longest made of ids cached or on their way."""
    out = []
    for r in fleet:
        if r.chained:
            cached, latest = r.cached, r.latest
            head = r.started - 1 if r.running is not None else r.started    # in `order`: not stored yet
            lo, hi = 0, len(blocks) + 1          # blocks[:lo] are all cached or on their way; blocks[:hi] not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                b = blocks[mid - 1]
                if b in cached or latest.get(b, -1) >= head:
                    lo = mid
                else:
                    hi = mid
            out.append(lo)
            continue
        promised = r.promised
        if promised.get(blocks[0], 0) <= 0:      # the usual case: nothing of this prompt is on its way there
            out.append(r.tree.peek(blocks))
            continue
        n = 0
        while n < len(blocks) and promised.get(blocks[n], 0) > 0:
            n += 1
        out.append(max(r.tree.peek(blocks), n))
    return out


def cached_tokens(blocks: int, request: Request, block_size: int) -> int:
    return min(blocks * block_size, request.input_length)


# ---- the routers: one small class each, over one base -------------------------------------------------
class Router:
    """Picks the replica for a request, given the fleet as it is at that moment."""
    key = ""
    name = ""
    reads_load = False     # whether it looks at the replicas' queued work (fleet_loads): only then is it estimated

    def choose(self, req: Request, fleet: list[Replica], now: float, p: LoadBalancerParams, count: int) -> int:
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}()"

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(self.key)


class RoundRobin(Router):
    """Request n goes to replica n mod replicas."""
    key, name = "round_robin", "round-robin"

    def choose(self, req, fleet, now, p, count):
        return count % len(fleet)


class LeastLoaded(Router):
    """The replica with the least prefill work queued (ties: fewest requests so far, then lowest number)."""
    key, name = "least_loaded", "least-loaded"
    reads_load = True

    def choose(self, req, fleet, now, p, count):
        keys = [(load, r.routed, r.index) for load, r in zip(fleet_loads(fleet, now), fleet)]
        return min(keys)[2]


@functools.lru_cache(maxsize=16)
def ring(replicas: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Consistent hashing: 64 points per replica on a 32-bit ring, at crc32("replica i point v")."""
    points = sorted((zlib.crc32(f"replica {i} point {v}".encode()), i)
                    for i in range(replicas) for v in range(RING_POINTS))
    return tuple(h for h, _ in points), tuple(i for _, i in points)


@functools.lru_cache(maxsize=4_096)
def sticky_replica(session: int, replicas: int) -> int:
    hashes, owners = ring(replicas)
    at = bisect.bisect_left(hashes, zlib.crc32(f"session {session}".encode()))
    return owners[at % len(owners)]


class Sticky(Router):
    """Consistent hashing: crc32 of the session id picks the next of 64 points per replica on a ring, so a
    session always lands on the same replica (Python's hash() is salted per process, so it is not used)."""
    key, name = "sticky", "sticky"

    def choose(self, req, fleet, now, p, count):
        return sticky_replica(req.session, len(fleet))


def cache_aware_scores(req: Request, fleet: list[Replica], now: float, p: LoadBalancerParams) -> list[tuple]:
    """(score, cached tokens, queued tokens) per replica: score = cached − load_weight × queued."""
    weight, size, blocks, length = p.load_weight, p.block_size, req.blocks, req.input_length
    cached = [min(b * size, length) for b in fleet_expected_blocks(fleet, blocks)]     # cached_tokens
    return [(c - weight * queued, c, queued) for c, queued in zip(cached, fleet_loads(fleet, now))]


class CacheAware(Router):
    """The replica with the highest score = cached prefix − load weight × queued work, both in tokens
    (ties: less queued, fewer requests so far, lowest number)."""
    key, name = "cache_aware", "cache-aware"
    reads_load = True

    def choose(self, req, fleet, now, p, count, scores=None):
        scores = scores or cache_aware_scores(req, fleet, now, p)
        return -max([(s[0], -s[2], -r.routed, -r.index) for s, r in zip(scores, fleet)])[3]


ROUTERS: tuple[Router, ...] = (RoundRobin(), LeastLoaded(), Sticky(), CacheAware())
BY_KEY = {r.key: r for r in ROUTERS}


# ---- the discrete-event simulation ------------------------------------------------------------------
class Served(typing.NamedTuple):
    """One request as a router's replay served it (a named tuple, as Snapshot is: one per request and router on
    every change, and a frozen dataclass's __init__ sets each field through object.__setattr__)."""
    request: int
    replica: int
    arrival: float
    start: float
    end: float          # = time of first token
    matched: int        # prompt tokens found in the replica's cache
    computed: int       # prompt tokens prefilled
    blocks: int = 0     # blocks of the prompt found in the replica's cache

    @property
    def wait(self) -> float:
        return self.start - self.arrival

    @property
    def ttft(self) -> float:
        return self.end - self.arrival


class Snapshot(typing.NamedTuple):
    """One replica when a request has just been routed (a named tuple: up to 200 are taken per router and
    replica in a run, and a frozen dataclass's __init__ cost a fifth of the run). Its queue is a range of
    the requests routed to it, which are served in order: the list is shared, not copied, as it only grows."""
    tally: dict         # owner -> blocks cached (none at 0): a plain copy, sorted only when drawn (`cache`)
    running: tuple      # request indices being prefilled (0 or 1)
    order: list         # request indices routed to the replica in the run, in order (the replica's own list)
    started: int        # ... of which the first `started` had started when it was taken
    routed: int         # ... and the first `routed` had arrived
    size: int           # blocks cached

    @property
    def waiting(self) -> tuple:
        """Request indices at the head of the queue (at most QUEUE_SHOWN), first to last."""
        return tuple(self.order[self.started:min(self.routed, self.started + QUEUE_SHOWN)])

    @property
    def queued(self) -> int:
        """Requests waiting in all."""
        return self.routed - self.started

    @property
    def cache(self) -> tuple:
        """(owner, blocks) pairs: what its prefix cache holds, by session (SHARED first)."""
        return tuple(sorted((o, n) for o, n in self.tally.items() if n))


@dataclasses.dataclass(frozen=True)
class Run:
    router: str
    served: tuple                # Served, by request index
    events: tuple                # (time, kind, request, replica, blocks cached there): every event, in order,
    #                              if asked for (the tests read them; the page does not)
    busy: tuple                  # seconds of prefill per replica
    queue_at_arrival: tuple      # the longest queue (waiting + running) in the fleet right after each arrival
    snapshots: dict              # request index -> tuple of Snapshot, one per replica
    evicted_blocks: tuple        # blocks each replica's cache evicted to make room
    scores: dict                 # request index -> the cache-aware scores (score, cached, queued) before routing


# The replay builds its named tuples with tuple.__new__ (fields in order, no defaults left out): their generated
# __new__ is a Python call each, 0.84 against 0.40 µs in the browser, for about 1,800 tuples a change.
_make = tuple.__new__


def _snapshot(fleet: list[Replica], shown: list, changed: set, owners: dict | None) -> tuple:
    """Every replica as it is now: a new Snapshot for those changed since the last one (`changed`, emptied
    here), the same object for the rest (most replicas do not change between two arrivals). Its tally is the
    replica's running one, or counted from its tree now where `owners` is given (see WALKED_TALLIES)."""
    for i in changed:
        r = fleet[i]
        tally = dict(r.tally) if owners is None else _tally_of(r.tree, owners)
        shown[i] = _make(Snapshot, (tally, (r.running.request.index,) if r.running else (), r.order,
                                    r.started, r.routed, r.tree.size))
    changed.clear()
    return tuple(shown)


def _tally_of(tree: RadixTree, owners: dict) -> dict:
    """The blocks a tree caches, by owner: what the running tally holds, counted afresh."""
    tally: dict = {}
    _count(tally, owners, (b for n in tree.nodes() for b in n.tokens))
    return tally


def _count(tally: dict, owners: dict, blocks) -> None:
    """Newly cached blocks join the tally."""
    get = owners.get
    for b in blocks:
        o = get(b, SHARED)
        tally[o] = tally.get(o, 0) + 1


def _forget(cached: set, victim) -> None:
    """A radix tree's on_evict where no tally is kept: the evicted leaf's blocks leave the replica's set of
    cached ids."""
    cached.difference_update(victim.tokens)


def _uncount(tally: dict, owners: dict, cached: set | None, victim) -> None:
    """A radix tree's on_evict: the evicted leaf's blocks leave the tally (and the replica's set of cached ids,
    where it keeps one)."""
    if cached is not None:
        _forget(cached, victim)
    get = owners.get
    for b in victim.tokens:
        o = get(b, SHARED)
        n = tally[o] - 1
        if n:
            tally[o] = n
        else:                    # an owner with nothing cached leaves: each snapshot copies the tally
            del tally[o]


def simulate(p: LoadBalancerParams, router: Router, snapshot_at: frozenset = frozenset(),
             with_events: bool = False, peaks_at: frozenset = frozenset()) -> Run:
    """Replay the workload under one router, with snapshots of the fleet as each request in `snapshot_at` has just
    been routed, and as the first in `peaks_at` at which the fleet's longest queue is at its highest has (the
    animation opens there: opening_frame). The replay cannot see ahead, so it snapshots each new high and keeps
    the last.

    Events: arrivals and prefill ends, in time order; at equal times a prefill end comes first (so a replica that
    frees up at the moment a request arrives is seen as free), and equal events in the order they were made.
    Arrivals come in the trace's order, so only the prefill ends (at most one a replica) need a heap. The event
    log (Run.events) is kept only `with_events`: three tuples a request, which a change of the page would make for
    all four routers and never read."""
    w = workload(p)
    requests, size, owners = w.requests, p.block_size, w.owners
    fleet = [Replica(i, RadixTree(capacity_tokens(p) // size), w.chained) for i in range(p.replicas)]
    track_ids = w.chained and router.reads_load       # Replica.cached: only fleet_expected_blocks reads it
    walked = len(snapshot_at) <= WALKED_TALLIES and not peaks_at     # count each snapshot's tally from its tree
    for r in fleet:                                   # else keep each cache's blocks by owner as they come and go
        if not walked:
            r.tree.on_evict = functools.partial(_uncount, r.tally, owners, r.cached if track_ids else None)
        elif track_ids:
            r.tree.on_evict = functools.partial(_forget, r.cached)
    arrivals = sorted(range(len(requests)), key=lambda i: (requests[i].arrival, i))
    ends, counter = [], itertools.count()             # (end time, counter, replica): the prefills running
    served, events, queues, snaps, scores = [None] * len(requests), [], [], {}, {}
    depth = [0] * p.replicas                          # requests running or waiting, per replica
    shown, changed = [None] * p.replicas, set(range(p.replicas))      # for _snapshot
    prefill_time: dict = {}                           # (new tokens, cached tokens) -> seconds
    cache_aware, reads_load, long_run = router.key == "cache_aware", router.reads_load, len(requests) > 5_000
    counts_out = reads_load and not w.chained
    record = events.append
    peak, last_high = -1, None                        # the longest queue at a request of peaks_at so far, and where

    def start(r: Replica, now: float) -> None:
        changed.add(r.index)
        job = r.waiting.popleft()
        r.started += 1
        r.queued -= job.estimate
        q, tree = job.request, r.tree
        # SGLang locks a running request's matched path (inc_lock_ref) until its prompt is stored. Here that lock
        # would change nothing: a replica prefills one prompt at a time, so only the routers' read-only peeks
        # touch its cache in between, and the store holds the path itself (RadixTree._grow). Taking and releasing
        # it cost a twentieth of a replay (test_replay_without_locks_is_the_replay_with_them: the same runs).
        job.blocks, job.path = tree.match(q.blocks)
        job.matched = matched = min(job.blocks * size, q.input_length)      # cached_tokens, without a call
        job.start = now
        new = q.input_length - matched
        seconds = prefill_time.get((new, matched))
        if seconds is None:                           # prompts repeat their lengths: the time model once each
            seconds = prefill_time[new, matched] = prefill_seconds(p, new, matched)
        job.end = now + seconds
        r.running = job
        if with_events:
            record((now, "start", q.index, r.index, tree.size))
        heapq.heappush(ends, (job.end, next(counter), r.index))

    def finish(now: float, _: int, i: int) -> None:
        """Replica i finished its prefill: cache the prompt, and start the next one waiting."""
        r = fleet[i]
        changed.add(i)
        job, r.running = r.running, None
        tree, done = r.tree, job.request
        held, stored = tree.store_matched(done.blocks, job.blocks, job.path)    # as start left it
        new_blocks = done.blocks[held:held + stored]
        if not walked:
            _count(r.tally, owners, new_blocks)
        if track_ids:
            r.cached.update(new_blocks)
        if counts_out:                                # only they ask what is on its way (fleet_expected_blocks);
            r.send(job, -1)                           # with chained ids a prompt is not counted out (Replica.send)
        r.busy += job.end - job.start
        served[done.index] = _make(Served, (done.index, i, done.arrival, job.start, job.end, job.matched,
                                            done.input_length - job.matched, job.blocks))
        if with_events:
            record((now, "end", done.index, i, tree.size))
        depth[i] -= 1
        if r.waiting:
            start(r, now)

    for x in arrivals:
        q = requests[x]
        arrival = q.arrival
        while ends and ends[0][0] <= arrival:         # a prefill that ends before (or as) it arrives
            finish(*heapq.heappop(ends))
        now = arrival
        if long_run and x % 2_000 == 0:              # a long replay tells the page how far it is
            traces.report((ROUTERS.index(router) + x / len(requests)) / len(ROUTERS),
                          f"replaying {len(requests):,} requests under {router.name}: request {x:,}")
        if cache_aware:                              # its scores, kept for the frames the page shows
            sc = cache_aware_scores(q, fleet, now, p)
            if x in snapshot_at:
                scores[x] = tuple(sc)
            r = fleet[router.choose(q, fleet, now, p, x, sc)]
            estimate = q.input_length - sc[r.index][1]        # the cached tokens it scored
        else:
            r = fleet[router.choose(q, fleet, now, p, x)]
            estimate = (q.input_length - cached_tokens(fleet_expected_blocks((r,), q.blocks)[0], q, size)
                        if reads_load else 0)        # round-robin and sticky never read it
        r.routed += 1
        r.order.append(x)
        changed.add(r.index)
        job = Job(q, estimate)
        r.waiting.append(job)
        if reads_load:
            r.send(job, +1)
        r.queued += estimate
        if with_events:
            record((now, "arrive", x, r.index, r.tree.size))
        if r.running is None:
            start(r, now)
        depth[r.index] += 1
        longest = max(depth)
        queues.append(longest)
        new_high = longest > peak and x in peaks_at
        if new_high:
            if last_high is not None and last_high not in snapshot_at:
                del snaps[last_high]                  # superseded: only the highest is kept
            peak, last_high = longest, x
        if new_high or x in snapshot_at:
            snaps[x] = _snapshot(fleet, shown, changed, owners if walked else None)
    while ends:                                       # the prefills still running after the last arrival
        finish(*heapq.heappop(ends))
    out = Run(router.key, tuple(served), tuple(events), tuple(f.busy for f in fleet), tuple(queues), snaps,
              tuple(f.tree.evicted for f in fleet), scores)
    for r in fleet:                                   # free the caches now, not in a cycle-collector pass
        r.tree.clear()
    return out


def replay_cache_blind(p: LoadBalancerParams, router: Router, snapshot_at: frozenset = frozenset(),
                       peaks_at: frozenset = frozenset()) -> Run:
    """simulate, for a router that never looks at the fleet (round-robin, sticky): where each request goes is
    known before anything is served, so each replica's queue is replayed on its own, first come, first served (a
    prefill starts once its request has arrived and the one before it has ended), without the event heap. Its
    cache sees the same operations in the same order as in simulate (a prompt's match when its prefill starts,
    its store when it ends, before the next one starts), so every figure is the same
    (test_cache_blind_replay_is_the_simulation). The fleet's longest queue at each arrival is counted afterwards
    from the start and end times, and the snapshots (which depend on it: peaks_at) are rebuilt from a log of what
    each cache stored and evicted, and when. In Pyodide, at 64 sessions: 0.86x simulate's time for round-robin,
    0.85x for sticky."""
    w = workload(p)
    requests, size = w.requests, p.block_size
    n, replicas = len(requests), range(p.replicas)
    arrivals = sorted(range(n), key=lambda i: (requests[i].arrival, i))
    orders: list[list[int]] = [[] for _ in replicas]
    for x in arrivals:                                # these routers read only how many replicas there are
        orders[router.choose(requests[x], replicas, 0.0, p, x)].append(x)
    served, busy, evicted, logs = [None] * n, [], [], []
    prefill_time: dict = {}                           # (new tokens, cached tokens) -> seconds
    done, long_run = 0, n > 5_000
    for i in replicas:
        tree, gone = RadixTree(capacity_tokens(p) // size), []
        tree.on_evict = gone.append
        log, free, b = [], -math.inf, 0.0   # log: (end, request, leaves evicted so far, blocks stored, cache size)
        for x in orders[i]:
            if long_run and done % 2_000 == 0:       # a long replay tells the page how far it is
                traces.report((ROUTERS.index(router) + done / n) / len(ROUTERS),
                              f"replaying {n:,} requests under {router.name}: replica {i + 1} of {p.replicas}")
            done += 1
            q = requests[x]
            start = q.arrival if q.arrival > free else free
            blocks, path = tree.match(q.blocks)
            matched = min(blocks * size, q.input_length)
            new = q.input_length - matched
            seconds = prefill_time.get((new, matched))
            if seconds is None:
                seconds = prefill_time[new, matched] = prefill_seconds(p, new, matched)
            free = end = start + seconds
            held, stored = tree.store_matched(q.blocks, blocks, path)
            log.append((end, x, len(gone), q.blocks[held:held + stored], tree.size))
            b += end - start
            served[x] = _make(Served, (x, i, q.arrival, start, end, matched, new, blocks))
        busy.append(b)
        evicted.append(tree.evicted)
        logs.append((log, [v.tokens for v in gone]))
        tree.clear()
    place = {x: k for k, x in enumerate(arrivals)}    # request -> its position in arrival order
    queues, left = _longest_queues(served, arrivals, place, p.replicas)
    top, peak = None, -1                              # of peaks_at, the first arrival at the longest queue
    for k, x in enumerate(arrivals):
        if queues[k] > peak and x in peaks_at:
            top, peak = x, queues[k]
    shots = [x for x in arrivals if x in snapshot_at or x == top]     # in arrival order
    snaps = _snapshots_from_logs(shots, place, left, served, orders, logs, w.owners) if shots else {}
    return Run(router.key, tuple(served), (), tuple(busy), tuple(queues), snaps, tuple(evicted), {})


def _longest_queues(served: list, arrivals: list, place: dict, replicas: int) -> tuple[list[int], dict]:
    """The fleet's longest queue (waiting + running) right after each arrival, from the start and end times; and
    for each request, the position in arrival order of the first arrival that found it gone from its queue (absent
    if none did). As in simulate, a prefill has left its queue when a request arrives if it ended before, or at the
    same moment and was routed earlier (a prompt found whole in the cache can take no time at all: it is still in
    its queue when its own arrival is counted)."""
    ends = sorted((s.end, place[s.request], s.replica, s.request) for s in served)
    depth, out, left, k = [0] * replicas, [], {}, 0
    for at, x in enumerate(arrivals):
        s = served[x]
        while k < len(ends) and (ends[k][0] < s.arrival or (ends[k][0] == s.arrival and ends[k][1] < at)):
            depth[ends[k][2]] -= 1
            left[ends[k][3]] = at
            k += 1
        depth[s.replica] += 1
        out.append(max(depth))
    return out, left


def _snapshots_from_logs(shots: list[int], place: dict, left: dict, served: list, orders: list, logs: list,
                         owners: dict) -> dict:
    """Every replica as request x has just been routed, for each x of `shots` (in arrival order): its queue from
    the start and end times, its cache from its log (what the prefills that had left their queues by then, as
    _longest_queues found, stored and evicted)."""
    never = len(place)
    out: dict = {x: [] for x in shots}
    get = owners.get
    for i, order in enumerate(orders):
        log, gone = logs[i]
        tally: dict = {}
        done = victims = routed = started = 0         # log entries counted into the tally; requests so far
        last = None
        for x in shots:
            t, at = served[x].arrival, place[x]
            while done < len(log) and left.get(log[done][1], never) <= at:
                _, _, evicted_by_then, stored, _ = log[done]
                for tokens in gone[victims:evicted_by_then]:     # evicted to make room for this prompt
                    for blk in tokens:
                        o = get(blk, SHARED)
                        if tally[o] == 1:
                            del tally[o]
                        else:
                            tally[o] -= 1
                victims = evicted_by_then
                for blk in stored:
                    o = get(blk, SHARED)
                    tally[o] = tally.get(o, 0) + 1
                done += 1
            while routed < len(order) and place[order[routed]] <= at:
                routed += 1
            while started < routed and served[order[started]].start <= t:
                started += 1
            running = (order[started - 1],) if started > done else ()   # started and not ended: one at most
            if last is None or (done, routed, started) != last[0]:    # else the same object, as simulate gives
                last = ((done, routed, started), _make(Snapshot, (dict(tally), running, order, started, routed,
                                                                  log[done - 1][4] if done else 0)))
            out[x].append(last[1])
    return {x: tuple(v) for x, v in out.items()}


@functools.lru_cache(maxsize=16)
def frame_requests(n: int) -> tuple[int, ...]:
    """The requests the animation stops at: every arrival, or MAX_FRAMES of them evenly spread (cached: a
    change asks for them six times)."""
    frames = min(n, MAX_FRAMES)
    if frames <= 1:
        return (0,) * frames
    return tuple([round(f * (n - 1) / (frames - 1)) for f in range(frames)])


SYNTHETIC_ONLY = ("sessions", "turns", "system_prompt", "message", "answer", "arrival_rate", "skew", "seed")
DEFAULTS = {f.name: f.default for f in dataclasses.fields(LoadBalancerParams)}


def replay_params(p: LoadBalancerParams, router_key: str) -> LoadBalancerParams:
    """The parameters one router's replay depends on, the rest set to their defaults, so a change that cannot
    alter a replay reuses it: the load weight matters to the cache-aware router only, and the synthetic
    trace's controls do not matter to an uploaded trace."""
    names = (("load_weight",) if router_key != "cache_aware" else ()) + (SYNTHETIC_ONLY if p.trace else ())
    changes = {n: DEFAULTS[n] for n in names if getattr(p, n) != DEFAULTS[n]}
    return dataclasses.replace(p, **changes) if changes else p


def run(p: LoadBalancerParams, router_key: str) -> Run:
    """One router's replay, with snapshots where the page needs them when it opens: sticky's at the first frame
    where its longest queue is at its highest (the animation opens there), the others' at that frame's request
    too. Snapshots at every frame (17% of a replay, and their tallies another 11%, in Pyodide) are replayed only
    when a reader moves the animation (frame_run)."""
    q = replay_params(p, router_key)
    stops = frame_requests(len(workload(p).requests))
    if router_key == "sticky":
        return _run(q, router_key, frozenset(), frozenset(stops))
    return _run(q, router_key, frozenset((stops[opening_frame(p)],)))


def frame_run(p: LoadBalancerParams, router_key: str, request: int) -> Run:
    """One router's replay with a snapshot as `request` (one of frame_requests) has just been routed."""
    r = run(p, router_key)
    if request in r.snapshots:
        return r
    return _run(replay_params(p, router_key), router_key, frozenset(frame_requests(len(workload(p).requests))))


# Two changes' replays (four routers each), as ttfts and summary keep. Every replay kept is thousands of objects
# that Python's cycle collector walks again and again: at 32 (eight changes) its longest pauses in Pyodide were
# 20-40 ms, a few changes in twenty, and at 8 they were 4-9 ms.
@functools.lru_cache(maxsize=8)
def _run(p: LoadBalancerParams, router_key: str, snapshot_at: frozenset, peaks_at: frozenset = frozenset()) -> Run:
    router = BY_KEY[router_key]
    replay = simulate if router.reads_load else replay_cache_blind
    return replay(p, router, snapshot_at, peaks_at=peaks_at)


# ---- the numbers -----------------------------------------------------------------------------------------
def percentile(values, q: float) -> float:
    """Nearest rank: the smallest value with at least q of the values at or below it."""
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def imbalance(busy) -> float:
    mean = sum(busy) / len(busy)
    return max(busy) / mean if mean else 1.0


@functools.lru_cache(maxsize=8)
def ttfts(p: LoadBalancerParams, router_key: str) -> tuple[tuple, tuple]:
    """Each request's time to first token under one router's replay, by request index, and the same sorted:
    the summary, the curves and the formulas all read them."""
    t = tuple([s.end - s.arrival for s in run(p, router_key).served])     # Served.ttft, without a call each
    return t, tuple(sorted(t))


@functools.lru_cache(maxsize=8)
def summary(p: LoadBalancerParams, router_key: str) -> dict:
    """One router's replay in figures (cached: read-only for its callers)."""
    r = run(p, router_key)
    asked = sum(s.matched + s.computed for s in r.served)
    matched = sum(s.matched for s in r.served)
    ttft = ttfts(p, router_key)[0]
    return {"hit_rate": matched / asked, "tokens_matched": matched, "tokens_requested": asked,
            "ttft_p50_s": percentile(ttft, 0.5), "ttft_p99_s": percentile(ttft, 0.99),
            "ttft_mean_s": sum(ttft) / len(ttft), "imbalance": imbalance(r.busy), "busy_s": list(r.busy),
            "evicted_tokens": sum(r.evicted_blocks) * p.block_size}


def over_cache(p: LoadBalancerParams) -> int:
    """Requests whose prompt is longer than a replica's whole cache: they cannot be cached whole."""
    cap = whole_block_tokens(p)
    return sum(q.input_length > cap for q in workload(p).requests)


@functools.lru_cache(maxsize=8)
def evaluate(p: LoadBalancerParams) -> dict:
    w = workload(p)
    out = {"trace": "uploaded" if w.uploaded else "synthetic", "requests": len(w.requests),
           "sessions": len({q.session for q in w.requests}),
           "tokens_requested": w.prompt_tokens,
           "capacity_tokens": capacity_tokens(p), "capacity_source": "derived" if p.capacity is None else "override",
           "requests_over_cache": over_cache(p),
           "longest_prompt_tokens": max(q.input_length for q in w.requests),
           "unlimited_cache_hit_rate": w.unlimited_found / w.prompt_tokens}
    for router in ROUTERS:
        s = summary(p, router.key)
        for k in ("hit_rate", "ttft_p50_s", "ttft_p99_s", "imbalance", "evicted_tokens"):
            out[f"{router.key}_{k}"] = s[k]
        out[f"{router.key}_busy_s"] = list(s["busy_s"])
    return out


# ---- what the page draws -----------------------------------------------------------------------------
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
           "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")
SHARED_COLOR = "#9ca3af"
ROUTER_COLORS = {"round_robin": "#6b7280", "least_loaded": "#2563eb", "sticky": "#b45309", "cache_aware": "#059669"}


def session_color(session: int) -> str:
    return SHARED_COLOR if session == SHARED else PALETTE[session % len(PALETTE)]


def lane_y(p: LoadBalancerParams, g: int, replica: int) -> float:
    """Lanes top to bottom: each router's replicas, a gap between routers."""
    return -(g * (p.replicas + 1) + replica)


def frame_data(p: LoadBalancerParams, frame: int) -> dict:
    """Frame f: every router's replicas the moment request k(f) has arrived and been routed."""
    w = workload(p)
    stops = frame_requests(len(w.requests))
    f = max(0, min(len(stops) - 1, frame))
    k = stops[f]
    q = w.requests[k]
    cap = whole_block_tokens(p)
    box, gap = 0.05 * cap, 0.012 * cap
    cache = {c: [] for c in ("x0", "x1", "y", "color", "owner", "tokens")}
    queue = {c: [] for c in ("x0", "x1", "y", "color", "line", "request", "state")}
    more = {"x": [], "y": [], "text": []}
    here = {"x0": [], "x1": [], "y": [], "text": [], "tx": []}
    parts = []
    for g, router in enumerate(ROUTERS):
        r = frame_run(p, router.key, k)
        snap = r.snapshots[k]
        for i, s in enumerate(snap):
            y, x = lane_y(p, g, i), 0
            for owner, blocks in s.cache:
                cache["x0"].append(x)
                x += blocks * p.block_size
                cache["x1"].append(x)
                cache["y"].append(y)
                cache["color"].append(session_color(owner))
                cache["owner"].append("shared by sessions" if owner == SHARED else f"session {owner}")
                cache["tokens"].append(blocks * p.block_size)
            jobs = [(j, "running") for j in s.running] + [(j, "waiting") for j in s.waiting]
            for n, (j, state) in enumerate(jobs[:QUEUE_SHOWN]):
                x0 = cap * 1.04 + n * (box + gap)
                queue["x0"].append(x0)
                queue["x1"].append(x0 + box)
                queue["y"].append(y)
                queue["color"].append(session_color(w.requests[j].session))
                queue["request"].append(f"request {j} (session {w.requests[j].session})")
                queue["state"].append(state)
                queue["line"].append("#111827" if state == "running" else "#ffffff")
            total = len(s.running) + s.queued
            if total > QUEUE_SHOWN:
                more["x"].append(cap * 1.04 + QUEUE_SHOWN * (box + gap))
                more["y"].append(y)
                more["text"].append(f"+{total - QUEUE_SHOWN}")
        sv = r.served[k]
        here["x0"].append(-0.02 * cap)
        here["x1"].append(cap * (1.04 + QUEUE_SHOWN * 0.062) + 0.09 * cap)
        here["y"].append(lane_y(p, g, sv.replica))
        here["text"].append(f"request {k}")
        here["tx"].append(cap * (1.04 + QUEUE_SHOWN * 0.062) + 0.1 * cap)
        parts.append(f"{router.name} → replica {sv.replica} ({thousands(sv.matched)} cached, waits "
                     f"{sv.wait:.2f} s, first token after {sv.ttft:.2f} s)")
    who = f"session {q.session}, turn {q.turn + 1}"
    sources = {"cache": cache, "queue": queue, "more": more, "here": here, "cursor": {"request": [k, k], "y": [0, 1]}}
    return {
        "sources": sources,
        "animation": {"mode": "on_demand", "frames": len(stops), "frame": f,
                      "caption": f"t = {q.arrival:.2f} s: request {k} ({who}, {thousands(q.input_length)} prompt "
                                 f"tokens) arrives. " + "; ".join(parts) + "."},
        "texts": summaries(lanes=lanes_summary({**lanes(p), **sources})),
    }


def lanes_summary(sources: dict) -> str:
    """The lanes plot in words, from what it draws: per router, where the request went, what its replicas
    cache and how many requests they queue."""
    place = {y: (label, g) for g, ys in enumerate(_router_lanes(sources)) for y, label in ys}
    cached, queued, sent = collections.Counter(), collections.Counter(), {}
    for y, n in zip(sources["cache"]["y"], sources["cache"]["tokens"]):
        cached[place[y][1]] += n
    for y in sources["queue"]["y"]:
        queued[place[y][1]] += 1
    for y, text in zip(sources["more"]["y"], sources["more"]["text"]):
        queued[place[y][1]] += int(text.lstrip("+"))
    for y in sources["here"]["y"]:
        sent[place[y][1]] = place[y][0]
    names = sources["router_names"]["text"]
    replicas = len(sources["lanes"]["y"]) // len(names)
    per = [f"{name} sends it to {sent.get(g, 'no replica')} (its replicas: {thousands(cached[g])} tokens cached, "
           f"{thousands(queued[g])} requests running or waiting)" for g, name in enumerate(names)]
    return (f"{sources['here']['text'][0].capitalize()} has just arrived at {replicas} replicas of "
            f"{thousands(sources['lanes']['x1'][0])} cached tokens each: " + "; ".join(per) + ".")


def _router_lanes(sources: dict) -> list[list[tuple]]:
    """The lanes' (y, replica label) by router, in the order drawn (each router's replicas together)."""
    names, rows = sources["router_names"]["text"], list(zip(sources["lanes"]["y"], sources["lanes"]["label"]))
    per = len(rows) // len(names)
    return [rows[g * per:(g + 1) * per] for g in range(len(names))]


def plot_summaries(sources: dict) -> dict:
    """The whole run's plots in words, from the columns they draw."""
    run_, names = sources["running"], {r.key: r.name for r in ROUTERS}
    running = ("Hit rate over the whole run: "
               + listing([f"{names[key]} {pct(run_[key][-1])}" for key in names if run_[key]])
               + f"; an unlimited cache would find {pct(sources['unlimited']['hit_rate'][0])}.")
    pc = sources["percentiles"]
    p50 = {r: t for r, t, q in zip(pc["router"], pc["ttft"], pc["share"]) if q == 0.5}
    p99 = {r: t for r, t, q in zip(pc["router"], pc["ttft"], pc["share"]) if q != 0.5}
    ttft = ("Median time to first token: "
            + listing([f"{r} {sig(p50[r])} s (99th percentile {sig(p99[r])} s)" for r in p50]) + ".")
    m = sources["busy_mean"]
    busy = ("Busiest replica against the mean, in seconds of prefill: "
            + listing([f"{r} {sig(hi)} against {sig(mean)} ({label})"
                       for r, hi, mean, label in zip(m["router"], m["max"], m["mean"], m["label"])]) + ".")
    return summaries(running=running, ttft=ttft, busy=busy)


@functools.lru_cache(maxsize=8)
def opening_frame(p: LoadBalancerParams) -> int:
    """Open on the busiest moment for sticky sessions: the arrival after which its longest queue peaks."""
    stops = frame_requests(len(workload(p).requests))
    queues = run(p, "sticky").queue_at_arrival
    return max(range(len(stops)), key=lambda f: (queues[stops[f]], -f))


HEADS_Y = 1.55          # the lanes plot's column heads, above the first router's name (at 0.75)


def lanes_key(p: LoadBalancerParams) -> str:
    cap = whole_block_tokens(p)
    return (f"Each bar is a replica's prefix cache, {thousands(cap)} tokens long, coloured by the session whose "
            f"blocks it holds (grey: blocks several sessions share, such as the system prompt). The boxes to its "
            f"right are its queue, one a request, first to last (outlined: the one being prefilled).")


def lanes(p: LoadBalancerParams) -> dict:
    """The fixed parts of the lanes plot: labels, capacity outlines, router names."""
    cap = whole_block_tokens(p)
    out = {"x0": [], "x1": [], "y": [], "label": [], "lx": []}
    names = {"x": [], "y": [], "text": [], "color": []}
    # Short column heads, a row above the first router's name (on a phone the long ones ran into it and into
    # each other); what the colours and outlines mean is said under the plot (lanes_key), where it can wrap.
    headers = {"x": [0, cap * 1.04], "y": [HEADS_Y, HEADS_Y], "text": ["prefix cache", "queue"]}
    for g, router in enumerate(ROUTERS):
        names["x"].append(-0.29 * cap)
        names["y"].append(lane_y(p, g, 0) + 0.75)
        names["text"].append(router.name)
        names["color"].append(ROUTER_COLORS[router.key])
        for i in range(p.replicas):
            out["x0"].append(0)
            out["x1"].append(cap)
            out["y"].append(lane_y(p, g, i))
            out["label"].append(f"replica {i}")
            out["lx"].append(-0.04 * cap)
    return {"lanes": out, "router_names": names, "headers": headers}


CURVE_POINTS = 1_000      # points per router in the curves: a 100,000-request trace draws as fast as 64 requests


def curve_points(n: int) -> list[int]:
    """Request indices the curves draw: all of them, or CURVE_POINTS spread evenly, always with the last."""
    if n <= CURVE_POINTS:
        return list(range(n))
    return sorted({round(i * (n - 1) / (CURVE_POINTS - 1)) for i in range(CURVE_POINTS)})


def page_data(p: LoadBalancerParams) -> dict:
    w = workload(p)
    n = len(w.requests)
    sums = {r.key: summary(p, r.key) for r in ROUTERS}
    shown = curve_points(n)
    running = {"request": shown}
    ecdf_lines = {}
    pcts, busy = {"ttft": [], "share": [], "router": [], "color": [], "label": []}, \
        {"router": [], "busy": [], "replica": [], "color": []}
    mean = {"router": [], "mean": [], "max": [], "color": [], "label": []}
    for router in ROUTERS:
        r, s = run(p, router.key), sums[router.key]
        m = a = 0
        col = []
        for sv in r.served:
            m, a = m + sv.matched, a + sv.matched + sv.computed
            col.append(m / a)
        running[router.key] = [col[i] for i in shown]
        # The distribution as a staircase (the page draws it with Bokeh's step glyph, horizontal after each point):
        # from 0 up to the first share at the shortest time, then the share of requests at or below each time
        # shown (every request's, or CURVE_POINTS of them), one point per step instead of a line's two.
        ttft = ttfts(p, router.key)[1]
        ecdf_lines[router.key] = {"ttft": [ttft[0]] + [ttft[i] for i in shown],
                                  "share": [0.0] + [(i + 1) / n for i in shown]}
        for qq, label in ((0.5, "p50"), (0.99, "p99")):
            pcts["ttft"].append(percentile(ttft, qq))
            pcts["share"].append(qq)
            pcts["router"].append(router.name)
            pcts["color"].append(ROUTER_COLORS[router.key])
            pcts["label"].append(f"{label} {percentile(ttft, qq):.2f} s")
        for i, b in enumerate(r.busy):
            busy["router"].append(router.name)
            busy["busy"].append(b)
            busy["replica"].append(f"replica {i}")
            busy["color"].append(ROUTER_COLORS[router.key])
        mean["router"].append(router.name)
        mean["mean"].append(sum(r.busy) / len(r.busy))
        mean["max"].append(max(r.busy))
        mean["color"].append(ROUTER_COLORS[router.key])
        mean["label"].append(f"imbalance {imbalance(r.busy):.2f}")
    at = frame_data(p, opening_frame(p))
    cap = whole_block_tokens(p)
    lanes_src = lanes(p)
    top = HEADS_Y + 0.5
    bottom = lane_y(p, len(ROUTERS) - 1, p.replicas - 1) - 0.8
    longest = max(max(sums[k]["ttft_p99_s"] for k in BY_KEY), 1e-9)
    sources = {**at["sources"], **lanes_src, "running": running, "percentiles": pcts,
               "unlimited": {"request": [-0.5, n - 0.5], "hit_rate": [w.unlimited_found / w.prompt_tokens] * 2},
               **{f"ecdf_{k}": v for k, v in ecdf_lines.items()}, "busy": busy, "busy_mean": mean}
    return {
        **at,
        "sources": sources,
        "ranges": {"lanes_x": [-0.3 * cap, cap * (1.04 + QUEUE_SHOWN * 0.062) + 0.42 * cap],
                   "lanes_y": [bottom, top], "running_x": [-0.5, n - 0.5], "ttft_x": [0, 1.08 * longest],
                   "busy_y": [0, 1.18 * max(max(mean["max"]), 1e-9)]},
        "formula": formula(p, sums),
        "readouts": readouts(p, sums),
        "notes": notes(p),
        "texts": {**at["texts"], **plot_summaries(sources), "trace": trace_note(p), "lanes_key": lanes_key(p)},
    }


def trace_note(p: LoadBalancerParams) -> str:
    w = workload(p)
    n, s = len(w.requests), len({q.session for q in w.requests})
    span = w.requests[-1].arrival - w.requests[0].arrival
    if w.uploaded:
        how = "from its session_id field" if w.sessions_given else "inferred from the hash ids"
        return (f"Replaying the uploaded trace: {n:,} requests over {span:,.1f} s, {s:,} sessions ({how}). "
                f"Sessions, turns, system prompt, message, answer, arrival rate, skew and seed do not apply to it, "
                f"and a link reproduces only the synthetic trace.")
    return (f"Replaying the synthetic trace: {n:,} requests from {s:,} sessions over {span:,.1f} s, "
            f"in the Mooncake format. Upload your own above.")


def capacity_line(p: LoadBalancerParams) -> dict:
    """The cache per replica: the cache-renting arithmetic for its GPUs, or the override."""
    cap = capacity_tokens(p)
    if p.capacity is not None:
        return {"name": "Prefix cache per replica", "formula": "capacity (set by hand)",
                "substituted": f"{thousands(cap)} tokens", "result": f"{thousands(cap)} tokens"}
    r, g, m = hardware(p), GPUS[p.gpu], MODELS[p.model]
    return {"name": "Prefix cache per replica",
            "formula": "(GPUs × memory − weights − GPUs × reserve) ÷ KV bytes per token",
            "substituted": f"({p.gpus_per_replica} × {g.memory_gb:g} GB − {r['weights_bytes'] / GB:,.1f} GB − "
                           f"{p.gpus_per_replica} × {RESERVE_GB:g} GB) ÷ {r['kv_bytes_per_token']:,.0f} bytes "
                           f"({m.title}, BF16 weights and cache, on {g.title})",
            "result": f"{thousands(cap)} tokens"}


def notes(p: LoadBalancerParams) -> list[str]:
    """What the reader must know to read the results: prompts that do not fit, and the reference hit rate."""
    w, out = workload(p), []
    big, cap = over_cache(p), whole_block_tokens(p)
    if big:
        longest = max(q.input_length for q in w.requests)
        out.append(f"{big:,} of {len(w.requests):,} prompts (the longest {thousands(longest)} tokens) are longer "
                   f"than a replica's whole {thousands(cap)}-token cache: each empties the cache it lands on and "
                   f"keeps only its first {thousands(cap)} tokens, so every router's hit rate suffers. Give each "
                   f"replica more GPUs or a larger GPU.")
    return out


def _p99_request(p: LoadBalancerParams, key: str) -> Served:
    ttft, ordered = ttfts(p, key)
    return run(p, key).served[ttft.index(percentile(ordered, 0.99))]    # the first request at the p99


def formula(p: LoadBalancerParams, sums: dict) -> list[dict]:
    w = workload(p)
    lines = []
    if not w.uploaded:
        lines.append({"name": "Prompt of turn t", "formula": "system prompt + t × (message + answer) + message",
                      "substituted": f"{thousands(p.system_prompt)} + t × ({thousands(p.message)} + "
                                     f"{thousands(p.answer)}) + {thousands(p.message)}",
                      "result": ", ".join(thousands(p._prompt(t)) for t in range(min(4, p._longest())))
                                + (" … tokens" if p._longest() > 4 else " tokens")})
    k = frame_requests(len(w.requests))[opening_frame(p)]
    sv = run(p, "cache_aware").served[k]
    lines.append({"name": f"Cached part, request {k} (cache-aware)",
                  "formula": "min(blocks found in the replica's radix tree × block size, prompt)",
                  "substituted": f"min({sv.blocks} × {thousands(p.block_size)}, {thousands(w.requests[k].input_length)})",
                  "result": f"{thousands(sv.matched)} tokens"})
    lines.append(capacity_line(p))
    for router in ROUTERS:
        s = _p99_request(p, router.key)
        q = w.requests[s.request]
        prefill = (f"({thousands(q.input_length)} − {thousands(s.matched)}) ÷ {thousands(p.prefill_rate)} tokens/s"
                   if p.prefill_rate is not None else
                   f"prefill(n = {thousands(q.input_length)} − {thousands(s.matched)}, c = {thousands(s.matched)})")
        lines.append({"name": f"Time to first token, {router.name} (its p99: request {s.request})",
                      "formula": "queue wait + (prompt − cached) ÷ prefill rate" if p.prefill_rate is not None
                                 else "queue wait + prefill of the n uncached tokens after the c cached ones",
                      "substituted": f"{s.wait:.3f} s + {prefill}",
                      "result": f"{s.ttft:.3f} s"})
    if p.prefill_rate is None:                    # the time model itself, for the cache-aware router's p99 request
        s = _p99_request(p, "cache_aware")
        row = timing.prefill_formula(MODELS[p.model], GPUS[p.gpu], w.requests[s.request].input_length - s.matched,
                                     s.matched, gpus=p.gpus_per_replica, mfu=p.mfu)
        lines.append({**row, "name": f"Prefill time, request {s.request} (cache-aware's p99)"})
    found = w.unlimited_found
    lines.append({"name": "Hit rate with an unlimited cache (reference)",
                  "formula": "Σ longest prefix of each prompt seen in any earlier prompt ÷ Σ prompt tokens",
                  "substituted": f"{thousands(found)} ÷ {thousands(w.prompt_tokens)}",
                  "result": f"{found / w.prompt_tokens:.1%}"})
    lines.append({"name": "Hit rate", "formula": "Σ cached tokens ÷ Σ prompt tokens",
                  "substituted": "; ".join(f"{r.name} {thousands(sums[r.key]['tokens_matched'])} ÷ "
                                           f"{thousands(sums[r.key]['tokens_requested'])}" for r in ROUTERS),
                  "result": ", ".join(f"{sums[r.key]['hit_rate']:.1%}" for r in ROUTERS)})
    lines.append({"name": "Load imbalance", "formula": "busiest replica's prefill seconds ÷ the mean over replicas",
                  "substituted": "; ".join(f"{r.name} {max(sums[r.key]['busy_s']):.2f} ÷ "
                                           f"{sum(sums[r.key]['busy_s']) / p.replicas:.2f}" for r in ROUTERS),
                  "result": ", ".join(f"{sums[r.key]['imbalance']:.2f}" for r in ROUTERS)})
    lines.append(score_line(p))
    return lines


def score_line(p: LoadBalancerParams) -> dict:
    """The cache-aware router's scores for the request the animation opens on, replica by replica."""
    k = frame_requests(len(workload(p).requests))[opening_frame(p)]
    scores = run(p, "cache_aware").scores[k]
    best = run(p, "cache_aware").served[k].replica
    return {"name": f"Cache-aware score, request {k}",
            "formula": "cached − load weight × queued  (tokens; the highest wins)",
            "substituted": "; ".join(f"replica {i}: {thousands(c)} − {p.load_weight:g} × {thousands(ld)}"
                                     for i, (_, c, ld) in enumerate(scores)),
            "result": ", ".join(f"{sc:,.0f}" for sc, _, _ in scores) + f" → replica {best}"}


def readouts(p: LoadBalancerParams, sums: dict) -> list[dict]:
    w = workload(p)
    return [{"label": router.name, "value": f"{sums[router.key]['hit_rate']:.0%} hits",
             "detail": f"first token p50 {sums[router.key]['ttft_p50_s']:.2f} s, p99 "
                       f"{sums[router.key]['ttft_p99_s']:.2f} s; imbalance {sums[router.key]['imbalance']:.2f}"}
            for router in ROUTERS] + [
        {"label": "unlimited cache", "value": f"{w.unlimited_found / w.prompt_tokens:.0%} hits",
         "detail": "the most any router could reuse: one cache that keeps every prompt (Mooncake's Table 2: "
                   "40% for its conversation trace, 66% for its synthetic one)"}]
