"""Mooncake-format request traces: read them line by line, check every line, and measure what they reuse.

One request per line (the FAST'25 release, `FAST25-release/README.md` in kvcache-ai/Mooncake): `timestamp`
(ms), `input_length` and `output_length` (tokens) and `hash_ids`, one id per block of the prompt (512 tokens
in the released traces), chained so that an equal id means an equal prefix. An optional `session_id` is kept.

The limits are set by the work a replay does, which grows with the hash ids, not by the file's bytes: at most
MAX_REQUESTS requests, MAX_BYTES bytes and MAX_BLOCKS hash ids in CPython (the CLI and the API), and smaller
ones in the browser (Pyodide), where a replay must finish in about half a minute. Standard library only: this
module runs in the browser.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import io
import itertools
import json
import math
import sys
import typing
from typing import Callable, Iterable

from .params import ParamError

BLOCK_SIZE = 512                   # tokens per hash id in Mooncake's released traces


@dataclasses.dataclass(frozen=True)
class Limits:
    requests: int
    bytes: int
    blocks: int                    # hash ids over the whole trace: what a replay's time grows with
    where: str


# CPython: the CLI and the API. 100,000 requests of the conversation trace's average 24 blocks are 2.4M ids.
CPYTHON = Limits(requests=100_000, bytes=50_000_000, blocks=5_000_000, where="")
# Pyodide: measured in headless Chromium (see BROWSER_NOTE); a replay of this much takes about 30 s there.
BROWSER = Limits(requests=40_000, bytes=10_000_000, blocks=800_000, where=" in the browser (use `kvx run` for more)")
BROWSER_NOTE = ("in the browser at most 40,000 requests, 10 MB and 800,000 hash ids, about 30 s of replay; "
                "`kvx run --trace` and the API take up to 100,000 requests, 50 MB and 5,000,000 hash ids")


def limits() -> Limits:
    """The browser's limits when running in Pyodide (sys.platform is "emscripten" there), else CPython's."""
    return BROWSER if sys.platform == "emscripten" else CPYTHON


# ---- progress: the browser's worker sets this to post "replaying: 40%" to the page ----------------------
progress: Callable[[float, str], None] | None = None


def report(share: float, text: str) -> None:
    if progress is not None:
        progress(share, text)


# ---- parsing ---------------------------------------------------------------------------------------------
def _field_error(line: int, message: str) -> ParamError:
    return ParamError("trace", f"The trace's line {line:,}: {message}")


def _whole(value, line: int, field: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value) or value < low:
        raise _field_error(line, f"{field} must be a whole number ≥ {low}; got {json.dumps(value)}.")
    return int(value)


def _ids(ids, line: int) -> tuple:
    if not isinstance(ids, list) or not ids:
        raise _field_error(line, f"hash_ids must be a non-empty list of block ids; got {json.dumps(ids)[:60]}.")
    if all(type(x) is int for x in ids) and min(ids) >= 0:      # the usual case, at C speed
        return tuple(ids)
    return tuple(_whole(x, line, "hash_ids", 0) for x in ids)


def _row(raw: str, line: int, block_size: int) -> dict:
    try:
        row = json.loads(raw)
    except ValueError as err:
        raise _field_error(line, f"is not JSON ({err.msg}).") from None
    if not isinstance(row, dict):
        raise _field_error(line, "must be a JSON object with timestamp, input_length, output_length and hash_ids.")
    for field in ("timestamp", "input_length", "output_length", "hash_ids"):
        if field not in row:
            raise _field_error(line, f"{field} is missing.")
    ts = row["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise _field_error(line, f"timestamp must be a number of milliseconds ≥ 0; got {json.dumps(ts)}.")
    n_in = _whole(row["input_length"], line, "input_length", 1)
    n_out = _whole(row["output_length"], line, "output_length", 0)
    ids = _ids(row["hash_ids"], line)
    lo, hi = n_in // block_size, -(-n_in // block_size)
    if not lo <= len(ids) <= hi:
        raise _field_error(line, f"hash_ids has {len(ids):,} blocks, but input_length {n_in:,} at "
                                 f"{block_size:,} tokens per block needs {hi:,}"
                                 + (f" (or {lo:,})" if lo != hi and lo else "")
                                 + "; set block_size to the trace's block size.")
    session = row.get("session_id")
    if session is not None and (isinstance(session, bool) or not isinstance(session, (int, str))):
        raise _field_error(line, f"session_id must be a string or a whole number; got {json.dumps(session)}.")
    return {"timestamp": float(ts), "input_length": n_in, "output_length": n_out, "hash_ids": ids,
            "session_id": session, "line": line}


def read_trace(lines: Iterable[str], block_size: int = BLOCK_SIZE, limit: Limits | None = None) -> tuple[dict, ...]:
    """Parse a trace one line at a time (a file object or any iterable of lines) and check each line.

    A bad line raises ParamError naming its line and field; a trace over a limit is refused at the first
    line past it, with one sentence naming the limit."""
    limit = limit or limits()
    out, size, blocks = [], 0, 0
    for number, raw in enumerate(lines, start=1):
        size += len(raw) if raw.isascii() else len(raw.encode("utf-8"))
        if size > limit.bytes:
            raise ParamError("trace", f"A trace may hold at most {limit.bytes:,} bytes{limit.where}; this one "
                                      f"passes that at line {number:,}.")
        if not raw.strip():
            continue
        if len(out) == limit.requests:
            raise ParamError("trace", f"A trace may hold at most {limit.requests:,} requests{limit.where}; line "
                                      f"{number:,} is one more (keep its first lines: head -n {limit.requests}).")
        row = _row(raw, number, block_size)
        blocks += len(row["hash_ids"])
        if blocks > limit.blocks:
            raise ParamError("trace", f"A trace may hold at most {limit.blocks:,} hash ids in all{limit.where} "
                                      f"(the replay's work grows with them); line {number:,} passes that, so "
                                      f"keep its first {len(out):,} lines.")
        out.append(row)
        if len(out) % 20_000 == 0:
            report(0.0, f"read {len(out):,} requests")
    if not out:
        raise ParamError("trace", "The trace holds no requests: give one JSON object per line.")
    return tuple(out)


@functools.lru_cache(maxsize=2)      # a trace can be 50 MB: keep few
def parse_trace(text: str, block_size: int = BLOCK_SIZE) -> tuple[dict, ...]:
    """read_trace over a string, streamed (no list of its lines is made); cached by the text."""
    return read_trace(io.StringIO(text), block_size)


def to_jsonl(records: Iterable[dict]) -> str:
    return "".join(json.dumps(r, separators=(", ", ": ")) + "\n" for r in records)


# ---- requests and their sessions (the load balancer's sticky router needs sessions; the released traces have none)
SHARED = -1                        # the owner of a block that more than one session uses


class Request(typing.NamedTuple):
    """One request of a trace (a named tuple: a replay makes one per line, and a frozen dataclass's __init__
    sets each field through object.__setattr__, several times slower)."""
    index: int            # arrival order
    arrival: float        # s
    input_length: int     # prompt tokens
    output_length: int    # not simulated: decode is left out
    blocks: tuple         # the prompt's hash ids, one per block
    session: int
    turn: int             # 0-based, within its session



def with_sessions(records, block_size: int = BLOCK_SIZE) -> tuple[tuple[Request, ...], dict, bool]:
    """(requests, owners, sessions_given): requests in arrival order (stable for equal timestamps), each block's
    owner (its session, or SHARED), and whether sessions came from the trace. Sessions from session_id if every
    line has one, else inferred: a request continues the session of the latest earlier prompt whose
    last full block it contains, unless that block is a branch point of the trace (followed by
    different blocks in different prompts, as a shared system prompt is)."""
    rows = sorted(records, key=lambda r: r["timestamp"])
    given = all(r.get("session_id") is not None for r in rows)
    following = collections.defaultdict(set)      # block -> the full blocks that follow it anywhere
    for r in () if given else rows:               # only inferring sessions asks where the trace branches
        ids = r["hash_ids"][: r["input_length"] // block_size]
        for a, b in zip(ids, ids[1:]):
            following[a].add(b)
    numbered = given and all(isinstance(r["session_id"], int) and 0 <= r["session_id"] < 1_000_000 for r in rows)
    names, ends, turns, out = {}, {}, collections.Counter(), []
    for i, r in enumerate(rows):
        ids = tuple(r["hash_ids"])
        if numbered:                     # whole-number session ids are kept, so session 0 stays session 0
            session = r["session_id"]
        elif given:
            session = names.setdefault(r["session_id"], len(names))
        else:
            session = next((ends[b] for b in reversed(ids) if b in ends), None)
            if session is None:
                session = len(names)
                names[("inferred", i)] = session
            full = min(len(ids), r["input_length"] // block_size)
            if full and len(following[ids[full - 1]]) <= 1:
                ends[ids[full - 1]] = session
        out.append(Request(i, r["timestamp"] / 1000, r["input_length"], r["output_length"], ids, session,
                           turns[session]))
        turns[session] += 1
    return tuple(out), block_owners(out), given


def block_owners(requests) -> dict:
    """Each block's owner: the one session whose prompts hold it, or SHARED if several sessions' do. By sets,
    a session at a time (set operations run in C; a loop over every block of every prompt, in the browser's
    Python, was a tenth of a load-balancer change)."""
    by_session = collections.defaultdict(set)
    for q in requests:
        by_session[q.session].update(q.blocks)
    owners: dict[int, int] = {}
    seen: set = set()            # owners' keys as a set: `blocks & owners.keys()` copied every key into a new set
    for session, blocks in by_session.items():     # for each session (at 64 sessions, 0.26x the time in CPython)
        owners.update(dict.fromkeys(blocks & seen, SHARED))     # an earlier session holds them too
        new = blocks - seen
        owners.update(dict.fromkeys(new, session))
        seen |= new
    return owners


def chained(requests) -> bool:
    """Whether every hash id stands for its whole prefix, as Mooncake's chained ids do (an id is a hash of its
    block and of the id before it): each id always follows the same id, or always opens a prompt. Then two
    prompts that share an id share every block up to it. Counted with sets: as many distinct (id, id before
    it) pairs as distinct ids."""
    ids, pairs = set(), set()
    for q in requests:
        ids.update(q.blocks)
        pairs.update(zip(q.blocks, (None,) + q.blocks))
    return len(pairs) == len(ids)


@functools.lru_cache(maxsize=2)
def requests_with_sessions(text: str) -> tuple[Request, ...]:
    """An uploaded trace's requests in arrival order with their sessions (with_sessions' rule). Cached: the
    pages that replay an upload ask for it on every change of a control, with the same text."""
    return with_sessions(parse_trace(text), BLOCK_SIZE)[0]


# ---- a trace shaped like the released conversation trace, for tests and benchmarks ---------------------------
def conversation_like(requests: int, seed: int = 0, block_size: int = BLOCK_SIZE) -> list[dict]:
    """A deterministic Mooncake-format trace with the conversation trace's broad shape (FAST'25 Table 2: 12,031
    requests, 12,035 input and 343 output tokens on average, over an hour): conversations start at Poisson
    times, open with one of 8 system prompts (Zipf), and each turn repeats the last prompt with its answer and
    adds a message. Not real data; real traces are the release's files."""
    import random
    rng = random.Random(seed)
    systems = [list(range(i * 8, i * 8 + 2 + i % 4)) for i in range(8)]     # 2-5 blocks each, ids 0..63
    next_id, out, live, t = 64, [], [], 0.0
    while len(out) < requests:
        if not live or rng.random() < 0.55:                # a new conversation: 55% of requests
            system = systems[min(int(rng.paretovariate(1.2)) - 1, 7)]
            tokens = len(system) * block_size + rng.randint(200, 20_000)
            live.append({"ids": list(system), "tokens": len(system) * block_size, "want": tokens})
        c = live[rng.randrange(len(live))] if rng.random() < 0.7 or len(live) == 1 else live[-1]
        c["want"] = min(c["want"], 128_000)
        full = c["tokens"] // block_size                   # whole blocks of the last prompt are shared
        ids = c["ids"][:full]
        while len(ids) * block_size < c["want"]:
            ids.append(next_id)
            next_id += 1
        t += rng.expovariate(1 / 0.3)                       # about 3.3 requests a second
        answer = int(rng.expovariate(1 / 343))
        out.append({"timestamp": round(t * 1000), "input_length": c["want"], "output_length": answer,
                    "hash_ids": ids})
        c["ids"], c["tokens"] = ids, c["want"]
        c["want"] += answer + rng.randint(100, 3_000)      # the next turn: the answer and a new message
        if len(live) > 50:
            live.pop(0)
    return out


# ---- what a trace could reuse ------------------------------------------------------------------------------
def unlimited_cache_hits(records: Iterable[dict], block_size: int = BLOCK_SIZE) -> tuple[int, int]:
    """(prompt tokens found, prompt tokens) with one cache that never evicts and holds every prompt from the
    moment it arrives, in arrival order: the most any router and any cache size could reuse. A prompt finds
    the longest prefix of its hash ids seen before (ids are chained, so a seen id means a seen prefix)."""
    rows = sorted(records, key=lambda r: r["timestamp"])
    return _unlimited(((r["hash_ids"], r["input_length"]) for r in rows), block_size)


def unlimited_prefix_hits(requests, block_size: int = BLOCK_SIZE, chained: bool = False) -> tuple[int, int]:
    """unlimited_cache_hits over requests already in arrival order. `chained`: the caller knows every id stands for
    its whole prefix (see chained()), so the leading ids seen are found by bisection, and only the ids after them
    are new (the load balancer's synthetic trace at 64 sessions, in Pyodide under Node, best of 20: 0.49-0.54 ms
    against 0.97-1.14; in CPython, where takewhile runs in C, no faster)."""
    prompts = ((q.blocks, q.input_length) for q in requests)
    return _unlimited_chained(prompts, block_size) if chained else _unlimited(prompts, block_size)


def _unlimited(prompts, block_size: int) -> tuple[int, int]:
    seen: set = set()
    found = total = 0
    for ids, length in prompts:
        n = len(list(itertools.takewhile(seen.__contains__, ids)))      # the leading ids seen, counted in C
        found += min(n * block_size, length)
        total += length
        seen.update(ids)
    return found, total


def _unlimited_chained(prompts, block_size: int) -> tuple[int, int]:
    seen: set = set()
    found = total = 0
    for ids, length in prompts:
        lo, hi = 0, len(ids) + 1         # ids[:lo] all seen, ids[:hi] not: a seen id means its prefix was seen
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ids[mid - 1] in seen:
                lo = mid
            else:
                hi = mid
        found += min(lo * block_size, length)
        total += length
        seen.update(ids[lo:])
    return found, total
