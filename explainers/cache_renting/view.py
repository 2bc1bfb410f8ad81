"""The cache-renting page: controls, the memory picture that fills up, and sessions against context."""
from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import HoverTool, LabelSet, NumeralTickFormatter, Range1d
from bokeh.plotting import figure
from bokeh.transform import factor_cmap

from kvx.site import widgets

KINDS = ["weights", "reserve", "session", "rejected"]
COLORS = ["#6b7280", "#d1d5db", "#2563eb", "#dc2626"]


def layout(params_cls, values: dict, data: dict):
    src = widgets.sources(data)
    x_start, x_end = data["ranges"]["memory_x"]

    memory = figure(height=240, sizing_mode="stretch_width", x_range=Range1d(x_start, x_end, name="range:memory_x"),
                    y_range=(0, 1.45), toolbar_location=None, title="The node's memory, filling up", name="plot:memory",
                    x_axis_label="GB (decimal) from the start of the node's memory")
    memory.quad(left="left", right="right", bottom=0, top=1, source=src["memory"], line_color="white",
                line_width=0.5, fill_color=factor_cmap("kind", COLORS, KINDS), legend_field="kind")
    memory.legend.orientation = "horizontal"
    memory.legend.location = "top_left"
    memory.legend.label_text_font_size = "13px"
    memory.segment(x0="x", x1="x", y0=0, y1=1.12, source=src["limits"], line_color="#111827", line_width=2,
                   line_dash="dashed")
    memory.add_layout(LabelSet(x="x", y=1.12, text="label", source=src["limits"], text_font_size="13px",
                               text_align="right", x_offset=-4, y_offset=-2))
    memory.yaxis.visible = False
    memory.ygrid.visible = False
    memory.add_tools(HoverTool(tooltips=[("", "@label")]))

    curve = figure(height=330, sizing_mode="stretch_width", x_axis_type="log", y_axis_type="log",
                   toolbar_location=None, title="Most sessions that fit, against context length", name="plot:curve",
                   x_axis_label="context per session (tokens, log scale)",
                   y_axis_label="concurrent sessions (log scale)")
    curve.line("context", "sessions", source=src["curve"], line_width=3, color=COLORS[2])
    curve.scatter("context", "sessions", source=src["point"], size=14, color=COLORS[3])
    curve.add_layout(LabelSet(x="context", y="sessions", text="text", source=src["point"], x_offset=10,
                              y_offset=6, text_font_size="14px"))
    curve.add_tools(HoverTool(tooltips=[("context", "@context{0,0} tokens"), ("sessions", "@sessions{0,0}")]))
    curve.xaxis.formatter = NumeralTickFormatter(format="0a")
    curve.yaxis.formatter = NumeralTickFormatter(format="0,0")
    for fig in (memory, curve):
        fig.title.text_font_size = "16px"
        fig.axis.axis_label_text_font_size = "14px"
        fig.axis.major_label_text_font_size = "13px"

    controls = widgets.controls(params_cls, values, free_choices=("weight_dtype", "kv_dtype"))
    animation = widgets.animation_controls(data["animation"]["frames"])
    return column(controls, animation, memory, curve, sizing_mode="stretch_width")
