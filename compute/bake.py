"""`kvx bake`: run the real kernels for the pages that draw their results, and store what they return.

Each baker is a function () -> dict of plain JSON values, registered in BAKERS by explainer slug. It
runs on the project's trained checkpoints, single-threaded so that a re-run on the same machine gives
the same numbers. The result carries its provenance (device, torch, checkpoints and when) so the page
can label it. The site build calls every baker again; `kvx bake` refreshes the committed copies.
"""
from __future__ import annotations

import datetime
import importlib
import json
from pathlib import Path
from typing import Callable

import torch

from kvx.compute.kernel_specs import describe_device
from kvx.explainers.core import baked

BAKERS: dict[str, str] = {
    # slug: "module:function" under kvx.compute.bakers, imported only when baked
    "cross-layer": "crosslayer:bake",
    "eviction": "eviction:bake",
}


def baker(slug: str) -> Callable[[], dict]:
    module, _, name = BAKERS[slug].partition(":")
    return getattr(importlib.import_module(f"kvx.compute.bakers.{module}"), name)


def bake(slug: str) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            result = baker(slug)()
    finally:
        torch.set_num_threads(threads)
    dev = describe_device()
    result["provenance"] = {**result.get("provenance", {}), "device": dev["device_name"], "device_type": dev["device"],
                            "torch": torch.__version__, "baked_on": datetime.date.today().isoformat(),
                            "command": f"kvx bake {slug}"}
    return json.loads(json.dumps(result))        # plain JSON values only, exactly what the page gets


def committed_path(slug: str) -> Path:
    return Path(importlib.import_module(f"kvx.explainers.{baked.package(slug)}").__file__).parent / baked.FILE


def write(slug: str) -> Path:
    path = committed_path(slug)
    path.write_text(json.dumps(bake(slug), indent=1, sort_keys=True) + "\n")
    return path
