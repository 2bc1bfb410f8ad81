"""Fixtures shared by the suite: one built site per session."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    """The static site, built once (Pyodide comes from the npm cache, verified against its hash).
    KVX_TEST_SITE=build/site reuses a site `kvx build` just made from this checkout (a quick rerun of a few
    browser tests); without it every session builds its own."""
    import os
    if os.environ.get("KVX_TEST_SITE"):
        site = Path(os.environ["KVX_TEST_SITE"]).resolve()
        use_the_sites_bakes(site)
        return site
    from kvx.site.build import build
    return build(tmp_path_factory.mktemp("site"))


def use_the_sites_bakes(site: Path) -> None:
    """A build puts its fresh kernel bakes into its wheel and into this process (baked.override), so the pages and
    CPython draw the same numbers. A site built by another process did the first only: its bakes (another date,
    this CPU's last digits) are loaded here as the build would have, or every comparison of a baked page with
    CPython (cross-layer, eviction, the worker's replies) fails on them."""
    from kvx.explainers.core import baked
    from kvx.explainers.registry import REGISTRY
    wheels = list(site.glob("assets/models-*/kvx_models-*.whl"))
    assert len(wheels) == 1, f"{site} should hold one models wheel, not {len(wheels)}"
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
        for slug in REGISTRY:
            if baked.wheel_path(slug) in names:
                baked.override(slug, json.loads(wheel.read(baked.wheel_path(slug))))
