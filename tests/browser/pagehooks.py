"""The page's own hooks, shared by the browser tests: read a plot's source, type into a control, wait for the
worker's reply to be applied, and compare what is drawn with CPython's model for the same parameters."""
from __future__ import annotations

import json

import pytest

from kvx.explainers.registry import REGISTRY
from kvx.site import widgets


def source_data(page, key: str) -> dict:
    return page.evaluate(
        """key => { const d = Bokeh.documents[0].get_model_by_name('source:' + key).data;
                     const out = {}; for (const [k, v] of (d instanceof Map ? d : Object.entries(d))) out[k] = Array.from(v);
                     return out; }""", key)


def label(name: str, slug: str | None = None) -> str:
    """The control's label, as the page shows it (from the same spec the control is built from)."""
    explainers = [REGISTRY[slug]] if slug else list(REGISTRY.values())
    spec = next(s for e in explainers for s in e.params.describe() if s["name"] == name)
    return widgets.title(spec)


def control_group(page, title: str):
    """A control's group (its label, its box and its help), found by the label's words as a reader finds it."""
    return page.locator(f".bk-input-group:has(label:text-is('{title}'))")


def control_box(page, name: str, slug: str | None = None):
    """The control's input box, found by its label."""
    return control_group(page, label(name, slug)).locator("input")


def set_control(page, name: str, value: str, slug: str | None = None, pause_ms: int = 0) -> None:
    """Type into a control: select its text, type, press Enter. With `pause_ms` (the page benchmark's pace), as a
    reader does: a click into the box, its text selected with the keyboard, the keys `pause_ms` apart, a pause,
    then Enter. Tests need no pause: the box is filled at once, and the Enter is then the page's first keydown.
    In a reader's first change it never is, and the browser's first keydown after a pointer's focus restyles the
    focused box and asks for a frame (its focus ring follows the keyboard): timed from an Enter, that frame was
    the first change's alone (Chromium traces of mla, 6 cold loads: a frame in the round trip in 6 of 6 first
    changes, 3 of 30 of the rest)."""
    box = control_box(page, name, slug)
    if not pause_ms:
        box.fill(value)
        box.press("Enter")
        return
    box.click()
    box.press("ControlOrMeta+A")
    box.press_sequentially(value, delay=pause_ms)
    page.wait_for_timeout(pause_ms)
    box.press("Enter")


def applied(page) -> int:
    return int(page.evaluate("Number(document.documentElement.dataset.kvxApplied || 0)"))


def wait_applied(page, before: int, timeout_ms: int = 60_000) -> None:
    page.wait_for_function(f"Number(document.documentElement.dataset.kvxApplied || 0) > {before}", timeout=timeout_ms)


def collect_garbage(page) -> None:
    """A full garbage collection of the page, as the browser's own comes (DevTools' HeapProfiler.collectGarbage)."""
    page.context.new_cdp_session(page).send("HeapProfiler.collectGarbage")


def wait_all_drawn(page, timeout_ms: int = 60_000) -> None:
    """Every plot drawn, the ones below the first screen too (kvx-page.js draws them once Python is ready, or
    cannot start): a plot's element, and all it carries, exists only from then."""
    page.wait_for_selector("html[data-kvx-all-drawn]", state="attached", timeout=timeout_ms)


def wait_url(page, *parts: str, timeout_ms: int = 10_000) -> str:
    """The address follows a change once the change is drawn (kvx-page.js, urlSoon): wait until its query has
    every `name=value` part (exactly: step=1 is not step=10), and return it."""
    page.wait_for_function("""parts => { const q = new URLSearchParams(location.search);
                                         return parts.every((p) => { const [k, v] = p.split('=');
                                                                     return q.get(k) === v; }); }""",
                           arg=list(parts), timeout=timeout_ms)
    return page.url


def functions_called(coverage: list[dict], in_url: str = "") -> dict[tuple[str, str, int], int]:
    """One take of V8's precise coverage (Profiler.takePreciseCoverage's result) as (script id, function name,
    start offset) -> calls since the last take, for the scripts whose address holds `in_url`. Functions not called
    are left out, and so are scripts without an address (the harness's own: each page.evaluate is one). A
    function's first range is the whole function (the rest are its blocks, and "detailed": false gives none)."""
    out: dict[tuple[str, str, int], int] = {}
    for script in coverage:
        if not script["url"] or in_url not in script["url"]:
            continue
        for f in script["functions"]:
            whole = f["ranges"][0]
            if whole["count"]:
                key = (script["scriptId"], f["functionName"] or "(anonymous)", whole["startOffset"])
                out[key] = out.get(key, 0) + whole["count"]
    return out


def expected(slug: str, **values) -> dict:
    e = REGISTRY[slug]
    return json.loads(json.dumps(e.page_data(e.params.from_mapping(values))))


def assert_sources_equal(page, data: dict) -> None:
    for key, cols in data["sources"].items():
        got = source_data(page, key)
        for col, values in cols.items():
            assert got[col] == pytest.approx(values) if values and isinstance(values[0], float) else got[col] == values, \
                (key, col)
