"""The static site: every page built, nothing fetched from another host, the model wheel pure."""
from __future__ import annotations

import json
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
    (folder,) = (built_site / "assets").glob(f"pyodide-{vendor.PYODIDE_VERSION}-*")
    for name in vendor.PYODIDE_FILES:
        assert (folder / name).stat().st_size > 0


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
    (wheel,) = (built_site / "assets").glob("models-*/*.whl")
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
    (wheel,) = (built_site / "assets").glob("models-*/*.whl")
    zipfile.ZipFile(wheel).extractall(tmp_path)
    out = subprocess.run([sys.executable, "-I", "-S", "-c", BLOCKER, str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")


# ---- assets: content-hashed names, precompressed copies, one `_headers` for static hosts ------------------

def test_every_asset_a_page_loads_is_named_by_its_content(built_site):
    import hashlib
    from kvx.site import assets
    html = (built_site / "eviction.html").read_text()
    config = json.loads(re.search(r'id="kvx-config">(.*?)</script>', html, re.S).group(1))
    loaded = re.findall(r'(?:src|href)="(assets/[^"]+)"', html) + [config["worker"], config["wheel"]]
    assert len(loaded) >= 5 and all((built_site / p).is_file() for p in loaded), loaded
    for rel in loaded:
        path = built_site / rel
        if path.parent.name == "assets":                          # name.<hash>.ext: the file's own hash
            assert path.name.split(".")[1] == assets.file_digest(path), rel
        else:                                                     # a folder of fixed names: the folder's hash
            assert path.parent.name.endswith("-" + assets.folder_digest(path.parent)), rel
    assert config["pyodide"].startswith("assets/pyodide-") and config["pyodide"].endswith("/")
    # The hash is of the bytes: any change to a byte gives another name.
    assert assets.file_digest(built_site / loaded[0]) != hashlib.sha256(b"").hexdigest()[:10]


def test_the_page_runtime_asks_v8_to_compile_it_whole_at_load(built_site):
    """kvx-page.js opens with V8's compile hint (Chromium 136 on), so the functions a reader's first change calls
    for the first time (onResult, the error boxes) are compiled at load, not in that change. The hint is read only
    as the script's first line: a build that put anything before it, or a file that lost it, loses the hint."""
    html = (built_site / "cache-renting.html").read_text()
    runtime = re.search(r'<script type="module" src="(assets/kvx-page\.[0-9a-f]+\.js)"', html).group(1)
    assert (built_site / runtime).read_text().split("\n", 1)[0] == "//# allFunctionsCalledOnLoad"


def test_precompressed_copies_decode_to_the_file(built_site):
    import gzip
    import brotli
    wasm = next((built_site / "assets").glob("pyodide-*/pyodide.asm.wasm"))
    for path in (wasm, built_site / "eviction.html"):
        data = path.read_bytes()
        assert gzip.decompress(path.with_name(path.name + ".gz").read_bytes()) == data
        assert brotli.decompress(path.with_name(path.name + ".br").read_bytes()) == data
    assert len(wasm.with_name(wasm.name + ".br").read_bytes()) < 0.5 * len(wasm.read_bytes())


def test_headers_file_gives_each_path_one_cache_rule(built_site):
    """Netlify and Cloudflare Pages merge every rule a path matches, so no path may get two Cache-Controls."""
    rules, path = {}, None
    for line in (built_site / "_headers").read_text().splitlines():
        if line.startswith("/"):
            path = line
        else:
            rules.setdefault(path, []).append(line.strip())
    assert rules["/assets/*"] == ["Cache-Control: public, max-age=31536000, immutable"] or \
        "Cache-Control: public, max-age=31536000, immutable" in rules["/assets/*"]
    for page in ("/eviction.html", "/eviction", "/", "/index.html"):
        assert "Cache-Control: public, max-age=60, must-revalidate" in rules[page], page
    for p, lines in rules.items():
        assert sum(x.startswith("Cache-Control") for x in lines) <= 1, p
    # /* applies to every path: it must not carry a Cache-Control of its own.
    assert not any(x.startswith("Cache-Control") for x in rules["/*"])


def test_texts_are_plain_dom_outside_bokeh(built_site):
    """The texts the model rewrites are elements of the page, not Bokeh Divs: changing one re-lays out no plot."""
    html = (built_site / "eviction.html").read_text()
    names = re.findall(r'data-kvx-text="([a-z_]+)"', html)
    assert set(names) == {"rule", "findings", "run_result", "provenance", "caption", "decode_text"}
    for name in names:
        assert f'"name":"text:{name}"' not in html, name               # not in the Bokeh document
    assert '"name":"anim:caption"' not in html
    assert '"name":"error:budget"' in html or '"name":"error:' in html   # control errors stay by their inputs
    # The baked texts are in the page before any script runs.
    eviction = REGISTRY["eviction"]
    findings = eviction.page_data(eviction.params())["texts"]["findings"]
    assert findings[:60] in html


@pytest.mark.parametrize("slug", ["eviction", "load-balancer", "mla"])
def test_the_first_screen_is_whole_before_any_script_runs(built_site, slug):
    """The baked readouts, notes and formula are written by the build, in the runtime's markup (kvx-page.js,
    renderReadouts and renderFormula), so the page does not move down when the runtime writes them again; every
    plot of fixed height that is always shown sits in a kvx-later box that holds its height, so the runtime can
    tell which plots are on the first screen before it draws any (firstScreenFirst)."""
    from markupsafe import escape                 # Jinja's own escaping, as the template writes them
    page = (built_site / f"{slug}.html").read_text()
    e = REGISTRY[slug]
    data = json.loads(json.dumps(e.page_data(e.params())))
    readouts = re.search(r'<div id="kvx-readouts"[^>]*>(.*?)</div>\s*<div id="kvx-notes"', page, re.S).group(1)
    want = "".join(f'<div class="kvx-readout"><div class="kvx-readout-label">{escape(r["label"])}</div>'
                   f'<div class="kvx-readout-value">{escape(r["value"])}</div>'
                   f'<div class="kvx-readout-detail">{escape(r["detail"])}</div></div>'
                   for r in data["readouts"])
    assert readouts and readouts == want
    formula = re.search(r'<div id="kvx-formula" class="kvx-formula">(.*?)</div>\s*(<h3>|</section>)', page, re.S).group(1)
    assert formula.count('class="kvx-formula-line"') == len(data["formula"])
    assert escape(f"= {data['formula'][-1]['result']}") in formula
    heights = [int(h) for h in re.findall(r'class="kvx-root kvx-later [^"]*" style="min-height:(\d+)px"', page)]
    assert len(heights) >= 2 and all(h >= 200 for h in heights), heights
    assert page.count('class="kvx-root') > len(heights)              # the controls are drawn at once
