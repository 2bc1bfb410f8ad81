"""Faults: each fails the one request it belongs to, with a JSON sentence (never a traceback), and the
server goes on answering everyone else."""
from __future__ import annotations

import dataclasses
import threading
import time

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from kvx.compute import kernel_specs
from kvx.compute.app import create_app
from kvx.compute.device import device_info
from kvx.compute.kernels import paged
from kvx.compute.settings import Settings
from kvx.explainers import registry

SMALL_PAGED = {"context": 8, "repeats": 1, "batch": 1, "heads": 2, "kv_heads": 1, "head_dim": 8}


def fake_kernel(monkeypatch, run, name: str = "paged") -> None:
    """Replace one kernel's run (the endpoint, its validation and its cost estimate stay real)."""
    monkeypatch.setitem(kernel_specs.KERNELS, name, dataclasses.replace(kernel_specs.KERNELS[name], run=run))


def assert_plain_error(r, status: int, *words: str) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert "Traceback" not in r.text and 'File "' not in r.text
    detail = r.json()["detail"]
    text = detail if isinstance(detail, str) else " ".join(d["msg"] for d in detail)
    for w in words:
        assert w in text, text
    return text


def still_serving(client) -> None:
    assert client.get("/api/v1/health").json()["status"] == "ok"
    assert client.post("/api/v1/explainers/cache-renting", json={"context": 8000}).status_code == 200


@pytest.fixture
def app(tmp_path):
    return create_app(Settings(site_dir=tmp_path / "none"))


def test_a_kernel_that_raises_fails_that_request_only(app, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("index 9 is out of bounds for the block table")

    monkeypatch.setattr(paged, "paged_decode", broken)       # the real kernel function, deep inside the run
    client = TestClient(app)
    r = client.post("/api/v1/kernels/paged", json=SMALL_PAGED)
    assert_plain_error(r, 500, "The kernel failed: RuntimeError: index 9 is out of bounds")
    again = client.get(f"/api/v1/jobs/{r.json()['job']}")                    # the job says the same
    assert_plain_error(again, 500, "The kernel failed")
    still_serving(client)
    ok = client.post("/api/v1/kernels/decode", json={"weight_mb": 1, "kv_mb": 0, "repeats": 1})
    assert ok.status_code == 200 and ok.json()["result"]["weight_bytes"] > 0
    monkeypatch.undo()
    assert client.post("/api/v1/kernels/paged", json=SMALL_PAGED).status_code == 200   # a failure is not cached


def test_a_model_bug_is_a_json_500_for_that_request_only(app, monkeypatch):
    def broken(params):
        raise ZeroDivisionError("division by zero")

    e = registry.REGISTRY["cache-renting"]
    monkeypatch.setitem(registry.REGISTRY, "cache-renting", dataclasses.replace(e, evaluate=broken))
    client = TestClient(app, raise_server_exceptions=False)
    r = client.post("/api/v1/explainers/cache-renting", json={"context": 7777})
    assert_plain_error(r, 500, "The server failed on this request (ZeroDivisionError)", "unaffected")
    assert client.post("/api/v1/explainers/paging").status_code == 200
    assert client.get("/api/v1/health").status_code == 200


def test_a_result_that_is_not_a_finite_number_is_null_not_a_500(app, monkeypatch):
    fake_kernel(monkeypatch, lambda r, progress: {"max_error": float("nan"), "seconds": float("inf"), "ok": 1.5})
    e = registry.REGISTRY["cache-renting"]
    monkeypatch.setitem(registry.REGISTRY, "cache-renting",
                        dataclasses.replace(e, evaluate=lambda p: {"break_even": float("inf")}))
    client = TestClient(app)
    assert client.post("/api/v1/kernels/paged", json=SMALL_PAGED).json()["result"] == {
        "max_error": None, "seconds": None, "ok": 1.5}
    assert client.post("/api/v1/explainers/cache-renting", json={"context": 7778}).json()["break_even"] is None


def test_a_job_past_its_time_limit_fails_alone(tmp_path, monkeypatch):
    app = create_app(Settings(site_dir=tmp_path, kernel_time_limit_s=0.3, kernel_queue=0))
    stopped = threading.Event()

    def slow(r, progress):                  # reports progress, so it is stopped at the next report
        for i in range(40):
            time.sleep(0.05)
            try:
                progress(i / 40, "working")
            except Exception:
                stopped.set()
                raise
        return {"late": True}

    fake_kernel(monkeypatch, slow)
    client = TestClient(app)
    started = time.monotonic()
    r = client.post("/api/v1/kernels/paged", json=SMALL_PAGED)
    assert_plain_error(r, 422, "ran past the server's limit of 0.3 s", "Ask for less")
    assert time.monotonic() - started < 1.5                  # told at the limit, not after the sync wait
    assert stopped.wait(2)                                   # and the kernel itself stopped
    still_serving(client)
    fake_kernel(monkeypatch, lambda r, progress: {"fine": 1})
    ok = client.post("/api/v1/kernels/paged", json={**SMALL_PAGED, "context": 9})
    assert ok.status_code == 200 and ok.json()["result"] == {"fine": 1}


def test_a_hung_kernel_is_answered_at_its_limit_and_still_counts_against_the_queue(tmp_path, monkeypatch):
    app = create_app(Settings(site_dir=tmp_path, kernel_time_limit_s=0.2, kernel_queue=0))
    release = threading.Event()
    fake_kernel(monkeypatch, lambda r, progress: release.wait(10) and {"never": "reported"})
    client = TestClient(app)
    try:
        assert_plain_error(client.post("/api/v1/kernels/paged", json=SMALL_PAGED), 422, "limit of 0.2 s")
        busy = client.post("/api/v1/kernels/paged", json={**SMALL_PAGED, "context": 9})
        assert_plain_error(busy, 503, "queue is full")                 # the hung thread still holds the worker
        assert busy.headers["retry-after"] == "5"
        still_serving(client)
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while app.state.jobs.active() and time.monotonic() < deadline:
        time.sleep(0.02)
    fake_kernel(monkeypatch, lambda r, progress: {"fine": 1})
    assert client.post("/api/v1/kernels/paged", json={**SMALL_PAGED, "context": 9}).status_code == 200


def test_identical_requests_share_one_job(tmp_path, monkeypatch):
    app = create_app(Settings(site_dir=tmp_path, kernel_queue=0))
    release, calls = threading.Event(), []

    def held(r, progress):
        calls.append(1)
        release.wait(5)
        return {"shared": True}

    fake_kernel(monkeypatch, held)
    with TestClient(app) as client:
        replies = []
        threads = [threading.Thread(target=lambda: replies.append(client.post("/api/v1/kernels/paged",
                                                                              json=SMALL_PAGED)))
                   for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        release.set()
        for t in threads:
            t.join(10)
    assert [r.status_code for r in replies] == [200, 200, 200] and calls == [1]   # one run, no 503 for the others


@pytest.mark.parametrize("error,status,words", [
    (FileNotFoundError("the trained model 'mla' is not in /x; run `kvx train mla`."), 503, "cannot run it"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), 503, "ran out of memory"),
    (MemoryError(), 503, "ran out of memory"),
])
def test_server_side_failures_are_503s(app, monkeypatch, error, status, words):
    def fail(r, progress):
        raise error

    fake_kernel(monkeypatch, fail)
    client = TestClient(app)
    r = client.post("/api/v1/kernels/paged", json=SMALL_PAGED)
    assert_plain_error(r, status, words)
    if "memory" in words:
        assert r.headers["retry-after"] == "5"              # out of memory is worth a retry later
    still_serving(client)


def test_without_a_gpu_the_kernels_run_on_the_cpu_and_cuda_cannot_be_asked_for(app, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    device_info.cache_clear()
    try:
        client = TestClient(app)
        assert client.get("/api/v1/health").json()["device"] == "cpu"
        r = client.post("/api/v1/kernels/paged", json={**SMALL_PAGED, "device": "cuda"})
        assert_plain_error(r, 422, "device is not a parameter here", "which is cpu on this server")
        ok = client.post("/api/v1/kernels/paged", json=SMALL_PAGED)
        assert ok.status_code == 200 and ok.json()["device"] == "cpu" and ok.json()["result"]["max_error"] < 1e-5
    finally:
        device_info.cache_clear()


def test_a_client_that_disconnects_mid_job_leaves_the_job_and_the_server_fine(app, serve, monkeypatch):
    release, runs = threading.Event(), []

    def held(r, progress):
        runs.append(1)
        progress(0.5, "half way")
        release.wait(10)
        return {"ok": True}

    fake_kernel(monkeypatch, held)
    with serve(app) as url, httpx.Client(base_url=url, timeout=5) as other:
        with pytest.raises(httpx.ReadTimeout):               # the client gives up and closes its connection
            httpx.post(f"{url}/api/v1/kernels/paged", json=SMALL_PAGED, timeout=0.5)
        # meanwhile, everyone else is answered
        t0 = time.monotonic()
        assert other.get("/api/v1/health").status_code == 200
        assert other.post("/api/v1/explainers/cache-renting").status_code == 200
        assert time.monotonic() - t0 < 2
        release.set()
        deadline = time.monotonic() + 5
        while app.state.jobs.active() and time.monotonic() < deadline:
            time.sleep(0.02)
        again = other.post("/api/v1/kernels/paged", json=SMALL_PAGED)   # its result was kept
        assert again.status_code == 200 and again.json()["cached"] is True and runs == [1]
