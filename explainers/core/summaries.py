"""A sentence per plot, for readers who cannot see it: what the plot shows, in the current numbers.

Each view names its plots `plot:<key>`; the model words one sentence per key from the very columns it
hands that plot (its `sources`), so a summary cannot disagree with the picture. The sentences travel as
page texts under `summary:<key>`, which the page runtime writes into a caption right under the plot and
the plot's `aria-describedby` points at (site/widgets.plot_summaries). The notebook updates the same
caption through the same texts.
"""
from __future__ import annotations

import html
import math

PREFIX = "summary:"


def text_name(plot: str) -> str:
    """The page text that holds plot `plot`'s summary."""
    return PREFIX + plot


def summaries(**by_plot: str) -> dict[str, str]:
    """Page texts for plot summaries: summaries(memory="...", curve="...") -> {"summary:memory": "..."}.

    The sentences are plain text (escaped here, since texts are written as HTML); an empty one is refused,
    because a plot must never be left without its summary."""
    out = {}
    for plot, sentence in by_plot.items():
        sentence = " ".join(str(sentence).split())
        if not sentence:
            raise ValueError(f"the summary of plot {plot} is empty")
        out[text_name(plot)] = html.escape(sentence, quote=False)
    return out


def of(texts: dict) -> dict[str, str]:
    """The plot summaries among a page's texts: {plot key: sentence as sent}."""
    return {k[len(PREFIX):]: v for k, v in texts.items() if k.startswith(PREFIX)}


# ---- wording ----------------------------------------------------------------------------------------------
def pct(share: float, digits: int = 0) -> str:
    """0.934 -> '93%' (a share as a percentage; one decimal below 1% so a small share is not '0%')."""
    value = 100 * share
    if digits == 0 and 0 < abs(value) < 1:
        return f"{value:.1f}%"
    return f"{value:,.{digits}f}%"


def num(x: float, digits: int = 0) -> str:
    """12345.6 -> '12,346'; 0.0123 with digits=0 -> '0.01' (keeps two significant figures below 1)."""
    if digits == 0 and x != 0 and abs(x) < 1:
        return f"{x:.2g}"
    return f"{x:,.{digits}f}"


def sig(x: float, figures: int = 3) -> str:
    """x to `figures` significant figures, with thousands separators and no trailing zeros:
    12345 -> '12,300', 0.01234 -> '0.0123', 60.0 -> '60', 2.50 -> '2.5'."""
    if x == 0 or x != x:
        return "0" if x == 0 else "not a number"
    digits = figures - 1 - math.floor(math.log10(abs(x)))
    if digits <= 0:
        return f"{round(x, digits):,.0f}"
    out = f"{round(x, digits):,.{digits}f}"
    return out.rstrip("0").rstrip(".") if "." in out else out


def times(ratio: float) -> str:
    """A ratio as '3.2×' (two significant figures below 10, whole numbers above)."""
    return f"{ratio:,.1f}×" if ratio < 10 else f"{ratio:,.0f}×"


def listing(items: list[str]) -> str:
    """['a', 'b', 'c'] -> 'a, b and c'."""
    items = [i for i in items if i]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]
