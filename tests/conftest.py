"""Fixtures shared by the suite: one built site per session."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    """The static site, built once (Pyodide comes from the npm cache, verified against its hash)."""
    from kvx.site.build import build
    return build(tmp_path_factory.mktemp("site"))
