"""KV cache eviction policies, as small classes over one base, and their evaluation on a real model.

The setting is the one kvpress measures: a prompt (the prefix) is prefilled with the full cache,
the policy then keeps `budget` of the prefix's tokens per KV head, and the continuation is decoded
against what was kept. Policies score tokens from the prefill's own attention weights:

- StreamingLLM (Xiao et al., ICLR 2024, sec. 3): the first few "sink" tokens plus a recent window.
- H2O (Zhang et al., NeurIPS 2023, sec. 3): the tokens with the most accumulated attention
  ("heavy hitters") plus a recent window.
- SnapKV (Li et al., 2024, sec. 4): attention from an observation window at the end of the prompt,
  pooled over neighbouring positions, plus the window itself.
- random, and the full cache as the reference.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class Policy:
    """Chooses which prefix tokens each KV head keeps. Subclasses define `scores`."""
    name = "policy"

    def keep(self, weights: torch.Tensor, budget: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """weights: [B, Hkv, P, P] prefill attention, summed over each KV head's query heads.

        Returns a bool mask [B, Hkv, P] with exactly min(budget, P) True per row.
        """
        b, h, p, _ = weights.shape
        budget = min(budget, p)
        scores = self.scores(weights, budget, generator)
        top = scores.topk(budget, dim=-1).indices
        return torch.zeros(b, h, p, dtype=torch.bool, device=weights.device).scatter_(-1, top, True)

    def scores(self, weights, budget, generator):
        raise NotImplementedError


def _recent(p: int, n: int, device) -> torch.Tensor:
    """+inf on the last n positions, 0 elsewhere: forces a recent window into the top-k."""
    s = torch.zeros(p, device=device)
    if n > 0:
        s[-n:] = math.inf
    return s


@dataclasses.dataclass(frozen=True)
class FullCache(Policy):
    name = "full"

    def keep(self, weights, budget, generator=None):
        b, h, p, _ = weights.shape
        return torch.ones(b, h, p, dtype=torch.bool, device=weights.device)


@dataclasses.dataclass(frozen=True)
class RandomPolicy(Policy):
    name = "random"

    def scores(self, weights, budget, generator):
        return torch.rand(weights.shape[:3], generator=generator).to(weights.device)


@dataclasses.dataclass(frozen=True)
class StreamingLLM(Policy):
    sinks: int = 4
    name = "streaming_llm"

    def scores(self, weights, budget, generator):
        p = weights.shape[-1]
        position = torch.arange(p, device=weights.device, dtype=torch.float32)
        # Sinks first, then the most recent tokens: a score that rises with position, sinks on top.
        return torch.where(position < min(self.sinks, budget), math.inf, position).expand(weights.shape[:3])


@dataclasses.dataclass(frozen=True)
class H2O(Policy):
    recent_share: float = 0.5
    name = "h2o"

    def scores(self, weights, budget, generator):
        p = weights.shape[-1]
        accumulated = weights.sum(dim=-2)                     # attention each key received, over all queries
        return accumulated + _recent(p, int(budget * self.recent_share), weights.device)


@dataclasses.dataclass(frozen=True)
class SnapKV(Policy):
    window: int = 32
    kernel: int = 7
    name = "snapkv"

    def scores(self, weights, budget, generator):
        p = weights.shape[-1]
        window = min(self.window, budget, p)
        observed = weights[..., p - window:, :].sum(dim=-2)  # what the last prompt tokens attend to
        b, h, _ = observed.shape
        pooled = F.max_pool1d(observed.reshape(b * h, 1, p), self.kernel, stride=1, padding=self.kernel // 2)
        return pooled.reshape(b, h, p) + _recent(p, window, weights.device)


POLICIES: dict[str, Policy] = {p.name: p for p in (FullCache(), RandomPolicy(), StreamingLLM(), H2O(), SnapKV())}


def kv_groups(model) -> tuple[int, int]:
    """(KV heads, query heads per KV head). MLA shares one latent among all heads: one group."""
    c = model.c
    return (c.n_kv_heads, c.n_heads // c.n_kv_heads) if c.attention == "gqa" else (1, c.n_heads)


def masks_for(model, weights: list[torch.Tensor], prefix: int, policy: Policy, budget: int,
              generator: torch.Generator | None = None):
    """Per-layer attention masks [B, H, T, T]: continuation queries see only the kept prefix tokens."""
    kv_heads, group = kv_groups(model)
    masks, kept = [], []
    for w in weights:
        b, h, t, _ = w.shape
        pre = w[:, :, :prefix, :prefix].reshape(b, kv_heads, group, prefix, prefix).sum(2)
        keep = policy.keep(pre, budget, generator)                          # [B, Hkv, P]
        kept.append(keep)
        mask = torch.ones(b, h, t, t, dtype=torch.bool, device=w.device)
        mask[:, :, prefix:, :prefix] = keep.repeat_interleave(group, 1)[:, :, None, :]
        masks.append(mask)
    return masks, kept


@torch.no_grad()
def evaluate(model, ids: torch.Tensor, prefix: int, policy: Policy, budget_fraction: float, seed: int = 0,
             answer_positions: torch.Tensor | None = None, full: tuple | None = None) -> dict:
    """Loss and top-1 agreement on the continuation, with the prefix cut to a budget by the policy.

    answer_positions: optional [B, k] positions (recall values) to score recall on: the share of
    answer bytes right, and of sequences with every answer right.
    full: optional (logits, weights) of `model(ids, need_weights=True)` already computed, so a sweep over
    policies and budgets on the same ids runs the full-cache forward once.
    """
    budget = max(1, round(budget_fraction * prefix))
    full_logits, weights = full if full is not None else model(ids, need_weights=True)[:2]
    generator = torch.Generator().manual_seed(seed)
    masks, kept = masks_for(model, weights, prefix, policy, budget, generator)
    logits = model(ids, masks=masks)
    targets = ids[:, prefix + 1:]
    pred = logits[:, prefix:-1]
    out = {
        "policy": policy.name, "budget": budget, "budget_fraction": budget_fraction, "prefix": prefix,
        "kept_per_head": [int(k.sum(-1).float().mean()) for k in kept],
        "loss": F.cross_entropy(pred.reshape(-1, pred.shape[-1]), targets.reshape(-1)).item(),
        "full_loss": F.cross_entropy(full_logits[:, prefix:-1].reshape(-1, pred.shape[-1]), targets.reshape(-1)).item(),
        "top1_agreement": (pred.argmax(-1) == full_logits[:, prefix:-1].argmax(-1)).float().mean().item(),
    }
    if answer_positions is not None:
        guess = logits.gather(1, (answer_positions - 1)[..., None].expand(-1, -1, logits.shape[-1])).argmax(-1)
        right = guess == ids.gather(1, answer_positions)
        out["recall_byte_acc"] = right.float().mean().item()
        out["recall_exact"] = right.all(-1).float().mean().item()
    return out


def summarize_weights(weights: list[torch.Tensor], top_share: float = 0.01, first: int = 4) -> list[dict]:
    """Per layer, over the queries in the second half of each sequence (plenty of context): the mean
    attention share on the first token (the sink), on the first `first` tokens, what an even spread
    would give those, and on each query's top `top_share` of keys (the heavy hitters)."""
    out = []
    for layer, w in enumerate(weights):
        t = w.shape[-1]
        rows = w[:, :, t // 2:, :]
        positions = torch.arange(t // 2, t, dtype=torch.float32, device=w.device)
        k = max(1, int(top_share * t))
        out.append({"layer": layer, "sink_mass": rows[..., 0].mean().item(),
                    "first_mass": rows[..., :first].sum(-1).mean().item(),
                    "uniform_first_mass": (first / (positions + 1)).mean().item(),
                    "top1pct_mass": rows.topk(k, dim=-1).values.sum(-1).mean().item()})
    return out


@torch.no_grad()
def attention_summary(model, ids: torch.Tensor, top_share: float = 0.01) -> list[dict]:
    """summarize_weights of the model's own attention over ids."""
    _, weights, _ = model(ids, need_weights=True)
    return summarize_weights(weights, top_share)
