"""Every control's label on every page says its unit once at most (issue 17: "pause mean s (s)",
"seed (seed)"), and keeps it: a unit left out of the brackets is one the name already says."""
from __future__ import annotations

import re

import pytest

from kvx.explainers.registry import REGISTRY
from kvx.site import widgets

# How the code spells a unit inside a name, written as the unit is; and words that join, not name, a unit.
SHORT = {"s": "s", "ms": "ms", "us": "µs", "min": "min", "hour": "h", "gb": "gb", "gbps": "gb/s"}
JOINERS = {"per", "of", "or", "the", "a"}


def said(word: str) -> str:
    word = SHORT.get(word.lower(), word.lower())
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


def unit_words(unit: str) -> set[str]:
    return {said(w) for w in re.split(r"[\s/]+", unit) if w and w.lower() not in JOINERS}


def repeats(label: str) -> str | None:
    """Why a label says its unit twice, or None."""
    m = re.fullmatch(r"(.*?)(?: \(([^()]*)\))?", label)
    name, unit = m.group(1), m.group(2) or ""
    both = {said(w) for w in name.split()} & (unit_words(unit) | {said(unit)} if unit else set())
    if both:
        return f"the name and the unit both say {sorted(both)}"
    if unit and f" {unit.lower()} " in f" {name.lower()} ":
        return f"{unit!r} appears twice"
    return None


CONTROLS = [(slug, spec) for slug in sorted(REGISTRY) for spec in REGISTRY[slug].params.describe()]


@pytest.mark.parametrize("slug, spec", CONTROLS, ids=[f"{slug}-{spec['name']}" for slug, spec in CONTROLS])
def test_a_label_says_its_unit_once(slug, spec):
    label = widgets.title(spec)
    assert repeats(label) is None, f"{slug}: {label!r}: {repeats(label)}"
    if spec["unit"]:                                    # the unit is kept, in the brackets or by the name
        name, _, rest = label.partition(" (")
        missing = unit_words(spec["unit"]) - unit_words(rest.rstrip(")")) - {said(w) for w in name.split()}
        assert not missing or spec["unit"] in rest, f"{slug}: {label!r} lost {sorted(missing)} of {spec['unit']!r}"


@pytest.mark.parametrize("name, unit, want", [
    ("pause_mean_s", "s", "pause mean (s)"), ("seed", "seed", "seed"), ("gpu_count", "GPUs", "gpu count"),
    ("rate_per_min", "requests/min", "rate (requests/min)"), ("link_gbps", "Gb/s", "link (Gb/s)"),
    ("kv_dtype", "dtype or bits", "kv dtype (or bits)"), ("context", "tokens", "context (tokens)"),
    ("latency_us", "µs", "latency (µs)"), ("gpu_price_per_hour", "$/h", "gpu price ($/h)"), ("model", "", "model")])
def test_the_rule_on_known_labels(name, unit, want):
    assert widgets.title({"name": name, "unit": unit}) == want


@pytest.mark.parametrize("label", ["pause mean s (s)", "seed (seed)", "gpu count (GPUs)", "lifetime s (s)",
                                   "rate per min (requests/min)", "kv dtype (dtype or bits)", "link gbps (Gb/s)"])
def test_the_check_finds_the_old_labels(label):
    assert repeats(label) is not None
