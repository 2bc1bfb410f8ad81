"""The prefix-reuse page: the radix tree growing request by request, and what each request computed."""
from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import ColorBar, HoverTool, LinearColorMapper
from bokeh.palettes import Viridis256
from bokeh.plotting import figure

from kvx.explainers.core import traces
from kvx.site import widgets


def layout(params_cls, values: dict, data: dict):
    src = widgets.sources(data)
    hits = LinearColorMapper(palette=Viridis256[::-1][40:], low=0, high=max(8, values["users"] * values["turns"]))
    tree = figure(height=380, sizing_mode="stretch_width", toolbar_location=None, y_axis_location=None, name="plot:tree",
                  title="The radix tree: each bar a run of cached tokens, coloured by how many requests stored it",
                  x_axis_label="token position from the start of the prompt")
    tree.quad(left="x0", right="x1", bottom="y0", top="y1", source=src["tree"], line_color="white",
              fill_color={"field": "hits", "transform": hits})
    tree.quad(left="x0", right="x1", bottom="y0", top="y1", source=src["tree"], fill_alpha=0, line_width=3,
              line_color={"field": "state", "transform": _outline()})
    tree.segment(x0="x0", x1="x1", y0="y", y1="y", source=src["current"], line_width=8, color="#dc2626")
    tree.text(x="x0", y="y", text="label", source=src["current"], y_offset=-8, text_font_size="13px")
    tree.add_layout(ColorBar(color_mapper=hits, title="requests that stored it", width=10), "right")
    tree.add_tools(HoverTool(tooltips=[("tokens", "@tokens"), ("stored by", "@hits requests (the first, then every reuse)"), ("", "@state")]))

    per = figure(height=280, sizing_mode="stretch_width", toolbar_location=None, name="plot:per",
                 title="Each request's prompt: reused from the cache, and computed", x_axis_label="request")
    per.vbar_stack(["matched", "computed"], x="request", width=0.8, color=["#059669", "#dc2626"],
                   source=src["per_request"], legend_label=["reused", "computed"])
    per.segment(x0="request", x1="request", y0=0, y1="top", source=src["cursor"], color="#111827", line_width=2,
                line_dash="dotted")
    per.legend.location = "top_left"
    cum = figure(height=280, sizing_mode="stretch_width", toolbar_location=None, name="plot:cum",
                 title="Prefill tokens computed so far", x_axis_label="request")
    cum.line("request", "without_cache", source=src["cumulative"], line_width=3, color="#6b7280",
             legend_label="without prefix caching")
    cum.line("request", "with_cache", source=src["cumulative"], line_width=3, color="#2563eb",
             legend_label="with prefix caching")
    cum.legend.location = "top_left"
    for fig in (tree, per, cum):
        fig.title.text_font_size = "15px"
        fig.axis.axis_label_text_font_size = "13px"
    controls = widgets.controls(params_cls, values, per_row=5)
    upload = widgets.upload("trace", "Replay your own trace in place of the synthetic users: a Mooncake-format "
                                     "JSONL file (one request per line; "
                                     f"{traces.BROWSER_NOTE}).", accept=".jsonl,.json,.txt")
    return column(controls, upload, widgets.text("trace"), widgets.animation_controls(data["animation"]["frames"]), tree,
                  widgets.plots_row(per, cum), sizing_mode="stretch_width")


def _outline():
    from bokeh.models import CategoricalColorMapper
    return CategoricalColorMapper(factors=["matched now", "cached"], palette=["#dc2626", "#ffffff"])
