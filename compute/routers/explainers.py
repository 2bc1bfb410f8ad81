"""Evaluate any registered explainer model on the server, with the same validation as everywhere else.

Each explainer gets its own POST route and request model, so /docs shows its parameters with units
and bounds. The bounds are enforced by the explainer's own parameter dataclass, so the message for
a bad value is the same sentence the CLI and the page show. A model is a pure function of its
parameters, so answers are cached by them (bounded in bytes): the defaults every page load asks for
cost nothing and never leave the event loop.

An answer that is not cached is a job (kvx.compute.jobs): it runs in a process of its own, so a slow
model never holds a thread or the GIL that health checks, static files and cached answers need. Each
has a cost estimate (the slowest of that model's recent runs), a time limit and a bounded queue; past
them the answer is 503 with Retry-After (busy), 429 (this client holds its share, or has asked for more new
answers than its rate) or 422 (this request ran past the limit: ask for less). A model that raises on valid
input is a 422 naming the exception, never a 500: the request cannot be answered, and the server and the
connection carry on.
"""

import collections
import hashlib
import math
import time
from typing import Optional, Union

from limits import parse as parse_rate
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictStr, create_model

from kvx.compute.jobs import DIED, FAILED, OUT_OF_MEMORY, TIMEOUT, UNAVAILABLE, ClientBusy, JobRunner, QueueFull
from kvx.compute.security import short
from kvx.explainers.core.params import ParamError
from kvx.explainers.registry import REGISTRY, Explainer, run

router = APIRouter(prefix="/explainers", tags=["explainers"])
RETRY_AFTER_S = 5
PARAM_ERROR = "__param_error__"          # a job's answer that is a ParamError, not a result
UPLOAD_HELP = {"trace": "A Mooncake-format trace as JSONL text, one request per line (timestamp in ms, input_length, "
                        "output_length, hash_ids of 512-token blocks); at most 50,000,000 bytes, 100,000 requests "
                        "and 5,000,000 hash ids. Empty: the model's own synthetic trace."}


def request_model(e: Explainer) -> type[BaseModel]:
    fields = {}
    for spec in e.params.describe():
        extra = {key: spec[k] for k, key in (("unit", "unit"), ("min", "minimum"), ("max", "maximum"))
                 if spec[k] not in (None, "")}
        if spec["choices"]:
            extra["examples"] = spec["choices"][:3]
        # Strict: JSON true/false is not a number here (pydantic would quietly read it as 1 or 0).
        fields[spec["name"]] = (Optional[Union[StrictFloat, StrictStr]],
                                Field(default=None, description=spec["help"], json_schema_extra=extra))
    for upload in e.uploads:         # data the model reads (a trace), as text; the model checks it line by line
        fields[upload] = (Optional[StrictStr], Field(default=None, description=UPLOAD_HELP[upload]))
    name = "".join(part.capitalize() for part in e.slug.split("-")) + "Request"
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields)


class CostEstimate:
    """Seconds one evaluation of a model is expected to take: the slowest of its last few runs (a prior of
    0.5 s before any). The models are plain Python with no cost formula; their recent runs are the estimate."""

    def __init__(self, prior_s: float = 0.5, window: int = 8):
        self.prior_s, self.runs = prior_s, collections.defaultdict(lambda: collections.deque(maxlen=window))

    def __call__(self, slug: str) -> float:
        runs = self.runs.get(slug)
        return max(runs) if runs else self.prior_s

    def record(self, slug: str, seconds: float | None) -> None:
        if seconds is not None:
            self.runs[slug].append(seconds)


def evaluations(request_or_app) -> JobRunner:
    """This app's evaluation jobs and their cache (one per app: tests and apps never share answers)."""
    state = (request_or_app.app if isinstance(request_or_app, Request) else request_or_app).state
    if getattr(state, "evaluations", None) is None:
        s = state.settings
        state.evaluations = JobRunner(s.explainer_workers, s.explainer_queue, cache_size=1024,
                                      time_limit_s=s.explainer_time_limit_s, cache_bytes=s.cache_bytes,
                                      per_client=s.explainer_per_client, queue_cost=s.explainer_queue_seconds,
                                      memory_bytes=s.job_memory_bytes, what="model", worker_fn=_evaluate)
        state.explainer_costs = CostEstimate()
    return state.evaluations


class NewEvaluations:
    """How many new (uncached) evaluations each client address has asked for lately: at most
    `explainer_rate_per_client` in a moving window. Cached answers are not counted: they cost the server no job.
    A client asking for distinct answers as fast as it can kept the server's one event loop busy with them (8
    at a time, about 500 a second) and a health check waited behind them."""

    def __init__(self, rate: str):
        self.rate = parse_rate(rate)
        self.limiter = MovingWindowRateLimiter(MemoryStorage())

    def wait_s(self, client: str | None) -> int:
        """0 if this client may have another new evaluation now (it is counted), else the whole seconds until
        it may."""
        key = client or "unknown"
        if self.limiter.hit(self.rate, "new-evaluations", key):
            return 0
        reset = self.limiter.get_window_stats(self.rate, "new-evaluations", key).reset_time
        return max(1, math.ceil(reset - time.time()))


def new_evaluations(request: Request) -> NewEvaluations:
    state = request.app.state
    if getattr(state, "new_evaluations", None) is None:
        state.new_evaluations = NewEvaluations(state.settings.explainer_rate_per_client)
    return state.new_evaluations


def trace_evaluations(request: Request) -> JobRunner:
    """Evaluations of an uploaded trace: one at a time, each with the longer time limit a big trace needs."""
    state = request.app.state
    if getattr(state, "trace_evaluations", None) is None:
        s = state.settings
        state.trace_evaluations = JobRunner(1, 2, cache_size=64, time_limit_s=s.explainer_trace_time_limit_s,
                                            cache_bytes=s.cache_bytes, per_client=1, memory_bytes=s.job_memory_bytes,
                                            what="trace")
    return state.trace_evaluations


def unprocessable(field: str, message: str, kind: str = "value_error") -> JSONResponse:
    return JSONResponse(status_code=422, content={"detail": [{"loc": ["body", field] if field != "body" else ["body"],
                                                              "msg": message, "type": kind}]})


def busy(status: int, detail: str, retry_after_s: int = RETRY_AFTER_S) -> JSONResponse:
    return JSONResponse(status_code=status, headers={"Retry-After": str(retry_after_s)}, content={"detail": detail})


def _evaluate(slug: str, values: dict, progress) -> dict:
    """One evaluation in a reused job process (jobs.JobRunner's worker_fn): a fork per cheap evaluation would
    cost the server more than the evaluation (about 25 ms holding the GIL, then copy-on-write faults)."""
    return _evaluate_in_job(slug)(values, progress)


def _evaluate_in_job(slug: str, data: dict | None = None):
    def job(values: dict, progress) -> dict:      # runs in the job's own process
        try:
            if data:                              # the uploaded text, in place of its digest
                values = {**{k: v for k, v in values.items() if not k.endswith("_sha256")}, **data}
            return run(slug, values)
        except ParamError as err:                 # a bad value found while evaluating: the caller's 422
            return {PARAM_ERROR: [err.field, str(err)]}
    return job


def _answer(slug: str, answer: dict):
    if PARAM_ERROR in answer:
        field, message = answer[PARAM_ERROR]
        return unprocessable(field, message if len(message) <= 400 else message[:400] + "…")
    return answer


def _failed(slug: str, job, limits) -> JSONResponse:
    if job.error == TIMEOUT:
        return unprocessable("body", f"Evaluating {slug} with these parameters ran past the server's limit of "
                                     f"{limits.time_limit_s:g} s and was stopped. Ask for less (a smaller "
                                     f"simulation), or run it in the page or with `kvx run`, which have no limit.",
                             "too_slow")
    if job.error in (OUT_OF_MEMORY, DIED, UNAVAILABLE):
        return busy(503, job.message)
    # FAILED: the model raised on valid input. Not the server's state, and not worth a retry.
    return unprocessable("body", f"The {slug} model could not evaluate these parameters "
                                 f"({job.message.removeprefix('The model failed: ')}). This is a bug in the model; "
                                 f"please report it with the parameters.", "model_failed")


@router.get("", summary="Every explainer with its parameters (name, default, bounds, unit, help)")
def list_explainers() -> list[dict]:
    return [e.describe() for e in REGISTRY.values()]


def _add_route(e: Explainer) -> None:
    Body = request_model(e)

    async def evaluate(request: Request, body: Body = None):  # type: ignore[valid-type]
        values = body.model_dump(exclude_none=True) if body is not None else {}
        # An upload (a trace of up to 50 MB) is data: jobs and the answer cache key it by its SHA-256, and it
        # gets the time an upload needs (a 100,000-request replay is about a minute of CPU).
        data = {f"_{n}": values.pop(n) for n in e.uploads if n in values}
        values.update({f"{k}_sha256": hashlib.sha256(v.encode()).hexdigest() for k, v in data.items()})
        jobs = trace_evaluations(request) if data else evaluations(request)
        hit = jobs.cached(e.slug, values)          # a cached answer costs no thread hop and no process
        if hit is not None:
            return _answer(e.slug, hit)
        settings, costs = request.app.state.settings, request.app.state.explainer_costs
        client = request.client.host if request.client else None
        wait_s = new_evaluations(request).wait_s(client)
        if wait_s:
            return busy(429, f"You have asked this server for more than {settings.explainer_rate_per_client} "
                             f"evaluations it had not already answered; try again in {wait_s} s. (Answers it "
                             f"has given before are not limited.)", wait_s)
        try:
            job = jobs.submit(e.slug, values, _evaluate_in_job(e.slug, data), client=client, cost=costs(e.slug))
        except QueueFull:
            return busy(503, "The server is busy evaluating other models; try again in a few seconds.")
        except ClientBusy:
            return busy(429, f"You already have {jobs.per_client} evaluations waiting or running on this server; "
                             f"wait for them, then try again.")
        wait = settings.explainer_trace_time_limit_s if data else settings.explainer_wait_s
        job = await jobs.wait_async(job, wait)
        if job.finished is not None:
            costs.record(e.slug, job.seconds)
        if job.status == "done":
            return _answer(e.slug, job.result)
        if job.status == "error":
            return _failed(e.slug, job, jobs)
        return busy(503, f"The answer is still being computed after {wait:g} s; ask again "
                         f"shortly (it will be kept).")

    router.add_api_route(f"/{e.slug}", evaluate, methods=["POST"], summary=e.title,
                         description=f"{e.claim}\n\nReturns the model's named results.", name=f"evaluate-{e.slug}",
                         responses={413: {"description": "The request body is over the server's limit."},
                                    422: {"description": "A bad value (a sentence naming the field), a request that "
                                                         "ran past the time limit, or a model that failed on it."},
                                    429: {"description": "This client already holds its share of the queue, or "
                                                         "has asked for too many new evaluations lately (with "
                                                         "Retry-After)."},
                                    503: {"description": "Busy, or out of memory (with Retry-After)."}})


for _explainer in REGISTRY.values():
    _add_route(_explainer)


@router.post("/{slug}", include_in_schema=False)
def unknown(slug: str):
    raise HTTPException(status_code=404, detail=f"There is no explainer {short(slug)}; the explainers are "
                                                f"{', '.join(REGISTRY)}.")
