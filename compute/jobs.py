"""Job control for the heavy endpoints: a bounded queue, one worker pool, a result cache, progress.

Every kernel request is a pure function of its validated parameters, so results are cached by them, and
a request identical to one already queued or running joins that job instead of queuing another. At most
`workers` jobs run at once and at most `queue` wait; beyond that the server answers 503 with Retry-After
instead of piling work up. A job that runs past its time limit fails with a message saying so as soon as
anyone asks about it; the kernel itself is stopped at its next progress report (a thread cannot be killed),
and until it stops it still counts against the queue, so the bound stays honest. Other jobs are unaffected.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import json
import os
import threading
import time
import uuid
from typing import Callable


class QueueFull(Exception):
    pass


class JobTimeout(Exception):
    pass


# Why a job failed, and so what its requester is told (see routers/kernels.py for the HTTP status of each).
TIMEOUT, UNAVAILABLE, OUT_OF_MEMORY, FAILED = "timeout", "unavailable", "out_of_memory", "failed"


@dataclasses.dataclass
class Job:
    id: str
    kernel: str
    params: dict
    status: str = "queued"          # queued, running, done, error
    progress: float = 0.0
    message: str = ""
    result: dict | None = None
    started: float | None = None
    finished: float | None = None   # when its thread let go of the worker (None while queued or running)
    error: str = ""                 # TIMEOUT, UNAVAILABLE, OUT_OF_MEMORY or FAILED once status is "error"
    future: concurrent.futures.Future | None = dataclasses.field(default=None, repr=False)

    def view(self) -> dict:
        return {"job": self.id, "kernel": self.kernel, "status": self.status, "progress": round(self.progress, 3),
                "message": self.message, "result": self.result}


def _classify(err: BaseException) -> tuple[str, str]:
    """(kind, message) for an exception a kernel raised; plain words, never a traceback."""
    if isinstance(err, JobTimeout):
        return TIMEOUT, str(err)
    if isinstance(err, FileNotFoundError):          # a trained model is missing on this server
        return UNAVAILABLE, f"This server cannot run it: {err}"
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError" or "out of memory" in str(err):
        return OUT_OF_MEMORY, "The server ran out of memory for this job; try again later or ask for less."
    return FAILED, f"The kernel failed: {type(err).__name__}: {err}"


def _lower_priority() -> None:
    """Kernel threads yield the CPU to the threads answering requests (Linux nices threads one by one)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):      # not Linux, or not allowed: run at the normal priority
        pass


class JobRunner:
    def __init__(self, workers: int = 1, queue: int = 4, cache_size: int = 128, time_limit_s: float = 300.0):
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvx-kernel",
                                                          initializer=_lower_priority)
        self.capacity = workers + queue
        self.time_limit_s = time_limit_s
        self.cache: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self.cache_size = cache_size
        self.jobs: dict[str, Job] = {}
        self.lock = threading.Lock()

    @staticmethod
    def key(kernel: str, params: dict) -> str:
        return kernel + ":" + json.dumps(params, sort_keys=True)

    def cached(self, kernel: str, params: dict) -> dict | None:
        with self.lock:
            k = self.key(kernel, params)
            if k in self.cache:
                self.cache.move_to_end(k)
                return self.cache[k]
        return None

    def active(self) -> int:
        """Jobs that hold or wait for a worker: queued, running, or timed out but not yet stopped."""
        return sum(j.finished is None for j in list(self.jobs.values()))

    def submit(self, kernel: str, params: dict, fn: Callable[[dict, Callable[[float, str], None]], dict]) -> Job:
        with self.lock:
            for job in self.jobs.values():      # the same request already on its way: share it
                if job.finished is None and job.status in ("queued", "running") and job.kernel == kernel \
                        and job.params == params:
                    return job
            if self.active() >= self.capacity:
                raise QueueFull()
            job = Job(uuid.uuid4().hex[:12], kernel, params)
            self.jobs[job.id] = job
            self._forget_old()
            job.future = self.pool.submit(self._run, job, fn)
        return job

    def _forget_old(self, keep: int = 256) -> None:
        done = [j for j in self.jobs.values() if j.finished is not None]
        for j in done[: max(0, len(done) - keep)]:
            del self.jobs[j.id]

    def _run(self, job: Job, fn) -> None:
        job.status, job.started = "running", time.monotonic()

        def progress(fraction: float, message: str = "") -> None:
            if self._expire(job):
                raise JobTimeout(job.message)
            job.progress, job.message = max(job.progress, min(1.0, fraction)), message

        try:
            result = fn(job.params, progress)
            if self._expire(job):                       # it finished, but too late: its requester was told so
                raise JobTimeout(job.message)
        except Exception as err:   # a kernel bug fails this job only, with a plain message
            if job.status != "error":
                job.error, job.message = _classify(err)
                job.status = "error"
        else:
            job.result, job.progress = result, 1.0
            with self.lock:
                self.cache[self.key(job.kernel, job.params)] = result
                while len(self.cache) > self.cache_size:
                    self.cache.popitem(last=False)
            job.status = "done"
        finally:
            job.finished = time.monotonic()

    def _expire(self, job: Job) -> bool:
        """Fail a running job that is past its time limit. True if it has timed out."""
        if job.status == "running" and job.started is not None \
                and time.monotonic() - job.started > self.time_limit_s:
            job.error, job.status = TIMEOUT, "error"
            job.message = (f"The job ran past the server's limit of {self.time_limit_s:g} s and was stopped. "
                           f"Ask for less (a shorter context, a smaller batch, fewer sequences or repeats).")
        return job.status == "error" and job.error == TIMEOUT

    def wait(self, job: Job, seconds: float) -> Job:
        deadline = time.monotonic() + seconds
        while job.status in ("queued", "running") and time.monotonic() < deadline:
            self._expire(job)
            time.sleep(0.01)
        return job

    async def wait_async(self, job: Job, seconds: float) -> Job:
        """Wait without holding a thread: the event loop keeps answering other requests meanwhile."""
        loop, finished = asyncio.get_running_loop(), asyncio.Event()

        def wake(_future) -> None:           # runs in the worker thread; never touches the job itself
            try:
                loop.call_soon_threadsafe(finished.set)
            except RuntimeError:             # that event loop has closed: nobody is waiting any more
                pass

        if job.future is not None:
            job.future.add_done_callback(wake)
        deadline = time.monotonic() + seconds
        while job.status in ("queued", "running") and not self._expire(job):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:                             # wake when the job ends, or every 0.1 s to check its time limit
                await asyncio.wait_for(finished.wait(), timeout=min(left, 0.1))
            except asyncio.TimeoutError:
                pass
        return job

    def get(self, job_id: str) -> Job | None:
        job = self.jobs.get(job_id)
        if job is not None:
            self._expire(job)
        return job


Progress = Callable[[float, str], None]
