"""The committed checkpoints: recorded, loadable, and good enough that eviction matters on them.

These load the trained models and never retrain. The figures they check were recorded by
`kvx train` in each model's JSON card.
"""
from __future__ import annotations

import pytest
import torch

from kvx.compute.kernels import crosslayer, eviction
from kvx.compute.lm import data
from kvx.compute.lm.train import CHECKPOINTS, CONFIGS, SEQ_LEN, card, evaluate, load

NAMES = sorted(CONFIGS)


@pytest.fixture(scope="module")
def models():
    return {name: load(name) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_is_small_and_carded(name):
    assert (CHECKPOINTS / f"{name}.pt").stat().st_size < 8 * 2 ** 20
    c = card(name)
    assert CONFIGS[name].__dict__ == {**CONFIGS[name].__dict__, **c["config"]}
    for key in ("bits_per_byte", "recall_byte_acc", "recall_exact"):
        assert key in c["full"] and key in c["window_32"]


@pytest.mark.parametrize("name", NAMES)
def test_model_clearly_beats_a_short_recent_window(name):
    """The acceptance rule: better held-out text loss and far better recall than a 32-token window."""
    c = card(name)
    assert c["full"]["bits_per_byte"] < c["window_32"]["bits_per_byte"] - 0.05
    assert c["full"]["recall_byte_acc"] > c["window_32"]["recall_byte_acc"] + 0.3


@pytest.mark.parametrize("name", NAMES)
def test_recorded_figures_reproduce_from_the_checkpoint(models, name):
    got = evaluate(models[name])
    assert got["bits_per_byte"] == pytest.approx(card(name)["full"]["bits_per_byte"], abs=0.02)   # fp16 weights


def test_the_models_form_an_attention_sink(models):
    ids = data.text_set(4, SEQ_LEN)
    summary = eviction.attention_summary(models["gqa-large"], ids)
    uniform = 1 / SEQ_LEN
    assert max(layer["sink_mass"] for layer in summary) > 20 * uniform


def test_keeping_sinks_and_window_beats_random_at_low_budget(models):
    ids, pos = data.recall_set(16, SEQ_LEN)
    prefix = data.query_start(pos[0].tolist())
    m = models["gqa-large"]
    full = eviction.evaluate(m, ids, prefix, eviction.FullCache(), 1.0, answer_positions=pos)
    snap = eviction.evaluate(m, ids, prefix, eviction.SnapKV(), 0.1, answer_positions=pos)
    stream = eviction.evaluate(m, ids, prefix, eviction.StreamingLLM(), 0.1, answer_positions=pos)
    assert full["recall_byte_acc"] > stream["recall_byte_acc"] + 0.3   # the needle is far back: a window loses it
    assert snap["loss"] < eviction.evaluate(m, ids, prefix, eviction.RandomPolicy(), 0.1,
                                             answer_positions=pos)["loss"]


def test_sharing_kv_across_layers_costs_loss(models):
    ids = data.text_set(4, SEQ_LEN)
    half = crosslayer.sharing_loss(models["gqa-large"], ids, 2)
    assert half["loss"] > half["own_loss"] and half["memory_fraction"] == 0.5


@pytest.mark.gpu
def test_kernels_agree_on_cuda_and_cpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    m = load("mla")
    ids = data.text_set(2, 128)
    torch.testing.assert_close(m.cuda()(ids.cuda()).cpu(), load("mla")(ids), atol=2e-3, rtol=2e-3)
