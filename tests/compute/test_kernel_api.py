"""The kernel endpoints: validated input, cost limits, caching, a bounded queue, progress, faults."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kvx.compute import kernel_specs
from kvx.compute.app import create_app
from kvx.compute.kernels import paged
from kvx.compute.lm.train import CHECKPOINTS
from kvx.compute.jobs import JobRunner, QueueFull
from kvx.compute.settings import Settings


def post_and_wait(client, url: str, body: dict, seconds: float = 120) -> dict:
    """POST a kernel request and, if it was queued (202), poll its job until it is done."""
    r = client.post(url, json=body)
    deadline = time.monotonic() + seconds
    while r.status_code == 202 and time.monotonic() < deadline:
        time.sleep(0.2)
        r = client.get(r.json()["status_url"])
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def client(tmp_path):
    return TestClient(create_app(Settings(site_dir=tmp_path / "none")))


def test_mla_endpoint_reports_device_time_bytes_and_error(client):
    body = post_and_wait(client, "/api/v1/kernels/mla", {"context": 256, "repeats": 3})
    assert body["device"] in ("cpu", "cuda") and body["torch"] and body["cached"] is False
    forms = body["result"]["forms"]
    assert set(forms) == {"naive", "materialized", "absorbed"}
    for form in forms.values():
        assert form["seconds"] > 0 and form["bytes"] > 0 and form["max_error"] < 1e-4
    assert forms["absorbed"]["bytes"] < forms["materialized"]["bytes"] < forms["naive"]["bytes"]


def test_results_are_cached_by_their_parameters(client):
    first = post_and_wait(client, "/api/v1/kernels/paged", {"context": 64, "repeats": 1})
    again = client.post("/api/v1/kernels/paged", json={"repeats": 1, "context": 64}).json()
    assert first["cached"] is False and again["cached"] is True and again["result"] == first["result"]


@pytest.mark.parametrize("body,field,message", [
    ({"context": 99999}, "context", "context must be a whole number between 1 and 16384; got 99999."),
    ({"context": "x"}, "context", "context must be a whole number (a JSON number, not a string or true/false) "
                                  "between 1 and 16384; got 'x'."),
    ({"heads": 6, "kv_heads": 4}, "kv_heads", "kv_heads must divide heads (6); got 4."),
    ({"nope": 1}, "nope", "nope is not a parameter here"),
])
def test_bad_kernel_input_is_a_sentence(client, body, field, message):
    r = client.post("/api/v1/kernels/paged", json=body)
    assert r.status_code == 422
    (detail,) = r.json()["detail"]
    assert detail["loc"] == ["body", field] and detail["msg"].startswith(message)


def test_literal_choices_are_listed(client):
    r = client.post("/api/v1/kernels/mla", json={"dtype": "fp64"})
    assert r.json()["detail"][0]["msg"] == "dtype must be one of 'float32' or 'bfloat16'; got 'fp64'."


def test_oversized_requests_are_refused_naming_the_limit(client):
    r = client.post("/api/v1/kernels/mla", json={"context": 32768, "batch": 16, "repeats": 25})
    assert r.status_code == 422
    assert "the server's limit is 2e+11 per request" in r.json()["detail"][0]["msg"]


def test_kernel_list_has_schemas(client):
    names = [k["name"] for k in client.get("/api/v1/kernels").json()]
    assert names == ["mla", "paged", "eviction", "quantization", "cross-layer", "cross-model", "decode"]


def test_unknown_job_is_a_404(client):
    assert client.get("/api/v1/jobs/nope").status_code == 404


def test_runner_bounds_the_queue_and_reports_progress():
    runner = JobRunner(workers=1, queue=1, processes=False)    # in threads: the job waits on this process's Event
    release = threading.Event()

    def slow(params, progress):
        progress(0.5, "half way")
        release.wait(5)
        return {"ok": True}

    a = runner.submit("slow", {"n": 1}, slow)
    b = runner.submit("slow", {"n": 2}, slow)
    with pytest.raises(QueueFull):
        runner.submit("slow", {"n": 3}, slow)
    deadline = time.monotonic() + 5
    while a.progress < 0.5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert a.view()["status"] == "running" and a.view()["message"] == "half way" and b.status == "queued"
    assert runner.ahead(a) is None and runner.ahead(b) == 1      # the page shows "1 job ahead" while b waits
    release.set()
    assert runner.wait(b, 5).status == "done" and runner.cached("slow", {"n": 2}) == {"ok": True}


def test_a_failing_or_overlong_job_fails_alone():
    runner = JobRunner(workers=1, queue=2, time_limit_s=0.05, processes=False)   # a fork alone can take 0.05 s

    def boom(params, progress):
        raise RuntimeError("broken kernel")

    def overlong(params, progress):
        time.sleep(0.1)
        progress(0.9)
        return {}

    bad = runner.wait(runner.submit("k", {"a": 1}, boom), 5)
    late = runner.wait(runner.submit("k", {"a": 2}, overlong), 5)
    good = runner.wait(runner.submit("k", {"a": 3}, lambda p, progress: {"fine": 1}), 5)
    assert bad.status == "error" and "broken kernel" in bad.message
    assert late.status == "error" and "limit of 0.05 s" in late.message
    assert good.status == "done" and good.result == {"fine": 1}


def test_busy_server_answers_503_with_retry_after(tmp_path):
    app = create_app(Settings(site_dir=tmp_path, kernel_workers=1, kernel_queue=0))
    # The one place is held by a job that runs in a thread until released. (The server's own runner sends a job
    # to its worker process by name, and a process told to run "hold" fails at once, freeing the place before
    # the request below can meet it: the test then passed or failed by a race.)
    app.state.jobs = JobRunner(workers=1, queue=0, processes=False)
    release = threading.Event()
    app.state.jobs.submit("hold", {}, lambda p, progress: release.wait(5) and {})
    try:
        r = TestClient(app).post("/api/v1/kernels/paged", json={"context": 8, "repeats": 1})
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
    finally:
        release.set()


def test_decode_kernel_reads_the_bytes_it_is_asked_to(client):
    body = post_and_wait(client, "/api/v1/kernels/decode", {"weight_mb": 8, "kv_mb": 4, "repeats": 1})
    r = body["result"]
    assert abs(r["weight_bytes"] - 8e6) < 16384 and abs(r["kv_bytes"] - 4e6) < 16384     # whole 16 KB rows
    assert r["seconds"] == r["weight_seconds"] + r["kv_seconds"] > 0
    assert r["predicted_seconds"] == r["model_bytes"] / r["copy_bytes_per_s"]


def test_quantization_words_a_measurement_from_the_server(client):
    from kvx.explainers.quantization.model import QuantizationParams, describe_run, run_request
    p = QuantizationParams(context=32000, batch=8)
    request = run_request(p)
    assert request["weight_mb"] + request["kv_mb"] <= 512.001
    reply = post_and_wait(client, "/api/v1/kernels/decode", {**request, "repeats": 1})
    text = describe_run(p, reply)
    assert text.startswith("Measured on") and "The cache was 68% of the bytes" in text


# ---- memory-aware admission -------------------------------------------------------------------------------
PROBE = Path(__file__).with_name("memory_probe.py")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's peak-RSS reset")
@pytest.mark.parametrize("kernel,body,warm", [
    ("paged", {"context": 4096, "batch": 8, "repeats": 1}, {"context": 8, "repeats": 1}),
    ("paged", {"context": 16384, "batch": 8, "kv_heads": 8, "repeats": 1}, {"context": 8, "repeats": 1}),
    ("mla", {"context": 32768, "batch": 2, "repeats": 1}, {"context": 8, "repeats": 1}),
    ("quantization", {"sequences": 8}, {"sequences": 1}),
])
def test_memory_estimate_covers_the_measured_peak(kernel, body, warm):
    """The estimate is at least the peak resident memory the request adds, and at most twice it (+32 MiB)."""
    if kernel == "quantization" and not (CHECKPOINTS / "gqa-large.pt").exists():
        pytest.skip("trained checkpoints not present")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "KVX_KERNEL_THREADS": "1"}
    out = subprocess.run([sys.executable, str(PROBE), kernel, json.dumps(body), json.dumps(warm)], env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    estimate = r["host"] + r["device"]                       # on the CPU the device is the host
    assert r["measured"] > 10 * 2 ** 20                        # the request really allocated something
    assert r["measured"] <= estimate <= 2 * r["measured"] + 32 * 2 ** 20, r


def test_a_request_over_the_memory_budget_is_a_422_naming_both(tmp_path):
    client = TestClient(create_app(Settings(site_dir=tmp_path, kernel_max_bytes=50e6)))
    body = {"context": 4096, "batch": 16, "repeats": 1}
    need = kernel_specs.paged_memory(kernel_specs.PagedRequest(**body))
    r = client.post("/api/v1/kernels/paged", json=body)
    assert r.status_code == 422
    (detail,) = r.json()["detail"]
    assert detail["type"] == "too_much_memory"
    assert f"about {(need['host'] + need['device']) / 1e6:.1f} MB of host memory" in detail["msg"]
    assert "the server's limit is 50.0 MB per request" in detail["msg"]


def test_default_budget_refuses_a_cheap_request_that_would_need_gigabytes(client):
    """Few FLOPs (under the cost limit) but 17 GB of cache: refused before anything is allocated."""
    body = {"batch": 64, "context": 16384, "heads": 8, "kv_heads": 8, "head_dim": 256, "repeats": 1}
    assert kernel_specs.paged_cost(kernel_specs.PagedRequest(**body)) < 2e11
    r = client.post("/api/v1/kernels/paged", json=body)
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "too_much_memory"
    budget = kernel_specs.memory_budget()["host"]
    assert f"the server's limit is {budget / 1e9:.2f} GB per request" in r.json()["detail"][0]["msg"]


@pytest.mark.parametrize("message", [
    "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
    "38654705664 bytes. Error code 12 (Cannot allocate memory)",
    "CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.15 GiB total capacity; 3.20 GiB already allocated)",
])
def test_an_allocation_failure_is_a_503_with_retry_after_and_no_internals(client, monkeypatch, message):
    def fails(*args, **kwargs):
        raise RuntimeError(message)

    monkeypatch.setattr(paged, "paged_decode", fails)
    r = client.post("/api/v1/kernels/paged", json={"context": 16, "repeats": 1, "batch": 3})
    deadline = time.monotonic() + 60
    while r.status_code == 202 and time.monotonic() < deadline:
        time.sleep(0.2)
        r = client.get(r.json()["status_url"])
    assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
    text = r.text
    for internal in ("alloc_cpu", "DefaultCPUAllocator", "enforce", "GiB", "38654705664", "Error code"):
        assert internal not in text


# ---- the API measures what the benchmark measures ---------------------------------------------------------
def test_served_mla_time_is_the_direct_calls_time(client):
    """The absorbed decode at 8K tokens through POST /kernels/mla against the same call made directly in this
    process: the issue measured 2.8 ms served against 0.28 ms direct (a lower-priority two-thread OpenMP team
    on a busy machine). Both now time one thread's CPU time."""
    body = {"context": 8192, "repeats": 9}
    served = post_and_wait(client, "/api/v1/kernels/mla", body)
    direct = kernel_specs.KERNELS["mla"].run(kernel_specs.MLARequest(**body), lambda *a: None)
    s, d = served["result"]["forms"]["absorbed"]["seconds"], direct["forms"]["absorbed"]["seconds"]
    assert served["result"]["threads"] == direct["threads"] == 1
    assert served["result"]["timer"] == direct["timer"] == "thread CPU time"
    assert 1 / 3 < s / d < 3, (s, d)


@pytest.mark.parametrize("slug", ["cross-layer", "cross-model", "eviction", "mla", "quantization"])
def test_every_run_it_here_request_a_page_can_send_is_accepted(slug):
    """Each choice a page offers (policy, dtype, ...) makes a request its kernel's model validates, so "run it
    here" never answers a reader's setting with a 422 (the eviction page once offered a policy the API refused)."""
    from kvx.explainers.registry import REGISTRY
    e = REGISTRY[slug]
    for name, spec in ((d["name"], d) for d in e.params.describe()):
        for value in spec["choices"] or [spec["default"]]:
            try:
                params = e.params.from_mapping({name: value})
            except ValueError:
                continue                              # a combination the page itself refuses
            run = e.page_data(params).get("run")
            assert run, f"{slug} has no run request"
            kernel_specs.KERNELS[run["kernel"]].request.model_validate(run["request"])
