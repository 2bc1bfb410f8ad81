"""The browser's model wheel: kvx.explainers without the views, pure Python, stdlib only.

Pyodide installs it with `loadPackage(url)`. It holds each explainer's model, the shared core and
the registry, and nothing that imports bokeh, panel, torch or fastapi (a test checks this).
"""
from __future__ import annotations

from pathlib import Path

from wheel.wheelfile import WheelFile

import kvx.explainers

DIST = "kvx_models"
EXCLUDE = {"view.py"}          # views build pages in CPython; the browser never needs them


def model_files() -> list[tuple[Path, str]]:
    """(source path, path inside the wheel) for every module the browser needs."""
    root = Path(kvx.explainers.__file__).parent
    files = []
    for path in sorted(root.rglob("*.py")):
        if path.name in EXCLUDE or "__pycache__" in path.parts:
            continue
        files.append((path, f"kvx/explainers/{path.relative_to(root).as_posix()}"))
    return files


def build_model_wheel(out_dir: Path, version: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{DIST}-{version}-py3-none-any.whl"
    path.unlink(missing_ok=True)
    info = f"{DIST}-{version}.dist-info"
    with WheelFile(path, "w") as whl:
        for src, arcname in model_files():
            whl.write(str(src), arcname)
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {version}\n"
                                         "Summary: kvx explainer models (standard library only)\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: kvx\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/top_level.txt", "kvx\n")
    return path
