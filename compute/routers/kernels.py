"""The heavy endpoints: /api/v1/kernels/{name} runs a real kernel, /api/v1/jobs/{id} reports progress.

A request that is cached answers at once. One that would cost more than the limit is refused with a
message naming the limit. Otherwise it is queued; if it finishes within a couple of seconds the
answer comes back directly, else the reply is 202 with a job to poll. A full queue is a 503 with
Retry-After.
"""
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from kvx.compute.jobs import JobRunner, QueueFull
from kvx.compute.kernel_specs import KERNELS, MAX_WORK, Kernel, envelope

router = APIRouter(tags=["kernels"])
SYNC_WAIT_S = 2.0


def runner(request: Request) -> JobRunner:
    return request.app.state.jobs


def _job_reply(job, started: float) -> JSONResponse:
    if job.status == "done":
        return JSONResponse(envelope(job.kernel, job.params, job.result, False, time.perf_counter() - started))
    if job.status == "error":
        code = 422 if "must be" in job.message else 503 if "not in" in job.message else 500
        return JSONResponse(status_code=code, content={"detail": job.message, "job": job.id})
    return JSONResponse(status_code=202, content={**job.view(), "status_url": f"/api/v1/jobs/{job.id}"})


def _add_route(k: Kernel) -> None:
    Body = k.request

    def run(request: Request, body: Body = None) -> JSONResponse:  # type: ignore[valid-type]
        started = time.perf_counter()
        body = body if body is not None else Body()
        params = body.model_dump()
        jobs = runner(request)
        hit = jobs.cached(k.name, params)
        if hit is not None:
            return JSONResponse(envelope(k.name, params, hit, True, time.perf_counter() - started))
        cost = k.cost(body)
        if cost > MAX_WORK:
            return JSONResponse(status_code=422, content={"detail": [{
                "loc": ["body"], "type": "too_expensive",
                "msg": f"This request would cost about {cost:.2g} FLOP; the server's limit is {MAX_WORK:.2g} per "
                       f"request. Ask for less (a shorter context, a smaller batch, fewer sequences or repeats)."}]})
        try:
            job = jobs.submit(k.name, params, lambda p, progress: k.run(Body(**p), progress))
        except QueueFull:
            return JSONResponse(status_code=503, headers={"Retry-After": "5"},
                                content={"detail": "The kernel queue is full; try again in a few seconds."})
        return _job_reply(jobs.wait(job, SYNC_WAIT_S), started)

    router.add_api_route(f"/kernels/{k.name}", run, methods=["POST"], summary=k.summary, name=f"kernel-{k.name}")


for _kernel in KERNELS.values():
    _add_route(_kernel)


@router.get("/kernels", summary="The kernels, with their request schemas")
def list_kernels() -> list[dict]:
    return [{"name": k.name, "summary": k.summary, "schema": k.request.model_json_schema()} for k in KERNELS.values()]


@router.get("/jobs/{job_id}", summary="A kernel job's status, progress and, when done, its result")
def job_status(job_id: str, request: Request) -> JSONResponse:
    job = runner(request).get(job_id)
    if job is None:
        return JSONResponse(status_code=404, content={"detail": f"There is no job {job_id!r}; jobs are kept for a while "
                                                                f"after they finish, then forgotten."})
    return _job_reply(job, time.perf_counter())
