"""Bokeh controls shared by every explainer page.

Controls are named `param:<name>`, their inline error messages `error:<name>`, plot sources
`source:<key>` and animation widgets `anim:<part>`. The page runtime (static/kvx-page.js) finds
them by these names, so an explainer's view only lays them out; it never writes JavaScript.
"""
from __future__ import annotations

from bokeh.models import (AutocompleteInput, Button, ColumnDataSource, CustomJS, Div, FileInput, InlineStyleSheet,
                          Select, Slider, TextInput)
from bokeh.layouts import column, row

SPEEDS = ["0.5×", "1×", "2×", "4×", "8×"]
# Bokeh draws widgets in shadow DOM at 13px; projectors and tired eyes want larger type.
READABLE_CSS = (":host { font-size: 16px; } label { font-size: 15px; } "
                ".bk-input, .bk-btn { font-size: 16px; min-height: 36px; }")


# Bokeh models belong to one document, so each page gets its own instances of these two.
def readable() -> InlineStyleSheet:
    return InlineStyleSheet(css=READABLE_CSS)


def on_change() -> CustomJS:
    """Every control tells the runtime that it changed; the runtime reads all values and asks the worker."""
    return CustomJS(code="window.kvx && window.kvx.onControl(cb_obj)")


def _title(spec) -> str:
    return f"{spec['name'].replace('_', ' ')}" + (f" ({spec['unit']})" if spec["unit"] else "")


def control(spec: dict, value, *, width: int = 190):
    """One control for one parameter, with its inline error message underneath."""
    name, title = spec["name"], _title(spec)
    common = dict(name=f"param:{name}", title=title, width=width, description=spec["help"], stylesheets=[readable()])
    if spec["kind"] == "choice" and spec.get("free"):
        widget = AutocompleteInput(value=str(value), completions=spec["choices"], restrict=False,
                                   min_characters=0, case_sensitive=False, **common)
    elif spec["kind"] == "choice":
        widget = Select(value=str(value), options=spec["choices"], **common)
    else:
        widget = TextInput(value="" if value is None else f"{value:g}" if isinstance(value, float) else str(value),
                           placeholder="auto" if spec["optional"] else "", **common)
    widget.js_on_change("value", on_change())
    error = Div(name=f"error:{name}", text="", width=width, styles={"color": "#b91c1c", "font-size": "14px"})
    return column(widget, error, spacing=0)


def controls(params_cls, values: dict, *, free_choices: tuple[str, ...] = (), per_row: int = 5):
    """All of an explainer's controls, in declaration order, `per_row` to a row."""
    items = []
    for spec in params_cls.describe():
        spec = dict(spec, free=spec["name"] in free_choices)
        items.append(control(spec, values[spec["name"]]))
    return column(*[row(*items[i:i + per_row]) for i in range(0, len(items), per_row)])


def sources(data: dict) -> dict[str, ColumnDataSource]:
    """A named ColumnDataSource per plot source, filled with the baked data."""
    return {key: ColumnDataSource(cols, name=f"source:{key}") for key, cols in data["sources"].items()}


def animation_controls(frames: int):
    """Play, pause, step, reset and speed, plus a caption; the runtime drives them from the model's frames."""
    play = Button(label="▶ Play", name="anim:play", width=100, button_type="primary")
    step_back = Button(label="◀ Step", name="anim:back", width=80)
    step = Button(label="Step ▶", name="anim:step", width=80)
    reset = Button(label="⟲ Reset", name="anim:reset", width=90)
    speed = Select(title="", value="1×", options=SPEEDS, name="anim:speed", width=70)
    frame = Slider(start=0, end=max(1, frames - 1), value=frames - 1, step=1, title="frame", name="anim:frame",
                   width=300)
    caption = Div(text="", name="anim:caption", sizing_mode="stretch_width", styles={"font-size": "17px"})
    for widget in (play, step_back, step, reset, speed, frame):
        widget.stylesheets = [readable()]
    for button, action in ((play, "toggle"), (step_back, "back"), (step, "step"), (reset, "reset")):
        button.js_on_event("button_click", CustomJS(code=f"window.kvx && window.kvx.anim.{action}()"))
    speed.js_on_change("value", CustomJS(code="window.kvx && window.kvx.anim.speed(cb_obj.value)"))
    frame.js_on_change("value", CustomJS(code="window.kvx && window.kvx.anim.seek(cb_obj.value)"))
    return column(row(play, step_back, step, reset, speed, frame), caption, sizing_mode="stretch_width")


def text(name: str, mono: bool = False) -> Div:
    """A block of text the model writes (data["texts"][name]), such as a block table."""
    styles = {"font-size": "16px"}
    if mono:
        styles["font-family"] = "ui-monospace, 'DejaVu Sans Mono', monospace"
    return Div(text="", name=f"text:{name}", sizing_mode="stretch_width", styles=styles)


def run_controls():
    """"Run it here": the runtime enables the button when the compute server answers, and shows the
    baked measurement (labelled with its device) until then."""
    button = Button(label="Run it here (looking for the kvx server…)", name="run:button", disabled=True, width=420,
                    button_type="success", stylesheets=[readable()])
    button.js_on_event("button_click", CustomJS(code="window.kvx && window.kvx.runHere()"))
    return column(button, text("run_result"), sizing_mode="stretch_width")


def upload(name: str, title: str, accept: str = ""):
    """A file the reader gives the model as data (a trace): the runtime reads it as text and sends it as
    `_<name>` with every request. The file is not a parameter, so it is never in the URL. A button
    puts the model back on its own data; the message for a bad file appears underneath."""
    label = Div(text=title, styles={"font-size": "15px"})
    box = FileInput(name=f"upload:{name}", accept=accept, width=360, stylesheets=[readable()])
    box.js_on_change("value", CustomJS(code="window.kvx && window.kvx.onUpload(cb_obj)"))
    clear = Button(label="Use the built-in data", name=f"clear:{name}", width=220, stylesheets=[readable()])
    clear.js_on_event("button_click", CustomJS(code=f"window.kvx && window.kvx.clearUpload({name!r})"))
    error = Div(name=f"error:{name}", text="", sizing_mode="stretch_width", styles={"color": "#b91c1c",
                                                                                  "font-size": "14px"})
    return column(label, row(box, clear), error, sizing_mode="stretch_width")


def readable_figure(fig):
    """Titles and axis labels large enough for a projector at the back of a room."""
    fig.title.text_font_size = "16px"
    fig.axis.axis_label_text_font_size = "14px"
    fig.axis.major_label_text_font_size = "14px"
    return fig
