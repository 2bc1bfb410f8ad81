"""Every registered explainer keeps the shape the definition of done asks for."""
from __future__ import annotations

import array
import ast
import base64
import dataclasses
import functools
import math
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvx.explainers.registry import LEVELS, PACKED_MIN, REGISTRY, pack_columns, page_json, run

ROOT = Path(__file__).parents[2]
EXPLAINERS = sorted(REGISTRY)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


BROWSER_MODULES = sorted(p for p in (ROOT / "explainers").rglob("*.py") if p.name != "view.py")


@pytest.mark.parametrize("path", BROWSER_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_models_and_core_use_only_the_standard_library(path):
    assert _imports(path) <= set(sys.stdlib_module_names), f"{path} imports {_imports(path) - set(sys.stdlib_module_names)}"


@pytest.mark.parametrize("slug", EXPLAINERS)
def test_explainer_has_model_view_and_page(slug):
    folder = ROOT / "explainers" / slug.replace("-", "_")
    assert {"model.py", "view.py", "page.md"} <= {p.name for p in folder.iterdir()}
    text = (folder / "page.md").read_text()
    for heading in ("## Try this", "## What the model leaves out", "## Sources"):
        assert heading in text


@pytest.mark.parametrize("slug", EXPLAINERS)
def test_parameters_are_frozen_with_units_defaults_and_bounds(slug):
    e = REGISTRY[slug]
    assert e.level in LEVELS and e.claim.endswith(".")
    assert dataclasses.is_dataclass(e.params) and e.params.__dataclass_params__.frozen
    for spec in e.params.describe():
        assert spec["help"]
        if spec["kind"] == "choice":
            assert spec["default"] in spec["choices"]
        else:
            assert spec["unit"] and spec["min"] < spec["max"]
            assert spec["default"] is None and spec["optional"] or spec["min"] <= spec["default"] <= spec["max"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(e.params(), e.params.describe()[0]["name"], "x")


@pytest.mark.parametrize("slug", EXPLAINERS)
def test_page_json_never_raises(slug):
    e = REGISTRY[slug]
    ok = json.loads(page_json(slug, "{}"))
    assert ok["ok"] and ok["data"]["sources"] and ok["data"]["formula"]
    spec = next(s for s in e.params.describe() if s["kind"] != "choice")
    bad = json.loads(page_json(slug, json.dumps({spec["name"]: spec["max"] * 10 + 1})))
    assert bad == {"ok": False, "field": spec["name"], "message": bad["message"]}
    assert spec["name"] in bad["message"] and "between" in bad["message"]
    assert json.loads(page_json("no-such", "{}"))["ok"] is False


@pytest.mark.parametrize("slug", EXPLAINERS)
def test_run_is_deterministic_and_json_ready(slug):
    assert run(slug, {}) == run(slug, {})
    json.dumps(run(slug, {}))
    json.dumps(REGISTRY[slug].page_data(REGISTRY[slug].params()), allow_nan=False)


@pytest.mark.parametrize("slug", list(REGISTRY))
def test_the_workers_warm_up_does_real_work_at_values_the_model_accepts(slug):
    """The warm-up evaluates other values (a cached answer would compile nothing in the browser's engine):
    seeds of a simulation, else of one integer parameter; each accepted, none the default, all different."""
    from kvx.explainers.registry import WARM_UP_RUNS, warm_up_values
    changes = warm_up_values(slug)
    assert len(changes) == WARM_UP_RUNS and len({json.dumps(c) for c in changes}) == WARM_UP_RUNS
    specs = {s["name"]: s for s in REGISTRY[slug].params.describe()}
    for change in changes:
        (name, value), = change.items()
        assert name == "seed" or "seed" not in specs
        assert float(value) != specs[name]["default"]
        assert json.loads(page_json(slug, json.dumps(change)))["ok"], change


def _first_change(slug: str) -> dict:
    """A reader's first change as the page benchmark makes it: the first integer parameter, one above its default."""
    for spec in REGISTRY[slug].params.describe():
        if spec["kind"] == "integer" and spec["name"] != "seed" and spec["default"] is not None:
            change = {spec["name"]: str(spec["default"] + 1)}
            if json.loads(page_json(slug, json.dumps(change)))["ok"]:
                return change
    raise AssertionError(f"{slug}: no integer parameter to change")


# Python function calls of the first change (a count, not a time: the same work gives the same count), after the
# opening and, with `warm`, the worker's warm-up as kvx-worker.mjs runs it: its values once through, then, with
# `reopen`, the opening again. In a fresh interpreter, so every model cache starts empty.
CALLS_OF_FIRST_CHANGE = """
import json, sys
from kvx.explainers.registry import neighbour_values, page_json, warm_up_values
slug, change, warm, reopen = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"
page_json(slug, "{}")
if warm:
    for values in warm_up_values(slug):
        page_json(slug, json.dumps(values))
    for values in neighbour_values(slug):         # the page's passes, which the worker answers during its warm-up
        page_json(slug, json.dumps(values))
    if reopen:
        page_json(slug, "{}")
calls = 0
def count(frame, event, arg):
    global calls
    calls += event == "call"
sys.setprofile(count)
page_json(slug, change)
sys.setprofile(None)
print(calls)
"""


@functools.cache          # a count is the same each time: the cliff's test reuses agent-sessions' two
def _calls_of_first_change(slug: str, warm: bool, reopen: bool = True) -> int:
    out = subprocess.run([sys.executable, "-c", CALLS_OF_FIRST_CHANGE, slug, json.dumps(_first_change(slug)),
                          str(int(warm)), str(int(reopen))], capture_output=True, text=True, check=True, cwd=ROOT)
    return int(out.stdout)


@pytest.mark.parametrize("slug", list(REGISTRY))
def test_the_warm_up_leaves_a_first_change_no_more_work_than_the_opening_did(slug):
    """The worker's warm-up evaluates 200 other values, and meanwhile the page's passes ask for the opening's
    neighbours: they fill the models' caches with their entries. The warm-up ends on the opening once more
    (kvx-worker.mjs), so a reader's first change finds what it shares with the opening as it would right after the
    opening alone, and does no more work than that."""
    assert _calls_of_first_change(slug, warm=True) <= _calls_of_first_change(slug, warm=False)


def test_without_the_opening_again_agent_sessions_first_change_would_rerun_its_cliff():
    """Why the warm-up ends on the opening: agent-sessions' cliff is thirteen runs at the opening's seed, shared by
    every change of its session count; 200 other seeds push them out of simulate's cache (32 entries), and the
    first change reran all thirteen (Python 16-18 ms in the browser against 7 for the later changes)."""
    alone, reopened = _calls_of_first_change("agent-sessions", warm=False), _calls_of_first_change("agent-sessions", warm=True)
    evicted = _calls_of_first_change("agent-sessions", warm=True, reopen=False)
    assert reopened <= alone and evicted > 2 * alone, (alone, reopened, evicted)     # 25,290; 25,290; 58,091


SAMPLE_TRACE = Path(__file__).parents[2] / "explainers" / "load_balancer" / "sample_trace.jsonl"


@pytest.mark.parametrize("slug", list(REGISTRY))
def test_a_change_leaves_no_garbage_in_cycles(slug):
    """What a change drops is freed by reference counting alone, with nothing left in reference cycles for
    Python's cycle collector: its passes over dropped radix trees (nodes point to their parents and children)
    took 60-150 ms of a change in Pyodide, a few changes in eighty, on the prefix-reuse page."""
    import gc
    from kvx.explainers.registry import warm_up_values
    changes = warm_up_values(slug)
    uploads = [{f"_{name}": SAMPLE_TRACE.read_text()} for name in REGISTRY[slug].uploads]
    for c in changes[:3] + uploads:               # imports and first-use caches
        page_json(slug, json.dumps(c))
    gc.collect()
    gc.disable()                                  # only reference counting frees anything from here
    try:
        for c in changes[3:15] + [{**u, **c} for u in uploads for c in changes[3:5]]:
            assert json.loads(page_json(slug, json.dumps(c)))["ok"], c
        left = gc.collect()
    finally:
        gc.enable()
    assert left == 0


def _unpacked(data: dict) -> dict:
    """What the worker makes of a packed reply (kvx-worker.mjs, decodeColumns), in Python: little-endian doubles."""
    def column(col):
        if isinstance(col, dict):
            values = array.array("d", base64.b64decode(col["f64"]))
            if sys.byteorder == "big":
                values.byteswap()
            return values.tolist()
        return col
    return {**data, "sources": {k: {c: column(v) for c, v in cols.items()} for k, cols in data["sources"].items()}}


def test_packed_columns_are_the_same_doubles_bit_for_bit():
    tricky = [1 / 3, 0.1, -0.0, 5e-324, 1.7976931348623157e308, 2.0 ** -1074 * 3, 123456.789e-20] * 10   # 1/3 in the middle
    data = {"sources": {"a": {"tricky": tricky, "ints": list(range(70)), "mixed": [1.5] * 69 + [2],
                              "short": [1 / 3] * (PACKED_MIN - 1), "nan": [1 / 3] * 69 + [math.nan],
                              "words": ["x"] * 70, "round": [0.5] * 70}}}
    out = pack_columns(data)["sources"]["a"]
    assert set(k for k, v in out.items() if isinstance(v, dict)) == {"tricky"}    # the rest stay lists
    back = _unpacked(pack_columns(data))["sources"]["a"]["tricky"]
    assert [math.copysign(1, x) for x in back] == [math.copysign(1, x) for x in tricky]       # -0.0 kept
    assert [x.hex() for x in back] == [x.hex() for x in tricky]
    with pytest.raises(ValueError):                  # NaN is never packed past the strict JSON check
        json.dumps(pack_columns(data), allow_nan=False)


@pytest.mark.parametrize("slug", sorted(REGISTRY))
def test_the_workers_packed_reply_is_the_plain_reply(slug):
    """The worker asks for packed replies; unpacked they are the plain ones, value for value, on every page."""
    spec = next((s for s in REGISTRY[slug].params.describe() if s["name"] in ("sessions", "requests")), None)
    for values in ({}, {spec["name"]: str(spec["max"])} if spec else {}):
        plain = json.loads(page_json(slug, json.dumps(values)))
        packed = json.loads(page_json(slug, json.dumps(values), packed=True))
        assert packed["ok"] and _unpacked(packed["data"]) == plain["data"]
        if slug == "load-balancer":                  # its curves are long columns of long decimals: packed
            assert sum(isinstance(c, dict) for cols in packed["data"]["sources"].values() for c in cols.values()) > 4


@pytest.mark.parametrize("slug", sorted(REGISTRY))
def test_the_passes_values_are_each_number_boxs_neighbours(slug):
    """registry.neighbour_values: one step up and one down from each number box's default (an integer's step 1, a
    number's a twentieth of it), within the box's bounds, one box changed at a time."""
    from kvx.explainers.registry import neighbour_values
    specs = {s["name"]: s for s in REGISTRY[slug].params.describe()}
    changes = neighbour_values(slug)
    assert changes
    for change in changes:
        (name, value), = change.items()
        spec = specs[name]
        step = 1 if spec["kind"] == "integer" else abs(spec["default"]) / 20 or 0.05
        assert float(value) in (pytest.approx(spec["default"] + step), pytest.approx(spec["default"] - step))
        assert spec["min"] is None or float(value) >= spec["min"]
        assert spec["max"] is None or float(value) <= spec["max"]
    boxes = [s for s in specs.values() if s["kind"] in ("integer", "number") and s["default"] is not None]
    assert {next(iter(c)) for c in changes} <= {s["name"] for s in boxes}


def test_mlas_neighbours_worked_by_hand():
    """mla: context 4096 gives 4097 and 4095; bandwidth efficiency and MFU at 1.0, their most, give 0.95 only."""
    from kvx.explainers.registry import neighbour_values
    assert neighbour_values("mla") == [{"context": "4097"}, {"context": "4095"}, {"bandwidth_efficiency": "0.95"},
                                       {"mfu": "0.95"}]
