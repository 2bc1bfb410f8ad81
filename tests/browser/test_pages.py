"""Every page in headless Chromium: loads offline, a control changes the plot, and the plot's values
equal CPython's model for the same parameters."""
from __future__ import annotations

import json
import re

import pytest

from kvx.explainers.registry import REGISTRY

from .pagehooks import (applied, assert_sources_equal, expected, set_control, source_data, wait_all_drawn, wait_applied,
                        wait_url)

READY_MS = 90_000     # cold Pyodide start on a busy 2-core machine; typically 3-8 s


def baked_run_text(page) -> str:
    """The "run it here" text the site build baked: a real measurement, labelled with where it ran."""
    text = page.evaluate("kvx.text('run_result')")
    assert text.startswith("Baked when the site was built") and "Measured on" in text
    return text


def run_here(page, timeout: int) -> str:
    """Click "Run it here" once the page has found the server; the server's measurement, as the page words it."""
    page.wait_for_function("!Bokeh.documents[0].get_model_by_name('run:button').disabled", timeout=10_000)
    page.get_by_role("button", name=re.compile("Run it here")).click()
    page.wait_for_function("Number(document.documentElement.dataset.kvxRun || 0) > 0", timeout=timeout)
    text = page.evaluate("kvx.text('run_result')")
    assert text.startswith("Measured on")
    return text


@pytest.mark.parametrize("path", ["index.html", "glossary.html"])
def test_plain_pages_load_offline(offline_page, site_url, screenshot, path):
    offline_page.goto(f"{site_url}/{path}")
    assert offline_page.locator("h1").count() == 1
    screenshot(offline_page, path.removesuffix(".html"))


def test_cache_renting_draws_baked_plot_then_goes_live(offline_page, site_url, screenshot):
    page = offline_page
    page.goto(f"{site_url}/cache-renting.html")
    page.wait_for_selector("html[data-kvx-drawn]", state="attached", timeout=20_000)
    # Drawn from baked data before Python is ready: the defaults' numbers.
    assert_sources_equal(page, expected("cache-renting"))
    assert "344" in page.locator("#kvx-readouts").inner_text()
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)

    before = applied(page)
    set_control(page, "context", "128000")
    wait_applied(page, before)
    want = expected("cache-renting", context=128000)
    assert_sources_equal(page, want)
    assert want["sources"]["point"]["sessions"] == [10]
    assert "128,000" in page.locator("#kvx-formula").inner_text()
    wait_url(page, "context=128000")
    screenshot(page, "cache-renting-128k")


def test_cache_renting_bad_value_shows_inline_message_and_keeps_plot(offline_page, site_url, screenshot):
    page = offline_page
    page.goto(f"{site_url}/cache-renting.html")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    set_control(page, "gpu_count", "0")
    page.wait_for_function("Number(document.documentElement.dataset.kvxErrors || 0) > 0", timeout=30_000)
    message = page.evaluate("Bokeh.documents[0].get_model_by_name('error:gpu_count').text")
    assert message == "gpu count must be between 1 and 64 GPUs; got 0."     # the control's label, not the field
    assert page.get_by_text(message).is_visible()
    assert_sources_equal(page, expected("cache-renting"))           # nothing lost
    assert "Traceback" not in page.content()
    before = applied(page)
    set_control(page, "gpu_count", "4")
    wait_applied(page, before)
    assert page.evaluate("Bokeh.documents[0].get_model_by_name('error:gpu_count').text") == ""
    assert_sources_equal(page, expected("cache-renting", gpu_count=4))
    screenshot(page, "cache-renting-recovered")


def test_cache_renting_url_state_animation_and_keyboard(offline_page, site_url):
    page = offline_page
    page.goto(f"{site_url}/cache-renting.html?context=128000&step=3")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    page.wait_for_function("Number(document.documentElement.dataset.kvxApplied || 0) > 0", timeout=30_000)
    want = expected("cache-renting", context=128000)
    frames = want["animation"]["frames"]
    assert frames == 12                     # weights, 10 sessions, the one that does not fit
    page.locator("body").click(position={"x": 5, "y": 5})
    page.keyboard.press("Home")
    # Step from the end back to the start and forward again with the keyboard.
    page.evaluate("window.kvx.anim.reset()")
    assert page.evaluate("document.documentElement.dataset.kvxFrame") == "0"
    assert len(source_data(page, "memory")["kind"]) == 2            # weights and workspace only
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.documentElement.dataset.kvxFrame") == "2"
    assert source_data(page, "memory")["kind"] == ["weights", "reserve", "session", "session"]
    wait_url(page, "step=2", "context=128000")
    page.keyboard.press(" ")
    page.wait_for_function(f"document.documentElement.dataset.kvxFrame === '{frames - 1}'", timeout=20_000)
    assert source_data(page, "memory")["kind"][-1] == "rejected"
    assert "the node is full at 10 sessions" in page.evaluate("kvx.text('caption')")
    wait_url(page, f"step={frames - 1}")      # the frame is always in the address, the last one too


def test_cache_renting_try_this_link_applies_in_place(offline_page, site_url):
    page = offline_page
    page.goto(f"{site_url}/cache-renting.html")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    before = applied(page)
    page.get_by_role("link", name="Store the cache in fp8").click()
    wait_applied(page, before)
    assert_sources_equal(page, expected("cache-renting", kv_dtype="fp8"))
    assert page.evaluate("Bokeh.documents[0].get_model_by_name('param:kv_dtype').value") == "fp8"


def test_setting_many_controls_at_once_asks_python_once(offline_page, site_url):
    """A link, "reset all" and the browser's Back set several controls at once, then ask for one evaluation.
    Bokeh runs a control's callback a few microtasks after its value changes, so each control the page set used
    to ask again: "reset all" after two changes evaluated three times, and the load balancer drew its reply
    only after the worker had run all three (the requests sent are counted: state.latest)."""
    page = offline_page
    page.goto(f"{site_url}/cache-renting.html")
    page.wait_for_selector("html[data-kvx-warmed]", state="attached", timeout=READY_MS)
    asked = lambda: page.evaluate("window.kvx.state.latest")          # noqa: E731
    widget = "Bokeh.documents[0].get_model_by_name('param:{}').value"
    defaults = REGISTRY["cache-renting"].params.from_mapping({})
    # The warm-up ran every control's change path (warmControls: another value and back) and asked for nothing.
    page.wait_for_timeout(200)
    assert asked() == 0
    assert page.evaluate(widget.format("context")) == str(defaults.context)
    assert page.evaluate(widget.format("kv_dtype")) == defaults.kv_dtype

    before, n = applied(page), asked()
    page.get_by_role("link", name="Store the cache in fp8").click()   # one control set by a link
    wait_applied(page, before)
    assert asked() == n + 1
    before, n = applied(page), asked()
    set_control(page, "context", "128000")                            # a reader's own change: one request
    wait_applied(page, before)
    assert asked() == n + 1
    want = expected("cache-renting", kv_dtype="fp8", context=128000)
    assert_sources_equal(page, want)

    # The link's entry in the history took the reader's change too (the address is replaced, not pushed): Back
    # goes to the page as opened, both controls to their defaults, and Forward to both changes again.
    for move, want in ((page.go_back, expected("cache-renting")), (page.go_forward, want)):
        before, n = applied(page), asked()
        move()
        wait_applied(page, before)
        page.wait_for_timeout(200)                                     # an echo would have been sent by now
        assert asked() == n + 1
        assert_sources_equal(page, want)
    assert page.evaluate(widget.format("context")) == "128000"

    before, n = applied(page), asked()
    page.click("#kvx-reset-all")                                       # two controls back to their defaults
    wait_applied(page, before)
    page.wait_for_timeout(200)
    assert asked() == n + 1
    assert page.evaluate(widget.format("kv_dtype")) == defaults.kv_dtype
    assert_sources_equal(page, expected("cache-renting"))
    page.wait_for_function("!/kv_dtype|context/.test(location.search)", timeout=10_000)   # the address too


def test_changes_faster_than_python_evaluate_only_the_newest(offline_page, site_url):
    """Five changes within one task (a choice stepped through with the arrow keys, faster than Python answers):
    the first goes to the worker, the other four wait and replace each other, and only the newest goes once the
    first's reply is in, so the worker evaluates two, not five, and the page draws the newest."""
    page = offline_page
    page.goto(f"{site_url}/cache-renting.html")
    page.wait_for_selector("html[data-kvx-warmed]", state="attached", timeout=READY_MS)
    n, before = page.evaluate("window.kvx.state.latest"), applied(page)
    page.evaluate("""() => { const box = Bokeh.documents[0].get_model_by_name('param:context');
                             for (const v of [8000, 16000, 32000, 64000, 96000]) box.value = String(v); }""")
    page.wait_for_function(f"window.kvx.state.handled === {n + 2}", timeout=30_000)
    page.wait_for_timeout(200)                                         # a third request would have gone by now
    assert page.evaluate("window.kvx.state.latest") == n + 2
    assert applied(page) == before + 1                                 # the first's reply was not drawn
    assert_sources_equal(page, expected("cache-renting", context=96000))
    wait_url(page, "context=96000")


def test_frames_dragged_faster_than_python_evaluate_only_the_newest(offline_page, site_url):
    """A frame slider dragged across nine on-demand frames within one task: two frame requests, the newest drawn."""
    from kvx.explainers.paging.model import PagingParams, frame_data
    page = offline_page
    page.goto(f"{site_url}/paging.html")
    page.wait_for_selector("html[data-kvx-warmed]", state="attached", timeout=READY_MS)
    n = page.evaluate("window.kvx.state.latestFrame")
    page.evaluate("() => { for (let k = 1; k <= 9; k++) window.kvx.anim.seek(k); }")
    page.wait_for_function(f"window.kvx.state.handledFrame === {n + 2}", timeout=30_000)
    page.wait_for_timeout(200)
    assert page.evaluate("window.kvx.state.latestFrame") == n + 2
    assert page.evaluate("document.documentElement.dataset.kvxFrame") == "9"
    want = json.loads(json.dumps(frame_data(PagingParams(), 9)))
    for key in ("reserve_map", "paged_map", "cursor"):
        got = source_data(page, key)
        assert got == {k: pytest.approx(v) if v and isinstance(v[0], float) else v
                       for k, v in want["sources"][key].items()}, key
    wait_url(page, "step=9")


def test_embed_mode_shows_the_explainer_alone(offline_page, site_url, screenshot):
    page = offline_page
    page.goto(f"{site_url}/cache-renting.html?embed=1")
    page.wait_for_selector("html[data-kvx-drawn]", state="attached", timeout=20_000)
    assert not page.locator("#try-this").is_visible()
    assert not page.locator("header").is_visible()
    assert page.locator("#kvx-readouts").is_visible()
    screenshot(page, "cache-renting-embed")


# One change of a typed control per explainer: the generic check every page must pass.
CHANGES = {"cache-renting": {"context": "64000"},
           "quantization": {"batch": "16", "context": "128000", "bandwidth_efficiency": "0.8"},
           "paging": {"block_size": "64"}, "prefix-reuse": {"capacity": "5000"},
           "prompt-caching": {"rate_per_min": "0.05"}, "agent-sessions": {"sessions": "4"},
           "load-balancer": {"load_weight": "0"},
           "disaggregation": {"links": "1", "context": "32000"},
           "cross-model": {"context": "2000"},
           "cross-layer": {"share": "4"},
           "eviction": {"budget": "50"},
           "mla": {"context": "16384", "mfu": "0.5"}}


def test_every_explainer_has_a_browser_change():
    assert set(CHANGES) == set(REGISTRY)


@pytest.mark.parametrize("slug", sorted(REGISTRY))
def test_explainer_goes_live_and_matches_cpython(offline_page, site_url, screenshot, slug):
    page = offline_page
    page.goto(f"{site_url}/{slug}.html")
    page.wait_for_selector("html[data-kvx-drawn]", state="attached", timeout=20_000)
    assert_sources_equal(page, expected(slug))                       # baked, before Python
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    for name, value in CHANGES[slug].items():
        before = applied(page)
        set_control(page, name, value)
        wait_applied(page, before)
    assert_sources_equal(page, expected(slug, **CHANGES[slug]))
    wait_url(page, *(f"{name}={value}" for name, value in CHANGES[slug].items()))
    assert page.locator("#kvx-formula .kvx-formula-line").count() >= 3
    screenshot(page, f"{slug}-changed")


def test_paging_steps_on_demand_frames_that_equal_cpython(offline_page, site_url):
    from kvx.explainers.paging.model import PagingParams, frame_data
    page = offline_page
    page.goto(f"{site_url}/paging.html")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    page.evaluate("window.kvx.anim.reset()")
    page.wait_for_function("Number(document.documentElement.dataset.kvxFrameApplied || 0) >= 1", timeout=30_000)
    page.locator("body").click(position={"x": 5, "y": 5})
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    page.wait_for_function("document.documentElement.dataset.kvxFrame === '3' && "
                           "Number(document.documentElement.dataset.kvxFrameApplied) >= 2", timeout=30_000)
    page.wait_for_timeout(300)                                  # let the latest of the three replies land
    want = json.loads(json.dumps(frame_data(PagingParams(), 3)))
    for key in ("reserve_map", "paged_map", "cursor"):
        got = source_data(page, key)
        assert got == {k: pytest.approx(v) if v and isinstance(v[0], float) else v
                       for k, v in want["sources"][key].items()}, key
    text = page.evaluate("kvx.text('block_table')")
    assert text == want["texts"]["block_table"]
    wait_url(page, "step=3")


def test_quantization_runs_the_real_kernel_on_the_server(offline_page, site_url):
    page = offline_page
    page.goto(f"{site_url}/quantization.html?context=32000&batch=8")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    baked_run_text(page)
    text = run_here(page, timeout=60_000)
    assert "The cache was 68% of the bytes" in text


def test_mla_runs_the_real_kernel_on_the_server(offline_page, site_url):
    page = offline_page
    page.goto(f"{site_url}/mla.html?context=2048")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    baked = baked_run_text(page)
    assert "trained MLA model" in baked and "4,096 cached tokens" in baked and "Outputs agree" in baked
    text = run_here(page, timeout=60_000)
    assert "2,048 cached tokens" in text
    assert "absorbed 524.29 KB" in text and "the server counted" not in text      # 2,048 x 64 x 4 B, as computed


def test_mla_steps_frames_that_equal_cpython(offline_page, site_url):
    from kvx.explainers.mla.model import MLAParams, frame_data
    page = offline_page
    page.goto(f"{site_url}/mla.html")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    page.evaluate("window.kvx.anim.reset()")
    page.wait_for_function("Number(document.documentElement.dataset.kvxFrameApplied || 0) >= 1", timeout=30_000)
    page.locator("body").click(position={"x": 5, "y": 5})
    for _ in range(9):
        page.keyboard.press("ArrowRight")
    page.wait_for_function("document.documentElement.dataset.kvxFrame === '9' && "
                           "Number(document.documentElement.dataset.kvxFrameApplied) >= 2", timeout=30_000)
    page.wait_for_timeout(300)                                  # let the latest reply land
    want = json.loads(json.dumps(frame_data(MLAParams(), 9)))
    for key in ("boxes", "arrows"):
        got = source_data(page, key)
        assert got == {k: pytest.approx(v) if v and isinstance(v[0], float) else v
                       for k, v in want["sources"][key].items()}, key
    text = page.evaluate("kvx.text('step_costs')")
    assert text == want["texts"]["step_costs"] and "[128 × 512]" in text
    wait_url(page, "step=9")


def test_load_balancer_replays_an_uploaded_trace(offline_page, site_url, screenshot, tmp_path):
    """The reader uploads the shipped Mooncake sample: the plots equal CPython's model for that file, a
    control change and an animation step keep it, a bad file is refused under the file input, and
    "Use the built-in data" goes back to the synthetic trace. The file never enters the URL."""
    import dataclasses
    from pathlib import Path

    from kvx.explainers.load_balancer.model import LoadBalancerParams, frame_data, page_data
    sample = Path(__file__).parents[2] / "explainers" / "load_balancer" / "sample_trace.jsonl"
    text = sample.read_text()

    def want(**values):
        p = dataclasses.replace(LoadBalancerParams.from_mapping(values), trace=text)
        return json.loads(json.dumps(page_data(p)))

    page = offline_page
    page.goto(f"{site_url}/load-balancer.html?replicas=3")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    wait_applied(page, 0)
    before = applied(page)
    page.locator("input[type=file]").set_input_files(str(sample))
    wait_applied(page, before)
    assert_sources_equal(page, want(replicas=3))
    note = page.evaluate("kvx.text('trace')")
    assert note.startswith("Replaying the uploaded trace: 36 requests")
    assert "trace" not in wait_url(page, "replicas=3")

    before = applied(page)
    set_control(page, "load_weight", "0")
    wait_applied(page, before)
    assert_sources_equal(page, want(replicas=3, load_weight=0))

    page.evaluate("window.kvx.anim.reset()")
    page.wait_for_function("document.documentElement.dataset.kvxFrame === '0' && "
                           "Number(document.documentElement.dataset.kvxFrameApplied || 0) >= 1", timeout=30_000)
    page.wait_for_timeout(300)
    frame = json.loads(json.dumps(frame_data(dataclasses.replace(
        LoadBalancerParams(replicas=3, load_weight=0), trace=text), 0)))
    for key in ("cache", "queue", "here"):
        got = source_data(page, key)
        assert got == {k: pytest.approx(v) if v and isinstance(v[0], float) else v
                       for k, v in frame["sources"][key].items()}, key
    screenshot(page, "load-balancer-uploaded")

    bad = tmp_path / "bad.jsonl"
    bad.write_text(text.splitlines()[0] + "\n" + '{"timestamp": 5, "input_length": -1, "output_length": 1, '
                   '"hash_ids": [0]}\n')
    errors = int(page.evaluate("Number(document.documentElement.dataset.kvxErrors || 0)"))
    page.locator("input[type=file]").set_input_files(str(bad))
    page.wait_for_function(f"Number(document.documentElement.dataset.kvxErrors || 0) > {errors}", timeout=30_000)
    message = page.evaluate("Bokeh.documents[0].get_model_by_name('error:trace').text")
    assert message == "The trace's line 2: input_length must be a whole number ≥ 1; got -1."
    assert page.get_by_text(message).is_visible() and "Traceback" not in page.content()

    before = applied(page)
    page.get_by_role("button", name="Use the built-in data").click()
    wait_applied(page, before)
    assert_sources_equal(page, expected("load-balancer", replicas=3, load_weight=0))
    assert page.evaluate("Bokeh.documents[0].get_model_by_name('error:trace').text") == ""


def test_cross_model_runs_the_real_kernel_on_the_server(offline_page, site_url):
    page = offline_page
    page.goto(f"{site_url}/cross-model.html")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    baked = baked_run_text(page)
    assert "gqa-small" in baked and "bits per byte" in baked and "worse than the small model alone" in baked
    text = run_here(page, timeout=120_000)
    assert "4,096 tokens of training text" in text


def test_a_link_with_parameters_and_a_step_opens_on_that_step(offline_page, site_url):
    """On-demand pages redraw their opening frame when new parameters arrive; the URL's step must win."""
    from kvx.explainers.paging.model import PagingParams, frame_data
    page = offline_page
    page.goto(f"{site_url}/paging.html?block_size=32&step=5")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    page.wait_for_function("document.documentElement.dataset.kvxFrame === '5' && "
                           "Number(document.documentElement.dataset.kvxFrameApplied || 0) >= 1", timeout=30_000)
    page.wait_for_timeout(300)
    want = json.loads(json.dumps(frame_data(PagingParams(block_size=32), 5)))
    assert source_data(page, "cursor") == want["sources"]["cursor"]
    assert page.evaluate("Bokeh.documents[0].get_model_by_name('anim:frame').value") == 5


def test_cross_layer_shows_baked_measurements_and_runs_the_real_kernel(offline_page, site_url):
    page = offline_page
    page.goto(f"{site_url}/cross-layer.html?measure=cosine")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    wait_applied(page, 0)
    assert_sources_equal(page, expected("cross-layer", measure="cosine"))     # the baked heat maps, as CPython reads them
    assert "Raw cosine of gqa-large" in page.evaluate("kvx.text('similarity')")
    baked = baked_run_text(page)
    assert "gqa-large over 4,096 held-out tokens" in baked and "(the baked heat map: " in baked
    text = run_here(page, timeout=120_000)
    assert "with its own cache" in text and "1:4" in text


def test_eviction_runs_the_real_kernel_and_steps_its_bounded_cache(offline_page, site_url):
    from kvx.explainers.eviction.model import EvictionParams, frame_data
    page = offline_page
    page.goto(f"{site_url}/eviction.html?policy=no_sinks&budget=10&step=5")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    wait_applied(page, 0)
    want = expected("eviction", policy="no_sinks", budget="10")
    frame_keys = ("life", "cut", "marks", "cursor", "steploss")     # redrawn by the step-5 frame
    assert_sources_equal(page, {"sources": {k: v for k, v in want["sources"].items() if k not in frame_keys}})
    page.wait_for_function("document.documentElement.dataset.kvxFrame === '5' && "
                           "Number(document.documentElement.dataset.kvxFrameApplied || 0) >= 1", timeout=30_000)
    page.wait_for_timeout(300)
    want = json.loads(json.dumps(frame_data(EvictionParams(policy="no_sinks", budget=10), 5)))
    for key in ("life", "cut", "marks"):
        assert source_data(page, key) == {k: pytest.approx(v) if v and isinstance(v[0], float) else v
                                          for k, v in want["sources"][key].items()}, key
    baked = baked_run_text(page)
    from kvx.explainers.eviction.model import budget_tokens
    assert f"keeping {budget_tokens(0.2, 423)} of the 423-token prompt (20%)" in baked   # 84: kvpress floors
    assert "The baked sweep (" in baked
    text = run_here(page, timeout=120_000)
    assert "StreamingLLM with its sinks evicted keeping 42 of the 423-token" in text


def shown_summaries(page) -> dict:
    """Every plot on the page with its summary as the browser holds it: the caption's text as the model sent it
    (kvx.text), as shown (innerText), where the plot's aria-describedby leads, and that both are in the same
    (light) DOM tree, so the reference resolves for assistive technology."""
    return page.evaluate("""() => {
        const out = {};
        for (const plot of document.querySelectorAll('[aria-describedby^="kvx-summary-"]')) {
            const id = plot.getAttribute('aria-describedby');
            const key = id.slice('kvx-summary-'.length);
            const box = document.getElementById(id);
            out[key] = {sent: kvx.text('summary:' + key), shown: box ? box.innerText.trim() : null,
                        text: box ? box.dataset.kvxText : null, role: plot.getAttribute('role'),
                        sameTree: !!box && plot.getRootNode() === document && box.getRootNode() === document,
                        visible: !!box && box.getBoundingClientRect().height > 0};
        }
        return out;
    }""")


@pytest.mark.parametrize("slug, change", [("paging", ("requests", "20")), ("cache-renting", ("context", "128000"))])
def test_plot_summaries_equal_cpython_after_a_change_and_describe_their_plots(offline_page, site_url, slug, change):
    """Issue 17: every plot is described by a caption under it (aria-describedby), worded by the model from the
    plotted numbers; after a control change the captions hold exactly CPython's page_data for the new values, and
    Chromium's accessibility tree gives each plot that sentence as its description."""
    import html as html_

    from playwright.sync_api import expect

    from kvx.explainers.core import summaries
    page = offline_page
    page.goto(f"{site_url}/{slug}.html")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    before = applied(page)
    set_control(page, change[0], change[1], slug)
    wait_applied(page, before)
    # A plot below the first screen is drawn after ready (kvx-page.js, drawTheRest), and its element, which carries
    # aria-describedby, exists from then: on a slow host the change came before the last of them.
    wait_all_drawn(page, READY_MS)
    want = summaries.of(expected(slug, **{change[0]: change[1]})["texts"])
    assert want != summaries.of(expected(slug)["texts"])              # the change rewords them
    got = shown_summaries(page)
    assert set(got) == set(want), (set(got), set(want))
    for key, sentence in want.items():
        g = got[key]
        assert g["sent"] == sentence, key                              # the model's words, to the character
        assert g["shown"] == html_.unescape(sentence), key             # and what the reader sees
        assert g["text"] == f"summary:{key}" and g["sameTree"] and g["visible"] and g["role"] == "img", (key, g)
        expect(page.locator(f'[aria-describedby="kvx-summary-{key}"]')).to_have_accessible_description(
            html_.unescape(sentence))
    if slug == "paging":                                               # a frame rewords the maps' summaries
        from kvx.explainers.paging.model import PagingParams, frame_data
        frames_before = int(page.evaluate("Number(document.documentElement.dataset.kvxFrameApplied || 0)"))
        page.evaluate("window.kvx.anim.reset()")
        page.wait_for_function("document.documentElement.dataset.kvxFrame === '0' && "
                               f"Number(document.documentElement.dataset.kvxFrameApplied || 0) > {frames_before}",
                               timeout=30_000)
        page.wait_for_timeout(300)
        frame = summaries.of(frame_data(PagingParams.from_mapping({"requests": "20"}), 0)["texts"])
        assert frame["paged_map"].startswith("Paged at step 0:")
        for key, sentence in frame.items():
            assert page.evaluate(f"kvx.text('summary:{key}')") == sentence, key
