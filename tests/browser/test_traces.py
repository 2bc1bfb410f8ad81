"""A real-scale trace in the page: the load-balancer page replays an upload past the old limits (8,500 requests,
2.0 MB) in its worker with a progress bar, equals CPython's model for it, and refuses one past the browser's own
limit with a sentence naming that limit."""
from __future__ import annotations

import json
import time

import pytest

from kvx.explainers.core import traces
from kvx.explainers.load_balancer.model import LoadBalancerParams, page_data

READY_MS = 90_000     # cold Pyodide start on a busy 2-core machine


def source(page, key: str) -> dict:
    return page.evaluate(
        """key => { const d = Bokeh.documents[0].get_model_by_name('source:' + key).data;
                     const out = {}; for (const [k, v] of (d instanceof Map ? d : Object.entries(d))) out[k] = Array.from(v);
                     return out; }""", key)


def counter(page, name: str) -> int:
    return int(page.evaluate(f"Number(document.documentElement.dataset.{name} || 0)"))


def test_a_big_trace_replays_in_the_page_with_progress(offline_page, site_url, tmp_path):
    text = traces.to_jsonl(traces.conversation_like(8_500, seed=1))      # the fixture of the CLI and API tests
    assert text.count("\n") > 5_000 and len(text.encode()) > 2_000_000  # past the old limits
    path = tmp_path / "big.jsonl"
    path.write_text(text)
    page = offline_page
    page.goto(f"{site_url}/load-balancer.html?gpus_per_replica=4")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    page.wait_for_function("Number(document.documentElement.dataset.kvxApplied || 0) >= 1", timeout=60_000)
    before, statuses = counter(page, "kvxApplied"), set()
    page.locator("input[type=file]").set_input_files(str(path))
    deadline = time.monotonic() + 240
    while counter(page, "kvxApplied") == before:                        # the page stays responsive meanwhile
        assert time.monotonic() < deadline, "the replay did not finish in 240 s"
        # One read of both, so a progress message landing between two reads cannot pair the old words with the bar.
        status, bar = page.evaluate("[document.getElementById('kvx-status').textContent, "
                                    "!!document.querySelector('#kvx-status progress')]")
        if bar:
            statuses.add(status.split(":")[0])
        time.sleep(0.1)
    assert statuses == {"Working"}                                      # a progress bar while it ran
    assert not page.evaluate("!!document.querySelector('#kvx-status progress')")
    want = json.loads(json.dumps(page_data(LoadBalancerParams(trace=text, gpus_per_replica=4))))
    for key in ("running", "busy", "percentiles", "unlimited"):
        got = source(page, key)
        for col, values in want["sources"][key].items():
            assert got[col] == (pytest.approx(values) if values and isinstance(values[0], float) else values), \
                (key, col)
    note = page.evaluate("window.kvx.text ? kvx.text('trace') : Bokeh.documents[0].get_model_by_name('text:trace').text")
    assert note.startswith("Replaying the uploaded trace: 8,500 requests")

    # Past the browser's limit (40,000 requests): refused at the first line past it, naming the limit.
    line = json.dumps({"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [0]})
    over = tmp_path / "over.jsonl"
    over.write_text((line + "\n") * (traces.BROWSER.requests + 1))
    errors = counter(page, "kvxErrors")
    page.locator("input[type=file]").set_input_files(str(over))
    page.wait_for_function(f"Number(document.documentElement.dataset.kvxErrors || 0) > {errors}", timeout=120_000)
    message = page.evaluate("Bokeh.documents[0].get_model_by_name('error:trace').text")
    assert message == ("A trace may hold at most 40,000 requests in the browser (use `kvx run` for more); line "
                       "40,001 is one more (keep its first lines: head -n 40000).")
