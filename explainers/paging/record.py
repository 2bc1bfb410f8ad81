"""A run of the paging simulation, recorded as segments of steps rather than one row per step.

A run is long (up to 50,000 steps) but changes at few events (arrivals, admissions, completions, preemptions):
between them every running request writes a token a step. So each stretch is one segment, and what the page needs
(a summary over every step, the series at the frames drawn) is computed from the segments; the rows are only
expanded for a caller that asks for them (`columns`).

Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import bisect
import itertools
import operator
from typing import NamedTuple

COLUMNS = ("stored", "in_use", "running", "waiting", "done", "short", "preemptions", "recomputed", "refound",
           "swapped")
CONSTANT = COLUMNS[2:]          # constant within a segment (waiting too, unless requests arrive in it)


class Segment(NamedTuple):
    """`steps` steps in which `running` requests each wrote a token a step. `stored` and `in_use` are the last
    step's; `grown[j]`, if given, is how many blocks step j took, and `arrived[j]` how many requests waited
    after step j. The rest held in every step."""
    steps: int
    stored: int
    in_use: int
    grown: list[int] | None
    arrived: list[int] | None
    running: int
    waiting: int
    done: int
    short: bool
    preemptions: int
    recomputed: int
    refound: int
    swapped: int


class Record:
    """The segments of one allocator's run, in step order."""

    def __init__(self, block_size: int):
        self.segments: list[Segment] = []
        self.bs = block_size
        self.ends: list[int] = []           # the step after each segment's last
        self._sampled: tuple[list[int], dict] | None = None     # the last `at`: its steps and answer

    def add(self, segment: Segment) -> None:
        self.segments.append(segment)
        self.ends.append((self.ends[-1] if self.ends else 0) + segment.steps)

    @property
    def steps(self) -> int:
        return self.ends[-1] if self.ends else 0

    # -- per step
    def _stored(self, s: Segment) -> range | list[int]:
        return (range(s.stored - s.running * (s.steps - 1), s.stored + 1, s.running) if s.running
                else [s.stored] * s.steps)

    def _in_use(self, s: Segment):
        if s.grown is None:
            return [s.in_use] * s.steps
        slots = itertools.accumulate(map(operator.mul, s.grown, itertools.repeat(self.bs)),
                                     initial=s.in_use - sum(s.grown) * self.bs)
        next(slots)                          # accumulate's initial value is the step before
        return slots

    def columns(self) -> dict[str, list]:
        """One row per step, as stepping one step at a time would record them."""
        out = {name: [] for name in COLUMNS}
        lengths = [s.steps for s in self.segments]
        for s in self.segments:
            out["stored"].extend(self._stored(s))
            out["in_use"].extend(self._in_use(s))
        for name in CONSTANT:
            values = map(operator.attrgetter(name), self.segments)
            out[name] = list(itertools.chain.from_iterable(map(itertools.repeat, values, lengths)))
        waiting, start = out["waiting"], 0
        for s, end in zip(self.segments, self.ends):
            if s.arrived is not None:
                waiting[start:end] = s.arrived
            start = end
        return out

    def at(self, steps: list[int]) -> dict[str, list]:
        """stored, running, waiting and preemptions at each of the given steps, in increasing order (a step after
        the end reads the last). The page asks twice for its frames' steps: the answer is kept for the last list."""
        if self._sampled is not None and self._sampled[0] == steps:
            return self._sampled[1]
        last, ends, segments = self.steps - 1, self.ends, self.segments
        steps_in = [min(k, last) for k in steps]
        where, i = [], 0                     # each step's segment, found by walking forward (steps increase)
        for k in steps_in:
            while ends[i] <= k:
                i += 1
            where.append(i)
        back = [ends[i] - 1 - k for i, k in zip(where, steps_in)]     # steps before its segment's last
        picked = [segments[i] for i in where]
        out = {"stored": [s.stored - s.running * b for s, b in zip(picked, back)],
               "running": [s.running for s in picked],
               "waiting": [s.waiting if s.arrived is None else s.arrived[s.steps - 1 - b] for s, b in zip(picked, back)],
               "preemptions": [s.preemptions for s in picked]}
        self._sampled = (list(steps), out)
        return out

    # -- over every step
    def summary(self, memory_slots: int, requests: int) -> dict:
        """Sums and extremes over every step, from the segments: the tokens stored grow by an arithmetic series
        in each, and the slots allocated by the blocks taken (summed in C, as accumulate and map)."""
        bs, mul, sub, repeat = self.bs, operator.mul, operator.sub, itertools.repeat
        stored_sum = allocated = busy_steps = busy_stored = running_sum = peak = 0
        slack_sum, slack_steps, slack_max = 0.0, 0, None
        for k, last_stored, last_used, grown, _, n, _, _, short, *_ in self.segments:
            stored = k * last_stored - n * (k * (k - 1) // 2)
            if grown is None:
                in_use, most = k * last_used, last_used - (last_stored - n * (k - 1))
            else:
                # step j holds (last_used - bs * all taken) + bs * (taken in steps 0..j) slots and stores
                # last_stored - n * (k - 1 - j) tokens, so its slack is a running sum of (bs * taken - n), plus
                # (last_used - bs * all taken) - last_stored + n * k
                taken = sum(grown)
                start = last_used - bs * taken
                in_use = k * start + bs * sum(itertools.accumulate(grown))
                most = (start - last_stored + n * k
                        + max(itertools.accumulate(map(sub, map(mul, grown, repeat(bs)), repeat(n)))))
            stored_sum += stored
            allocated += in_use
            running_sum += n * k
            if n > peak:
                peak = n
            if short:
                busy_steps += k
                busy_stored += stored
            if n:                                # waste per running request, in every step that has one
                slack_sum += (in_use - stored) / n
                slack_steps += k
                slack_max = most / n if slack_max is None or most / n > slack_max else slack_max
        last = self.segments[-1]
        steps = self.steps
        return {
            "steps": steps,
            "finished_requests": last.done,
            "stopped_early": last.done < requests,
            "steps_memory_short": busy_steps,
            # None when memory never kept a request out or from growing: the share is then not about capacity.
            "token_state_share_busy": busy_stored / busy_steps / memory_slots if busy_steps else None,
            "token_state_share_mean": stored_sum / steps / memory_slots,
            "token_state_share_of_allocated": stored_sum / allocated if allocated else 0.0,
            "peak_running": peak,
            "mean_running": running_sum / steps,
            "preemptions": last.preemptions,
            "recomputed_tokens": last.recomputed,
            "refound_tokens": last.refound,
            "swapped_tokens": last.swapped,
            "mean_waste_per_request_slots": slack_sum / slack_steps if slack_steps else 0.0,
            "max_waste_per_request_slots": slack_max if slack_max is not None else 0.0,
        }
