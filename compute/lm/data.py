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
LOWER = "abcdefghijklmnopqrstuvwxyz"


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


NEEDLE, SHOWN = 8, 2            # needle length, and how much of it the question repeats


def recall_sequence(data: bytes, length: int, rng: random.Random, needles: int = 4) -> tuple[list[int], list[int]]:
    """Code with `SECRET_k = "<8 random letters>"` lines planted in the first half; at the end each
    needle is asked for again by its name and first two letters, and the model must continue it.

    Continuing a string seen earlier is what induction heads do, so a small model can learn it, and
    it needs the needle's own tokens still in the cache: evict them and the answer is a guess.
    Returns the token ids and the positions of the letters to recall (6 per needle).
    """
    secrets = ["".join(rng.choice(LOWER) for _ in range(NEEDLE)) for _ in range(needles)]
    order = rng.sample(range(needles), needles)
    lines = [f'\nSECRET_{i} = "{secrets[i]}"' for i in order]
    query = ("".join(lines) + "\n").encode()
    filler = bytearray(data[(s := rng.randrange(0, len(data) - length)):s + length])
    spots = sorted(rng.sample(range(8, length // 2), needles), reverse=True)
    for spot, i in zip(spots, range(needles)):
        cut = filler.rfind(b"\n", 0, spot) + 1
        filler[cut:cut] = f'SECRET_{i} = "{secrets[i]}"\n'.encode()
    body = bytes(filler[:length - 1 - len(query)])
    ids = [BOS] + list(body + query)
    positions, offset = [], len(ids) - len(query)
    for line in lines:
        first = offset + len(line) - 1 - NEEDLE            # the needle's first letter
        positions.extend(range(first + SHOWN, first + NEEDLE))
        offset += len(line)
    return ids, positions


def query_start(positions: list[int]) -> int:
    """Where the questions begin (from the first answer's position): a cache policy compresses the
    prompt before it, and the questions come after compression."""
    return positions[0] - SHOWN - len('\nSECRET_0 = "')


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
