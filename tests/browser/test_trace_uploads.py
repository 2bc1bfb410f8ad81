"""agent-sessions replays an uploaded Mooncake-format trace in the page: the plots equal CPython's model for that
file, the page says which workload runs, a control change keeps the file, a bad line is refused under the file
input, and "Use the built-in data" goes back to the synthetic sessions. The file never enters the URL."""
from __future__ import annotations

import dataclasses
import json

from kvx.explainers.agent_sessions.model import AgentParams, page_data
from kvx.explainers.core import traces

from . import pagehooks
from .pagehooks import applied, assert_sources_equal, expected, wait_applied

READY_MS = 90_000     # cold Pyodide start on a busy 2-core machine


def set_control(page, name: str, value: str) -> None:
    pagehooks.set_control(page, name, value, slug="agent-sessions")


def test_agent_sessions_replays_an_uploaded_trace(offline_page, site_url, screenshot, tmp_path):
    text = traces.to_jsonl(traces.conversation_like(400, seed=2))
    path = tmp_path / "agent.jsonl"
    path.write_text(text)

    def want(**values):
        p = dataclasses.replace(AgentParams.from_mapping(values), trace=text)
        return json.loads(json.dumps(page_data(p)))

    page = offline_page
    page.goto(f"{site_url}/agent-sessions.html?offload=host-dram")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    wait_applied(page, 0)
    assert page.evaluate("kvx.text('trace')").startswith("Workload: the synthetic sessions")
    before = applied(page)
    page.locator("input[type=file]").set_input_files(str(path))
    wait_applied(page, before)
    assert_sources_equal(page, want(offload="host-dram"))
    assert page.evaluate("kvx.text('trace')").startswith("Workload: your trace, 400 requests")
    assert "trace" not in pagehooks.wait_url(page, "offload=host-dram")
    screenshot(page, "agent-sessions-uploaded")

    before = applied(page)
    set_control(page, "mfu", "0.4")
    wait_applied(page, before)
    assert_sources_equal(page, want(offload="host-dram", mfu=0.4))

    bad = tmp_path / "bad.jsonl"
    bad.write_text(text.splitlines()[0] + "\n" + '{"timestamp": 5, "input_length": 1, "output_length": 1}\n')
    errors = int(page.evaluate("Number(document.documentElement.dataset.kvxErrors || 0)"))
    page.locator("input[type=file]").set_input_files(str(bad))
    page.wait_for_function(f"Number(document.documentElement.dataset.kvxErrors || 0) > {errors}", timeout=30_000)
    message = page.evaluate("Bokeh.documents[0].get_model_by_name('error:trace').text")
    assert message == "The trace's line 2: hash_ids is missing."
    assert page.get_by_text(message).is_visible() and "Traceback" not in page.content()

    before = applied(page)
    page.get_by_role("button", name="Use the built-in data").click()
    wait_applied(page, before)
    assert_sources_equal(page, expected("agent-sessions", offload="host-dram", mfu=0.4))
    assert page.evaluate("kvx.text('trace')").startswith("Workload: the synthetic sessions")
