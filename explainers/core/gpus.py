"""Accelerator presets: memory, memory bandwidth and dense BF16 throughput, from vendors' datasheets.

Memory is stored as the datasheet prints it, in decimal GB. HBM stacks are built in binary sizes,
so the physical capacity is often the same number in GiB (80 GiB = 85.9 GB) while the driver keeps
some back; pages that need the usable figure let the reader override it. FLOP/s are dense (the
datasheets' headline "with sparsity" figures are twice these). Standard library only.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class GpuPreset:
    slug: str
    title: str
    memory_gb: float        # decimal GB, as on the datasheet
    bandwidth_gbs: float    # memory bandwidth, GB/s
    bf16_tflops: float      # dense BF16 tensor throughput, TFLOP/s
    source: str

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9


_PRESETS = [
    GpuPreset("h100-sxm", "NVIDIA H100 SXM", 80, 3350, 989,
              "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column; BF16 1,979 TFLOPS is with sparsity)"),
    GpuPreset("h200", "NVIDIA H200 SXM", 141, 4800, 989,
              "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column)"),
    GpuPreset("b200", "NVIDIA B200", 180, 8000, 2250,
              "NVIDIA DGX B200 datasheet: 1,440 GB for 8 GPUs; 72 PFLOPS FP8 with sparsity for 8 GPUs, "
              "so 2.25 PFLOPS dense BF16 per GPU"),
    GpuPreset("a100-80gb", "NVIDIA A100 80GB SXM", 80, 2039, 312,
              "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column)"),
    GpuPreset("l40s", "NVIDIA L40S", 48, 864, 362,
              "NVIDIA L40S datasheet (BF16 362.05 TFLOPS dense, 733 with sparsity)"),
    GpuPreset("rtx-4090", "NVIDIA GeForce RTX 4090", 24, 1008, 165.2,
              "NVIDIA Ada Lovelace architecture whitepaper, Appendix A (FP16/BF16 tensor with FP32 accumulate)"),
    GpuPreset("mi300x", "AMD Instinct MI300X", 192, 5300, 1307.4,
              "AMD Instinct MI300X datasheet (BF16 1,307.4 TFLOPS dense, 2,614.9 with sparsity)"),
]

GPUS: dict[str, GpuPreset] = {g.slug: g for g in _PRESETS}
