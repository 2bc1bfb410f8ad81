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
def test_model_is_accepted_only_if_it_needs_its_context(name):
    """Each model clearly beats a 32-token recent window on held-out text, and answers the recall task
    (a value planted hundreds of tokens back) almost always with its full cache and at chance (1/64)
    with the window: so which tokens a policy keeps decides whether the answer survives."""
    c = card(name)
    assert c["full"]["bits_per_byte"] < c["window_32"]["bits_per_byte"] - 0.05
    assert c["full"]["recall_byte_acc"] > 0.95 and c["full"]["recall_exact"] > 0.9
    assert c["window_32"]["recall_byte_acc"] < 0.05


@pytest.mark.parametrize("name", NAMES)
def test_recorded_figures_reproduce_from_the_checkpoint(models, name):
    got = evaluate(models[name])
    assert got["bits_per_byte"] == pytest.approx(card(name)["full"]["bits_per_byte"], abs=0.02)   # fp16 weights


def test_an_attention_sink_forms_on_the_first_token(models):
    """Every sequence starts with BOS; in some layer late queries put over 10% of their attention on it,
    more than 50 times an even spread over 512 keys."""
    ids = data.text_set(4, SEQ_LEN)
    summary = eviction.attention_summary(models["gqa-large"], ids)
    assert max(layer["sink_mass"] for layer in summary) > 50 / SEQ_LEN


def test_trained_in_sharing_keeps_quality_that_imposed_sharing_loses(models):
    """gqa-cla2 (1:2 sharing built in, same data and steps) caches half of gqa-large's KV at almost the
    same loss; imposing 1:2 on gqa-large after training costs several times more."""
    ids = data.text_set(4, SEQ_LEN)
    large, cla = models["gqa-large"], models["gqa-cla2"]
    assert cla.c.cache_numbers_per_token() * 2 == large.c.cache_numbers_per_token()
    imposed = crosslayer.sharing_loss(large, ids, 2)
    trained_in = crosslayer.sharing_loss(cla, ids, 1)["own_loss"]
    assert trained_in - imposed["own_loss"] < 0.05
    assert imposed["loss"] - imposed["own_loss"] > 0.2


def test_attention_concentrates_on_heavy_hitters(models):
    """In some layer the top 1% of keys receive over 40% of the attention of late queries."""
    ids = data.text_set(4, SEQ_LEN)
    summary = eviction.attention_summary(models["gqa-large"], ids)
    assert max(layer["top1pct_mass"] for layer in summary) > 0.4


def test_attention_scored_policies_beat_random_at_low_budget(models):
    ids = data.text_set(8, SEQ_LEN)
    prefix = SEQ_LEN - 64
    m = models["gqa-large"]
    snap = eviction.evaluate(m, ids, prefix, eviction.SnapKV(), 0.1)
    rand = eviction.evaluate(m, ids, prefix, eviction.RandomPolicy(), 0.1)
    assert snap["loss"] < rand["loss"] - 0.05 and snap["top1_agreement"] > rand["top1_agreement"]
    assert snap["full_loss"] <= rand["loss"]


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
