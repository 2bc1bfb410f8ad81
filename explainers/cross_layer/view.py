"""The cross-layer page: bytes per token along the four axes (a waterfall), all sessions' caches against
context, the paper's Table 1, and what the kernels measured on the project's trained models (heat maps
of layer-to-layer similarity, loss and recall with sharing imposed and trained in)."""
from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import (Div, FactorRange, FixedTicker, HoverTool, LabelSet, NumeralTickFormatter, Range1d,
                          Span)
from bokeh.plotting import figure

from kvx.site import widgets

REMAINING, REMOVED = "#2563eb", "#bfdbfe"
LINES = {"raw": ("#6b7280", "its own attention in bf16, every layer caching"),
         "s1": ("#111827", "precision and kept tokens as chosen, no sharing"),
         "s2": ("#2563eb", "… and 1:2 sharing"),
         "s4": ("#059669", "… and 1:4 sharing")}



def _waterfall(src, data):
    names = data["sources"]["stages"]["stage"]
    x0, x1 = data["ranges"]["stages_x"]
    fig = figure(height=420, sizing_mode="stretch_width", x_axis_type="log", toolbar_location=None, name="plot:stages",
                 y_range=FactorRange(*reversed(names)), x_range=Range1d(x0, x1, name="range:stages_x"),
                 title="Bytes cached per token of context, one axis at a time (light: what that step removed)",
                 x_axis_label="bytes per token, all layers (log scale)")
    fig.hbar(y="stage", left="one", right="bytes", height=0.62, color=REMAINING, source=src["stages"])
    fig.hbar(y="stage", left="bytes", right="before", height=0.62, color=REMOVED, source=src["stages"])
    fig.add_layout(LabelSet(x="before", y="stage", text="label", source=src["stages"], x_offset=8, y_offset=-9,
                            text_font_size="15px"))
    fig.add_tools(HoverTool(tooltips=[("", "@stage"), ("bytes per token", "@bytes{0,0.00}")]))
    fig.ygrid.visible = False
    return widgets.readable_figure(fig)


def _memory(src):
    fig = figure(height=380, sizing_mode="stretch_width", x_axis_type="log", y_axis_type="log", toolbar_location=None,
                 name="plot:memory", title="All sessions' caches against context", x_axis_label="context per session (tokens, log scale)",
                 y_axis_label="GB (decimal, log scale)")
    for key, (color, label) in LINES.items():
        fig.line("context", key, source=src["memory"], line_width=3, color=color, legend_label=label,
                 line_dash="dashed" if key == "raw" else "solid")
    fig.scatter("context", "gb", source=src["here"], size=13, color="#dc2626")
    fig.add_layout(LabelSet(x="context", y="gb", text="text", source=src["here"], x_offset=12, y_offset=-24,
                            text_font_size="14px"))
    fig.legend.location = "top_left"
    fig.legend.label_text_font_size = "13px"
    fig.xaxis.formatter = NumeralTickFormatter(format="0a")
    return widgets.readable_figure(fig)


def _paper(src):
    fig = figure(height=380, sizing_mode="stretch_width", x_axis_type="log", toolbar_location=None, name="plot:paper",
                 title="Brandon et al. 2024, Table 1 (1B models)",
                 x_axis_label="KV bytes per token, 16-bit, by this page's formula (log scale)",
                 y_axis_label="validation perplexity (as reported)")
    fig.scatter("bytes", "perplexity", source=src["paper"], size=11, color="color", legend_field="group")
    fig.add_layout(LabelSet(x="bytes", y="perplexity", text="label", source=src["paper"], x_offset=8, y_offset=-7,
                            text_font_size="13px", text_color="#374151"))
    fig.add_tools(HoverTool(tooltips=[("", "@model"), ("bytes per token", "@bytes{0,0}"),
                                      ("perplexity", "@perplexity{0.00}")]))
    fig.x_range.range_padding = 0.45
    fig.legend.location = "bottom_left"
    fig.legend.label_text_font_size = "13px"
    return widgets.readable_figure(fig)


def _heat(src, key: str, title: str, n: int):
    fig = figure(width=430, height=420, sizing_mode="scale_width", max_width=560, toolbar_location=None, title=title,
                 name=f"plot:{key}",
                 x_range=Range1d(-0.5, n - 0.5), y_range=Range1d(n - 0.5, -0.5),
                 x_axis_label="layer", y_axis_label="layer")
    fig.rect("x", "y", 0.96, 0.96, source=src[key], fill_color="color", line_color=None)
    fig.text("x", "y", text="label", source=src[key], text_align="center", text_baseline="middle",
             text_font_size="19px", text_font_style="bold", text_color="text_color")
    fig.add_tools(HoverTool(tooltips=[("layers", "@y and @x"), ("value", "@value{0.0000}")]))
    for axis in (fig.xaxis, fig.yaxis):
        axis.ticker = FixedTicker(ticks=list(range(n)))
    fig.grid.visible = False
    return widgets.readable_figure(fig)


def _bars(src, labels, field: str, text: str, title: str, axis: str, end: float, chance: float | None = None,
          key: str = ""):
    fig = figure(height=300, sizing_mode="stretch_width", y_range=FactorRange(*reversed(labels)), name=f"plot:{key}",
                 x_range=Range1d(0, end), toolbar_location=None, title=title, x_axis_label=axis)
    fig.hbar(y="label", right=field, height=0.62, color=REMAINING, fill_alpha="alpha", line_alpha="alpha",
             source=src["loss"])
    fig.add_layout(LabelSet(x=field, y="label", text=text, source=src["loss"], x_offset=6, y_offset=-8,
                            text_font_size="14px"))
    if chance is not None:
        fig.add_layout(Span(location=chance, dimension="height", line_color="#dc2626", line_dash="dashed",
                            line_width=2))
    fig.ygrid.visible = False
    return widgets.readable_figure(fig)


def layout(params_cls, values: dict, data: dict):
    src = widgets.sources(data)
    baked = data["baked_label"]
    n = max(data["sources"]["heat_k"]["x"]) + 1
    labels = data["sources"]["loss"]["label"]
    bits_end = max(data["sources"]["loss"]["bits"]) * 2.3
    heat_k = _heat(src, "heat_k", "Keys (K): layer against layer", n)
    heat_v = _heat(src, "heat_v", "Values (V): layer against layer", n)
    loss = _bars(src, labels, "bits", "text", "Held-out text: bits per byte (lower is better)",
                 "bits per byte", bits_end, key="loss")
    recall = _bars(src, labels, "recall", "recall_text", "Recall: planted value bytes continued correctly",
                   "share of value bytes (dashed red line: chance, 1 in 64)", 2.5, chance=data["recall_chance"], key="recall")
    recall.xaxis.formatter = NumeralTickFormatter(format="0%")
    recall.xaxis.ticker = FixedTicker(ticks=[0, 0.25, 0.5, 0.75, 1])
    header = Div(text=f"<h2 style='margin:18px 0 4px;font-size:20px;border:0;padding:0'>Measured on the project's own trained models</h2>"
                      f"<p style='font-size:15px;color:#4b5563;margin:0'>{baked}. The bar for the chosen sharing "
                      f"factor is solid.</p>", sizing_mode="stretch_width")
    controls = widgets.controls(params_cls, values, free_choices=("kv_dtype",), per_row=4)
    return column(controls, _waterfall(src, data), widgets.plots_row(_memory(src), _paper(src)),
                  header, widgets.text("measured"), widgets.text("similarity"), widgets.plots_row(heat_k, heat_v),
                  widgets.plots_row(loss, recall), widgets.run_controls(),
                  sizing_mode="stretch_width")
