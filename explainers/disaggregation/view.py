"""The disaggregation page: both modes on one timeline, step by step; exposed time against context and link."""
from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import FactorRange, HoverTool, LabelSet, NumeralTickFormatter, Range1d
from bokeh.plotting import figure
from bokeh.transform import factor_cmap

from kvx.explainers.disaggregation.model import LANES
from kvx.site import widgets

STYLES = ["prefill-a", "prefill-b", "link-a", "link-b", "decode"]
COLORS = ["#6b7280", "#9ca3af", "#dc2626", "#f87171", "#059669"]
AFTER, LAYERWISE = "#dc2626", "#2563eb"



def layout(params_cls, values: dict, data: dict):
    src = widgets.sources(data)
    start, end = data["ranges"]["gantt_x"]
    gantt = figure(height=330, sizing_mode="stretch_width", toolbar_location=None, name="plot:gantt",
                   y_range=FactorRange(*reversed(LANES)), x_range=Range1d(start, end, name="range:gantt_x"),
                   title="Prefill layer by layer, the cache crossing the link, the first decode step",
                   x_axis_label="time since the request arrived (ms)")
    gantt.hbar(y="lane", left="start", right="end", height=0.7, source=src["gantt"], line_color=None,
               fill_color=factor_cmap("style", COLORS, STYLES))
    gantt.add_tools(HoverTool(tooltips=[("", "@label")]))
    gantt.ygrid.visible = False
    z0, z1 = data["ranges"]["zoom_x"]
    zoom = figure(height=300, sizing_mode="stretch_width", toolbar_location=None, name="plot:zoom",
                  y_range=FactorRange(*reversed(LANES)), x_range=Range1d(z0, z1, name="range:zoom_x"),
                  title="Zoomed in on the end of prefill, where the two modes part",
                  x_axis_label="time since the request arrived (ms)")
    zoom.hbar(y="lane", left="start", right="end", height=0.7, source=src["gantt"], line_color="white",
              line_width=0.5, fill_color=factor_cmap("style", COLORS, STYLES))
    zoom.add_tools(HoverTool(tooltips=[("", "@label")]))
    zoom.ygrid.visible = False

    curve = figure(height=340, sizing_mode="stretch_width", x_axis_type="log", y_axis_type="log",
                   toolbar_location=None, title="Exposed transfer time against prompt length", name="plot:curve",
                   x_axis_label="prompt tokens (log scale)", y_axis_label="ms (log scale)")
    curve.line("context", "prefill_ms", source=src["curve"], line_width=3, color="#6b7280",
               legend_label="prefill (TTFT)")
    curve.line("context", "after_ms", source=src["curve"], line_width=3, color=AFTER,
               legend_label="exposed: after prefill")
    curve.line("context", "layerwise_ms", source=src["curve"], line_width=3, color=LAYERWISE,
               legend_label="exposed: layer by layer")
    curve.scatter("context", "ms", source=src["here"], size=12, color="#111827")
    curve.add_layout(LabelSet(x="context", y="ms", text="text", source=src["here"], x_offset=8, y_offset="dy",
                              text_font_size="13px"))
    curve.legend.location = "top_left"
    curve.legend.label_text_font_size = "13px"
    curve.xaxis.formatter = NumeralTickFormatter(format="0a")
    curve.add_tools(HoverTool(tooltips=[("tokens", "@context{0,0}"), ("prefill", "@prefill_ms{0.000} ms"),
                                        ("after prefill", "@after_ms{0.000} ms"),
                                        ("layer by layer", "@layerwise_ms{0.000} ms")]))

    names = data["sources"]["links"]["link"]
    links = figure(height=340, sizing_mode="stretch_width", x_axis_type="log", toolbar_location=None, name="plot:links",
                   y_range=FactorRange(*reversed(names)), title="The same request over each link preset",
                   x_axis_label="exposed transfer time (ms, log scale)")
    links.segment(x0="layerwise_ms", x1="after_ms", y0="link", y1="link", source=src["links"], color="#d1d5db",
                  line_width=3)
    links.scatter("after_ms", "link", source=src["links"], size=13, color=AFTER, legend_label="after prefill")
    links.scatter("layerwise_ms", "link", source=src["links"], size=13, color=LAYERWISE, marker="square",
                  legend_label="layer by layer")
    links.add_layout(LabelSet(x="after_ms", y="link", text="after_text", source=src["links"], x_offset=9,
                              y_offset=-7, text_font_size="12px"))
    links.legend.location = "top_right"
    links.x_range.range_padding = 0.6
    links.add_tools(HoverTool(tooltips=[("", "@links × @link"), ("after prefill", "@after_ms{0.000} ms"),
                                        ("layer by layer", "@layerwise_ms{0.000} ms")]))
    for fig in (gantt, zoom, curve, links):
        widgets.readable_figure(fig)
    controls = widgets.controls(params_cls, values, free_choices=("kv_dtype",), per_row=5)
    animation = widgets.animation_controls(data["animation"]["frames"])
    return column(controls, animation, gantt, zoom, widgets.plots_row(curve, links),
                  sizing_mode="stretch_width")
