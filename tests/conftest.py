"""Fixtures shared by the suite: one built site per session."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    """The static site, built once (Pyodide comes from the npm cache, verified against its hash).
    KVX_TEST_SITE=build/site reuses a site `kvx build` just made from this checkout (a quick rerun of a few
    browser tests); without it every session builds its own. A reused site's fresh kernel bakes are not
    loaded into this process, so tests comparing baked pages with CPython (cross-layer) may then differ."""
    import os
    from pathlib import Path
    if os.environ.get("KVX_TEST_SITE"):
        return Path(os.environ["KVX_TEST_SITE"]).resolve()
    from kvx.site.build import build
    return build(tmp_path_factory.mktemp("site"))
