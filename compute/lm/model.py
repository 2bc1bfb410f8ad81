"""A small decoder-only byte-level language model with selectable attention: GQA or MLA.

Small enough to train on two CPU cores, real enough to have the attention patterns the explainers
show (sinks, heavy hitters, induction heads for recall). Attention can return its weights and its
KV cache, which is what the kernels and the eviction experiments consume.

MLA follows DeepSeek-V2 (sec. 2.1): per token and layer it caches a normalised latent c_kv
(kv_latent numbers) and one RoPE key shared by all heads (rope_dim numbers). Per-head keys and
values are up-projections of the latent; the position part is decoupled because RoPE does not
commute with the up-projection.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

BOS = 256          # every sequence starts with it, so an attention sink can form
VOCAB = 257


@dataclasses.dataclass(frozen=True)
class LMConfig:
    name: str
    attention: str = "gqa"      # "gqa" or "mla"
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    head_dim: int = 32
    n_kv_heads: int = 2         # GQA only
    kv_latent: int = 64         # MLA only: cached latent per token and layer
    rope_dim: int = 16          # MLA only: cached decoupled RoPE key per token and layer
    mlp_mult: int = 4
    max_len: int = 512
    rope_base: float = 10000.0
    # What a Hugging Face checkpoint needs (see hf.py); the project's own models use the defaults.
    vocab: int = VOCAB
    mlp_hidden: int = 0          # 0: mlp_mult * d_model
    norm_eps: float = 1e-6
    qkv_bias: bool = False
    tie_embeddings: bool = True
    # Cross-layer attention (Brandon et al., 2024): groups of kv_share layers use the KV of the group's
    # first layer (the anchor); the followers have no K/V projections of their own. 1: no sharing.
    kv_share: int = 1
    # Token shift on the K/V inputs (Olsson et al. 2022's "smeared keys"; RWKV's time-mix): each cached
    # key and value may mix in the previous token's input, so one layer can find "the token after
    # the last time I saw this one", which is what copying and recall need. It changes what is
    # cached, not how much: still one key and value (or latent) per token.
    kv_shift: bool = False

    def __post_init__(self):
        if self.attention not in ("gqa", "mla"):
            raise ValueError(f"attention must be gqa or mla; got {self.attention!r}.")
        if self.attention == "gqa" and self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads}).")
        if self.kv_share < 1:
            raise ValueError(f"kv_share must be at least 1; got {self.kv_share}.")

    def owns_kv(self, layer: int) -> bool:
        return layer % self.kv_share == 0

    def cached_layers(self) -> int:
        return sum(self.owns_kv(i) for i in range(self.n_layers))

    def cache_numbers_per_token(self) -> int:
        """Numbers cached per token across all layers: the explainers' formula, for this model."""
        if self.attention == "mla":
            return self.cached_layers() * (self.kv_latent + self.rope_dim)
        return 2 * self.cached_layers() * self.n_kv_heads * self.head_dim


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) of predicting ids[:, t+1] from logits[:, t]."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def rope_tables(length: int, dim: int, base: float, device=None):
    inv = 1.0 / base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    angles = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., 2i], x[..., 2i+1]) by position-dependent angles. x: [..., T, dim]."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


class TokenShift(nn.Module):
    """x_t + mix * (x_{t-1} - x_t), per channel; the first position sees zeros before it."""

    def __init__(self, dim: int):
        super().__init__()
        self.mix = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x):
        prev = F.pad(x, (0, 0, 1, 0))[:, :-1]
        return x + self.mix * (prev - x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def attend(q, k, v, need_weights: bool = False, mask=None):
    """Causal attention. q, k: [B, H, T, d], v: [B, H, T, dv].

    `mask` (bool, broadcastable to [B, H, T, T], True = may attend) narrows the causal mask: that is
    how the eviction experiments drop tokens. With need_weights the eager path returns the weights.
    """
    t = q.shape[-2]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    allowed = causal if mask is None else causal & mask
    if not need_weights:
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True), None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed), None
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return weights @ v, weights


class GQAAttention(nn.Module):
    def __init__(self, c: LMConfig, owns_kv: bool = True):
        super().__init__()
        self.c = c
        self.owns_kv = owns_kv
        self.wq = nn.Linear(c.d_model, c.n_heads * c.head_dim, bias=c.qkv_bias)
        if owns_kv:
            self.wk = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=c.qkv_bias)
            self.wv = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=c.qkv_bias)
            if c.kv_shift:
                self.shift_k, self.shift_v = TokenShift(c.d_model), TokenShift(c.d_model)
        self.wo = nn.Linear(c.n_heads * c.head_dim, c.d_model, bias=False)

    def kv(self, x, cos, sin):
        """What this layer caches: K (after RoPE) and V, [B, n_kv_heads, T, head_dim] each."""
        b, t, _ = x.shape
        xk, xv = (self.shift_k(x), self.shift_v(x)) if self.c.kv_shift else (x, x)
        k = self.wk(xk).view(b, t, self.c.n_kv_heads, self.c.head_dim).transpose(1, 2)
        v = self.wv(xv).view(b, t, self.c.n_kv_heads, self.c.head_dim).transpose(1, 2)
        return {"k": apply_rope(k, cos, sin), "v": v}

    def forward(self, x, cos, sin, need_weights=False, mask=None, kv_transform=None):
        b, t, _ = x.shape
        q = apply_rope(self.wq(x).view(b, t, self.c.n_heads, self.c.head_dim).transpose(1, 2), cos, sin)
        cache = self.kv(x, cos, sin) if self.owns_kv else None      # a follower gets its anchor's below
        if kv_transform is not None:
            cache = kv_transform(cache)
        rep = self.c.n_heads // self.c.n_kv_heads
        out, w = attend(q, cache["k"].repeat_interleave(rep, 1), cache["v"].repeat_interleave(rep, 1),
                        need_weights, mask)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1)), w, cache


class MLAAttention(nn.Module):
    def __init__(self, c: LMConfig):
        super().__init__()
        self.c = c
        self.wq = nn.Linear(c.d_model, c.n_heads * (c.head_dim + c.rope_dim), bias=False)
        self.w_dkv = nn.Linear(c.d_model, c.kv_latent, bias=False)        # down-projection to the latent
        self.kv_norm = RMSNorm(c.kv_latent)
        self.w_kr = nn.Linear(c.d_model, c.rope_dim, bias=False)          # the shared RoPE key
        self.w_uk = nn.Linear(c.kv_latent, c.n_heads * c.head_dim, bias=False)   # latent -> per-head keys
        self.w_uv = nn.Linear(c.kv_latent, c.n_heads * c.head_dim, bias=False)   # latent -> per-head values
        self.wo = nn.Linear(c.n_heads * c.head_dim, c.d_model, bias=False)
        if c.kv_shift:
            self.shift_kv, self.shift_kr = TokenShift(c.d_model), TokenShift(c.d_model)

    def kv(self, x, cos, sin):
        """What this layer caches: the latent [B, T, kv_latent] and the RoPE key [B, T, rope_dim]."""
        xkv, xkr = (self.shift_kv(x), self.shift_kr(x)) if self.c.kv_shift else (x, x)
        return {"latent": self.kv_norm(self.w_dkv(xkv)), "k_rope": apply_rope(self.w_kr(xkr), cos, sin)}

    def split_query(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.c.n_heads, self.c.head_dim + self.c.rope_dim).transpose(1, 2)
        q_nope, q_rope = q.split([self.c.head_dim, self.c.rope_dim], dim=-1)
        return q_nope, apply_rope(q_rope, cos, sin)

    def forward(self, x, cos, sin, need_weights=False, mask=None, kv_transform=None):
        """The naive form: rebuild per-head K and V from the latent, then attend as MHA."""
        b, t, _ = x.shape
        c = self.c
        q_nope, q_rope = self.split_query(x, cos, sin)
        cache = self.kv(x, cos, sin)
        if kv_transform is not None:
            cache = kv_transform(cache)
        s = t
        k_nope = self.w_uk(cache["latent"]).view(b, s, c.n_heads, c.head_dim).transpose(1, 2)
        v = self.w_uv(cache["latent"]).view(b, s, c.n_heads, c.head_dim).transpose(1, 2)
        k_rope = cache["k_rope"].unsqueeze(1).expand(b, c.n_heads, s, c.rope_dim)
        q = torch.cat([q_nope, q_rope], dim=-1)
        k = torch.cat([k_nope, k_rope], dim=-1)
        # attend() scales by sqrt(head_dim + rope_dim), the full query/key width, as DeepSeek-V2 does.
        out, w = attend(q, k, v, need_weights, mask)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1)), w, cache


class Block(nn.Module):
    def __init__(self, c: LMConfig, owns_kv: bool = True):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(c.d_model, c.norm_eps), RMSNorm(c.d_model, c.norm_eps)
        if c.attention == "mla" and not owns_kv:
            raise ValueError("trained-in KV sharing (kv_share > 1) is implemented for GQA models only.")
        self.attn = GQAAttention(c, owns_kv) if c.attention == "gqa" else MLAAttention(c)
        hidden = c.mlp_hidden or c.mlp_mult * c.d_model
        self.up = nn.Linear(c.d_model, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, c.d_model, bias=False)

    def forward(self, x, cos, sin, need_weights=False, mask=None, kv_transform=None):
        a, w, cache = self.attn(self.norm1(x), cos, sin, need_weights, mask, kv_transform)
        x = x + a
        gate, up = self.up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up), w, cache


class TinyLM(nn.Module):
    def __init__(self, c: LMConfig):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.d_model)
        self.blocks = nn.ModuleList(Block(c, c.owns_kv(i)) for i in range(c.n_layers))
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.head = None if c.tie_embeddings else nn.Linear(c.d_model, c.vocab, bias=False)
        rope = c.head_dim if c.attention == "gqa" else c.rope_dim
        cos, sin = rope_tables(c.max_len, rope, c.rope_base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, ids, need_weights=False, masks=None, kv_transform=None):
        """Logits [B, T, vocab]; with need_weights, also each layer's attention weights and KV caches.

        masks: None, or one bool mask per layer (see attend) that narrows what each layer may see.
        kv_transform(layer, cache) -> cache: replaces what a layer caches before it attends, which is
        how quantization, cross-layer sharing and cross-model maps are measured on the real model.
        """
        t = ids.shape[1]
        x = self.embed(ids)
        cos, sin = self.cos[:t], self.sin[:t]
        weights, caches = [], []
        anchors = {}

        def layer_transform(i, cache):
            if not self.c.owns_kv(i):                      # trained-in sharing: the anchor's (transformed) KV
                return anchors[i - i % self.c.kv_share]
            anchors[i] = cache if kv_transform is None else kv_transform(i, cache)
            return anchors[i]

        for i, block in enumerate(self.blocks):
            if self.c.kv_share > 1:
                transform = lambda cache, i=i: layer_transform(i, cache)
            else:
                transform = None if kv_transform is None else (lambda cache, i=i: kv_transform(i, cache))
            x, w, cache = block(x, cos, sin, need_weights, None if masks is None else masks[i], transform)
            weights.append(w)
            caches.append(cache)
        x = self.norm(x)
        logits = x @ self.embed.weight.T if self.head is None else self.head(x)
        return (logits, weights, caches) if need_weights else logits
