"""A small, bounded load test (the full one is tests/benchmarks/load_server.py): 8 clients send 200 cached
requests while 4 more send 24 real kernel requests into a queue of one. Nothing may fail except a
busy answer (503 with Retry-After), and cached answers must stay fast while the kernels queue."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx

from kvx.compute.app import create_app
from kvx.compute.settings import Settings
from kvx.explainers.registry import REGISTRY

_spec = importlib.util.spec_from_file_location("load_server",
                                               Path(__file__).parents[1] / "benchmarks" / "load_server.py")
load = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(load)


def test_cached_answers_stay_fast_while_kernels_queue(tmp_path, serve, monkeypatch, run_async):
    site = load.tiny_site()
    app = create_app(Settings(site_dir=site, kernel_workers=1, kernel_queue=1))
    # Small real kernels, each with new parameters (never cached), so the queue of two fills up.
    counter = iter(range(10 ** 6))
    monkeypatch.setattr(load, "BACKOFF_S", 0.05)
    monkeypatch.setattr(load, "heavy_request", lambda: ("/api/v1/kernels/paged",
                                                        {"batch": 2, "context": 256 + next(counter), "repeats": 3}))
    with serve(app) as url:
        for slug in REGISTRY:                  # the first answer is computed, every later one is cached
            httpx.post(f"{url}/api/v1/explainers/{slug}", json={}, timeout=60).raise_for_status()
        result = run_async(load.phase(url, clients=8, heavy=4, seconds=30, slugs=list(REGISTRY),
                                        statics=load.static_paths(site), cached_limit=25, heavy_limit=6))
    classes = result["classes"]
    assert result["failures"] == [], result["failures"]
    assert sum(classes[k]["requests"] for k in ("health", "explainer", "static")) == 200
    heavy = classes["heavy"]
    assert heavy["requests"] == 24 and heavy["errors"] == 0
    assert heavy["busy_429_503"] > 0 and heavy["busy_with_retry_after"] == heavy["busy_429_503"]
    assert heavy["requests"] - heavy["busy_429_503"] > 0                        # and some really ran
    assert load.cached_p99(result) < 1000, classes                              # ms, on a busy 2-core CI box
    assert result["seconds"] < 30


def test_jobs_run_in_processes_of_their_own_that_yield_the_cpu():
    """Jobs run in a process of their own (not holding the server's GIL), at nice +10, on Linux."""
    import os
    import threading

    from kvx.compute.jobs import JobRunner
    runner = JobRunner(workers=1, queue=0)
    job = runner.wait(runner.submit("nice", {}, lambda p, progress: {
        "nice": os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), "pid": os.getpid()}), 5)
    assert job.result["pid"] != os.getpid() and job.seconds is not None and job.seconds < 5
    assert job.result["nice"] >= os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + 10 or \
        job.result["nice"] == 19


def test_caches_are_bounded_in_bytes():
    from kvx.compute.jobs import JobRunner
    runner = JobRunner(workers=1, queue=0, cache_size=1000, cache_bytes=100_000)
    for i in range(100):
        runner._remember(f"k{i}", {"echo": "x" * 5000}, 0.1)            # 5 KB each: 100 would be 500 KB
    assert runner.cached_bytes <= 100_000 and 15 <= len(runner.cache) <= 20
    runner._remember("big", {"echo": "x" * 50_000}, 0.1)                # over an eighth of the bound: not kept
    assert runner.cached("big", {}) is None and "big" not in runner.cache
