"""The hit rate is the workload.

Agent sessions take turns against one GPU's KV memory. Each turn appends tool output and an answer
to a long history, then the agent pauses (a tool call, thinking) before its next turn. While the
sessions' histories fit, a turn computes only its new tokens; once they do not, a returning session
finds its history evicted and pays for all of it again, by recomputing it or, with an offload tier,
by loading it back. Deterministic for a seed. Standard library only: this module runs in the browser.

An uploaded Mooncake-format trace (core/traces.py) replaces the synthetic sessions: its requests are
replayed in arrival order against the same GPU's KV memory, block by block (core/trace_replay.py).
"""
from __future__ import annotations

import dataclasses
import functools
import heapq
import random

from ..core import trace_replay, traces

from ..cache_renting.model import CacheRentingParams, evaluate as cache_renting
from ..core.dtypes import DTYPE_BITS, dtype_bytes
from ..core.gpus import GPUS
from ..core.models import MODELS
from ..core.limits import check_weights_fit
from ..core.params import ParamError, Params, choice, integer, number
from ..core.summaries import listing, pct, sig, summaries
from ..core.timing import prefill_formula, prefill_seconds
from ..core.units import bytes_si, thousands

POLICIES = ("lru", "lfu", "return-aware")
OFFLOAD = {"none": 0.0, "host-dram": 50.0, "ssd": 7.0}       # GB/s: PCIe 5 x16 in practice; one NVMe Gen4 drive
RESERVE_GB = CacheRentingParams.__dataclass_fields__["reserve_gb_per_gpu"].default   # its workspace per GPU
CLIFF_SESSIONS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32]


@dataclasses.dataclass(frozen=True)
class AgentParams(Params):
    sessions: int = integer(8, unit="sessions", min=1, max=64, help="Agent sessions sharing the GPU")
    turns: int = integer(10, unit="turns", min=1, max=100, help="Turns each session takes")
    initial_tokens: int = integer(52_000, unit="tokens", min=1, max=1_000_000,
                                  help="First turn's prompt (system prompt, tools, task)")
    growth_tokens: int = integer(8_000, unit="tokens", min=1, max=200_000,
                                 help="Tokens each turn adds to the history (tool output and answer)")
    output_tokens: int = integer(413, unit="tokens", min=1, max=100_000, help="Tokens generated per turn")
    pause_mean_s: float = number(30.0, unit="s", min=0.1, max=36_000, help="Mean pause between turns (exponential)")
    model: str = choice("llama-3-8b", MODELS, help="Model preset")
    gpu: str = choice("h100-sxm", GPUS, help="GPU preset")
    kv_dtype: str = choice("bf16", tuple(DTYPE_BITS), parse=dtype_bytes, unit="dtype or bits", help="KV precision")
    mfu: float = number(0.5, unit="share", min=0.01, max=1.0, help="Share of peak FLOP/s prefill reaches")
    policy: str = choice("lru", POLICIES, help="Which session's history is evicted first")
    offload: str = choice("none", tuple(OFFLOAD), help="Where evicted history goes (none: dropped)")
    seed: int = integer(0, unit="seed", min=0, max=10_000, help="Seed for the pauses")
    # An uploaded trace: data, not a parameter (no control, not in the URL). Empty: the synthetic sessions.
    trace: str = dataclasses.field(default="", repr=False, metadata={})

    def __post_init__(self):
        super().__post_init__()
        m = MODELS[self.model]
        # One GPU holds the weights (bf16) and the cache-renting page's workspace; the last turn must fit the model.
        check_weights_fit("model", m, GPUS[self.gpu], 1, 2, "bf16", reserve_bytes_per_gpu=RESERVE_GB * 1e9)
        if self.trace:
            traces.parse_trace(self.trace)            # a bad line is refused here, naming its line and field
            if self.policy == "return-aware":
                raise ParamError("policy", "policy return-aware needs to know when each session returns, which "
                                           "only the synthetic sessions say, so with a trace choose lru or lfu; "
                                           "got return-aware.")
            return                                    # the synthetic sessions' controls do not apply to a trace
        last = self.initial_tokens + (self.turns - 1) * self.growth_tokens + self.output_tokens
        if last > m.max_context:
            room = m.max_context - self.output_tokens                  # prompt tokens the last turn may hold
            if room < 1:
                field, value, limit = "output_tokens", self.output_tokens, m.max_context - 1
            elif self.initial_tokens > room:
                field, value, limit = "initial_tokens", self.initial_tokens, room
            else:
                field, value, limit = "turns", self.turns, (room - self.initial_tokens) // self.growth_tokens + 1
            raise ParamError(field, f"{field} must be at most {limit:,} so that the last turn (initial + (turns − 1) "
                                    f"× growth + output = {last:,} tokens) stays within {m.title}'s "
                                    f"{m.max_context:,}-token context; got {value:,}.")


def capacity_tokens(p: AgentParams) -> int:
    """Tokens of KV one GPU holds after the weights and workspace: the cache-renting page's arithmetic."""
    return cache_renting(CacheRentingParams(model=p.model, gpu=p.gpu, gpu_count=1, kv_dtype=p.kv_dtype))["token_capacity"]


def prefill_s(p: AgentParams, new_tokens: float, cached_tokens: float = 0) -> float:
    """Seconds to prefill new tokens that attend to cached ones: the shared time model (core/timing.py),
    linear FLOPs plus causal attention, at this page's MFU. Attention makes a token late in a long
    history cost more than one early on, so there is no single tokens-per-second rate."""
    return prefill_seconds(MODELS[p.model], GPUS[p.gpu], new_tokens, cached_tokens, mfu=p.mfu)


def bytes_per_token(p: AgentParams) -> float:
    return MODELS[p.model].kv_bytes_per_token(dtype_bytes(p.kv_dtype))


@dataclasses.dataclass(frozen=True)
class Turn:
    session: int
    turn: int
    start: float
    prompt: int
    cached: int          # history tokens found in GPU memory
    reloaded: int        # history tokens loaded back from the offload tier
    recomputed: int      # history tokens prefilled again
    new_seconds: float   # prefill of the turn's new tokens, attending to the whole history before them
    reload_seconds: float
    recompute_seconds: float  # prefill of the evicted history, attending to what was found or reloaded

    @property
    def seconds(self) -> float:
        """Time to first token: new tokens, plus reload or recompute."""
        return self.new_seconds + self.reload_seconds + self.recompute_seconds

    @property
    def history(self) -> int:
        """Prompt tokens computed before: the session's history (a trace: blocks any earlier request computed)."""
        return self.cached + self.reloaded + self.recomputed

    @property
    def kind(self) -> str:
        if self.history == 0:                         # a first turn (synthetic turn 0 has no history, later ones do)
            return "first turn"
        return "recompute" if self.recomputed else "reload" if self.reloaded else "hit"


@functools.lru_cache(maxsize=32)
def simulate(p: AgentParams) -> tuple[Turn, ...]:
    """Every turn of every session, in time order (events ordered by time, then a counter)."""
    n = p.sessions
    rng = random.Random(p.seed)
    cap, bpt = capacity_tokens(p), bytes_per_token(p)
    bw = OFFLOAD[p.offload] * 1e9
    resident: dict[int, int] = {}        # session -> tokens of its history in GPU memory
    offloaded: dict[int, int] = {}
    last_use: dict[int, float] = {}
    uses: dict[int, int] = {}
    next_start: dict[int, float] = {}
    queue, counter, out = [], 0, []
    for s in range(n):
        heapq.heappush(queue, (rng.expovariate(1 / p.pause_mean_s), counter, s, 0))
        counter += 1
    while queue:
        t, _, s, k = heapq.heappop(queue)
        prompt = p.initial_tokens + k * p.growth_tokens
        history = prompt - (p.initial_tokens if k == 0 else p.growth_tokens)
        cached = min(resident.pop(s, 0), history)
        reloaded = min(offloaded.pop(s, 0), history - cached) if bw else 0
        recomputed = history - cached - reloaded
        # The history is a prefix: found, then reloaded, then recomputed; the new tokens come after all of it.
        recompute_s = prefill_s(p, recomputed, cached + reloaded) if recomputed else 0.0
        new_s = prefill_s(p, prompt - history, history)
        turn = Turn(s, k, t, prompt, cached, reloaded, recomputed, new_s, reloaded * bpt / (bw or 1), recompute_s)
        seconds = turn.seconds
        out.append(turn)
        keep = min(prompt + p.output_tokens, cap)   # what this session now holds on the GPU
        pause = rng.expovariate(1 / p.pause_mean_s)
        if k + 1 < p.turns:
            heapq.heappush(queue, (t + seconds + pause, counter, s, k + 1))
            counter += 1
            next_start[s] = t + seconds + pause
        else:
            next_start[s] = float("inf")
            keep = 0                                 # a finished session's history is no longer needed
        last_use[s], uses[s] = t, uses.get(s, 0) + 1
        while resident and sum(resident.values()) + keep > cap:
            victim = min(resident, key=_policy_key(p.policy, last_use, uses, next_start))
            if bw:
                offloaded[victim] = resident[victim]
            del resident[victim]
        if keep:
            resident[s] = keep
    return tuple(out)


def _policy_key(policy, last_use, uses, next_start):
    if policy == "lru":
        return lambda s: (last_use[s], s)
    if policy == "lfu":
        return lambda s: (uses[s], last_use[s], s)
    return lambda s: (-next_start[s], s)             # evict whoever comes back last


def summary(turns: tuple[Turn, ...]) -> dict:
    """Totals over the run. The hit rate counts returning turns only, those with a history to find (every
    synthetic turn after the first); with none, there is no hit rate (None), not a 100% that nothing measured."""
    history = sum(t.history for t in turns)
    returning = sum(t.history > 0 for t in turns)
    return {
        "turns": len(turns),
        "returning_turns": returning,
        "hit_rate": sum(t.cached for t in turns) / history if history else None,
        "reloaded_tokens": sum(t.reloaded for t in turns),
        "recomputed_tokens": sum(t.recomputed for t in turns),
        "mean_turn_seconds": sum(t.seconds for t in turns) / len(turns),
        "max_turn_seconds": max(t.seconds for t in turns),
        "recompute_seconds": sum(t.recompute_seconds for t in turns),
        "reload_seconds": sum(t.reload_seconds for t in turns),
        "new_token_seconds": sum(t.new_seconds for t in turns),
    }


# ---- an uploaded trace in place of the synthetic sessions ------------------------------------------------
def trace_requests(text: str) -> tuple:
    """The trace's requests in arrival order, each with a session inferred from its hash ids (the
    load-balancer's rule: a request continues the session whose latest prompt's last full block it holds)."""
    return traces.requests_with_sessions(text)


@functools.lru_cache(maxsize=4)
def served(text: str, blocks: int, policy: str, offload: bool) -> tuple:
    """The replay by what it depends on alone: a change of model, MFU or tier speed reprices it, not reruns it."""
    return trace_replay.replay(trace_requests(text), blocks, policy, offload)


@functools.lru_cache(maxsize=4)
def replay_trace(p: AgentParams) -> tuple[Turn, ...]:
    """Every request of the uploaded trace, replayed in arrival order against one GPU's KV memory held as
    512-token blocks: found, reloaded from the offload tier, recomputed (computed before, since evicted),
    or new. Times from the shared time model; turns do not queue, as in the synthetic run."""
    reqs = trace_requests(p.trace)
    bw, bpt = OFFLOAD[p.offload] * 1e9, bytes_per_token(p)
    out = []
    for q, s in zip(reqs, served(p.trace, capacity_tokens(p) // traces.BLOCK_SIZE, p.policy, bool(bw))):
        out.append(Turn(q.session, q.turn, q.arrival, q.input_length, s.cached, s.reloaded, s.recomputed,
                        prefill_s(p, s.new, s.history) if s.new else 0.0, s.reloaded * bpt / (bw or 1),
                        prefill_s(p, s.recomputed, s.cached + s.reloaded) if s.recomputed else 0.0))
    return tuple(out)


def evaluate_trace(p: AgentParams) -> dict:
    turns, reqs = replay_trace(p), trace_requests(p.trace)
    found, total = traces.unlimited_cache_hits(traces.parse_trace(p.trace))
    cap = capacity_tokens(p) // traces.BLOCK_SIZE * traces.BLOCK_SIZE
    return {
        "trace": "uploaded",
        **summary(turns),
        "requests": len(turns),
        "sessions": len({q.session for q in reqs}),
        "capacity_tokens": capacity_tokens(p),
        "capacity_blocks": capacity_tokens(p) // traces.BLOCK_SIZE,
        "prompt_tokens": total,
        "cached_tokens": sum(t.cached for t in turns),
        "history_tokens": sum(t.history for t in turns),      # equals `found`: what an unlimited cache finds
        "prompt_hit_rate": sum(t.cached for t in turns) / total,
        "unlimited_cache_hit_rate": found / total,
        "requests_over_capacity": sum(q.input_length > cap for q in reqs),
        "requests_over_context": sum(q.input_length > MODELS[p.model].max_context for q in reqs),
    }


@functools.lru_cache(maxsize=8)
def evaluate(p: AgentParams) -> dict:
    if p.trace:
        return evaluate_trace(p)
    turns = simulate(p)
    s = summary(turns)
    last_history = p.initial_tokens + (p.turns - 2) * p.growth_tokens      # before the last turn's new tokens
    return {
        "trace": "synthetic",
        **s,
        "capacity_tokens": capacity_tokens(p),
        # The last turn is the dearest: its new tokens attend to the longest history.
        "hit_turn_seconds": prefill_s(p, p.growth_tokens, last_history) if p.turns > 1 else None,
        "miss_turn_seconds": prefill_s(p, p.initial_tokens + (p.turns - 1) * p.growth_tokens),
        "sessions_that_fit": capacity_tokens(p) // (p.initial_tokens + (p.turns - 1) * p.growth_tokens
                                                    + p.output_tokens),
    }


def page_data(p: AgentParams) -> dict:
    if p.trace:
        return page_data_trace(p)
    r = evaluate(p)
    turns = simulate(p)
    # With one turn per session nobody returns, so no session count has a hit rate: the cliff stays empty.
    # Each point is the run with that session count (and every other setting as it is): cached under those
    # parameters, so changing the session count reruns one run, not thirteen.
    cliff = [summary(simulate(dataclasses.replace(p, sessions=n)))["hit_rate"] for n in CLIFF_SESSIONS] \
        if p.turns > 1 else []
    frames, captions = _frames(turns)
    sources = {
        **_turn_sources(turns, frames, r),
        "cliff": {"sessions": CLIFF_SESSIONS if cliff else [], "hit_rate": cliff},
        "here": {"sessions": [p.sessions] if cliff else [], "hit_rate": [r["hit_rate"]] if cliff else []},
    }
    return {
        "animation": {"source": "turns", "frames": len(captions), "captions": captions},
        "sources": sources,
        "ranges": {"turns_x": [0, 1.03 * max(t.start + t.seconds for t in turns)]},  # fixed while animating
        "formula": formula(p, r),
        "readouts": readouts(p, r),
        "notes": [] if r["hit_rate"] is not None else [
            "With one turn per session no session comes back, so there is no history to find and no hit rate: "
            "give the sessions two turns or more."],
        "texts": {**plot_summaries(sources),
                  "trace": f"Workload: the synthetic sessions ({p.sessions} sessions × {p.turns} turns). Upload a "
                           f"Mooncake-format trace above to replay its requests instead."},
    }


def plot_summaries(sources: dict) -> dict:
    """Each plot in words, from the columns it draws (the turns as they stand at the last frame)."""
    t = sources["turns"]
    counts = {k: t["kind"].count(k) for k in ("first turn", "hit", "reload", "recompute")}
    names = {"first turn": "first turns", "hit": "hits (history still cached)", "reload": "reloads",
             "recompute": "recomputes"}
    end = max((a + b for a, b in zip(t["start"], t["seconds"])), default=0.0)
    turns = (f"Of {thousands(len(t['kind']))} turns over {sig(end)} s, "
             + listing([f"{thousands(n)} {names[k]}" for k, n in counts.items() if n])
             + f"; time to first token ranges from {sig(min(t['seconds'], default=0))} s to "
               f"{sig(max(t['seconds'], default=0))} s.")
    c, here = sources["cliff"], sources["here"]
    if c["sessions"]:
        cliff = (f"The hit rate is {pct(c['hit_rate'][0])} with {c['sessions'][0]} session and "
                 f"{pct(c['hit_rate'][-1])} with {c['sessions'][-1]}; at your {here['sessions'][0]} sessions it is "
                 f"{pct(here['hit_rate'][0])}.")
    else:
        cliff = ("The cliff is empty: it is drawn only for synthetic sessions of two turns or more, "
                 "where sessions come back to their history.")
    sp = dict(zip(sources["split"]["what"], sources["split"]["seconds"]))
    split = (f"Over the run the GPU spends {sig(sp['recompute'])} s recomputing evicted history, "
             f"{sig(sp['reload'])} s reloading it from the offload tier and {sig(sp['new tokens'])} s on new tokens.")
    return summaries(turns=turns, cliff=cliff, split=split)


def _turn_sources(turns, frames, r: dict) -> dict:
    """The turns' dots and the time split: the same columns whether the turns are synthetic or a trace's."""
    return {
        "turns": {"start": [t.start for t in turns], "seconds": [t.seconds for t in turns],
                  "session": [str(t.session) for t in turns], "kind": [t.kind for t in turns],
                  "prompt": [t.prompt for t in turns], "frame": frames},
        "split": {"what": ["recompute", "reload", "new tokens"],
                  "seconds": [r["recompute_seconds"], r["reload_seconds"], r["new_token_seconds"]]},
    }


TRACE_NOTE = ("A Mooncake trace gives each request's arrival, prompt and answer lengths and the hash ids of its "
              "prompt's 512-token blocks, chained so that an equal id means an equal prefix. It does not say which "
              "requests belong to one session, how long a tool call paused, or what a request would have done on "
              "another GPU, so the replay keeps the trace's own arrival times, finds reuse only as shared prefixes "
              "of hash ids (across sessions too: a shared system prompt counts), and groups requests into sessions "
              "by prefix chains only to label them. It caches whole blocks: a block is kept or evicted, never part "
              "of one; a prompt is cached when it arrives, and its answer only as blocks of a later prompt (a trace "
              "names no answer blocks); and the return-aware policy, which needs each session's next return, is not offered.")


def page_data_trace(p: AgentParams) -> dict:
    """The uploaded trace's requests in place of the synthetic sessions; the cliff (a session count) does not
    apply, so it stays empty."""
    r, turns = evaluate(p), replay_trace(p)
    frames, captions = _frames(turns)
    notes = [TRACE_NOTE]
    if r["requests_over_capacity"]:
        notes.append(f"{r['requests_over_capacity']:,} of the trace's requests have prompts longer than the GPU's "
                     f"{thousands(r['capacity_tokens'])} tokens of KV memory: only their first blocks are cached.")
    if r["requests_over_context"]:
        notes.append(f"{r['requests_over_context']:,} of the trace's prompts are longer than {MODELS[p.model].title}'s "
                     f"{MODELS[p.model].max_context:,}-token context; they are replayed anyway, priced by the same "
                     f"time model.")
    sources = {
        **_turn_sources(turns, frames, r),
        "cliff": {"sessions": [], "hit_rate": []},
        "here": {"sessions": [], "hit_rate": []},
    }
    return {
        "animation": {"source": "turns", "frames": len(captions), "captions": captions},
        "sources": sources,
        "ranges": {"turns_x": [0, 1.03 * max(t.start + t.seconds for t in turns)]},
        "formula": formula_trace(p, r),
        "readouts": readouts_trace(p, r),
        "notes": notes,
        "texts": {**plot_summaries(sources),
                  "trace": f"Workload: your trace, {r['requests']:,} requests ({thousands(r['prompt_tokens'])} "
                           f"prompt tokens over {turns[-1].start - turns[0].start:,.1f} s, {r['sessions']:,} "
                           f"sessions inferred from prefix chains). The sessions, turns, initial, growth, output, "
                           f"pause and seed controls do not apply to it, the cliff is drawn only for the synthetic "
                           f"sessions, and a link reproduces only the synthetic workload."},
    }


def formula_trace(p: AgentParams, r: dict) -> list[dict]:
    bpt, bw, b = bytes_per_token(p), OFFLOAD[p.offload], traces.BLOCK_SIZE
    rate = lambda x: "none: no request finds history" if x is None else f"{x:.1%}"
    cached, history = r["cached_tokens"], r["history_tokens"]
    return [
        {"name": "KV memory", "formula": "(GPU memory − weights − workspace) ÷ KV bytes per token  (cache-renting)",
         "substituted": f"{bytes_si(r['capacity_tokens'] * bpt)} ÷ {thousands(bpt)} B",
         "result": f"{thousands(r['capacity_tokens'])} tokens"},
        {"name": "Blocks of KV memory", "formula": f"⌊KV tokens ÷ {b} tokens per hash id⌋",
         "substituted": f"⌊{thousands(r['capacity_tokens'])} ÷ {b}⌋",
         "result": f"{thousands(r['capacity_blocks'])} blocks, evicted by {p.policy}"
                   + (f", to {p.offload} at {bw:g} GB/s" if bw else ", dropped")},
        {"name": "Hit rate", "formula": "history tokens found in GPU memory ÷ history tokens (prompt blocks some "
                                        "earlier request computed), tokens = blocks × 512, capped at the prompt",
         "substituted": f"{thousands(cached)} ÷ {thousands(history)} over {r['returning_turns']:,} requests "
                        f"with history, of {r['requests']:,}",
         "result": rate(r["hit_rate"])},
        {"name": "Prompt tokens found", "formula": "tokens found in GPU memory ÷ all prompt tokens",
         "substituted": f"{thousands(cached)} ÷ {thousands(r['prompt_tokens'])}",
         "result": f"{r['prompt_hit_rate']:.1%}"},
        {"name": "Reference: an unlimited cache", "formula": "history tokens ÷ all prompt tokens: every prefix "
                                                             "seen before is found (core.traces.unlimited_cache_hits)",
         "substituted": f"{thousands(history)} ÷ {thousands(r['prompt_tokens'])}",
         "result": f"{r['unlimited_cache_hit_rate']:.1%}"},
        {"name": "Where the history came from", "formula": "found + reloaded + recomputed = history",
         "substituted": f"{thousands(cached)} + {thousands(r['reloaded_tokens'])} + "
                        f"{thousands(r['recomputed_tokens'])}",
         "result": f"{thousands(history)} tokens"},
        {"name": "Request time", "formula": "prefill(new after history) + prefill(recomputed after found and "
                                            "reloaded) + reloaded × KV bytes per token ÷ offload bandwidth",
         "substituted": f"{r['new_token_seconds']:,.1f} s + {r['recompute_seconds']:,.1f} s + "
                        f"{r['reload_seconds']:,.1f} s over {r['requests']:,} requests",
         "result": f"mean {r['mean_turn_seconds']:.2f} s, worst {r['max_turn_seconds']:.2f} s"},
    ]


def readouts_trace(p: AgentParams, r: dict) -> list[dict]:
    return [
        {"label": "Hit rate", "value": "none" if r["hit_rate"] is None else f"{r['hit_rate']:.0%}",
         "detail": "of history found in GPU memory"},
        {"label": "Workload", "value": f"your trace: {r['requests']:,} requests",
         "detail": f"an unlimited cache would find {r['unlimited_cache_hit_rate']:.0%} of prompt tokens; "
                   f"this GPU finds {r['prompt_hit_rate']:.0%}"},
        {"label": "Mean request", "value": f"{r['mean_turn_seconds']:.2f} s", "detail": f"the worst "
                                                                                        f"{r['max_turn_seconds']:.2f} s"},
        {"label": "Recompute vs reload", "value": f"{r['recompute_seconds']:.0f} s / {r['reload_seconds']:.0f} s",
         "detail": f"{thousands(r['recomputed_tokens'])} tokens recomputed, {thousands(r['reloaded_tokens'])} "
                   f"reloaded"},
    ]


MAX_FRAMES = 120


def _frames(turns: tuple[Turn, ...]) -> tuple[list[int], list[str]]:
    """The turns appear in time order, a few per frame; each caption says what the latest turns cost."""
    per = max(1, -(-len(turns) // MAX_FRAMES))
    frames = [i // per for i in range(len(turns))]
    captions, kinds = [], [t.kind for t in turns]
    hits = misses = 0
    for f in range(frames[-1] + 1 if turns else 0):
        done = kinds[f * per:(f + 1) * per]            # the counts so far grow frame by frame: not a re-count
        hits += done.count("hit")
        misses += done.count("reload") + done.count("recompute")
        last = turns[min(len(turns), (f + 1) * per) - 1]
        captions.append(f"t = {last.start:,.0f} s: session {last.session}, turn {last.turn + 1}, "
                        f"{thousands(last.prompt)} tokens, {last.kind}: {last.seconds:.2f} s to first token. "
                        f"So far {hits} hits and {misses} misses.")
    return frames, captions


def formula(p: AgentParams, r: dict) -> list[dict]:
    m, g = MODELS[p.model], GPUS[p.gpu]
    bpt = bytes_per_token(p)
    longest = p.initial_tokens + (p.turns - 1) * p.growth_tokens + p.output_tokens
    bw = OFFLOAD[p.offload]
    rows = [
        {"name": "KV memory", "formula": "(GPU memory − weights − workspace) ÷ KV bytes per token  (cache-renting)",
         "substituted": f"{bytes_si(r['capacity_tokens'] * bpt)} ÷ {thousands(bpt)} B",
         "result": f"{thousands(r['capacity_tokens'])} tokens"},
        {"name": "Sessions at full length", "formula": "KV tokens ÷ (initial + (turns − 1) × growth + output)",
         "substituted": f"{thousands(r['capacity_tokens'])} ÷ {thousands(longest)}",
         "result": f"room for {r['sessions_that_fit']:,}; {p.sessions} run"},
    ]
    if p.turns > 1:
        last_history = longest - p.output_tokens - p.growth_tokens
        rows.append({**prefill_formula(m, g, p.growth_tokens, last_history, mfu=p.mfu),
                     "name": "A last turn that hits: its new tokens over the whole history"})
    miss = prefill_formula(m, g, longest - p.output_tokens, 0, mfu=p.mfu)
    rows.append({**miss, "name": "A last turn that misses: the whole prompt again",
                 "substituted": miss["substituted"] + (f"; or reload the history at {bw:g} GB/s" if bw else "")})
    rows.append({"name": "Hit rate", "formula": "history tokens found in GPU memory ÷ history tokens needed, "
                                                "over returning turns",
                 "substituted": f"over {r['returning_turns']} returning turns of {r['turns']}",
                 "result": "none: no session returns" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"})
    return rows


def readouts(p: AgentParams, r: dict) -> list[dict]:
    hit = r["hit_turn_seconds"]
    return [
        {"label": "Hit rate", "value": "none" if r["hit_rate"] is None else f"{r['hit_rate']:.0%}",
         "detail": "no session returns: one turn each" if r["hit_rate"] is None
         else "of returning turns' history found in GPU memory"},
        # Never "7 of 1": at most every session fits; the room left is in the formula row.
        {"label": "Sessions that fit", "value": f"{min(r['sessions_that_fit'], p.sessions)} of {p.sessions}",
         "detail": f"at full length, in {thousands(r['capacity_tokens'])} tokens of KV"},
        {"label": "Mean turn", "value": f"{r['mean_turn_seconds']:.2f} s",
         "detail": (f"a last turn that hits costs {hit:.2f} s; " if hit is not None else "")
         + f"the worst turn {r['max_turn_seconds']:.2f} s"},
        {"label": "Recompute vs reload", "value": f"{r['recompute_seconds']:.0f} s / {r['reload_seconds']:.0f} s",
         "detail": "of GPU time over the run"},
    ]
