"""Link presets: how fast bytes cross from one GPU (or host) to another, each way, with sources.

Network links are sold in gigabits per second (Gb/s) and GPU links in gigabytes per second (GB/s),
and GPU vendors print the sum of both directions. Every preset here stores the rate **one way**
in Gb/s and says what the datasheet prints, so 8 bits = 1 byte is the only conversion:
400 Gb/s = 50 GB/s. All these links are full duplex: sending does not slow receiving.
Standard library only.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LinkPreset:
    slug: str
    title: str
    gbit_each_way: float      # Gb/s (bits, decimal) in one direction
    printed_as: str           # what the datasheet or standard prints, and how that maps to one way
    source: str

    @property
    def bytes_per_s(self) -> float:
        """Bytes per second in one direction."""
        return self.gbit_each_way * 1e9 / 8

    @property
    def gbyte_each_way(self) -> float:
        return self.gbit_each_way / 8

    def label(self) -> str:
        """'InfiniBand NDR: 400 Gb/s = 50 GB/s each way'."""
        return f"{self.title}: {self.gbit_each_way:,g} Gb/s = {self.gbyte_each_way:,g} GB/s each way"


_PRESETS = [
    LinkPreset("nvlink-4", "NVLink 4 (H100 SXM)", 3600,
               "900 GB/s total = 450 GB/s each way (18 links × 50 GB/s bidirectional)",
               "NVIDIA H100 Tensor Core GPU datasheet (SXM: NVLink 900 GB/s, the sum of both directions); "
               "NCCL issue #1264 measures about 380 GB/s one way with p2pBandwidthLatencyTest"),
    LinkPreset("nvlink-3", "NVLink 3 (A100 SXM)", 2400,
               "600 GB/s total = 300 GB/s each way (12 links × 50 GB/s bidirectional)",
               "NVIDIA A100 Tensor Core GPU datasheet (SXM: NVLink 600 GB/s, the sum of both directions); "
               "DistServe (OSDI 2024) sec. 3.3 quotes the 600 GB/s"),
    LinkPreset("ib-ndr-400g", "InfiniBand NDR 400G", 400,
               "400 Gb/s per port, each way (4 lanes × 100G PAM4)",
               "NVIDIA ConnectX-7 and Quantum-2 NDR documentation (400 Gb/s ports of 4 × 100G-PAM4 lanes); "
               "Splitwise's H100 machines: 400 Gbps (sec. 5.1), per GPU pair (sec. 2.6)"),
    LinkPreset("ib-hdr-200g", "InfiniBand HDR 200G", 200,
               "200 Gb/s per port, each way",
               "InfiniBand HDR (200 Gb/s); the bandwidth of Splitwise's A100 machines (sec. 6.1: 200 vs 400 Gbps)"),
    LinkPreset("roce-200g", "RoCE 200G (200 GbE)", 200,
               "200 Gb/s Ethernet, each way",
               "IEEE 802.3bs (200 Gb/s Ethernet); RoCE v2 runs RDMA over it (InfiniBand Trade Association, "
               "RoCEv2 annex, 2014)"),
    LinkPreset("roce-100g", "RoCE 100G (100 GbE)", 100,
               "100 Gb/s Ethernet, each way",
               "IEEE 802.3ba (100 Gb/s Ethernet); RoCE v2 as above"),
    LinkPreset("eth-25g", "Ethernet 25G", 25,
               "25 Gb/s Ethernet, each way",
               "IEEE 802.3by (25 Gb/s Ethernet); DistServe's testbed had 25 Gbps between nodes (sec. 6.1)"),
    LinkPreset("pcie-5-x16", "PCIe 5.0 x16", 504,
               "32 GT/s × 16 lanes × 128/130 encoding = 504 Gb/s = 63 GB/s each way",
               "PCI-SIG PCI Express Base Specification 5.0 (32 GT/s per lane, 128b/130b encoding)"),
]

LINKS: dict[str, LinkPreset] = {link.slug: link for link in _PRESETS}
