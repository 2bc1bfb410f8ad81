"""Sphinx: `.. kvx-explainer:: paging` puts a live, self-sizing kvx explainer into the page.

    extensions = ["kvx.site.docs_integrations.sphinx_ext"]
    kvx_base_url = "https://example.org/kvx/"      # where a built kvx site is served

    .. kvx-explainer:: cache-renting
       :params: context=8192&gpu_count=2
       :step: 3                  (optional: the animation frame to open on)
       :base: https://...        (optional: this one explainer from another kvx site)
       :title: ...               (optional: the iframe's accessible name)
"""
from __future__ import annotations

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

from kvx.compute import VERSION
from kvx.explainers.core.params import ParamError
from kvx.site.docs_integrations import explainer_html, parse_params


class KvxExplainer(SphinxDirective):
    required_arguments = 1
    has_content = False
    option_spec = {"params": directives.unchanged, "base": directives.uri, "step": directives.nonnegative_int,
                   "title": directives.unchanged}

    def run(self):
        try:
            html = explainer_html(self.arguments[0], parse_params(self.options.get("params", "")),
                                  self.options.get("base") or self.config.kvx_base_url,
                                  step=self.options.get("step"), title=self.options.get("title"))
        except (ParamError, KeyError, ValueError) as err:
            message = err.args[0] if isinstance(err, KeyError) else str(err)
            raise self.error(f"kvx-explainer: {message}") from None
        return [nodes.raw("", html, format="html")]


def setup(app):
    app.add_config_value("kvx_base_url", "", "html", types=[str])
    app.add_directive("kvx-explainer", KvxExplainer)
    return {"version": VERSION, "parallel_read_safe": True, "parallel_write_safe": True}
