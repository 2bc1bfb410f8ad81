"""Bokeh controls shared by every explainer page.

Controls are named `param:<name>`, their inline error messages `error:<name>`, plot sources
`source:<key>` and animation widgets `anim:<part>`. The page runtime (static/kvx-page.js) finds
them by these names, so an explainer's view only lays them out; it never writes JavaScript.
"""
from __future__ import annotations

import re

from bokeh.models import (AutocompleteInput, Button, ColumnDataSource, CustomJS, Div, FileInput, InlineStyleSheet,
                          Select, Slider, TextInput)
from bokeh.layouts import column, row

SPEEDS = ["0.5×", "1×", "2×", "4×", "8×"]
# Bokeh draws widgets in shadow DOM at 13px; projectors and tired eyes want larger type.
# Buttons' colours meet 4.5:1 with white text (Bokeh's own primary is 3.63:1, success 2.48:1), and focus
# is a ring a projector shows (Bokeh's is a faint glow); the slider's handle is at least 24x24 px for a finger.
# Sizes are CSS variables (they cross into Bokeh's shadow DOM), so classroom mode (?present=1) can enlarge them.
READABLE_CSS = (":host { font-size: var(--kvx-widget-font, 16px); } "
                "label { font-size: var(--kvx-label-font, 15px); white-space: normal; overflow-wrap: anywhere; } "
                ".bk-input, .bk-btn { font-size: var(--kvx-widget-font, 16px); min-height: 36px; } "
                ".bk-btn-primary { background-color: #1d4ed8; border-color: #1e3a8a; color: #fff; } "
                ".bk-btn-primary:hover { background-color: #1e40af; } "
                ".bk-btn-success { background-color: #15803d; border-color: #14532d; color: #fff; } "
                ".bk-btn-success:hover { background-color: #166534; } "
                ".bk-btn:focus-visible, .bk-input:focus, .noUi-handle:focus { outline: var(--kvx-ring, 3px) solid "
                "#1d4ed8; outline-offset: 2px; box-shadow: 0 0 0 calc(2 * var(--kvx-ring, 3px)) #fde68a; } "
                ".bk-description { padding: 4px; margin: -4px 0; cursor: pointer; } "
                ".bk-description:focus-visible { outline: 3px solid #1d4ed8; outline-offset: 1px; } "
                ".noUi-horizontal .noUi-handle { width: 28px; height: 28px; right: -14px; top: -11px; }")

# Rows wrap instead of running off a phone's screen; a control takes half the column there (two columns).
WRAP_CSS = ":host { flex-wrap: wrap !important; row-gap: 4px; }"
CONTROLS_CSS = (":host { flex-wrap: wrap !important; row-gap: 2px; } "
                "@media (max-width: 560px) { * { flex: 0 0 calc(50% - 10px) !important; width: auto !important; } }")

# Bokeh models belong to one document, so each page gets its own instances of these two.
def readable() -> InlineStyleSheet:
    return InlineStyleSheet(css=READABLE_CSS)


def on_change() -> CustomJS:
    """Every control tells the runtime that it changed; the runtime reads all values and asks the worker."""
    return CustomJS(code="window.kvx && window.kvx.onControl(cb_obj)")


# The code's short spelling of a unit inside a parameter's name ("lifetime_s", "link_gbps"), as the unit is written.
UNIT_SPELLINGS = {"s": "s", "ms": "ms", "us": "µs", "min": "min", "hour": "h", "gb": "gb", "gbps": "gb/s"}
JOINERS = {"per", "of", "or", "the", "a"}


def _said(word: str) -> str:
    word = word.lower()
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


def title(spec) -> str:
    """A control's label: its name in words and its unit in brackets, never saying the unit twice.
    A unit spelled short in the name gives way to the unit as written ("lifetime_s" in s: "lifetime (s)";
    "rate_per_min" in requests/min: "rate (requests/min)"); unit words the name already says are left out of
    the brackets ("seed", "output tokens", "gpus per replica", "kv dtype (or bits)")."""
    unit = spec["unit"] or ""
    parts = [w for w in re.split(r"[\s/]+", unit.lower()) if w]
    words = [w for w in spec["name"].split("_") if UNIT_SPELLINGS.get(w.lower()) not in (unit.lower(), *parts)]
    while words and words[-1] in JOINERS:                # "rate per" after "min" left
        words.pop()
    words = words or spec["name"].split("_")
    said = {_said(w) for w in words}
    if "/" not in unit:                                  # a rate keeps its unit whole
        unit = " ".join(w for w in unit.split() if _said(w) not in said)
        if all(w.lower() in JOINERS for w in unit.split()):
            unit = ""
    return f"{' '.join(words)} ({unit})" if unit else " ".join(words)


def control(spec: dict, value, *, width: int = 190):
    """One control for one parameter, with its inline error message underneath."""
    name, label = spec["name"], title(spec)
    common = dict(name=f"param:{name}", title=label, width=width, description=spec["help"], stylesheets=[readable()])
    if spec["kind"] == "choice" and spec.get("free"):
        widget = AutocompleteInput(value=str(value), completions=spec["choices"], restrict=False,
                                   min_characters=0, case_sensitive=False, **common)
    elif spec["kind"] == "choice":
        widget = Select(value=str(value), options=spec["choices"], **common)
    else:
        widget = TextInput(value="" if value is None else f"{value:g}" if isinstance(value, float) else str(value),
                           placeholder="auto" if spec["optional"] else "", **common)
    widget.js_on_change("value", on_change())
    error = Div(name=f"error:{name}", text="", sizing_mode="stretch_width", margin=(0, 5, 4, 5),
                styles={"color": "#b91c1c", "font-size": "14px"},
                stylesheets=[InlineStyleSheet(css=".bk-clearfix:empty, div:empty { display: none; }")])
    widget.sizing_mode = "stretch_width"
    widget.width = None
    return column(widget, error, spacing=0, width=width)


def controls(params_cls, values: dict, *, free_choices: tuple[str, ...] = (), per_row: int = 5):
    """All of an explainer's controls, in declaration order, in one row that wraps: as many to a line as
    the screen holds, two to a line on a phone. (`per_row` was the old fixed count; it is ignored.)"""
    items = []
    for spec in params_cls.describe():
        spec = dict(spec, free=spec["name"] in free_choices)
        items.append(control(spec, values[spec["name"]]))
    return row(*items, stylesheets=[InlineStyleSheet(css=CONTROLS_CSS)], sizing_mode="stretch_width")


def sources(data: dict) -> dict[str, ColumnDataSource]:
    """A named ColumnDataSource per plot source, filled with the baked data."""
    return {key: ColumnDataSource(cols, name=f"source:{key}") for key, cols in data["sources"].items()}


def animation_controls(frames: int):
    """Play, pause, step, reset and speed, plus a caption; the runtime drives them from the model's frames."""
    play = Button(label="▶ Play", name="anim:play", width=100, button_type="primary")
    step_back = Button(label="◀ Step", name="anim:back", width=80)
    step = Button(label="Step ▶", name="anim:step", width=80)
    reset = Button(label="⟲ Reset", name="anim:reset", width=90)
    speed = Select(title="speed", value="1×", options=SPEEDS, name="anim:speed", width=80)
    frame = Slider(start=0, end=max(1, frames - 1), value=frames - 1, step=1, title="frame", name="anim:frame",
                   sizing_mode="stretch_width", min_width=200)
    caption = Div(text="", name="anim:caption", sizing_mode="stretch_width", styles={"font-size": "17px"})
    for widget in (play, step_back, step, reset, speed, frame):
        widget.stylesheets = [readable()]
    for button, action in ((play, "toggle"), (step_back, "back"), (step, "step"), (reset, "reset")):
        button.js_on_event("button_click", CustomJS(code=f"window.kvx && window.kvx.anim.{action}()"))
    speed.js_on_change("value", CustomJS(code="window.kvx && window.kvx.anim.speed(cb_obj.value)"))
    frame.js_on_change("value", CustomJS(code="window.kvx && window.kvx.anim.seek(cb_obj.value)"))
    # The buttons wrap on a phone; the slider gets a line of its own, as wide as the column.
    return column(row(play, step_back, step, reset, speed, stylesheets=[InlineStyleSheet(css=WRAP_CSS)]),
                  frame, caption, sizing_mode="stretch_width")


def text(name: str, mono: bool = False) -> Div:
    """A block of text the model writes (data["texts"][name]), such as a block table."""
    styles = {"font-size": "16px"}
    if mono:
        styles["font-family"] = "ui-monospace, 'DejaVu Sans Mono', monospace"
    return Div(text="", name=f"text:{name}", sizing_mode="stretch_width", styles=styles)


def run_controls():
    """"Run it here": the runtime enables the button when the compute server answers, and shows the
    baked measurement (labelled with its device) until then."""
    button = Button(label="Run it here (looking for the kvx server…)", name="run:button", disabled=True,
                    sizing_mode="stretch_width", max_width=520,
                    button_type="success", stylesheets=[readable()])
    button.js_on_event("button_click", CustomJS(code="window.kvx && window.kvx.runHere()"))
    return column(button, text("run_result"), sizing_mode="stretch_width")


def upload(name: str, title: str, accept: str = ""):
    """A file the reader gives the model as data (a trace): the runtime reads it as text and sends it as
    `_<name>` with every request. The file is not a parameter, so it is never in the URL. A button
    puts the model back on its own data; the message for a bad file appears underneath."""
    box = FileInput(name=f"upload:{name}", title=title, accept=accept, width=360, stylesheets=[readable()])
    box.js_on_change("value", CustomJS(code="window.kvx && window.kvx.onUpload(cb_obj)"))
    clear = Button(label="Use the built-in data", name=f"clear:{name}", width=220, stylesheets=[readable()])
    clear.js_on_event("button_click", CustomJS(code=f"window.kvx && window.kvx.clearUpload({name!r})"))
    error = Div(name=f"error:{name}", text="", sizing_mode="stretch_width", styles={"color": "#b91c1c",
                                                                                  "font-size": "14px"})
    box.width, box.sizing_mode, box.max_width = None, "stretch_width", 360
    # The file box keeps a usable width: on a phone the button goes under it (PLOTS_ROW_CSS wraps).
    return column(row(box, clear, stylesheets=[InlineStyleSheet(css=PLOTS_ROW_CSS)], sizing_mode="stretch_width"),
                  error, sizing_mode="stretch_width")


# Plots side by side on a laptop, one under the other on a phone: each keeps at least 320 px (or the
# whole column) and the row wraps when two do not fit.
PLOTS_ROW_CSS = ":host { flex-wrap: wrap !important; row-gap: 8px; } * { min-width: min(100%, 320px); }"


def plots_row(*children):
    """Plots (or columns) side by side that wrap onto their own lines on a narrow screen (as an HTML row,
    site/dom_layout.py, the class kvx-plots-row does the same)."""
    return row(*children, sizing_mode="stretch_width", stylesheets=[InlineStyleSheet(css=PLOTS_ROW_CSS)],
               css_classes=["kvx-plots-row"])


def plot_summaries(layout):
    """Each plot named `plot:<key>` gets its summary right under it: the model's sentence
    (data["texts"]["summary:<key>"], explainers/core/summaries.py) in a modest caption, which the plot's
    aria-describedby points at, so a screen reader reads it with the plot. Two plots that show the same thing
    two ways (one for a wide screen, one for a phone, only one visible) share a key: the caption goes under the
    last of them and both point at it. Runs once per layout."""
    from bokeh.models import Column, Plot, Row
    from kvx.explainers.core.summaries import text_name

    def named(child):
        return (isinstance(child, Plot) and (child.name or "").startswith("plot:")
                and "aria-describedby" not in child.html_attributes)

    def walk(box, visit):
        for i, child in enumerate(list(box.children)):
            if named(child):
                visit(box, i, child)
            elif isinstance(child, (Row, Column)):
                walk(child, visit)

    last = {}
    walk(layout, lambda box, i, plot: last.__setitem__(plot.name, plot))

    def caption(box, i, plot):
        key = plot.name[len("plot:"):]
        if last[plot.name] is plot:
            note = Div(text="", name=f"text:{text_name(key)}", html_id=f"kvx-summary-{key}",
                       sizing_mode="stretch_width", styles={"font-size": "15px", "color": "#374151"})
            kids = list(box.children)
            kids[i] = column(plot, note, sizing_mode="stretch_width", spacing=0)
            box.children = kids
        plot.html_attributes = {**plot.html_attributes, "aria-describedby": f"kvx-summary-{key}"}
    walk(layout, caption)
    return layout


def calm_plots(layout):
    """No plot pans or zooms on its own: a swipe over a plot scrolls the page (on a phone, a drag on a
    plot used to pan it away for good, with the toolbar hidden and no reset). Hover stays. Each plot is
    also named for assistive technology by its title, so it is not an unnamed tab stop, and described by
    the model's summary under it (plot_summaries)."""
    from bokeh.models import Plot
    plot_summaries(layout)
    for plot in layout.select({"type": Plot}):
        plot.toolbar.active_drag = None
        plot.toolbar.active_scroll = None
        plot.toolbar.active_multi = None
        title = plot.title.text if plot.title is not None else ""
        if title and not plot.html_attributes.get("aria-label"):
            plot.html_attributes = {**plot.html_attributes, "role": "img", "aria-label": title}
    return layout


def readable_figure(fig):
    """Titles and axis labels large enough for a projector at the back of a room."""
    fig.title.text_font_size = "16px"
    fig.axis.axis_label_text_font_size = "14px"
    fig.axis.major_label_text_font_size = "14px"
    return fig
