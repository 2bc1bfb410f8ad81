"""The agent-sessions page: every turn's cost over time, the hit-rate cliff, and where the time went."""
from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import HoverTool, NumeralTickFormatter, Range1d
from bokeh.plotting import figure
from bokeh.transform import factor_cmap, factor_hatch, factor_mark

from kvx.explainers.core import traces
from kvx.site import widgets

KINDS = ["first turn", "hit", "reload", "recompute"]
COLORS = ["#6b7280", "#059669", "#d97706", "#dc2626"]
MARKERS = ["square", "circle", "triangle", "x"]


def layout(params_cls, values: dict, data: dict):
    src = widgets.sources(data)
    start, end = data["ranges"]["turns_x"]
    turns = figure(height=330, sizing_mode="stretch_width", toolbar_location=None, name="plot:turns",
                   x_range=Range1d(start, end, name="range:turns_x"),
                   title="Every turn's time to first token: green circles when the history was still cached",
                   x_axis_label="time (s)", y_axis_label="seconds of prefill")
    # A shape per kind as well as a colour: a reader who cannot tell green from red still can (WCAG 1.4.1).
    turns.scatter("start", "seconds", source=src["turns"], size=10, legend_field="kind",
                  color=factor_cmap("kind", COLORS, KINDS), marker=factor_mark("kind", MARKERS, KINDS))
    turns.add_tools(HoverTool(tooltips=[("session", "@session"), ("prompt", "@prompt{0,0} tokens"),
                                        ("", "@kind"), ("time", "@seconds{0.00} s")]))
    turns.legend.location = "top_left"
    turns.legend.orientation = "horizontal"

    cliff = figure(height=300, sizing_mode="stretch_width", toolbar_location=None, y_range=(0, 1.05), name="plot:cliff",
                   title="The cliff: hit rate against the number of sessions", x_axis_label="sessions",
                   y_axis_label="history found in GPU memory")
    cliff.line("sessions", "hit_rate", source=src["cliff"], line_width=3, color="#2563eb")
    cliff.scatter("sessions", "hit_rate", source=src["cliff"], size=7, color="#2563eb")
    cliff.scatter("sessions", "hit_rate", source=src["here"], size=15, color="#dc2626")
    cliff.yaxis.formatter = NumeralTickFormatter(format="0%")

    split = figure(height=300, sizing_mode="stretch_width", toolbar_location=None, x_range=["recompute", "reload",
                                                                                           "new tokens"],
                   title="GPU seconds over the run", y_axis_label="seconds", name="plot:split")
    split.vbar(x="what", top="seconds", source=src["split"], width=0.6,
               color=factor_cmap("what", ["#dc2626", "#d97706", "#059669"], ["recompute", "reload", "new tokens"]),
               hatch_pattern=factor_hatch("what", ["x", "/", " "], ["recompute", "reload", "new tokens"]),
               hatch_color="white", hatch_alpha=0.7)
    for fig in (turns, cliff, split):
        fig.title.text_font_size = "15px"
        fig.axis.axis_label_text_font_size = "13px"
    upload = widgets.upload("trace", "Replay your own trace in place of the synthetic sessions: a Mooncake-format "
                                     "JSONL file (one request per line; "
                                     f"{traces.BROWSER_NOTE}).", accept=".jsonl,.json,.txt")
    return column(widgets.controls(params_cls, values, per_row=5), upload, widgets.text("trace"),
                  widgets.animation_controls(data["animation"]["frames"]), turns,
                  widgets.plots_row(cliff, split), sizing_mode="stretch_width")
