"""The cross-model page: FLOPs and time of both handoffs against context, memory, the layer map, the real fit."""
from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import FactorRange, HoverTool, LabelSet, NumeralTickFormatter, Range1d
from bokeh.plotting import figure

from kvx.site import widgets

REPREFILL, MAP = "#dc2626", "#2563eb"



def _against_context(src, y: str, title: str, label: str, breakeven: bool, key: str):
    fig = figure(height=340, sizing_mode="stretch_width", x_axis_type="log", y_axis_type="log", toolbar_location=None,
                 name=f"plot:{key}",
                 title=title, x_axis_label="context handed over (tokens, log scale)", y_axis_label=label)
    fig.line("context", f"reprefill_{y}", source=src["curve"], line_width=3, color=REPREFILL,
             legend_label="re-prefill on the large model")
    fig.line("context", f"map_{y}", source=src["curve"], line_width=3, color=MAP, legend_label="map the small cache")
    if breakeven:
        fig.line("context", y, source=src["breakeven"], line_dash="dashed", line_width=2, color="#111827",
                 legend_label="break-even (when there is one)")
    fig.scatter("context", y, source=src["here"], size=12, color="#111827")
    fig.add_layout(LabelSet(x="context", y=y, text="text", source=src["here"], x_offset=8, y_offset="dy",
                            text_font_size="13px"))
    fig.legend.location = "top_left"
    fig.legend.label_text_font_size = "13px"
    fig.xaxis.formatter = NumeralTickFormatter(format="0a")
    return widgets.readable_figure(fig)


def layout(params_cls, values: dict, data: dict):
    src = widgets.sources(data)
    flops = _against_context(src, "flops", "FLOPs of the handoff", "FLOPs (log scale)", False, "flops")
    flops.add_tools(HoverTool(tooltips=[("tokens", "@context{0,0}"), ("re-prefill", "@reprefill_flops{0.00e0}"),
                                        ("map", "@map_flops{0.00e0}")]))
    time = _against_context(src, "ms", "Time of the handoff", "ms (log scale)", True, "time")
    time.add_tools(HoverTool(tooltips=[("tokens", "@context{0,0}"), ("re-prefill", "@reprefill_ms{0.000} ms"),
                                       ("map", "@map_ms{0.000} ms")]))

    names = data["sources"]["memory"]["what"]
    memory = figure(height=260, sizing_mode="stretch_width", x_axis_type="log", toolbar_location=None, name="plot:memory",
                    y_range=FactorRange(*reversed(names)), title="Memory: the maps next to what they serve",
                    x_axis_label="GB (decimal, log scale)")
    memory.scatter("gb", "what", source=src["memory"], size=14, color="#6b7280")
    memory.add_layout(LabelSet(x="gb", y="what", text="text", source=src["memory"], x_offset=10, y_offset=-8,
                               text_font_size="13px"))
    memory.x_range.range_padding = 0.8

    x0, x1 = data["ranges"]["layers_x"]
    y0, y1 = data["ranges"]["layers_y"]
    layers = figure(height=260, sizing_mode="stretch_width", toolbar_location=None, name="plot:layers",
                    x_range=Range1d(x0, x1, name="range:layers_x"), y_range=Range1d(y0, y1, name="range:layers_y"),
                    title="Which small-model layer each large-model layer's maps read",
                    x_axis_label="large-model layer", y_axis_label="small-model layer")
    layers.step("large", "small", source=src["layers"], mode="center", line_width=2, color=MAP)
    layers.scatter("large", "small", source=src["layers"], size=6, color=MAP)
    layers.add_tools(HoverTool(tooltips=[("large layer", "@large"), ("reads small layer", "@small")]))
    for fig in (memory, layers):
        widgets.readable_figure(fig)

    controls = widgets.controls(params_cls, values, free_choices=("map_dtype",), per_row=5)
    return column(controls, widgets.plots_row(flops, time),
                  widgets.plots_row(memory, layers), widgets.run_controls(),
                  sizing_mode="stretch_width")
