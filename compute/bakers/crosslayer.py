"""Baked results for the cross-layer page: how alike the layers' caches are, and what sharing them costs.

On the trained `gqa-large` (4 layers, each caching its own K and V):
- layer-by-layer linear CKA and raw cosine of the cached K and of V (crosslayer.similarity), with
  CKA's random baseline;
- bits per byte on held-out text and recall accuracy (the planted key-value lookup) when follower
  layers reuse their anchor's cache after training, at 1:1, 1:2 and 1:4 (crosslayer.sharing_transform);
- the same 1:2 sharing with a fitted linear map from each anchor's cache to its follower's (ridge,
  RoPE taken out of the keys first), which still stores only the anchors' caches.
On `gqa-cla2` (the same model trained with sharing built in at 1:2, as cross-layer attention does,
Brandon et al. 2024), when its checkpoint exists: its own bits per byte and recall on the same data.

Everything is scored on the held-out sets the checkpoints' cards use (24 text and 48 recall sequences
of 512 bytes), so the 1:1 row equals each card's "full" figures.
"""
from __future__ import annotations

import math
import random

import torch

from kvx.compute.kernels import crosslayer
from kvx.compute.lm import data
from kvx.compute.lm.model import apply_rope, next_token_loss
from kvx.compute.lm.train import CHECKPOINTS, SEQ_LEN, load

IMPOSED = "gqa-large"          # trained without sharing; sharing is imposed on it afterwards
TRAINED_IN = "gqa-cla2"        # the same family trained with kv_share=2 (followers have no K/V projections)
RATIOS = (1, 2, 4)
TEXT_SEQUENCES, RECALL_SEQUENCES = 24, 48      # the cards' held-out sets (compute/lm/train.py evaluate)
SIMILARITY_SEQUENCES = 8                       # 4,096 tokens per layer for CKA
FIT_SEQUENCES, FIT_SEED, FIT_RECALL_SHARE, RIDGE = 8, 11, 0.3, 1e-3
DIGITS = 5


def _r(x: float) -> float:
    return float(f"{x:.{DIGITS}g}")


def trained_in_model(required: bool = False):
    """The trained-in checkpoint, or None while it does not exist (unless required: then a clear error)."""
    if not (CHECKPOINTS / f"{TRAINED_IN}.pt").exists():
        if required:
            raise FileNotFoundError(f"the trained-in sharing model {TRAINED_IN!r} is not in {CHECKPOINTS}; train it "
                                    f"with `kvx train {TRAINED_IN}`, then `kvx bake cross-layer`.")
        return None
    return load(TRAINED_IN)


def bake() -> dict:
    """What `kvx bake cross-layer` stores: gqa-large, and gqa-cla2 when its checkpoint is there."""
    return bake_for(load(IMPOSED), trained_in_model())


# ---- scoring --------------------------------------------------------------------------------------
def held_out(seq_len: int = SEQ_LEN, text_sequences: int = TEXT_SEQUENCES, recall_sequences: int = RECALL_SEQUENCES):
    text = data.text_set(text_sequences, seq_len)
    ids, pos = data.recall_set(recall_sequences, seq_len)
    return text, ids, pos


@torch.no_grad()
def score(model, text: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, transform=None) -> dict:
    """Bits per byte on text, and recall accuracy per value byte and per whole value (6 bytes asked each).

    transform: None, or a function () -> kv_transform, called once per forward (transforms keep state)."""
    logits = model(text, kv_transform=None if transform is None else transform())
    bits = next_token_loss(logits, text).item() / math.log(2)
    logits = model(ids, kv_transform=None if transform is None else transform())
    guess = logits.gather(1, (pos - 1)[..., None].expand(-1, -1, logits.shape[-1])).argmax(-1)
    right = guess == ids.gather(1, pos)
    per_value = right.view(right.shape[0], -1, data.NEEDLE - data.SHOWN).all(-1)
    return {"bits_per_byte": bits, "recall_byte_acc": right.float().mean().item(),
            "recall_value_acc": per_value.float().mean().item()}


def _rounded(d: dict) -> dict:
    return {k: _r(v) if isinstance(v, float) else v for k, v in d.items()}


# ---- a fitted linear map from each anchor's cache to its follower's ----------------------------------
def _unrope(k: torch.Tensor, model) -> torch.Tensor:
    t = k.shape[-2]
    return apply_rope(k, model.cos[:t], -model.sin[:t])


def _flat(x: torch.Tensor) -> torch.Tensor:
    """[B, H, T, D] -> [B, T, H*D]"""
    return x.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)


def _features(model, cache: dict) -> torch.Tensor:
    """[B, T, 2*H*D]: a layer's cached K with RoPE taken out, then its V."""
    return torch.cat([_flat(_unrope(cache["k"], model)), _flat(cache["v"])], dim=-1)


@torch.no_grad()
def fit_alignment(model, ids: torch.Tensor, ratio: int, ridge: float = RIDGE) -> dict[int, torch.Tensor]:
    """{follower layer: W [2HD + 1, 2HD]}: ridge regression from the anchor's (K without RoPE, V, 1) to the
    follower's own (K without RoPE, V), fitted on `ids` with the model's own caches."""
    if model.c.attention != "gqa" or model.c.kv_share != 1:
        raise ValueError("the alignment is fitted on a GQA model that caches every layer")
    caches = {}
    model(ids, kv_transform=lambda layer, cache: caches.setdefault(layer, cache))     # the model's own caches
    maps = {}
    for layer in range(model.c.n_layers):
        anchor = layer - layer % ratio
        if layer == anchor:
            continue
        x = _features(model, caches[anchor]).reshape(-1, 2 * model.c.n_kv_heads * model.c.head_dim).double()
        y = _features(model, caches[layer]).reshape(x.shape[0], -1).double()
        x = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], dim=-1)
        gram = x.T @ x
        penalty = ridge * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=x.dtype)
        maps[layer] = torch.linalg.solve(gram + penalty, x.T @ y).float()
    return maps


def aligned_transform(model, maps: dict[int, torch.Tensor], ratio: int):
    """kv_transform: anchors keep their cache; each follower gets its anchor's cache through its fitted map.
    Only the anchors' caches are stored, as with plain sharing."""
    stored = {}
    c = model.c

    def heads(z: torch.Tensor) -> torch.Tensor:
        b, t, _ = z.shape
        return z.view(b, t, c.n_kv_heads, c.head_dim).transpose(1, 2)

    def transform(layer: int, cache: dict) -> dict:
        anchor = layer - layer % ratio
        if layer == anchor:
            stored[anchor] = cache
            return cache
        x = _features(model, stored[anchor])
        y = torch.cat([x, torch.ones(*x.shape[:2], 1)], dim=-1) @ maps[layer]
        k, v = y.split(c.n_kv_heads * c.head_dim, dim=-1)
        t = x.shape[1]
        return {"k": apply_rope(heads(k), model.cos[:t], model.sin[:t]), "v": heads(v)}

    return transform


# ---- the bake -------------------------------------------------------------------------------------
def _similarity(model, text: torch.Tensor) -> dict:
    sim = crosslayer.similarity(model, text)
    return {part: {"cka": [[_r(x) for x in row] for row in s["cka"]],
                   "cosine": [[_r(x) for x in row] for row in s["cosine"]],
                   "random_cka": _r(s["random_cka"])} for part, s in sim.items()}


def _config(model) -> dict:
    c = model.c
    return {"layers": c.n_layers, "q_heads": c.n_heads, "kv_heads": c.n_kv_heads, "head_dim": c.head_dim,
            "d_model": c.d_model, "kv_share": c.kv_share, "cached_layers": c.cached_layers(),
            "cache_numbers_per_token": c.cache_numbers_per_token(),
            "params": sum(p.numel() for p in model.parameters())}


@torch.no_grad()
def bake_for(model, trained_in=None, *, seq_len: int = SEQ_LEN, text_sequences: int = TEXT_SEQUENCES,
             recall_sequences: int = RECALL_SEQUENCES, similarity_sequences: int = SIMILARITY_SEQUENCES,
             fit_sequences: int = FIT_SEQUENCES, names: tuple[str, str] = (IMPOSED, TRAINED_IN)) -> dict:
    """The page's measured numbers for `model` (sharing imposed after training) and, if given, `trained_in`
    (sharing built in), all scored on the same held-out data. Plain JSON values."""
    model.eval()
    text, ids, pos = held_out(seq_len, text_sequences, recall_sequences)
    layers = model.c.n_layers
    sharing = []
    for ratio in (r for r in RATIOS if r <= layers):
        got = score(model, text, ids, pos, None if ratio == 1 else (lambda r=ratio: crosslayer.sharing_transform(r)))
        cached = len({layer - layer % ratio for layer in range(layers)})
        sharing.append({"ratio": ratio, "cached_layers": cached, "memory_fraction": cached / layers,
                        **_rounded(got)})
    fit_ids = data.batch("train", fit_sequences, seq_len, random.Random(FIT_SEED), FIT_RECALL_SHARE)
    maps = fit_alignment(model, fit_ids, 2)
    aligned = score(model, text, ids, pos, lambda: aligned_transform(model, maps, 2))
    map_numbers = sum(w.numel() for w in maps.values())
    out = {
        "model": names[0],
        "config": _config(model),
        "data": {"seq_len": seq_len, "text_sequences": text_sequences, "recall_sequences": recall_sequences,
                 "similarity_sequences": similarity_sequences, "recall_chance": _r(1 / len(data.VALUE_BYTES)),
                 "answers_per_value": data.NEEDLE - data.SHOWN},
        "similarity": _similarity(model, text[:similarity_sequences]),
        "sharing": sharing,
        "aligned": {"ratio": 2, "cached_layers": len(range(0, layers, 2)),
                    "memory_fraction": len(range(0, layers, 2)) / layers,
                    "fit_sequences": fit_sequences, "fit_recall_share": FIT_RECALL_SHARE, "ridge": RIDGE,
                    "map_numbers": map_numbers, **_rounded(aligned)},
        "trained_in": None,
        "provenance": {"models": [names[0]]},
    }
    if trained_in is not None:
        trained_in.eval()
        c = trained_in.c
        out["trained_in"] = {"model": names[1], "config": _config(trained_in), "ratio": c.kv_share,
                             "memory_fraction": c.cached_layers() / c.n_layers, **_rounded(score(trained_in, text, ids, pos))}
        out["provenance"]["models"].append(names[1])
    return out
