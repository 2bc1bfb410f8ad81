"""Time a kernel the way a benchmark should: warm up, repeat, take the median.

On CUDA, each repeat is bracketed by two CUDA events recorded on the stream, and the host waits once,
after the last repeat, so launch overhead and host syncs stay out of the timed region (wall clock around
a microsecond kernel mostly measures the launch). An optional flush writes a buffer twice the size of the
last-level cache between repeats (outside the timed region), so a cache that fits in L2 is read from
memory each time, as in a real decode step where other layers' data has evicted it.

On the CPU with one thread the clock is the thread's CPU time (see `timer_for`). The timer is a small object (`mark`, `elapsed`, `sync`) so the loop's structure is tested on the CPU with
a fake clock, which is all the CUDA path adds.
"""
from __future__ import annotations

import statistics
import time

import torch


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class WallTimer:
    """CPU: marks are readings of a monotonic clock; nothing runs asynchronously, so sync does nothing."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock

    def mark(self):
        return self.clock()

    def elapsed(self, start, end) -> float:
        return end - start

    def sync(self) -> None:
        pass


class CudaEventTimer:
    """CUDA: marks are events recorded on the current stream; read them only after `sync`."""

    def __init__(self, dev: torch.device):
        self.dev = dev

    def mark(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3          # elapsed_time is in milliseconds

    def sync(self) -> None:
        torch.cuda.synchronize(self.dev)


def timer_for(dev: torch.device):
    """CUDA events on a GPU. On the CPU, with one PyTorch thread, the thread's own CPU time: the kernel's
    work, which other processes and the server's lower priority for jobs cannot stretch (wall time there
    was up to 10x the benchmark's on a busy machine); with more threads, the wall clock."""
    if dev.type == "cuda":
        return CudaEventTimer(dev)
    return WallTimer(time.thread_time if torch.get_num_threads() == 1 else time.perf_counter)


def clock_name(dev: torch.device) -> str:
    """Which clock `timer_for` uses here, for the reader."""
    if dev.type == "cuda":
        return "CUDA events"
    return "thread CPU time" if torch.get_num_threads() == 1 else "wall clock"


def cache_flusher(dev: torch.device, nbytes: int | None = None):
    """A function that overwrites twice the device's last-level cache (L2 on CUDA; 64 MiB on the CPU)."""
    if nbytes is None:
        nbytes = 2 * torch.cuda.get_device_properties(dev).L2_cache_size if dev.type == "cuda" else 64 * 2 ** 20
    buf = torch.empty(max(1, nbytes // 4), dtype=torch.float32, device=dev)
    return buf.zero_


def median_seconds(fn, dev: torch.device, repeats: int = 7, warmup: int = 2, flush=None, timer=None) -> float:
    """Median seconds of `fn()` over `repeats` runs after `warmup` untimed ones.

    flush: None, or a function run before each repeat outside the timed region (see `cache_flusher`).
    timer: defaults to CUDA events on a CUDA device, else the wall clock.
    """
    timer = timer or timer_for(dev)
    for _ in range(warmup):
        fn()
    timer.sync()
    marks = []
    for _ in range(repeats):
        if flush is not None:
            flush()
        start = timer.mark()
        fn()
        marks.append((start, timer.mark()))
    timer.sync()                                       # the only wait: after every repeat has been queued
    return statistics.median(timer.elapsed(a, b) for a, b in marks)


def copy_bandwidth(dev: torch.device, mib: int = 256, repeats: int = 5) -> float:
    """Bytes per second of a plain device copy (read + write), the ceiling a memory-bound kernel can reach.

    At 256 MiB the copy runs from DRAM (HBM on a GPU); a copy as small as a kernel's cache runs from the
    last-level cache instead, which is the ceiling for a cache that fits there (pass `mib` to measure it).
    """
    n = max(1, int(mib * 2 ** 20))
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), dev, repeats=repeats, warmup=1)
    return 2 * src.numel() / seconds
