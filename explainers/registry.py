"""The explicit list of explainers. The site build, the server, the CLI and the tests loop over it.

Standard library only: the browser imports this module to find a model by slug.
"""
from __future__ import annotations

import array
import base64
import dataclasses
import json
import math
import sys
from typing import Any, Callable

from .agent_sessions import model as agent_sessions
from .cache_renting import model as cache_renting
from .cross_layer import model as cross_layer
from .cross_model import model as cross_model
from .disaggregation import model as disaggregation
from .eviction import model as eviction
from .load_balancer import model as load_balancer
from .mla import model as mla
from .paging import model as paging
from .prefix_reuse import model as prefix_reuse
from .prompt_caching import model as prompt_caching
from .quantization import model as quantization
from .core.params import ParamError, Params

LEVELS = ("beginner", "intermediate", "advanced")


@dataclasses.dataclass(frozen=True)
class Explainer:
    slug: str
    title: str
    level: str
    claim: str                            # the page's first sentence
    params: type[Params]
    evaluate: Callable[[Any], dict]       # named results, for `kvx run` and the API
    page_data: Callable[[Any], dict]      # what the page draws, for the browser and the site build
    glossary: tuple[str, ...] = ()        # glossary terms the page links to
    # Animations whose frames are not cumulative ask the model for one frame at a time.
    frame_data: Callable[[Any, int], dict] | None = None
    # Pages with a "run it here" button: the model words the server's reply (params, reply) -> text.
    describe_run: Callable[[Any, dict], str] | None = None
    # Data the reader uploads (a trace file): each name is a non-parameter field of the params dataclass,
    # sent by the page as `_<name>` and by `kvx run --<name> FILE`. Never part of the URL.
    uploads: tuple[str, ...] = ()

    def describe(self) -> dict:
        return {"slug": self.slug, "title": self.title, "level": self.level, "claim": self.claim,
                "parameters": self.params.describe()}


REGISTRY: dict[str, Explainer] = {e.slug: e for e in [
    Explainer(
        slug="cache-renting",
        title="The KV cache is the thing you are actually renting",
        level="beginner",
        claim=("A GPU node pays for the model's weights once, but pays for every user's KV cache separately, "
               "so the cache, not the model, decides how many users fit, and long contexts collapse that number."),
        params=cache_renting.CacheRentingParams,
        evaluate=cache_renting.evaluate,
        page_data=cache_renting.page_data,
        glossary=("kv-cache", "pagedattention", "kv-cache-quantization", "preemption", "kv-cache-offloading",
                  "gqa", "mla"),
    ),
    Explainer(
        slug="paging",
        title="Reserve for the worst case, or page",
        level="beginner",
        claim=("A server that reserves each request's maximum length up front keeps only about a quarter of its KV "
               "memory full of real tokens, while one that hands out small blocks on demand fills more than nine "
               "tenths of it and wastes less than a block per request."),
        params=paging.PagingParams,
        evaluate=paging.evaluate,
        page_data=paging.page_data,
        frame_data=paging.frame_data,
        glossary=("kv-cache", "pagedattention", "block-table", "preemption", "kv-cache-offloading"),
    ),
    Explainer(
        slug="prefix-reuse",
        title="Compute the system prompt once",
        level="beginner",
        claim=("When requests share a beginning (a system prompt, a conversation so far), a prefix cache computes "
               "it once and every later request reuses it, so most of a multi-turn chat's prefill is never done "
               "again."),
        params=prefix_reuse.PrefixParams,
        evaluate=prefix_reuse.evaluate,
        page_data=prefix_reuse.page_data,
        frame_data=prefix_reuse.frame_data,
        uploads=("trace",),
        glossary=("kv-cache", "prefix-caching", "radixattention", "cache-eviction"),
    ),
    Explainer(
        slug="agent-sessions",
        title="The hit rate is the workload",
        level="intermediate",
        claim=("Agent sessions that pause between turns stay cheap only while all their histories fit in GPU "
               "memory; add a few more and each returning session must prefill its whole history again, so the "
               "hit rate falls off a cliff."),
        params=agent_sessions.AgentParams,
        evaluate=agent_sessions.evaluate,
        page_data=agent_sessions.page_data,
        uploads=("trace",),
        glossary=("kv-cache", "prefix-caching", "cache-eviction", "kv-cache-offloading"),
    ),
    Explainer(
        slug="prompt-caching",
        title="When caching a prefix pays",
        level="intermediate",
        claim=("A cached prompt prefix is billed extra when written and far less when read, so caching pays only "
               "when the prefix comes back often enough within its lifetime: for a five-minute cache, in at least "
               "about one request in five."),
        params=prompt_caching.PromptCachingParams,
        evaluate=prompt_caching.evaluate,
        page_data=prompt_caching.page_data,
        glossary=("prefix-caching", "cache-eviction", "kv-cache"),
    ),
    Explainer(
        slug="load-balancer",
        title="The load balancer decides the hit rate",
        level="intermediate",
        claim=("Behind a load balancer every replica keeps its own prefix cache, so the router decides the hit "
               "rate: round-robin scatters each conversation and recomputes it, sticky sessions keep it cached "
               "but pile hot sessions onto one replica, and a router that weighs the cached prefix against the "
               "queue gets most of both."),
        params=load_balancer.LoadBalancerParams,
        evaluate=load_balancer.evaluate,
        page_data=load_balancer.page_data,
        frame_data=load_balancer.frame_data,
        uploads=("trace",),
        glossary=("cache-aware-routing", "prefix-caching", "radixattention", "cache-eviction", "ttft"),
    ),
    Explainer(
        slug="quantization",
        title="Smaller weights run faster, a smaller cache does not",
        level="beginner",
        claim=("Decoding reads every weight and every cached token once per step, so 4-bit weights make short, "
               "small-batch decoding up to three to four times faster on the bandwidth roofline (measured end to "
               "end: up to about 2.8×) while a 4-bit cache barely helps, until long contexts or big batches make "
               "the cache most of the bytes."),
        params=quantization.QuantizationParams,
        evaluate=quantization.evaluate,
        page_data=quantization.page_data,
        describe_run=quantization.describe_run,
        glossary=("kv-cache", "kv-cache-quantization", "roofline", "gqa"),
    ),
    Explainer(
        slug="disaggregation",
        title="Split the phases, and the cache has to travel",
        level="advanced",
        claim=("Serving prefill and decode on separate GPUs moves each prompt's whole KV cache over a link: sent "
               "after prefill it delays the second token by the full transfer, but sent layer by layer while "
               "prefill continues only the last layer's transfer shows, unless the link is slower than prefill."),
        params=disaggregation.DisaggregationParams,
        evaluate=disaggregation.evaluate,
        page_data=disaggregation.page_data,
        glossary=("disaggregated-serving", "ttft", "kv-cache", "gqa"),
    ),
    Explainer(
        slug="mla",
        title="Cache a latent, not every head",
        level="advanced",
        claim=("Multi-head latent attention caches one 512-number latent and one 64-number position key per token "
               "and layer, as much as grouped-query attention with 2.25 groups and 1.8% of what DeepSeek-V2's 128 "
               "heads would cache, and at decode it attends over the latent itself instead of rebuilding every "
               "head's keys and values; the paper's \"93.3% smaller\" also counts a 6-bit cache against DeepSeek "
               "67B's 16-bit one."),
        params=mla.MLAParams,
        evaluate=mla.evaluate,
        page_data=mla.page_data,
        frame_data=mla.frame_data,
        describe_run=mla.describe_run,
        glossary=("mla", "gqa", "kv-cache", "kv-cache-quantization", "roofline"),
    ),
    Explainer(
        slug="cross-model",
        title="Cross-model KV cache transfer",
        level="advanced",
        claim=("When a cascade hands a request from a small model to its larger sibling, mapping the small "
               "model's KV cache across with per-head linear maps costs a few hundredths of a percent of "
               "prefilling the context again, so the handoff's real price is the quality the maps lose, which "
               "varies by model pair."),
        params=cross_model.CrossModelParams,
        evaluate=cross_model.evaluate,
        page_data=cross_model.page_data,
        describe_run=cross_model.describe_run,
        glossary=("cross-model-kv-cache-transfer", "kv-cache", "ttft", "gqa"),
    ),
    Explainer(
        slug="cross-layer",
        title="Share the cache across layers",
        level="advanced",
        claim=("Letting pairs of layers attend with one cached K and V halves the KV cache again, multiplying "
               "with GQA, MLA, quantization and eviction, and a model trained to share keeps most of its quality, "
               "but imposed on a model trained without it the same sharing costs far more, even where the "
               "layers' caches hold similar information."),
        params=cross_layer.CrossLayerParams,
        evaluate=cross_layer.evaluate,
        page_data=cross_layer.page_data,
        describe_run=cross_layer.describe_run,
        glossary=("cross-layer-kv-sharing", "cka", "gqa", "mla", "kv-cache-quantization", "cache-eviction",
                  "kv-cache"),
    ),
    Explainer(
        slug="eviction",
        title="Keep the sinks, keep the heavy hitters",
        level="advanced",
        claim=("A bounded KV cache keeps a budget of the prompt's tokens by a rule (StreamingLLM the first few "
               "\"sink\" tokens and the most recent, H2O the most-attended \"heavy hitters\", SnapKV what the "
               "prompt's end attends to), and on a real model the rule matters less to the average loss than to a "
               "question asked after the cut, which finds its answer only if the policy happened to keep it."),
        params=eviction.EvictionParams,
        evaluate=eviction.evaluate,
        page_data=eviction.page_data,
        frame_data=eviction.frame_data,
        describe_run=eviction.describe_run,
        glossary=("cache-eviction", "attention-sink", "heavy-hitter", "kv-cache", "gqa"),
    ),
]}


def get(slug: str) -> Explainer:
    if slug not in REGISTRY:
        raise KeyError(f"no explainer {slug!r}; the explainers are {', '.join(REGISTRY)}.")
    return REGISTRY[slug]


def params_from(explainer: Explainer, values: dict):
    """The parameters from `values`, with any uploaded data (`_<name>` keys) attached. Pops those keys."""
    data = {name: values.pop(f"_{name}") for name in explainer.uploads if values.get(f"_{name}") is not None}
    for key in [k for k in values if k.startswith("_") and k[1:] in explainer.uploads]:
        values.pop(key)
    params = explainer.params.from_mapping(values)
    return dataclasses.replace(params, **data) if data else params


# Columns shorter than this stay plain JSON: packing them saves nothing worth the step. Nor do columns of short
# decimals (paging's 12.5 s, 0.25 GB), judged by the one in the middle: a double is 10.7 characters in base64, and
# packing paging's columns made its reply slower to write (1.0 -> 1.25 ms in Pyodide) and larger.
PACKED_MIN = 64
PACKED_DIGITS = 12


def pack_columns(data: dict) -> dict:
    """data with each long column of finite floats in its plots' sources as {"f64": base64 of its little-endian
    doubles}, which the worker turns into a Float64Array for BokehJS (as Bokeh itself sends numeric arrays): the
    same numbers bit for bit, without writing and parsing each one's shortest decimal (measured in Pyodide: the load
    balancer's reply at 64 sessions, json.dumps 3.0 -> 1.6 ms with the packing, 77 -> 58 KB). A column with anything
    else (an int, a string, NaN) stays a list, so the strict JSON check still sees it."""
    sources = data.get("sources")
    if not sources:
        return data
    return {**data, "sources": {key: {name: _packed(col) for name, col in cols.items()}
                                for key, cols in sources.items()}}


def _packed(col):
    """One column, packed if it is worth it (pack_columns), else as it is."""
    if not (isinstance(col, list) and len(col) >= PACKED_MIN and type(col[len(col) // 2]) is float
            and len(repr(col[len(col) // 2])) > PACKED_DIGITS):
        return col
    if set(map(type, col)) != {float} or not all(map(math.isfinite, col)):
        return col
    values = array.array("d", col)
    if sys.byteorder == "big":
        values.byteswap()
    return {"f64": base64.b64encode(values.tobytes()).decode("ascii")}


def run(slug: str, values: dict) -> dict:
    """Validate `values` and evaluate the model: the explainer, its parameters, and its named results.

    Used by `kvx run` and the server, so both print the same thing. Raises ParamError on bad input.
    """
    explainer = get(slug)
    params = params_from(explainer, dict(values))
    return {"explainer": slug, "params": params.as_dict(), **explainer.evaluate(params)}


def _strict_json(reply: dict) -> str:
    """JSON the browser can parse: NaN or Infinity is a model bug, reported as one (below), never sent."""
    return json.dumps(reply, allow_nan=False)


# The browser's Python (WebAssembly) runs slower until the engine has compiled its hot functions with its
# optimising compiler, which it does only after they have run for a while: measured in Chromium, the first
# twenty changes on a simulation page took 2-3x as long in Python as the next twenty. So right after it is
# ready the worker evaluates the page at other values (real work: a cached answer compiles nothing) while
# the reader is still reading, stopping as soon as a real change comes or its time is up (kvx-worker.mjs).
# Six were too few: on cache-renting, with a 4 s pause after ready, Python's time per change went from 38 ms
# on the first to about 2 ms by the twentieth; after forty warm-up runs the first took 2.8 ms. Forty still left
# one change in ten slow: on cross-model, prompt-caching, disaggregation and cross-layer, Python's p95 over 40
# changes was 6-14 ms against a median of 2-5 (each change runs functions the engine has not optimised yet;
# with its optimising compiler forced on for everything, 3-4 ms). After 200 warm-up runs it was 3-8 ms. The worker
# goes through them again until its time budget is spent (kvx-worker.mjs, WARM_UP_MS): a repeated value of an
# arithmetic page is real work again (its model keeps no answers); a simulation that gets through its 200 seeds
# within the budget answers repeats from its caches, which costs little and warms nothing more.
WARM_UP_RUNS = 200


def warm_up_values(slug: str) -> list[dict]:
    """Parameter changes for the worker's warm-up: other seeds of a simulation; else values just below the
    default of the first integer (else number) parameter where the model accepts them all (pure arithmetic
    takes 1-2 ms in CPython but 6-8 ms in the browser before its Python is compiled)."""
    explainer = get(slug)
    specs = explainer.params.describe()
    seed = next((s for s in specs if s["name"] == "seed"), None)
    if seed is not None:
        return [{"seed": str(v)} for v in range(seed["max"], seed["max"] - WARM_UP_RUNS, -1)]
    for s in sorted(specs, key=lambda s: s["kind"] != "integer"):      # integers first, then numbers
        if s["kind"] not in ("integer", "number") or not s["default"]:
            continue
        step = 1 if s["kind"] == "integer" else s["default"] / (2 * WARM_UP_RUNS)     # down to half the default
        changes = [{s["name"]: str(round(s["default"] - i * step, 6))} for i in range(1, WARM_UP_RUNS + 1)]
        if all(_valid(explainer, c) for c in changes):             # validation only: no evaluation
            return changes
    return []


def neighbour_values(slug: str) -> list[dict]:
    """Each number box's nearest values to its default, one step up and one down (an integer's step 1, a
    number's a twentieth of it), where the model accepts them, box by box: what the page's warm-up passes draw
    (kvx-page.js, warmDrawingAgain: why). The warm-up's own values all lie below one default, or are other seeds."""
    explainer = get(slug)
    out = []
    for s in explainer.params.describe():
        if s["kind"] not in ("integer", "number") or s["default"] is None:
            continue
        step = 1 if s["kind"] == "integer" else abs(s["default"]) / 20 or 0.05
        for value in (s["default"] + step, s["default"] - step):
            change = {s["name"]: str(value if s["kind"] == "integer" else round(value, 6))}
            if _valid(explainer, change):                          # validation only: no evaluation
                out.append(change)
    return out


def _valid(explainer: Explainer, values: dict) -> bool:
    try:
        params_from(explainer, dict(values))
    except ParamError:
        return False
    return True


def page_json(slug: str, params_json: str, packed: bool = False) -> str:
    """The browser's entry point: JSON in, JSON out, and never an exception.

    A bad value comes back as {"ok": false, "field": ..., "message": ...} so the page can show the
    sentence next to the control instead of a traceback. `packed` (the page's worker asks for it): long columns
    of floats in the plots' sources come as binary (pack_columns).
    """
    try:
        explainer = get(slug)
        values = json.loads(params_json)
        frame = values.pop("_frame", None)              # a request for one animation frame, not a parameter
        run_reply = values.pop("_run_reply", None)      # the server's measurement, to be put into words
        params = params_from(explainer, values)         # with any uploaded data (`_trace`) attached
        if run_reply is not None and explainer.describe_run is not None:
            return _strict_json({"ok": True, "params": params.as_dict(),
                               "data": {"texts": {"run_result": explainer.describe_run(params, run_reply)}}})
        if frame is not None and explainer.frame_data is not None:
            data = explainer.frame_data(params, int(frame))
        else:
            data = explainer.page_data(params)
        return _strict_json({"ok": True, "params": params.as_dict(), "data": pack_columns(data) if packed else data})
    except ParamError as err:
        return json.dumps({"ok": False, "field": err.field, "message": str(err)})
    except Exception as err:  # a model bug: say so plainly, keep the page alive
        return json.dumps({"ok": False, "field": None, "message": f"The model failed: {type(err).__name__}: {err}"})
