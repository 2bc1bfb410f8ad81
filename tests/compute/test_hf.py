"""A Hugging Face checkpoint on disk loads into TinyLM and computes the same logits as transformers.

The checkpoints are tiny random models written by transformers itself (nothing is downloaded),
with every weight and bias perturbed so that a mis-mapped tensor cannot hide.
"""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, \
    Qwen2ForCausalLM

from kvx.compute.kernels import eviction
from kvx.compute.lm.hf import config_from_hf, load_hf

SHAPE = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5)


@pytest.mark.parametrize("config_cls,model_cls,extra", [
    (LlamaConfig, LlamaForCausalLM, {"tie_word_embeddings": False}),
    (Qwen2Config, Qwen2ForCausalLM, {"tie_word_embeddings": True}),
    (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
])
def test_loaded_checkpoint_matches_transformers(tmp_path, config_cls, model_cls, extra):
    torch.manual_seed(0)
    hf = model_cls(config_cls(**SHAPE, **extra, attn_implementation="eager")).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.02 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path)
    ids = torch.randint(0, 300, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)
    # and the eviction machinery runs on it unchanged
    r = eviction.evaluate(ours, ids, 32, eviction.FullCache(), 1.0)
    assert r["loss"] == pytest.approx(r["full_loss"], abs=1e-5)


def test_unsupported_checkpoints_say_why():
    with pytest.raises(ValueError, match="model_type must be one of llama, mistral, qwen2; got 'gpt2'"):
        config_from_hf({"model_type": "gpt2"})
    base = {"model_type": "llama", **SHAPE, "num_attention_heads": 4}
    with pytest.raises(ValueError, match="only plain RoPE"):
        config_from_hf({**base, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
