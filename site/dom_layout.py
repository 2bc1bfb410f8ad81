"""A view's Bokeh layout as HTML: the texts the model rewrites become plain DOM, the rest Bokeh roots.

Why: when a Bokeh Div's text changes, BokehJS re-lays out the whole root it belongs to (measured on
eviction: 43 ms of a 49 ms round trip, for five changed Divs), while writing the same sentences into
plain elements costs 0.044x that. So every container (Row/Column) that holds such a text is written as
an HTML flex box; its text Divs become `<div data-kvx-text="name">` elements the runtime
(static/kvx-page.js) fills with innerHTML, its static Divs become plain HTML, and every other child
(plots, controls, containers without texts) becomes its own Bokeh root in one shared document, so
sources, ranges and callbacks still cross between them. Containers without a text stay whole, as the
view wrote them.

A plot root of a fixed height is written as a `kvx-later` box that holds its height (later_height): the runtime
draws those below the first screen only after Python is ready, or when the reader scrolls near one.

Which Divs are texts: `text:<name>` (widgets.text) and the animation caption `anim:caption`.
Controls' error messages stay Bokeh Divs beside their inputs: they change only on a bad value.
"""
from __future__ import annotations

import html

from bokeh.embed import components
from bokeh.models import Column, Div, Plot, Row

CAPTION = "anim:caption"
STRETCH = {"stretch_width", "stretch_both", "scale_width", "scale_both"}


def text_name(model) -> str | None:
    """The runtime's name for a text Div ("caption" for the animation's), None for anything else."""
    if not isinstance(model, Div) or not model.name:
        return None
    if model.name == CAPTION:
        return "caption"
    return model.name[len("text:"):] if model.name.startswith("text:") else None


def holds_text(model) -> bool:
    if text_name(model) is not None:
        return True
    return isinstance(model, (Row, Column)) and any(holds_text(c) for c in model.children)


def _style(model, extra: str = "") -> str:
    styles = dict(model.styles or {}) if isinstance(model.styles, dict) else {}
    css = "".join(f"{k}:{v};" for k, v in styles.items())
    if model.width and model.sizing_mode not in STRETCH:
        css += f"width:{model.width}px;"
    return html.escape(css + extra, quote=True)


def _flex(model) -> str:
    """How a child sits in a row: stretching children share the width, fixed ones keep theirs."""
    return "kvx-grow" if model.sizing_mode in STRETCH else "kvx-fixed"


def _html(model, roots: dict, texts: dict, top: bool = False) -> str:
    name = text_name(model)
    if name is not None:
        # The baked text is written in at build time, so the page reads right before any script runs.
        # An id (html_id) lets another element point at the text: a plot's summary (widgets.plot_summaries).
        ident = f' id="{html.escape(model.html_id)}"' if model.html_id else ""
        return (f'<div class="kvx-text {_flex(model)}"{ident} data-kvx-text="{html.escape(name)}" '
                f'style="{_style(model)}">{texts.get(name, model.text)}</div>')
    # The view's own column is always HTML, texts or not: on a phone the page puts the readouts right after
    # its first child, the controls (kvx.css, .kvx-interactive), which it cannot do inside one Bokeh root.
    if isinstance(model, (Row, Column)) and (top or holds_text(model)):
        kind = "kvx-row" if isinstance(model, Row) else "kvx-col"
        kind += "".join(f" {html.escape(c)}" for c in model.css_classes)     # e.g. kvx-plots-row: wraps
        gap = f"gap:{model.spacing}px;" if model.spacing else ""
        inner = "".join(_html(child, roots, texts) for child in model.children)
        return f'<div class="{kind} {_flex(model)}" style="{_style(model, gap)}">{inner}</div>'
    if isinstance(model, Div) and not model.name:          # a heading or fixed sentence: never changes
        return f'<div class="kvx-static {_flex(model)}" style="{_style(model)}">{model.text}</div>'
    key = f"root{len(roots)}"
    roots[key] = model
    height = later_height(model)
    if height is None:
        return f'<div class="kvx-root {_flex(model)}">\x00{key}\x00</div>'
    return (f'<div class="kvx-root kvx-later {_flex(model)}" style="min-height:{height}px">'
            f'\x00{key}\x00</div>')


def later_height(model) -> int | None:
    """A plot's height, if the page may draw it after the first screen (static/kvx-page.js, firstScreenFirst):
    its box holds the height until then, so what is below does not move and the page can tell which plots are
    on the first screen before any is drawn. Only a plot of a fixed height (its width may stretch) that the page
    always shows: one drawn two ways (tags kvx:wide and kvx:narrow) is hidden at some widths, and its box
    would leave a gap there."""
    if not isinstance(model, Plot) or not model.visible or not model.height:
        return None
    if model.sizing_mode not in (None, "fixed", "stretch_width"):
        return None
    if {"kvx:wide", "kvx:narrow"} & set(model.tags or ()):
        return None
    return int(model.height)


def embed(layout, texts: dict[str, str]) -> tuple[str, str]:
    """(script, html) for a view's layout; texts: the baked data's texts, shown before Python starts."""
    roots: dict = {}
    body = _html(layout, roots, texts, top=True)
    script, divs = components(roots)
    for key, div in divs.items():
        body = body.replace(f"\x00{key}\x00", div)
    return script, body
