"""Builds the compute server's native kernels ahead of time: `kvx build-kernels` (run by `make setup`).

The fused CPU kernel for MLA's absorbed decode (compute/kernels/mla_cpu.py) is a small C source specialised
for a latent and RoPE width and for this CPU. The server only loads a library built here, from a directory
only this user can write to: it never runs a compiler or any other program itself (tests/compute/
test_security.py checks that its code starts no process). Without a compiler, nothing is built and the server
runs the PyTorch kernel, with the same answers.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from kvx.compute.kernels import mla_cpu

CHECKPOINTS = Path(__file__).parents[1] / "compute" / "lm" / "checkpoints"


def checkpoint_widths() -> list[tuple[int, int]]:
    """(latent, RoPE width) of every MLA model the project ships (compute/lm/checkpoints/*.json)."""
    out = set()
    for card in sorted(CHECKPOINTS.glob("*.json")):
        cfg = json.loads(card.read_text())
        cfg = cfg.get("config", cfg)
        if cfg.get("attention") == "mla":
            out.add((int(cfg["kv_latent"]), int(cfg["rope_dim"])))
    return sorted(out)


def compile_source(cc: str, flags: list[str], out: Path) -> str | None:
    """Compile the fused MLA kernel's source with these flags into `out` (atomically); None, or why it failed."""
    src, tmp = out.with_suffix(f".{os.getpid()}.c"), out.with_suffix(f".{os.getpid()}.tmp")
    src.write_text(mla_cpu.SOURCE)
    try:
        r = subprocess.run([cc, *flags, "-o", str(tmp), str(src), "-lm", "-pthread"], capture_output=True,
                           text=True, timeout=120)
        if r.returncode == 0:
            os.replace(tmp, out)                  # atomic: a process reading the cache sees all or nothing
            return None
        return r.stderr[-500:]
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    finally:
        src.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)


def build_mla(latent: int, rope: int) -> Path:
    """The library for this shape, compiled unless it is already there; raises with the compiler's words."""
    errors = []
    for cc, flags, out in mla_cpu.plans(latent, rope):
        if out.exists():
            return out
        error = compile_source(cc, flags, out)
        if error is None:
            return out
        errors.append(error)
    raise RuntimeError(f"compiling the fused MLA kernel ({latent}, {rope}) failed: " + " | ".join(errors))


def build_all(extra: list[tuple[int, int]] = ()) -> dict[tuple[int, int], str]:
    """Every shipped MLA shape and any extra (latent, rope): shape -> the library's path, or why it failed."""
    out = {}
    for latent, rope in sorted({*checkpoint_widths(), *extra}):
        try:
            out[(latent, rope)] = str(build_mla(latent, rope))
        except RuntimeError as err:
            out[(latent, rope)] = f"not built: {err}"
    return out
