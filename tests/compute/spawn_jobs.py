"""Jobs for tests/compute/test_spawned_jobs.py, in a module of their own: a spawned job process imports its
worker function by name (it inherits nothing from the server's memory, as a forked one does)."""
from __future__ import annotations

import os
import signal
import time

MARK = "as imported"      # the test changes it in the server; a forked child would see the change, a spawned one not


def run(name: str, params: dict, progress) -> dict:
    if name == "echo":
        return {"pid": os.getpid(), "mark": MARK, **params}
    if name == "crash":                   # what the kernel's OOM killer does: SIGKILL, without a word
        os.kill(os.getpid(), signal.SIGKILL)
    if name == "hang":
        time.sleep(60)
    if name == "hungry":                  # past the address-space ceiling: fails inside the job
        return {"n": len(bytearray(params["bytes"]))}
    raise ValueError(f"no job {name!r}")
