"""Paged attention for one decode step: the cache lives in fixed-size blocks scattered through a
pool, and each sequence's block table says where its tokens are (Kwon et al., SOSP 2023, sec. 4.1).

`paged_decode` gathers through the block table; `contiguous_decode` is the reference over a plain
[B, S, H, D] cache. They must agree, whatever the physical order of the blocks.
"""
from __future__ import annotations

import math

import torch


def contiguous_decode(q, k, v, seq_lens):
    """q: [B, H, D]; k, v: [B, S, Hkv, D]; each sequence b attends over its first seq_lens[b] tokens."""
    out = []
    for b in range(q.shape[0]):
        n = int(seq_lens[b])
        out.append(_attend_one(q[b], k[b, :n], v[b, :n]))
    return torch.stack(out)


def paged_decode(q, k_pool, v_pool, block_table, seq_lens):
    """q: [B, H, D]; k_pool, v_pool: [num_blocks, block_size, Hkv, D]; block_table: [B, max_blocks] int.

    Gathers each sequence's blocks in logical order, drops the unused tail of its last block (which may
    hold anything, even NaN), and attends.
    """
    block_size = k_pool.shape[1]
    b, max_blocks = block_table.shape
    k = k_pool[block_table].reshape(b, max_blocks * block_size, *k_pool.shape[2:])
    v = v_pool[block_table].reshape(b, max_blocks * block_size, *v_pool.shape[2:])
    positions = torch.arange(max_blocks * block_size, device=q.device)
    valid = positions[None, :] < seq_lens[:, None]                       # [B, S]
    # Zero what lies past each sequence's end so a NaN there cannot leak through a 0 weight.
    k = torch.where(valid[:, :, None, None], k, torch.zeros((), dtype=k.dtype, device=k.device))
    v = torch.where(valid[:, :, None, None], v, torch.zeros((), dtype=v.dtype, device=v.device))
    rep = q.shape[1] // k.shape[2]
    k = k.repeat_interleave(rep, dim=2).permute(0, 2, 1, 3)              # [B, H, S, D]
    v = v.repeat_interleave(rep, dim=2).permute(0, 2, 1, 3)
    scores = (q[:, :, None, :] @ k.transpose(-1, -2)).squeeze(2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    return (scores.softmax(-1)[:, :, None, :] @ v).squeeze(2)


def _attend_one(q, k, v):
    """q: [H, D]; k, v: [S, Hkv, D] -> [H, D]."""
    rep = q.shape[0] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1).transpose(0, 1)                  # [H, S, D]
    v = v.repeat_interleave(rep, dim=1).transpose(0, 1)
    weights = (q[:, None, :] @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(-1)
    return (weights @ v).squeeze(1)


def scatter_to_blocks(k, seq_lens, block_size: int, num_blocks: int, generator: torch.Generator, fill=float("nan")):
    """Copy a contiguous cache into a pool of blocks in random physical order; unused slots hold `fill`.

    Returns (pool, block_table). The block table of sequence b lists its blocks in logical order.
    """
    b, s = k.shape[:2]
    per_seq = [math.ceil(int(n) / block_size) for n in seq_lens]
    max_blocks = max(per_seq)
    if sum(per_seq) > num_blocks:
        raise ValueError(f"num_blocks must be at least {sum(per_seq)} for these sequences; got {num_blocks}.")
    order = torch.randperm(num_blocks, generator=generator)
    pool = torch.full((num_blocks, block_size, *k.shape[2:]), fill, dtype=k.dtype)
    table = torch.zeros(b, max_blocks, dtype=torch.long)
    used = 0
    for i, n in enumerate(per_seq):
        for j in range(n):
            phys = int(order[used])
            used += 1
            table[i, j] = phys
            lo, hi = j * block_size, min((j + 1) * block_size, int(seq_lens[i]))
            pool[phys, : hi - lo] = k[i, lo:hi]
    return pool.to(k.device), table.to(k.device)
