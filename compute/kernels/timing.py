"""Time a kernel the way a benchmark should: warm up, repeat, take the median, sync the device."""
from __future__ import annotations

import statistics
import time

import torch


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def median_seconds(fn, dev: torch.device, repeats: int = 7, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    _sync(dev)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(dev: torch.device, mib: int = 256) -> float:
    """Bytes per second of a plain device copy (read + write), the ceiling a memory-bound kernel can reach."""
    src = torch.empty(mib * 2 ** 20, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), dev, repeats=5, warmup=1)
    return 2 * src.numel() / seconds
