"""FLOPs of a prefill, written out: the weights' matrix multiplies plus causal attention.

A forward pass over n tokens multiplies every token by every weight once: 2 FLOPs (a multiply and
an add) per parameter per token, so 2 × params × n. Attention adds the scores q·k and the weighted
sum of values: for each layer and query head, 2 × n × n × head_dim FLOPs for each, halved by the
causal mask, so 2 × layers × q_heads × head_dim × n² in all. For MLA models head_dim is the
per-head dimension of the no-RoPE part (an approximation). Standard library only.
"""
from __future__ import annotations


def dense_flops(m, tokens: float) -> float:
    """2 × params × tokens (active parameters for a mixture of experts)."""
    return 2 * (m.active_params or m.params) * tokens


def attention_flops(m, tokens: float) -> float:
    """2 × layers × q_heads × head_dim × tokens²: causal q·kᵀ and attention × V over a prompt."""
    return 2 * m.layers * m.q_heads * m.head_dim * tokens * tokens


def prefill_flops(m, tokens: float) -> float:
    return dense_flops(m, tokens) + attention_flops(m, tokens)
