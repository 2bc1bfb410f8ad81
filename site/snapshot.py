"""The Pyodide memory snapshot a page restores instead of booting Python and importing the models.

Made at build time by Node running the vendored Pyodide (site/snapshot.mjs), so the build needs no
browser. Pyodide 314's snapshot is its WebAssembly heap plus a build id; a page whose Pyodide has another
build id (or a browser that refuses the snapshot) gets an error from loadPyodide, and the worker then
boots the normal way (static/kvx-worker.mjs). Without Node the build makes none and says so: the pages
then always boot the normal way.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).with_name("snapshot.mjs")
TIMEOUT_S = 300             # about 10 s on an idle machine, 30 s on a loaded one


def make_snapshot(pyodide_dir: Path, wheel: Path, out: Path) -> Path | None:
    """Write the snapshot to `out`; None (and a line on stdout saying why) when it cannot be made."""
    node = shutil.which("node")
    if node is None:
        print("kvx build: Node is not installed, so the site has no Python snapshot (pages boot Pyodide the "
              "normal way)")
        return None
    try:
        subprocess.run([node, str(SCRIPT), str(pyodide_dir), str(wheel), str(out)], check=True,
                       timeout=TIMEOUT_S, capture_output=True, text=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        detail = getattr(err, "stderr", "") or ""
        print(f"kvx build: the Python snapshot failed ({type(err).__name__}: {detail.strip()[-300:]}); pages will "
              f"boot Pyodide the normal way")
        out.unlink(missing_ok=True)
        return None
    return out
