"""When caching a prefix pays.

A provider bills a cache write above the normal input price and a cache read far below it, and a
cached prefix lives for a while after its last use. With requests arriving at random (Poisson) at
rate r, a request finds the prefix cached when the previous one came less than a lifetime L ago:
P(hit) = 1 - exp(-r L). Caching pays when the hits' savings outweigh the writes' surcharge.
Prices are parameters with a dated source, not constants. Standard library only.
"""
from __future__ import annotations

import dataclasses
import math
import random

from ..core.gpus import GPUS
from ..core.limits import check_split, check_weights_fit
from ..core.models import MODELS
from ..core.summaries import num, sig, summaries
from ..core.params import ParamError, Params, choice, integer, number
from ..core.timing import prefill_formula, prefill_seconds
from ..core.units import thousands

# One major provider's published multipliers (Anthropic, prompt caching documentation, as of
# 2025-11): a 5-minute cache write costs 1.25x base input, a 1-hour write 2x, a read 0.1x.
PRICES_AS_OF = "2025-11"


@dataclasses.dataclass(frozen=True)
class PromptCachingParams(Params):
    prefix_tokens: int = integer(10_000, unit="tokens", min=1, max=2_000_000, help="The reusable prefix")
    suffix_tokens: int = integer(500, unit="tokens", min=0, max=2_000_000, help="New input per request")
    output_tokens: int = integer(300, unit="tokens", min=0, max=200_000, help="Output per request")
    input_price: float = number(3.0, unit="$/M tokens", min=0.01, max=1000, help="Base input price")
    output_price: float = number(15.0, unit="$/M tokens", min=0, max=1000, help="Output price")
    write_multiplier: float = number(1.25, unit="× input", min=1, max=10,
                                     help="Cache write price over base input (1.25 for 5 minutes, 2 for an hour)")
    read_multiplier: float = number(0.1, unit="× input", min=0, max=1, help="Cache read price over base input")
    lifetime_s: float = number(300, unit="s", min=1, max=86_400, help="How long a cached prefix lives after use")
    rate_per_min: float = number(1.0, unit="requests/min", min=0.001, max=10_000,
                                 help="How often requests with this prefix arrive (Poisson)")
    duration_min: float = number(60, unit="min", min=1, max=10_000, help="Simulated time")
    seed: int = integer(0, unit="seed", min=0, max=10_000, help="Seed for arrival times")
    # Self-hosted: the GPU time a hit saves comes from the shared time model (core/timing.py), not a fixed
    # tokens/s rate, because attention makes a long prefix cost more per token than a short one.
    model: str = choice("llama-3-8b", MODELS, help="Self-hosted: the model that prefills the prefix")
    gpu: str = choice("h100-sxm", GPUS, help="Self-hosted: GPU preset (datasheet dense BF16 FLOP/s)")
    gpus: int = integer(1, unit="GPUs", min=1, max=64, help="Self-hosted: GPUs the model is split over")
    mfu: float = number(0.5, unit="share", min=0.01, max=1.0, help="Self-hosted: share of peak FLOP/s prefill reaches")
    gpu_price_per_hour: float = number(3.0, unit="$/h", min=0, max=1000, help="Self-hosted: one GPU's hourly cost")

    def __post_init__(self):
        super().__post_init__()
        if self.rate_per_min * self.duration_min > 20_000:
            raise ParamError("rate_per_min", f"rate_per_min × duration_min must be at most 20,000 requests to "
                                             f"simulate; got {self.rate_per_min * self.duration_min:,.0f}.")
        m = MODELS[self.model]
        check_split("gpus", m, self.gpus)
        check_weights_fit("gpus", m, GPUS[self.gpu], self.gpus, 2, "BF16")


def reuses_per_lifetime(p: PromptCachingParams) -> float:
    return p.rate_per_min / 60 * p.lifetime_s


def hit_probability(reuses: float) -> float:
    """Poisson arrivals, lifetime refreshed on every use: the previous request came within L."""
    return 1 - math.exp(-reuses)


def cost_per_request(p: PromptCachingParams, hit_rate: float | None) -> float:
    """Dollars per request; hit_rate None means no caching at all."""
    m = 1e-6
    rest = p.suffix_tokens * p.input_price * m + p.output_tokens * p.output_price * m
    if hit_rate is None:
        return p.prefix_tokens * p.input_price * m + rest
    prefix_mult = hit_rate * p.read_multiplier + (1 - hit_rate) * p.write_multiplier
    return p.prefix_tokens * p.input_price * m * prefix_mult + rest


def break_even(p: PromptCachingParams) -> dict:
    """Where caching starts to pay: the hit rate h with h read + (1 − h) write = 1, and the rate that gives it.

    The multipliers are bounded (write ≥ 1 ≥ read), so h = (write − 1) ÷ (write − read) lies in [0, 1], with
    three ends that have no crossing: write = read = 1 (caching changes nothing, at any hit rate), read = 1
    < write (a read saves nothing, so the writes' surcharge is never paid back: caching never pays), and
    write = 1 (nothing to pay back: any hit pays). None, never an infinity, where there is no such rate.
    """
    w, r = p.write_multiplier, p.read_multiplier
    if w == r:
        return {"kind": "no difference", "hit_rate": None, "rate_per_min": None}
    if r >= 1:
        return {"kind": "never", "hit_rate": None, "rate_per_min": None}
    h = (w - 1) / (w - r)
    return {"kind": "always" if h == 0 else "crossing", "hit_rate": h,
            "rate_per_min": -math.log(1 - h) / p.lifetime_s * 60}


def break_even_hit_rate(p: PromptCachingParams) -> float | None:
    """Hit rate above which caching is cheaper; None where no hit rate makes it so (see break_even)."""
    return break_even(p)["hit_rate"]


def break_even_words(b: dict) -> str:
    """The break-even in one phrase, for the formula and the readouts."""
    if b["kind"] == "no difference":
        return "none: with write = read = 1× input, caching costs the same as not caching at any hit rate"
    if b["kind"] == "never":
        return "none: a read costs the full input price, so the writes' surcharge is never paid back"
    if b["kind"] == "always":
        return "0% hits: a write costs no more than input, so any hit pays"
    return f"{b['hit_rate']:.1%} hits, at {b['rate_per_min']:.3g} requests/min"


def simulate(p: PromptCachingParams) -> list[dict]:
    """Poisson arrivals; each request is a write (cache empty or expired) or a hit, then expiry is reset."""
    rng = random.Random(p.seed)
    t, expires, events = 0.0, -1.0, []
    rate_s = p.rate_per_min / 60
    end = p.duration_min * 60
    while True:
        t += rng.expovariate(rate_s)
        if t > end:
            break
        if t > expires >= 0:
            events.append({"t": expires, "kind": "expiry"})
        events.append({"t": t, "kind": "hit" if t <= expires else "write"})
        expires = t + p.lifetime_s
    if 0 <= expires <= end:
        events.append({"t": expires, "kind": "expiry"})
    return events


def evaluate(p: PromptCachingParams) -> dict:
    reuses = reuses_per_lifetime(p)
    h = hit_probability(reuses)
    events = simulate(p)
    requests = [e for e in events if e["kind"] != "expiry"]
    sim_hits = sum(e["kind"] == "hit" for e in requests)
    be = break_even(p)
    without, with_ = cost_per_request(p, None), cost_per_request(p, h)
    # A hit skips exactly the prefix's own prefill: the suffix attends to the prefix either way, and
    # prefill(prefix + suffix) − prefill(suffix after prefix) = prefill(prefix) (the causal terms add up).
    saved_s = prefill_seconds(MODELS[p.model], GPUS[p.gpu], p.prefix_tokens, gpus=p.gpus, mfu=p.mfu)
    return {
        "reuses_per_lifetime": reuses,
        "hit_rate": h,
        "simulated_requests": len(requests),
        "simulated_hit_rate": sim_hits / len(requests) if requests else None,      # no requests, no rate
        "cost_without": without,
        "cost_with": with_,
        "saving": 1 - with_ / without,
        "break_even_kind": be["kind"],
        "break_even_hit_rate": be["hit_rate"],
        "break_even_rate_per_min": be["rate_per_min"],
        "self_hosted_prefill_s_saved_per_hit": saved_s,
        "self_hosted_dollars_saved_per_hour": p.rate_per_min * 60 * h * saved_s / 3600 * p.gpus * p.gpu_price_per_hour,
    }


def page_data(p: PromptCachingParams) -> dict:
    r = evaluate(p)
    xs = [10 ** (i / 10) for i in range(-30, 21)]                      # 0.001 .. 100 reuses per lifetime
    events = simulate(p)
    alive = {"t0": [], "t1": []}
    for e in events:
        if e["kind"] == "write":
            alive["t0"].append(e["t"] / 60)
        elif e["kind"] == "expiry":
            alive["t1"].append(e["t"] / 60)
    if len(alive["t1"]) < len(alive["t0"]):
        alive["t1"].append(p.duration_min)
    kinds = [e["kind"] for e in events]
    sources = {
        "curve": {"reuses": xs, "without": [r["cost_without"] * 1e3] * len(xs),
                  "with_cache": [cost_per_request(p, hit_probability(x)) * 1e3 for x in xs]},
        "here": {"reuses": [r["reuses_per_lifetime"]], "cost": [r["cost_with"] * 1e3],
                 "text": [f"you: {r['hit_rate']:.0%} hits, {r['saving']:+.0%} saved"]},
        "break_even": ({"reuses": [-math.log(1 - r["break_even_hit_rate"])] * 2,
                        "y": [0, r["cost_without"] * 1e3 * 1.3]}
                       if r["break_even_kind"] == "crossing" else {"reuses": [], "y": []}),
        "timeline": {"t": [e["t"] / 60 for e in events], "kind": kinds,
                     "y": [{"write": 2, "hit": 1, "expiry": 0}[k] for k in kinds]},
        "alive": alive,
    }
    ranges = {"timeline_x": [0, p.duration_min]}
    return {
        "sources": sources,
        "texts": plot_summaries(sources, ranges),
        "ranges": ranges,
        "formula": formula(p, r),
        "readouts": readouts(p, r),
        "notes": [f"Prices are parameters: the defaults are one provider's list prices as of {PRICES_AS_OF}. "
                  f"Check today's before you rely on them."],
    }


def plot_summaries(sources: dict, ranges: dict) -> dict:
    """Each plot in words, from the columns (and the timeline's span) it draws."""
    c, here, be = sources["curve"], sources["here"], sources["break_even"]
    curve = (f"Without caching 1,000 requests cost ${c['without'][0]:,.2f}; with caching, ${c['with_cache'][0]:,.2f} "
             f"at {num(c['reuses'][0])} requests per lifetime and ${c['with_cache'][-1]:,.2f} at "
             f"{num(c['reuses'][-1])}. ")
    curve += (f"Caching pays above {sig(be['reuses'][0])} requests per lifetime. " if be["reuses"] else
              "The two lines do not cross: caching never pays, or always does. ")
    curve += f"You are at {sig(here['reuses'][0])} requests per lifetime: ${here['cost'][0]:,.2f}."
    kinds = sources["timeline"]["kind"]
    alive, span = sources["alive"], ranges["timeline_x"][1] - ranges["timeline_x"][0]
    cached = sum(b - a for a, b in zip(alive["t0"], alive["t1"]))
    writes, hits, expiries = kinds.count("write"), kinds.count("hit"), kinds.count("expiry")
    timeline = (f"In {sig(span)} simulated minutes {thousands(writes + hits)} requests arrive: "
                f"{thousands(writes)} {'writes' if writes == 1 else 'write'} the prefix and {thousands(hits)} "
                f"{'hits' if hits == 1 else 'hit'} it; it expires {thousands(expiries)} "
                f"{'time' if expiries == 1 else 'times'} and is cached for {sig(cached)} of the {sig(span)} minutes.")
    return summaries(curve=curve, timeline=timeline)


def formula(p: PromptCachingParams, r: dict) -> list[dict]:
    return [
        {"name": "Reuses per lifetime", "formula": "rate × lifetime",
         "substituted": f"{p.rate_per_min:g}/min × {p.lifetime_s:g} s", "result": f"{r['reuses_per_lifetime']:.3g}"},
        {"name": "Hit rate", "formula": "1 − exp(−rate × lifetime)   (Poisson arrivals, lifetime refreshed on use)",
         "substituted": f"1 − exp(−{r['reuses_per_lifetime']:.3g})",
         "result": f"{r['hit_rate']:.1%} ({simulated_words(r)})"},
        {"name": "Prefix cost multiplier", "formula": "hit rate × read + (1 − hit rate) × write",
         "substituted": f"{r['hit_rate']:.3f} × {p.read_multiplier:g} + {1 - r['hit_rate']:.3f} × "
                        f"{p.write_multiplier:g}",
         "result": f"{r['hit_rate'] * p.read_multiplier + (1 - r['hit_rate']) * p.write_multiplier:.3f} × input"},
        {"name": "Cost per request", "formula": "prefix × input × multiplier + suffix × input + output × output price",
         "substituted": f"{thousands(p.prefix_tokens)} × ${p.input_price:g}/M × multiplier + "
                        f"{thousands(p.suffix_tokens)} × ${p.input_price:g}/M + {thousands(p.output_tokens)} × "
                        f"${p.output_price:g}/M",
         "result": f"${r['cost_with']:.5f} with caching, ${r['cost_without']:.5f} without"},
        {"name": "Break-even", "formula": "hit rate > (write − 1) ÷ (write − read)",
         "substituted": f"({p.write_multiplier:g} − 1) ÷ ({p.write_multiplier:g} − {p.read_multiplier:g})",
         "result": break_even_words(break_even(p))},
        {**prefill_formula(MODELS[p.model], GPUS[p.gpu], p.prefix_tokens, 0, gpus=p.gpus, mfu=p.mfu),
         "name": f"Self-hosted: a hit skips the prefix's prefill ({MODELS[p.model].title})"},
        {"name": "Self-hosted: GPU time saved", "formula": "requests/h × hit rate × seconds saved per hit × GPUs × $/GPU-h",
         "substituted": f"{p.rate_per_min * 60:,.4g} × {r['hit_rate']:.3f} × "
                        f"{r['self_hosted_prefill_s_saved_per_hit']:.3g} s ÷ 3,600 × {p.gpus} × ${p.gpu_price_per_hour:g}",
         "result": f"{r['self_hosted_prefill_s_saved_per_hit']:.2f} s per hit, "
                   f"${r['self_hosted_dollars_saved_per_hour']:.3f} of GPU time per hour"},
    ]


MIN_SIMULATED = 30      # fewer requests than this and the simulated rate says little about the formula


def simulated_words(r: dict) -> str:
    n = r["simulated_requests"]
    if n == 0:
        return "no request arrived in the simulated time, so the simulation has nothing to check"
    if n < MIN_SIMULATED:
        return (f"simulated: {r['simulated_hit_rate']:.0%} of {n} request{'s' if n > 1 else ''}, too few to check "
                f"the formula; simulate longer")
    return f"simulated: {r['simulated_hit_rate']:.1%} of {n:,} requests"


def readouts(p: PromptCachingParams, r: dict) -> list[dict]:
    return [
        {"label": "Hit rate", "value": f"{r['hit_rate']:.0%}",
         "detail": f"{r['reuses_per_lifetime']:.2g} requests arrive per lifetime, on average"},
        {"label": "Per 1,000 requests", "value": f"${r['cost_with'] * 1e3:.2f}",
         "detail": f"with caching; ${r['cost_without'] * 1e3:.2f} without"},
        {"label": "Saving", "value": f"{r['saving']:.0%}",
         "detail": "of each request's cost" if r["saving"] >= 0 else "caching costs more than not caching"},
        {"label": "Break-even", "value": ("none" if r["break_even_hit_rate"] is None
                                          else f"{r['break_even_hit_rate']:.0%}"),
         "detail": (f"hits, or {r['break_even_rate_per_min']:.2g} requests/min at this lifetime"
                    if r["break_even_kind"] == "crossing" else break_even_words(break_even(p)))},
    ]
