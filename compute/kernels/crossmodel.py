"""Map a small model's KV cache into its larger sibling's, instead of prefilling the large model again.

Ridge regression from every layer and head of the small model's cache to each layer and head of the
large one's, fitted on training text, with RoPE removed from keys first (rotation by position is the
same in both models, so the map should learn only content). One solve gives every per-layer,
per-head map at once, because they share the same inputs and penalty.
"""
from __future__ import annotations

import torch

from kvx.compute.lm.model import apply_rope, next_token_loss


def _unrope(k: torch.Tensor, model) -> torch.Tensor:
    t = k.shape[-2]
    return apply_rope(k, model.cos[:t], -model.sin[:t])


def _features(model, ids) -> torch.Tensor:
    """[tokens, features]: every layer's de-roped K and V, all heads."""
    _, _, caches = model(ids, need_weights=True)
    parts = []
    for c in caches:
        for x in (_unrope(c["k"], model), c["v"]):
            parts.append(x.permute(0, 2, 1, 3).reshape(-1, x.shape[1] * x.shape[3]))
    return torch.cat(parts, dim=-1).double()


def _with_bias(x: torch.Tensor) -> torch.Tensor:
    """x with a column of ones (the bias), on x's device."""
    return torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], dim=-1)


def fit(small, large, ids: torch.Tensor, ridge: float = 1e-2) -> dict:
    """Fit the map on `ids`; returns weights [small features + 1, large features] and the layout."""
    if small.c.attention != "gqa" or large.c.attention != "gqa":
        raise ValueError("the cross-model map is defined for the GQA family")
    with torch.no_grad():
        x, y = _features(small, ids), _features(large, ids)
    x = _with_bias(x)
    gram = x.T @ x
    penalty = ridge * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=x.dtype, device=x.device)
    w = torch.linalg.solve(gram + penalty, x.T @ y)
    return {"w": w, "in_features": x.shape[1] - 1, "out_features": y.shape[1]}


def mapped_transform(small, large, fitted: dict, ids: torch.Tensor):
    """kv_transform for the large model: each layer's cache replaced by the mapped small cache."""
    with torch.no_grad():
        x = _features(small, ids)
        y = (_with_bias(x) @ fitted["w"]).float()
    b, t = ids.shape
    c = large.c
    per = c.n_kv_heads * c.head_dim
    chunks = y.reshape(b, t, -1).split(per, dim=-1)            # k0, v0, k1, v1, ...

    def heads(z):
        return z.reshape(b, t, c.n_kv_heads, c.head_dim).permute(0, 2, 1, 3)

    def transform(layer: int, cache: dict) -> dict:
        k, v = heads(chunks[2 * layer]), heads(chunks[2 * layer + 1])
        return {"k": apply_rope(k, large.cos[:t], large.sin[:t]), "v": v}

    return transform


@torch.no_grad()
def evaluate(small, large, fitted: dict, ids: torch.Tensor) -> dict:
    def loss(logits):
        return next_token_loss(logits, ids).item()

    tokens = ids.numel()
    large_params = sum(p.numel() for n, p in large.named_parameters() if not n.startswith("embed"))
    return {
        "large_own_loss": loss(large(ids)),
        "large_mapped_loss": loss(large(ids, kv_transform=mapped_transform(small, large, fitted, ids))),
        "small_loss": loss(small(ids)),
        "reprefill_flops": 2 * large_params * tokens,
        "map_flops": 2 * (fitted["in_features"] + 1) * fitted["out_features"] * tokens,
    }
