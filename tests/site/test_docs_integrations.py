"""The docs integrations' output, without a browser: what the Sphinx directive and the Markdown line write,
and that a bad parameter fails the docs build with the model's own sentence."""
from __future__ import annotations

import html
import re
import subprocess
import sys
import textwrap

import pytest

from kvx.explainers.core.params import ParamError
from kvx.site.docs_integrations import explainer_html, parse_params

BASE = "https://docs.example/kvx"
markdown = pytest.importorskip("markdown")
EXT = "kvx.site.docs_integrations.markdown_ext"


def md(text: str, *extensions) -> str:
    return markdown.markdown(text, extensions=[*extensions, EXT], extension_configs={EXT: {"base_url": BASE}})


def element(out: str) -> dict:
    tag = re.search(r"<kvx-explainer ([^>]*)>", out).group(1)
    return {k: html.unescape(v) for k, v in re.findall(r'([\w-]+)="([^"]*)"', tag)}


def test_parse_params_takes_a_query_string_or_shell_words():
    assert parse_params("context=8192&model=llama-3-70b") == {"context": "8192", "model": "llama-3-70b"}
    assert parse_params('context=8192  gpu="H100 80GB"') == {"context": "8192", "gpu": "H100 80GB"}
    assert parse_params("") == {}
    with pytest.raises(ValueError, match="'8192' is not name=value"):
        parse_params("8192")


def test_element_carries_slug_params_and_base_and_a_fallback_link():
    out = explainer_html("cache-renting", {"context": "8192", "gpu_count": "2"}, BASE, step=3, title="Renting")
    assert out.count('<script src="https://docs.example/kvx/static/kvx-embed.js" defer></script>') == 1
    assert element(out) == {"slug": "cache-renting", "params": "context=8192&gpu_count=2",
                            "src-base": BASE + "/", "step": "3", "title": "Renting"}
    assert 'href="https://docs.example/kvx/cache-renting.html?context=8192&amp;gpu_count=2"' in out


def test_values_are_escaped_in_attributes():
    out = explainer_html("cache-renting", {"model": "llama-3-70b"}, 'https://x.example/"><script>')
    assert '"><script>' not in out.replace('<script src=', '')


@pytest.mark.parametrize("slug, params, message", [
    ("paging", {"requests": "0"}, "requests must be between 2 and 200 requests; got 0."),
    ("paging", {"context": "8192"}, "context is not a parameter"),
])
def test_a_bad_parameter_is_the_models_sentence(slug, params, message):
    with pytest.raises(ParamError, match=re.escape(message)):
        explainer_html(slug, params, BASE)


def test_unknown_slug_and_missing_base_are_refused():
    with pytest.raises(KeyError, match="no explainer 'pagin'"):
        explainer_html("pagin", {}, BASE)
    with pytest.raises(ValueError, match="base URL is not set"):
        explainer_html("paging", {}, "")


def test_markdown_line_becomes_the_element_not_a_paragraph_or_admonition():
    out = md("Before.\n\n!!! kvx paging requests=20 step=4\n\n!!! note\n    Still a note.\n", "admonition")
    assert element(out)["params"] == "requests=20" and element(out)["step"] == "4"
    assert "<p><div" not in out and "!!! kvx" not in out
    assert '<div class="admonition note">' in out and "<p>Before.</p>" in out


def test_markdown_line_inside_prose_is_left_alone():
    assert "<kvx-explainer" not in md("Write `!!! kvx paging` on a line of its own.")


def test_sphinx_build_fails_on_a_bad_parameter_naming_it(tmp_path):
    pytest.importorskip("sphinx")
    (tmp_path / "conf.py").write_text(f'extensions = ["kvx.site.docs_integrations.sphinx_ext"]\n'
                                      f'kvx_base_url = "{BASE}"\n')
    (tmp_path / "index.rst").write_text(textwrap.dedent("""
        T
        =

        .. kvx-explainer:: paging
           :params: requests=20

        .. kvx-explainer:: paging
           :params: requests=0
    """))
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", str(tmp_path), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert "index.rst:8: ERROR: kvx-explainer: requests must be between 2 and 200 requests; got 0." in done.stderr
    page = (tmp_path / "out" / "index.html").read_text()
    assert page.count("<kvx-explainer") == 1 and 'params="requests=20"' in page
