"""The one time model every explainer uses to turn tokens into seconds. Standard library only.

Prefill is compute: FLOPs ÷ (GPUs × peak BF16 FLOP/s × MFU).
  linear    2 × active params × n         a multiply and an add per weight per token (a mixture of experts
                                           only multiplies by the experts it routes to: the *active* parameters)
  attention 2 × layers × q_heads × (d_qk + d_v) × (n·c + n²/2)
                                           q·kᵀ (2·d_qk per pair) and weights × V (2·d_v per pair), for n new
                                           tokens that each see the c cached tokens and, under the causal mask,
                                           the new tokens up to themselves: n·c + n(n+1)/2 pairs, written n·c + n²/2
                                           (the diagonal's n/2 is left out: under 1/n of the attention term).
  For MHA/GQA/MQA d_qk = d_v = head_dim, so at c = 0 attention is 2 × L × H × head_dim × n² (the closed form
  this project used before). For MLA prefill computes per head as plain attention does (DeepSeek-V2 sec. 2.1.3):
  d_qk = qk_nope + qk_rope (128 + 64), d_v = v_head_dim (128).

Decode is bytes, unless the batch is large: one step reads the weights once and every sequence's cache once.
  weights   a dense model reads all its parameters. A mixture of experts reads its always-used part (attention,
            dense layers, shared experts, embeddings: active − moe_layers × k × expert) plus, in each MoE
            layer, every routed expert that at least one of the B tokens picked: on average
            E × (1 − (1 − k/E)^B) of them (each token picks k of E; an expert is missed by one token with
            probability 1 − k/E). This assumes routing independent and uniform across experts, which is what
            load balancing aims for; real routing is correlated, so fewer distinct experts may be touched.
  cache     batch × context × cached numbers per token × bytes per number
  FLOPs     2 × active × batch + batch × context × attention FLOPs per cached token
  seconds   max(bytes ÷ (GPUs × bandwidth × efficiency), FLOPs ÷ (GPUs × peak × MFU))   (the roofline)
GPUs split the work perfectly (tensor parallelism without communication): a lower bound on time.
"""
from __future__ import annotations


def linear_flops(m, tokens: float) -> float:
    """2 × active params × tokens: every token is multiplied by every weight it uses once."""
    return 2 * (m.active_params or m.params) * tokens


def attention_pairs(new_tokens: float, cached_tokens: float = 0) -> float:
    """(query, key) pairs under the causal mask: n·c + n²/2."""
    return new_tokens * cached_tokens + new_tokens * new_tokens / 2


def attention_flops_per_pair(m) -> float:
    """FLOPs for one query against one key, all layers and heads: 2·d_qk for the score, 2·d_v for the value."""
    return 2 * m.layers * m.q_heads * (m.attention_qk_dim + m.attention_v_dim)


def attention_flops(m, new_tokens: float, cached_tokens: float = 0) -> float:
    """2 × layers × q_heads × (d_qk + d_v) × (n·c + n²/2)."""
    return attention_flops_per_pair(m) * attention_pairs(new_tokens, cached_tokens)


def prefill_flops(m, new_tokens: float, cached_tokens: float = 0) -> float:
    """Linear FLOPs of the active parameters plus causal attention over cache and the new tokens."""
    return linear_flops(m, new_tokens) + attention_flops(m, new_tokens, cached_tokens)


def flops_per_second(gpu, gpus: int = 1, mfu: float = 0.5) -> float:
    return gpus * gpu.bf16_tflops * 1e12 * mfu


def prefill_seconds(m, gpu, new_tokens: float, cached_tokens: float = 0, *, gpus: int = 1, mfu: float = 0.5) -> float:
    """prefill FLOPs ÷ (GPUs × peak BF16 FLOP/s × MFU)."""
    return prefill_flops(m, new_tokens, cached_tokens) / flops_per_second(gpu, gpus, mfu)


def prefill_formula(m, gpu, new_tokens: float, cached_tokens: float = 0, *, gpus: int = 1, mfu: float = 0.5) -> dict:
    """The prefill time as a formula row, with the current values substituted (for a page's formulas list)."""
    lin, att = linear_flops(m, new_tokens), attention_flops(m, new_tokens, cached_tokens)
    n, c = f"{new_tokens:,.0f}", f"{cached_tokens:,.0f}"
    return {
        "name": "Prefill time",
        "formula": "(2 × active params × n + 2 × layers × q_heads × (d_qk + d_v) × (n·c + n²/2)) "
                   "÷ (GPUs × peak FLOP/s × MFU)",
        "substituted": f"(2 × {(m.active_params or m.params) / 1e9:,.3g}B × {n} + 2 × {m.layers} × {m.q_heads} × "
                       f"({m.attention_qk_dim} + {m.attention_v_dim}) × ({n}·{c} + {n}²/2)) ÷ "
                       f"({gpus} × {gpu.bf16_tflops:,g} TFLOP/s × {mfu:g}); n = new tokens, c = cached",
        "result": f"{(lin + att) / 1e12:,.4g} TFLOP ({lin / 1e12:,.4g} linear + {att / 1e12:,.4g} attention) → "
                  f"{(lin + att) / flops_per_second(gpu, gpus, mfu):,.4g} s",
    }


def expected_experts_touched(experts: int, top_k: int, batch: float) -> float:
    """Distinct experts that B tokens, each picking top_k of `experts` uniformly, touch on average:
    E × (1 − (1 − k/E)^B)."""
    if experts <= 0:
        return 0.0
    return experts * (1 - (1 - top_k / experts) ** batch)


def weight_params_read(m, batch: float) -> float:
    """Parameters one decode step of `batch` tokens reads: all of a dense model; for a mixture of experts
    the always-used part plus the expected distinct routed experts in every MoE layer (at most all of them)."""
    if not m.is_moe:
        return m.params
    always = m.active_params - m.moe_layers * m.experts_per_token * m.expert_params
    routed = m.moe_layers * expected_experts_touched(m.experts, m.experts_per_token, batch) * m.expert_params
    return min(max(always + routed, m.active_params), m.params)      # clamp float rounding at B = 1


def attention_flops_per_cached_token(m) -> float:
    """FLOPs one new token spends on each cached token, all layers: scores, then the weighted sum.

    MHA/GQA/MQA: 2 × heads × head_dim for q·k plus the same for weights × V.
    MLA (absorbed, as DeepSeek decodes: attention runs in the latent space, DeepSeek-V2 sec. 2.1.3):
    2 × heads × (latent + rope) for scores plus 2 × heads × latent for the weighted latent.
    """
    if m.attention == "MLA":
        return m.layers * (2 * m.q_heads * (m.kv_latent + m.rope_dim) + 2 * m.q_heads * m.kv_latent)
    return m.layers * 4 * m.q_heads * m.head_dim


def roofline_seconds(bytes_moved: float, flops: float, gpu, *, gpus: int = 1, bandwidth_efficiency: float = 1.0,
                     mfu: float = 1.0) -> dict:
    """max(bytes ÷ (GPUs × bandwidth × efficiency), FLOPs ÷ (GPUs × peak × MFU)), and which one sets it."""
    memory_s = bytes_moved / (gpus * gpu.bandwidth_gbs * 1e9 * bandwidth_efficiency)
    compute_s = flops / flops_per_second(gpu, gpus, mfu)
    return {"memory_s": memory_s, "compute_s": compute_s, "seconds": max(memory_s, compute_s),
            "bound": "memory" if memory_s >= compute_s else "compute"}


def decode_step(m, gpu, *, batch: int, context: float, weight_bytes_per_param: float = 2,
                kv_bytes_per_element: float = 2, gpus: int = 1, bandwidth_efficiency: float = 1.0,
                mfu: float = 1.0) -> dict:
    """One decode step of `batch` sequences with `context` cached tokens each, on the roofline."""
    params_read = weight_params_read(m, batch)
    weight_bytes = params_read * weight_bytes_per_param
    kv_bytes = batch * context * m.kv_elements_per_token * kv_bytes_per_element
    active = m.active_params or m.params
    flops = 2 * active * batch + batch * context * attention_flops_per_cached_token(m)
    return {
        "weight_params_read": params_read,
        "experts_touched": expected_experts_touched(m.experts, m.experts_per_token, batch) if m.is_moe else 0.0,
        "weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "bytes": weight_bytes + kv_bytes, "flops": flops,
        **roofline_seconds(weight_bytes + kv_bytes, flops, gpu, gpus=gpus,
                           bandwidth_efficiency=bandwidth_efficiency, mfu=mfu),
    }


def decode_weights_formula(m, batch: int) -> str:
    """The weights-read formula for this model, with values: dense reads all; MoE reads the expected experts."""
    if not m.is_moe:
        return f"all {m.params / 1e9:,.4g}B parameters (dense)"
    touched = expected_experts_touched(m.experts, m.experts_per_token, batch)
    always = m.active_params - m.moe_layers * m.experts_per_token * m.expert_params
    return (f"{always / 1e9:,.4g}B always used + {m.moe_layers} MoE layers × {touched:,.1f} experts "
            f"[= {m.experts} × (1 − (1 − {m.experts_per_token}/{m.experts})^{batch:,})] × "
            f"{m.expert_params / 1e6:,.2f}M = {weight_params_read(m, batch) / 1e9:,.4g}B parameters")
