"""Load a Hugging Face checkpoint that is already on disk (Llama, Mistral or Qwen2 layout) into TinyLM.

The kernels and the eviction experiments then run on it unchanged. Nothing is downloaded: the path
must hold config.json and *.safetensors. Hugging Face applies RoPE to the two halves of each head
("rotate_half") where TinyLM rotates interleaved pairs; permuting the rows of each head of W_q and
W_k turns one into the other and leaves every attention score the same.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from kvx.compute.lm.model import LMConfig, TinyLM

SUPPORTED = ("llama", "mistral", "qwen2")


def config_from_hf(cfg: dict, name: str = "hf") -> LMConfig:
    kind = cfg.get("model_type")
    if kind not in SUPPORTED:
        raise ValueError(f"model_type must be one of {', '.join(SUPPORTED)}; got {kind!r}.")
    scaling = cfg.get("rope_scaling") or {}
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        raise ValueError(f"only plain RoPE is supported; this checkpoint uses rope_scaling {scaling}.")
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", kind != "qwen2"):
        raise ValueError("sliding-window attention is not supported; this checkpoint sets sliding_window.")
    heads = cfg["num_attention_heads"]
    return LMConfig(
        name=name, attention="gqa", d_model=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"], n_heads=heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        n_kv_heads=cfg.get("num_key_value_heads", heads), max_len=cfg.get("max_position_embeddings", 4096),
        rope_base=float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
        vocab=cfg["vocab_size"], mlp_hidden=cfg["intermediate_size"], norm_eps=cfg.get("rms_norm_eps", 1e-6),
        qkv_bias=kind == "qwen2" or bool(cfg.get("attention_bias")), tie_embeddings=bool(cfg.get("tie_word_embeddings")),
    )


def _half_to_interleaved(w: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Reorder each head's rows from (first halves, second halves) to (pairs), for W_q/W_k and biases."""
    order = torch.stack([torch.arange(head_dim // 2), torch.arange(head_dim // 2) + head_dim // 2], -1).flatten()
    return w.reshape(heads, head_dim, *w.shape[1:])[:, order].reshape(w.shape)


def load_hf(path: str | Path, max_len: int | None = None) -> TinyLM:
    from safetensors.torch import load_file     # the `hf` extra

    path = Path(path)
    config = config_from_hf(json.loads((path / "config.json").read_text()), name=path.name)
    if max_len:
        config = LMConfig(**{**config.__dict__, "max_len": max_len})
    weights = {}
    for f in sorted(path.glob("*.safetensors")):
        weights.update(load_file(f))
    if not weights:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    weights = {k.removeprefix("model."): v.float() for k, v in weights.items()}
    c = config
    state = {"embed.weight": weights["embed_tokens.weight"], "norm.weight": weights["norm.weight"]}
    if not c.tie_embeddings:
        state["head.weight"] = weights.get("lm_head.weight", weights["embed_tokens.weight"])
    for i in range(c.n_layers):
        p = f"layers.{i}."
        b = f"blocks.{i}."
        for ours, theirs, heads in (("wq", "q_proj", c.n_heads), ("wk", "k_proj", c.n_kv_heads), ("wv", "v_proj", 0),
                                    ("wo", "o_proj", 0)):
            for part in ("weight", "bias"):
                w = weights.get(f"{p}self_attn.{theirs}.{part}")
                if w is None:
                    continue
                state[f"{b}attn.{ours}.{part}"] = _half_to_interleaved(w, heads, c.head_dim) if heads else w
        state[f"{b}up.weight"] = torch.cat([weights[f"{p}mlp.gate_proj.weight"], weights[f"{p}mlp.up_proj.weight"]])
        state[f"{b}down.weight"] = weights[f"{p}mlp.down_proj.weight"]
        state[f"{b}norm1.weight"] = weights[f"{p}input_layernorm.weight"]
        state[f"{b}norm2.weight"] = weights[f"{p}post_attention_layernorm.weight"]
    model = TinyLM(c)
    model.load_state_dict(state)
    return model.eval()
