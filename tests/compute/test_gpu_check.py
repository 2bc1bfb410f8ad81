"""`make gpu-check`'s script, dry-run on the CPU (--smoke: tiny sizes, every step), within a time bound."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def test_gpu_check_smoke_runs_every_step_and_writes_a_labelled_report(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-report.json").read_text())
    assert report["smoke"] is True and report["device"]["device"] == "cpu"
    assert list(report["steps"]) == ["tests", "endpoints", "benchmark", "memory"]
    assert all(step["ok"] for step in report["steps"].values())
    assert set(report["steps"]["endpoints"]["result"]) == {"mla", "paged", "eviction", "quantization", "cross-layer",
                                                           "cross-model", "decode"}
    bench = report["steps"]["benchmark"]["result"]
    assert bench["copy_bytes_per_s"] > 0 and bench["mla"] and bench["paged"]
    assert all(row["max_error"] <= 1e-6 for row in bench["paged"])
    md = (tmp_path / "gpu-report.md").read_text()
    assert md.startswith("# GPU check: CPU (cpu, torch ") and "| memory | ok |" in md


def test_gpu_check_refuses_to_run_without_a_gpu_unless_smoke(tmp_path):
    import pytest
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the full check would run")
    out = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "no CUDA device here" in out.stderr
    assert not (tmp_path / "gpu-report.json").exists()
