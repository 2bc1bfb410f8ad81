"""The training data: the recall task can only be answered from the needle, and the copy runs only by copying."""
from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from kvx.compute.lm import data
from kvx.compute.lm.model import BOS

VALUES = set(data.VALUE_BYTES)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), length=st.sampled_from([256, 512]))
def test_each_answer_was_planted_once_before_the_questions(seed, length):
    ids, answers = data.recall_sequence(data.corpus()["heldout"], length, random.Random(seed))
    assert len(ids) == length and ids[0] == BOS and len(answers) == 4 * (data.NEEDLE - data.SHOWN)
    start = data.query_start(answers)
    assert bytes(ids[start:start + 8]) == b"\nSECRET_"
    for pos in answers:
        assert pos > start and ids[pos] in VALUES
        # The value byte and the byte before it occur together exactly once in the prompt: the needle.
        pairs = [i for i in range(1, start) if ids[i] == ids[pos] and ids[i - 1] == ids[pos - 1]]
        assert len(pairs) == 1
    planted = [t for t in ids[:start] if t in VALUES]
    assert len(set(planted)) >= 4 * data.NEEDLE      # every value byte is distinct (the corpus may add a few)


def test_the_recall_set_is_fixed():
    a_ids, a_pos = data.recall_set(3, 512)
    b_ids, b_pos = data.recall_set(3, 512)
    assert (a_ids == b_ids).all() and (a_pos == b_pos).all()


def test_value_bytes_are_rare_in_the_corpus():
    text = data.corpus()["train"]
    assert sum(text.count(bytes([b])) for b in data.VALUE_BYTES) / len(text) < 5e-4


@given(seed=st.integers(0, 10_000))
def test_copy_runs_repeat_exactly(seed):
    ids, predictable = data.copy_sequence(128, random.Random(seed))
    run = predictable[0] - 1
    assert len(ids) == 128 and ids[0] == BOS and 8 <= run <= 32
    assert len(set(ids[1:1 + run])) == run
    assert all(ids[i] == ids[i - run] for i in predictable)


def test_batches_weight_only_recall_answers():
    x, answers = data.batch_with_answers("train", 16, 256, random.Random(0), recall_share=0.5, copy_share=0.25)
    assert x.shape == (16, 256)
    for row, pos in zip(x.tolist(), answers):
        assert all(row[p] in VALUES for p in pos)
