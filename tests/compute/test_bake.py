"""Baked kernel results are the kernels' own output: the committed copy equals a fresh bake."""
from __future__ import annotations

import json
import math

import pytest

from kvx.compute.bake import BAKERS, bake, committed_path
from kvx.explainers.core import baked


def close(a, b, path="") -> list[str]:
    """Differences between two JSON values; floats within 1e-3 relative (one thread, same checkpoints)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in close(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in close(x, y, f"{path}[{i}]")]
    if isinstance(a, float) or isinstance(b, float):
        ok = isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-3,
                                                                                           abs_tol=1e-6)
        return [] if ok else [f"{path}: {a} vs {b}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


@pytest.mark.parametrize("slug", sorted(BAKERS))
def test_committed_results_equal_a_fresh_bake(slug):
    committed = json.loads(committed_path(slug).read_text())
    fresh = bake(slug)
    for side in (committed, fresh):
        side.pop("provenance")
    assert close(committed, fresh) == []


@pytest.mark.parametrize("slug", sorted(BAKERS))
def test_results_say_where_they_were_measured(slug):
    p = baked.load(slug)["provenance"]
    assert p["device"] and p["torch"] and p["baked_on"] and p["command"] == f"kvx bake {slug}"


def test_override_wins_over_the_committed_copy():
    baked.override("a-slug-that-is-not-there", {"x": 1})
    assert baked.load("a-slug-that-is-not-there") == {"x": 1}


def test_an_override_gives_back_the_one_it_replaced_and_none_withdraws_it():
    slug = "paging"                                     # an explainer with no baked results
    assert baked.override(slug, {"x": 1}) is None
    assert baked.override(slug, {"x": 2}) == {"x": 1} and baked.load(slug) == {"x": 2}
    assert baked.override(slug, None) == {"x": 2}
    with pytest.raises(FileNotFoundError, match=f"kvx bake {slug}"):
        baked.load(slug)                                # the committed copy again: here, none


def test_a_missing_bake_names_the_command():
    with pytest.raises(FileNotFoundError, match="kvx bake paging"):
        baked.load("paging")
