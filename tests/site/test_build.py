"""The static site: every page built, nothing fetched from another host, the model wheel pure."""
from __future__ import annotations

import re
import subprocess
import sys
import zipfile

import pytest

from kvx.explainers.registry import REGISTRY
from kvx.site import vendor
from kvx.site.build import glossary_terms, sections

REQUIRED_TERMS = {"kv-cache", "pagedattention", "block-table", "preemption", "prefix-caching", "radixattention",
                  "cache-eviction", "kv-cache-offloading", "kv-cache-quantization", "cross-layer-kv-sharing",
                  "cross-model-kv-cache-transfer"}


def test_pages_exist(built_site):
    names = {p.name for p in built_site.glob("*.html")}
    assert {"index.html", "glossary.html"} | {f"{slug}.html" for slug in REGISTRY} == names


def test_no_page_refers_to_another_host(built_site):
    for page in built_site.glob("*.html"):
        html = page.read_text()
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), page.name
        assert "cdn." not in html.lower(), page.name


def test_vendored_pyodide_matches_the_pinned_hash(built_site):
    assert vendor._integrity(vendor.pyodide_tarball().read_bytes()) == vendor.PYODIDE_INTEGRITY
    for name in vendor.PYODIDE_FILES:
        assert (built_site / "vendor" / "pyodide" / name).stat().st_size > 0


def test_index_is_a_reading_path(built_site):
    html = (built_site / "index.html").read_text()
    for level in ("Beginner", "Intermediate", "Advanced"):
        assert f"<h2>{level}</h2>" in html
    for slug, e in REGISTRY.items():
        assert f'href="{slug}.html"' in html and e.title in html


def test_glossary_defines_every_term_and_links_back(built_site):
    terms = {t.id: t for t in glossary_terms()}
    assert REQUIRED_TERMS <= set(terms)
    html = (built_site / "glossary.html").read_text()
    for e in REGISTRY.values():
        page = (built_site / f"{e.slug}.html").read_text()
        for term in e.glossary:
            assert term in terms, f"{e.slug} names an undefined term {term}"
            assert f'href="glossary.html#{term}"' in page
        assert f'href="{e.slug}.html"' in html


@pytest.mark.parametrize("slug", sorted(REGISTRY))
def test_explainer_page_order(built_site, slug):
    """Claim, then the interactive part, try this, the formula, what is left out, sources."""
    html = (built_site / f"{slug}.html").read_text()
    marks = ['class="kvx-claim', 'class="kvx-interactive"', 'id="try-this"', 'id="formula"', 'id="leaves-out"',
             'id="sources"']
    positions = [html.index(m) for m in marks]
    assert positions == sorted(positions)


def test_sections_split_at_headings():
    got = sections("## Try this\nA *b*\n## Sources\n- c\n")
    assert got == {"try this": "<p>A <em>b</em></p>", "sources": "<ul>\n<li>c</li>\n</ul>"}


def test_model_wheel_holds_models_but_no_views(built_site):
    (wheel,) = (built_site / "wheels").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "kvx/explainers/registry.py" in names and "kvx/explainers/cache_renting/model.py" in names
    assert not [n for n in names if n.endswith("view.py")]


BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"bokeh", "panel", "torch", "fastapi", "numpy", "pydantic"}:
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
sys.path.insert(0, sys.argv[1])
import json
import kvx.explainers
from kvx.explainers.registry import REGISTRY, page_json
assert kvx.explainers.__path__[0].startswith(sys.argv[1]), kvx.explainers.__path__
for slug in REGISTRY:
    assert json.loads(page_json(slug, "{}"))["ok"], slug
print("ok", len(REGISTRY))
"""


def test_model_wheel_imports_alone_with_heavy_packages_blocked(built_site, tmp_path):
    (wheel,) = (built_site / "wheels").glob("*.whl")
    zipfile.ZipFile(wheel).extractall(tmp_path)
    out = subprocess.run([sys.executable, "-I", "-S", "-c", BLOCKER, str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")
