"""Training text every machine has: the Python standard library's own sources, as bytes.

Plus a synthetic long-range recall task in code-like text (a needle the model must copy from far
back), mixed into training and evaluation so that which tokens an eviction policy keeps changes
accuracy, as needle and RULER-style tests do. Deterministic: files in sorted order, a seeded RNG.
"""
from __future__ import annotations

import hashlib
import random
import sysconfig
import zlib
from functools import cache
from pathlib import Path

import torch

from kvx.compute.lm.model import BOS

SKIP_PARTS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
HEX, ALNUM = "0123456789abcdef", "abcdefghijklmnopqrstuvwxyz0123456789"


@cache
def corpus() -> dict[str, bytes]:
    """{"train": ..., "heldout": ...}: stdlib .py files, one in ten held out by a hash of its path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = {"train": [], "heldout": []}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if SKIP_PARTS & set(path.relative_to(root).parts):
            continue
        split = "heldout" if zlib.crc32(rel.encode()) % 10 == 0 else "train"
        parts[split].append(path.read_bytes())
    return {k: b"\n".join(v) for k, v in parts.items()}


def corpus_digest() -> str:
    c = corpus()
    return hashlib.sha256(c["train"] + b"\0" + c["heldout"]).hexdigest()[:16]


def text_sequence(data: bytes, length: int, rng: random.Random) -> list[int]:
    start = rng.randrange(0, len(data) - length)
    return [BOS] + list(data[start:start + length - 1])


def recall_sequence(data: bytes, length: int, rng: random.Random, pairs: int = 4) -> tuple[list[int], list[int]]:
    """Code with `KEY_xxxx = "vvvv"` lines planted early and `assert KEY_xxxx == "vvvv"` at the end.

    Returns the token ids and the positions of the four value bytes the model must recall.
    """
    keys = ["".join(rng.choice(HEX) for _ in range(4)) for _ in range(pairs)]
    values = ["".join(rng.choice(ALNUM) for _ in range(4)) for _ in range(pairs)]
    asked = rng.randrange(pairs)
    query = f'\nassert KEY_{keys[asked]} == "{values[asked]}"\n'.encode()
    filler = bytearray(data[(s := rng.randrange(0, len(data) - length)):s + length])
    # Plant the definitions at line starts in the first half, so the recall spans hundreds of tokens.
    spots = sorted(rng.sample(range(8, length // 2), pairs), reverse=True)
    for spot, k, v in zip(spots, keys, values):
        cut = filler.rfind(b"\n", 0, spot) + 1
        filler[cut:cut] = f'KEY_{k} = "{v}"\n'.encode()
    body = bytes(filler[:length - 1 - len(query)])
    ids = [BOS] + list(body + query)
    value_end = len(ids) - 2                     # the closing quote sits before the final newline
    return ids, list(range(value_end - 4, value_end))


def batch(split: str, size: int, length: int, rng: random.Random, recall_share: float):
    data = corpus()[split]
    rows = [recall_sequence(data, length, rng)[0] if rng.random() < recall_share else text_sequence(data, length, rng)
            for _ in range(size)]
    return torch.tensor(rows, dtype=torch.long)


def recall_set(n: int, length: int, seed: int = 1234):
    """A fixed held-out recall set: ids [n, length] and the answer positions [n, 4]."""
    rng = random.Random(seed)
    items = [recall_sequence(corpus()["heldout"], length, rng) for _ in range(n)]
    return torch.tensor([i for i, _ in items]), torch.tensor([p for _, p in items])


def text_set(n: int, length: int, seed: int = 4321):
    rng = random.Random(seed)
    return torch.tensor([text_sequence(corpus()["heldout"], length, rng) for _ in range(n)])
