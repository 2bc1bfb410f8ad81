"""The paging page: two memory maps filling side by side, a block table, and the run over time."""
from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import HoverTool, Range1d
from bokeh.plotting import figure
from bokeh.transform import dodge

from kvx.explainers.paging.model import ROW_SLOTS
from kvx.site import widgets

RESERVE, PAGED = "#b45309", "#2563eb"


def _memory_map(title: str, source, rows_range, key: str):
    fig = figure(height=300, sizing_mode="stretch_width", x_range=(0, ROW_SLOTS), y_range=rows_range, name=f"plot:{key}",
                 toolbar_location=None, title=title, x_axis_label=f"token slot within a row of {ROW_SLOTS}",
                 y_axis_label="row")
    fig.quad(left="x0", right="x1", bottom=dodge("row", -0.42), top=dodge("row", 0.42), source=source,
             fill_color="color", fill_alpha="alpha", line_color="white", line_width=0.5)
    fig.add_tools(HoverTool(tooltips=[("request", "@request"), ("", "@kind"), ("slots", "@x0–@x1")]))
    fig.ygrid.visible = False
    return fig


def layout(params_cls, values: dict, data: dict):
    src = widgets.sources(data)
    top, bottom = data["ranges"]["map_rows"]
    rows_range = Range1d(top, bottom, name="range:map_rows")
    reserve = _memory_map("Reserve: a chunk per request (pale: reserved, still empty)",
                          src["reserve_map"], rows_range, "reserve_map")
    paged = _memory_map("Paged: blocks on demand (pale: the empty end of a last block)", src["paged_map"], rows_range, "paged_map")

    share = figure(height=260, sizing_mode="stretch_width", toolbar_location=None, y_range=(0, 1.02), name="plot:share",
                   title="Share of KV memory holding real token states", x_axis_label="engine step")
    share.line("step", "reserve_share", source=src["series"], color=RESERVE, line_width=3, legend_label="reserve")
    share.line("step", "paged_share", source=src["series"], color=PAGED, line_width=3, legend_label="paged")
    running = figure(height=260, sizing_mode="stretch_width", toolbar_location=None, x_range=share.x_range, name="plot:running",
                     title="Requests running at once, and paged preemptions", x_axis_label="engine step")
    running.line("step", "reserve_running", source=src["series"], color=RESERVE, line_width=3, legend_label="reserve")
    running.line("step", "paged_running", source=src["series"], color=PAGED, line_width=3, legend_label="paged")
    running.line("step", "paged_preemptions", source=src["series"], color=PAGED, line_dash="dashed", line_width=2,
                 legend_label="paged preemptions (total)")
    for fig, top in ((share, "top"), (running, "top_running")):
        fig.segment(x0="step", x1="step", y0=0, y1=top, source=src["cursor"], color="#111827", line_width=2,
                    line_dash="dotted")
        fig.legend.location = "top_right"
        fig.legend.label_text_font_size = "12px"
    for fig in (reserve, paged, share, running):
        fig.title.text_font_size = "15px"
        fig.axis.axis_label_text_font_size = "13px"
    controls = widgets.controls(params_cls, values, per_row=6)
    animation = widgets.animation_controls(data["animation"]["frames"])
    block_table = widgets.text("block_table", mono=True)
    return column(controls, animation, widgets.plots_row(reserve, paged), block_table,
                  widgets.plots_row(share, running), sizing_mode="stretch_width")
