"""Job processes started by spawn, as a CUDA server's kernels run (a CUDA context does not survive a fork), here on
the CPU: each job still runs in a process of its own, reused, killed at its time limit, and a worker that dies
costs only its own job. No GPU is needed to check that; `make gpu-check` runs the kernels this way on CUDA."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kvx.compute.app import create_app
from kvx.compute.jobs import DIED, OUT_OF_MEMORY, TIMEOUT, JobRunner
from kvx.compute.settings import Settings

sys.path.insert(0, str(Path(__file__).parent))     # the spawned child finds spawn_jobs the same way
import spawn_jobs  # noqa: E402


def runner(**kw) -> JobRunner:
    return JobRunner(workers=1, queue=2, worker_fn=spawn_jobs.run, start="spawn", **kw)


def done(jobs: JobRunner, name: str, params: dict, seconds: float = 60):
    return jobs.wait(jobs.submit(name, params, fn=None), seconds)


def test_a_spawned_worker_starts_afresh_and_is_reused(monkeypatch):
    monkeypatch.setattr(spawn_jobs, "MARK", "changed in the server")
    jobs = runner()
    first, second = done(jobs, "echo", {"a": 1}), done(jobs, "echo", {"a": 2})
    assert first.status == second.status == "done", (first.message, second.message)
    assert first.result["pid"] != os.getpid() and first.result["mark"] == "as imported"   # spawned, not forked
    assert second.result["pid"] == first.result["pid"] and second.result["a"] == 2        # the same process again


def test_a_spawned_worker_that_dies_costs_only_its_job():
    jobs = runner()
    before = done(jobs, "echo", {"a": 1}).result["pid"]
    crashed = done(jobs, "crash", {})
    assert crashed.status == "error" and crashed.error == DIED and jobs.deaths == 1
    after = done(jobs, "echo", {"a": 2})
    assert after.status == "done" and after.result["pid"] not in (before, os.getpid())


def test_a_spawned_job_is_killed_at_its_limit_and_the_next_runs():
    jobs = runner(time_limit_s=3.0)
    done(jobs, "echo", {"a": 0})                    # the worker's start is paid before the limit is tried
    hung = done(jobs, "hang", {}, seconds=30)
    assert hung.status == "error" and hung.error == TIMEOUT
    assert done(jobs, "echo", {"a": 1}).status == "done"


def test_a_spawned_job_over_its_memory_ceiling_fails_alone():
    jobs = runner(memory_bytes=256 * 2 ** 20)
    hungry = done(jobs, "hungry", {"bytes": 2 ** 31})
    assert hungry.status == "error" and hungry.error == OUT_OF_MEMORY
    assert done(jobs, "echo", {"a": 1}).status == "done"


def test_spawn_needs_jobs_by_name():
    with pytest.raises(ValueError, match="needs a worker_fn"):
        JobRunner(start="spawn")
    with pytest.raises(ValueError, match="start must be one of fork, spawn"):
        JobRunner(start="forkserver")


def test_the_server_runs_real_kernels_in_spawned_processes(tmp_path):
    """What a CUDA server does, on the CPU: the kernels' endpoint answers from a spawned job process."""
    app = create_app(Settings(site_dir=tmp_path, job_start="spawn"))
    assert app.state.jobs.context.get_start_method() == "spawn"
    client = TestClient(app)
    r = client.post("/api/v1/kernels/paged", json={"context": 8, "repeats": 1, "batch": 1, "heads": 2,
                                                   "kv_heads": 1, "head_dim": 8})
    for _ in range(600):                            # the worker's first job imports PyTorch: it may take a while
        if r.status_code != 202:
            break
        time.sleep(0.1)
        r = client.get(r.json()["status_url"])
    assert r.status_code == 200, r.text
    assert r.json()["result"]["max_error"] < 1e-5 and r.json()["threads"] == 1    # one thread, as forked ones
