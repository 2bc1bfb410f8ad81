"""The load-balancer page: four routers' replicas side by side (caches and queues, request by request),
then each router's hit rate over the run, its time-to-first-token distribution and its busiest replica."""
from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import HoverTool, NumeralTickFormatter, Range1d
from bokeh.plotting import figure
from bokeh.transform import dodge

from kvx.explainers.core import traces
from kvx.explainers.load_balancer.model import ROUTER_COLORS, ROUTERS
from kvx.site import widgets


def _lanes(src, data):
    x0, x1 = data["ranges"]["lanes_x"]
    y0, y1 = data["ranges"]["lanes_y"]
    fig = figure(height=600, sizing_mode="stretch_width", toolbar_location=None, name="plot:lanes",
                 x_range=Range1d(x0, x1, name="range:lanes_x"), y_range=Range1d(y0, y1, name="range:lanes_y"),
                 title="The same requests under four routers: each replica's prefix cache and queue")
    fig.axis.visible = False
    fig.grid.visible = False
    fig.outline_line_color = None
    fig.quad(left="x0", right="x1", bottom=dodge("y", -0.34), top=dodge("y", 0.34),
             source=src["lanes"], fill_color="#f3f4f6", line_color="#d1d5db")
    fig.text(x="lx", y="y", text="label", source=src["lanes"], text_align="right", text_baseline="middle",
             text_font_size="13px", text_color="#4b5563")
    fig.text(x="x", y="y", text="text", source=src["router_names"], text_color="color", text_font_size="16px",
             text_font_style="bold", text_baseline="middle")
    fig.text(x="x", y="y", text="text", source=src["headers"], text_font_size="13px", text_color="#4b5563",
             text_baseline="middle")
    cached = fig.quad(left="x0", right="x1", bottom=dodge("y", -0.3), top=dodge("y", 0.3),
                      source=src["cache"], fill_color="color", line_color="white", line_width=0.5)
    queued = fig.quad(left="x0", right="x1", bottom=dodge("y", -0.3), top=dodge("y", 0.3),
                      source=src["queue"], fill_color="color", line_color="line", line_width=2)
    fig.text(x="x", y="y", text="text", source=src["more"], text_baseline="middle", text_font_size="13px")
    fig.quad(left="x0", right="x1", bottom=dodge("y", -0.46), top=dodge("y", 0.46),
             source=src["here"], fill_alpha=0, line_color="#dc2626", line_width=3)
    fig.text(x="tx", y="y", text="text", source=src["here"], text_color="#dc2626", text_baseline="middle",
             text_font_size="14px", text_font_style="bold")
    fig.add_tools(HoverTool(renderers=[cached], tooltips=[("", "@owner"), ("cached", "@tokens{0,0} tokens")]))
    fig.add_tools(HoverTool(renderers=[queued], tooltips=[("", "@request"), ("", "@state")]))
    return fig


def layout(params_cls, values: dict, data: dict):
    src = widgets.sources(data)
    lanes = _lanes(src, data)

    start, end = data["ranges"]["running_x"]
    running = figure(height=300, sizing_mode="stretch_width", toolbar_location=None, y_range=(0, 1.02), name="plot:running",
                     x_range=Range1d(start, end, name="range:running_x"),
                     title="Hit rate so far (dashed: an unlimited cache)", x_axis_label="request (arrival order)",
                     y_axis_label="cached ÷ prompt")
    for router in ROUTERS:
        running.line("request", router.key, source=src["running"], line_width=3, color=ROUTER_COLORS[router.key],
                     legend_label=router.name)
    running.line("request", "y", source=src["cursor"], color="#111827", line_width=2, line_dash="dotted")
    running.line("request", "hit_rate", source=src["unlimited"], color="#111827", line_width=2, line_dash="dashed",
                 legend_label="unlimited cache")
    running.yaxis.formatter = NumeralTickFormatter(format="0%")
    running.legend.location = "bottom_right"

    t0, t1 = data["ranges"]["ttft_x"]
    ttft = figure(height=300, sizing_mode="stretch_width", toolbar_location=None, y_range=(0, 1.02), name="plot:ttft",
                  x_range=Range1d(t0, t1, name="range:ttft_x"),
                  title="Time to first token (dots: p50 and p99)",
                  x_axis_label="seconds", y_axis_label="share of requests")
    for router in ROUTERS:
        ttft.step("ttft", "share", source=src[f"ecdf_{router.key}"], mode="after", line_width=3,
                  color=ROUTER_COLORS[router.key], legend_label=router.name)
    dots = ttft.scatter("ttft", "share", source=src["percentiles"], color="color", size=11, line_color="white")
    ttft.add_tools(HoverTool(renderers=[dots], tooltips=[("", "@router"), ("", "@label")]))
    ttft.yaxis.formatter = NumeralTickFormatter(format="0%")
    ttft.legend.location = "bottom_right"

    names = [r.name for r in ROUTERS]
    b0, b1 = data["ranges"]["busy_y"]
    busy = figure(height=300, sizing_mode="stretch_width", toolbar_location=None, x_range=names, name="plot:busy",
                  y_range=Range1d(b0, b1, name="range:busy_y"),
                  title="Busy seconds per replica (dots), mean (bar)", y_axis_label="seconds of prefill")
    busy.scatter("router", "busy", source=src["busy"], color="color", size=12, alpha=0.75, line_color="white")
    busy.scatter("router", "mean", source=src["busy_mean"], color="color", marker="dash", size=46, line_width=3)
    busy.text("router", "max", text="label", source=src["busy_mean"], text_align="center", y_offset=-12,
              text_font_size="12px")
    busy.add_tools(HoverTool(tooltips=[("", "@replica"), ("busy", "@busy{0.00} s")]))
    busy.xaxis.major_label_text_font_size = "13px"

    for fig in (running, ttft):
        fig.legend.label_text_font_size = "12px"
        fig.legend.spacing = 0
        fig.legend.padding = 4
        fig.legend.background_fill_alpha = 0.7
    for fig in (lanes, running, ttft, busy):
        fig.title.text_font_size = "15px"
        fig.axis.axis_label_text_font_size = "13px"
    upload = widgets.upload("trace", "Replay your own trace: a Mooncake-format JSONL file (one request per line; "
                                     f"{traces.BROWSER_NOTE}).", accept=".jsonl,.json,.txt")
    return column(widgets.controls(params_cls, values, per_row=5), upload, widgets.text("trace"),
                  widgets.animation_controls(data["animation"]["frames"]), lanes, widgets.text("lanes_key"),
                  widgets.plots_row(running, ttft, busy), sizing_mode="stretch_width")
