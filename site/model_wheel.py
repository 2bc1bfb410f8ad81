"""The browser's model wheel: kvx.explainers without the views, pure Python, stdlib only.

Pyodide installs it with `loadPackage(url)`. It holds each explainer's model, the shared core and
the registry, and nothing that imports bokeh, panel, torch or fastapi (a test checks this).
"""
from __future__ import annotations

from pathlib import Path

from wheel.wheelfile import WheelFile

import kvx.explainers

DIST = "kvx_models"
EXCLUDE = {"view.py"}
BAKED = "baked.json"           # kernel results that models draw (kvx.explainers.core.baked)          # views build pages in CPython; the browser never needs them


def model_files() -> list[tuple[Path, str]]:
    """(source path, path inside the wheel) for every module and baked result the browser needs."""
    root = Path(kvx.explainers.__file__).parent
    files = []
    for path in sorted([*root.rglob("*.py"), *root.rglob(BAKED)]):
        if path.name in EXCLUDE or "__pycache__" in path.parts:
            continue
        files.append((path, f"kvx/explainers/{path.relative_to(root).as_posix()}"))
    return files


def build_model_wheel(out_dir: Path, version: str, fresh: dict[str, str] | None = None) -> Path:
    """fresh: {path inside the wheel: text} written instead of the source file (the build's new bakes)."""
    fresh = fresh or {}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{DIST}-{version}-py3-none-any.whl"
    path.unlink(missing_ok=True)
    info = f"{DIST}-{version}.dist-info"
    with WheelFile(path, "w") as whl:
        for src, arcname in model_files():
            if arcname not in fresh:
                whl.write(str(src), arcname)
        for arcname, text in fresh.items():
            whl.writestr(arcname, text)
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {version}\n"
                                         "Summary: kvx explainer models (standard library only)\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: kvx\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/top_level.txt", "kvx\n")
    return path
