"""The kvx command, run as a user runs it."""
from __future__ import annotations

import json
import subprocess
import sys

from kvx.compute.cli import main


def kvx(*args):
    return subprocess.run([sys.executable, "-m", "kvx.compute.cli", *args], capture_output=True, text=True)


def test_run_json_reproduces_the_seed():
    out = kvx("run", "cache-renting", "model=llama-3-70b", "kv_dtype=fp16", "context=4000", "kv_memory_gb=450", "--json")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["kv_bytes_per_token"] == 327_680 and body["max_sessions"] == 343


def test_list_json_describes_parameters():
    out = kvx("list", "--json")
    (e,) = [e for e in json.loads(out.stdout) if e["slug"] == "cache-renting"]
    assert e["level"] == "beginner"
    for p in e["parameters"]:
        assert {"name", "default", "min", "max", "unit", "help"} <= set(p)


def test_run_prints_named_results(capsys):
    assert main(["run", "cache-renting", "context=128000"]) == 0
    out = capsys.readouterr().out
    assert "max_sessions" in out and "kv_bytes_per_token" in out


def test_bad_values_exit_2_with_a_sentence(capsys):
    assert main(["run", "cache-renting", "context=-5"]) == 2
    assert capsys.readouterr().err.strip() == "kvx: context must be between 1 and 10,000,000 tokens; got -5."
    assert main(["run", "cache-renting", "context"]) == 2
    assert "name=value" in capsys.readouterr().err
    assert main(["run", "nope"]) == 2
    assert "cache-renting" in capsys.readouterr().err
