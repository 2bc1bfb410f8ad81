"""Reserve for the worst case, or page.

Two allocators serve the same stream of requests from KV memories of the same size, one engine step at a time,
under one scheduler whose accounting follows nano-vllm (engine/scheduler.py and engine/block_manager.py,
commit bb823b3) and vLLM v1:

- a step either prefills the requests at the head of the queue that fit (and nothing else runs), or, when none
  fits, decodes every running request by one token;
- a prefill writes the KV of every token the request has so far; a decode step writes the KV of the token sampled
  in the step before, so the token a step samples is stored in the next step, and the last one never;
- reserve: each request gets one contiguous chunk when it is admitted, sized for its maximum length ("max"), for
  the next power of two above its real length ("pow2"), or for exactly its real length ("oracle"), as the
  PagedAttention paper's Orca baselines do (Kwon et al., SOSP 2023, sec. 6.1);
- paged: fixed-size blocks from a first-in, first-out free list, a block table per request, a block taken only
  when a token is written past the last one. When a running request needs a block and none is free, the latest
  admitted is preempted: recomputed later (full blocks keep their contents until reused, so it re-finds its own
  prefix, as with prefix caching), or swapped out and back; or ("wait") a request is admitted only when every
  running one is sure of blocks up to max_len, so none is ever preempted.

Deterministic for a given seed. Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import heapq
import itertools
import math
import operator
import random

from ..core.params import ParamError, Params, choice, integer
from ..core.summaries import pct, summaries
from ..core.units import thousands
from .record import Record, Segment

ROW_SLOTS = 512                 # the memory maps wrap every 512 token slots
PREFILL_TOKENS = 16_384         # tokens one prefill step may compute: nano-vllm's max_num_batched_tokens default
MAX_STEPS = 50_000              # a run longer than this is stopped, and the page says so


@dataclasses.dataclass(frozen=True)
class PagingParams(Params):
    requests: int = integer(40, unit="requests", min=2, max=200,
                            help="Requests in the stream (two at least: one request alone has nothing to share with)")
    prompt_mean: int = integer(161, unit="tokens", min=1, max=4096,
                               help="Mean prompt length (exponential); ShareGPT's is 161 (PagedAttention, Fig. 11)")
    output_mean: int = integer(338, unit="tokens", min=1, max=4096,
                               help="Mean output length (exponential); ShareGPT's is 338")
    max_len: int = integer(2048, unit="tokens", min=16, max=16384, help="Longest a request may be, prompt + output")
    block_size: int = integer(16, unit="tokens", min=1, max=256, help="Tokens per block (paged)")
    memory_slots: int = integer(8192, unit="tokens", min=64, max=131072, help="KV memory, in token slots")
    arrival_gap: int = integer(4, unit="steps", min=0, max=1000, help="Engine steps between arrivals")
    reserve: str = choice("max", ("max", "pow2", "oracle"), help="How much the reserving allocator sets aside")
    on_full: str = choice("recompute", ("recompute", "swap", "wait"),
                          help="Paged: when a running request needs a block and none is free, preempt the latest "
                               "admitted and recompute it later or swap it out; or wait: admit a request only when "
                               "every running one is sure of blocks up to max_len, so none is ever preempted")
    seed: int = integer(0, unit="seed", min=0, max=10_000, help="Seed for lengths")
    inspect: int = integer(0, unit="request", min=0, max=199, help="Request whose block table is shown")

    def __post_init__(self):
        super().__post_init__()
        if self.inspect >= self.requests:
            raise ParamError("inspect", f"inspect must be between 0 and {self.requests - 1} request; "
                                        f"got {self.inspect}.")
        if self.max_len > self.memory_slots:
            raise ParamError("max_len", f"max_len must be at most memory_slots ({self.memory_slots:,} tokens), "
                                        f"so that one request fits; got {self.max_len:,}.")
        whole = -(-self.max_len // self.block_size) * self.block_size
        if whole > self.memory_slots:
            raise ParamError("memory_slots", f"memory_slots must hold one request of max_len ({self.max_len:,} "
                                             f"tokens) in whole blocks of {self.block_size}, at least {whole:,} "
                                             f"token slots; got {self.memory_slots:,}.")
        last_arrival = (self.requests - 1) * self.arrival_gap
        if last_arrival >= MAX_STEPS:
            most = (MAX_STEPS - 1) // (self.requests - 1)
            raise ParamError("arrival_gap", f"arrival_gap must be at most {most:,} steps with {self.requests} "
                                            f"requests, so that the last arrives within the {MAX_STEPS:,} steps "
                                            f"simulated; got {self.arrival_gap:,}.")


# eq=False: the simulator asks "is this request still running?" thousands of times a run, and each
# request is one object, so identity is the right equality (field-by-field cost a third of a run).
@dataclasses.dataclass(frozen=True, eq=False)
class Request:
    id: int
    arrival: int
    prompt: int
    output: int

    @property
    def total(self) -> int:
        return self.prompt + self.output


def workload(p: PagingParams) -> list[Request]:
    """Exponential prompt and output lengths with the given means, each request at most max_len."""
    rng = random.Random(p.seed)
    out = []
    for i in range(p.requests):
        prompt = min(p.max_len - 1, max(1, round(rng.expovariate(1 / p.prompt_mean))))
        output = min(p.max_len - prompt, max(1, round(rng.expovariate(1 / p.output_mean))))
        out.append(Request(i, i * p.arrival_gap, prompt, output))
    return out


def reservation(p: PagingParams, r: Request) -> int:
    if p.reserve == "max":
        return p.max_len
    if p.reserve == "pow2":
        return min(p.max_len, 2 ** math.ceil(math.log2(r.total)))
    return r.total


# ---- the two allocators ------------------------------------------------------------------------------
# Both answer the scheduler's questions: can this request be admitted with `tokens` tokens (and how many of them
# are already cached)? Is there room to write the token at index `written`? `used` is the token slots allocated.
class ReserveAllocator:
    """Contiguous chunks, first fit. A chunk is reserved on admission and freed on completion."""

    def __init__(self, p: PagingParams):
        self.p = p
        self.chunks: dict[int, tuple[int, int]] = {}       # request -> (start, size)
        self.used = 0
        self.fit: tuple[int, int | None] | None = None     # the last first fit asked: (size, start), until a change

    def _first_fit(self, size: int) -> int | None:
        if self.fit is not None and self.fit[0] == size:  # the queue's head is asked about at every event
            return self.fit[1]
        self.fit = size, self._search(size)
        return self.fit[1]

    def _search(self, size: int) -> int | None:
        start = 0
        for s, n in sorted(self.chunks.values()):
            if s - start >= size:
                break
            start = max(start, s + n)
        return start if start + size <= self.p.memory_slots else None

    def fits(self, r: Request, tokens: int, running: int) -> int | None:
        return None if self._first_fit(reservation(self.p, r)) is None else 0

    def admit(self, r: Request, tokens: int, cached: int) -> None:
        size = reservation(self.p, r)
        self.chunks[r.id] = (self._first_fit(size), size)
        self.used += size
        self.fit = None

    def append(self, r: Request, written: int) -> bool:
        return True                                             # the reservation covers every token

    def release(self, r: Request, keep: int = 0) -> None:
        self.used -= self.chunks.pop(r.id)[1]
        self.fit = None

    def reserved(self) -> int:
        return self.used

    def clone(self) -> "ReserveAllocator":
        c = ReserveAllocator.__new__(ReserveAllocator)
        c.p, c.chunks, c.used, c.fit = self.p, dict(self.chunks), self.used, self.fit
        return c


class PagedAllocator:
    """Fixed-size blocks from a first-in, first-out free list; a block table per request, filled as tokens arrive.

    As in nano-vllm's BlockManager (and vLLM v1's free block queue), freed blocks go to the back of the free list
    and keep what they hold until they are taken again, so a preempted request re-finds its own full blocks
    (prefix caching; only with on_full=recompute, where that saves work). Requests share no prefixes here.
    """

    def __init__(self, p: PagingParams):
        self.p, self.bs = p, p.block_size
        self.blocks = p.memory_slots // p.block_size
        # The free list is a list read from `head`. Its entries are numbered from the first ever appended
        # (absolute number = base + index in the list), so an entry is still free while its number is at least
        # base + head, unless it was re-found from the middle: those ranges are in `gone`, skipped when reached.
        # Taking blocks from the front is then a list slice, with no work per block.
        self.queue, self.head, self.base = list(range(self.blocks)), 0, 0
        self.gone: list[tuple[int, int]] = []                  # a heap of (first, last) entries re-found
        self.nfree = self.blocks
        self.tables: dict[int, list[int]] = {}
        self.used = 0
        self.caching = p.on_full == "recompute"
        # A preempted request's full blocks, first to last, and the entry of the first: its blocks were freed
        # last first, so block i sits at entry first - i, and stays findable until the front passes it.
        self.cached: dict[int, tuple[list[int], int]] = {}
        # on_full=wait: admit only while every running request, and the new one, could reach max_len.
        self.guarantee = self.blocks_for(p.max_len) if p.on_full == "wait" else 0

    @property
    def free_blocks(self) -> list[int]:
        """The free list, front first (for tests and the page; the allocator itself never lists it)."""
        gone = {e for lo, hi in self.gone for e in range(lo, hi + 1)}
        return [b for e, b in enumerate(self.queue[self.head:], self.base + self.head) if e not in gone]

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.bs)

    def findable(self, rid: int) -> list[int]:
        """The blocks a preempted request would find still holding its first blocks (a prefix of them)."""
        blocks, first = self.cached.get(rid, ((), 0))
        return list(blocks[:max(0, first - (self.base + self.head) + 1)])

    def fits(self, r: Request, tokens: int, running: int) -> int | None:
        need = -(-tokens // self.bs)
        if need > self.nfree or (running + 1) * self.guarantee > self.blocks:
            return None
        cached = self.cached.get(r.id)
        if cached is None:
            return 0
        findable = min(len(cached[0]), max(0, cached[1] - (self.base + self.head) + 1))     # as findable()
        return min(need - 1, findable) * self.bs    # never the last block (nano-vllm)

    def admit(self, r: Request, tokens: int, cached: int) -> None:
        table = []
        if cached:
            blocks, first = self.cached.pop(r.id)
            hits = cached // self.bs
            table = blocks[:hits]
            heapq.heappush(self.gone, (first - hits + 1, first))
            self.nfree -= hits
        table.extend(self.take(self.blocks_for(tokens) - len(table)))
        self.tables[r.id] = table
        self.used += len(table) * self.bs

    def take(self, count: int) -> list[int]:
        """The first `count` free blocks; what they held is no longer findable."""
        q, head = self.queue, self.head
        if not self.gone or self.gone[0][0] >= self.base + head + count:     # no re-found range in the way
            out = q[head:head + count]
            self.head = head + count
        else:
            out = self._take_around(count)
        self.nfree -= count
        if self.head > 2 * self.blocks:                             # drop what was read, keep the numbering
            self.base += self.head
            self.queue, self.head = q[self.head:], 0
        return out

    def _take_around(self, count: int) -> list[int]:
        """take(count) where ranges re-found from the middle of the free list are skipped."""
        out, q = [], self.queue
        while len(out) < count:
            need = count - len(out)
            if self.gone and self.gone[0][0] < self.base + self.head + need:     # skip a range re-found
                lo, hi = heapq.heappop(self.gone)
                out.extend(q[self.head:lo - self.base])
                self.head = hi - self.base + 1
            else:
                out.extend(q[self.head:self.head + need])
                self.head += need
        return out

    def append(self, r: Request, written: int) -> bool:
        if written < len(self.tables[r.id]) * self.bs:
            return True
        if not self.nfree:
            return False
        self.tables[r.id].extend(self.take(1))
        self.used += self.bs
        return True

    def release(self, r: Request, keep: int = 0) -> None:
        """Free the request's blocks, the last first; with keep, its first keep tokens' full blocks stay findable.

        nano-vllm registers a block's hash as soon as it is full (hash_blocks); only a preempted request ever
        looks its own blocks up again (requests share no prefixes here), so remembering them when it is
        preempted finds exactly the same blocks. A request stores more tokens each time it is preempted, so
        this replaces all it had left before."""
        table = self.tables.pop(r.id)
        if self.caching and keep >= self.bs:
            self.cached[r.id] = (table[:keep // self.bs], self.base + len(self.queue) + len(table) - 1)
        self.queue.extend(reversed(table))
        self.nfree += len(table)
        self.used -= len(table) * self.bs

    def reserved(self) -> int:
        return self.used

    def clone(self) -> "PagedAllocator":
        """An independent copy; the free list keeps only its unread part, renumbered from the same entries."""
        c = PagedAllocator.__new__(PagedAllocator)
        c.p, c.bs, c.blocks, c.nfree, c.used = self.p, self.bs, self.blocks, self.nfree, self.used
        c.caching, c.guarantee = self.caching, self.guarantee
        c.queue, c.base, c.head = self.queue[self.head:], self.base + self.head, 0
        c.gone = list(self.gone)
        c.tables = {rid: list(t) for rid, t in self.tables.items()}
        c.cached = dict(self.cached)                 # its lists are never changed, only replaced
        return c


# ---- the simulation ------------------------------------------------------------------------------------


class Simulation:
    """One allocator serving the whole stream, an engine step per call to step().

    With record=True it keeps the run in `record`, a segment per stretch of steps (record.COLUMNS: tokens stored,
    slots allocated, requests running, waiting and done, whether memory was short, and the running totals of the
    preemption counters); `cols` expands it to a row per step.

    Every running request decodes in every decode step, so their progress is one clock: `tick` counts decode
    steps, and a running request has written base[id] + tick tokens. A stretch of plain steps then moves one
    number instead of every request; completions come off a heap keyed by the tick of each request's last token,
    and (paged) the running requests are grouped by the tick at which they next need a block, so a step looks
    only at those that take one.
    """

    def __init__(self, p: PagingParams, kind: str, record: bool = False, reqs: list[Request] | None = None):
        self.p, self.kind = p, kind
        self.alloc = ReserveAllocator(p) if kind == "reserve" else PagedAllocator(p)
        self.reqs = workload(p) if reqs is None else reqs          # ids 0, 1, ... in arrival order
        n = len(self.reqs)
        self.pending = collections.deque(self.reqs)     # not yet arrived
        self.waiting: collections.deque[Request] = collections.deque()   # arrived, not running (new or preempted)
        self.running: list[Request] = []                # in admission order
        self.tick = 0                                   # decode steps so far
        self.base = [0] * n                             # running: tokens written - tick
        self.sampled = [0] * n                          # not running: tokens sampled so far
        self.admission = [-1] * n                       # running: its admission number; else -1
        self.admissions = 0
        self.finishes: list[tuple[int, int, int]] = []  # heap: (tick of its last token, admission, request)
        # paged: running requests by phase (-base % block_size: a request takes a block in the decode steps whose
        # tick % block_size equals it), each list in admission order, and how many each holds
        bs = self.alloc.bs if kind == "paged" else 0
        self.phases: list[list[Request]] = [[] for _ in range(bs)]
        self.phase_counts = [0] * bs
        self.stored_total = 0
        self.done = 0
        self.preemptions = self.recomputed = self.refound = self.swapped = 0
        self.short = False                              # this step, memory kept a request out or from growing
        self.now = -1
        self.record = Record(bs) if record else None

    @property
    def finished(self) -> bool:
        return self.done == len(self.reqs)

    @property
    def written(self) -> list[int]:
        """Tokens whose KV is stored, per request (0 unless running)."""
        out = [0] * len(self.reqs)
        for r in self.running:
            out[r.id] = self.base[r.id] + self.tick
        return out

    @property
    def generated(self) -> list[int]:
        """Tokens sampled so far, per request: a running one stores all but the last it sampled."""
        out = list(self.sampled)
        for r in self.running:
            out[r.id] = self.base[r.id] + self.tick - r.prompt + 1
        return out

    def clone(self) -> "Simulation":
        """An independent copy that records nothing: a checkpoint to resume from (see `run`).

        Field by field, not copy.copy: reading an object's __dict__ (as copy.copy does) makes CPython 3.11+
        keep its attributes in a real dict from then on, and the run being copied went 40% slower."""
        c = Simulation.__new__(Simulation)
        c.p, c.kind, c.reqs, c.alloc = self.p, self.kind, self.reqs, self.alloc.clone()
        c.pending, c.waiting = collections.deque(self.pending), collections.deque(self.waiting)
        c.running, c.tick, c.base, c.sampled = list(self.running), self.tick, list(self.base), list(self.sampled)
        c.admission, c.admissions, c.finishes = list(self.admission), self.admissions, list(self.finishes)
        c.phases, c.phase_counts = [list(b) for b in self.phases], list(self.phase_counts)
        c.stored_total, c.done, c.short, c.now = self.stored_total, self.done, self.short, self.now
        c.preemptions, c.recomputed, c.refound, c.swapped = (self.preemptions, self.recomputed, self.refound,
                                                             self.swapped)
        c.record = None
        return c

    def stored(self, r: Request) -> int:
        return self.base[r.id] + self.tick if self.admission[r.id] >= 0 else 0

    # -- a request starts or stops running
    def _start(self, r: Request, tokens: int) -> None:
        """r runs with `tokens` written, and samples its next token in this step."""
        rid, base = r.id, tokens - self.tick
        self.base[rid], self.admission[rid] = base, self.admissions
        self.admissions += 1
        # its last token is sampled when prompt + output - 1 are written, one a decode step from now on
        heapq.heappush(self.finishes, (self.tick + r.prompt + r.output - 1 - tokens, self.admission[rid], rid))
        self.running.append(r)
        if self.phases:
            phase = -base % self.alloc.bs
            self.phases[phase].append(r)
            self.phase_counts[phase] += 1

    def _stop(self, r: Request, last: bool) -> int:
        """r stops running (the latest admitted if last); returns the tokens it had written."""
        rid = r.id
        written = self.base[rid] + self.tick
        self.sampled[rid] = written - r.prompt + 1
        self.admission[rid] = -1
        if last:
            self.running.pop()
        if self.phases:
            phase = -self.base[rid] % self.alloc.bs
            members = self.phases[phase]
            members.pop() if last else members.remove(r)
            self.phase_counts[phase] -= 1
        return written

    def _next_finish(self) -> int:
        """The tick at which the next running request samples its last token (entries of preempted ones go)."""
        heap = self.finishes
        while self.admission[heap[0][2]] != heap[0][1]:
            heapq.heappop(heap)
        return heap[0][0]

    # -- one step, as nano-vllm's Scheduler.schedule() and postprocess() do it
    def step(self) -> None:
        self.now += 1
        while self.pending and self.pending[0].arrival <= self.now:
            self.waiting.append(self.pending.popleft())
        self.short = False
        if not self._prefill():
            self._decode()
        self._finish()
        if self.record is not None:
            self._record(1)

    def _prefill(self) -> bool:
        """Admit from the head of the queue while the head fits; each writes the KV of all its tokens."""
        budget, admitted = PREFILL_TOKENS, False
        while self.waiting and budget:
            r = self.waiting[0]
            before = self.sampled[r.id]
            tokens = r.prompt + before
            cached = self.alloc.fits(r, tokens, len(self.running))
            if cached is None:
                self.short = True
                break
            if tokens - cached > budget and admitted:   # a prompt is < 16,384 tokens: the first always fits
                break
            self.waiting.popleft()
            self.alloc.admit(r, tokens, cached)
            if before:                                  # it had been preempted: its cache comes back
                if self.p.on_full == "swap":
                    self.swapped += tokens - 1
                else:                                   # the last token's KV was never written: it is new work
                    self.recomputed += tokens - 1 - cached
                    self.refound += cached
            budget -= tokens - cached
            self.stored_total += tokens
            self._start(r, tokens)
            admitted = True
        return admitted

    def _decode(self) -> None:
        """Every running request writes the KV of its last sampled token. One that needs a block when none is
        free preempts the latest admitted not yet served in this step (itself, if that is it)."""
        if self.phases:
            t = self.tick
            for r in list(self.phases[t % self.alloc.bs]):     # the requests whose next token opens a block
                if self.admission[r.id] < 0:                    # preempted earlier in this step
                    continue
                while not self.alloc.append(r, self.base[r.id] + t):
                    self.short = True
                    victim = self.running[-1]
                    self._preempt(victim)
                    if victim is r:
                        break
        self.tick += 1
        self.stored_total += len(self.running)

    def _preempt(self, victim: Request) -> None:
        w = self._stop(victim, last=True)
        self.alloc.release(victim, keep=w)
        if self.p.on_full == "swap":
            self.swapped += w
        self.stored_total -= w
        self.waiting.appendleft(victim)
        self.preemptions += 1

    def _finish(self) -> None:
        """The requests that have sampled all their output are done and free their memory, in admission order."""
        heap, ended = self.finishes, False
        while heap and heap[0][0] <= self.tick:
            _, admission, rid = heapq.heappop(heap)
            if self.admission[rid] != admission:       # preempted since: a later entry stands for it
                continue
            r = self.reqs[rid]
            self.stored_total -= self._stop(r, last=False)
            self.alloc.release(r)
            self.done += 1
            ended = True
        if ended:
            self.running = [r for r in self.running if self.admission[r.id] >= 0]

    @property
    def cols(self) -> dict[str, list]:
        """The recorded run, a row per step."""
        return self.record.columns()

    def _record(self, steps: int, grown: list[int] | None = None, arrived: list[int] | None = None,
                stored: int | None = None, used: int | None = None) -> None:
        """A segment for the last `steps` steps, ending with `stored` tokens in `used` slots (default: now); grown[j],
        if given, is how many blocks step j took, and arrived[j] how many requests waited after it."""
        self.record.add(Segment._make((steps, self.stored_total if stored is None else stored,
                                       self.alloc.used if used is None else used, grown, arrived, len(self.running),
                                       len(self.waiting), self.done, self.short, self.preemptions, self.recomputed,
                                       self.refound, self.swapped)))

    # -- many steps at once, where nothing happens but decoding
    def plain_steps(self, limit: int) -> tuple[int, list[int] | None, bool]:
        """How many of the next steps (at most `limit`) are plain: no arrival, admission or preemption, and no
        completion except in the last of them.

        In such steps every running request writes one token and takes a block when it crosses into a new one,
        so they can be taken together (skip) with exactly the outcome of stepping one at a time; requests that
        sample their last token in the last step then finish, as they would at the end of that step. Also
        returns, for paged memory, how many running requests are each number of steps (0 to block_size - 1)
        from needing a block, and whether requests finish in the last step.
        """
        if self.waiting and not self.running:
            return 0, None, False                         # the head fits an empty memory: it is admitted next step
        if self.waiting:                                # it stays out: memory only fills during plain steps
            head = self.waiting[0]
            if self.alloc.fits(head, head.prompt + self.sampled[head.id], len(self.running)) is not None:
                return 0, None, False
        k = limit
        if self.pending and not self.waiting:           # behind a head that stays out, arrivals only queue
            k = min(k, self.pending[0].arrival - self.now - 1)
            if k <= 1:                                    # an arrival next step: no need to look further
                return 0, None, False
        finish = math.inf
        if self.running:
            finish = self._next_finish() - self.tick      # steps to the first completion
            k = min(k, finish)
        elif not self.pending:
            return 0, None, False
        if k <= 1:
            return 0, None, False
        if not self.phases or not self.running:
            return k, None, k == finish
        # Each cycle of block_size steps takes one block per request, the requests `room` steps from needing one
        # in the cycle's step `room`. The stretch ends before the step that would find the free list empty.
        bs, s = self.alloc.bs, self.tick % self.alloc.bs
        counts = self.phase_counts[s:] + self.phase_counts[:s]           # by room
        before = list(itertools.accumulate(counts, initial=0))     # blocks taken in a cycle's first m steps
        cycles, left = divmod(self.alloc.nfree, len(self.running))
        k = min(k, cycles * bs + bisect.bisect_right(before, left, 0, bs) - 1)
        return k, counts, k == finish

    def skip(self, k: int, counts: list[int] | None, finish: bool = False) -> None:
        """Take k plain steps at once (see plain_steps), the blocks in the order stepping would take them:
        step by step, and within a step in running order. With finish, the requests that sampled their last
        token in the last step then finish, and that step's row says so."""
        grown = None
        if counts is not None:
            bs, n = self.alloc.bs, len(self.running)
            cycles, rest = divmod(k, bs)
            blocks = self.alloc.take(cycles * n + sum(counts[:rest]))
            # one cycle's takers, in the order they take: by room, then in running order
            s, m = self.tick % bs, min(k, bs)
            order = itertools.chain.from_iterable(self.phases[s:s + m] + self.phases[:max(0, s + m - bs)])
            tables = self.alloc.tables
            for q, r in enumerate(order):
                tables[r.id].extend(blocks[q::n])
            self.alloc.used += len(blocks) * bs
            grown = list(itertools.islice(itertools.cycle(counts), k))
        self.tick += k
        self.stored_total += len(self.running) * k
        waiting = None
        if self.pending and self.pending[0].arrival <= self.now + k:     # they join the queue, nothing else
            base, arrived = len(self.waiting), []
            while self.pending and self.pending[0].arrival <= self.now + k:
                arrived.append(self.pending[0].arrival)
                self.waiting.append(self.pending.popleft())
            if self.record is not None:
                waiting = [base + bisect.bisect_right(arrived, t) for t in range(self.now + 1, self.now + k + 1)]
        self.now += k
        self.short = bool(self.waiting)
        if not finish:
            if self.record is not None:
                self._record(k, grown, waiting)
            return
        if self.record is not None:            # the stretch but its last step, whose row is after the finishing
            last_blocks = grown[-1] * self.alloc.bs if grown else 0
            self._record(k - 1, grown and grown[:-1], waiting and waiting[:-1],
                         stored=self.stored_total - len(self.running), used=self.alloc.used - last_blocks)
        self._finish()
        if self.record is not None:
            self._record(1)

    def run_to(self, step: int, fast: bool = True, checkpoints: list | None = None) -> None:
        """Advance until `step` has run or every request is done; fast takes plain steps together. With
        `checkpoints`, append a copy of the simulation every CHECKPOINT_STEPS steps or so."""
        mark = self.now + CHECKPOINT_STEPS
        total = len(self.reqs)
        while self.now < step and self.done < total:
            k, counts, finish = self.plain_steps(step - self.now) if fast else (0, None, False)
            if k > 1:
                self.skip(k, counts, finish)
            else:
                self.step()
            if checkpoints is not None and self.now >= mark:
                checkpoints.append(self.clone())
                mark = self.now + CHECKPOINT_STEPS

    def summary(self) -> dict:
        return {"stored": self.stored_total, "running": len(self.running), "waiting": len(self.waiting),
                "done": self.done, "preemptions": self.preemptions, "recomputed": self.recomputed,
                "refound": self.refound, "swapped": self.swapped, "in_use": self.alloc.used,
                "waste_per_request": ((self.alloc.used - self.stored_total) / len(self.running)
                                      if self.running else 0.0)}

    def layout(self) -> list[tuple]:
        """(request, first slot, slots, tokens stored) for every piece of memory in use."""
        if self.kind == "reserve":
            return [(rid, start, size, self.base[rid] + self.tick) for rid, (start, size) in self.alloc.chunks.items()]
        out, bs = [], self.p.block_size
        for rid, table in self.alloc.tables.items():
            full, rest = divmod(self.base[rid] + self.tick, bs)     # a table holds just the blocks its tokens need
            out.extend([(rid, block * bs, bs, bs) for block in table[:full]])
            if rest:
                out.append((rid, table[full] * bs, bs, rest))
        return out


# ---- runs, cached per allocator ---------------------------------------------------------------------------
KINDS = ("reserve", "paged")


def allocator_key(p: PagingParams, kind: str) -> tuple:
    """The parameters one allocator's run depends on: changing `inspect`, or the other allocator's setting,
    reuses it."""
    stream = (p.requests, p.prompt_mean, p.output_mean, p.max_len, p.memory_slots, p.arrival_gap, p.seed)
    return (kind, *stream, *((p.reserve,) if kind == "reserve" else (p.block_size, p.on_full)))


_runs: collections.OrderedDict[tuple, Record] = collections.OrderedDict()    # allocator key -> the run
_live: collections.OrderedDict[tuple, Simulation] = collections.OrderedDict()   # allocator key -> a simulation
# allocator key -> copies of the run's simulation along the way, in step order: a frame before the live
# simulation's step (the page's opening frame, a step back) resumes from the nearest, not from step 0.
_checkpoints: collections.OrderedDict[tuple, list] = collections.OrderedDict()
CACHED_RUNS = 16
CHECKPOINT_STEPS = 256


def _remember(cache: collections.OrderedDict, key: tuple, value) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > CACHED_RUNS:
        cache.popitem(last=False)


def clear_caches() -> None:
    _runs.clear()
    _live.clear()
    _checkpoints.clear()


def run(p: PagingParams, kind: str) -> Record:
    """One allocator's run (Simulation.record) until every request has finished or MAX_STEPS."""
    key = allocator_key(p, kind)
    record = _runs.get(key)
    if record is None:
        sim, checkpoints = Simulation(p, kind, record=True), []
        sim.run_to(MAX_STEPS - 1, checkpoints=checkpoints)
        record = sim.record
        _remember(_runs, key, record)
        _remember(_checkpoints, key, checkpoints)
        _remember(_live, key, sim)                  # the last frame is then free to draw
    else:
        _runs.move_to_end(key)
    return record


def history(p: PagingParams) -> dict[str, Record]:
    return {kind: run(p, kind) for kind in KINDS}


def state_at(p: PagingParams, kind: str, k: int) -> Simulation:
    """The simulation after step k. Playing forward reuses the last one, so each frame costs one step; a frame
    before it resumes from the run's nearest checkpoint at or before k."""
    key = allocator_key(p, kind)
    sim = _live.get(key)
    if sim is None or sim.now > k:
        earlier = [c for c in _checkpoints.get(key, ()) if c.now <= k]
        sim = earlier[-1].clone() if earlier else Simulation(p, kind)
    sim.run_to(k)
    _remember(_live, key, sim)
    return sim


def summarize(record: Record, p: PagingParams) -> dict:
    return record.summary(p.memory_slots, p.requests)


def evaluate(p: PagingParams) -> dict:
    out = {kind: summarize(record, p) for kind, record in history(p).items()}
    return {"reserve": out["reserve"], "paged": out["paged"],
            "reserve_token_state_share": out["reserve"]["token_state_share_busy"],
            "paged_token_state_share": out["paged"]["token_state_share_busy"]}


# ---- what the page draws --------------------------------------------------------------------------------
def memory_map(layout: list[tuple], p: PagingParams, kind: str) -> dict:
    """Rectangles of the memory map at one frame, wrapped into rows of ROW_SLOTS slots."""
    pieces = []                     # (request, first slot, end slot, stored?), none across the end of a row
    for rid, start, size, stored in layout:
        if start % ROW_SLOTS + size <= ROW_SLOTS:       # the usual case (a block, a short chunk): one row
            if stored:
                pieces.append((rid, start, start + stored, True))
            if size > stored:
                pieces.append((rid, start + stored, start + size, False))
            continue
        for first, n, what in ((start, stored, True), (start + stored, size - stored, False)):
            while n > 0:
                end = min(first + n, first - first % ROW_SLOTS + ROW_SLOTS)
                pieces.append((rid, first, end, what))
                n -= end - first
                first = end
    unused = "reserved" if kind == "reserve" else "last-block slack"
    # Column by column: a comprehension each is several times faster than appending to seven lists per piece
    # (in Pyodide most of all).
    return {"x0": [a % ROW_SLOTS for _, a, _, _ in pieces],
            "x1": [b - a + a % ROW_SLOTS for _, a, b, _ in pieces],
            "row": [a // ROW_SLOTS for _, a, _, _ in pieces],
            "request": [rid for rid, _, _, _ in pieces],
            "kind": ["stored" if what else unused for _, _, _, what in pieces],
            "color": [PALETTE[rid % len(PALETTE)] for rid, _, _, _ in pieces],
            "alpha": [1.0 if what else 0.3 for _, _, _, what in pieces]}


PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354",
           "#756bb1", "#636363"]


def block_table_text(sim: Simulation, p: PagingParams) -> str:
    rid = p.inspect
    if rid not in sim.alloc.tables:
        return f"Request {rid} holds no blocks at step {sim.now} (not arrived, waiting, preempted or finished)."
    table = sim.alloc.tables[rid]
    stored = sim.stored(sim.reqs[rid])
    pairs = ", ".join(f"{i}→{b}" for i, b in enumerate(table))
    slack = len(table) * p.block_size - stored
    return (f"Request {rid} at step {sim.now}: {thousands(stored)} tokens in {len(table)} blocks of "
            f"{p.block_size}; logical→physical: {pairs}. Its last block has {slack} empty slots.")


FRAMES = 300                  # a long run is shown, and animated, at most this many steps apart


def frame_steps(p: PagingParams) -> list[int]:
    """The step each animation frame shows: every step of a short run, evenly spaced for a long one."""
    n = max(record.steps for record in history(p).values())
    stride = max(1, math.ceil(n / FRAMES))
    return list(range(0, n, stride)) + ([n - 1] if (n - 1) % stride else [])


def frame_data(p: PagingParams, frame: int) -> dict:
    """What changes from frame to frame: the two memory maps, the cursor, the block table, the caption."""
    steps = frame_steps(p)
    frame = max(0, min(len(steps) - 1, frame))
    k = steps[frame]
    sims = {kind: state_at(p, kind, k) for kind in KINDS}
    sources = {
        "reserve_map": memory_map(sims["reserve"].layout(), p, "reserve"),
        "paged_map": memory_map(sims["paged"].layout(), p, "paged"),
        "cursor": {"step": [k], "top": [1.0], "top_running": [p.requests]},
    }
    return {
        "sources": sources,
        "animation": {"mode": "on_demand", "frames": len(steps), "frame": frame, "caption": caption(sims, p, k)},
        "texts": {"block_table": block_table_text(sims["paged"], p),
                  **summaries(**{f"{kind}_map": map_summary(sources[f"{kind}_map"], kind, k, p.memory_slots)
                                 for kind in KINDS})},
    }


def map_summary(cols: dict, kind: str, step: int, slots: int) -> str:
    """One memory map in words, from its rectangles."""
    held = collections.Counter()
    for kind_, a, b in zip(cols["kind"], cols["x0"], cols["x1"]):
        held[kind_] += b - a
    unused = "reserved" if kind == "reserve" else "last-block slack"
    words = "reserved but still empty" if kind == "reserve" else "empty ends of last blocks"
    return (f"{kind.capitalize()} at step {thousands(step)}: {len(set(cols['request']))} requests hold memory; "
            f"{thousands(held['stored'])} of {thousands(slots)} slots ({pct(held['stored'] / slots)}) hold tokens, "
            f"{thousands(held[unused])} are {words} and {thousands(slots - held['stored'] - held[unused])} are free.")


def series_summaries(series: dict) -> dict:
    """The two plots of the whole run in words, from the series they draw."""
    steps, out = series["step"], {}
    share, running = [], []
    for kind in KINDS:
        n = series[f"{kind}_running"]
        last = max((i for i, x in enumerate(n) if x), default=-1)
        upto = series[f"{kind}_share"][:last + 1] or [0.0]
        end = (f"has finished by step {thousands(steps[last + 1])}" if last + 1 < len(steps)
               else f"is still going at step {thousands(steps[-1])}")
        share.append(f"{kind} up to {pct(max(upto))} (mean {pct(sum(upto) / len(upto))}) and {end}")
        running.append(f"{kind} runs at most {max(n)} requests at once")
    preempted = series["paged_preemptions"][-1]
    return summaries(
        share="Share of memory holding token states: " + "; ".join(share) + ".",
        running=("; ".join(running) + f"; paged preempts a request {thousands(preempted)} "
                 f"{'time' if preempted == 1 else 'times'} in all.").capitalize())


def busiest_frame(p: PagingParams) -> int:
    """The frame to open on: when the most requests wait for memory (the maps are full), not the empty end."""
    steps = frame_steps(p)
    at = history(p)["paged"].at(steps)
    load = list(map(operator.add, at["waiting"], at["running"]))
    return max(range(len(steps)), key=lambda i: (load[i], -i))


def page_data(p: PagingParams, frame: int | None = None) -> dict:
    hist = history(p)
    steps = frame_steps(p)
    series = {"step": steps}
    for kind, record in hist.items():
        at = record.at(steps)
        series[f"{kind}_share"] = [stored / p.memory_slots for stored in at["stored"]]
        series[f"{kind}_running"] = at["running"]
        series[f"{kind}_preemptions"] = at["preemptions"]
    r = evaluate(p)
    at = frame_data(p, busiest_frame(p) if frame is None else frame)
    return {
        **at,
        "sources": {**at["sources"], "series": series},
        "texts": {**at["texts"], **series_summaries(series)},
        "ranges": {"map_rows": [math.ceil(p.memory_slots / ROW_SLOTS) - 0.5, -0.5]},
        "formula": formula(p, r),
        "readouts": readouts(p, r),
        "notes": notes(p, r),
    }


def notes(p: PagingParams, r: dict) -> list[str]:
    out = []
    never = [kind for kind in KINDS if r[kind]["token_state_share_busy"] is None]
    if len(never) == 2:
        out.append("Memory never ran short in this run: every request was admitted when it arrived and could always "
                   "grow, so the share of memory holding tokens says nothing about capacity. The shares shown are "
                   "of the memory each allocator had allocated. Make memory smaller, requests longer or arrivals "
                   "closer to see the allocators differ.")
    elif never:
        out.append(f"The {never[0]} allocator never ran short of memory in this run (every request was admitted "
                   f"when it arrived), while the other did: its share shown is of the memory it had allocated.")
    for kind in KINDS:
        s = r[kind]
        if s["stopped_early"]:
            out.append(f"The {kind} run was stopped after {thousands(s['steps'])} steps with "
                       f"{s['finished_requests']} of {p.requests} requests finished: its figures describe those "
                       f"steps only.")
    return out


def _share(s: dict) -> float:
    """Share of memory holding tokens while memory was short, or else of the memory allocated."""
    busy = s["token_state_share_busy"]
    return s["token_state_share_of_allocated"] if busy is None else busy


def _share_text(s: dict, digits: int = 1) -> str:
    if s["token_state_share_busy"] is None:
        return f"never short ({_share(s):.{digits}%} of what it allocated)"
    return f"{_share(s):.{digits}%}"


def caption(sims: dict, p: PagingParams, k: int) -> str:
    parts = []
    for kind, sim in sims.items():
        parts.append(f"{kind}: {len(sim.running)} running, {len(sim.waiting)} waiting, {sim.done} done, "
                     f"{sim.stored_total / p.memory_slots:.0%} of memory holds tokens")
    return f"Step {k}. " + "; ".join(parts) + "."


def formula(p: PagingParams, r: dict) -> list[dict]:
    mean_total = p.prompt_mean + p.output_mean
    res = {"max": "max_len, whatever the request", "pow2": "next power of two ≥ prompt + output",
           "oracle": "prompt + output (known in advance)"}[p.reserve]
    rs, ps = r["reserve"], r["paged"]
    return [
        {"name": "Share holding token states", "formula": "Σ tokens stored ÷ memory slots, averaged over the steps "
                                                          "when memory kept a request out or from growing",
         "substituted": f"reserve ({p.reserve}): {_share_text(rs)} over {thousands(rs['steps_memory_short'])} "
                        f"steps; paged: {_share_text(ps)} over {thousands(ps['steps_memory_short'])} steps",
         "result": f"{_share(rs):.1%} vs {_share(ps):.1%}"},
        {"name": "Reserved per request", "formula": res,
         "substituted": f"mean request: {thousands(p.prompt_mean)} + {thousands(p.output_mean)} = "
                        f"{thousands(mean_total)} tokens" + (f" in {thousands(p.max_len)} reserved slots"
                                                            if p.reserve == "max" else ""),
         "result": (f"even a finished request fills {mean_total / p.max_len:.0%} of its reservation on average"
                    if p.reserve == "max" else "the reservation shrinks as the length is better known")},
        {"name": "Paged waste per request", "formula": "slots in the last block not yet filled < block size",
         "substituted": f"mean {ps['mean_waste_per_request_slots']:.1f}, most "
                        f"{ps['max_waste_per_request_slots']:.1f} slots, block size {p.block_size}",
         "result": f"{ps['mean_waste_per_request_slots'] / p.block_size:.2f} blocks per request on average"},
        {"name": "Concurrent requests", "formula": "requests running at once (mean over the run)",
         "substituted": f"reserve {rs['mean_running']:.1f}, paged {ps['mean_running']:.1f}",
         "result": f"paged runs {ps['mean_running'] / max(1e-9, rs['mean_running']):.1f}× as many"},
    ]


def readouts(p: PagingParams, r: dict) -> list[dict]:
    rs, ps = r["reserve"], r["paged"]

    def detail(s):
        return ("of memory holds token states while memory is short" if s["token_state_share_busy"] is not None
                else "of what it allocated held tokens: memory never ran short")
    preempt = (f"{thousands(ps['recomputed_tokens'])} tokens recomputed, {thousands(ps['refound_tokens'])} re-found "
               f"in cached blocks" if p.on_full == "recompute" else
               f"{thousands(ps['swapped_tokens'])} tokens swapped out and in" if p.on_full == "swap" else
               "none: a request is admitted only when all can reach max_len")
    return [
        {"label": f"Reserve ({p.reserve}): tokens", "value": f"{_share(rs):.0%}", "detail": detail(rs)},
        {"label": "Paged: tokens", "value": f"{_share(ps):.0%}",
         "detail": detail(ps) + f"; waste under {ps['max_waste_per_request_slots'] / p.block_size:.2f} block "
                                f"per request"},
        {"label": "Running at once", "value": f"{rs['mean_running']:.1f} vs {ps['mean_running']:.1f}",
         "detail": "mean, reserve vs paged"},
        {"label": "Finished in", "value": f"{thousands(rs['steps'])} vs {thousands(ps['steps'])}",
         "detail": "engine steps, reserve vs paged" + ("" if not (rs["stopped_early"] or ps["stopped_early"])
                                                       else " (stopped early: see the note)")},
        {"label": "Preemptions (paged)", "value": thousands(ps["preemptions"]), "detail": preempt},
    ]
