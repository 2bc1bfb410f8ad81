"""The heavy endpoints: /api/v1/kernels/{name} runs a real kernel, /api/v1/jobs/{id} reports progress.

A request that is cached answers at once. One that would cost more than the limit is refused with a
message naming the limit. Otherwise it is queued; if it finishes within a couple of seconds the
answer comes back directly, else the reply is 202 with a job to poll. A full queue is a 503 with
Retry-After. The handlers are async and wait for a job without holding a thread, so a queue of heavy
requests never starves the cheap endpoints of threads.
"""
import time

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from kvx.compute.jobs import FAILED, OUT_OF_MEMORY, TIMEOUT, UNAVAILABLE, JobRunner, QueueFull
from kvx.compute.kernel_specs import KERNELS, Kernel, envelope
from kvx.compute.responses import FiniteJSONResponse as JSONResponse

router = APIRouter(tags=["kernels"])
SYNC_WAIT_S = 2.0
RETRY_AFTER_S = 5
# What a failed job answers: the job's own fault is a 422 (ask for less); the server's state a 503 to retry.
ERROR_STATUS = {TIMEOUT: 422, UNAVAILABLE: 503, OUT_OF_MEMORY: 503, FAILED: 500}

RESPONSES = {
    202: {"description": "Still running after two seconds: poll `status_url` (`/api/v1/jobs/{id}`) for progress."},
    413: {"description": "The request body is over the server's limit."},
    422: {"description": "A bad value (a sentence naming the field, its range and the value), a request over the "
                         "cost limit (naming the limit), or a job that ran past the time limit."},
    500: {"description": "The kernel failed on this request (a bug); other requests are unaffected."},
    503: {"description": "The queue is full (with Retry-After), or this server cannot run the kernel."},
}


def runner(request: Request) -> JobRunner:
    return request.app.state.jobs


def _job_reply(job, started: float) -> JSONResponse:
    if job.status == "done":
        return JSONResponse(envelope(job.kernel, job.params, job.result, False, time.perf_counter() - started))
    if job.status == "error":
        code = ERROR_STATUS.get(job.error, 500)
        headers = {"Retry-After": str(RETRY_AFTER_S)} if job.error == OUT_OF_MEMORY else None
        # A 422 reads like every other 422 (a list of sentences, here about the body as a whole).
        detail = [{"loc": ["body"], "msg": job.message, "type": "too_slow"}] if code == 422 else job.message
        return JSONResponse(status_code=code, headers=headers,
                            content={"detail": detail, "job": job.id, "status": "error"})
    return JSONResponse(status_code=202, content={**job.view(), "status_url": f"/api/v1/jobs/{job.id}"})


def _add_route(k: Kernel) -> None:
    Body = k.request

    async def run(request: Request, body: Body = None) -> JSONResponse:  # type: ignore[valid-type]
        started = time.perf_counter()
        body = body if body is not None else Body()
        params = body.model_dump()
        jobs = runner(request)
        hit = jobs.cached(k.name, params)
        if hit is not None:
            return JSONResponse(envelope(k.name, params, hit, True, time.perf_counter() - started))
        limit = request.app.state.settings.kernel_max_work
        cost = await run_in_threadpool(k.cost, body)     # the first MLA estimate loads a checkpoint
        if cost > limit:
            return JSONResponse(status_code=422, content={"detail": [{
                "loc": ["body"], "type": "too_expensive",
                "msg": f"This request would cost about {cost:.2g} FLOP; the server's limit is {limit:.2g} per "
                       f"request. Ask for less (a shorter context, a smaller batch, fewer sequences or repeats)."}]})
        try:
            job = jobs.submit(k.name, params, lambda p, progress: KERNELS[k.name].run(body, progress))
        except QueueFull:
            return JSONResponse(status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)},
                                content={"detail": "The kernel queue is full; try again in a few seconds."})
        return _job_reply(await jobs.wait_async(job, SYNC_WAIT_S), started)

    router.add_api_route(f"/kernels/{k.name}", run, methods=["POST"], summary=k.summary, name=f"kernel-{k.name}",
                         responses=RESPONSES)


for _kernel in KERNELS.values():
    _add_route(_kernel)


@router.get("/kernels", summary="The kernels, with their request schemas")
def list_kernels() -> list[dict]:
    return [{"name": k.name, "summary": k.summary, "schema": k.request.model_json_schema()} for k in KERNELS.values()]


@router.get("/jobs/{job_id}", summary="A kernel job's status, progress and, when done, its result",
            responses={404: {"description": "No such job (jobs are forgotten a while after they finish)."},
                       **{code: RESPONSES[code] for code in (202, 422, 500, 503)}})
def job_status(job_id: str, request: Request) -> JSONResponse:
    job = runner(request).get(job_id)
    if job is None:
        return JSONResponse(status_code=404, content={"detail": f"There is no job {job_id!r}; jobs are kept for a "
                                                                f"while after they finish, then forgotten."})
    return _job_reply(job, time.perf_counter())
