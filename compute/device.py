"""Which device the kernels run on: CUDA when PyTorch sees a GPU, otherwise the CPU."""
from __future__ import annotations

import functools


@functools.cache
def device_info() -> dict:
    try:
        import torch
    except ImportError:   # the kernels' extra is not installed: everything here still runs on the CPU
        return {"device": "cpu", "torch": None, "name": "CPU (PyTorch not installed)"}
    if torch.cuda.is_available():
        return {"device": "cuda", "torch": torch.__version__, "name": torch.cuda.get_device_name(0)}
    return {"device": "cpu", "torch": torch.__version__, "name": "CPU"}
