"""MLA decode three ways, on a trained (or any) MLAAttention layer.

naive:        rebuild every head's K and V from the cached latent at every step, then attend as
              multi-head attention. Reads the small cache, but redoes the up-projection each step.
materialized: the plain-MHA baseline: per-head K and V were built once and cached, so a step only
              attends, but the cache is H x (2 head_dim + rope_dim) numbers per token.
absorbed:     fold W_uk into the query and W_uv into the output, and attend over the latent itself
              (plus the shared RoPE key), so per-head keys and values are never built (DeepSeek-V2,
              sec. 2.1.2). Reads the small cache and does more FLOPs per cached token than MHA.
              float32 on the CPU runs one fused pass over the cache (mla_cpu.py, a small C kernel: scores,
              online softmax and the weighted sum per chunk of 64 tokens); everything else runs
              `absorbed_matmul`, the same algorithm in PyTorch ops, which is also what runs on CUDA.
naive and absorbed read the same cache: per token, kv_latent + rope_dim numbers per layer.
"""
from __future__ import annotations

import math

import torch

from kvx.compute.kernels import mla_cpu
from kvx.compute.lm.model import MLAAttention, rope_tables


def decode_inputs(layer: MLAAttention, batch: int, context: int, generator: torch.Generator, dtype=torch.float32):
    """A cache of `context` tokens and one new token's hidden state, as a real decode step has."""
    c = layer.c
    dev = layer.wq.weight.device
    x_ctx = torch.randn(batch, context, c.d_model, generator=generator).to(dev, dtype)
    x_new = torch.randn(batch, 1, c.d_model, generator=generator).to(dev, dtype)
    cos, sin = rope_tables(context + 1, c.rope_dim, c.rope_base, device=dev)
    with torch.no_grad():
        cache = layer.kv(x_ctx, cos[:context].to(dtype), sin[:context].to(dtype))
        q_nope, q_rope = layer.split_query(x_new, cos[context:].to(dtype), sin[context:].to(dtype))
    return {"latent": cache["latent"], "k_rope": cache["k_rope"], "q_nope": q_nope, "q_rope": q_rope}


def _heads(weight: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """A [n_heads*head_dim, kv_latent] up-projection as [n_heads, head_dim, kv_latent]."""
    return weight.view(n_heads, head_dim, -1)


@torch.no_grad()
def naive(layer: MLAAttention, inp: dict) -> torch.Tensor:
    c = layer.c
    latent, k_rope = inp["latent"], inp["k_rope"]                         # [B,S,C], [B,S,R]
    k_nope = torch.einsum("bsc,hdc->bhsd", latent, _heads(layer.w_uk.weight, c.n_heads, c.head_dim))
    v = torch.einsum("bsc,hdc->bhsd", latent, _heads(layer.w_uv.weight, c.n_heads, c.head_dim))
    scores = (inp["q_nope"] @ k_nope.transpose(-1, -2)
              + inp["q_rope"] @ k_rope.unsqueeze(1).transpose(-1, -2)) / math.sqrt(c.head_dim + c.rope_dim)
    out = scores.softmax(-1) @ v                                           # [B,H,1,D]
    return layer.wo(out.transpose(1, 2).reshape(out.shape[0], 1, -1))


@torch.no_grad()
def materialize(layer: MLAAttention, inp: dict) -> dict:
    """The MHA-style cache: per-head K (no-RoPE part) and V, built once from the latent."""
    c = layer.c
    return {"k_nope": torch.einsum("bsc,hdc->bhsd", inp["latent"], _heads(layer.w_uk.weight, c.n_heads, c.head_dim)),
            "v": torch.einsum("bsc,hdc->bhsd", inp["latent"], _heads(layer.w_uv.weight, c.n_heads, c.head_dim))}


@torch.no_grad()
def materialized(layer: MLAAttention, inp: dict, mha_cache: dict) -> torch.Tensor:
    c = layer.c
    scores = (inp["q_nope"] @ mha_cache["k_nope"].transpose(-1, -2)
              + inp["q_rope"] @ inp["k_rope"].unsqueeze(1).transpose(-1, -2)) / math.sqrt(c.head_dim + c.rope_dim)
    out = scores.softmax(-1) @ mha_cache["v"]
    return layer.wo(out.transpose(1, 2).reshape(out.shape[0], 1, -1))


def absorbed(layer: MLAAttention, inp: dict) -> torch.Tensor:
    """The absorbed decode: the fused CPU kernel where it applies (float32 on the CPU), else `absorbed_matmul`
    (both without autograd: the fused kernel records nothing, and absorbed_matmul runs under no_grad itself, so
    no decorator here adds its few microseconds to every call)."""
    out = mla_cpu.absorbed(layer, inp)
    return out if out is not None else absorbed_matmul(layer, inp)


def absorbed_implementation(layer: MLAAttention, inp: dict) -> str:
    """Which kernel `absorbed` runs for these inputs, in words."""
    width = mla_cpu.vector_width(layer.c.kv_latent, layer.c.rope_dim) if mla_cpu.applies(layer, inp) else None
    if width is not None:
        return f"{mla_cpu.NAME}, {width}-float vectors"
    return "PyTorch ops (heads as the rows of one matmul)"


@torch.no_grad()
def absorbed_matmul(layer: MLAAttention, inp: dict) -> torch.Tensor:
    """The heads (times the new tokens) are the rows of one matmul over the latent, so each step reads the
    latent once per pass, not once per head; W_uk and W_uv are applied as one bmm over the heads each.
    Device-agnostic PyTorch: what `absorbed` runs off the CPU, and the CPU's previous kernel."""
    c = layer.c
    latent, k_rope = inp["latent"], inp["k_rope"]                         # [B,S,C], [B,S,R]
    b, h, t, d = inp["q_nope"].shape
    w_uk = _heads(layer.w_uk.weight, h, d)                                 # [H,D,C]
    w_uv = _heads(layer.w_uv.weight, h, d)
    q_latent = torch.bmm(inp["q_nope"].permute(1, 0, 2, 3).reshape(h, b * t, d), w_uk)   # the query, in latent space
    q_latent = q_latent.view(h, b, t, -1).transpose(0, 1).reshape(b, h * t, -1)         # [B, H*T, C]
    scores = torch.baddbmm(torch.bmm(inp["q_rope"].reshape(b, h * t, -1), k_rope.transpose(1, 2)),
                           q_latent, latent.transpose(1, 2))                            # [B, H*T, S]
    weights = scores.mul_(1 / math.sqrt(c.head_dim + c.rope_dim)).softmax(-1)
    out_latent = torch.bmm(weights, latent)                                # [B, H*T, C]: attend over the latent
    out = torch.bmm(out_latent.view(b, h, t, -1).permute(1, 0, 2, 3).reshape(h, b * t, -1),
                    w_uv.transpose(1, 2))                                  # W_uv applied once, after attention
    return layer.wo(out.view(h, b, t, d).permute(1, 2, 0, 3).reshape(b, t, h * d))


@torch.no_grad()
def absorbed_broadcast(layer: MLAAttention, inp: dict) -> torch.Tensor:
    """The previous absorbed kernel, kept for the benchmark: the latent broadcast over the heads makes one
    matrix-vector product per head, so the latent is read once per head."""
    c = layer.c
    latent, k_rope = inp["latent"], inp["k_rope"]
    w_uk = _heads(layer.w_uk.weight, c.n_heads, c.head_dim)
    w_uv = _heads(layer.w_uv.weight, c.n_heads, c.head_dim)
    q_latent = torch.einsum("bhtd,hdc->bhtc", inp["q_nope"], w_uk)
    scores = (q_latent @ latent.unsqueeze(1).transpose(-1, -2)
              + inp["q_rope"] @ k_rope.unsqueeze(1).transpose(-1, -2)) / math.sqrt(c.head_dim + c.rope_dim)
    out_latent = scores.softmax(-1) @ latent.unsqueeze(1)
    out = torch.einsum("bhtc,hdc->bhtd", out_latent, w_uv)
    return layer.wo(out.transpose(1, 2).reshape(out.shape[0], 1, -1))


def cost(layer: MLAAttention, batch: int, context: int, bytes_per_number: float) -> dict:
    """Bytes each form must move and FLOPs it does for one decode step of one layer (weights excluded)."""
    c = layer.c
    h, d, r, lat, s = c.n_heads, c.head_dim, c.rope_dim, c.kv_latent, context
    cache = batch * s * (lat + r) * bytes_per_number
    rebuilt = batch * s * h * 2 * d * bytes_per_number                    # naive writes K and V, then reads them
    attention_mha = 2 * s * h * (d + r) + 2 * s * h * d                  # scores over d + r, then weights x V
    return {
        "cache_bytes": cache,
        "cache_bytes_per_token": (lat + r) * bytes_per_number,
        "naive_bytes": cache + 2 * rebuilt,
        "materialized_bytes": batch * s * (h * 2 * d + r) * bytes_per_number,
        "absorbed_bytes": cache,
        "naive_flops": batch * (2 * s * lat * 2 * h * d + attention_mha),
        "materialized_flops": batch * attention_mha,
        "absorbed_flops": batch * (2 * h * d * lat + 2 * s * h * (lat + r) + 2 * s * h * lat + 2 * h * lat * d),
    }
