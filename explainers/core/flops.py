"""FLOPs of a prefill: kept for the names explainers import; the arithmetic lives in timing.py."""
from __future__ import annotations

from .timing import attention_flops, linear_flops as dense_flops, prefill_flops

__all__ = ["attention_flops", "dense_flops", "prefill_flops"]
