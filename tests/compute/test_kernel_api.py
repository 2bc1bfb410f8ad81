"""The kernel endpoints: validated input, cost limits, caching, a bounded queue, progress, faults."""
from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from kvx.compute.app import create_app
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
    ({"context": "x"}, "context", "context must be a whole number between 1 and 16384; got 'x'."),
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
    runner = JobRunner(workers=1, queue=1)
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
    release.set()
    assert runner.wait(b, 5).status == "done" and runner.cached("slow", {"n": 2}) == {"ok": True}


def test_a_failing_or_overlong_job_fails_alone():
    runner = JobRunner(workers=1, queue=2, time_limit_s=0.05)

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
