"""The quantization page: bytes per decode step, the roofline, speed against context, the crossover."""
from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import DataRange1d, FactorRange, HoverTool, LabelSet, Legend, LegendItem, NumeralTickFormatter
from bokeh.plotting import figure

from kvx.site import widgets

COLORS = ["#6b7280", "#2563eb", "#d97706", "#059669"]



def layout(params_cls, values: dict, data: dict):
    src = widgets.sources(data)
    names = data["variants"]

    bytes_fig = figure(height=340, sizing_mode="stretch_width", y_range=FactorRange(*reversed(names)),
                       x_range=DataRange1d(start=0, range_padding=1.4, range_padding_units="percent"),
                       toolbar_location=None, title="Bytes one decode step reads (weights, then cache)", name="plot:bytes",
                       x_axis_label="GB per step (decimal)")
    stack = bytes_fig.hbar_stack(["weights_gb", "cache_gb"], y="variant", height=0.6, color=[COLORS[0], COLORS[1]],
                                 source=src["bytes"])
    bytes_fig.add_layout(LabelSet(x="total_gb", y="variant", text="label", source=src["bytes"], x_offset=8,
                                  y_offset=-8, text_font_size="13px"))
    # Above the bars, not over them: on a phone the bars' labels wrap and a legend inside would cover one.
    bytes_fig.add_layout(Legend(items=[LegendItem(label="weights", renderers=[stack[0]]),
                                       LegendItem(label="KV cache", renderers=[stack[1]])],
                                orientation="horizontal", location="top_left"), "above")
    bytes_fig.add_tools(HoverTool(tooltips=[("", "@variant"), ("weights", "@weights_gb{0.000} GB"),
                                            ("cache", "@cache_gb{0.000} GB"), ("step", "@ms{0.000} ms")]))

    roof = figure(height=330, sizing_mode="stretch_width", x_axis_type="log", y_axis_type="log",
                  toolbar_location=None, title="Roofline: where each variant's decode step sits", name="plot:roof",
                  x_axis_label="arithmetic intensity (FLOP per byte read)", y_axis_label="attained TFLOP/s")
    roof.line("intensity", "tflops", source=src["roofline"], line_width=3, color="#111827")
    roof.scatter("intensity", "tflops", source=src["points"], size=13, color="#dc2626", alpha=0.8)
    roof.add_tools(HoverTool(tooltips=[("", "@variant"), ("intensity", "@intensity{0.00} FLOP/B"),
                                       ("attained", "@tflops{0.0} TFLOP/s")]))

    speed = figure(height=330, sizing_mode="stretch_width", x_axis_type="log", y_axis_type="log",
                   toolbar_location=None, title="Tokens per second per user, against context", name="plot:speed",
                   x_axis_label="context per sequence (tokens, log scale)", y_axis_label="tokens/s per user (log)")
    for i, name in enumerate(names):
        speed.line("context", f"v{i}", source=src["speed"], line_width=3, color=COLORS[i], legend_label=name)
    speed.legend.location = "bottom_left"
    speed.legend.label_text_font_size = "12px"
    speed.xaxis.formatter = NumeralTickFormatter(format="0a")

    cross = figure(height=330, sizing_mode="stretch_width", x_axis_type="log", y_axis_type="log",
                   toolbar_location=None, title="Where the cache outweighs the weights", name="plot:cross",
                   x_axis_label="batch (sequences, log scale)", y_axis_label="context (tokens, log scale)")
    cross.line("batch", "context", source=src["crossover"], line_width=3, color=COLORS[1],
               legend_label="cache bytes = weight bytes")
    cross.scatter("batch", "context", source=src["here"], size=14, color="#dc2626")
    cross.add_layout(LabelSet(x="batch", y="context", text="text", source=src["here"], x_offset=12, y_offset=-18,
                              text_font_size="13px"))
    cross.legend.location = "top_right"
    cross.yaxis.formatter = NumeralTickFormatter(format="0a")

    for fig in (bytes_fig, roof, speed, cross):
        widgets.readable_figure(fig)
    controls = widgets.controls(params_cls, values, free_choices=("weight_dtype", "kv_dtype"), per_row=5)
    return column(controls, bytes_fig, widgets.run_controls(), widgets.plots_row(roof, cross), speed,
                  sizing_mode="stretch_width")
