"""Reserve for the worst case, or page.

Two allocators serve the same stream of requests from KV memories of the same size, one decode
step at a time:

- reserve: each request gets one contiguous chunk when it is admitted, sized for its maximum length
  ("max"), for the next power of two above its real length ("pow2"), or for exactly its real
  length ("oracle"), as the PagedAttention paper's Orca baselines do (Kwon et al., SOSP 2023, sec. 6.1);
- paged: fixed-size blocks, allocated one at a time as a request's tokens fill them, through a
  per-request block table; when no block is free, a running request is preempted (its blocks freed,
  to be recomputed or swapped back in later) or the request waits.

Deterministic for a given seed. Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import random

from ..core.params import ParamError, Params, choice, integer
from ..core.units import thousands

ROW_SLOTS = 512                 # the memory maps wrap every 512 token slots


@dataclasses.dataclass(frozen=True)
class PagingParams(Params):
    requests: int = integer(40, unit="requests", min=1, max=200, help="Requests in the stream")
    prompt_mean: int = integer(161, unit="tokens", min=1, max=4096,
                               help="Mean prompt length (exponential); ShareGPT's is 161 (PagedAttention, Fig. 11)")
    output_mean: int = integer(338, unit="tokens", min=1, max=4096,
                               help="Mean output length (exponential); ShareGPT's is 338")
    max_len: int = integer(2048, unit="tokens", min=16, max=16384, help="Longest a request may be, prompt + output")
    block_size: int = integer(16, unit="tokens", min=1, max=256, help="Tokens per block (paged)")
    memory_slots: int = integer(8192, unit="tokens", min=64, max=131072, help="KV memory, in token slots")
    arrival_gap: int = integer(4, unit="steps", min=0, max=1000, help="Decode steps between arrivals")
    reserve: str = choice("max", ("max", "pow2", "oracle"), help="How much the reserving allocator sets aside")
    on_full: str = choice("recompute", ("recompute", "swap", "wait"),
                          help="Paged, when no block is free: preempt (recompute or swap) or wait")
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
class ReserveAllocator:
    """Contiguous chunks, first fit. A chunk is reserved on admission and freed on completion."""

    def __init__(self, p: PagingParams):
        self.p = p
        self.chunks: dict[int, tuple[int, int]] = {}       # request -> (start, size)

    def admit(self, r: Request, stored: int) -> bool:
        size = reservation(self.p, r)
        start = 0
        for s, n in sorted(self.chunks.values()):
            if s - start >= size:
                break
            start = max(start, s + n)
        if start + size > self.p.memory_slots:
            return False
        self.chunks[r.id] = (start, size)
        return True

    def grow(self, r: Request, stored: int) -> bool:
        return stored <= self.chunks[r.id][1]                   # never runs out: the reservation covers it

    def free(self, rid: int) -> None:
        del self.chunks[rid]

    def reserved(self) -> int:
        return sum(n for _, n in self.chunks.values())


class PagedAllocator:
    """Fixed-size blocks from a free list; a block table per request, filled as tokens arrive."""

    def __init__(self, p: PagingParams):
        self.p = p
        self.free_blocks = list(range(p.memory_slots // p.block_size - 1, -1, -1))   # pop() gives block 0 first
        self.tables: dict[int, list[int]] = {}

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.p.block_size)

    def admit(self, r: Request, stored: int) -> bool:
        # While others run, keep a watermark of free blocks (1%, at least one, as vLLM does) so they can grow.
        need = self.blocks_for(stored)
        watermark = max(1, (self.p.memory_slots // self.p.block_size) // 100) if self.tables else 0
        if need + watermark > len(self.free_blocks):
            return False
        self.tables[r.id] = [self.free_blocks.pop() for _ in range(need)]
        return True

    def grow(self, r: Request, stored: int) -> bool:
        table = self.tables[r.id]
        if self.blocks_for(stored) <= len(table):
            return True
        if not self.free_blocks:
            return False
        table.append(self.free_blocks.pop())
        return True

    def free(self, rid: int) -> None:
        self.free_blocks.extend(reversed(self.tables.pop(rid)))

    def reserved(self) -> int:
        return sum(len(t) for t in self.tables.values()) * self.p.block_size


# ---- the simulation ------------------------------------------------------------------------------------
class Simulation:
    """One allocator serving the whole stream, a decode step per call to step()."""

    def __init__(self, p: PagingParams, kind: str):
        self.p, self.kind = p, kind
        self.alloc = ReserveAllocator(p) if kind == "reserve" else PagedAllocator(p)
        self.reqs = workload(p)
        self.pending = list(self.reqs)                  # not yet arrived
        self.waiting: list[Request] = []                # arrived, not running (new or preempted)
        self.running: list[Request] = []                # in admission order
        self.generated = {r.id: 0 for r in self.reqs}
        self.done: set[int] = set()
        self.swapped_out: set[int] = set()
        self.preemptions = self.recomputed = self.swapped = 0
        self.blocked = False                            # a request could not grow last step
        self.now = -1

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.reqs)

    def stored(self, r: Request) -> int:
        return r.prompt + self.generated[r.id]

    def _preempt(self, victim: Request) -> None:
        self.running.remove(victim)
        self.alloc.free(victim.id)
        self.waiting.insert(0, victim)
        self.preemptions += 1
        if self.p.on_full == "swap":
            self.swapped += self.stored(victim)
            self.swapped_out.add(victim.id)

    def step(self) -> None:
        self.now += 1
        while self.pending and self.pending[0].arrival <= self.now:
            self.waiting.append(self.pending.pop(0))
        # Admit in order (preempted requests went back to the front) while memory allows, but not
        # right after running requests ran out of room: that would only preempt again (thrash).
        while not self.blocked and self.waiting and self.alloc.admit(self.waiting[0], self.stored(self.waiting[0])):
            r = self.waiting.pop(0)
            self.running.append(r)
            if self.generated[r.id]:                    # it had been preempted: bring its cache back
                if r.id in self.swapped_out:
                    self.swapped += self.stored(r)
                    self.swapped_out.discard(r.id)
                else:
                    self.recomputed += self.stored(r)
        # Every running request stores one more token: the one it generates this step.
        progressed, self.blocked = False, False
        for r in list(self.running):
            if r not in self.running:                   # preempted earlier in this step
                continue
            while not self.alloc.grow(r, self.stored(r) + 1):
                self.blocked = True
                if self.p.on_full == "wait":
                    break
                victim = self.running[-1]               # the latest admitted, as vLLM preempts
                self._preempt(victim)
                if victim is r:
                    break
            else:
                progressed = True
                self.generated[r.id] += 1
                if self.generated[r.id] == r.output:
                    self.running.remove(r)
                    self.alloc.free(r.id)
                    self.done.add(r.id)
        if self.running and not progressed:             # everyone waits on a block: free the latest
            self._preempt(self.running[-1])

    def summary(self) -> dict:
        stored = sum(self.stored(r) for r in self.running)
        return {"stored": stored, "running": len(self.running), "waiting": len(self.waiting),
                "done": len(self.done), "preemptions": self.preemptions, "recomputed": self.recomputed,
                "swapped": self.swapped, "in_use": self.alloc.reserved(),
                "waste_per_request": (self.alloc.reserved() - stored) / len(self.running) if self.running else 0.0}

    def layout(self) -> list[tuple]:
        """(request, first slot, slots, tokens stored) for every piece of memory in use."""
        out = []
        if self.kind == "reserve":
            for rid, (start, size) in self.alloc.chunks.items():
                out.append((rid, start, size, self.stored(self.reqs[rid])))
            return out
        for rid, table in self.alloc.tables.items():
            left = self.stored(self.reqs[rid])
            for block in table:
                n = min(left, self.p.block_size)
                out.append((rid, block * self.p.block_size, self.p.block_size, n))
                left -= n
        return out


MAX_STEPS = 50_000


@functools.lru_cache(maxsize=8)
def history(p: PagingParams) -> dict[str, list[dict]]:
    """Each allocator's summary after every step, until every request has finished."""
    out = {}
    for kind in ("reserve", "paged"):
        sim, rows = Simulation(p, kind), []
        while not sim.finished and sim.now < MAX_STEPS:
            sim.step()
            rows.append(sim.summary())
        out[kind] = rows
        _keep_live(p, kind, sim)                    # the last frame is then free to draw
    return out


_live: dict[tuple, Simulation] = {}


def _keep_live(p: PagingParams, kind: str, sim: Simulation) -> None:
    if len(_live) > 16:
        _live.clear()
    _live[(p, kind)] = sim


def state_at(p: PagingParams, kind: str, k: int) -> Simulation:
    """The simulation after step k. Playing forward reuses the last one, so each frame costs one step."""
    sim = _live.get((p, kind))
    if sim is None or sim.now > k:
        sim = Simulation(p, kind)
        _keep_live(p, kind, sim)
    while sim.now < k and not sim.finished:
        sim.step()
    return sim


def busy_average(rows: list[dict], p: PagingParams) -> float:
    """Share of memory holding token states, averaged over the steps when requests were waiting.

    That is when memory is the limit, and the quantity the PagedAttention paper's Fig. 2 reports.
    """
    busy = [r["stored"] / p.memory_slots for r in rows if r["waiting"]]
    return sum(busy) / len(busy) if busy else None


def evaluate(p: PagingParams) -> dict:
    out = {}
    for kind, rows in history(p).items():
        waste = [r["waste_per_request"] for r in rows if r["running"]] or [0.0]   # one-token outputs never wait
        out[kind] = {
            "steps": len(rows),
            "token_state_share_busy": busy_average(rows, p),
            "token_state_share_mean": sum(r["stored"] for r in rows) / len(rows) / p.memory_slots,
            "peak_running": max(r["running"] for r in rows),
            "mean_running": sum(r["running"] for r in rows) / len(rows),
            "preemptions": rows[-1]["preemptions"],
            "recomputed_tokens": rows[-1]["recomputed"],
            "swapped_tokens": rows[-1]["swapped"],
            "mean_waste_per_request_slots": sum(waste) / len(waste),
            "max_waste_per_request_slots": max(waste),
        }
    return {"reserve": out["reserve"], "paged": out["paged"],
            "reserve_token_state_share": out["reserve"]["token_state_share_busy"],
            "paged_token_state_share": out["paged"]["token_state_share_busy"]}


# ---- what the page draws --------------------------------------------------------------------------------
def memory_map(layout: list[tuple], p: PagingParams, kind: str) -> dict:
    """Rectangles of the memory map at one frame, wrapped into rows of ROW_SLOTS slots."""
    cols = {"x0": [], "x1": [], "row": [], "request": [], "kind": [], "color": [], "alpha": []}

    def piece(rid, start, size, what):
        while size > 0:
            row, x = divmod(start, ROW_SLOTS)
            n = min(size, ROW_SLOTS - x)
            cols["x0"].append(x)
            cols["x1"].append(x + n)
            cols["row"].append(row)
            cols["request"].append(rid)
            cols["kind"].append(what)
            cols["color"].append(PALETTE[rid % len(PALETTE)])
            cols["alpha"].append(1.0 if what == "stored" else 0.3)
            start, size = start + n, size - n

    unused = "reserved" if kind == "reserve" else "last-block slack"
    for rid, start, size, stored in layout:
        piece(rid, start, stored, "stored")
        piece(rid, start + stored, size - stored, unused)
    return cols


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
    """The decode step each animation frame shows: every step of a short run, evenly spaced for a long one."""
    n = max(len(rows) for rows in history(p).values())
    stride = max(1, math.ceil(n / FRAMES))
    return list(range(0, n, stride)) + ([n - 1] if (n - 1) % stride else [])


def frame_data(p: PagingParams, frame: int) -> dict:
    """What changes from frame to frame: the two memory maps, the cursor, the block table, the caption."""
    steps = frame_steps(p)
    frame = max(0, min(len(steps) - 1, frame))
    k = steps[frame]
    sims = {kind: state_at(p, kind, k) for kind in ("reserve", "paged")}
    return {
        "sources": {
            "reserve_map": memory_map(sims["reserve"].layout(), p, "reserve"),
            "paged_map": memory_map(sims["paged"].layout(), p, "paged"),
            "cursor": {"step": [k], "top": [1.0], "top_running": [p.requests]},
        },
        "animation": {"mode": "on_demand", "frames": len(steps), "frame": frame, "caption": caption(sims, p, k)},
        "texts": {"block_table": block_table_text(sims["paged"], p)},
    }


def busiest_frame(p: PagingParams) -> int:
    """The frame to open on: when the most requests wait for memory (the maps are full), not the empty end."""
    rows = history(p)["paged"]
    steps = frame_steps(p)
    waiting = [rows[min(k, len(rows) - 1)]["waiting"] + rows[min(k, len(rows) - 1)]["running"] for k in steps]
    return max(range(len(steps)), key=lambda i: (waiting[i], -i))


def page_data(p: PagingParams, frame: int | None = None) -> dict:
    hist = history(p)
    steps = frame_steps(p)
    series = {"step": steps}
    for kind, rows in hist.items():
        rows = [rows[min(i, len(rows) - 1)] for i in steps]
        series[f"{kind}_share"] = [r["stored"] / p.memory_slots for r in rows]
        series[f"{kind}_running"] = [r["running"] for r in rows]
        series[f"{kind}_preemptions"] = [r["preemptions"] for r in rows]
    r = evaluate(p)
    at = frame_data(p, busiest_frame(p) if frame is None else frame)
    return {
        **at,
        "sources": {**at["sources"], "series": series},
        "ranges": {"map_rows": [math.ceil(p.memory_slots / ROW_SLOTS) - 0.5, -0.5]},
        "formula": formula(p, r),
        "readouts": readouts(p, r),
        "notes": [] if r["reserve_token_state_share"] is not None else [
            "Memory never ran out in this run, so no request waited for it: make memory smaller or requests "
            "longer to see the allocators differ."],
    }


def caption(sims: dict, p: PagingParams, k: int) -> str:
    parts = []
    for kind, sim in sims.items():
        s = sim.summary()
        parts.append(f"{kind}: {s['running']} running, {s['waiting']} waiting, {s['done']} done, "
                     f"{s['stored'] / p.memory_slots:.0%} of memory holds tokens")
    return f"Step {k}. " + "; ".join(parts) + "."


def formula(p: PagingParams, r: dict) -> list[dict]:
    mean_total = p.prompt_mean + p.output_mean
    res = {"max": "max_len, whatever the request", "pow2": "next power of two ≥ prompt + output",
           "oracle": "prompt + output (known in advance)"}[p.reserve]
    return [
        {"name": "Share holding token states", "formula": "Σ tokens stored ÷ memory slots, averaged over steps "
                                                          "when requests wait",
         "substituted": f"reserve ({p.reserve}): {r['reserve_token_state_share']:.1%}; paged: "
                        f"{r['paged_token_state_share']:.1%}", "result": f"{r['reserve_token_state_share']:.1%} vs "
                                                                        f"{r['paged_token_state_share']:.1%}"},
        {"name": "Reserved per request", "formula": res,
         "substituted": f"mean request: {thousands(p.prompt_mean)} + {thousands(p.output_mean)} = "
                        f"{thousands(mean_total)} tokens" + (f" in {thousands(p.max_len)} reserved slots"
                                                            if p.reserve == "max" else ""),
         "result": (f"even a finished request fills {mean_total / p.max_len:.0%} of its reservation on average"
                    if p.reserve == "max" else "the reservation shrinks as the length is better known")},
        {"name": "Paged waste per request", "formula": "slots in the last block not yet filled < block size",
         "substituted": f"mean {r['paged']['mean_waste_per_request_slots']:.1f}, most "
                        f"{r['paged']['max_waste_per_request_slots']:.1f} slots, block size {p.block_size}",
         "result": f"{r['paged']['mean_waste_per_request_slots'] / p.block_size:.2f} blocks per request on average"},
        {"name": "Concurrent requests", "formula": "requests running at once (mean over the run)",
         "substituted": f"reserve {r['reserve']['mean_running']:.1f}, paged {r['paged']['mean_running']:.1f}",
         "result": f"paged runs {r['paged']['mean_running'] / max(1e-9, r['reserve']['mean_running']):.1f}× as many"},
    ]


def readouts(p: PagingParams, r: dict) -> list[dict]:
    return [
        {"label": f"Reserve ({p.reserve}): tokens", "value": f"{r['reserve_token_state_share']:.0%}",
         "detail": "of memory holds token states while requests wait"},
        {"label": "Paged: tokens", "value": f"{r['paged_token_state_share']:.0%}",
         "detail": f"waste under {r['paged']['max_waste_per_request_slots'] / p.block_size:.2f} block per request"},
        {"label": "Running at once", "value": f"{r['reserve']['mean_running']:.1f} vs {r['paged']['mean_running']:.1f}",
         "detail": "mean, reserve vs paged"},
        {"label": "Finished in", "value": f"{r['reserve']['steps']} vs {r['paged']['steps']}",
         "detail": "decode steps, reserve vs paged"},
        {"label": "Preemptions (paged)", "value": thousands(r["paged"]["preemptions"]),
         "detail": f"{thousands(r['paged']['recomputed_tokens'])} tokens recomputed, "
                   f"{thousands(r['paged']['swapped_tokens'])} swapped"},
    ]
