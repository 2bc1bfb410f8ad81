"""How alike are the KV caches of different layers, and what does sharing one layer's KV cost?

Raw cosine between two layers' keys compares coordinates in two arbitrary bases (each layer has its
own projection), so it reads near zero even for caches that carry the same information. Linear CKA
(Kornblith et al., ICML 2019, sec. 3) is invariant to rotations and isotropic scaling of either
side; it is reported against a random baseline of the same shape. Sharing follows cross-layer
attention (Brandon et al., 2024): follower layers attend with an anchor layer's cached K and V.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kvx.compute.lm.model import next_token_loss


def flat(cache: dict, part: str) -> torch.Tensor:
    """One layer's cached part as [tokens, features]."""
    x = cache[part]
    if x.dim() == 4:                                            # [B, H, T, D] -> [B*T, H*D]
        x = x.permute(0, 2, 1, 3).reshape(-1, x.shape[1] * x.shape[3])
    else:                                                       # [B, T, F] -> [B*T, F]
        x = x.reshape(-1, x.shape[-1])
    return x.double()


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    x = x - x.mean(0)
    y = y - y.mean(0)
    return ((x.T @ y).norm() ** 2 / ((x.T @ x).norm() * (y.T @ y).norm())).item()


def mean_cosine(x: torch.Tensor, y: torch.Tensor) -> float:
    return F.cosine_similarity(x, y, dim=-1).mean().item()


@torch.no_grad()
def similarity(model, ids: torch.Tensor, seed: int = 0) -> dict:
    """Layer-by-layer CKA and raw cosine of each cached part, with a random baseline for CKA."""
    _, _, caches = model(ids, need_weights=True)
    parts = list(caches[0])
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for part in parts:
        xs = [flat(c, part) for c in caches]
        n = len(xs)
        out[part] = {
            "cka": [[linear_cka(xs[i], xs[j]) for j in range(n)] for i in range(n)],
            "cosine": [[mean_cosine(xs[i], xs[j]) for j in range(n)] for i in range(n)],
            # Drawn on the CPU (the same baseline on every device), then moved to the cache's device.
            "random_cka": linear_cka(xs[0], torch.randn(xs[0].shape, generator=gen, dtype=torch.float64)
                                     .to(xs[0].device)),
        }
    return out


def sharing_transform(ratio: int):
    """kv_transform for model(): layer i attends with the cache of anchor layer i - i % ratio."""
    stored = {}

    def transform(layer: int, cache: dict) -> dict:
        anchor = layer - layer % ratio
        if layer == anchor:
            stored[anchor] = cache
        return stored[anchor]

    return transform


@torch.no_grad()
def sharing_loss(model, ids: torch.Tensor, ratio: int) -> dict:
    """Next-token loss when followers reuse their anchor's KV (1:ratio), against the model's own."""
    own = next_token_loss(model(ids), ids).item()
    shared = next_token_loss(model(ids, kv_transform=sharing_transform(ratio)), ids).item()
    layers = model.c.n_layers
    cached = len({layer - layer % ratio for layer in range(layers)})
    return {"ratio": ratio, "loss": shared, "own_loss": own, "cached_layers": cached,
            "memory_fraction": cached / layers}
