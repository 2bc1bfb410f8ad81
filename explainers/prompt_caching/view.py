"""The prompt-caching page: cost against reuse with the break-even, and a simulated timeline."""
from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import FixedTicker, HoverTool, LabelSet, Range1d
from bokeh.plotting import figure
from bokeh.transform import factor_cmap, factor_mark

from kvx.site import widgets

KINDS = ["write", "hit", "expiry"]


def layout(params_cls, values: dict, data: dict):
    src = widgets.sources(data)
    curve = figure(height=340, sizing_mode="stretch_width", x_axis_type="log", toolbar_location=None, name="plot:curve",
                   title="Cost per 1,000 requests against how often the prefix is reused within its lifetime",
                   x_axis_label="requests per lifetime (rate × lifetime, log scale)", y_axis_label="$ per 1,000 requests")
    curve.line("reuses", "without", source=src["curve"], line_width=3, color="#6b7280", legend_label="no caching")
    curve.line("reuses", "with_cache", source=src["curve"], line_width=3, color="#2563eb", legend_label="caching")
    curve.line("reuses", "y", source=src["break_even"], line_width=2, line_dash="dashed", color="#dc2626",
               legend_label="break-even")
    curve.scatter("reuses", "cost", source=src["here"], size=14, color="#dc2626")
    curve.add_layout(LabelSet(x="reuses", y="cost", text="text", source=src["here"], x_offset=10, y_offset=6,
                              text_font_size="13px"))
    curve.legend.location = "top_right"
    curve.add_tools(HoverTool(tooltips=[("reuses per lifetime", "@reuses{0.000}"), ("cached", "$@with_cache{0.00}"),
                                        ("not cached", "$@without{0.00}")]))

    start, end = data["ranges"]["timeline_x"]
    timeline = figure(height=240, sizing_mode="stretch_width", toolbar_location=None, y_range=(-0.7, 2.7), name="plot:timeline",
                      x_range=Range1d(start, end, name="range:timeline_x"), x_axis_label="minutes",
                      title="A simulated hour: cache writes, hits and expiries (shaded: the prefix is cached)")
    timeline.hbar(y=1, left="t0", right="t1", height=2.8, source=src["alive"], color="#dbeafe")
    timeline.scatter("t", "y", source=src["timeline"], size=12, color=factor_cmap("kind", ["#d97706", "#059669",
                                                                                          "#dc2626"], KINDS),
                     marker=factor_mark("kind", ["triangle", "circle", "x"], KINDS), legend_field="kind")
    timeline.yaxis.ticker = FixedTicker(ticks=[0, 1, 2])
    timeline.yaxis.major_label_overrides = {0: "expiry", 1: "hit", 2: "write"}
    timeline.legend.orientation = "horizontal"
    timeline.legend.location = "top_right"
    for fig in (curve, timeline):
        fig.title.text_font_size = "15px"
        fig.axis.axis_label_text_font_size = "13px"
    return column(widgets.controls(params_cls, values, per_row=5), curve, timeline, sizing_mode="stretch_width")
