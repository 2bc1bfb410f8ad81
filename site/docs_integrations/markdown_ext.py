"""Python-Markdown (and so MkDocs): a line `!!! kvx paging requests=20 seed=3` becomes a live, self-sizing
kvx explainer.

    # mkdocs.yml
    markdown_extensions:
      - kvx.site.docs_integrations.markdown_ext:
          base_url: https://example.org/kvx/     # where a built kvx site is served

    !!! kvx cache-renting context=8192 model=llama-3-70b

Parameters are name=value, quoted like a shell when a value has spaces; `step=N` opens an animation on
frame N. The line must be a paragraph of its own. It is read before the `admonition` extension (whose
`!!! note` syntax it borrows), so both can be enabled together.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as etree

from markdown import Extension
from markdown.blockprocessors import BlockProcessor

from kvx.site.docs_integrations import explainer_html, parse_params

LINE = re.compile(r"^!!! +kvx +([a-z0-9-]+)(.*)$")


class KvxBlock(BlockProcessor):
    def __init__(self, parser, base_url: str):
        super().__init__(parser)
        self.base_url = base_url

    def test(self, parent, block):
        return LINE.match(block.strip()) is not None and "\n" not in block.strip()

    def run(self, parent, blocks):
        match = LINE.match(blocks.pop(0).strip())
        params = parse_params(match.group(2))
        step = params.pop("step", None)
        html = explainer_html(match.group(1), params, self.base_url, step=None if step is None else int(step))
        # Stashed, so the HTML reaches the page as written; a block-level <div>, so it is not wrapped in <p>.
        etree.SubElement(parent, "p").text = self.parser.md.htmlStash.store(html)


class KvxExtension(Extension):
    def __init__(self, **kwargs):
        self.config = {"base_url": ["", "URL where a built kvx site is served, e.g. https://example.org/kvx/"]}
        super().__init__(**kwargs)

    def extendMarkdown(self, md):
        # admonition's processor has priority 105: ours goes first, so `!!! kvx …` is never an admonition.
        md.parser.blockprocessors.register(KvxBlock(md.parser, self.getConfig("base_url")), "kvx_explainer", 106)


def makeExtension(**kwargs):
    return KvxExtension(**kwargs)
