"""Every explainer on a phone (360x740, touch) and a laptop (1280x800): no sideways scroll, every control
reachable and working, axe-core with no critical or serious violation, the view's URL (with `step`) opening
the same view, no text a plot draws running out of its frame or its canvas (measured from the canvas's own
fillText calls), MLA's step diagram with no two labels overlapping, and the first control above the first
readout and the notes; a reply's words never moving the controls; plus the pieces issue 17 asked for one at a
time (help as a disclosure, one frame per arrow on the slider, suggestion lists closing on Tab, an emptied box
saying so, plots that do not pan, a bad `step` clamped, classroom mode, "Run it here" retrying after
Retry-After). Screenshots of every page at both sizes land in test-results/screenshots/ (phone-<slug>.png,
laptop-<slug>.png)."""
from __future__ import annotations

import json
import re
from urllib.parse import parse_qs, urlparse

import pytest

from kvx.explainers.registry import REGISTRY
from kvx.site import widgets
from kvx.site.vendor import axe_core_js

from .conftest import SHOTS
from .pagehooks import applied, control_group, wait_all_drawn, wait_applied, wait_url

READY_MS = 90_000
SIZES = {
    "phone": dict(viewport={"width": 360, "height": 740}, is_mobile=True, has_touch=True, device_scale_factor=1),
    "laptop": dict(viewport={"width": 1280, "height": 800}),
}
SLUGS = sorted(REGISTRY)

# Every text a plot draws on its canvas, with its box in CSS px of that canvas: fillText is wrapped before the
# page loads, and each canvas's list starts again when the canvas is cleared for a new paint.
CANVAS_TEXTS = r"""(() => {
  const drawn = new WeakMap();
  window.kvxCanvasTexts = drawn;
  const P = CanvasRenderingContext2D.prototype, fill = P.fillText, clear = P.clearRect;
  P.clearRect = function (x, y) {
    if (x <= 0 && y <= 0) drawn.set(this.canvas, Object.assign([], { size: `${this.canvas.width}x${this.canvas.height}` }));
    return clear.apply(this, arguments);
  };
  P.fillText = function (text, x, y) {
    const m = this.measureText(text), t = this.getTransform();
    const k = this.canvas.width / (this.canvas.clientWidth || this.canvas.width);
    const xs = [], ys = [];
    for (const px of [x - m.actualBoundingBoxLeft, x + m.actualBoundingBoxRight]) {
      for (const py of [y - m.actualBoundingBoxAscent, y + m.actualBoundingBoxDescent]) {
        xs.push((t.a * px + t.c * py + t.e) / k);
        ys.push((t.b * px + t.d * py + t.f) / k);
      }
    }
    const size = `${this.canvas.width}x${this.canvas.height}`;     // a resized canvas starts blank
    if (!drawn.has(this.canvas) || drawn.get(this.canvas).size !== size) drawn.set(this.canvas, Object.assign([], { size }));
    if (String(text).trim()) drawn.get(this.canvas).push({ text: String(text), x0: Math.min(...xs), x1: Math.max(...xs),
                                                           y0: Math.min(...ys), y1: Math.max(...ys) });
    return fill.apply(this, arguments);
  };
})();"""

PLOTS_DRAWN = """() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => {
  const plots = [];
  for (const v of Bokeh.index.all_views()) {
    if (!v.frame || !v.canvas_view || !v.model.properties.renderers || !v.model.visible) continue;
    const texts = [v.canvas_view.primary, v.canvas_view.overlays]
      .flatMap(layer => window.kvxCanvasTexts.get(layer.canvas) || []);
    const f = v.frame.bbox;
    plots.push({ title: v.model.title ? v.model.title.text : '', frame: { x0: f.x0, x1: f.x1, y0: f.y0, y1: f.y1 },
                 width: v.el.getBoundingClientRect().width, texts });
  }
  done(plots);
})))"""


def texts_past_the_frame(plots) -> list[str]:
    """Texts that start inside a plot's frame and run past its right edge (a bar's value cut off)."""
    out = []
    for p in plots:
        f = p["frame"]
        for t in p["texts"]:
            inside = f["y0"] <= (t["y0"] + t["y1"]) / 2 <= f["y1"] and f["x0"] - 1 <= t["x0"] < f["x1"]
            if inside and t["x1"] > f["x1"] + 1:
                out.append(f"{p['title'][:40]!r}: {t['text']!r} ends at {t['x1']:.0f} px, the frame at {f['x1']:.0f}")
    return out


def texts_cut_off(plots) -> list[str]:
    """Texts (titles, axis labels) that run past the edge of their plot's canvas."""
    return [f"{p['title'][:40]!r}: {t['text']!r} spans {t['x0']:.0f}-{t['x1']:.0f} px of {p['width']:.0f}"
            for p in plots for t in p["texts"] if t["x0"] < -1 or t["x1"] > p["width"] + 1]


def overlapping(texts) -> list[tuple[str, str]]:
    def meet(a, b):
        return min(a["x1"], b["x1"]) - max(a["x0"], b["x0"]) > 0.5 and min(a["y1"], b["y1"]) - max(a["y0"], b["y0"]) > 0.5
    return [(a["text"], b["text"]) for i, a in enumerate(texts) for b in texts[i + 1:] if meet(a, b)]


@pytest.fixture(scope="module")
def contexts(browser):
    """One browser context per size for the whole module (a context per test would cost a second each).
    bypass_csp lets the test add axe-core's script; every request must stay on 127.0.0.1."""
    made = {}

    def get(size: str):
        if size not in made:
            ctx = browser.new_context(**SIZES[size], bypass_csp=True)
            ctx.add_init_script(CANVAS_TEXTS)
            ctx.blocked = []

            def guard(route, ctx=ctx):
                url = route.request.url
                if urlparse(url).hostname == "127.0.0.1" or url.startswith(("data:", "blob:")):
                    route.continue_()
                else:
                    ctx.blocked.append(url)
                    route.abort()
            ctx.route("**/*", guard)
            made[size] = ctx
        return made[size]
    yield get
    for ctx in made.values():
        ctx.close()


@pytest.fixture
def open_page(contexts):
    pages = []

    def opener(size: str, url: str):
        page = contexts(size).new_page()
        page.errors = []
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
        pages.append(page)
        page.goto(url)
        page.wait_for_selector("html[data-kvx-drawn]", state="attached", timeout=30_000)
        page.wait_for_selector("html[data-py-ready]", state="attached", timeout=READY_MS)
        # Every plot, the ones below the first screen too (drawn after Python is ready): these tests read them all.
        wait_all_drawn(page, 30_000)
        return page
    yield opener
    for page in pages:
        assert page.errors == [], page.errors
        assert page.context.blocked == [], page.context.blocked
        page.close()


def no_sideways_scroll(page, width: int) -> None:
    got = page.evaluate("document.scrollingElement.scrollWidth")
    assert got <= width, f"the page is {got} px wide in a {width} px window: it scrolls sideways"


def axe_violations(page) -> list[str]:
    page.add_script_tag(path=str(axe_core_js()))
    found = page.evaluate("""() => axe.run(document, {resultTypes: ['violations']}).then(r => r.violations
        .filter(v => v.impact === 'critical' || v.impact === 'serious')
        .map(v => `${v.id} (${v.impact}): ${v.help}; ${v.nodes.slice(0, 3).map(n => n.target.join(' > ')).join(' | ')}`))""")
    return found


def frame(page) -> int:
    return int(page.evaluate("document.documentElement.dataset.kvxFrame"))


def query(page) -> dict:
    return {k: v[0] for k, v in parse_qs(urlparse(page.url).query).items()}


def control(page, spec):
    return control_group(page, widgets.title(spec)).locator("input, select").first


def in_view(page, locator, width: int) -> None:
    locator.scroll_into_view_if_needed()
    box = locator.bounding_box()
    height = page.viewport_size["height"]
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5, box
    assert box["y"] >= 0 and box["y"] + box["height"] <= height + 0.5, box
    assert locator.is_enabled()


def a_new_value(spec) -> str | None:
    """A valid value different from the default, for a number box (None for other kinds)."""
    if spec["kind"] != "integer" or spec["default"] is None:
        return None
    d = spec["default"]
    return str(d + 1 if spec["max"] is None or d + 1 <= spec["max"] else d - 1)


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("slug", SLUGS)
def test_page_fits_is_reachable_accessible_and_linkable(open_page, site_url, size, slug):
    width = SIZES[size]["viewport"]["width"]
    e = REGISTRY[slug]
    page = open_page(size, f"{site_url}/{slug}.html")
    no_sideways_scroll(page, width)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{size}-{slug}.png"), full_page=True)

    # No text runs out of its plot's frame (a bar's value at the end of the axis), and the step diagram's
    # labels do not overlap (on a phone, MLA draws it in rows that fit).
    plots = page.evaluate(PLOTS_DRAWN)
    assert texts_past_the_frame(plots) == []
    assert texts_cut_off(plots) == []
    for p in plots:
        if p["title"].startswith("One decode step of one MLA layer"):
            assert overlapping(p["texts"]) == [], p["title"]
    assert slug != "mla" or any(p["title"].startswith("One decode step") for p in plots)
    # At both sizes the first controls come before the readouts and the notes (the words a reply rewrites), so a
    # change of those moves nothing a reader types in (test_a_replys_words_never_move_the_controls).
    specs = e.params.describe()
    first, card = control(page, specs[0]).bounding_box(), page.locator(".kvx-readout").first.bounding_box()
    notes = page.locator("#kvx-notes").bounding_box() or {"y": float("inf")}        # none while empty and hidden
    assert first["y"] < card["y"] <= notes["y"], (first, card, notes)

    # Every control is on screen after scrolling to it (not off to the side, not covered) and enabled.
    for spec in specs:
        in_view(page, control(page, spec), width)
    animated = page.evaluate("!!Bokeh.documents[0].get_model_by_name('anim:play')")
    if animated:
        for name in ("Play", "Step", "Reset"):
            in_view(page, page.get_by_role("button", name=re.compile(name)).first, width)
        in_view(page, page.locator(".noUi-handle").first, width)
    for name in ("Copy link to this view", "Reset all"):
        in_view(page, page.get_by_role("button", name=name), width)

    # A control works: a new value reaches the model (which draws it, or says why it cannot, under the
    # control) and the URL holds it.
    spec = next((s for s in specs if a_new_value(s) is not None), None)
    if spec is not None:
        answered = ("Number(document.documentElement.dataset.kvxApplied || 0) + "
                    "Number(document.documentElement.dataset.kvxErrors || 0)")
        before = int(page.evaluate(answered))
        box = control(page, spec)
        box.fill(a_new_value(spec))
        box.press("Enter")
        page.wait_for_function(f"{answered} > {before}", timeout=60_000)
        wait_url(page, f"{spec['name']}={a_new_value(spec)}")          # written once the change is drawn
        assert query(page)[spec["name"]] == a_new_value(spec)

    violations = axe_violations(page)
    assert violations == [], violations

    # The view's URL opens the same view, frame included.
    if animated:
        page.get_by_role("button", name="◀ Step").click()
        k = frame(page)
        wait_url(page, f"step={k}")
        assert query(page)["step"] == str(k)
        link = page.url
        again = open_page(size, link)
        again.wait_for_function(f"document.documentElement.dataset.kvxFrame === '{k}'", timeout=60_000)
        assert query(again)["step"] == str(k)
        if spec is not None:
            assert control(again, spec).input_value() == a_new_value(spec)
        no_sideways_scroll(again, width)


@pytest.mark.parametrize("bad, want", [("abc", "last"), ("-3", "0"), ("1000000000", "last")])
def test_a_bad_step_is_clamped(open_page, site_url, bad, want):
    page = open_page("laptop", f"{site_url}/cache-renting.html?step={bad}")
    last = int(page.evaluate("kvx.state.data.animation.frames")) - 1
    k = last if want == "last" else int(want)
    assert frame(page) == k
    assert query(page)["step"] == str(k)
    assert "NaN" not in page.evaluate("kvx.text('caption') || ''")


def test_step_stays_in_the_url_after_pause(open_page, site_url):
    page = open_page("laptop", f"{site_url}/cache-renting.html")
    page.evaluate("kvx.anim.reset()")
    page.get_by_role("button", name=re.compile("Play")).click()
    page.wait_for_function("Number(document.documentElement.dataset.kvxFrame) >= 2", timeout=10_000)
    page.get_by_role("button", name=re.compile("Pause")).click()
    wait_url(page, f"step={frame(page)}")


def test_help_is_a_disclosure_for_touch_and_keyboard(open_page, site_url):
    page = open_page("phone", f"{site_url}/paging.html")
    spec = REGISTRY["paging"].params.describe()[0]
    help_button = page.get_by_role("button", name=f"Help: {widgets.title(spec)}")
    assert help_button.get_attribute("aria-expanded") == "false"
    help_button.tap()
    note = page.locator(".kvx-help").filter(has_text=spec["help"])
    assert note.is_visible() and help_button.get_attribute("aria-expanded") == "true"
    help_button.focus()
    page.keyboard.press("Enter")
    assert not note.is_visible()


def test_arrow_on_the_focused_slider_moves_one_frame(open_page, site_url):
    page = open_page("laptop", f"{site_url}/cache-renting.html?step=3")
    handle = page.locator(".noUi-handle").first
    assert handle.get_attribute("aria-label") == "animation frame"
    box = handle.bounding_box()
    assert box["width"] >= 24 and box["height"] >= 24, box        # a finger's target
    handle.focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_timeout(300)
    assert frame(page) == 4


def test_suggestion_list_closes_on_tab(open_page, site_url):
    page = open_page("laptop", f"{site_url}/mla.html")
    spec = next(s for s in REGISTRY["mla"].params.describe() if s["name"] == "kv_dtype")
    box = control(page, spec)
    box.click()
    box.fill("")
    box.type("b")
    menu = page.locator(".bk-AutocompleteInput .bk-menu").first
    menu.wait_for(state="visible", timeout=5_000)
    page.keyboard.press("Tab")
    assert not menu.is_visible()


def test_an_emptied_box_says_so_with_its_label(open_page, site_url):
    page = open_page("laptop", f"{site_url}/cache-renting.html")
    spec = next(s for s in REGISTRY["cache-renting"].params.describe() if s["name"] == "gpu_count")
    box = control(page, spec)
    box.fill("")
    box.press("Enter")
    said = "Bokeh.documents[0].get_model_by_name('error:gpu_count').text"
    page.wait_for_function(f"{said}.includes('needs a value')", timeout=10_000)
    text = page.evaluate(said)
    assert text.startswith(widgets.title(spec)) and "gpu_count" not in text
    assert f"from {spec['min']} to {spec['max']}" in text
    # A value out of range names the label too, not the code's field.
    box.fill("0")
    box.press("Enter")
    page.wait_for_function("Number(document.documentElement.dataset.kvxErrors || 0) > 0", timeout=30_000)
    text = page.evaluate(said)
    assert "got 0" in text and widgets.title(spec) in text and "gpu_count" not in text


def test_a_drag_over_a_plot_does_not_pan_it(open_page, site_url):
    page = open_page("laptop", f"{site_url}/prompt-caching.html")
    ranges = """() => [...Bokeh.documents[0].all_models].filter(m => 'x_range' in m.properties && 'renderers' in m.properties)
                  .map(p => [p.x_range.start, p.x_range.end, p.y_range.start, p.y_range.end])"""
    before = page.evaluate(ranges)
    canvas = page.locator(".bk-Figure").first
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(cx, cy)
    page.mouse.down()
    page.mouse.move(cx - 150, cy + 60, steps=8)
    page.mouse.up()
    page.mouse.wheel(0, 300)
    page.wait_for_timeout(200)
    assert page.evaluate(ranges) == before


def test_plots_are_named_and_agent_sessions_uses_shapes(open_page, site_url):
    page = open_page("laptop", f"{site_url}/agent-sessions.html")
    labels = page.evaluate("""() => [...document.querySelectorAll('*')].concat(...[...document.querySelectorAll('*')]
        .filter(e => e.shadowRoot).map(e => [...e.shadowRoot.querySelectorAll('*')]))
        .filter(e => e.getAttribute && e.getAttribute('role') === 'img').map(e => e.getAttribute('aria-label'))""")
    assert any(label.startswith("Every turn's time to first token") for label in labels), labels
    markers = page.evaluate("""() => { const r = [...Bokeh.documents[0].all_models].find(m => m.type === 'GlyphRenderer'
        && m.glyph.type === 'Scatter' && m.data_source.name === 'source:turns');
        return r.glyph.marker.transform.markers; }""")
    assert len(set(markers)) == 4


def test_classroom_mode_fits_controls_and_a_plot_on_a_projector(open_page, site_url):
    """1920x1080 at 150% zoom is 1280x720 CSS pixels: the controls and the first plot's top half on it."""
    page = open_page("laptop", f"{site_url}/paging.html?present=1")
    page.set_viewport_size({"width": 1280, "height": 720})
    assert page.evaluate("document.documentElement.classList.contains('kvx-present')")
    assert page.evaluate("[...Bokeh.documents[0].all_models].find(m => m.type === 'Title' && m.text).text_font_size") \
        != "15px"
    page.locator(".kvx-interactive").evaluate("e => e.scrollIntoView()")
    spec = REGISTRY["paging"].params.describe()[-1]
    last = control(page, spec).bounding_box()
    plot = page.locator(".bk-Figure").first.bounding_box()
    assert last["y"] + last["height"] <= 720 and plot["y"] + plot["height"] / 2 <= 720, (last, plot)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "present-paging.png"))
    page.keyboard.press("p")
    assert not page.evaluate("document.documentElement.classList.contains('kvx-present')")
    assert "present" not in query(page)


def test_run_it_here_waits_its_turn_and_retries_by_itself(open_page, site_url):
    """A class pressing together: the first answer is a 503 with Retry-After: 1, then the job is queued,
    then it runs; the page says each state and gets its answer without a second click."""
    page = open_page("laptop", f"{site_url}/quantization.html")
    calls = {"post": 0, "poll": 0}
    said = []

    def kernel(route):
        calls["post"] += 1
        if calls["post"] == 1:
            route.fulfill(status=503, headers={"Retry-After": "1", "Content-Type": "application/json"},
                          body=json.dumps({"detail": "The kernel queue is full; try again in a few seconds."}))
        elif calls["post"] == 2:
            route.fulfill(status=202, content_type="application/json",
                          body=json.dumps({"job": "j1", "status": "queued", "position": 2, "progress": 0}))
        else:
            route.continue_()

    def job(route):
        calls["poll"] += 1
        if calls["poll"] == 1:
            route.fulfill(status=202, content_type="application/json",
                          body=json.dumps({"job": "j1", "status": "running", "progress": 0.5, "message": "timing"}))
        else:                                 # the job is done: answer as a fresh POST would (the real kernel)
            route.fulfill(status=404, content_type="application/json", body=json.dumps({"detail": "gone"}))

    page.route("**/api/v1/kernels/**", kernel)
    page.route("**/api/v1/jobs/**", job)
    page.expose_function("kvxSaid", lambda text: said.append(text))
    page.evaluate("""() => new MutationObserver(() => window.kvxSaid(document.querySelector('[data-kvx-text="run_result"]').textContent))
        .observe(document.querySelector('[data-kvx-text="run_result"]'), {childList: true, characterData: true, subtree: true})""")
    page.wait_for_function("!Bokeh.documents[0].get_model_by_name('run:button').disabled", timeout=10_000)
    page.get_by_role("button", name=re.compile("Run it here")).click()
    page.wait_for_function("['failed', 'done'].includes(document.documentElement.dataset.kvxRunState)", timeout=30_000)
    assert any("busy" in s and "trying again by itself" in s for s in said), said
    assert any(s.startswith("Queued on the server, 2 jobs ahead") for s in said), said
    assert any(s.startswith("Running: 50%") for s in said), said
    # The mocked job vanished (404): the page says so once, without the doubled "try again" sentence.
    final = said[-1]
    assert final.count("again") <= 1 and page.evaluate("document.documentElement.dataset.kvxRetries") == "1"
    # The browser logs each mocked 503 and 404 as a failed load; those are this test's own doing.
    page.errors[:] = [e for e in page.errors if "Failed to load resource" not in e]


# Values that make a note under the readouts come and go (cross-layer: 1:3 does not divide 80 layers, 1:4 does), or
# grow (eviction: the baked page's note and a reply's differ): above the controls, they moved the box being typed in
# by 45-74 px at 1280 px.
MOVERS = [("cross-layer", "share", ["3", "4", "3"]), ("eviction", "budget", ["30", "20", "50"])]


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("slug, name, values", MOVERS, ids=[m[0] for m in MOVERS])
def test_a_replys_words_never_move_the_controls(open_page, site_url, size, slug, name, values):
    page = open_page(size, f"{site_url}/{slug}.html")
    spec = next(s for s in REGISTRY[slug].params.describe() if s["name"] == name)
    box = control(page, spec)
    box.scroll_into_view_if_needed()
    tops, notes = [box.bounding_box()["y"]], set()
    for value in values:
        before = applied(page)
        box.fill(value)
        box.press("Enter")
        wait_applied(page, before)
        page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")
        tops.append(box.bounding_box()["y"])
        notes.add(page.locator("#kvx-notes").inner_text())
    assert len(notes) > 1, f"the values should change the note: {notes}"       # else this test shows nothing
    assert max(tops) - min(tops) < 0.5, f"the {name} box moved: its top at {tops} px"
