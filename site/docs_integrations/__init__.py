"""Thin integrations that put a kvx explainer into other projects' docs: a Sphinx directive
(`sphinx_ext`) and a Python-Markdown / MkDocs extension (`markdown_ext`).

Both write the same two things: the embedding script (static/kvx-embed.js, served by name by every kvx
site) and a `<kvx-explainer>` element, an iframe of the explainer that takes its content's height.
The parameters are checked here, at docs-build time, with the explainer's own bounds, so a typo fails the
docs build with the model's sentence instead of showing a broken page to readers.
"""
from __future__ import annotations

import html
import shlex
from urllib.parse import urlencode

from kvx.explainers.registry import get, params_from

SCRIPT = "static/kvx-embed.js"


def _base(base_url: str) -> str:
    if not base_url:
        raise ValueError("the kvx site's base URL is not set: give the URL where a built kvx site is served "
                         "(for example https://example.org/kvx/).")
    return base_url if base_url.endswith("/") else base_url + "/"


def check_params(slug: str, params: dict[str, str]) -> dict[str, str]:
    """The explainer's parameters as given, after the model has accepted them (ParamError or KeyError if not)."""
    explainer = get(slug)
    params_from(explainer, dict(params))
    return params


def parse_params(text: str) -> dict[str, str]:
    """`context=8192&model=llama-3-70b` (a query string) or `context=8192 model=llama-3-70b` (the Markdown
    form, quoted like a shell) as a dict."""
    parts = text.split("&") if "&" in text else shlex.split(text)
    out = {}
    for part in (p.strip() for p in parts):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{part!r} is not name=value; write each parameter as name=value.")
        out[key.strip()] = value.strip()
    return out


def script_tag(base_url: str) -> str:
    return f'<script src="{html.escape(_base(base_url) + SCRIPT, quote=True)}" defer></script>'


def explainer_html(slug: str, params: dict[str, str], base_url: str, *, step: int | None = None,
                   title: str | None = None) -> str:
    """The script tag and the element; the link inside shows where scripts do not run."""
    base = _base(base_url)
    check_params(slug, params)
    query = urlencode(params)
    attrs = {"slug": slug, "params": query, "src-base": base}
    if step is not None:
        attrs["step"] = str(int(step))
    if title:
        attrs["title"] = title
    attr_text = " ".join(f'{k}="{html.escape(v, quote=True)}"' for k, v in attrs.items())
    link = html.escape(f"{base}{slug}.html" + (f"?{query}" if query else ""), quote=True)
    return (f'<div class="kvx-embed-block">{script_tag(base)}<kvx-explainer {attr_text}>'
            f'<a href="{link}">Open the kvx explainer “{html.escape(get(slug).title)}”</a></kvx-explainer></div>')
