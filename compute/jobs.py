"""Job control for the heavy work: bounded queues, one process per running job, a byte-bounded result cache.

Every job (a kernel, or an explainer evaluation that is not cached) is a pure function of its validated
parameters, so results are cached by them, and a request identical to one already queued or running joins
that job instead of queuing another. At most `workers` jobs run at once and at most `queue` wait; beyond
that the server answers 503 with Retry-After instead of piling work up. One client (by address) may hold at
most `per_client` of those places (429 with Retry-After beyond). Each job has a cost estimate: queued and
running work together may not exceed `queue_cost` (in the estimate's own unit), so a few expensive jobs
fill the queue as many cheap ones would.

Each job runs in a process of its own, forked when it starts: it cannot take the GIL from the threads that
answer health checks, static files and cached answers; it runs at nice +10 with a ceiling on its address
space, so a memory-hungry job fails alone (MemoryError) instead of the machine's OOM killer choosing; a job
past its time limit is killed at the limit (SIGKILL: the CPU is free at once); and a worker that crashes or is
killed costs only its own job (503 with Retry-After) — the next job gets a fresh process. Forking per job
also means a job sees the server's code as it is at that moment, and nothing a job does survives it.
On a CUDA device the processes are spawned instead (start="spawn": a fresh interpreter that imports the kernels
and makes its own CUDA context, which a forked child cannot use); they are reused the same way, so only a
worker's first job pays for its start.
The child sends its progress and result back as JSON over a pipe (no pickles), and a thread per running
job waits on that pipe without holding the GIL.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import json
import math
import multiprocessing
import os
import resource
import signal
import stat
import sys
import threading
import time
import uuid
import warnings
from typing import Callable

# The server forks a job process while its other threads run; each child only runs the job and exits, and
# Python holds its own locks across the fork, so the general warning does not apply here.
warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks", category=DeprecationWarning)


class QueueFull(Exception):
    pass


class ClientBusy(Exception):
    """This client already holds its share of the queue."""


class JobTimeout(Exception):
    pass


# Why a job failed, and so what its requester is told (see routers/kernels.py for the HTTP status of each).
TIMEOUT, UNAVAILABLE, OUT_OF_MEMORY, FAILED, DIED = "timeout", "unavailable", "out_of_memory", "failed", "died"
START_METHODS = ("fork", "spawn")
JOB_THREADS = 1        # PyTorch threads in a job's process (OpenMP's thread team does not survive a fork)


@dataclasses.dataclass
class Job:
    id: str
    kernel: str
    params: dict
    client: str | None = None
    cost: float = 0.0
    status: str = "queued"          # queued, running, done, error
    progress: float = 0.0
    message: str = ""
    result: dict | None = None
    started: float | None = None
    finished: float | None = None   # when its process was gone (None while queued or running)
    error: str = ""                 # TIMEOUT, UNAVAILABLE, OUT_OF_MEMORY, FAILED or DIED once status is "error"
    pid: int | None = None          # the process running it, while it runs
    future: concurrent.futures.Future | None = dataclasses.field(default=None, repr=False)

    @property
    def seconds(self) -> float | None:
        """How long the job ran (not how long anyone waited for it, or when they asked)."""
        if self.started is None:
            return None
        return (self.finished if self.finished is not None else time.monotonic()) - self.started

    def view(self) -> dict:
        return {"job": self.id, "kernel": self.kernel, "status": self.status, "progress": round(self.progress, 3),
                "message": self.message, "result": self.result}


def _classify(err: BaseException, what: str = "kernel") -> tuple[str, str]:
    """(kind, message) for an exception a job raised; plain words, never a traceback."""
    if isinstance(err, JobTimeout):
        return TIMEOUT, str(err)
    if isinstance(err, FileNotFoundError):          # a trained model is missing on this server
        return UNAVAILABLE, f"This server cannot run it: {err}"
    text = str(err).lower()
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError" or "out of memory" in text \
            or "can't allocate memory" in text or "cannot allocate memory" in text or "bad_alloc" in text:
        return OUT_OF_MEMORY, "The server ran out of memory for this job; try again later or ask for less."
    return FAILED, f"The {what} failed: {type(err).__name__}: {str(err)[:300]}"


def _close_sockets(keep: int) -> None:
    """Close the server's sockets in the child: a connection the server closes must not live on in a job."""
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
        fd = int(name)
        try:
            if fd > 2 and fd != keep and stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)
        except OSError:
            pass


def _prepare_child(conn, memory_bytes: int | None) -> None:
    """In a job process: no server sockets, lower priority, a memory ceiling, one PyTorch thread."""
    _close_sockets(conn.fileno())
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 10)        # yield the CPU to the server's request threads
    except (AttributeError, OSError):
        pass
    if memory_bytes:
        try:                                            # the ceiling: what the process has now, plus the budget
            resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + memory_bytes, resource.RLIM_INFINITY))
        except (OSError, ValueError):
            pass
    if "torch" in sys.modules:                 # before any torch op: a parallel region after fork can hang
        sys.modules["torch"].set_num_threads(JOB_THREADS)


def _vm_bytes(field: int = 0) -> int:
    """This process's virtual size (field 0) or resident size (field 1), in bytes."""
    return int(open("/proc/self/statm").read().split()[field]) * os.sysconf("SC_PAGE_SIZE")


def _answer(conn, fn, args: tuple, what: str, after=lambda: {}) -> None:
    """Run one job and send its result or error as JSON (with what `after()` adds); progress goes the same way."""
    def send(message: dict) -> None:
        conn.send_bytes(json.dumps(message).encode())

    def progress(fraction: float, message: str = "") -> None:
        send({"progress": fraction, "message": message})

    try:
        result = fn(*args, progress)
        send({"result": result, **after()})
    except BaseException as err:       # everything, even SystemExit: the parent hears why
        try:
            kind, message = _classify(err, what)
            send({"error": kind, "message": message, **after()})
        except BaseException:
            pass


def _child(conn, fn, params: dict, memory_bytes: int | None, what: str) -> None:
    """A process forked for one job: the job, its answer, exit."""
    _prepare_child(conn, memory_bytes)
    try:
        _answer(conn, fn, (params,), what)
    finally:
        conn.close()
        os._exit(0)                    # no atexit handlers, no flushing of the parent's buffers


RETIRE_GROWTH_BYTES = 256 * 2 ** 20     # a reused worker that has grown this much since it started is replaced
IDLE_EXIT_S = 60.0                      # a reused worker with no job for this long exits (apps that are gone)
IDLE_REPLACE_S = 45.0                   # the server replaces one idle this long itself, so it never races the exit


def _worker(conn, worker_fn, memory_bytes: int | None, what: str) -> None:
    """A reused job process: jobs (name and parameters, as JSON) in, answers out, until told to stop or grown."""
    _prepare_child(conn, memory_bytes)
    start = _vm_bytes(1)

    def grown() -> bool:                  # Python keeps memory it freed: a worker that grew starts afresh
        return _vm_bytes(1) > start + RETIRE_GROWTH_BYTES

    try:
        while conn.poll(IDLE_EXIT_S):
            try:
                job = json.loads(conn.recv_bytes())
            except (EOFError, OSError):
                break
            _answer(conn, worker_fn, (job["name"], job["params"]), what,
                    after=lambda: {"retire": True} if grown() else {})
            if grown():
                break
    finally:
        conn.close()
        os._exit(0)


def _memory_budget() -> int | None:
    """Default address-space budget per job: half of the memory available when the server starts."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return None


class JobRunner:
    def __init__(self, workers: int = 1, queue: int = 4, cache_size: int = 128, time_limit_s: float = 300.0,
                 cache_bytes: int = 32 * 2 ** 20, per_client: int | None = None, queue_cost: float = math.inf,
                 memory_bytes: int | None = -1, what: str = "kernel", processes: bool = True,
                 worker_fn: Callable[[str, dict, Callable], dict] | None = None, start: str = "fork"):
        self.processes = processes      # False: jobs run in the waiting thread (no process isolation)
        if start not in START_METHODS:
            raise ValueError(f"start must be one of {', '.join(START_METHODS)}; got {start!r}.")
        if start == "spawn" and worker_fn is None:
            raise ValueError("start='spawn' needs a worker_fn: a spawned process gets jobs by name, not as functions.")
        self.context = multiprocessing.get_context(start)     # how job processes are started
        # With a worker_fn(name, params, progress), each waiting thread keeps one job process and reuses it
        # (replaced when it dies, is killed at a time limit, its job fails, or it has grown): no fork, and no
        # copy-on-write faults in the server, per job. Without one, each job gets a process forked for it.
        self.worker_fn, self.local = worker_fn, threading.local()
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"kvx-{what}")
        self.capacity = workers + queue
        self.per_client = per_client or self.capacity
        self.queue_cost = queue_cost
        self.time_limit_s = time_limit_s
        self.memory_bytes = _memory_budget() if memory_bytes == -1 else memory_bytes
        self.what = what
        self.cache: collections.OrderedDict[str, tuple[dict, float, int]] = collections.OrderedDict()
        self.cache_size, self.cache_bytes, self.cached_bytes = cache_size, cache_bytes, 0
        self.jobs: dict[str, Job] = {}
        self.lock = threading.Lock()
        self.deaths = 0                 # worker processes that died without answering (crash, OOM kill)

    @staticmethod
    def key(kernel: str, params: dict) -> str:
        return kernel + ":" + json.dumps(params, sort_keys=True)

    def cached(self, kernel: str, params: dict) -> dict | None:
        hit = self.cached_with_seconds(kernel, params)
        return None if hit is None else hit[0]

    def cached_with_seconds(self, kernel: str, params: dict) -> tuple[dict, float] | None:
        with self.lock:
            k = self.key(kernel, params)
            if k in self.cache:
                self.cache.move_to_end(k)
                result, seconds, _ = self.cache[k]
                return result, seconds
        return None

    def _remember(self, key: str, result: dict, seconds: float) -> None:
        """Keep a result, bounded by entries and by bytes (its JSON size); one too big is not kept."""
        size = len(json.dumps(result, default=str)) + len(key)
        if size > self.cache_bytes // 8:
            return
        with self.lock:
            if key in self.cache:
                self.cached_bytes -= self.cache.pop(key)[2]
            self.cache[key] = (result, seconds, size)
            self.cached_bytes += size
            while len(self.cache) > self.cache_size or self.cached_bytes > self.cache_bytes:
                self.cached_bytes -= self.cache.popitem(last=False)[1][2]

    def active(self) -> int:
        """Jobs that hold or wait for a worker: queued or running."""
        return sum(j.finished is None for j in list(self.jobs.values()))

    def submit(self, kernel: str, params: dict, fn: Callable[[dict, Callable[[float, str], None]], dict],
               client: str | None = None, cost: float = 0.0) -> Job:
        """Queue a job (or join the identical one on its way). QueueFull or ClientBusy if there is no room."""
        with self.lock:
            for job in self.jobs.values():      # the same request already on its way: share it
                if job.finished is None and job.status in ("queued", "running") and job.kernel == kernel \
                        and job.params == params:
                    return job
            active = [j for j in self.jobs.values() if j.finished is None]
            if len(active) >= self.capacity or (active and sum(j.cost for j in active) + cost > self.queue_cost):
                raise QueueFull()
            if client is not None and sum(j.client == client for j in active) >= self.per_client:
                raise ClientBusy()
            job = Job(uuid.uuid4().hex[:12], kernel, params, client=client, cost=cost)
            self.jobs[job.id] = job
            self._forget_old()
            job.future = self.pool.submit(self._run, job, fn)
        return job

    def _forget_old(self, keep: int = 256) -> None:
        done = [j for j in self.jobs.values() if j.finished is not None]
        for j in done[: max(0, len(done) - keep)]:
            del self.jobs[j.id]

    def _run(self, job: Job, fn) -> None:
        """In a waiting thread: fork the job's process, relay its messages, kill it at the time limit."""
        job.status, job.started = "running", time.monotonic()
        if not self.processes:
            return self._run_here(job, fn)
        try:
            process, reader = self._process_for(job, fn)
        except OSError as err:                           # no process to be had (out of memory or of pids)
            job.error, job.status = UNAVAILABLE, "error"
            job.message = f"The server could not start a worker for this job ({err.strerror}); try again later."
            job.finished = time.monotonic()
            return
        job.pid = process.pid
        answered = retire = False
        try:
            while not answered:
                left = job.started + self.time_limit_s - time.monotonic()
                if self._expire(job) or left <= 0:
                    self._expire(job, force=True)
                    break
                if not reader.poll(min(left, 0.25)):
                    continue
                try:
                    message = json.loads(reader.recv_bytes())
                except (EOFError, OSError):              # the process is gone without a word
                    break
                if "progress" in message:
                    job.progress = max(job.progress, min(1.0, float(message["progress"])))
                    job.message = str(message.get("message", ""))
                elif "result" in message:
                    answered, retire = True, bool(message.get("retire"))
                    job.result, job.progress = message["result"], 1.0
                    job.finished = time.monotonic()          # the job ended when its answer came
                    self._remember(self.key(job.kernel, job.params), job.result, job.seconds)
                    job.status = "done"
                else:
                    answered, retire = True, bool(message.get("retire"))
                    if job.status != "error":
                        job.error, job.message, job.status = message["error"], message["message"], "error"
        finally:
            reused = self.worker_fn is not None
            if process.is_alive() and not answered:
                process.kill()                            # past its limit: the CPU is free at once
            retire = retire or job.status == "error"      # a job that raised may have left its process broken
            if not reused or not answered or retire:      # this process is done: the next job gets a new one
                if reused:
                    reader.close()                        # a retiring worker sees EOF and exits
                    self.local.worker = None
                process.join(5)
            elif reused:
                self.local.worker = (process, reader, time.monotonic())   # idle from now
            if not answered and job.status != "error":
                self.deaths += 1
                code = process.exitcode
                how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited ({code})"
                oom = " (signal 9 is what the kernel's out-of-memory killer sends)" if code == -signal.SIGKILL else ""
                job.error, job.status = DIED, "error"
                job.message = (f"The worker process running this {self.what} job {how}{oom}; it has been replaced. "
                               f"Try again later, or ask for less.")
            if not reused:
                reader.close()
            job.pid = None
            if job.finished is None:
                job.finished = time.monotonic()

    def _process_for(self, job: Job, fn):
        """(process, connection) for this job: this thread's reused worker, or a process forked for the job."""
        if self.worker_fn is None:
            reader, writer = self.context.Pipe(duplex=False)
            try:
                process = self.context.Process(target=_child, daemon=True,     # forked: spawn needs a worker_fn
                                               args=(writer, fn, job.params, self.memory_bytes, self.what))
                process.start()
            finally:
                writer.close()
            return process, reader
        request = json.dumps({"name": job.kernel, "params": job.params}).encode()
        for _ in range(2):                         # a worker that died while idle is replaced once
            worker = getattr(self.local, "worker", None)
            if worker is not None and time.monotonic() - worker[2] > IDLE_REPLACE_S:
                worker[1].close()                  # about to exit by itself: replace it now instead
                worker[0].join(5)
                worker = None
            if worker is None or not worker[0].is_alive():
                here, there = self.context.Pipe(duplex=True)
                process = self.context.Process(target=_worker, args=(there, self.worker_fn, self.memory_bytes,
                                                                     self.what), daemon=True)
                process.start()
                there.close()
                worker = (process, here, time.monotonic())
            try:
                worker[1].send_bytes(request)
                self.local.worker = worker
                return worker[0], worker[1]
            except OSError:
                worker[1].close()
                self.local.worker = None
        raise OSError(0, "its worker process would not take it")

    def _run_here(self, job: Job, fn) -> None:
        """Without processes, the job runs in this thread at nice +10; past its limit it is told so at its next
        progress report (a thread cannot be killed), and until it stops it still counts against the queue, so
        the bound stays honest."""
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass

        def progress(fraction: float, message: str = "") -> None:
            if self._expire(job):
                raise JobTimeout(job.message)
            job.progress, job.message = max(job.progress, min(1.0, fraction)), message

        try:
            result = fn(job.params, progress)
            if self._expire(job):                       # it finished, but too late: its requester was told so
                raise JobTimeout(job.message)
        except Exception as err:   # a bug fails this job only, with a plain message
            if job.status != "error":
                job.error, job.message = _classify(err, self.what)
                job.status = "error"
        else:
            job.result, job.progress, job.finished = result, 1.0, time.monotonic()
            self._remember(self.key(job.kernel, job.params), result, job.seconds)
            job.status = "done"
        finally:
            if job.finished is None:
                job.finished = time.monotonic()

    def _expire(self, job: Job, force: bool = False) -> bool:
        """Fail a running job that is past its time limit. True if it has timed out."""
        if job.status == "running" and job.started is not None and job.finished is None \
                and (force or time.monotonic() - job.started > self.time_limit_s):
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

        def wake(_future) -> None:           # runs in the waiting thread; never touches the job itself
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

    def ahead(self, job: Job) -> int | None:
        """While a job waits: how many jobs submitted before it are still queued or running (0: it is next).
        The page shows it, so a class pressing "Run it here" together sees the queue move, not "0%"."""
        if job.status != "queued":
            return None
        with self.lock:
            earlier = list(self.jobs.values())
        return sum(j.finished is None and j.status in ("queued", "running") for j in earlier[:earlier.index(job)]) \
            if job in earlier else None

    def get(self, job_id: str) -> Job | None:
        job = self.jobs.get(job_id)
        if job is not None:
            self._expire(job)
        return job


Progress = Callable[[float, str], None]
