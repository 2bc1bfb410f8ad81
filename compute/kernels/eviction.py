"""KV cache eviction policies, as small classes over one base, and their evaluation on a real model.

The setting is the one kvpress measures: a prompt (the prefix) is prefilled with the full cache,
the policy then keeps `budget` of the prefix's tokens per KV head, and the continuation is decoded
against what was kept. Policies score tokens from the prefill's own attention weights:

- StreamingLLM (Xiao et al., ICLR 2024, sec. 3): the first few "sink" tokens plus a recent window.
  Keeps the same tokens as kvpress's `StreamingLLMPress` (tests/compute/test_kvpress_parity.py).
- H2O as its paper states it (Zhang et al., NeurIPS 2023, sec. 3 and 4.1): the tokens with the most
  accumulated attention ("heavy hitters") plus a recent window. Not a kvpress press.
- Observed attention as kvpress's `ObservedAttentionPress` scores it (presses/observed_attention_press.py):
  attention received, divided by the number of queries that see each token, no recent window. Related to
  H2O but a different rule: the division lifts late tokens, which few queries can see.
- SnapKV as kvpress's `SnapKVPress` (presses/snapkv_press.py) and the SnapKV reference code (Li et al.,
  NeurIPS 2024, sec. 4.1 and Listing 1): the mean attention from an observation window of the last 64
  prompt tokens, average-pooled over 5 neighbouring positions, averaged over each KV head's query heads,
  plus the window itself.
- random, and the full cache as the reference.

The kept counts are kvpress's (`utils.compute_n_kept`): whole tokens, max(1, floor(P × (1 − compression
ratio))) with compression ratio = 1 − the budget fraction, computed in floating point as kvpress does.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F


def kept_count(prompt: int, budget_fraction: float) -> int:
    """Whole tokens kept of a `prompt`-token prefix: kvpress's compute_n_kept(prompt, 1 − budget_fraction).

    kvpress floors (int) rather than rounds, and its 1 − (1 − f) is a float: 10% of 450 keeps 44, not 45."""
    compression_ratio = 1 - budget_fraction
    if compression_ratio >= 1:
        return 0
    return max(1, int(prompt * (1 - compression_ratio)))


@dataclasses.dataclass(frozen=True)
class Policy:
    """Chooses which prefix tokens each KV head keeps. Subclasses define `scores`."""
    name = "policy"

    def keep(self, weights: torch.Tensor, budget: int, generator: torch.Generator | None = None,
             group: int = 1) -> torch.Tensor:
        """weights: [B, H, P, P] prefill attention of H = KV heads × `group` query heads (group=1: already one
        map per KV head).

        Returns a bool mask [B, H // group, P] with exactly min(budget, P) True per row: the top `budget`
        scores, by torch.topk as kvpress's ScorerPress takes them (so ties fall the same way)."""
        b, h, p, _ = weights.shape
        budget = min(budget, p)
        scores = self.scores(weights, group, budget, generator)
        top = scores.topk(budget, dim=-1).indices
        return torch.zeros(b, h // group, p, dtype=torch.bool, device=weights.device).scatter_(-1, top, True)

    def scores(self, weights, group, budget, generator):
        raise NotImplementedError


def _recent(p: int, n: int, device) -> torch.Tensor:
    """+inf on the last n positions, 0 elsewhere: forces a recent window into the top-k."""
    s = torch.zeros(p, device=device)
    if n > 0:
        s[-n:] = math.inf
    return s


def _per_kv_head_sum(weights: torch.Tensor, group: int) -> torch.Tensor:
    """[B, H, P, P] -> [B, H // group, P, P]: each KV head's query heads summed."""
    b, h, p, q = weights.shape
    return weights.reshape(b, h // group, group, p, q).sum(2)


@dataclasses.dataclass(frozen=True)
class FullCache(Policy):
    name = "full"

    def keep(self, weights, budget, generator=None, group=1):
        b, h, p, _ = weights.shape
        return torch.ones(b, h // group, p, dtype=torch.bool, device=weights.device)


@dataclasses.dataclass(frozen=True)
class RandomPolicy(Policy):
    """Uniform scores from one seeded generator that runs on across layers (kvpress's RandomPress(seed)
    re-seeds in every layer, so it drops the same positions in each)."""
    name = "random"

    def scores(self, weights, group, budget, generator):
        b, h, p, _ = weights.shape
        return torch.rand((b, h // group, p), generator=generator).to(weights.device)


@dataclasses.dataclass(frozen=True)
class StreamingLLM(Policy):
    """kvpress StreamingLLMPress(n_sink=sinks): the first `sinks` tokens and the most recent rest. Where the
    budget is below the sinks (kvpress then leaves the choice among its sinks to topk), the first ones."""
    sinks: int = 4
    name = "streaming_llm"

    def scores(self, weights, group, budget, generator):
        b, h, p, _ = weights.shape
        position = torch.arange(p, device=weights.device, dtype=torch.float32)
        # Sinks first, then the most recent tokens: a score that rises with position, sinks on top.
        return torch.where(position < min(self.sinks, budget), math.inf, position).expand(b, h // group, p)


@dataclasses.dataclass(frozen=True)
class H2O(Policy):
    """H2O as its paper states it: attention accumulated over all the prompt's queries (summed, not
    normalised), plus the most recent `recent_share` of the budget (sec. 5.1 splits it evenly)."""
    recent_share: float = 0.5
    name = "h2o"

    def scores(self, weights, group, budget, generator):
        p = weights.shape[-1]
        accumulated = _per_kv_head_sum(weights, group).sum(dim=-2)   # attention each key received
        return accumulated + _recent(p, int(budget * self.recent_share), weights.device)


@dataclasses.dataclass(frozen=True)
class ObservedAttention(Policy):
    """kvpress ObservedAttentionPress: the attention a key received divided by the number of queries that
    see it (P − j for key j), averaged over the KV head's query heads; no recent window. The same
    operations in the same order as the press, so the scores are bit-identical on the same maps."""
    name = "observed"

    def scores(self, weights, group, budget, generator):
        b, h, p, _ = weights.shape
        seen_by = torch.arange(p, 0, -1).to(weights.device, weights.dtype)
        return (weights.sum(2) / seen_by).view(b, h // group, group, p).mean(2)


@dataclasses.dataclass(frozen=True)
class SnapKV(Policy):
    """kvpress SnapKVPress(window_size=window, kernel_size=kernel), defaults as kvpress's: the mean attention
    from the last `window` prompt queries to each earlier key, average-pooled over `kernel` neighbours
    (zero padded, as F.avg_pool1d), averaged over each KV head's query heads, the window itself on top.

    Below the window the budget goes to window tokens only, all tied at the top; torch.topk picks among
    them as in kvpress. kvpress refuses a prompt no longer than the window; here the window shrinks to P − 1."""
    window: int = 64
    kernel: int = 5
    name = "snapkv"

    def scores(self, weights, group, budget, generator):
        b, h, p, _ = weights.shape
        window = min(self.window, p - 1)
        if window <= 0:
            return torch.zeros(b, h // group, p, device=weights.device)
        observed = weights[..., -window:, :-window].mean(dim=-2)          # [B, H, P − window]
        pooled = F.avg_pool1d(observed, kernel_size=self.kernel, padding=self.kernel // 2, stride=1)
        per_kv = pooled.view(b, h // group, group, p - window).mean(2)
        return F.pad(per_kv, (0, window), value=per_kv.max().item() + 1)


POLICIES: dict[str, Policy] = {p.name: p for p in (FullCache(), RandomPolicy(), StreamingLLM(), H2O(),
                                                    ObservedAttention(), SnapKV())}


def kv_groups(model) -> tuple[int, int]:
    """(KV heads, query heads per KV head). MLA shares one latent among all heads: one group."""
    c = model.c
    return (c.n_kv_heads, c.n_heads // c.n_kv_heads) if c.attention == "gqa" else (1, c.n_heads)


def masks_for(model, weights: list[torch.Tensor], prefix: int, policy: Policy, budget: int,
              generator: torch.Generator | None = None):
    """Per-layer attention masks [B, H, T, T]: continuation queries see only the kept prefix tokens."""
    _, group = kv_groups(model)
    masks, kept = [], []
    for w in weights:
        b, h, t, _ = w.shape
        keep = policy.keep(w[:, :, :prefix, :prefix], budget, generator, group)   # [B, Hkv, P]
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
    budget = kept_count(prefix, budget_fraction)
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
