"""kvx: interactive explainers of the LLM KV cache.

The package's parts are its folders, mapped by setup.py: kvx.explainers (the stdlib-only models), kvx.compute
(the server, CLI and kernels) and kvx.site (the static-site builder, the docs integrations and the notebook
view). This file adds one thing, `kvx.show`, and imports nothing heavy: the browser's model wheel and the
server import kvx.explainers without Panel.
"""


def show(slug: str, **params):
    """The explainer `slug` live in a Jupyter notebook, run by the notebook's Python: `kvx.show("paging",
    requests=40)`. Parameters are the page's URL parameters; needs the `notebook` extra (Panel)."""
    from kvx.site.notebook import show as _show
    return _show(slug, **params)
