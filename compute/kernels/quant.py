"""KV cache quantization: symmetric integer codes with per-token or per-channel scales, and fp8.

A cache tensor is [..., tokens, channels]. Per-token scales share one scale across a token's
channels; per-channel scales share one across all tokens of a channel (KIVI quantizes keys per
channel and values per token, because keys have outlier channels).
"""
from __future__ import annotations

import torch

SCHEMES = ("int8-token", "int8-channel", "int4-token", "int4-channel", "fp8")


def quantize_dequantize(x: torch.Tensor, scheme: str) -> torch.Tensor:
    """What the cache holds after a round trip through the scheme, in x's dtype."""
    if scheme == "fp8":
        return x.to(torch.float8_e4m3fn).to(x.dtype)
    kind, axis = scheme.split("-")
    levels = {"int8": 127, "int4": 7}[kind]
    dim = -1 if axis == "token" else -2
    scale = x.abs().amax(dim=dim, keepdim=True).clamp_min(1e-8) / levels
    return (x / scale).round().clamp(-levels, levels) * scale


def bits_per_number(scheme: str, tokens: int, channels: int, scale_bits: int = 16) -> float:
    """Average stored bits per number, scales included."""
    if scheme == "fp8":
        return 8.0
    kind, axis = scheme.split("-")
    bits = {"int8": 8, "int4": 4}[kind]
    scales = tokens if axis == "token" else channels
    return bits + scale_bits * scales / (tokens * channels)


def relative_error(x: torch.Tensor, scheme: str) -> float:
    """||x - Q(x)|| / ||x||."""
    return ((x - quantize_dequantize(x, scheme)).norm() / x.norm()).item()
