"""Paged attention for one decode step: the cache lives in fixed-size blocks scattered through a
pool, and each sequence's block table says where its tokens are (Kwon et al., SOSP 2023, sec. 4.1).

`paged_decode` gathers through the block table; `contiguous_decode` is the reference over a plain
[B, S, Hkv, D] cache (one batched SDPA call). They must agree, whatever the physical order of the blocks.
`loop_decode` is the naive per-sequence reference (run it in float64 for the tests), and
`gather_repeat_decode` the previous paged kernel, kept so the benchmark shows before and after.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _host_lens(seq_lens) -> list[int]:
    """Sequence lengths as Python ints. Pass a list to keep a device sync out of a timed region."""
    return [int(n) for n in seq_lens.tolist()] if isinstance(seq_lens, torch.Tensor) else [int(n) for n in seq_lens]


def contiguous_decode(q, k, v, seq_lens):
    """q: [B, H, D]; k, v: [B, S, Hkv, D]; sequence b attends over its first seq_lens[b] tokens.

    One batched SDPA call; the positions past each sequence's end are masked (they must be finite).
    """
    s = k.shape[1]
    lens = seq_lens.to(q.device) if isinstance(seq_lens, torch.Tensor) else torch.tensor(seq_lens, device=q.device)
    valid = torch.arange(s, device=q.device)[None, :] < lens[:, None]                       # [B, S]
    return F.scaled_dot_product_attention(q[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2),
                                          attn_mask=valid[:, None, None, :], enable_gqa=True).squeeze(2)


def paged_decode(q, k_pool, v_pool, block_table, seq_lens):
    """q: [B, H, D]; k_pool, v_pool: [num_blocks, block_size, Hkv, D]; block_table: [B, max_blocks] int.

    Per sequence: one index_select of its blocks (in logical order) into a scratch buffer that stays in
    cache, then one batched matmul over its KV heads with that head's group of queries as the rows, so K
    and V are read once, with no repeat_interleave and no transposed copy of K. Only the first
    seq_lens[b] tokens are read, so the unused tail of the last block (which may hold NaN) never is.
    """
    b, max_blocks = block_table.shape
    block_size, hkv, d = k_pool.shape[1:]
    h = q.shape[1]
    group = h // hkv
    # One sequence's worth of scratch, reused: a fresh [B, S] gather would cost page faults on every call.
    k_buf = k_pool.new_empty(max_blocks, block_size, hkv, d)
    v_buf = v_pool.new_empty(max_blocks, block_size, hkv, d)
    out = q.new_empty(b, h, d)
    scale = 1 / math.sqrt(d)
    for i, n in enumerate(_host_lens(seq_lens)):
        used = -(-n // block_size)
        torch.index_select(k_pool, 0, block_table[i, :used], out=k_buf[:used])
        torch.index_select(v_pool, 0, block_table[i, :used], out=v_buf[:used])
        k = k_buf.view(-1, hkv, d)[:n].transpose(0, 1)                   # [Hkv, n, D], a view
        v = v_buf.view(-1, hkv, d)[:n].transpose(0, 1)
        scores = torch.bmm(q[i].view(hkv, group, d), k.transpose(1, 2)).mul_(scale)   # [Hkv, G, n]
        torch.bmm(scores.softmax(-1), v, out=out[i].view(hkv, group, d))
    return out


def loop_decode(q, k, v, seq_lens, dtype=None):
    """The naive reference: one sequence at a time, K and V repeated for each query group, computed in
    `dtype` (float64 for the tests) one sequence at a time, so no whole float64 copy of the cache is made."""
    def cast(x):
        return x if dtype is None else x.to(dtype)
    return torch.stack([_attend_one(cast(q[b]), cast(k[b, :n]), cast(v[b, :n]))
                        for b, n in enumerate(_host_lens(seq_lens))])


def gather_repeat_decode(q, k_pool, v_pool, block_table, seq_lens):
    """The previous paged kernel: gather every sequence's whole table, zero the tail, repeat K/V per group."""
    block_size = k_pool.shape[1]
    b, max_blocks = block_table.shape
    k = k_pool[block_table].reshape(b, max_blocks * block_size, *k_pool.shape[2:])
    v = v_pool[block_table].reshape(b, max_blocks * block_size, *v_pool.shape[2:])
    positions = torch.arange(max_blocks * block_size, device=q.device)
    valid = positions[None, :] < seq_lens[:, None]                       # [B, S]
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

    Returns (pool, block_table), on k's device. The block table of sequence b lists its blocks in
    logical order (padding entries point at block 0). The permutation is drawn on the CPU, so the layout
    is the same on every device; the copies are made on k's device.
    """
    b, s = k.shape[:2]
    lens = _host_lens(seq_lens)
    per_seq = [math.ceil(n / block_size) for n in lens]
    max_blocks = max(per_seq)
    if sum(per_seq) > num_blocks:
        raise ValueError(f"num_blocks must be at least {sum(per_seq)} for these sequences; got {num_blocks}.")
    order = torch.randperm(num_blocks, generator=generator).tolist()
    table, used = [], 0
    for n in per_seq:
        table.append(order[used:used + n] + [0] * (max_blocks - n))
        used += n
    table = torch.tensor(table, dtype=torch.long, device=k.device)
    pos = torch.arange(s, device=k.device)
    slots = table[:, pos // block_size] * block_size + pos % block_size                     # [B, S]
    pool = torch.full((num_blocks * block_size, *k.shape[2:]), fill, dtype=k.dtype, device=k.device)
    for i, n in enumerate(lens):                                       # one indexed write per sequence
        pool[slots[i, :n]] = k[i, :n]
    return pool.view(num_blocks, block_size, *k.shape[2:]), table
