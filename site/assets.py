"""Content-hashed asset names, precompressed copies and the `_headers` file of a built site.

Every file a page loads (Pyodide, BokehJS, the model wheel, the page runtime, its worker and styles)
lives under `assets/` with a hash of its content in its name, so it can be cached for a year as
immutable: a new build that changes a byte gives it a new name. Pyodide fetches its own files by fixed
names from one folder, so its folder carries the hash; single files carry it before their extension.
Pages and everything else keep their names and are cached briefly (compute/static_files.py serves
both rules; `_headers` states them for Netlify and Cloudflare Pages).

Compressible files get `.gz` (always) and `.br` (when the `brotli` package is installed) copies
beside them, chosen by Accept-Encoding when served; `.wasm` keeps its type under either.
"""
from __future__ import annotations

import gzip
import hashlib
import shutil
from pathlib import Path

try:
    import brotli
except ImportError:          # gzip alone still serves every browser; the build says which it made
    brotli = None

ASSETS = "assets"
IMMUTABLE = "public, max-age=31536000, immutable"
SHORT = "public, max-age=60, must-revalidate"
COMPRESS = {".html", ".js", ".mjs", ".css", ".json", ".wasm", ".zip", ".whl", ".svg", ".txt", ".bin", ".snapshot"}
BIG = 4 << 20
MIN_BYTES = 1024             # smaller files gain nothing worth a second request header


def file_digest(path: Path, length: int = 10) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:length]


def folder_digest(folder: Path, length: int = 10) -> str:
    """Its files' names and bytes (precompressed copies left out: they follow from the files)."""
    h = hashlib.sha256()
    for p in sorted(folder.iterdir()):
        if p.suffix not in {".gz", ".br"}:
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:length]


def hashed_file(src: Path, out: Path) -> str:
    """Copy src into out/assets as name.<hash>.ext; returns the site-relative path."""
    stem, dot, ext = src.name.partition(".")
    name = f"{stem}.{file_digest(src)}{dot}{ext}"
    (out / ASSETS).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, out / ASSETS / name)
    return f"{ASSETS}/{name}"


def hashed_dir(src: Path, out: Path, label: str) -> str:
    """Move folder src to out/assets/<label>-<hash>/ (its files keep their names); returns that path."""
    rel = f"{ASSETS}/{label}-{folder_digest(src)}"
    (out / ASSETS).mkdir(parents=True, exist_ok=True)
    shutil.move(str(src), out / rel)
    return rel


def precompress(site: Path) -> dict[str, int]:
    """.gz (level 9) and .br (quality 11) copies of every compressible file; returns {encoding: files}."""
    made = {"gzip": 0, "br": 0}
    for path in sorted(site.rglob("*")):
        if not path.is_file() or path.suffix in {".gz", ".br"} or path.suffix not in COMPRESS:
            continue
        data = path.read_bytes()
        if len(data) < MIN_BYTES:
            continue
        packed = gzip.compress(data, compresslevel=9, mtime=0)
        if len(packed) < len(data):
            path.with_name(path.name + ".gz").write_bytes(packed)
            made["gzip"] += 1
        if brotli is not None:
            # Quality 11 is ~1 MB/s: worth it for what changes with each build, too slow for the 10-30 MB
            # Pyodide heap and snapshot (quality 9 is within a few percent of it on them).
            packed = brotli.compress(data, quality=11 if len(data) < BIG else 9)
            if len(packed) < len(data):
                path.with_name(path.name + ".br").write_bytes(packed)
                made["br"] += 1
    return made


def cache_rules(site: Path) -> str:
    """The caching half of `_headers`. Hosts merge every rule a path matches (two Cache-Control values
    would be joined), so each path is named by exactly one rule: the pages one by one, then folders."""
    lines = []
    for page in sorted(site.rglob("*.html")):
        rel = "/" + page.relative_to(site).as_posix()
        for path in [rel, rel.removesuffix(".html")] + (["/"] if rel == "/index.html" else []):
            lines += [path, f"  Cache-Control: {SHORT}"]
    for folder in sorted(p.name for p in site.iterdir() if p.is_dir()):
        lines += [f"/{folder}/*", f"  Cache-Control: {IMMUTABLE if folder == ASSETS else SHORT}"]
    return "\n".join(lines) + "\n"
