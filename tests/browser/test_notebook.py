"""kvx.show's notebook view, served by Panel on loopback and driven in Chromium: a control typed into the
page's own Bokeh input runs the model in this Python, and the plotted columns equal CPython's page_data."""
from __future__ import annotations

import json
import socket
import time

import pytest

pn = pytest.importorskip("panel", reason="the notebook view needs the `notebook` extra (Panel)")

from kvx.explainers.registry import get, page_json  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served():
    """Serves apps (name -> function making the Panel object) on 127.0.0.1; yields their base URL."""
    servers = []

    def start(apps: dict):
        port = _free_port()
        server = pn.serve(apps, port=port, address="127.0.0.1", websocket_origin=f"127.0.0.1:{port}",
                          show=False, threaded=True, verbose=False)
        servers.append(server)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("Panel's server did not start")
                time.sleep(0.1)
        return f"http://127.0.0.1:{port}"
    yield start
    for server in servers:
        server.stop()


def _columns(page, name: str) -> dict:
    return page.evaluate("""(name) => {
        const doc = Bokeh.documents[0];
        const m = doc && doc.get_model_by_name(name);
        if (!m) return null;
        const out = {};
        const entries = m.data instanceof Map ? [...m.data] : Object.entries(m.data);
        for (const [k, v] of entries) out[k] = Array.from(v);
        return out;
    }""", name)


def _expected(slug: str, params: dict) -> dict:
    reply = json.loads(page_json(slug, json.dumps(params)))
    assert reply["ok"], reply
    return reply["data"]


def test_notebook_view_runs_the_model_in_this_python(offline_page, served, screenshot):
    import kvx
    base = served({"paging": lambda: kvx.show("paging", requests=30)})
    page = offline_page
    page.set_default_timeout(60_000)
    page.goto(f"{base}/paging")
    page.wait_for_function("() => window.Bokeh && Bokeh.documents[0] && "
                           "Bokeh.documents[0].get_model_by_name('source:series')")
    # the starting parameters reached the model: the plot holds page_data(requests=30)
    start = _expected("paging", {"requests": "30"})
    assert _columns(page, "source:series") == start["sources"]["series"]

    # the reader types into the page's own control (the Bokeh input named param:requests, found by its label)
    box = page.locator(".bk-input-group", has=page.locator("label", has_text="requests")).locator("input").first
    box.fill("12")
    box.press("Enter")
    want = _expected("paging", {"requests": "12"})
    assert want["sources"]["series"] != start["sources"]["series"]
    page.wait_for_function("""(n) => Bokeh.documents[0].get_model_by_name('source:series').data
                                     .paged_running.length === n""",
                           arg=len(want["sources"]["series"]["paged_running"]))
    assert _columns(page, "source:series") == want["sources"]["series"]
    readouts = page.locator(".kvx-nb-readouts").first.inner_text()
    assert want["readouts"][0]["value"] in readouts
    screenshot(page, "notebook-paging")


def test_show_refuses_a_bad_parameter_with_the_models_sentence():
    import kvx
    from kvx.explainers.core.params import ParamError
    with pytest.raises(ParamError, match="requests must be between"):
        kvx.show("paging", requests=0)
    with pytest.raises(ParamError, match="context is not a parameter"):
        kvx.show("paging", context=8192)
    assert get("paging")  # the slug the tests use exists
