"""Our eviction policies against kvpress's presses (NVIDIA kvpress 0.5.5), on the same attention maps.

A tiny random Llama (built from a transformers config, nothing downloaded) runs one eager prefill. In each
layer a forward hook hands the press exactly what kvpress's own hook (BasePress.forward_hook) hands it: the
layer's hidden states, its cache and its attention weights. The press compresses the cache; the kept
positions are read back by matching the surviving key rows against the full cache's. Our policy gets the same
attention weights, and must keep the same positions in every layer, sequence and KV head.

kvpress 0.5.5 declares transformers<5.3; the transformers here passes the cache to attention as `cache`
where kvpress's hook reads `past_key_values`, and it no longer passes `cache_position`. The hook below adds
those two names and then calls kvpress's forward_hook itself, so everything else is kvpress's code.
kvpress imports `datasets` and `fire` at import time only for DuoAttention's downloads and a training
script, neither used here: they are stubbed when absent (see the Makefile's setup for how kvpress is
installed: with --no-deps, so that pip leaves torch and transformers alone).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest
import torch
import transformers

for _name in ("datasets", "fire"):
    if importlib.util.find_spec(_name) is None:
        _stub = types.ModuleType(_name)
        _stub.load_dataset = None
        sys.modules[_name] = _stub
try:
    import kvpress
except ImportError as e:           # not a skip: CI must run these
    raise ImportError("kvpress is missing: `make setup` installs it (pip install --no-deps kvpress==<the "
                      "Makefile's KVPRESS pin>)") from e

from kvx.compute.kernels import eviction  # noqa: E402

PIN = re.search(r"^KVPRESS := kvpress==(\S+)$", (Path(__file__).parents[2] / "Makefile").read_text(), re.M).group(1)

HEADS, KV_HEADS = 4, 2
pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=128,
                                      max_position_embeddings=512,
                                      initializer_range=0.5)    # peaked attention: ranks are far from ties
    config._attn_implementation = "eager"                     # attention weights, as kvpress requires
    return transformers.LlamaForCausalLM(config).eval()


def ids_for(length: int, batch: int = 2, seed: int = 1):
    return torch.randint(0, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def press_run(model, press, ids):
    """Prefill `ids` with `press` applied by kvpress's own hook. Returns per layer the attention weights the
    press saw [B, H, P, P] and the positions it kept (bool [B, Hkv, P])."""
    full_cache = transformers.DynamicCache()
    model(ids, past_key_values=full_cache, use_cache=True)
    full_keys = [layer.keys.clone() for layer in full_cache.layers]

    seen = {}

    def hook(module, args, kwargs, output):
        q_len = kwargs["hidden_states"].shape[1]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        adapted = {**kwargs, "past_key_values": cache, "cache_position": torch.arange(q_len)}
        seen[module.layer_idx] = output[1].clone()
        return press.forward_hook(module, args, adapted, output)

    cache = transformers.DynamicCache()
    hooks = [layer.self_attn.register_forward_hook(hook, with_kwargs=True) for layer in model.model.layers]
    try:
        model(ids, past_key_values=cache, use_cache=True)
    finally:
        for h in hooks:
            h.remove()
    out = []
    for i, layer in enumerate(cache.layers):
        match = (layer.keys[:, :, :, None, :] == full_keys[i][:, :, None, :, :]).all(-1)   # [B, Hkv, kept, P]
        assert (match.sum(-1) == 1).all(), "every surviving key row is one position of the full cache"
        out.append((seen[i], match.any(-2)))
    return out


def ours(policy, weights, kept_tokens):
    return policy.keep(weights, kept_tokens, None, group=HEADS // KV_HEADS)


@pytest.mark.parametrize("ratio", [0.1, 0.3, 0.5, 0.65, 0.8, 0.9, 0.95])
@pytest.mark.parametrize("make", [
    pytest.param(lambda r: (kvpress.StreamingLLMPress(compression_ratio=r), eviction.StreamingLLM(sinks=4)),
                 id="streaming_llm"),
    pytest.param(lambda r: (kvpress.StreamingLLMPress(compression_ratio=r, n_sink=1), eviction.StreamingLLM(sinks=1)),
                 id="streaming_llm-1-sink"),
    pytest.param(lambda r: (kvpress.ObservedAttentionPress(compression_ratio=r), eviction.ObservedAttention()),
                 id="observed"),
    pytest.param(lambda r: (kvpress.SnapKVPress(compression_ratio=r), eviction.SnapKV()), id="snapkv"),
    pytest.param(lambda r: (kvpress.SnapKVPress(compression_ratio=r, window_size=16, kernel_size=7),
                            eviction.SnapKV(window=16, kernel=7)), id="snapkv-16-7"),
])
def test_each_kvpress_policy_keeps_the_press_tokens(llama, make, ratio):
    press, policy = make(ratio)
    length = 150
    for weights, kept in press_run(llama, press, ids_for(length)):
        n_kept = kvpress.utils.compute_n_kept(length, ratio)
        assert (kept.sum(-1) == n_kept).all()
        assert torch.equal(ours(policy, weights, n_kept), kept), (policy.name, ratio)


def test_snapkv_below_its_window_keeps_what_the_press_keeps(llama):
    """95% of 150 keeps 7 tokens, fewer than the 64-token window: only window tokens, picked among equal
    scores by torch.topk, in kvpress and here alike."""
    (weights, kept), _ = press_run(llama, kvpress.SnapKVPress(compression_ratio=0.95), ids_for(150))
    assert kept[..., :150 - 64].sum() == 0 and (kept.sum(-1) == 7).all()
    assert torch.equal(ours(eviction.SnapKV(), weights, 7), kept)


def test_the_installed_kvpress_is_the_pinned_one():
    assert importlib.metadata.version("kvpress") == PIN == "0.5.5"


def test_kvpress_defaults_are_ours():
    assert (kvpress.SnapKVPress().window_size, kvpress.SnapKVPress().kernel_size) == (64, 5)
    assert (eviction.SnapKV().window, eviction.SnapKV().kernel) == (64, 5)
    assert kvpress.StreamingLLMPress().n_sink == eviction.StreamingLLM().sinks == 4


@pytest.mark.parametrize("length", [5, 21, 100, 150, 423, 448, 450, 511])
@pytest.mark.parametrize("fraction", [0.05, 0.1, 0.2, 0.35, 0.5, 0.9, 1.0])
def test_kept_counts_are_whole_tokens_as_kvpress_counts_them(length, fraction):
    assert eviction.kept_count(length, fraction) == kvpress.utils.compute_n_kept(length, 1 - fraction)


def test_kept_counts_pinned():
    """kvpress floors, and 1 − (1 − f) is not f in floating point: the page's budgets keep these counts."""
    assert [eviction.kept_count(423, f) for f in (0.05, 0.1, 0.2, 0.35, 0.5, 1.0)] == [21, 42, 84, 148, 211, 423]
    assert eviction.kept_count(450, 0.1) == 44                 # 450 × 0.0999… = 44.99…, not 45
    assert eviction.kept_count(10, 0.01) == 1                  # never an empty cache


def test_h2o_is_not_observed_attention(llama):
    """H2O as its paper states it (summed attention + a recent half) and kvpress's ObservedAttentionPress
    (attention ÷ queries that see each token, no window) keep different tokens on the same maps."""
    (weights, kept), _ = press_run(llama, kvpress.ObservedAttentionPress(compression_ratio=0.7), ids_for(150))
    n = int(kept.sum(-1)[0, 0])
    h2o = ours(eviction.H2O(), weights, n)
    assert not torch.equal(h2o, kept)
    assert h2o[..., -(n // 2):].all()                           # H2O's recent window; the press has none
