"""Every plot has a text summary (issue 17): a sentence the model words from the columns it hands that plot,
shown under the plot and tied to it by aria-describedby (site/widgets.plot_summaries,
explainers/core/summaries.py). Parametrized over the registry, at the defaults and at a second set of values,
and through the frames of pages that draw a frame at a time."""
from __future__ import annotations

import importlib
import json
import re

import pytest
from bokeh.models import ColumnDataSource, Plot

from kvx.explainers.core import summaries
from kvx.explainers.registry import REGISTRY, page_json
from kvx.site import widgets
from kvx.site.dom_layout import embed

# A second set of values per page that moves every plot's data.
SECOND = {
    "cache-renting": {"context": "128000", "gpu_count": "4"},
    "paging": {"requests": "20", "memory_slots": "4096", "seed": "2"},
    "prefix-reuse": {"users": "4", "system_prompt": "2000", "capacity": "20000"},
    "agent-sessions": {"sessions": "12", "growth_tokens": "6000", "offload": "host-dram"},
    "prompt-caching": {"rate_per_min": "0.1", "prefix_tokens": "20000"},
    "load-balancer": {"replicas": "2", "sessions": "8", "skew": "2"},
    "quantization": {"context": "32000", "batch": "8", "weight_dtype": "fp8"},
    "disaggregation": {"context": "32000", "link": "eth-25g"},
    "mla": {"context": "32768", "kv_dtype": "fp8"},
    "cross-model": {"context": "2000", "map_dtype": "fp8", "small": "qwen2.5-7b"},
    "cross-layer": {"share": "4", "context": "32000", "kv_dtype": "fp8", "keep": "50", "measure": "cosine"},
    "eviction": {"policy": "snapkv", "budget": "50", "layer": "2"},
}


# Sources that only mark the current frame on a plot of the whole run.
MARKERS = {"cursor"}


def data(slug: str, values: dict) -> dict:
    out = json.loads(page_json(slug, json.dumps(values)))
    assert out["ok"], out
    return out["data"]


def view_plots(slug: str, d: dict) -> dict:
    """{plot key: Bokeh plot} for the page's view, with the summaries' captions put in."""
    e = REGISTRY[slug]
    view = importlib.import_module(f"kvx.explainers.{slug.replace('-', '_')}.view")
    layout = widgets.plot_summaries(view.layout(e.params, e.params().as_dict(), d))
    plots = list(layout.select({"type": Plot}))
    unnamed = [p.title.text if p.title else "?" for p in plots if not (p.name or "").startswith("plot:")]
    assert not unnamed, f"plots without a plot:<key> name: {unnamed}"
    return {p.name[len("plot:"):]: p for p in plots}


def drawn_sources(plot) -> set[str]:
    """The page sources a plot draws (glyphs, labels, arrows): the keys of `source:<key>` models it refers to."""
    return {m.name[len("source:"):] for m in plot.references()
            if isinstance(m, ColumnDataSource) and (m.name or "").startswith("source:")}


def test_summaries_helper_escapes_and_refuses_empty():
    assert summaries.summaries(a="x < y  and\n z") == {"summary:a": "x &lt; y and z"}
    assert summaries.of({"summary:a": "1", "trace": "t"}) == {"a": "1"}
    with pytest.raises(ValueError, match="plot b"):
        summaries.summaries(b="  ")


@pytest.mark.parametrize("slug", REGISTRY)
def test_every_plot_has_a_summary_that_follows_its_data(slug):
    first, second = data(slug, {}), data(slug, SECOND[slug])
    plots = view_plots(slug, first)
    assert plots, slug
    said = [summaries.of(first.get("texts", {})), summaries.of(second.get("texts", {}))]
    for key, plot in plots.items():
        for s in said:
            assert key in s and s[key].strip(), (slug, key)
            assert re.search(r"\d", s[key]), (slug, key, s[key])         # worded from the numbers
        # The plot's data moved, so its summary says something else.
        used = drawn_sources(plot)
        assert used, (slug, key)
        if any(first["sources"].get(k) != second["sources"].get(k) for k in used):
            assert said[0][key] != said[1][key], (slug, key, said[0][key])
        # Tied to the plot for assistive technology.
        assert plot.html_attributes["aria-describedby"] == f"kvx-summary-{key}"
    assert set(said[0]) == set(plots), (slug, set(said[0]) ^ set(plots))      # no summary of a plot not drawn


@pytest.mark.parametrize("slug", [s for s, e in REGISTRY.items() if e.frame_data is not None])
def test_frames_reword_the_summaries_of_the_plots_they_redraw(slug):
    """Pages that draw a frame at a time send the summaries of the plots a frame redraws with the frame. A plot
    of the whole run that a frame only marks (a cursor line; the frame's caption says where) keeps its summary."""
    e = REGISTRY[slug]
    params = e.params()
    frames = e.page_data(params)["animation"]["frames"]
    plots = view_plots(slug, e.page_data(params))
    a, b = e.frame_data(params, 0), e.frame_data(params, frames - 1)
    for key, plot in plots.items():
        used = drawn_sources(plot) & set(a["sources"]) - MARKERS
        if not used:
            continue
        sa, sb = summaries.of(a.get("texts", {})), summaries.of(b.get("texts", {}))
        assert key in sa and key in sb, (slug, key)
        if any(a["sources"][k] != b["sources"][k] for k in used):
            assert sa[key] != sb[key], (slug, key, sa[key])


def test_the_page_html_ties_each_plot_to_its_caption():
    """In the built page the summary is a plain element with the id the plot's aria-describedby names, and
    holds the baked sentence before any script runs."""
    e = REGISTRY["paging"]
    d = e.page_data(e.params())
    view = importlib.import_module("kvx.explainers.paging.view")
    script, body = embed(widgets.calm_plots(view.layout(e.params, e.params().as_dict(), d)), d["texts"])
    for key, sentence in summaries.of(d["texts"]).items():
        assert f'id="kvx-summary-{key}" data-kvx-text="summary:{key}"' in body
        assert sentence in body
        assert f'["aria-describedby","kvx-summary-{key}"]' in script
        assert f'"name":"text:summary:{key}"' not in script         # plain DOM, not a Bokeh Div
    assert 'class="kvx-row kvx-plots-row' in body          # plots side by side still wrap on a phone


def test_two_plots_of_one_thing_share_one_caption():
    """A wide and a narrow drawing of the same thing (only one shown at a time) share a key: one caption, under
    the last, and both plots point at it."""
    from bokeh.layouts import column
    from bokeh.plotting import figure
    wide, narrow, other = (figure(name="plot:diagram"), figure(name="plot:diagram", visible=False),
                           figure(name="plot:other"))
    layout = widgets.plot_summaries(column(wide, narrow, other))
    captions = [m for m in layout.references() if (m.name or "").startswith("text:summary:")]
    assert sorted(m.name for m in captions) == ["text:summary:diagram", "text:summary:other"]
    assert layout.children[0] is wide                              # not wrapped: the caption goes under the last
    assert layout.children[1].children[0] is narrow
    assert wide.html_attributes["aria-describedby"] == narrow.html_attributes["aria-describedby"] == "kvx-summary-diagram"
    widgets.plot_summaries(layout)                                 # a second pass changes nothing
    assert len([m for m in layout.references() if (m.name or "").startswith("text:summary:")]) == 2


def test_the_notebook_shows_the_same_captions():
    """kvx.show's view: each plot's caption is there and follows a change, as on the page."""
    pytest.importorskip("panel", reason="the notebook view needs the `notebook` extra (Panel)")
    from kvx.site.notebook import NotebookExplainer
    nb = NotebookExplainer("cache-renting")
    nb.update(context=128000)
    want = summaries.of(data("cache-renting", {"context": "128000"})["texts"])
    assert want and all(nb.model(f"text:summary:{k}").text == v for k, v in want.items())
    assert nb.model("text:summary:curve").html_id == "kvx-summary-curve"
