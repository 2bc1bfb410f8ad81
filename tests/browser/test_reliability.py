"""Pages keep working when what they lean on fails: no compute server, a dead Python worker."""
from __future__ import annotations

import functools
import http.server
import threading

import pytest

from kvx.explainers.registry import REGISTRY

from .test_pages import READY_MS, applied, expected, assert_sources_equal, set_control, wait_applied

RUN_PAGES = sorted(slug for slug, e in REGISTRY.items() if e.describe_run is not None)


@pytest.fixture(scope="module")
def static_url(built_site):
    """The built site on a plain static file server: no API at all, as on any static host or CDN."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(built_site))
    handler.extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                              ".mjs": "text/javascript", ".wasm": "application/wasm", ".js": "text/javascript"}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.RequestHandlerClass.log_message = lambda *a: None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("slug", RUN_PAGES)
def test_without_a_server_pages_show_baked_measurements_and_say_so(offline_page, static_url, slug):
    page = offline_page                    # it also asserts no console errors: the probe must not 404
    page.goto(f"{static_url}/{slug}.html")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    page.wait_for_function("Bokeh.documents[0].get_model_by_name('run:button').label.includes('no kvx server')",
                           timeout=10_000)
    assert page.evaluate("Bokeh.documents[0].get_model_by_name('run:button').disabled")
    assert page.evaluate("kvx.text('run_result')").startswith("Baked when")


def test_a_dead_worker_is_replaced_on_the_next_change(offline_page, site_url):
    page = offline_page
    page.goto(f"{site_url}/cache-renting.html")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    page.evaluate("kvx.worker.dispatchEvent(new ErrorEvent('error', {message: 'simulated crash'}))")
    page.wait_for_function("document.documentElement.dataset.kvxWorkerDied === '1'")
    assert "simulated crash" in page.locator("body").inner_text()
    before = applied(page)
    set_control(page, "context", "64000")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    wait_applied(page, before)
    assert_sources_equal(page, expected("cache-renting", context=64000))
