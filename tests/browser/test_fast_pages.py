"""Pages that start fast and cost little the second time: the Python snapshot and its fallback give the
same values, a second page comes from the browser's cache, assets come compressed with their own types."""
from __future__ import annotations

import json
import re
import socket
import threading
import time
from html import unescape

import pytest
import uvicorn

from kvx.compute.app import create_app
from kvx.compute.serving import BytesSent
from kvx.compute.settings import Settings
from kvx.explainers.registry import REGISTRY, neighbour_values

from .conftest import ARGS, CHROMIUM
from .pagehooks import (applied, assert_sources_equal, collect_garbage, control_box, expected, functions_called,
                        set_control, wait_all_drawn, wait_applied)

READY_MS = 90_000
SLUG, FIELD, VALUE = "paging", "requests", "57"            # a simulation: a change runs real Python


def source_data(page) -> dict:
    return page.evaluate("""() => { const out = {};
        for (const m of Bokeh.documents[0].all_models) if (m.name && m.name.startsWith('source:')) {
          const d = m.data; const cols = {};
          for (const [k, v] of (d instanceof Map ? d : Object.entries(d))) cols[k] = Array.from(v);
          out[m.name.slice(7)] = cols; }
        return out; }""")


def change_and_read(page, url: str) -> tuple[str, dict]:
    page.goto(url)
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    boot = page.evaluate("document.documentElement.dataset.kvxBoot")
    # Either way the worker starts, what Python holds at ready (the interpreter and every model: tens of thousands
    # of objects) is frozen out of the cycle collector's walks (kvx-worker.mjs, HOOK).
    assert int(page.evaluate("document.documentElement.dataset.kvxFrozen")) > 10_000
    before = int(page.evaluate("Number(document.documentElement.dataset.kvxApplied || 0)"))
    page.evaluate(f"Bokeh.documents[0].get_model_by_name('param:{FIELD}').value = '{VALUE}'")
    page.wait_for_function(f"Number(document.documentElement.dataset.kvxApplied || 0) > {before}", timeout=30_000)
    return boot, source_data(page)


def test_snapshot_and_normal_boot_give_identical_values(offline_page, site_url, built_site):
    page = offline_page
    cfg = json.loads((built_site / f"{SLUG}.html").read_text().split('id="kvx-config">', 1)[1].split("</script>")[0])
    assert cfg["snapshot"], "the build made no snapshot (is Node installed?)"
    boot, restored = change_and_read(page, f"{site_url}/{SLUG}.html")
    assert boot == "snapshot"

    # A snapshot the browser cannot use (here: not a snapshot at all) must leave the reader with a working page.
    page.context.route("**/*.snapshot", lambda route: route.fulfill(status=200, body=b"not a snapshot" * 8,
                                                                       content_type="application/octet-stream"))
    boot, booted = change_and_read(page, f"{site_url}/{SLUG}.html")
    assert boot == "boot"
    assert "could not" not in page.locator("#kvx-status").inner_text()
    assert booted == restored
    e = REGISTRY[SLUG]
    want = json.loads(json.dumps(e.page_data(e.params.from_mapping({FIELD: VALUE}))))
    for key, cols in want["sources"].items():
        for col, values in cols.items():
            got = restored[key][col]
            assert got == pytest.approx(values) if values and isinstance(values[0], float) else got == values, (key, col)


@pytest.fixture
def counted_site(built_site):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = BytesSent(create_app(Settings(site_dir=built_site)))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield app, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_second_page_costs_under_0_3_mb_on_the_wire(playwright, counted_site, tmp_path):
    app, url = counted_site
    # A persistent profile: a disk cache, as a reader's browser has.
    ctx = playwright.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                       args=ARGS, headless=True)
    page = ctx.pages[0] if ctx.pages else ctx.new_page()
    responses = []
    page.on("response", lambda r: responses.append(r))
    try:
        page.goto(f"{url}/cache-renting.html")
        page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
        first = app.total
        # Pyodide, BokehJS, the wheel and the snapshot: several MB even compressed (so the counting counts).
        assert first > 3_000_000, first
        wasm = next(r for r in responses if r.url.endswith("pyodide.asm.wasm"))
        headers = wasm.all_headers()
        assert headers["content-type"] == "application/wasm"
        assert headers["content-encoding"] in {"br", "gzip"}          # Chromium offers br over HTTPS only
        assert headers["cache-control"] == "public, max-age=31536000, immutable"
        assert headers["vary"] == "Accept-Encoding"
        html = next(r for r in responses if r.url.endswith("cache-renting.html")).all_headers()
        assert html["cache-control"] == "public, max-age=60, must-revalidate"

        page.wait_for_timeout(500)                    # the page's last requests (the server probe) land first
        app.total = 0
        page.goto(f"{url}/prompt-caching.html")
        page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
        page.wait_for_timeout(500)
        assert app.total <= 300_000, app.total
    finally:
        ctx.close()


RECORD_CSS_LOOKUPS = """() => {
    const visual = Bokeh.require("core/visuals/visual").VisualProperties.prototype;
    const skip = visual._get_css_value, lookup = window.kvx.bokehOwn.cssLookup;
    if (lookup === null || skip.call(null, "line-color") !== "") return false;
    const seen = window.kvxCssSeen = {calls: 0, set: []};
    visual._get_css_value = function (name) {
        const value = lookup.call(this, name);
        seen.calls++;
        if (value !== "") seen.set.push(`${this.css_prefix}${name}: ${value}`);
        return value;
    };
    window.kvxCssRestore = () => { visual._get_css_value = skip; };
    return true;
}"""


FONT_SIZES = """() => { const PlotView = Bokeh.Models.get("Plot").prototype.default_view;
    return Array.from(Bokeh.index.all_views()).filter((v) => v instanceof PlotView)
      .map((v) => [window.kvx.bokehOwn.fontSizeRead.call(v), v.base_font_size]); }"""


# Every legend's entries after a change to every data source (which Bokeh answers with a rebuild the page
# skips when nothing in the legend changed), then after Bokeh's own rebuild: the two must be the same.
LEGENDS_KEPT_AND_REBUILT = """() => {
    const doc = Bokeh.documents[0], Legend = Bokeh.Models.get("Legend").prototype.default_view;
    for (const m of doc.all_models) if (m.type === "ColumnDataSource") m.data = new Map(m.data instanceof Map ? m.data : Object.entries(m.data));
    const legends = Array.from(Bokeh.index.all_views()).filter((v) => v instanceof Legend);
    const read = () => legends.map((v) => [v.entries.map((e) => [e.label, e.el.isConnected, e.el.className]),
                                           v.grid_el.innerHTML.replace(/<canvas[^>]*>/g, "<canvas>")]);
    const kept = read();
    for (const v of legends) window.kvx.bokehOwn.legendRebuild.call(v);
    return [kept, read()];
}"""


def test_the_style_reads_the_page_skips_would_give_what_it_uses_on_every_page(offline_page, site_url):
    """The page answers BokehJS's per-paint CSS-variable lookups (--bk-<visual>-<property>) as unset, and
    each plot keeps its font size until the window is resized: each saves a style recalculation per read.
    That is only right while what Bokeh itself would read agrees: its own lookup, run over every plot of
    every page as it paints at a phone's width and a laptop's, must find no variable set (a stylesheet that
    set one fails this), and every plot's kept font size must equal a fresh read at each width. Legends the
    page does not rebuild on a data change must equal Bokeh's own rebuild."""
    page = offline_page
    legend_entries = 0
    for slug in REGISTRY:
        page.set_viewport_size({"width": 1280, "height": 900})
        page.goto(f"{site_url}/{slug}.html")
        # Every plot, the ones below the first screen too (drawn once Python is ready), each as it first painted.
        wait_all_drawn(page, READY_MS)
        assert page.evaluate(RECORD_CSS_LOOKUPS), f"{slug}: the page does not skip Bokeh's CSS lookups"
        sizes = page.evaluate(FONT_SIZES)                              # as kept since the first paint
        assert sizes and all(read == kept for read, kept in sizes), (slug, "first paint", sizes)
        for width, height in ((360, 800), (1280, 900)):               # each layout paints every plot again
            page.set_viewport_size({"width": width, "height": height})
            page.wait_for_timeout(400)
            sizes = page.evaluate(FONT_SIZES)
            assert sizes and all(read == kept for read, kept in sizes), (slug, width, sizes)
        seen = page.evaluate("() => { window.kvxCssRestore(); return window.kvxCssSeen; }")
        assert seen["calls"] > 100 and seen["set"] == [], (slug, seen["calls"], seen["set"][:5])
        kept, rebuilt = page.evaluate(LEGENDS_KEPT_AND_REBUILT)
        assert kept == rebuilt, slug
        legend_entries += sum(len(entries) for entries, _ in kept)
    assert legend_entries > 20                                         # the pages do have legends to keep


def when_marked(attribute: str, js: str) -> str:
    """An init script that runs `js` the moment the page sets `attribute` on <html>: a MutationObserver's
    callback, after that task and before any other. It observes the document, since an init script runs before
    there is an <html> to observe."""
    return """new MutationObserver((_, obs) => {
    if (!document.documentElement || !document.documentElement.hasAttribute('%s')) return;
    obs.disconnect();
    %s
  }).observe(document, {attributes: true, subtree: true, attributeFilter: ['%s']});""" % (attribute, js, attribute)


def when_first_screen_drawn(js: str) -> str:
    """`js` the moment the first screen is drawn (no other plot drawn yet, Python not yet ready)."""
    return when_marked("data-kvx-drawn", js)


# ---- the warm-up after ready ---------------------------------------------------------------------------
@pytest.mark.parametrize("slug", ["cache-renting", "load-balancer"])
def test_the_warmed_drawing_shows_the_opening_values(offline_page, site_url, slug):
    """The worker's warm-up runs the drawing's update paths on another value's data and then gives the opening
    data back, in one task: what stays drawn is the opening parameters' data, exactly as CPython computes it."""
    page = offline_page
    page.goto(f"{site_url}/{slug}.html")
    page.wait_for_selector("html[data-kvx-warmed]", state="attached", timeout=READY_MS)
    assert page.evaluate("window.kvx.state.latest") == 0          # nothing asked: the warm-up drew what is drawn
    want = expected(slug)
    anim = want.get("animation") or {}
    if anim.get("mode") != "on_demand":                       # a cumulative animation's rows are up to its frame
        want["sources"].pop(anim.get("source"), None)
    assert_sources_equal(page, want)
    for name, (start, end) in (want.get("ranges") or {}).items():
        r = page.evaluate(f"(() => {{ const r = Bokeh.documents[0].get_model_by_name('range:{name}'); "
                          f"return [r.start, r.end]; }})()")
        assert r == pytest.approx([start, end]), name
    words = page.evaluate("""names => ({
        texts: Object.fromEntries(names.map((k) => [k, window.kvx.text(k)])),
        readouts: Array.from(document.querySelectorAll('#kvx-readouts .kvx-readout'), (e) => e.innerText.split('\\n')),
        formula: document.querySelectorAll('#kvx-formula .kvx-formula-line').length,
        notes: document.getElementById('kvx-notes').textContent })""", list(want["texts"]))
    assert words["texts"] == want["texts"]                    # the words too: the warm-up wrote another value's
    assert [r[:2] for r in words["readouts"]] == [[r["label"], r["value"]] for r in want["readouts"]]
    assert words["formula"] == len(want["formula"]) and words["notes"] == " ".join(want["notes"])


# Every caption the page writes, as the text of the nodes it puts in its box (a MutationObserver's callback comes
# after the task, when the box holds only the last of the captions written in it).
CAPTIONS_WRITTEN = """
window.kvxCaptions = [];
new MutationObserver((records) => {
  for (const r of records) {
    const box = r.target.nodeType === 1 && r.target.closest('[data-kvx-text="caption"]');
    if (box && r.addedNodes.length) window.kvxCaptions.push(Array.from(r.addedNodes, (n) => n.textContent).join(''));
  }
}).observe(document, {childList: true, subtree: true});
"""


@pytest.mark.parametrize("slug", ["disaggregation", "mla"])     # a cumulative animation, an on-demand one
def test_the_warm_up_runs_the_animations_paths_too(offline_page, site_url, slug):
    """The warmed drawing goes through the path a reply takes, the animation's included (its rows up to the frame,
    its caption, its slider): warmed without it, the pages that animate their data had the arithmetic pages'
    slowest first changes. The other value's caption was written, and the opening frame is back, exactly."""
    from kvx.explainers.registry import warm_up_values
    page = offline_page
    page.add_init_script(CAPTIONS_WRITTEN)
    page.goto(f"{site_url}/{slug}.html")
    page.wait_for_selector("html[data-kvx-warmed]", state="attached", timeout=READY_MS)
    assert page.evaluate("window.kvx.state.latest") == 0
    plain = lambda text: unescape(re.sub(r"<[^>]+>", "", text))                # noqa: E731  the box's text
    caption = lambda anim: anim["caption"] if anim.get("mode") == "on_demand" else anim["captions"][-1]   # noqa: E731
    want, other = expected(slug), expected(slug, **warm_up_values(slug)[0])
    assert caption(other["animation"]) != caption(want["animation"])           # else this test could not fail
    written = page.evaluate("window.kvxCaptions")
    assert plain(caption(other["animation"])) in written, written
    assert page.evaluate("window.kvx.text('caption')") == caption(want["animation"])
    opening = want["animation"].get("frame", want["animation"]["frames"] - 1)
    assert page.evaluate("document.documentElement.dataset.kvxFrame") == str(opening)
    assert page.evaluate("Bokeh.documents[0].get_model_by_name('anim:frame').value") == opening
    assert_sources_equal(page, want)                 # the cumulative animation's rows too: all of them, at its end


# Counts each source's data being set, from the moment the first screen is drawn (before Python is ready, so
# before the warm-up).
SOURCES_SET = when_first_screen_drawn("""
window.kvxSourcesSet = {};
for (const m of Bokeh.documents[0].all_models) {
  if (!m.name || !m.name.startsWith('source:')) continue;
  const key = m.name.slice(7);
  window.kvxSourcesSet[key] = 0;
  m.properties.data.change.connect(() => { window.kvxSourcesSet[key] += 1; });
}""")


def test_the_warm_up_changes_the_sources_its_other_value_leaves_alone(offline_page, site_url):
    """The warm-up's other value (cross-layer: a longer context) leaves some sources as they are (the loss and
    the stages, which the share changes): untouched, their glyphs' update paths ran for the first time on the
    reader's first change (its sources took 0.47 ms more than on the rest, median of 16 cold loads). The warm-up gives
    those their rows reversed and then back, so every source whose rows are not all alike has been set twice,
    and what stays drawn is the opening data."""
    from kvx.explainers.registry import warm_up_values
    page = offline_page
    page.add_init_script(SOURCES_SET)
    page.goto(f"{site_url}/cross-layer.html")
    page.wait_for_selector("html[data-kvx-warmed]", state="attached", timeout=READY_MS)
    assert page.evaluate("window.kvx.state.latest") == 0
    want, other = expected("cross-layer"), expected("cross-layer", **warm_up_values("cross-layer")[0])
    still = [k for k, cols in want["sources"].items() if other["sources"][k] == cols]
    assert {"loss", "stages"} <= set(still)                     # else this test would not test the still ones
    counts = page.evaluate("window.kvxSourcesSet")
    for key, cols in want["sources"].items():
        rows = [json.dumps(row) for row in zip(*cols.values())]
        if rows != rows[::-1]:                                   # reversed, they would be the same data
            assert counts[key] >= 2, (key, counts)
    assert_sources_equal(page, want)


# A reader's press as soon as the first pass of the warmed drawing is done: the passes after it have not begun.
PRESS_WHEN_WARMED = when_marked("data-kvx-warmed", """
document.body.dispatchEvent(new PointerEvent('pointerdown', {bubbles: true}));""")


# Counts the changes to the live regions' words (readouts, notes) from the moment the first pass is done.
WORDS_WRITTEN = "window.kvxWordsWritten = 0;" + when_marked("data-kvx-warmed", """
const count = () => { window.kvxWordsWritten += 1; };
for (const id of ['kvx-readouts', 'kvx-notes'])
  new MutationObserver(count).observe(document.getElementById(id), {childList: true, subtree: true, characterData: true});""")


def on_warm_ask(js: str) -> str:
    """An init script that runs `js` each time the page has asked its worker for a warmed drawing's pass (a run
    with id "warm-N": a real round trip)."""
    return """const post = Worker.prototype.postMessage;
Worker.prototype.postMessage = function (msg, ...rest) {
  const out = post.call(this, msg, ...rest);
  if (msg && msg.type === 'run' && String(msg.id).startsWith('warm-')) { %s }
  return out;
};""" % js


WARM_ASKS = "window.kvxWarmAsks = 0;" + on_warm_ask("window.kvxWarmAsks += 1;")


def source_sets(page) -> dict:
    return page.evaluate("Object.assign({}, window.kvxSourcesSet)")


def test_the_drawing_is_warmed_in_passes_until_the_reader_acts(offline_page, site_url):
    """One pass of the warmed drawing left the engine's compiling of its paths to the reader's first change (mla:
    its drawing 1.8 ms over the rest's, median of 8 cold loads). More passes follow, one task each, while the reader
    does nothing: every changing source is set again in each, and the opening data is what stays drawn. The words
    are left alone: the readouts and notes are live regions, which a screen reader reads out at each rewrite.
    Each pass after the first asks the worker for a value, as a change does, so the messages' paths both ways are
    warmed too; and those asks do not end the worker's own warm-up, as a change does. The values are the opening's
    neighbours in turn (registry.neighbour_values), so each source is set in every pass whose value changes it."""
    page = offline_page
    page.add_init_script(COLLECTED_BY_THE_TEST)
    page.add_init_script(SOURCES_SET)
    page.add_init_script(WORDS_WRITTEN)
    page.add_init_script(WARM_ASKS)
    page.goto(f"{site_url}/mla.html")
    page.wait_for_selector("html[data-kvx-drawing-warmed]", state="attached", timeout=READY_MS)
    ended = page.evaluate("document.documentElement.dataset.kvxDrawingWarmed")
    passes = int(ended.split()[0])
    assert ended.endswith("ended by budget") and passes >= 5, ended       # 21 at most; fewer if the time ran out
    from kvx.explainers.registry import neighbour_values
    want, neighbours = expected("mla"), neighbour_values("mla")
    replies = [expected("mla", **values) for values in neighbours]
    asked = [replies[k % len(replies)] for k in range(passes - 1)]           # pass k asks for neighbour k
    changed_by = {key: sum(reply["sources"].get(key) != cols for reply in asked)
                  for key, cols in want["sources"].items()}
    assert sum(changed_by.values()) >= passes - 1                  # else a pass would set nothing
    assert pass_after_collection(page) == "drawn"                # one more, once the first major collection came
    counts = source_sets(page)
    for key, times in changed_by.items():
        assert counts.get(key, 0) >= 2 * times, (key, times, counts)   # its value, then the opening's, each pass
    page.wait_for_timeout(300)
    assert source_sets(page) == counts                            # and then no more
    assert page.evaluate("window.kvxWordsWritten") == 0
    assert page.evaluate("window.kvxWarmAsks") == passes - 1
    page.wait_for_selector("html[data-kvx-warm-up]", state="attached", timeout=READY_MS)
    # and the worker ended its own on the opening once more (kvx-worker.mjs: the models' caches hold its entries)
    assert page.evaluate("document.documentElement.dataset.kvxWarmUp").endswith("ended by budget, then the opening again")
    assert page.evaluate("window.kvx.state.latest") == 0
    assert_sources_equal(page, want)


def bokehjs_calls(cdp) -> dict:
    """BokehJS's functions called since the last take of V8's precise coverage."""
    return functions_called(cdp.send("Profiler.takePreciseCoverage")["result"], "/bokeh-")


@pytest.mark.parametrize("slug", sorted(REGISTRY))
def test_a_first_change_runs_no_bokehjs_code_the_warm_up_did_not(offline_page, site_url, slug):
    """The warm-up's passes draw the opening's neighbours so that a reader's first change to one of them takes its
    data into the plots with no BokehJS code that the engine meets for the first time (it would run uncompiled,
    and be compiled then). Counted by V8's precise coverage (tests/benchmarks/first_run_code.py does it by hand):
    the BokehJS functions the first change calls were all called before it. The taking in alone, which is what a
    round trip times: the frames are held (requestAnimationFrame), since the passes paint only the opening's
    picture and a neighbour's repaint has its own paths (a data range moved, a canvas resized); and the box is
    scrolled to first, as a reader's is. On mla six renderers' culling masks changed first in a reader's change,
    because a pass put the opening data back before BokehJS's awaited steps saw its neighbour's (kvx-page.js,
    bokehsContinuations)."""
    page = offline_page
    cdp = page.context.new_cdp_session(page)
    cdp.send("Profiler.enable")
    cdp.send("Profiler.startPreciseCoverage", {"callCount": True, "detailed": False})
    page.goto(f"{site_url}/{slug}.html")
    page.wait_for_selector("html[data-kvx-drawing-warmed]", state="attached", timeout=READY_MS)
    assert page.evaluate("document.documentElement.dataset.kvxDrawingWarmed").endswith("ended by budget")
    [(name, value)] = neighbour_values(slug)[0].items()             # a neighbour: what the passes drew
    control_box(page, name, slug).scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    page.evaluate("window.requestAnimationFrame = () => 0")
    before, done = bokehjs_calls(cdp), applied(page)
    set_control(page, name, value, slug)
    wait_applied(page, done)
    page.wait_for_timeout(100)
    first_time = sorted(key for key in bokehjs_calls(cdp) if key not in before)
    assert first_time == [], f"{slug}, {name} = {value}: BokehJS functions called for the first time {first_time}"


def open_mla_pressed(page, site_url, press: str) -> None:
    """mla opened with its sources' settings counted and a reader's press where `press` makes it: the passes end
    at the first, the one warmDrawing draws."""
    page.add_init_script(SOURCES_SET)
    page.add_init_script(press)
    page.goto(f"{site_url}/mla.html")
    page.wait_for_selector("html[data-kvx-drawing-warmed]", state="attached", timeout=READY_MS)
    assert page.evaluate("document.documentElement.dataset.kvxDrawingWarmed") == "1 passes, ended by reader"


def test_a_readers_press_ends_the_warmed_drawings_passes(offline_page, site_url):
    """The passes are for a reader who is only reading: a press ends them before the next, so a change never
    competes with one, and the reader's change is drawn as CPython computes it."""
    page = offline_page
    open_mla_pressed(page, site_url, PRESS_WHEN_WARMED)
    counts = source_sets(page)
    page.wait_for_timeout(300)
    assert source_sets(page) == counts
    before = applied(page)
    set_control(page, "context", "8192", "mla")
    wait_applied(page, before)
    assert_sources_equal(page, expected("mla", context=8192))


# A reader's press the moment the first pass's ask has gone to the worker: its reply comes after the press.
PRESS_WHEN_ASKED = on_warm_ask("""if (!window.kvxSetsAtPress) {
    window.kvxSetsAtPress = Object.assign({}, window.kvxSourcesSet);
    document.body.dispatchEvent(new PointerEvent('pointerdown', {bubbles: true}));
  }""")


def test_a_pass_whose_reply_comes_after_the_readers_press_is_not_drawn(offline_page, site_url):
    """A pass's reply that comes once the reader has pressed is dropped, not drawn over what they are about to
    change, and no pass follows it."""
    page = offline_page
    open_mla_pressed(page, site_url, PRESS_WHEN_ASKED)
    assert page.evaluate("window.kvxSetsAtPress") == source_sets(page)
    assert_sources_equal(page, expected("mla"))


# The page's FinalizationRegistry, replaced so that a test says when a collection comes (window.kvxCollect): the
# browser's own first major collection comes when it will (about 3 s after ready here, or at the first press),
# during the passes or after them, and would make these tests' answers depend on when.
COLLECTED_BY_THE_TEST = """
window.kvxWatched = [];
window.FinalizationRegistry = class {
  constructor(callback) { this.callback = callback; }
  register(target, held) { window.kvxWatched.push(() => this.callback(held)); }
  unregister() { return false; }
};
window.kvxCollect = () => { for (const collected of window.kvxWatched.splice(0)) collected(); };"""


def said_after_collection(page) -> str:
    """What the page says it drew after the major collection it saw (kvx-page.js, afterMajorCollection)."""
    page.wait_for_selector("html[data-kvx-pass-after-collection]", state="attached", timeout=10_000)
    return page.evaluate("document.documentElement.dataset.kvxPassAfterCollection")


def pass_after_collection(page) -> str:
    """A major collection, as the page sees it (COLLECTED_BY_THE_TEST), and what the page says it drew after it."""
    page.evaluate("window.kvxCollect()")
    return said_after_collection(page)


SETS_AT_END = when_marked("data-kvx-drawing-warmed", "window.kvxSetsAtEnd = Object.assign({}, window.kvxSourcesSet);")


def test_a_pass_follows_the_first_major_collection(offline_page, site_url):
    """A change drawn just after a major garbage collection takes its data in slower (the twin of mla's first
    change, 1 s after a forced collection: +1.55 ms over the rest, 6 of 6 cold loads), and the browser holds the
    page's first one back until the reader's first press, so it came while they typed their first change. Once it
    has come, the page draws one pass more, the last pass's neighbour and then the opening data, as the passes do:
    once, with the words left alone, and the opening data is what stays drawn."""
    page = offline_page
    for script in (COLLECTED_BY_THE_TEST, SOURCES_SET, WORDS_WRITTEN, SETS_AT_END):
        page.add_init_script(script)
    page.goto(f"{site_url}/mla.html")
    page.wait_for_selector("html[data-kvx-drawing-warmed]", state="attached", timeout=READY_MS)
    assert page.evaluate("document.documentElement.dataset.kvxDrawingWarmed").endswith("ended by budget")
    assert page.evaluate("document.documentElement.dataset.kvxPassAfterCollection") is None   # none before it
    assert pass_after_collection(page) == "drawn"
    at_end, after = page.evaluate("window.kvxSetsAtEnd"), source_sets(page)
    more = {key: after[key] - at_end[key] for key in after}
    assert set(more.values()) <= {0, 2} and 2 in more.values(), more   # a neighbour's data, then the opening's
    page.evaluate("window.kvxCollect()")
    page.wait_for_timeout(300)
    assert source_sets(page) == after                              # once: not after the next collection
    assert page.evaluate("window.kvxWordsWritten") == 0
    assert page.evaluate("window.kvx.state.latest") == 0
    assert_sources_equal(page, expected("mla"))


def test_no_pass_after_the_collection_draws_over_a_readers_change(offline_page, site_url):
    """A reader who has sent a change is not drawn over: the first major collection, coming after it, has no
    pass after it, and the plots keep the reader's value as CPython computes it."""
    page = offline_page
    page.add_init_script(COLLECTED_BY_THE_TEST)
    page.goto(f"{site_url}/mla.html")
    page.wait_for_selector("html[data-kvx-drawing-warmed]", state="attached", timeout=READY_MS)
    before = applied(page)
    set_control(page, "context", "8192", "mla")
    wait_applied(page, before)
    assert pass_after_collection(page) == "not drawn: a change was sent"
    assert_sources_equal(page, expected("mla", context=8192))


def test_the_page_sees_the_browsers_major_collection(offline_page, site_url):
    """The page's own watch, in the browser as it is: a full collection frees the object let go when the passes
    start, and the page answers it, whether that collection came after the passes (a pass drawn) or during them
    (the passes after it were enough)."""
    page = offline_page
    page.goto(f"{site_url}/mla.html")
    page.wait_for_selector("html[data-kvx-drawing-warmed]", state="attached", timeout=READY_MS)
    collect_garbage(page)
    said = said_after_collection(page)
    assert said in ("drawn", "not drawn: passes came after it"), said
    assert_sources_equal(page, expected("mla"))


# Counts the Enter keyups each box gets, from the moment the first screen is drawn (before the warm-up).
ENTER_KEYUPS = when_first_screen_drawn("""
window.kvxKeyups = {};
for (const m of Bokeh.documents[0].all_models) {
  const view = m.name && m.name.startsWith('param:') && Bokeh.index.find_one(m);
  if (!view || !view.input_el || view.input_el.tagName === 'SELECT') continue;
  const name = m.name.slice(6);
  window.kvxKeyups[name] = 0;
  view.input_el.addEventListener('keyup', (e) => { if (e.key === 'Enter') window.kvxKeyups[name] += 1; });
}""")


def test_the_warm_up_runs_the_boxes_enter_keyup_past_its_compiling(offline_page, site_url):
    """A reader's Enter ends with a keyup, handled by BokehJS's box in the frame after it, and a reply that comes
    meanwhile waits for that frame. Run for the first time the handler took 0.29-0.57 ms against about 0.12 later;
    one warm-up keyup only moved that cost to the second change (0.56-0.89 ms), where the engine compiled it. So
    the warm-up gives each box a dozen, and asks for nothing: an autocomplete box commits its text on Enter, here
    its own. A reader's Enter on an autocomplete box still applies their choice."""
    page = offline_page
    page.add_init_script(ENTER_KEYUPS)
    page.goto(f"{site_url}/cache-renting.html")
    page.wait_for_selector("html[data-kvx-warmed]", state="attached", timeout=READY_MS)
    keyups = page.evaluate("window.kvxKeyups")
    assert {"kv_dtype", "weight_dtype", "context"} <= set(keyups)            # autocomplete boxes and a text box
    assert all(n >= 10 for n in keyups.values()), keyups
    page.wait_for_timeout(200)                                  # any echo's callback has come
    assert page.evaluate("window.kvx.state.latest") == 0
    assert_sources_equal(page, expected("cache-renting"))
    before = applied(page)
    set_control(page, "kv_dtype", "fp8", "cache-renting")
    wait_applied(page, before)
    assert_sources_equal(page, expected("cache-renting", kv_dtype="fp8"))


def test_each_round_trip_is_broken_into_parts_that_add_up(offline_page, site_url):
    """kvx.parts says where each change's time to applied went (the benchmark's first change against the rest):
    waiting, to the worker, in it, back and drawing add up to the round trip, on one clock for page and worker."""
    page = offline_page
    page.goto(f"{site_url}/cross-model.html")
    page.wait_for_selector("html[data-kvx-warmed]", state="attached", timeout=READY_MS)
    for value in ("9000", "12000"):
        before = applied(page)
        set_control(page, "context", value, "cross-model")
        wait_applied(page, before)
    trips, parts = page.evaluate("[Array.from(kvx.timings), Array.from(kvx.parts)]")
    assert len(parts) == len(trips) == 2
    for trip, p in zip(trips, parts):
        assert set(p) == {"waiting", "to_worker", "worker", "python", "back", "drawing"}
        assert all(v >= -0.2 for v in p.values()), p                # clocks coarsened to 0.1 ms at most
        assert p["python"] <= p["worker"] + 0.2 and p["drawing"] > 0, p
        total = p["waiting"] + p["to_worker"] + p["worker"] + p["back"] + p["drawing"]
        assert total == pytest.approx(trip, abs=0.5), (trip, p)


def test_a_readers_first_touch_ends_the_warm_up(offline_page, site_url):
    """A press, key or focus ends the worker's warm-up, so the change that follows does not wait for a warm-up
    evaluation in flight; left alone, the warm-up spends its budget (kvx-worker.mjs, WARM_UP_MS = 4 s). Either
    way it ends on the opening once more, while the reader types, so the models' caches hold the opening's
    entries for the first change (agent-sessions' cliff: test_registry)."""
    page = offline_page
    page.goto(f"{site_url}/quantization.html")
    page.wait_for_selector("html[data-kvx-warmed]", state="attached", timeout=READY_MS)
    t0 = time.monotonic()
    page.locator(".bk-input-group input").first.click()          # a reader clicks into a box
    page.wait_for_selector("html[data-kvx-warm-up]", state="attached", timeout=10_000)
    assert time.monotonic() - t0 < 3.0
    assert page.evaluate("document.documentElement.dataset.kvxWarmUp").endswith("ended by hold, then the opening again")
    page.goto(f"{site_url}/cross-model.html")                    # nobody touches this one
    page.wait_for_selector("html[data-kvx-warm-up]", state="attached", timeout=READY_MS)
    spent = page.evaluate("document.documentElement.dataset.kvxWarmUp")
    assert spent.endswith("ended by budget, then the opening again") and int(spent.split(" ms")[0].split()[-1]) >= 4000, spent


# Canvas calls that put pixels down (Chromium's 2D context): the test records when each was last made.
DRAW_CALLS = ("clearRect", "fillRect", "fill", "stroke", "fillText", "drawImage")


def test_a_change_is_counted_on_screen_after_bokeh_has_repainted_it(offline_page, site_url):
    """The benchmark's "on screen" mark (kvx-page.js, afterNextFrame) comes after the last canvas drawing the change
    caused, not when its reply was applied: BokehJS takes the new data in and repaints in the next frame, which on
    a simulation page costs more than the reply's way there. A mark taken at once, or from a plain timer, comes
    before that drawing and fails."""
    page = offline_page
    page.goto(f"{site_url}/{SLUG}.html")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    page.wait_for_timeout(500)
    page.evaluate("""(calls) => {
        window.kvxDrawn = [];
        for (const name of calls) {
          const own = CanvasRenderingContext2D.prototype[name];
          CanvasRenderingContext2D.prototype[name] = function (...args) {
            window.kvxDrawn.push(performance.now());
            return own.apply(this, args);
          };
        }
    }""", list(DRAW_CALLS))
    before = int(page.evaluate("Number(document.documentElement.dataset.kvxPainted || 0)"))
    page.evaluate(f"Bokeh.documents[0].get_model_by_name('param:{FIELD}').value = '{VALUE}'")
    page.wait_for_function(f"Number(document.documentElement.dataset.kvxPainted || 0) > {before}", timeout=30_000)
    t = page.evaluate("""() => { const k = window.kvx, n = k.painted.length;
        return { sent: k.state.sentAt, applied: k.timings[k.timings.length - 1], painted: k.painted[n - 1],
                 drawn: window.kvxDrawn.filter((x) => x > k.state.sentAt) }; }""")
    applied_at, painted_at = t["sent"] + t["applied"], t["sent"] + t["painted"]
    after_apply = [x for x in t["drawn"] if x > applied_at]
    assert after_apply, "BokehJS drew nothing after the reply was applied"
    assert max(after_apply) <= painted_at, (max(after_apply) - applied_at, t["painted"] - t["applied"])
    assert t["painted"] > t["applied"]


# ---- the first screen first (kvx-page.js, firstScreenFirst; site/dom_layout.py, later_height) ----------------
# What each kvx-later box holds at a moment: [its top, whether its plot is drawn, its reserved min-height].
BOXES = """Array.from(document.querySelectorAll('.kvx-later')).map(b => [Math.round(b.getBoundingClientRect().top
    + scrollY), b.querySelector('[data-root-id]').children.length > 0, b.style.minHeight])"""


# Records BOXES the moment the page marks its first screen drawn (before any other task can draw more).
AT_FIRST_SCREEN = when_first_screen_drawn(f"window.atFirstScreen = {BOXES};")
# A worker that never answers: Python is never ready, so only the reader's scrolling draws a plot.
SILENT_WORKER = """window.Worker = class { constructor() {} postMessage() {} terminate() {} addEventListener() {} };"""


def test_plots_below_the_first_screen_are_drawn_after_python_is_ready_where_they_were_kept(offline_page, site_url):
    page = offline_page                      # 1280 x 720: on eviction every plot is below the first screen
    page.add_init_script(AT_FIRST_SCREEN)
    page.goto(f"{site_url}/eviction.html")
    page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
    first = page.evaluate("window.atFirstScreen")
    assert len(first) == 9, first                             # the nine plots of fixed height
    assert [drawn for _, drawn, _ in first] == [False] * 9
    assert all(h.endswith("px") and int(h[:-2]) >= 260 for _, _, h in first), first
    assert page.locator(".bk-input-group input").count() >= 3      # the controls are on it, drawn
    wait_all_drawn(page, 30_000)
    after = page.evaluate(BOXES)
    assert [drawn for _, drawn, _ in after] == [True] * 9
    assert [h for _, _, h in after] == [""] * 9                # the reservation is gone once drawn
    assert [top for top, _, _ in after] == [top for top, _, _ in first], "a plot moved when the ones above were drawn"
    empty = page.evaluate("Array.from(document.querySelectorAll('[data-root-id]')).filter(e => !e.children.length).length")
    assert empty == 0, f"{empty} of the page's Bokeh roots were never drawn"
    drawn_at, every = page.evaluate("[Number(document.documentElement.dataset.kvxDrawn), "
                                    "Number(document.documentElement.dataset.kvxAllDrawn)]")
    assert every >= int(page.evaluate("document.documentElement.dataset.pyReadyMs")) > drawn_at


def test_a_plot_the_reader_scrolls_to_is_drawn_before_python_is_ready(offline_page, site_url):
    page = offline_page
    page.add_init_script(SILENT_WORKER)
    page.goto(f"{site_url}/eviction.html")
    page.wait_for_selector("html[data-kvx-drawn]", state="attached", timeout=30_000)
    page.wait_for_timeout(500)
    assert [drawn for _, drawn, _ in page.evaluate(BOXES)] == [False] * 9      # nothing scrolled: nothing more
    page.evaluate("document.querySelectorAll('.kvx-later')[8].scrollIntoView()")     # the last plot, 4,453 px down
    page.wait_for_function(f"({BOXES}).at(-1)[1]", timeout=10_000)
    boxes = page.evaluate(BOXES)
    assert boxes[-1][1] and boxes[-1][2] == ""
    assert boxes[-2][1], "the plot right above what the reader sees (within a screen) was not drawn ahead"
    assert not any(drawn for _, drawn, _ in boxes[:4]), "plots several screens above what the reader sees were drawn"
    assert not page.locator("html[data-py-ready]").count()


@pytest.mark.parametrize("missing", ["pyodide.mjs", "pyodide.asm.wasm"])
def test_a_page_whose_python_cannot_start_says_so_and_draws_every_plot(offline_page, site_url, missing):
    """Pyodide's loader missing (its import fails) or its WebAssembly (Emscripten aborts from a callback and
    loadPyodide never settles: the page said "warming up" for good): the reader is told, and every plot is drawn
    with its baked values."""
    page = offline_page
    page.context.route(f"**/{missing}", lambda route: route.fulfill(status=404, body="gone"))
    page.goto(f"{site_url}/eviction.html")
    wait_all_drawn(page, 60_000)
    page.wait_for_function("document.getElementById('kvx-status').innerText.includes('could not start')",
                           timeout=30_000)
    assert [drawn for _, drawn, _ in page.evaluate(BOXES)] == [True] * 9
    assert not page.locator("html[data-py-ready]").count()
    page.errors.clear()                      # the failed fetch is reported on the console, as it should be


def test_text_typed_before_the_warm_up_is_kept_and_applied_by_enter(offline_page, site_url):
    """The controls' warm-up (kvx-page.js, warmControls) gives each box another value and its own text back. A
    reader who had typed into a box before it ran (the page is drawn seconds before Python is ready) saw their
    uncommitted text taken as the box's own: it was committed as a warm-up echo, and their Enter then changed
    nothing, so the plots kept the opening values under a box that showed theirs (CI, prefix-reuse, typed
    just after ready). The box being typed in is left alone."""
    page = offline_page
    page.goto(f"{site_url}/prefix-reuse.html")
    page.wait_for_selector("html[data-kvx-drawn]", state="attached", timeout=20_000)
    box = control_box(page, "capacity", "prefix-reuse")
    box.fill("5000")                                             # typed, not yet committed
    page.wait_for_selector("html[data-kvx-warmed]", state="attached", timeout=READY_MS)
    assert box.input_value() == "5000"
    before = applied(page)
    box.press("Enter")
    wait_applied(page, before, timeout_ms=10_000)
    assert_sources_equal(page, expected("prefix-reuse", capacity=5000))


def test_a_box_the_reader_is_in_keeps_its_selection_through_the_warm_up(offline_page, site_url):
    """A reader who has clicked into a box and selected its text, but not typed yet, when the controls' warm-up
    runs: the box is theirs. The warm-up looked for it as the document's focused element, but a Bokeh box
    lives in a shadow root (the document sees its host), so the box was written "20" and "2" again, which
    dropped the selection: the reader's "0" went after the "2", and their Enter asked for 20 (CI, load-balancer,
    typed just after ready: the address said load_weight=20)."""
    page = offline_page
    page.goto(f"{site_url}/load-balancer.html")
    page.wait_for_selector("html[data-kvx-drawn]", state="attached", timeout=20_000)
    box = control_box(page, "load_weight", "load-balancer")
    box.focus()
    box.select_text()
    page.wait_for_selector("html[data-kvx-warmed]", state="attached", timeout=READY_MS)
    assert box.evaluate("el => [el.value, el.selectionStart, el.selectionEnd]") == ["2", 0, 1]
    before = applied(page)
    page.keyboard.type("0")
    page.keyboard.press("Enter")
    wait_applied(page, before, timeout_ms=10_000)
    assert box.input_value() == "0"
    assert_sources_equal(page, expected("load-balancer", load_weight=0))


# A reader's step back, taken as soon as the first screen is drawn: before Python can be ready, so before the
# warm-up's drawing.
STEP_BACK_WHEN_DRAWN = when_first_screen_drawn(
    "window.kvxSteppedBeforeReady = !document.documentElement.hasAttribute('data-py-ready'); window.kvx.anim.back();")


def test_a_frame_chosen_before_the_warm_up_is_kept_through_it(offline_page, site_url):
    """The warm-up's drawing goes through apply() only while the animation is as it opened; a reader who has
    already stepped it keeps their frame, its caption and its rows, with the warm-up's other value drawn and
    replaced around them."""
    page = offline_page
    page.add_init_script(STEP_BACK_WHEN_DRAWN)
    page.goto(f"{site_url}/disaggregation.html")
    page.wait_for_selector("html[data-kvx-warmed]", state="attached", timeout=READY_MS)
    assert page.evaluate("window.kvxSteppedBeforeReady") is True
    assert page.evaluate("window.kvx.state.latest") == 0
    want = expected("disaggregation")
    anim = want["animation"]
    k = anim["frames"] - 2                                   # one back from the frame it opens on, its last
    assert page.evaluate("document.documentElement.dataset.kvxFrame") == str(k)
    assert page.evaluate("Bokeh.documents[0].get_model_by_name('anim:frame').value") == k
    assert page.evaluate("window.kvx.text('caption')") == anim["captions"][k]
    full = want["sources"][anim["source"]]
    keep = [i for i, f in enumerate(full["frame"]) if f <= k]
    assert 0 < len(keep) < len(full["frame"])                # else the rows could not tell the frames apart
    want["sources"][anim["source"]] = {c: [v[i] for i in keep] for c, v in full.items()}
    assert_sources_equal(page, want)
