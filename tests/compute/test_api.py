"""The compute server: health, the explainer endpoints, clear 4xx for bad input, and the site at /."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from kvx.compute.app import create_app
from kvx.compute.settings import Settings
from kvx.explainers.registry import REGISTRY


@pytest.fixture
def client(tmp_path):
    return TestClient(create_app(Settings(site_dir=tmp_path / "missing")))


def test_health_reports_version_and_device(client):
    body = client.get("/api/v1/health").json()
    assert body["status"] == "ok" and body["version"]
    assert body["device"] in ("cpu", "cuda")


def test_list_describes_every_explainer(client):
    body = client.get("/api/v1/explainers").json()
    assert [e["slug"] for e in body] == list(REGISTRY)
    params = {p["name"]: p for p in body[0]["parameters"]}
    assert params["context"] == {"name": "context", "kind": "integer", "default": 4000, "min": 1, "max": 10_000_000,
                                 "unit": "tokens", "help": params["context"]["help"], "choices": [],
                                 "optional": False}


def test_evaluate_reproduces_the_seed(client):
    body = client.post("/api/v1/explainers/cache-renting",
                       json={"model": "llama-3-70b", "kv_dtype": "fp16", "context": 4000, "kv_memory_gb": 450}).json()
    assert body["kv_bytes_per_token"] == 327_680 and body["max_sessions"] == 343
    assert body["params"]["context"] == 4000


def test_evaluate_with_no_body_uses_defaults(client):
    assert client.post("/api/v1/explainers/cache-renting").json()["max_sessions"] == 344


@pytest.mark.parametrize("body,field,words", [
    ({"context": 0}, "context", "context must be between 1 and 10,000,000 tokens; got 0."),
    ({"context": "lots"}, "context", "context must be a number between 1 and 10,000,000 tokens; got 'lots'."),
    ({"gpu_count": 65}, "gpu_count", "gpu_count must be between 1 and 64 GPUs; got 65."),
    ({"model": "gpt-5"}, "model", "model must be one of llama-3-8b"),
    ({"kv_dtype": "fp3"}, "kv_dtype", "or a bit-width between 1 and 32; got 'fp3'."),
    ({"bogus": 1}, "bogus", "bogus is not a parameter"),
    ({"context": [1, 2]}, "context", "context must be a number or a name; got [1, 2]."),
])
def test_bad_input_is_a_422_sentence_naming_the_field(client, body, field, words):
    r = client.post("/api/v1/explainers/cache-renting", json=body)
    assert r.status_code == 422
    (detail,) = r.json()["detail"]
    assert detail["loc"] == ["body", field]
    assert words in detail["msg"] and detail["msg"].endswith(".")


def test_non_object_body_is_a_422(client):
    r = client.post("/api/v1/explainers/cache-renting", content=b"[1,2]", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "JSON object" in r.json()["detail"][0]["msg"]


def test_unknown_explainer_is_a_404_that_lists_the_explainers(client):
    r = client.post("/api/v1/explainers/nope", json={})
    assert r.status_code == 404 and "cache-renting" in r.json()["detail"]


def test_large_bodies_are_refused(client):
    r = client.post("/api/v1/explainers/cache-renting", content=b"{" + b" " * 70_000 + b"}",
                    headers={"content-type": "application/json"})
    assert r.status_code == 413 and "at most 65536 bytes" in r.json()["detail"]


def test_openapi_documents_each_explainer_with_units(client):
    spec = client.get("/openapi.json").json()
    assert "/api/v1/explainers/cache-renting" in spec["paths"]
    schema = spec["components"]["schemas"]["CacheRentingRequest"]["properties"]["context"]
    assert (schema["unit"], schema["minimum"], schema["maximum"]) == ("tokens", 1, 10_000_000)
    assert client.get("/docs").status_code == 200


def test_cors_only_for_configured_origins(tmp_path):
    app = create_app(Settings(site_dir=tmp_path, cors_origins=["https://docs.example.org"]))
    c = TestClient(app)
    ok = c.get("/api/v1/health", headers={"Origin": "https://docs.example.org"})
    assert ok.headers["access-control-allow-origin"] == "https://docs.example.org"
    other = c.get("/api/v1/health", headers={"Origin": "https://elsewhere.example"})
    assert "access-control-allow-origin" not in other.headers


def test_serves_the_built_site_with_the_right_types(built_site):
    c = TestClient(create_app(Settings(site_dir=built_site)))
    assert "The KV cache, explained" in c.get("/").text
    wasm = next(built_site.glob("assets/pyodide-*/pyodide.asm.wasm")).relative_to(built_site).as_posix()
    assert c.get(f"/{wasm}").headers["content-type"] == "application/wasm"
    assert c.get("/static/kvx-worker.mjs").headers["content-type"].startswith("text/javascript")
    assert c.get("/cache-renting.html").status_code == 200
    assert c.get("/../pyproject.toml").status_code == 404
    assert c.get("/api/v1/health").json()["status"] == "ok"      # the API still wins over the site


def test_without_pytorch_the_kernels_say_so(tmp_path, monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "kvx.compute.routers" and args and args[2] and "kernels" in args[2]:
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    app = create_app(Settings(site_dir=tmp_path))
    monkeypatch.setattr(builtins, "__import__", real_import)
    r = TestClient(app).post("/api/v1/kernels/mla", json={})
    assert r.status_code == 503 and "need PyTorch (No module named 'torch')" in r.json()["detail"]


def test_one_client_gets_a_rate_of_new_evaluations_then_a_429_with_retry_after(tmp_path):
    """The fill attack (tests/benchmarks/attack_server.py): one address asking for distinct answers as fast as
    it can. Past its rate, a 429 with Retry-After, in a sentence naming the rate; answers already given are not
    limited, and another address is not held back."""
    app = create_app(Settings(site_dir=tmp_path / "missing", explainer_rate_per_client="3/minute"))
    one, other = TestClient(app, client=("10.0.0.1", 50000)), TestClient(app, client=("10.0.0.2", 50000))
    url = "/api/v1/explainers/cache-renting"
    assert [one.post(url, json={"context": 1000 + n}).status_code for n in range(3)] == [200, 200, 200]
    r = one.post(url, json={"context": 5000})
    assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 60
    assert r.json() == {"detail": f"You have asked this server for more than 3/minute evaluations it had not "
                                  f"already answered; try again in {r.headers['retry-after']} s. (Answers it has "
                                  f"given before are not limited.)"}
    assert one.post(url, json={"context": 1001}).status_code == 200           # given before: cached, not counted
    assert other.post(url, json={"context": 5000}).status_code == 200


def test_a_rate_that_is_not_one_is_refused_at_start_in_a_sentence():
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="explainer_rate_per_client must be a rate such as '20/second' or "
                                              "'600/minute'; got 'fast'."):
        Settings(explainer_rate_per_client="fast")
