"""The MLA page: a step-through of one decode step's shapes, bytes per token four ways and across presets,
the paper's 93.3% accounting, and the modelled attention time of naive and absorbed decode."""
from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import (Arrow, DataRange1d, FactorRange, HoverTool, LabelSet, NumeralTickFormatter, Range1d,
                          VeeHead)
from bokeh.plotting import figure
from bokeh.transform import factor_cmap

from kvx.explainers.core.models import ATTENTION_KINDS
from kvx.explainers.mla.model import FORM_TITLES, FORMS, N_RAIL, N_TITLE, N_WIDTH
from kvx.site import widgets

KIND_COLORS = ["#6b7280", "#d97706", "#0891b2", "#059669"]          # MHA, GQA, MQA, MLA
FORM_COLORS = {"naive": "#dc2626", "materialized": "#6b7280", "absorbed": "#7c3aed"}


def _stages(fig, bands, boxes, band_baseline: str) -> None:
    """The stages' headings and the tensors as boxes, each with its shape and name above it, on a bare plot:
    the same in both diagrams."""
    fig.grid.visible = False
    fig.outline_line_color = None
    fig.text(x="x", y="y", text="text", source=bands, text_font_size="16px", text_font_style="bold",
             text_color="#111827", text_baseline=band_baseline)
    fig.quad(left="x0", right="x1", bottom="y0", top="y1", source=boxes, fill_color="color",
             fill_alpha="alpha", line_color="line_color", line_width="line_width")
    fig.text(x="label_x", y="label_y", text="shape", source=boxes, text_font_size="14px",
             text_alpha="text_alpha", text_baseline="bottom", y_offset=-2, text_color="#374151")
    fig.text(x="label_x", y="label_y", text="name", source=boxes, text_font_size="15px",
             text_font_style="bold", text_alpha="text_alpha", text_baseline="bottom", y_offset=-19,
             text_color="#111827")


def _diagram(src, x_range):
    fig = figure(height=660, sizing_mode="stretch_width", x_range=Range1d(*x_range, name="range:diagram_x"),
                 y_range=Range1d(-122, 19), name="plot:diagram", toolbar_location=None, x_axis_location=None,
                 y_axis_location=None, min_border_left=10,
                 title="One decode step of one MLA layer (box sides ∝ √ of each dimension; S = cached tokens)")
    _stages(fig, src["bands"], src["boxes"], "bottom")
    fig.add_layout(Arrow(source=src["arrows"], x_start="x0", y_start="y0", x_end="x1", y_end="y1",
                         line_width=2, line_alpha="alpha", line_color="#374151",
                         end=VeeHead(size=10, line_color="#374151", line_alpha=0.9)))
    fig.add_tools(HoverTool(tooltips=[("", "@name"), ("shape", "@shape")]))
    fig.tags = ["kvx:wide"]             # the page shows _narrow_diagram instead on a phone
    return widgets.readable_figure(fig)


def _narrow_diagram(src, y_range):
    """The same diagram for a phone, in rows a 300 px plot holds, each box's name and shape above it
    (model.narrow_boxes; its units are pixels, so the plot is as tall as its y range). The page shows it
    instead of the wide one up to 560 px (tags, static/kvx-page.js)."""
    fig = figure(height=round(y_range[1] - y_range[0]) + 34, sizing_mode="stretch_width", toolbar_location=None,
                 x_range=Range1d(N_RAIL - 4, N_WIDTH + 4), y_range=Range1d(*y_range, name="range:diagram_narrow_y"),
                 x_axis_location=None, y_axis_location=None, min_border_left=4, min_border_right=4,
                 min_border_bottom=0, title=N_TITLE, tags=["kvx:narrow"], visible=False,
                 name="plot:diagram_narrow")
    _stages(fig, src["bands_narrow"], src["boxes_narrow"], "top")
    fig.multi_line(xs="xs", ys="ys", source=src["rails_narrow"], line_width=2, line_alpha="alpha", line_color="#374151")
    fig.add_layout(Arrow(source=src["arrows_narrow"], x_start="x0", y_start="y0", x_end="x1", y_end="y1",
                         line_width=2, line_alpha="alpha", line_color="#374151",
                         end=VeeHead(size=8, line_color="#374151", line_alpha=0.9)))
    fig.add_tools(HoverTool(tooltips=[("", "@name"), ("shape", "@shape")]))
    return widgets.readable_figure(fig)


def layout(params_cls, values: dict, data: dict):
    src = widgets.sources(data)
    diagram = _diagram(src, data["ranges"]["diagram_x"])
    narrow = _narrow_diagram(src, data["ranges"]["diagram_narrow_y"])
    costs = widgets.text("step_costs", mono=True)
    costs.styles = {**costs.styles, "white-space": "pre-line", "font-size": "16px", "background": "#f3f4f6",
                    "padding": "8px 12px", "border-radius": "6px"}

    kinds = figure(height=300, sizing_mode="stretch_width", y_range=FactorRange(*reversed(ATTENTION_KINDS)), name="plot:kinds",
                   x_range=DataRange1d(start=0, range_padding=1.4, range_padding_units="percent"),
                   toolbar_location=None, title="Bytes per token, this model's shape four ways",
                   x_axis_label="KB per token (decimal), all layers")
    kinds.hbar(y="kind", right="kb", height=0.6, source=src["kinds"],
               color=factor_cmap("kind", KIND_COLORS, list(ATTENTION_KINDS)))
    kinds.add_layout(LabelSet(x="kb", y="kind", text="text", source=src["kinds"], x_offset=8, y_offset=-8,
                              text_font_size="14px"))

    names = data["sources"]["accounting"]["what"]
    account = figure(height=300, sizing_mode="stretch_width", y_range=FactorRange(*reversed(names)), name="plot:account",
                     x_range=DataRange1d(start=0, range_padding=0.8, range_padding_units="percent"),
                     toolbar_location=None, title="The paper's 93.3%: DeepSeek-V2 against DeepSeek 67B",
                     x_axis_label="KB per token (decimal), all layers")
    account.hbar(y="what", right="kb", height=0.6, source=src["accounting"],
                 color=factor_cmap("what", ["#6b7280", "#059669", "#047857", "#7c3aed"], names))
    account.add_layout(LabelSet(x="kb", y="what", text="text", source=src["accounting"], x_offset=8, y_offset=-8,
                                text_font_size="14px"))

    presets = data["sources"]["presets"]["model"]
    every = figure(height=470, sizing_mode="stretch_width", y_range=FactorRange(*presets), name="plot:every",
                   x_range=DataRange1d(start=0, range_padding=0.45, range_padding_units="percent"),
                   toolbar_location=None, title="Every model preset's own cache per token, at the chosen dtype",
                   x_axis_label="KB per token (decimal), all layers")
    every.hbar(y="model", right="kb", height=0.65, source=src["presets"],
               color=factor_cmap("kind", KIND_COLORS, list(ATTENTION_KINDS)), legend_field="kind")
    every.add_layout(LabelSet(x="kb", y="model", text="text", source=src["presets"], x_offset=8, y_offset=-8,
                              text_font_size="13px"))
    every.legend.location = "bottom_right"

    decode = figure(height=360, sizing_mode="stretch_width", x_axis_type="log", y_axis_type="log", name="plot:decode",
                    toolbar_location=None, title="Attention time per decode step, all layers (roofline model)",
                    x_axis_label="cached tokens (log scale)", y_axis_label="ms per decode step (log)")
    for form in FORMS:
        decode.line("context", form, source=src["decode"], line_width=3, color=FORM_COLORS[form],
                    legend_label=FORM_TITLES[form])
    decode.scatter("context", "ms", source=src["here"], size=12, color="#111827")
    decode.add_layout(LabelSet(x="context", y="ms", text="text", source=src["here"], x_offset=10, y_offset=-6,
                               text_font_size="13px"))
    decode.legend.location = "top_left"
    decode.legend.label_text_font_size = "13px"
    decode.xaxis.formatter = NumeralTickFormatter(format="0a")
    for fig in (kinds, account, every, decode):
        widgets.readable_figure(fig)
    every.yaxis.major_label_text_font_size = "13px"

    controls = widgets.controls(params_cls, values, free_choices=("kv_dtype",), per_row=4)
    # The bar charts sit in their own column, so that their long category labels do not push the diagram's
    # frame (which Bokeh aligns with its siblings') to the right.
    charts = column(kinds, account, every, sizing_mode="stretch_width")
    return column(controls, widgets.animation_controls(data["animation"]["frames"]), diagram, narrow, costs, charts,
                  widgets.run_controls(), decode, sizing_mode="stretch_width")
