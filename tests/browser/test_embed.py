"""The embedding kit in a real docs site: a small Sphinx site (the kvx-explainer directive) and a small MkDocs
site (the `!!! kvx` Markdown line) are built here, served from their own loopback port (another origin, as
for a real docs host) and opened in Chromium. Each embedded explainer loads from the test server, takes its
content's height (no inner scrollbar), and no request leaves 127.0.0.1."""
from __future__ import annotations

import functools
import socket
import subprocess
import sys
import textwrap
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

SLACK_PX = 3          # the iframe's height against its document's: rounding of fractional CSS px


def settings(url: str) -> dict:
    """A page URL's query without `step`: the page always writes the frame it shows (issue 17)."""
    return {k: v for k, v in parse_qs(urlparse(url).query).items() if k != "step"}


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def docs_host():
    """Serves a folder on its own loopback port; yields a function folder -> base URL."""
    servers = []

    def serve(folder: Path) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"
    yield serve
    for server in servers:
        server.shutdown()


def build_sphinx(tmp: Path, base_url: str) -> Path:
    pytest.importorskip("sphinx")
    src, out = tmp / "sphinx-src", tmp / "sphinx-out"
    src.mkdir()
    (src / "conf.py").write_text(textwrap.dedent(f"""
        project = "kvx embedding test"
        extensions = ["kvx.site.docs_integrations.sphinx_ext"]
        kvx_base_url = {base_url!r}
        html_theme = "alabaster"
    """))
    (src / "index.rst").write_text(textwrap.dedent("""
        Embedding test
        ==============

        Some prose before the explainer.

        .. kvx-explainer:: cache-renting
           :params: context=8192

        Some prose after it.
    """))
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", str(src), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out


def build_mkdocs(tmp: Path, base_url: str) -> Path:
    pytest.importorskip("mkdocs")
    src = tmp / "mkdocs-src"
    (src / "docs").mkdir(parents=True)
    (src / "mkdocs.yml").write_text(textwrap.dedent(f"""
        site_name: kvx embedding test
        theme: {{name: readthedocs, highlightjs: false}}    # its highlight.js comes from a CDN
        markdown_extensions:
          - admonition
          - kvx.site.docs_integrations.markdown_ext:
              base_url: {base_url}
    """))
    (src / "docs" / "index.md").write_text(textwrap.dedent("""
        # Embedding test

        Some prose before the explainer.

        !!! kvx paging requests=20 seed=3

        !!! note
            An admonition still works beside it.
    """))
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q", "-f", str(src / "mkdocs.yml"),
                           "-d", str(tmp / "mkdocs-out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return tmp / "mkdocs-out"


def explainer_frame(page, slug: str):
    page.wait_for_function(f"""() => {{
        const el = document.querySelector('kvx-explainer[slug="{slug}"]');
        return el && el.iframe && el.iframe.dataset.kvxSized === "1";
    }}""")
    frame = next(f for f in page.frames if urlparse(f.url).path.endswith(f"/{slug}.html"))
    frame.wait_for_selector("html[data-py-ready]", state="attached", timeout=120_000)
    return frame


def assert_sized_to_content(page, frame, slug: str):
    """The iframe is as tall as its document (within SLACK_PX), and the document has nothing to scroll."""
    def heights():
        outer = page.evaluate(f"""() => document.querySelector('kvx-explainer[slug="{slug}"]').iframe
                                   .getBoundingClientRect().height""")
        inner = frame.evaluate("() => ({content: document.documentElement.getBoundingClientRect().height, "
                               "scroll: document.documentElement.scrollHeight, "
                               "view: document.documentElement.clientHeight})")
        return outer, inner
    page.wait_for_timeout(500)        # a last ResizeObserver round after Python's status line changed
    outer, inner = heights()
    assert inner["content"] > 1000, inner          # the explainer itself, not an error page
    assert abs(outer - inner["content"]) <= SLACK_PX, (outer, inner)
    assert inner["scroll"] <= inner["view"] + 1, inner   # no inner scrollbar: nothing is hidden below


def test_sphinx_directive_embeds_a_self_sizing_explainer(offline_page, site_url, docs_host, tmp_path, screenshot):
    docs = docs_host(build_sphinx(tmp_path, site_url + "/"))
    page = offline_page
    page.set_viewport_size({"width": 1280, "height": 800})
    page.set_default_timeout(60_000)
    page.goto(f"{docs}/index.html")
    frame = explainer_frame(page, "cache-renting")
    assert urlparse(frame.url).netloc == urlparse(site_url).netloc       # served by the kvx test server
    assert settings(frame.url) == {"context": ["8192"], "embed": ["1"]}
    assert frame.evaluate("() => Bokeh.documents[0].get_model_by_name('param:context').value") == "8192"
    assert_sized_to_content(page, frame, "cache-renting")
    screenshot(page, "embed-sphinx")

    # "Open in kvx ↗" opens the full page with the reader's settings, including one changed in the frame
    box = frame.locator(".bk-input-group", has=frame.locator("label", has_text="gpu count")).locator("input").first
    box.fill("2")
    box.press("Enter")
    frame.wait_for_function("() => new URLSearchParams(location.search).get('gpu_count') === '2'")
    link = frame.locator("a.kvx-open")
    link.hover()
    href = urlparse(link.evaluate("(a) => a.href"))
    assert href.path.endswith("/cache-renting.html")
    assert settings(href.geturl()) == {"context": ["8192"], "gpu_count": ["2"]}     # the settings, not embed=1

    # the element's attributes are reflected to the iframe's URL: new params load a new view, sized again
    page.evaluate("""() => document.querySelector('kvx-explainer').setAttribute('params', 'context=32768')""")
    page.wait_for_function("""() => document.querySelector('kvx-explainer').iframe.src.includes('context=32768')""")
    frame = explainer_frame(page, "cache-renting")
    assert frame.evaluate("() => Bokeh.documents[0].get_model_by_name('param:context').value") == "32768"
    assert_sized_to_content(page, frame, "cache-renting")


def test_mkdocs_extension_embeds_a_self_sizing_explainer(offline_page, site_url, docs_host, tmp_path, screenshot):
    out = build_mkdocs(tmp_path, site_url + "/")
    html = (out / "index.html").read_text()
    assert 'class="admonition note"' in html and "<kvx-explainer" in html
    docs = docs_host(out)
    page = offline_page
    page.set_viewport_size({"width": 1280, "height": 800})
    page.set_default_timeout(60_000)
    page.goto(f"{docs}/index.html")
    frame = explainer_frame(page, "paging")
    assert settings(frame.url) == {"requests": ["20"], "seed": ["3"], "embed": ["1"]}
    assert frame.evaluate("() => Bokeh.documents[0].get_model_by_name('param:requests').value") == "20"
    assert_sized_to_content(page, frame, "paging")
    screenshot(page, "embed-mkdocs")
    # a narrower window reflows the explainer: its ResizeObserver reports the new height and the frame follows
    before = page.evaluate("() => document.querySelector('kvx-explainer').iframe.getBoundingClientRect().height")
    page.set_viewport_size({"width": 480, "height": 800})
    page.wait_for_function("""(h) => Math.abs(document.querySelector('kvx-explainer').iframe
                                              .getBoundingClientRect().height - h) > 20""", arg=before)
    assert_sized_to_content(page, frame, "paging")


def test_height_only_from_the_sized_frame_and_its_origin(offline_page, site_url, docs_host, tmp_path):
    """kvx-embed.js takes a height only from the iframe's own window and from its src's origin."""
    (tmp_path / "host.html").write_text(f"""<!doctype html><meta charset="utf-8">
        <script src="{site_url}/static/kvx-embed.js"></script>
        <iframe id="a" data-kvx-autosize style="height:100px" src="{site_url}/static/favicon.svg"></iframe>""")
    page = offline_page
    page.goto(f"{docs_host(tmp_path)}/host.html")
    page.wait_for_function("() => customElements.get('kvx-explainer')")
    send = """([origin, fromFrame]) => {
        const a = document.getElementById('a');
        window.dispatchEvent(new MessageEvent('message', {data: {type: 'kvx:height', height: 432}, origin,
                                                          source: fromFrame ? a.contentWindow : window}));
        return a.style.height;
    }"""
    assert page.evaluate(send, ["http://127.0.0.2:1", True]) == "100px"      # the right window, another origin
    assert page.evaluate(send, [site_url, False]) == "100px"                 # the right origin, another window
    assert page.evaluate(send, [site_url, True]) == "432px"                  # both right: sized

