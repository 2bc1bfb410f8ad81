"""The heavy endpoints: /api/v1/kernels/{name} runs a real kernel, /api/v1/jobs/{id} reports progress.

A request that is cached answers at once. One that would cost more than the limit is refused with a
message naming the limit. Otherwise it is queued; if it finishes within a couple of seconds the
answer comes back directly, else the reply is 202 with a job to poll. A full queue is a 503 with
Retry-After, and a client that already holds its share of the queue gets 429 with Retry-After. Each job
runs in a process of its own (kvx.compute.jobs); the handlers are async and wait for a job without holding
a thread, so a queue of heavy requests never starves the cheap endpoints of threads or of the GIL.
`wall_seconds` is how long the job ran (for a cached answer, the run that computed it), not how long
this request waited.
"""

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from kvx.compute.jobs import (DIED, FAILED, JOB_THREADS, OUT_OF_MEMORY, TIMEOUT, UNAVAILABLE, ClientBusy, JobRunner,
                              QueueFull)
from kvx.compute.kernel_specs import KERNELS, Kernel, envelope, memory_refusal
from kvx.compute.responses import FiniteJSONResponse as JSONResponse
from kvx.compute.security import short

router = APIRouter(tags=["kernels"])
SYNC_WAIT_S = 2.0
RETRY_AFTER_S = 5
# What a failed job answers: the job's own fault is a 422 (ask for less), and so is a kernel that raised on
# valid input (a bug to report: retrying will not help, and the server is fine); the server's state is a
# 503 with Retry-After (out of memory, a worker process that died, a missing checkpoint).
ERROR_STATUS = {TIMEOUT: 422, FAILED: 422, UNAVAILABLE: 503, OUT_OF_MEMORY: 503, DIED: 503}
ERROR_TYPE = {TIMEOUT: "too_slow", FAILED: "kernel_failed"}

RESPONSES = {
    202: {"description": "Still running after two seconds: poll `status_url` (`/api/v1/jobs/{id}`) for progress."},
    413: {"description": "The request body is over the server's limit."},
    422: {"description": "A bad value (a sentence naming the field, its range and the value), a request over the "
                         "cost limit (naming the limit), or a job that ran past the time limit."},
    429: {"description": "This client already holds its share of the kernel queue (with Retry-After)."},
    503: {"description": "The queue is full, the job ran out of memory or its worker died (with Retry-After), or "
                         "this server cannot run the kernel."},
}


def runner(request: Request) -> JobRunner:
    return request.app.state.jobs


def _answer(jobs: JobRunner, kernel: str, params: dict, result: dict, cached: bool, seconds: float) -> dict:
    answer = envelope(kernel, params, result, cached, seconds)
    if jobs.processes:                  # the job ran in a process of its own, with the threads it reports
        answer["threads"] = result.get("threads", JOB_THREADS) if isinstance(result, dict) else JOB_THREADS
    return answer


def _job_reply(jobs: JobRunner, job) -> JSONResponse:
    if job.status == "done":
        return JSONResponse(_answer(jobs, job.kernel, job.params, job.result, False, job.seconds))
    if job.status == "error":
        code = ERROR_STATUS.get(job.error, 503)
        headers = {"Retry-After": str(RETRY_AFTER_S)} if code == 503 else None
        # A 422 reads like every other 422 (a list of sentences, here about the body as a whole).
        detail = [{"loc": ["body"], "msg": job.message, "type": ERROR_TYPE.get(job.error, "failed")}] \
            if code == 422 else job.message
        return JSONResponse(status_code=code, headers=headers,
                            content={"detail": detail, "job": job.id, "status": "error"})
    return JSONResponse(status_code=202, content={**job.view(), "position": jobs.ahead(job),
                                                  "status_url": f"/api/v1/jobs/{job.id}"})


def run_job(name: str, params: dict, progress) -> dict:
    """One kernel job in a reused job process (jobs.JobRunner's worker_fn): the request rebuilt from its
    validated parameters. Reuse also keeps what a process measures once (the copy bandwidth) between jobs."""
    k = KERNELS[name]
    return k.run(k.request(**params), progress)


def _add_route(k: Kernel) -> None:
    Body = k.request

    async def run(request: Request, body: Body = None) -> JSONResponse:  # type: ignore[valid-type]
        body = body if body is not None else Body()
        params = body.model_dump()
        jobs = runner(request)
        hit = jobs.cached_with_seconds(k.name, params)
        if hit is not None:
            return JSONResponse(_answer(jobs, k.name, params, hit[0], True, hit[1]))
        limit = request.app.state.settings.kernel_max_work
        cost = await run_in_threadpool(k.cost, body)     # the first MLA estimate loads a checkpoint
        if cost > limit:
            return JSONResponse(status_code=422, content={"detail": [{
                "loc": ["body"], "type": "too_expensive",
                "msg": f"This request would cost about {cost:.2g} FLOP; the server's limit is {limit:.2g} per "
                       f"request. Ask for less (a shorter context, a smaller batch, fewer sequences or repeats)."}]})
        too_big = await run_in_threadpool(memory_refusal, k, body, request.app.state.settings.kernel_max_bytes)
        if too_big:
            return JSONResponse(status_code=422, content={"detail": [{"loc": ["body"], "type": "too_much_memory",
                                                                      "msg": too_big}]})
        try:
            job = jobs.submit(k.name, params, lambda p, progress: KERNELS[k.name].run(body, progress),
                              client=request.client.host if request.client else None, cost=cost)
        except QueueFull:
            return JSONResponse(status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)},
                                content={"detail": "The kernel queue is full; try again in a few seconds."})
        except ClientBusy:
            return JSONResponse(status_code=429, headers={"Retry-After": str(RETRY_AFTER_S)},
                                content={"detail": f"You already have {jobs.per_client} kernel jobs waiting or "
                                                   f"running on this server; wait for them, then try again."})
        return _job_reply(jobs, await jobs.wait_async(job, SYNC_WAIT_S))

    router.add_api_route(f"/kernels/{k.name}", run, methods=["POST"], summary=k.summary, name=f"kernel-{k.name}",
                         responses=RESPONSES)


for _kernel in KERNELS.values():
    _add_route(_kernel)


@router.get("/kernels", summary="The kernels, with their request schemas")
def list_kernels() -> list[dict]:
    return [{"name": k.name, "summary": k.summary, "schema": k.request.model_json_schema()} for k in KERNELS.values()]


@router.get("/jobs/{job_id}", summary="A kernel job's status, progress and, when done, its result",
            responses={404: {"description": "No such job (jobs are forgotten a while after they finish)."},
                       **{code: RESPONSES[code] for code in (202, 422, 503)}})
def job_status(job_id: str, request: Request) -> JSONResponse:
    jobs = runner(request)
    job = jobs.get(job_id)
    if job is None:
        return JSONResponse(status_code=404, content={"detail": f"There is no job {short(job_id)}; jobs are kept "
                                                                f"for a while after they finish, then forgotten."})
    return _job_reply(jobs, job)
