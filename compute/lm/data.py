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


NEEDLE, SHOWN = 8, 2            # value length, and how much of it the question repeats
# Values are spelled in 64 byte values (0x80-0xBF) that are 0.013% of the corpus (UTF-8 continuation
# bytes in a few files), so a value cannot be guessed from the code around it: only a model that
# still holds the line where it was set can answer.
VALUE_BYTES = tuple(range(0x80, 0xC0))


def _secret_line(i: int, value: list[int]) -> list[int]:
    return list(f'SECRET_{i} = "'.encode()) + value + [ord('"'), ord("\n")]


def recall_sequence(data: bytes, length: int, rng: random.Random, needles: int = 4) -> tuple[list[int], list[int]]:
    """A key-value lookup in code: `SECRET_k = "<8 value bytes>"` lines planted in the first half of a
    stretch of stdlib code; at the end each key is asked for again with the first two bytes of its
    value, and the model must continue it (the needle and RULER-style tests of the eviction papers).

    Continuing a string seen earlier is what induction heads do, and it needs the value's own tokens
    still in the cache: evict them and the answer is a guess (1 in 64). All value bytes in a sequence
    are distinct. Returns the token ids and the positions of the bytes to recall (6 per needle).
    """
    pool = rng.sample(VALUE_BYTES, NEEDLE * needles)
    values = [pool[i * NEEDLE:(i + 1) * NEEDLE] for i in range(needles)]
    order = rng.sample(range(needles), needles)
    query, answers = [ord("\n")], []
    for i in order:
        line = _secret_line(i, values[i])
        first = len(query) + len(line) - 2 - NEEDLE               # the value's first byte
        answers.extend(range(first + SHOWN, first + NEEDLE))
        query += line
    filler = bytearray(data[(s := rng.randrange(0, len(data) - length)):s + length])
    room = length - 1 - len(query)                              # the prompt's length
    # In the first half, and early enough that the planted lines all end inside the prompt.
    spots = sorted(rng.sample(range(8, min(length // 2, room - needles * len(_secret_line(0, values[0])))),
                              needles), reverse=True)
    for spot, i in zip(spots, range(needles)):
        cut = filler.rfind(b"\n", 0, spot) + 1
        filler[cut:cut] = bytes(_secret_line(i, values[i]))
    body = list(filler[:room])
    offset = 1 + len(body)
    return [BOS] + body + query, [offset + a for a in answers]


def copy_sequence(length: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """A random run of 8-32 distinct value bytes, repeated to fill the sequence: every token after the
    first run is predictable only by copying, which is how induction heads are taught quickly
    (Olsson et al., 2022, use the same repeated random tokens to find them). Returns the ids and the
    predictable positions."""
    n = rng.randrange(8, 33)
    run = rng.sample(VALUE_BYTES, n)
    ids = [BOS] + (run * (length // n + 1))[:length - 1]
    return ids, list(range(1 + n, length))


def query_start(positions: list[int]) -> int:
    """Where the questions begin (from the first answer's position): a cache policy compresses the
    prompt before it, and the questions come after compression."""
    return positions[0] - SHOWN - len('\nSECRET_0 = "')


def batch_with_answers(split: str, size: int, length: int, rng: random.Random, recall_share: float,
                       copy_share: float = 0.0):
    """ids [size, length] and, per row, the positions whose loss is weighted (recall answers)."""
    data = corpus()[split]
    rows, answers = [], []
    for _ in range(size):
        r = rng.random()
        if r < copy_share:
            ids, _ = copy_sequence(length, rng)
            pos = []
        elif r < copy_share + recall_share:
            ids, pos = recall_sequence(data, length, rng)
        else:
            ids, pos = text_sequence(data, length, rng), []
        rows.append(ids)
        answers.append(pos)
    return torch.tensor(rows, dtype=torch.long), answers


def batch(split: str, size: int, length: int, rng: random.Random, recall_share: float):
    return batch_with_answers(split, size, length, rng, recall_share)[0]


def recall_set(n: int, length: int, seed: int = 1234):
    """A fixed held-out recall set: ids [n, length] and the answer positions [n, 4]."""
    rng = random.Random(seed)
    items = [recall_sequence(corpus()["heldout"], length, rng) for _ in range(n)]
    return torch.tensor([i for i, _ in items]), torch.tensor([p for _, p in items])


def text_set(n: int, length: int, seed: int = 4321):
    rng = random.Random(seed)
    return torch.tensor([text_sequence(corpus()["heldout"], length, rng) for _ in range(n)])
