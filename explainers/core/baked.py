"""Results of the real kernels, baked by `kvx bake` (and again by every site build) for the pages to draw.

A page whose heavy part runs on the compute server (attention maps of a trained model, measured loss
against cache budget) cannot compute it in the browser. The build runs the kernels in CPython with
PyTorch and ships the result as `baked.json` beside the explainer's model; the model reads it here,
with the standard library only, so the browser, `kvx run` and the tests all draw the same numbers.
The committed copy is what a checkout without PyTorch uses; a test re-runs the kernels and checks
that it still matches, so it is never typed in by hand.
"""
from __future__ import annotations

import json
from functools import cache, lru_cache
from importlib import resources

FILE = "baked.json"
_overrides: dict[str, dict] = {}        # the site build's fresh results, which win over the committed copy
_derived: list = []                     # caches of results computed from the data, emptied when it is replaced


def package(slug: str) -> str:
    return slug.replace("-", "_")


def wheel_path(slug: str) -> str:
    """Where an explainer's baked results lie in the models wheel (the site build writes them there)."""
    return f"kvx/explainers/{package(slug)}/{FILE}"


def override(slug: str, data: dict | None) -> dict | None:
    """Results that win over the committed copy (the site build's fresh bake); None withdraws them. Returns the
    override it replaced, so a caller (a test) can put back what was in effect."""
    replaced = _overrides.pop(slug, None)
    if data is not None:
        _overrides[slug] = data
    _committed.cache_clear()
    for derived_cache in _derived:
        derived_cache.cache_clear()
    return replaced


def derived(maxsize: int | None):
    """An lru_cache for a function of baked data (a page's arrangement of it), emptied whenever override()
    replaces the data, so a cached answer never outlives the numbers it came from."""
    def wrap(fn):
        cached = lru_cache(maxsize=maxsize)(fn)
        _derived.append(cached)
        return cached
    return wrap


@cache
def _committed(slug: str) -> dict:
    path = resources.files(f"kvx.explainers.{package(slug)}").joinpath(FILE)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{slug} has no baked kernel results yet: run `kvx bake {slug}` "
                                "(it needs PyTorch and the trained checkpoints).") from None


def load(slug: str) -> dict:
    """The baked results for an explainer: {"provenance": {...}, ...whatever its baker returned}."""
    return _overrides[slug] if slug in _overrides else _committed(slug)
