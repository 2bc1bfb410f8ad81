"""Baked results for the eviction page: real attention maps, and what each policy's cut costs.

On the trained `gqa-large`, with the kernels of compute/kernels/eviction.py:

- **The sweep.** For every policy (the full cache, random, StreamingLLM with its 4 sinks, StreamingLLM
  with its sinks evicted, H2O as its paper states it, kvpress's observed attention, SnapKV) and every
  budget (5% to 100% of the prompt): the prompt is prefilled with the full cache, the policy keeps
  `budget` of its tokens per layer and KV head (kvpress's whole-token count), and the rest of the
  sequence is scored against what was kept (`eviction.evaluate`, the setting kvpress measures). On
  held-out text (prompt = all but the last 64 bytes): bits per byte and top-1 agreement with the full
  cache. On the recall task (prompt = everything before the questions,
  `data.query_start`; the questions come after compression): recall accuracy, the questions' bits per
  byte and top-1 agreement; and why recall goes as it does: the share of the planted SECRET-line tokens each
  policy keeps, against the lines' share of the prompt and of the questions' attention.
- **Attention maps.** For one recall sequence: each layer's attention (mean over heads) summed into
  16-token key bins and averaged over 16-query bins; per layer and KV head, the attention each prompt
  token receives from the questions (mean over them) and from the prompt's own queries (summed: H2O's
  score); which prompt tokens each policy keeps at each budget (per layer
  and KV head, as hex bit masks). On the text set: the share of attention on the first token and on
  the first 4 tokens, per layer.
- **Decoding with a bounded cache.** One held-out text sequence: a 64-byte prompt, then 128 decode
  steps (teacher-forced) with a cache of 32 tokens per layer and KV head. Each step's query attends to
  the 32 cached tokens and itself, then the policy evicts one token (the rules are in `decode`).

Single-threaded and deterministic; about 10-20 s on one CPU core.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kvx.compute.kernels import eviction
from kvx.compute.lm import data
from kvx.compute.lm.model import BOS
from kvx.compute.lm.train import SEQ_LEN, card, load

MODEL = "gqa-large"
BUDGETS = (0.05, 0.10, 0.20, 0.35, 0.50, 1.00)
TEXT_SEQUENCES, RECALL_SEQUENCES = 4, 8        # "run it here" asks the server for the same 8 recall sequences
TEXT_CONTINUATION = 64                         # as the kernel's text task: the prompt is all but the last 64
MAP_BIN = 16                                   # attention map cells: 16 queries × 16 keys
SINKS = 4                                      # StreamingLLM's sink tokens (sec. 3.2: four initial tokens)
DECODE_LENGTH, DECODE_PROMPT, DECODE_BUDGET = 192, 64, 32
DECODE_H2O_RECENT = DECODE_BUDGET // 2         # H2O splits its budget evenly (sec. 5.1, "Baselines"): 0.5
DECODE_SNAPKV_WINDOW = 8                       # SnapKV's observation window in the decode simulation (kvpress's
                                               # 64 would be the whole 64-byte prompt, which kvpress refuses)
DECODE_SEED = 13                               # which held-out text sequence the decode steps through (code
                                               # that repeats itself, so far tokens matter)
DIGITS = 4


def policies() -> dict[str, eviction.Policy]:
    """The page's policies, in its order. `no_sinks` is StreamingLLM with its sinks evicted: the window only."""
    return {"full": eviction.FullCache(), "random": eviction.RandomPolicy(),
            "streaming_llm": eviction.StreamingLLM(sinks=SINKS), "no_sinks": eviction.StreamingLLM(sinks=0),
            "h2o": eviction.H2O(), "observed": eviction.ObservedAttention(), "snapkv": eviction.SnapKV()}


def _r(x: float) -> float:
    return float(f"{x:.{DIGITS}g}")


def _bits(nats: float) -> float:
    return _r(nats / math.log(2))


def bake() -> dict:
    """What `kvx bake eviction` stores."""
    out = bake_for(load(MODEL))
    out["provenance"] = {"model": MODEL, "checkpoint_bits_per_byte": _r(card(MODEL)["full"]["bits_per_byte"])}
    return out


# ---- the sweep -----------------------------------------------------------------------------------
def sweep(model, ids, prefix: int, answer_positions=None) -> dict:
    """Every policy at every budget on one batch; the full cache's forward runs once.

    At 100% every policy keeps every prompt token (`keep` takes the top `prefix` of `prefix`), so its
    row there is the full cache's own, scored once (tests/compute check `evaluate` agrees)."""
    logits, weights, _ = model(ids, need_weights=True)
    full = eviction.evaluate(model, ids, prefix, eviction.FullCache(), 1.0, answer_positions=answer_positions,
                             full=(logits, weights))
    results = {}
    for name, policy in policies().items():
        rows = [full if name == "full" or fraction >= 1.0 else
                eviction.evaluate(model, ids, prefix, policy, fraction, answer_positions=answer_positions,
                                  full=(logits, weights))
                for fraction in BUDGETS]
        res = {"budget_tokens": [eviction.kept_count(prefix, f) for f in BUDGETS],
               "loss_bits": [_bits(r["loss"]) for r in rows],
               "top1": [_r(r["top1_agreement"]) for r in rows]}
        if answer_positions is not None:
            res["recall_byte_acc"] = [_r(r["recall_byte_acc"]) for r in rows]
            res["recall_exact"] = [_r(r["recall_exact"]) for r in rows]
        results[name] = res
    return {"results": results, "full_loss_bits": _bits(full["full_loss"]), "logits": logits,
            "weights": weights}


def _hex(mask: torch.Tensor) -> str:
    """A bool vector as hex, position 0 the most significant bit of the first digit (4 positions a digit)."""
    bits = "".join("1" if b else "0" for b in mask.tolist())
    bits += "0" * (-len(bits) % 4)
    return "".join(f"{int(bits[i:i + 4], 2):x}" for i in range(0, len(bits), 4))


def kept_masks(model, weights, prefix: int, row: int = 0) -> dict:
    """{policy: [budget][layer][kv head] hex mask of the kept prompt tokens} for one row of the batch.

    The same masks `evaluate` scores: `masks_for` on the whole batch with the same seeded generator."""
    out = {}
    for name, policy in policies().items():
        if name == "full":
            continue
        per_budget = []
        for fraction in BUDGETS:
            budget = eviction.kept_count(prefix, fraction)
            _, kept = eviction.masks_for(model, weights, prefix, policy, budget, torch.Generator().manual_seed(0))
            per_budget.append([[_hex(k[row, h]) for h in range(k.shape[1])] for k in kept])
        out[name] = per_budget
    return out


def recall_coverage(model, weights, ids, prefix: int) -> dict:
    """Why recall goes as it does, pooled over every recall sequence, layer and KV head.

    kept: per policy and budget, the share of the planted SECRET-line tokens kept (the masks `evaluate`
    scores: `masks_for` with the same seeded generator). on_lines: the lines' share of the prompt's tokens,
    and of the attention the questions pay the prompt with the full cache."""
    kv_heads, group = eviction.kv_groups(model)
    b = ids.shape[0]
    lines = torch.zeros(b, 1, prefix, dtype=torch.bool)
    for row in range(b):
        for start, end in needles(ids[row].tolist(), prefix):
            lines[row, 0, start:end] = True
    asked = torch.stack([w[:, :, prefix:, :prefix].sum(2) for w in weights])     # [L, B, H, P]
    on_lines = {"tokens": _r(lines.float().mean().item()),
                "questions": _r(((asked * lines).sum() / asked.sum()).item())}
    kept = {}
    for name, policy in policies().items():
        if name == "full":
            continue
        shares = []
        for fraction in BUDGETS:
            budget = eviction.kept_count(prefix, fraction)
            _, masks = eviction.masks_for(model, weights, prefix, policy, budget, torch.Generator().manual_seed(0))
            k = torch.stack(masks)                                   # [L, B, Hkv, P]
            shares.append(_r((k & lines).sum().item() / (lines.sum().item() * k.shape[0] * kv_heads)))
        kept[name] = shares
    return {"secret_tokens_kept": kept, "on_lines": on_lines}


# ---- attention maps -------------------------------------------------------------------------------
def display_chars(ids: list[int]) -> str:
    """One printable character per token, for labels: ␂ the start token, ⏎ a newline, ◆ a value byte."""
    out = []
    for t in ids:
        if t == BOS:
            out.append("␂")
        elif t == 10:
            out.append("⏎")
        elif t == 9:
            out.append("⇥")
        elif 32 <= t < 127:
            out.append(chr(t))
        elif t in data.VALUE_BYTES:
            out.append("◆")
        else:
            out.append("·")
    return "".join(out)


def needles(ids: list[int], prefix: int) -> list[list[int]]:
    """[start, end) of each planted `SECRET_k = "..."` line in the prompt."""
    text = bytes(t if t < 256 else 0 for t in ids[:prefix])
    spans, at = [], text.find(b"SECRET_")
    while at >= 0:
        end = text.find(b"\n", at)
        spans.append([at, (end if end >= 0 else prefix)])
        at = text.find(b"SECRET_", at + 1)
    return spans


def kv_group_mean(w: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[H, ...] -> [kv_heads, ...]: each KV head's query heads averaged."""
    return w.reshape(kv_heads, w.shape[0] // kv_heads, *w.shape[1:]).mean(1)


def attention_map(w: torch.Tensor, bin_size: int = MAP_BIN) -> list[float]:
    """One layer's [H, T, T] weights: mean over heads, each cell the mass a query in the row bin puts on
    the keys of the column bin (summed over keys, averaged over queries); lower triangle, row by row."""
    a = w.mean(0)
    t = a.shape[-1] - a.shape[-1] % bin_size
    n = t // bin_size
    cells = a[:t, :t].reshape(n, bin_size, n, bin_size).sum(-1).mean(1)
    return [_r(cells[i, j].item()) for i in range(n) for j in range(i + 1)]


def sink_shares(weights: list[torch.Tensor]) -> list[dict]:
    """The kernel's per-layer sink and heavy-hitter shares (eviction.summarize_weights), for the page."""
    return [{"layer": s["layer"], "first_token": _r(s["sink_mass"]), "first_4": _r(s["first_mass"]),
             "uniform_first_4": _r(s["uniform_first_mass"]), "top1pct": _r(s["top1pct_mass"])}
            for s in eviction.summarize_weights(weights, first=SINKS)]


# ---- decoding with a bounded cache ---------------------------------------------------------------------
DECODE_RULES = {
    "full": "keeps every token (the reference)",
    "random": "evicts a uniformly random cached token (never the newest)",
    "streaming_llm": f"keeps the first {SINKS} tokens and evicts the oldest of the rest (a rolling window)",
    "no_sinks": "evicts the oldest token (window attention: the sinks go first)",
    "h2o": (f"adds each step's attention to every cached token's running score and evicts the lowest-scored "
            f"token outside the {DECODE_H2O_RECENT} most recent"),
    "observed": ("adds each step's attention to every cached token's running score and evicts the token with the "
                 "lowest score per query that has seen it (kvpress's normalisation; no recent window)"),
    "snapkv": (f"keeps the prompt tokens SnapKV chose at the end of the prompt and evicts the oldest of the "
               f"rest (its {DECODE_SNAPKV_WINDOW}-token observation window, then the generated tokens)"),
}


def decode_policies() -> dict[str, eviction.Policy]:
    """The cut at the end of the prompt, with the decode simulation's settings."""
    p = policies()
    p["h2o"] = eviction.H2O(recent_share=0.5)
    p["snapkv"] = eviction.SnapKV(window=DECODE_SNAPKV_WINDOW)
    return p


@torch.no_grad()
def decode(model, ids: torch.Tensor, prompt: int = DECODE_PROMPT, budget: int = DECODE_BUDGET) -> dict:
    """Teacher-forced decoding of ids [1, T] with a bounded cache, for every policy at once (one row each).

    The prompt is prefilled with the full cache; at its end each policy keeps `budget` of its tokens per
    layer and KV head (its `keep`, with the decode settings). Then, for each later position t: the query
    at t attends to the cached tokens and itself (the evicted are masked out in every layer, so the
    hidden states of later layers see the bounded cache too), and the policy evicts one token to get
    back to `budget` (DECODE_RULES). H2O's score starts from the prompt's accumulated attention
    (sec. 4.1, Algorithm 1: accumulated attention, one eviction a step, half the budget for recent
    tokens); observed attention (kvpress's score) evicts greedily too, on the running score divided by the
    number of queries that have seen each token; SnapKV selects once at the end of the prompt (sec. 4.1,
    Listing 1) and never revisits it; StreamingLLM rolls its window past its sinks (sec. 3.2, Figure 4).

    Returns, per policy (`full` included, which never evicts): per layer and KV head, the prompt tokens
    kept at the end of the prompt (a hex mask) and the position evicted at each step (two hex digits a
    step, "ff": none); and each step's loss (bits), top-1 agreement with the full cache and predicted byte.
    """
    if ids.shape[1] > 255:
        raise ValueError(f"the decode simulation writes positions as two hex digits; length {ids.shape[1]} > 255")
    c = model.c
    kv_heads, group = eviction.kv_groups(model)
    t_all = ids.shape[1]
    names = [n for n in decode_policies() if n != "full"]
    rules = decode_policies()
    rows = len(names)
    logits, weights, _ = model(ids, need_weights=True)
    full_pred = logits[0].argmax(-1)
    targets = ids[0, 1:]
    full_loss = F.cross_entropy(logits[0, :-1], targets, reduction="none")

    kept = torch.zeros(rows, c.n_layers, kv_heads, t_all, dtype=torch.bool)
    score = torch.zeros(rows, c.n_layers, kv_heads, t_all)                 # H2O's accumulated attention
    protected = torch.zeros(rows, c.n_layers, kv_heads, t_all, dtype=torch.bool)   # SnapKV's selection
    victims = torch.full((rows, c.n_layers, kv_heads, t_all - prompt), -1, dtype=torch.long)
    cut = [[[None] * kv_heads for _ in range(c.n_layers)] for _ in range(rows)]
    for layer, w in enumerate(weights):
        pre = w[:, :, :prompt, :prompt].reshape(1, kv_heads, group, prompt, prompt).sum(2)
        for r, name in enumerate(names):
            keep = rules[name].keep(w[:, :, :prompt, :prompt], budget, torch.Generator().manual_seed(layer), group)[0]
            kept[r, layer, :, :prompt] = keep
            for h in range(kv_heads):
                cut[r][layer][h] = _hex(keep[h])
            if name in ("h2o", "observed"):
                score[r, layer, :, :prompt] = pre[0].sum(-2)
            if name == "snapkv":
                window = min(rules[name].window, prompt - 1)
                protected[r, layer, :, :prompt - window] = keep[:, :prompt - window]
    masks = [torch.ones(rows, c.n_heads, t_all, t_all, dtype=torch.bool) for _ in range(c.n_layers)]
    rng = torch.Generator().manual_seed(0)
    position = torch.arange(t_all)
    recent = int(budget * rules["h2o"].recent_share)
    steps = {n: {"loss_bits": [], "top1": [], "predicted": []} for n in names}
    for t in range(prompt, t_all):
        step = t - prompt + 1
        for layer in range(c.n_layers):
            see = kept[:, layer].clone()
            see[..., t] = True
            masks[layer][:, :, t, :] = see.repeat_interleave(group, 1)
        lg, ws, _ = model(ids[:, :t + 1].expand(rows, -1), need_weights=True,
                          masks=[m[:, :, :t + 1, :t + 1] for m in masks])
        if t + 1 < t_all:
            loss = F.cross_entropy(lg[:, t], targets[t].expand(rows), reduction="none")
            for r, name in enumerate(names):
                steps[name]["loss_bits"].append(_bits(loss[r].item()))
                steps[name]["top1"].append(int(lg[r, t].argmax().item() == full_pred[t].item()))
                steps[name]["predicted"].append(int(lg[r, t].argmax().item()))
        for layer, w in enumerate(ws):
            row = w[:, :, t, :t + 1].reshape(rows, kv_heads, group, t + 1).sum(2)     # [rows, Hkv, t+1]
            for r, name in enumerate(names):
                kept[r, layer, :, t] = True
                for h in range(kv_heads):
                    cached = kept[r, layer, h, :t + 1]
                    if name in ("h2o", "observed"):
                        score[r, layer, h, :t + 1] += row[r, h] * cached      # only what it attended to
                    if int(cached.sum()) <= budget:                            # not full yet: nothing to evict
                        continue
                    victim = _victim(name, cached, t, score[r, layer, h, :t + 1], protected[r, layer, h, :t + 1],
                                     position[:t + 1], rng, recent)
                    kept[r, layer, h, victim] = False
                    victims[r, layer, h, step - 1] = victim
    everything = _hex(torch.ones(prompt, dtype=torch.bool))
    out = {"full": {"cut": [[everything] * kv_heads for _ in range(c.n_layers)],
                    "victims": [["ff" * (t_all - prompt)] * kv_heads for _ in range(c.n_layers)],
                    "loss_bits": [_bits(x) for x in full_loss[prompt:].tolist()],
                    "top1": [1] * (t_all - prompt - 1),
                    "predicted": full_pred[prompt:t_all - 1].tolist()}}
    for r, name in enumerate(names):
        out[name] = {"cut": cut[r], "victims": [["".join(f"{v & 0xff:02x}" for v in head) for head in layer]
                                                for layer in victims[r].tolist()], **steps[name]}
    return {"policies": {n: out[n] for n in decode_policies()}}


def _victim(name: str, cached: torch.Tensor, t: int, score: torch.Tensor, protected: torch.Tensor,
            position: torch.Tensor, rng: torch.Generator, recent: int) -> int:
    """The token one policy evicts after the query at t attended (cached: bool over positions 0..t).

    Where a rule has no candidate (a budget no larger than the sinks, the recent window or the
    selection), it evicts the oldest cached token, so the cache never exceeds its budget."""
    older = cached.clone()
    older[t] = False                                                    # the newest token always stays
    if name == "random":
        candidates = older.nonzero().flatten()
        return candidates[torch.randint(len(candidates), (1,), generator=rng)].item()
    if name in ("streaming_llm", "no_sinks"):
        sinks = SINKS if name == "streaming_llm" else 0
        candidates = older & (position >= sinks)
    elif name == "h2o":
        candidates = older & (position <= t - recent)
        if candidates.any():
            return torch.where(candidates, score, torch.tensor(math.inf)).argmin().item()
    elif name == "observed":
        # Every query from j's entry to t saw cached token j: t − j + 1 of them (kvpress's divisor, P − j).
        per_query = score / (t - position + 1)
        return torch.where(older, per_query, torch.tensor(math.inf)).argmin().item()
    elif name == "snapkv":
        candidates = older & ~protected
    else:
        raise ValueError(f"no decode rule for {name!r}")
    if not candidates.any():
        candidates = older
    return candidates.nonzero().flatten().min().item()


# ---- everything ----------------------------------------------------------------------------------
@torch.no_grad()
def bake_for(model, seq_len: int = SEQ_LEN, text_sequences: int = TEXT_SEQUENCES,
             recall_sequences: int = RECALL_SEQUENCES, decode_length: int = DECODE_LENGTH,
             decode_prompt: int = DECODE_PROMPT, decode_budget: int = DECODE_BUDGET) -> dict:
    """The page's data for any GQA TinyLM (the tests pass a tiny random one)."""
    c = model.c
    kv_heads, _ = eviction.kv_groups(model)
    text = data.text_set(text_sequences, seq_len)
    text_prefix = seq_len - TEXT_CONTINUATION
    text_sweep = sweep(model, text, text_prefix)
    ids, pos = data.recall_set(recall_sequences, seq_len)
    recall_prefix = data.query_start(pos[0].tolist())
    recall_sweep = sweep(model, ids, recall_prefix, answer_positions=pos)
    weights = recall_sweep["weights"]
    shown = ids[0].tolist()
    received, accumulated = [], []
    for w in weights:
        q = w[0, :, recall_prefix:, :recall_prefix].mean(1)                  # [H, prefix]: from the questions
        received.append([[_r(x) for x in row] for row in kv_group_mean(q, kv_heads).tolist()])
        pre = w[0, :, :recall_prefix, :recall_prefix].sum(1)                 # [H, prefix]: over the prompt's queries
        score = pre.reshape(kv_heads, -1, recall_prefix).sum(1)             # H2O's score, per KV head
        accumulated.append([[_r(x) for x in row] for row in score.tolist()])
    dec_ids = data.text_set(1, decode_length, seed=DECODE_SEED)
    return {
        "config": {"n_layers": c.n_layers, "n_heads": c.n_heads, "n_kv_heads": kv_heads, "head_dim": c.head_dim,
                   "cache_numbers_per_token": c.cache_numbers_per_token(), "seq_len": seq_len},
        "budgets": list(BUDGETS),
        "policies": list(policies()),
        "settings": {"sinks": SINKS, "h2o_recent_share": eviction.H2O().recent_share, "kvpress": "0.5.5",
                     "snapkv_window": eviction.SnapKV().window, "snapkv_kernel": eviction.SnapKV().kernel,
                     "random_seed": 0},
        "text": {"sequences": text_sequences, "prefix": text_prefix, "continuation": seq_len - text_prefix,
                 "full_loss_bits": text_sweep["full_loss_bits"], "results": text_sweep["results"]},
        "recall": {"sequences": recall_sequences, "prefix": recall_prefix, "answer_bytes": int(pos.numel()),
                   "chance": _r(1 / len(data.VALUE_BYTES)), "full_loss_bits": recall_sweep["full_loss_bits"],
                   "results": recall_sweep["results"],
                   "coverage": recall_coverage(model, weights, ids, recall_prefix)},
        "shown": {"row": 0, "chars": display_chars(shown), "prefix": recall_prefix, "needles": needles(shown,
                                                                                                     recall_prefix),
                  "answers": pos[0].tolist(), "map_bin": MAP_BIN,
                  "map": [attention_map(w[0]) for w in weights],
                  "received": received, "accumulated": accumulated,
                  "kept": kept_masks(model, weights, recall_prefix)},
        "sinks": sink_shares(text_sweep["weights"]),
        "decode": {"length": decode_length, "prompt": decode_prompt, "budget": decode_budget,
                   "h2o_recent": DECODE_H2O_RECENT, "snapkv_window": DECODE_SNAPKV_WINDOW, "seed": DECODE_SEED,
                   "rules": DECODE_RULES, "chars": display_chars(dec_ids[0].tolist()),
                   "tokens": dec_ids[0].tolist(),
                   **decode(model, dec_ids, decode_prompt, decode_budget)},
    }
