"""Faults: each fails the one request it belongs to, with a JSON sentence (never a traceback), and the
server goes on answering everyone else. Jobs (kernels, uncached explainer evaluations) run in processes
of their own, forked per job: a fake kernel set with monkeypatch runs in that process, so what it does is
seen here through files and process ids, not through shared Python objects."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import threading
import time
from urllib.parse import urlparse

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


def settled(client, url: str, json: dict, seconds: float = 60):
    """POST a kernel request and, while it is queued or running (202), follow its job: the answer a client
    ends with, however loaded this machine is (a fresh job process can take over the endpoint's two seconds
    to start when other work shares the cores, and the first reply is then a 202)."""
    r = client.post(url, json=json)
    deadline = time.monotonic() + seconds
    while r.status_code == 202 and time.monotonic() < deadline:
        time.sleep(0.1)
        r = client.get(r.json()["status_url"])
    return r


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
    r = settled(client, "/api/v1/kernels/paged", json=SMALL_PAGED)
    # A bug on valid input: 422 (retrying will not help, the server is fine), never a 5xx.
    assert_plain_error(r, 422, "The kernel failed: RuntimeError: index 9 is out of bounds")
    again = client.get(f"/api/v1/jobs/{r.json()['job']}")                    # the job says the same
    assert_plain_error(again, 422, "The kernel failed")
    still_serving(client)
    # A job that raised retires its process: the next job's process is forked now, without the patch.
    monkeypatch.undo()
    assert settled(client, "/api/v1/kernels/paged", json=SMALL_PAGED).status_code == 200   # a failure is not cached
    ok = settled(client, "/api/v1/kernels/decode", json={"weight_mb": 1, "kv_mb": 0, "repeats": 1})
    assert ok.status_code == 200 and ok.json()["result"]["weight_bytes"] > 0


def raw_exchange(url: str, requests: list[bytes]) -> list[tuple[int, dict, bytes]]:
    """Send requests one after another on ONE keep-alive connection; the answers, until it closes."""
    out = []
    with socket.create_connection((urlparse(url).hostname, urlparse(url).port), timeout=10) as s:
        for request in requests:
            data = b""
            try:
                s.sendall(request)
                while b"\r\n\r\n" not in data:
                    chunk = s.recv(65536)
                    if not chunk:
                        return out                   # closed before answering
                    data += chunk
            except (BrokenPipeError, ConnectionResetError):
                return out                           # closed (a reset if our next request was still unread)
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = dict((k.lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:]))
            while len(body) < int(headers.get("content-length", 0)):
                body += s.recv(65536)
            out.append((int(lines[0].split()[1]), headers, body))
    return out


def post(path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


HEALTH = b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n"


def test_a_model_bug_is_a_json_422_and_the_connection_stays_usable(app, serve, monkeypatch):
    def broken(params):
        raise ZeroDivisionError("division by zero")

    e = registry.REGISTRY["cache-renting"]
    monkeypatch.setitem(registry.REGISTRY, "cache-renting", dataclasses.replace(e, evaluate=broken))
    client = TestClient(app, raise_server_exceptions=False)
    r = client.post("/api/v1/explainers/cache-renting", json={"context": 7777})
    assert_plain_error(r, 422, "The cache-renting model could not evaluate these parameters (ZeroDivisionError",
                       "bug in the model")
    assert client.post("/api/v1/explainers/paging").status_code == 200
    assert client.get("/api/v1/health").status_code == 200
    with serve(app) as url:                       # on one keep-alive connection: the bug, then more answers
        answers = raw_exchange(url, [post("/api/v1/explainers/cache-renting", {"context": 7778}), HEALTH, HEALTH])
    assert [a[0] for a in answers] == [422, 200, 200]
    assert "close" not in answers[0][1].get("connection", "")


def test_a_server_bug_is_a_json_500_that_says_the_connection_closes(app, serve, monkeypatch):
    """Beyond the models: any exception that escapes the app is JSON, with Connection: close, not a drop."""
    from kvx.compute.routers import explainers

    def broken(_):
        raise KeyError("a bug in the server itself")

    monkeypatch.setattr(explainers, "evaluations", broken)
    with serve(app) as url:
        answers = raw_exchange(url, [post("/api/v1/explainers/cache-renting", {"context": 7779}), HEALTH])
    (status, headers, body), = answers                     # one answer, then the connection closed as announced
    assert status == 500 and headers["connection"] == "close" and headers["x-content-type-options"] == "nosniff"
    assert json.loads(body)["detail"].startswith("The server failed on this request (KeyError)")


def test_a_result_that_is_not_a_finite_number_is_null_not_a_500(app, monkeypatch):
    fake_kernel(monkeypatch, lambda r, progress: {"max_error": float("nan"), "seconds": float("inf"), "ok": 1.5})
    e = registry.REGISTRY["cache-renting"]
    monkeypatch.setitem(registry.REGISTRY, "cache-renting",
                        dataclasses.replace(e, evaluate=lambda p: {"break_even": float("inf")}))
    client = TestClient(app)
    result = settled(client, "/api/v1/kernels/paged", json=SMALL_PAGED).json()["result"]
    assert {k: result[k] for k in ("max_error", "seconds", "ok")} == {"max_error": None, "seconds": None, "ok": 1.5}
    assert client.post("/api/v1/explainers/cache-renting", json={"context": 7778}).json()["break_even"] is None


def gone(pid: int, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def test_a_job_past_its_time_limit_fails_alone(tmp_path, monkeypatch):
    app = create_app(Settings(site_dir=tmp_path, kernel_time_limit_s=0.3, kernel_queue=0))
    pid_file = tmp_path / "pid"

    def slow(r, progress):                  # never stops by itself: its process is killed at the limit
        pid_file.write_text(str(os.getpid()))
        while True:
            sum(range(10_000))

    fake_kernel(monkeypatch, slow)
    client = TestClient(app)
    started = time.monotonic()
    r = settled(client, "/api/v1/kernels/paged", json=SMALL_PAGED)
    assert_plain_error(r, 422, "ran past the server's limit of 0.3 s", "Ask for less")
    assert time.monotonic() - started < 1.5                  # told at the limit, not after the sync wait
    assert gone(int(pid_file.read_text()))                   # and the kernel's process is gone
    still_serving(client)
    fake_kernel(monkeypatch, lambda r, progress: {"fine": 1})
    ok = settled(client, "/api/v1/kernels/paged", json={**SMALL_PAGED, "context": 9})
    assert ok.status_code == 200 and ok.json()["result"]["fine"] == 1


def test_a_hung_kernel_is_killed_at_its_limit_and_frees_its_place_at_once(tmp_path, monkeypatch):
    app = create_app(Settings(site_dir=tmp_path, kernel_time_limit_s=0.2, kernel_queue=0))
    fake_kernel(monkeypatch, lambda r, progress: threading.Event().wait(30) and {"never": "reported"})
    client = TestClient(app)
    assert_plain_error(settled(client, "/api/v1/kernels/paged", json=SMALL_PAGED), 422, "limit of 0.2 s")
    deadline = time.monotonic() + 5
    while app.state.jobs.active() and time.monotonic() < deadline:     # the kill and reap take a moment
        time.sleep(0.02)
    assert app.state.jobs.active() == 0
    still_serving(client)
    fake_kernel(monkeypatch, lambda r, progress: {"fine": 1})
    assert settled(client, "/api/v1/kernels/paged", json={**SMALL_PAGED, "context": 9}).status_code == 200


def test_a_worker_that_crashes_costs_only_its_request_and_is_replaced(app, monkeypatch):
    """SIGKILL is what the kernel's OOM killer sends: the job's process dies without a word."""
    fake_kernel(monkeypatch, lambda r, progress: os.kill(os.getpid(), signal.SIGKILL))
    client = TestClient(app)
    r = settled(client, "/api/v1/kernels/paged", json=SMALL_PAGED)
    assert_plain_error(r, 503, "was killed by signal 9", "out-of-memory killer", "replaced")
    assert r.headers["retry-after"] == "5" and app.state.jobs.deaths == 1
    still_serving(client)
    fake_kernel(monkeypatch, lambda r, progress: {"pid": os.getpid()})
    ok = settled(client, "/api/v1/kernels/paged", json={**SMALL_PAGED, "context": 9})
    assert ok.status_code == 200 and ok.json()["result"]["pid"] != os.getpid()   # a fresh worker process


def test_a_memory_hungry_job_fails_alone_with_a_503(tmp_path, monkeypatch):
    """The job's process has a ceiling on its address space, so the allocation fails inside the job."""
    app = create_app(Settings(site_dir=tmp_path, job_memory_bytes=256 * 2 ** 20))
    fake_kernel(monkeypatch, lambda r, progress: {"n": torch.ones(2 ** 30, dtype=torch.float32).sum().item()})
    client = TestClient(app)
    r = settled(client, "/api/v1/kernels/paged", json=SMALL_PAGED)
    text = assert_plain_error(r, 503, "ran out of memory")
    assert r.headers["retry-after"] == "5" and "alloc" not in text.lower()     # no allocator internals
    still_serving(client)


def test_identical_requests_share_one_job(tmp_path, monkeypatch):
    app = create_app(Settings(site_dir=tmp_path, kernel_queue=0))
    calls = tmp_path / "calls"

    def held(r, progress):
        with open(calls, "a") as f:
            f.write("1")
        time.sleep(1.0)
        return {"shared": True}

    fake_kernel(monkeypatch, held)
    with TestClient(app) as client:
        replies = []
        threads = [threading.Thread(target=lambda: replies.append(client.post("/api/v1/kernels/paged",
                                                                              json=SMALL_PAGED)))
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert [r.status_code for r in replies] == [200, 200, 200] and calls.read_text() == "1"   # one run, no 503


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
    r = settled(client, "/api/v1/kernels/paged", json=SMALL_PAGED)
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
        r = settled(client, "/api/v1/kernels/paged", json={**SMALL_PAGED, "device": "cuda"})
        assert_plain_error(r, 422, "device is not a parameter here", "which is cpu on this server")
        ok = settled(client, "/api/v1/kernels/paged", json=SMALL_PAGED)
        assert ok.status_code == 200 and ok.json()["device"] == "cpu" and ok.json()["result"]["max_error"] < 1e-5
    finally:
        device_info.cache_clear()


def test_a_client_that_disconnects_mid_job_leaves_the_job_and_the_server_fine(app, serve, monkeypatch, tmp_path):
    runs, release = tmp_path / "runs", tmp_path / "release"

    def held(r, progress):
        with open(runs, "a") as f:
            f.write("1")
        progress(0.5, "half way")
        while not release.exists():
            time.sleep(0.02)
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
        release.write_text("go")
        deadline = time.monotonic() + 5
        while app.state.jobs.active() and time.monotonic() < deadline:
            time.sleep(0.02)
        again = other.post("/api/v1/kernels/paged", json=SMALL_PAGED)   # its result was kept
        assert again.status_code == 200 and again.json()["cached"] is True and runs.read_text() == "1"
