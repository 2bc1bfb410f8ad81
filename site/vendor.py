"""What the build vendors: Pyodide core from the npm registry, BokehJS from the bokeh wheel.

Pyodide is pinned and checked against the registry's integrity hash, so a build never serves a
file that differs from the published one. Nothing here is committed to git; it lands in the
build output.
"""
from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import bokeh

PYODIDE_VERSION = "314.0.7"
# `npm view pyodide@314.0.7 dist.integrity`
PYODIDE_INTEGRITY = "sha512-0YvXxEhfEdpLfb/XkM2BFAeMROq0iMUX2bzzH9pOttyMcWkwq+HbE5uyuGD82LN7y2q+SNvi/6V5JEsOlD2R1A=="
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json")
BOKEH_FILES = ("bokeh.min.js", "bokeh-widgets.min.js")


def cache_dir() -> Path:
    return Path(os.environ.get("KVX_CACHE", Path.home() / ".cache" / "kvx"))


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def pyodide_tarball() -> Path:
    """The pinned Pyodide tarball, fetched with `npm pack` once and verified every time."""
    tgz = cache_dir() / f"pyodide-{PYODIDE_VERSION}.tgz"
    if not tgz.exists():
        tgz.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "pack", f"pyodide@{PYODIDE_VERSION}", "--silent", "--pack-destination",
                        str(tgz.parent)], check=True, stdout=subprocess.DEVNULL)
    got = _integrity(tgz.read_bytes())
    if got != PYODIDE_INTEGRITY:
        raise RuntimeError(f"{tgz} does not match the pinned integrity hash: expected {PYODIDE_INTEGRITY}, got {got}. "
                           f"Delete it and build again.")
    return tgz


def vendor_pyodide(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(pyodide_tarball()) as tar:
        for name in PYODIDE_FILES:
            member = tar.extractfile(f"package/{name}")
            (out / name).write_bytes(member.read())


def vendor_bokeh(out: Path) -> list[str]:
    """Copy BokehJS from the installed wheel; returns the file names in load order."""
    out.mkdir(parents=True, exist_ok=True)
    src = Path(bokeh.__file__).parent / "server" / "static" / "js"
    names = []
    for name in BOKEH_FILES:
        versioned = name.replace(".min.js", f"-{bokeh.__version__}.min.js")
        shutil.copyfile(src / name, out / versioned)
        names.append(versioned)
    return names


AXE_VERSION = "4.14.1"
# `npm view axe-core@4.14.1 dist.integrity`
AXE_INTEGRITY = "sha512-FHfa+lmNjQZfJz1q8wKqIDwC6DExcHt/pkjNQb09a3NPjCKg2rhu5qb2S4r76ASyFNNtuFooJpZe37OgudVGtQ=="


def axe_core_js() -> Path:
    """axe-core's browser script, for the accessibility checks in the browser tests (never served by the
    site): fetched with `npm pack` once, checked against the pinned integrity hash every time."""
    tgz = cache_dir() / f"axe-core-{AXE_VERSION}.tgz"
    if not tgz.exists():
        tgz.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "pack", f"axe-core@{AXE_VERSION}", "--silent", "--pack-destination", str(tgz.parent)],
                       check=True, stdout=subprocess.DEVNULL)
    got = _integrity(tgz.read_bytes())
    if got != AXE_INTEGRITY:
        raise RuntimeError(f"{tgz} does not match the pinned integrity hash: expected {AXE_INTEGRITY}, got {got}. "
                           f"Delete it and fetch it again.")
    out = cache_dir() / f"axe-core-{AXE_VERSION}.min.js"
    if not out.exists():
        with tarfile.open(tgz) as tar:
            out.write_bytes(tar.extractfile("package/axe.min.js").read())
    return out
