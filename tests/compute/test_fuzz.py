"""Property-based fuzzing of every API operation in the OpenAPI spec (schemathesis), in process.

Each operation gets examples from its schema (valid and invalid bodies, boundary values, wrong methods).
Every answer must be: not a server error (a 503 only when busy, with Retry-After), JSON, without a
traceback, documented in the spec (status, content type, body schema), and a 4xx must say what was wrong:
a 422 from validation is a sentence that names the field it is about.

Kernels are real but bounded: the cost limit is set so low that most kernel requests are refused cheaply
(the refusal is what gets tested), while the smallest paged, MLA and decode requests still run.

CI runs a few examples per operation, the same ones every time. More, and random:
    KVX_FUZZ_EXAMPLES=300 KVX_FUZZ_RANDOM=1 python -m pytest tests/compute/test_fuzz.py
or  python tests/benchmarks/fuzz_server.py --examples 300
"""
from __future__ import annotations

import atexit
import collections
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_schema_conformance, status_code_conformance)

from kvx.compute.app import create_app
from kvx.compute.settings import Settings

EXAMPLES = int(os.environ.get("KVX_FUZZ_EXAMPLES", "8"))
RANDOM = os.environ.get("KVX_FUZZ_RANDOM", "") not in ("", "0")
# The smallest real kernel requests cost 1e3-1e7 FLOP-equivalents; the defaults 1e9-1e11.
MAX_WORK = float(os.environ.get("KVX_FUZZ_MAX_WORK", "3e7"))

_site = Path(tempfile.mkdtemp(prefix="kvx-fuzz-site-"))
atexit.register(shutil.rmtree, _site, ignore_errors=True)
(_site / "index.html").write_text("<!doctype html><title>kvx</title><p>fuzz</p>")
APP = create_app(Settings(site_dir=_site, kernel_max_work=MAX_WORK, kernel_queue=2, kernel_time_limit_s=60))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)

STATS: dict[str, list] = collections.defaultdict(list)     # operation -> [(status, seconds)]


def header(response, name: str) -> str | None:
    """A header of schemathesis's response (its values are lists)."""
    values = {k.lower(): v for k, v in response.headers.items()}.get(name)
    return values[0] if isinstance(values, list) else values


def check_answer(case, response, seconds: float) -> None:
    status, text = response.status_code, response.text
    STATS[f"{case.method} {case.path}"].append((status, seconds))
    where = f"{case.method} {case.formatted_path} {case.body!r} -> {status} {text[:300]}"
    assert status < 500 or (status == 503 and header(response, "retry-after")), f"server error: {where}"
    assert "Traceback" not in text and 'File "' not in text, f"a traceback leaked: {where}"
    assert header(response, "x-content-type-options") == "nosniff", where
    if status < 400:
        return
    assert header(response, "content-type").startswith("application/json"), where
    detail = response.json()["detail"]
    if status != 422:
        assert isinstance(detail, str) and detail.strip(), f"a {status} must say why: {where}"
        return
    assert isinstance(detail, list) and detail, where
    for item in detail:
        field, msg = item["loc"][-1], item["msg"]
        assert msg.rstrip(")").endswith("."), f"not a sentence: {where}"
        if field == "body":      # about the body as a whole: not JSON, not an object, or over the cost limit
            assert any(w in msg for w in ("body", "JSON", "limit")), f"says nothing about the body: {where}"
        else:                    # about one parameter: the sentence names it
            assert str(field) in msg, f"the message does not name {field!r}: {where}"


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_operation_answers_cleanly(case):
    started = time.perf_counter()
    response = case.call()
    seconds = time.perf_counter() - started
    check_answer(case, response, seconds)
    # The spec and the server agree: documented status codes, content type and body schema, and an
    # invalid body (by the schema) is never accepted.
    case.validate_response(response, checks=[status_code_conformance, content_type_conformance,
                                             response_schema_conformance, negative_data_rejection])


def test_fuzz_ran_real_kernels_and_cheap_refusals():
    """The bound works both ways: some kernel requests really ran, and most were refused cheaply."""
    if not STATS:
        pytest.skip("run together with the fuzz test")
    kernel = [(op, s) for op, rows in STATS.items() if "/kernels/" in op and op.startswith("POST")
              for s, _ in rows]
    assert any(s == 200 for _, s in kernel), "no kernel request ran"
    assert sum(s == 422 for _, s in kernel) > len(kernel) / 3
    slowest = max((t, op) for op, rows in STATS.items() for _, t in rows)
    print(f"\n{sum(map(len, STATS.values()))} requests over {len(STATS)} operations; slowest {slowest[0]:.2f} s "
          f"({slowest[1]}); kernel answers {collections.Counter(s for _, s in kernel)}")


# ---- what the fuzzer found, pinned (each was a 500, a wrong status or a wrong sentence before the fix) -----
@pytest.fixture
def client():
    from fastapi.testclient import TestClient
    return TestClient(APP)


def test_found_kv_heads_left_at_its_default_is_checked_against_heads(client):
    r = client.post("/api/v1/kernels/paged", json={"heads": 1})            # was a 500 from inside the job
    assert r.status_code == 422 and r.json()["detail"][0]["msg"] == "kv_heads must divide heads (1); got 2."


@pytest.mark.parametrize("value", [True, False])
def test_found_true_and_false_are_not_numbers(client, value):
    r = client.post("/api/v1/explainers/cache-renting", json={"context": value})   # was read as 1 or 0
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "context"]


@pytest.mark.parametrize("body,words", [
    (b'{"context": 5', "The request body is not valid JSON: Expecting ',' delimiter at character 13."),
    (b"\x07#K\xff\xfe", "The request body is not valid JSON"),                   # was a 400 "error parsing"
    (b'{"context": 1' + b"0" * 5000 + b"}", "a number in it is too long"),
])
def test_found_a_body_that_is_not_json_is_a_422_about_the_body(client, body, words):
    r = client.post("/api/v1/explainers/cache-renting", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422
    (detail,) = r.json()["detail"]
    assert detail["loc"] == ["body"] and words in detail["msg"]           # was "13 must be a number or a name"


@pytest.mark.parametrize("method,path,allow", [
    ("GET", "/api/v1/explainers/cache-renting", "POST"), ("PUT", "/api/v1/kernels/mla", "POST"),
    ("DELETE", "/api/v1/jobs/abc", "GET"), ("POST", "/api/v1/health", "GET"),
])
def test_found_a_wrong_method_on_the_api_is_a_405_naming_the_right_one(client, method, path, allow):
    r = client.request(method, path)                                      # was the site's "Allow: GET, HEAD"
    assert r.status_code == 405 and r.headers["allow"] == allow and f"takes {allow}" in r.json()["detail"]


def test_an_unknown_api_path_is_a_json_404_not_the_sites(client):
    r = client.get("/api/v2/health")
    assert r.status_code == 404 and "There is no API endpoint /api/v2/health" in r.json()["detail"]
