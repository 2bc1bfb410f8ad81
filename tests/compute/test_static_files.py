"""`kvx serve` serves the built site like a static host: cache rules per kind, precompressed copies chosen
by Accept-Encoding, the original type kept (.wasm stays application/wasm), Vary, and a page's policy
computed from the page as the browser decodes it."""
from __future__ import annotations

import gzip

import brotli
import pytest
from fastapi.testclient import TestClient

from kvx.compute.app import create_app
from kvx.compute.security import csp_for_html
from kvx.compute.settings import Settings
from kvx.compute.static_files import IMMUTABLE, SHORT, accepted
from kvx.site import assets

PAGE = (b"<!doctype html><html><head><script>document.documentElement.dataset.x = 1</script></head><body>"
        + b"<p>words</p>" * 400 + b"</body></html>")
WASM = b"\x00asm\x01\x00\x00\x00" + bytes(range(256)) * 64


@pytest.fixture
def site(tmp_path):
    (tmp_path / "assets" / "pyodide-abc").mkdir(parents=True)
    (tmp_path / "assets" / "pyodide-abc" / "pyodide.asm.wasm").write_bytes(WASM)
    (tmp_path / "assets" / "kvx-page.0123456789.js").write_text("// runtime\n" * 300)
    (tmp_path / "index.html").write_bytes(PAGE)
    (tmp_path / "static").mkdir()
    (tmp_path / "static" / "favicon.svg").write_text("<svg/>")
    made = assets.precompress(tmp_path)
    assert made == {"gzip": 3, "br": 3}
    return tmp_path


@pytest.fixture
def client(site):
    return TestClient(create_app(Settings(site_dir=site)))


def test_cache_control_per_kind(client):
    assert client.get("/assets/kvx-page.0123456789.js").headers["cache-control"] == IMMUTABLE
    assert client.get("/assets/pyodide-abc/pyodide.asm.wasm").headers["cache-control"] == IMMUTABLE
    for path in ("/", "/index.html", "/static/favicon.svg"):
        assert client.get(path).headers["cache-control"] == SHORT, path
    assert IMMUTABLE == "public, max-age=31536000, immutable"


@pytest.mark.parametrize("accept, coding", [("br, gzip", "br"), ("gzip, deflate, br, zstd", "br"), ("gzip", "gzip"),
                                            ("br;q=0, gzip", "gzip"), ("identity", None), ("", None), ("*", "br")])
def test_accept_encoding_picks_the_copy(client, site, accept, coding):
    r = client.get("/assets/pyodide-abc/pyodide.asm.wasm", headers={"Accept-Encoding": accept})
    assert r.status_code == 200
    assert r.headers.get("content-encoding") == coding
    assert r.headers["content-type"] == "application/wasm"        # Pyodide's streaming compile needs it
    assert r.headers["vary"] == "Accept-Encoding"
    raw = r.content if coding is None else None
    # httpx decodes gzip and br itself: the body the client sees is the original file either way.
    assert (raw or r.content) == WASM
    want = {"br": ".br", "gzip": ".gz", None: ""}[coding]
    size = (site / "assets" / "pyodide-abc" / f"pyodide.asm.wasm{want}").stat().st_size
    assert int(r.headers["content-length"]) == size


def test_each_copy_has_its_own_etag_and_revalidates(client):
    path = "/index.html"
    br = client.get(path, headers={"Accept-Encoding": "br"})
    gz = client.get(path, headers={"Accept-Encoding": "gzip"})
    plain = client.get(path, headers={"Accept-Encoding": "identity"})
    assert len({br.headers["etag"], gz.headers["etag"], plain.headers["etag"]}) == 3
    again = client.get(path, headers={"Accept-Encoding": "br", "If-None-Match": br.headers["etag"]})
    assert again.status_code == 304
    assert again.headers["cache-control"] == SHORT and again.headers["vary"] == "Accept-Encoding"


def test_small_files_have_no_copies_and_no_vary(client):
    r = client.get("/static/favicon.svg", headers={"Accept-Encoding": "br, gzip"})
    assert "content-encoding" not in r.headers and "vary" not in r.headers


def test_a_compressed_page_gets_the_policy_of_its_decoded_scripts(client):
    for coding in ("br", "gzip", "identity"):
        r = client.get("/", headers={"Accept-Encoding": coding})
        assert r.headers["content-security-policy"] == csp_for_html(PAGE), coding
    head = client.head("/", headers={"Accept-Encoding": "br"})
    assert head.headers["content-security-policy"] == csp_for_html(PAGE)


def test_accepted_reads_q_values():
    assert accepted("gzip;q=0.5, br;q=0, deflate") == {"gzip", "deflate"}
    assert accepted("") == set()
    assert gzip.decompress(gzip.compress(b"x")) == b"x" and brotli.decompress(brotli.compress(b"x")) == b"x"
