"""Job control for the heavy endpoints: a bounded queue, one worker pool, a result cache, progress.

Every kernel request is a pure function of its validated parameters, so results are cached by them.
At most `workers` jobs run at once and at most `queue` wait; beyond that the server answers 503 with
Retry-After instead of piling work up. A job that runs past its time limit is stopped at its next
progress report and fails with a message saying so; other jobs are unaffected.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import threading
import time
import uuid
from typing import Callable


class QueueFull(Exception):
    pass


class JobTimeout(Exception):
    pass


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
    finished: float | None = None

    def view(self) -> dict:
        return {"job": self.id, "kernel": self.kernel, "status": self.status, "progress": round(self.progress, 3),
                "message": self.message, "result": self.result}


class JobRunner:
    def __init__(self, workers: int = 1, queue: int = 4, cache_size: int = 128, time_limit_s: float = 300.0):
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvx-kernel")
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
        return sum(j.status in ("queued", "running") for j in self.jobs.values())

    def submit(self, kernel: str, params: dict, fn: Callable[[dict, Callable[[float, str], None]], dict]) -> Job:
        with self.lock:
            if self.active() >= self.capacity:
                raise QueueFull()
            job = Job(uuid.uuid4().hex[:12], kernel, params)
            self.jobs[job.id] = job
            self._forget_old()
        self.pool.submit(self._run, job, fn)
        return job

    def _forget_old(self, keep: int = 256) -> None:
        done = [j for j in self.jobs.values() if j.status in ("done", "error")]
        for j in done[: max(0, len(done) - keep)]:
            del self.jobs[j.id]

    def _run(self, job: Job, fn) -> None:
        job.status, job.started = "running", time.monotonic()

        def progress(fraction: float, message: str = "") -> None:
            if time.monotonic() - job.started > self.time_limit_s:
                raise JobTimeout(f"The job ran past the server's limit of {self.time_limit_s:g} s and was stopped.")
            job.progress, job.message = max(job.progress, min(1.0, fraction)), message

        try:
            result = fn(job.params, progress)
        except JobTimeout as err:
            job.status, job.message = "error", str(err)
        except Exception as err:   # a kernel bug fails this job only, with a plain message
            job.status, job.message = "error", f"The kernel failed: {type(err).__name__}: {err}"
        else:
            job.result, job.status, job.progress = result, "done", 1.0
            with self.lock:
                self.cache[self.key(job.kernel, job.params)] = result
                while len(self.cache) > self.cache_size:
                    self.cache.popitem(last=False)
        job.finished = time.monotonic()

    def wait(self, job: Job, seconds: float) -> Job:
        deadline = time.monotonic() + seconds
        while job.status in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.01)
        return job

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)


Progress = Callable[[float, str], None]
