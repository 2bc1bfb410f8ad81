"""kvx.show's view without a browser: its Bokeh models hold exactly what page_json (the page's worker's entry
point) returns for the same parameters, through changes, bad values, animation frames and "run it here"."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

pytest.importorskip("panel", reason="the notebook view needs the `notebook` extra (Panel)")

from kvx.explainers.registry import page_json  # noqa: E402
from kvx.site.notebook import NotebookExplainer  # noqa: E402


def reply(slug: str, **values) -> dict:
    out = json.loads(page_json(slug, json.dumps(values)))
    assert out["ok"], out
    return out["data"]


def data_of(nb: NotebookExplainer, key: str) -> dict:
    return dict(nb.model(f"source:{key}").data)


def test_importing_kvx_does_not_import_panel():
    code = "import sys, kvx, kvx.explainers.registry; print('panel' in sys.modules, callable(kvx.show))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.split() == ["False", "True"]


def test_a_change_sets_the_sources_texts_and_ranges_the_page_would():
    nb = NotebookExplainer("paging", requests=30)
    assert data_of(nb, "series") == reply("paging", requests="30")["sources"]["series"]
    nb.update(requests=12, seed=2)
    want = reply("paging", requests="12", seed="2")
    assert data_of(nb, "series") == want["sources"]["series"]
    assert [nb.model("range:map_rows").start, nb.model("range:map_rows").end] == want["ranges"]["map_rows"]
    assert nb.model("text:block_table").text == want["texts"]["block_table"]
    assert want["readouts"][0]["value"] in nb.readouts.object
    assert nb.frame == want["animation"]["frame"]             # on-demand: opens where the model says


def test_changing_several_controls_at_once_runs_the_model_once(monkeypatch):
    """update(a=…, b=…) moves both controls, then asks once: each control's own on_change used to run the model,
    the first on half the change (load balancer: 20 sessions on the old 4 replicas, then on 8)."""
    nb = NotebookExplainer("load-balancer")
    asked = []
    ask = nb._ask
    monkeypatch.setattr(nb, "_ask", lambda values: asked.append(dict(values)) or ask(values))
    nb.update(sessions=20, replicas=8)
    assert [(v["sessions"], v["replicas"]) for v in asked] == [("20", "8")]
    want = reply("load-balancer", sessions="20", replicas="8")
    assert data_of(nb, "running") == want["sources"]["running"]
    set_by_reader = nb.model("param:sessions")                     # a reader's change still runs it, once
    set_by_reader.value = "24"
    assert [v["sessions"] for v in asked] == ["20", "24"]


def test_a_bad_value_shows_the_sentence_under_its_control_and_keeps_the_plots():
    nb = NotebookExplainer("paging")
    before = data_of(nb, "series")
    nb.update(requests=0)
    assert nb.model("error:requests").text == "requests must be between 2 and 200 requests; got 0."
    assert data_of(nb, "series") == before
    nb.update(requests=20)
    assert nb.model("error:requests").text == ""


def test_on_demand_frames_come_from_frame_data():
    nb = NotebookExplainer("paging", requests=20)
    nb._seek(3)
    frame = json.loads(page_json("paging", json.dumps({"requests": "20", "_frame": 3})))["data"]
    assert nb.frame == 3 and nb.model("anim:frame").value == 3
    assert data_of(nb, "cursor") == frame["sources"]["cursor"]
    assert nb.model("anim:caption").text == frame["animation"]["caption"]


def test_cumulative_frames_show_the_rows_up_to_the_frame():
    nb = NotebookExplainer("cache-renting")
    a = nb.data["animation"]
    assert a.get("mode") != "on_demand"
    full = nb.data["sources"][a["source"]]
    nb._seek(2)
    shown = data_of(nb, a["source"])
    keep = [i for i, f in enumerate(full["frame"]) if f <= 2]
    assert 0 < len(keep) < len(full["frame"])
    assert shown == {c: [v[i] for i in keep] for c, v in full.items()}
    assert nb.model("anim:caption").text == a["captions"][2]


def test_run_it_here_runs_the_kernel_in_this_process():
    pytest.importorskip("torch")
    nb = NotebookExplainer("quantization", model="llama-3-8b", context=1024, batch=1)
    assert nb.model("run:button").disabled is False
    nb.run_here()
    assert nb.model("text:run_result").text.startswith("Measured on CPU")


def test_kvx_show_in_a_jupyter_kernel_is_inline_and_holds_the_view():
    """A real Jupyter kernel runs `kvx.show`: Panel's and Bokeh's JS go into the notebook itself (no URL to
    fetch them from), and the displayed document holds the page's named sources and controls."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import kvx\nkvx.show('paging', requests=20)")]
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    loads = [o["data"]["application/javascript"] for o in outputs if "application/javascript" in o.get("data", {})]
    assert any("/* BEGIN bokeh.min.js */" in js for js in loads)              # BokehJS itself, inline
    for js in loads:
        for kind in ("js_urls", "css_urls"):
            assert set(re.findall(rf"{kind} = \[[^\]]*\]", js)) <= {f"{kind} = []"}, kind   # nothing to fetch from a CDN
    shown = next(o for o in outputs if o["output_type"] == "execute_result")
    assert "application/vnd.holoviews_exec.v0+json" in shown["data"]
    doc = shown["data"]["text/html"]
    assert all(name in doc for name in ("source:series", "param:requests", "anim:frame", "text:block_table"))
