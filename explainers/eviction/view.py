"""The eviction page: the attention map with the kept tokens, the cost against budget, and a bounded cache
stepping through decoding."""
from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import (CategoricalColorMapper, ColorBar, Div, FactorRange, HoverTool, Label, LogColorMapper,
                          NumeralTickFormatter, Range1d, Span)
from bokeh.palettes import Magma256
from bokeh.plotting import figure
from bokeh.transform import dodge

from kvx.explainers.eviction.model import POLICIES, SHORT, data
from kvx.site import widgets

COLORS = {"full": "#111827", "random": "#9ca3af", "streaming_llm": "#2563eb", "no_sinks": "#93c5fd",
          "h2o": "#dc2626", "observed": "#f97316", "snapkv": "#059669"}
DASH = {"no_sinks": "dashed", "random": "dotted", "observed": "dashed"}
STATES = CategoricalColorMapper(factors=["kept", "evicted"], palette=["#16a34a", "#d1d5db"])



def _against_budget(src, key: str, title: str, label: str, percent: bool):
    fig = figure(height=330, sizing_mode="stretch_width", toolbar_location=None, title=title, name=f"plot:{key}",
                 x_axis_label="budget (% of the prompt's tokens kept)", y_axis_label=label, x_range=Range1d(0, 103))
    for name in POLICIES:
        if name == "full":
            continue
        fig.line("budget", f"{key}_{name}", source=src["curve"], line_width=3, color=COLORS[name],
                 line_dash=DASH.get(name, "solid"), legend_label=SHORT[name])
        fig.scatter("budget", f"{key}_{name}", source=src["curve"], size=7, color=COLORS[name])
    fig.line("budget", key, source=src["reference"], line_width=2, color=COLORS["full"], line_dash="dashed",
             legend_label="full cache")
    if key == "recall":
        fig.line("budget", "chance", source=src["reference"], line_width=2, color="#a16207", line_dash="dotdash",
                 legend_label="chance (1 in 64)")
    fig.scatter("budget", key, source=src["here"], size=16, marker="circle", fill_alpha=0, line_width=3,
                color="#111827")
    if percent:
        fig.yaxis.formatter = NumeralTickFormatter(format="0.0%")
    fig.legend.label_text_font_size = "12px"
    fig.legend.location = "bottom_right" if key != "loss" else "top_right"
    fig.legend.background_fill_alpha = 0.7
    return widgets.readable_figure(fig)


def layout(params_cls, values: dict, data_: dict):
    src = widgets.sources(data_)
    d = data()
    seq_len = d["config"]["seq_len"]
    prefix = d["shown"]["prefix"]

    # The attention map of one recall sequence, with what the questions can no longer see greyed out.
    mapper = LogColorMapper(palette=Magma256[::-1], low=1e-4, high=1.0)
    amap = figure(height=620, sizing_mode="stretch_width", toolbar_location=None, name="plot:amap",
                  title="Attention in the chosen layer (mean over heads; each cell 16 queries × 16 keys)",
                  x_axis_label="key position (the token attended to)", y_axis_label="query position (the token attending)",
                  x_range=Range1d(-2, seq_len + 2), y_range=Range1d(seq_len + 2, -62))
    b = d["shown"]["map_bin"]
    amap.rect("x", "y", width=b, height=b, source=src["map"], line_color=None,
              fill_color={"field": "mass", "transform": mapper})
    amap.quad(left="left", right="right", bottom="bottom", top="top", source=src["band"], fill_color="#e5e7eb",
              fill_alpha=0.85, line_color=None)
    amap.quad(left="left", right="right", bottom=-24, top=-8, source=src["strip"], line_color=None,
              fill_color={"field": "state", "transform": STATES})
    amap.quad(left="left", right="right", bottom=-44, top=-30, source=src["needles"], fill_color="#f59e0b",
              line_color="#b45309")
    amap.add_layout(Span(location=prefix, dimension="width", line_color="#2563eb", line_width=2, line_dash="dashed"))
    amap.add_layout(Label(x=prefix + 4, y=-30, text="← SECRET lines", text_font_size="12px"))
    amap.add_layout(Label(x=prefix + 4, y=-8, text="← kept / evicted", text_font_size="12px"))
    amap.add_layout(Label(x=4, y=prefix + 4, text="questions (after the cut): grey columns are hidden from them",
                          text_font_size="13px", text_color="#1e3a8a", y_offset=-22, background_fill_color="white",
                          background_fill_alpha=0.85))
    amap.add_layout(ColorBar(color_mapper=mapper, title="share of the query's attention", width=12), "right")
    amap.add_tools(HoverTool(tooltips=[("keys from", "@x{0}"), ("queries from", "@y{0}"), ("mass", "@mass{0.0000}")],
                             renderers=[amap.renderers[0]]))

    def _received(y: str, title: str, label: str, low: float, high: float, fmt: str, key: str):
        fig = figure(height=300, sizing_mode="stretch_width", toolbar_location=None, y_axis_type="log", title=title,
                     name=f"plot:{key}",
                     x_axis_label="prompt position", y_axis_label=label, x_range=Range1d(-2, prefix + 2),
                     y_range=Range1d(low, high))
        fig.quad(left="left", right="right", bottom=low, top=high, source=src["needles"], fill_color="#fde68a",
                 fill_alpha=0.5, line_color=None, legend_label="SECRET lines")
        fig.line("x", y, source=src["received"], color="#6b7280", line_width=1)
        dots = fig.scatter("x", y, source=src["received"], size=6, color={"field": "state", "transform": STATES},
                           legend_field="state")
        fig.add_tools(HoverTool(tooltips=[("position", "@x"), ("byte", "@char"), ("value", f"@{y}{{{fmt}}}"),
                                          ("", "@state")], renderers=[dots]))
        fig.legend.location = "top_right"
        fig.legend.orientation = "horizontal"
        fig.legend.background_fill_alpha = 0.7
        return widgets.readable_figure(fig)

    score = _received("score", "Accumulated attention from the prompt's queries (H2O's score)",
                      "summed weight (log)", 1e-4, 1e3, "0.000", "score")
    recv = _received("mass", "Attention from the questions (what recall needs)", "mean weight (log)", 1e-6, 1.0,
                     "0.00000", "recv")

    sinks = figure(height=300, sizing_mode="stretch_width", toolbar_location=None, name="plot:sinks",
                   x_range=FactorRange(*data_["sources"]["sinks"]["layer"]),
                   title="Share of attention on the first 4 tokens (held-out text)",
                   y_axis_label="% of each query's attention")
    sinks.vbar(x=dodge("layer", -0.18, range=sinks.x_range), top="first_4", width=0.34, source=src["sinks"],
               color="#2563eb", legend_label="first 4 tokens")
    sinks.vbar(x=dodge("layer", 0.18, range=sinks.x_range), top="uniform", width=0.34, source=src["sinks"],
               color="#d1d5db", legend_label="if spread evenly")
    sinks.add_tools(HoverTool(tooltips=[("", "@layer"), ("first 4", "@first_4{0.00}%"), ("first token",
                                                                                      "@first_token{0.00}%"),
                                        ("uniform", "@uniform{0.00}%"), ("top 1% of keys", "@top1pct{0.0}%")]))
    sinks.y_range.start = 0
    sinks.add_layout(sinks.legend[0], "below")
    sinks.legend.orientation = "horizontal"

    loss = _against_budget(src, "loss", "Loss against budget (held-out text)", "bits per byte", False)
    top1 = _against_budget(src, "top1", "Top-1 agreement with the full cache (held-out text)", "agreement", True)
    recall = _against_budget(src, "recall", "Recall: the questions asked after the cut", "answer bytes right",
                             True)

    # Decoding with a bounded cache.
    raster = figure(height=560, sizing_mode="stretch_width", toolbar_location=None, name="plot:raster",
                    title=f"A {d['decode']['budget']}-token cache while decoding (one bar per token: when it was cached)",
                    x_axis_label="token position", y_axis_label="decode step (time runs down)",
                    x_range=Range1d(-1, d["decode"]["length"] + 1),
                    y_range=Range1d(d["decode"]["length"] - d["decode"]["prompt"] + 2, -2))
    life_colors = CategoricalColorMapper(factors=["cached", "sink", "evicted"],
                                         palette=["#16a34a", "#2563eb", "#d1d5db"])
    raster.quad(left="left", right="right", bottom="bottom", top="top", source=src["cut"], fill_color="#fca5a5",
                line_color=None, legend_label="cut at the end of the prompt")
    raster.quad(left="left", right="right", bottom="bottom", top="top", source=src["life"], line_color=None,
                fill_color={"field": "state", "transform": life_colors}, legend_field="state")
    raster.scatter("x", "y", source=src["marks"], size=12, marker="x", line_width=3,
                   color={"field": "what", "transform": CategoricalColorMapper(
                       factors=["new token", "evicted now"], palette=["#111827", "#dc2626"])})
    raster.add_layout(Span(location=d["decode"]["prompt"], dimension="height", line_color="#111827",
                           line_dash="dashed", line_width=2))
    raster.legend.location = "top_right"
    raster.legend.background_fill_alpha = 0.8

    steploss = figure(height=260, sizing_mode="stretch_width", toolbar_location=None, name="plot:steploss",
                      title="Mean loss of the decoded bytes so far", x_axis_label="decode step",
                      y_axis_label="bits per byte")
    steploss.line("step", "full", source=src["steploss"], line_width=2, line_dash="dashed", color=COLORS["full"],
                  legend_label="full cache")
    steploss.line("step", "policy", source=src["steploss"], line_width=3, color="#dc2626",
                  legend_label="this policy")
    steploss.line("step", "bits", source=src["cursor"], color="#6b7280", line_width=2)
    steploss.legend.location = "top_right"

    for fig in (amap, sinks, raster, steploss):
        widgets.readable_figure(fig)
    h3 = {"font-size": "20px", "font-weight": "bold", "margin-top": "12px"}
    head = Div(text="Which tokens stay, on a real attention map", sizing_mode="stretch_width", styles=h3)
    cost = Div(text="What it costs, at every budget", sizing_mode="stretch_width", styles=h3)
    steps = Div(text="<b style='font-size:20px'>Step through decoding with a bounded cache</b><p>The same policy "
                     "on a held-out piece "
                     f"of code: a {d['decode']['prompt']}-byte prompt, then {d['decode']['length'] - d['decode']['prompt']}"
                     f" decode steps with a cache of {d['decode']['budget']} tokens per layer and KV head (the bytes "
                     "are the real text, fed in one at a time).</p>", sizing_mode="stretch_width",
                styles={"font-size": "16px"})
    controls = widgets.controls(params_cls, values, per_row=4)
    return column(controls, widgets.text("rule"), head, amap, widgets.plots_row(score, recv),
                  widgets.plots_row(sinks, widgets.text("findings")), cost, widgets.plots_row(loss, top1),
                  widgets.plots_row(recall, column(widgets.run_controls(), widgets.text("provenance"),
                                                   sizing_mode="stretch_width")),
                  steps, widgets.animation_controls(data_["animation"]["frames"]), raster, steploss,
                  widgets.text("decode_text"), sizing_mode="stretch_width")
