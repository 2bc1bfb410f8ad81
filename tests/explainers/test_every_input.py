"""Every explainer, anywhere within its bounds, through every entry point.

A reader can set any parameter to any value its bounds allow, alone or together with the others. The
answer is then either a ParamError, one sentence naming the field (a combination that cannot exist:
weights that do not fit, a parallel degree that does not split the heads), or results that are finite
and serialise as strict JSON (no NaN, no Infinity: JavaScript's JSON.parse refuses them, and so does
the API). This drives the strategies from each explainer's own `describe()`, bounds included, through
the model, the browser worker's entry point (`registry.page_json`), the CLI (`kvx run --json`) and the
API (valid input is never a 5xx; invalid input is a 422 with the same sentence).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kvx.explainers.core.dtypes import MAX_BITS, MIN_BITS
from kvx.explainers.core.params import ParamError
from kvx.explainers.registry import REGISTRY, page_json, run

# Examples per explainer for the models and the worker: the simulators cost more per call, so get fewer.
EXAMPLES = {"paging": 25, "load-balancer": 8, "prefix-reuse": 8, "agent-sessions": 30}
DEFAULT_EXAMPLES = 60
SLUGS = list(REGISTRY)


def strict_loads(text: str):
    """json.loads that refuses NaN and Infinity, as JavaScript's JSON.parse does."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def strict_dumps(data) -> str:
    return json.dumps(data, allow_nan=False)


def value_strategy(spec: dict, parsed: bool):
    """Any value the bounds allow, with the bounds themselves drawn often."""
    if spec["kind"] == "choice":
        options = st.sampled_from(spec["choices"])
        if parsed:   # a dtype field also takes a bit-width
            options = st.one_of(options, st.sampled_from([f"{MIN_BITS:g}", f"{MAX_BITS:g}", "4.5"]),
                                st.floats(MIN_BITS, MAX_BITS).map(lambda x: f"{x:.4g}"))
    elif spec["kind"] == "integer":
        lo, hi = int(spec["min"]), int(spec["max"])
        options = st.one_of(st.sampled_from([lo, hi]), st.integers(lo, hi))
    else:
        lo, hi = spec["min"], spec["max"]
        options = st.one_of(st.sampled_from([lo, hi]), st.floats(lo, hi, allow_nan=False))
        if lo > 0 and hi / lo > 100:             # wide ranges: every order of magnitude, as the fuzzer does
            options = st.one_of(options, st.floats(math.log(lo), math.log(hi)).map(
                lambda x: min(hi, max(lo, math.exp(x)))))
    return st.one_of(st.none(), options) if spec["optional"] else options


def values_strategy(slug: str):
    """Either one parameter moved from its default, or all of them at once."""
    e = REGISTRY[slug]
    specs = e.params.specs()
    fields = {d["name"]: value_strategy(d, specs[d["name"]][1].parse is not None) for d in e.params.describe()}
    one = st.sampled_from(sorted(fields)).flatmap(lambda name: st.fixed_dictionaries({name: fields[name]}))
    return st.one_of(one, st.fixed_dictionaries(fields))


def assert_one_sentence(slug: str, err_field: str, message: str) -> None:
    """A refusal names a real field, in one sentence."""
    e = REGISTRY[slug]
    assert err_field in e.params.specs() or err_field in e.uploads, (err_field, message)
    assert err_field in message, message
    assert "\n" not in message and message.endswith("."), message
    assert not re.search(r"[.!?]\s+[A-Z]", message), f"more than one sentence: {message}"


def frames_to_try(data: dict) -> list[int]:
    frames = data.get("animation", {}).get("frames", 1)
    return sorted({0, 1, frames - 1, frames + 3})      # first, second, last, and past the end (clamped)


def check_model(slug: str, values: dict):
    """The model itself: a sentence or strict-JSON results. Returns the params, or None if refused."""
    e = REGISTRY[slug]
    try:
        p = e.params.from_mapping(dict(values))
    except ParamError as err:
        assert_one_sentence(slug, err.field, str(err))
        return None
    for result in (e.evaluate(p), run(slug, dict(values))):
        strict_dumps(result)
    data = e.page_data(p)
    strict_dumps(data)
    if e.frame_data is not None:
        for k in frames_to_try(data):
            strict_dumps(e.frame_data(p, k))
    return p


def check_worker(slug: str, values: dict, refused: bool):
    """The browser worker's entry point never raises and always answers strict JSON."""
    reply = strict_loads(page_json(slug, json.dumps(values)))
    if refused:
        assert reply["ok"] is False and reply["field"] is not None, reply
        assert_one_sentence(slug, reply["field"], reply["message"])
        return
    assert reply["ok"] is True, reply
    if REGISTRY[slug].frame_data is not None:
        for k in frames_to_try(reply["data"]):
            frame = strict_loads(page_json(slug, json.dumps({**values, "_frame": k})))
            assert frame["ok"] is True, frame


@pytest.mark.parametrize("slug", SLUGS)
def test_every_input_is_refused_in_a_sentence_or_answered_in_strict_json(slug):
    @settings(max_examples=EXAMPLES.get(slug, DEFAULT_EXAMPLES), deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(values_strategy(slug))
    def check(values):
        p = check_model(slug, values)
        check_worker(slug, values, refused=p is None)

    check()


def test_the_strategies_reach_both_answers():
    """The strategies above are not vacuous: over the whole registry they find refusals and answers."""
    outcomes = {"refused": 0, "answered": 0}

    @settings(max_examples=60, deadline=None, database=None)
    @given(st.sampled_from(["cache-renting", "agent-sessions", "disaggregation", "prompt-caching"]).flatmap(
        lambda slug: st.tuples(st.just(slug), values_strategy(slug))))
    def check(case):
        slug, values = case
        outcomes["refused" if check_model(slug, values) is None else "answered"] += 1

    check()
    assert outcomes["refused"] > 0 and outcomes["answered"] > 0, outcomes


# ---- the command line ----------------------------------------------------------------------------------
def cli(args: list[str]) -> tuple[int, str, str]:
    from kvx.compute.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("slug", SLUGS)
def test_kvx_run_json_is_strict_or_a_sentence(slug):
    @settings(max_examples=6, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(values_strategy(slug))
    def check(values):
        pairs = [f"{k}={v!r}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items() if v is not None]
        code, out, err = cli(["run", slug, *pairs, "--json"])
        try:
            REGISTRY[slug].params.from_mapping({k: v for k, v in values.items() if v is not None})
        except ParamError as refusal:
            assert code == 2 and out == "" and err.strip() == f"kvx: {refusal}"
            return
        assert code == 0, err
        assert strict_loads(out)["explainer"] == slug

    check()


@pytest.mark.parametrize("args,code,expect", [
    (["prompt-caching", "read_multiplier=1"], 0, "never"),              # was Infinity, not JSON
    (["prompt-caching", "write_multiplier=1", "read_multiplier=1"], 0, "no difference"),   # was a ZeroDivisionError
    (["cache-renting", "model=llama-3-405b", "gpu_count=1"], 2, "gpu_count must be at least 11"),
])
def test_kvx_run_in_a_subprocess(args, code, expect):
    done = subprocess.run([sys.executable, "-m", "kvx.compute.cli", "run", *args, "--json"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == code, done.stderr
    if code == 0:
        assert strict_loads(done.stdout)["break_even_kind"] == expect
    else:
        assert done.stdout == "" and done.stderr.startswith(f"kvx: {expect}") and done.stderr.count("\n") == 1


# ---- the API ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from fastapi.testclient import TestClient

    from kvx.compute.app import create_app
    from kvx.compute.settings import Settings
    # Hundreds of distinct evaluations in a few seconds from one address: past the server's default rate of new
    # evaluations (tests/compute/test_api.py checks that 429), which is not what these tests are about.
    settings = Settings(site_dir=tmp_path_factory.mktemp("nosite") / "missing", explainer_rate_per_client="1000/second")
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.mark.parametrize("slug", SLUGS)
def test_the_api_never_fails_on_input_within_bounds(slug, client):
    @settings(max_examples=4, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(values_strategy(slug))
    def check(values):
        body = {k: v for k, v in values.items() if v is not None}
        r = client.post(f"/api/v1/explainers/{slug}", json=body)
        assert r.status_code < 500 or r.status_code == 503, (r.status_code, r.text)   # 503: busy, retry
        answer = strict_loads(r.text)
        try:
            REGISTRY[slug].params.from_mapping(dict(body))
        except ParamError as refusal:
            assert r.status_code == 422, r.text
            assert answer["detail"][0]["msg"] == str(refusal) and answer["detail"][0]["loc"][-1] == refusal.field
            return
        if r.status_code == 422:           # only a run past the server's time limit may be refused
            assert answer["detail"][0]["type"] == "too_slow", answer
        elif r.status_code == 200:
            assert answer["explainer"] == slug

    check()


def test_the_api_refuses_an_impossible_configuration_in_the_models_sentence(client):
    r = client.post("/api/v1/explainers/cache-renting", json={"model": "llama-3-405b", "gpu_count": 1})
    assert r.status_code == 422
    assert r.json()["detail"][0]["msg"].startswith("gpu_count must be at least 11 to hold Llama 3.1 405B's")
    r = client.post("/api/v1/explainers/prompt-caching", json={"write_multiplier": 1, "read_multiplier": 1})
    assert r.status_code == 200 and r.json()["break_even_hit_rate"] is None


def test_kvx_run_json_never_prints_a_non_finite_number(monkeypatch):
    """Should a model ever return infinity, `kvx run --json` says it is a bug instead of printing `Infinity`."""
    e = REGISTRY["prompt-caching"]
    monkeypatch.setitem(REGISTRY, "prompt-caching", dataclasses.replace(e, evaluate=lambda p: {"x": math.inf}))
    code, out, err = cli(["run", "prompt-caching", "--json"])
    assert (code, out) == (1, "") and "not finite" in err and "\n" == err[-1] and err.count("\n") == 1
