"""The larger fuzz of the compute server: the same checks as tests/compute/test_fuzz.py, more examples, random.

    python tests/benchmarks/fuzz_server.py [--examples 300] [--max-work 3e7] [--seed N]

Every API operation in the OpenAPI spec gets `--examples` generated requests per phase (schemathesis:
valid and invalid bodies, boundary values, other methods). Kernel requests over `--max-work` FLOP are
refused cheaply; raise it to run more real kernels (slower). A failure prints the request to reproduce it.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=300)
    ap.add_argument("--max-work", default="3e7", help="the kernel cost limit during the fuzz (FLOP-equivalents)")
    ap.add_argument("--seed", type=int, default=None, help="hypothesis seed, to repeat a run")
    a = ap.parse_args()
    env = {**os.environ, "KVX_FUZZ_EXAMPLES": str(a.examples), "KVX_FUZZ_RANDOM": "1", "KVX_FUZZ_MAX_WORK": a.max_work}
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/compute/test_fuzz.py"]
    if a.seed is not None:
        cmd += [f"--hypothesis-seed={a.seed}"]
    return subprocess.call(cmd, cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
