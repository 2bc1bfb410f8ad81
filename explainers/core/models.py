"""Model presets and the one formula every explainer uses for KV bytes per token.

Each preset's shape is copied from the model's published config.json (or paper, where noted).
Standard library only.
"""
from __future__ import annotations

import dataclasses

ATTENTION_KINDS = ("MHA", "GQA", "MQA", "MLA")


@dataclasses.dataclass(frozen=True)
class ModelPreset:
    slug: str
    title: str
    attention: str          # MHA, GQA, MQA or MLA
    layers: int
    q_heads: int
    kv_heads: int           # MLA: the number of query heads that share one latent (not cached per head)
    head_dim: int           # MHA/GQA/MQA: cached per KV head; MLA: per-head dim of the no-RoPE part
    params: float           # total parameters (all experts, for MoE), which is what the weights occupy
    max_context: int        # tokens the released model supports
    source: str
    kv_latent: int = 0      # MLA only: the cached compressed KV (kv_lora_rank)
    rope_dim: int = 0       # MLA only: the cached decoupled RoPE key (qk_rope_head_dim), shared by all heads
    active_params: float | None = None  # MoE: parameters used per token
    v_head_dim: int = 0     # MLA only: per-head value dim (0: same as head_dim); its query·key dim is head_dim + rope_dim
    # Mixture of experts (0 for dense models): routed experts per MoE layer, how many each token picks,
    # always-on shared experts, how many layers are MoE, and one routed expert's parameters
    # (3 × hidden × moe_intermediate_size: gate, up and down projections).
    experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    moe_layers: int = 0
    expert_params: float = 0

    def __post_init__(self):
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}; got {self.attention!r}.")
        if self.attention == "MLA" and not (self.kv_latent and self.rope_dim):
            raise ValueError(f"{self.slug}: an MLA model needs kv_latent and rope_dim.")
        if self.attention == "MHA" and self.kv_heads != self.q_heads:
            raise ValueError(f"{self.slug}: MHA has as many KV heads as query heads.")
        if self.attention == "MQA" and self.kv_heads != 1:
            raise ValueError(f"{self.slug}: MQA has one KV head.")
        if self.experts and not (0 < self.experts_per_token <= self.experts and 0 < self.moe_layers <= self.layers
                                 and self.expert_params > 0 and self.active_params):
            raise ValueError(f"{self.slug}: a mixture of experts needs experts_per_token in 1..experts, moe_layers "
                             f"in 1..layers, expert_params and active_params.")

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def attention_qk_dim(self) -> int:
        """Per-head dim of q·k: MLA scores over the no-RoPE part plus the decoupled RoPE key (DeepSeek-V2 sec. 2.1.3)."""
        return self.head_dim + self.rope_dim if self.attention == "MLA" else self.head_dim

    @property
    def attention_v_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def kv_elements_per_token(self) -> int:
        """Numbers cached per token, across all layers.

        MHA/GQA/MQA: a key and a value vector for each KV head in each layer.
        MLA: one latent plus one RoPE key per layer, shared by every head (DeepSeek-V2 paper, sec. 2.1.3).
        """
        if self.attention == "MLA":
            return self.layers * (self.kv_latent + self.rope_dim)
        return 2 * self.layers * self.kv_heads * self.head_dim

    def kv_bytes_per_token(self, bytes_per_element: float) -> float:
        return self.kv_elements_per_token * bytes_per_element

    def kv_formula(self) -> str:
        """The per-token formula for this attention kind, in words and symbols."""
        if self.attention == "MLA":
            return "layers × (latent + rope_dim) × bytes"
        return "2 (K and V) × layers × kv_heads × head_dim × bytes"


def _hf(repo: str) -> str:
    return f"Hugging Face {repo}, config.json"


_PRESETS = [
    ModelPreset("llama-3-8b", "Llama 3 8B", "GQA", 32, 32, 8, 128, 8.03e9, 131072,
                _hf("meta-llama/Llama-3.1-8B") + "; same shape as Llama 3 8B, whose context was 8,192"),
    ModelPreset("llama-3-70b", "Llama 3 70B", "GQA", 80, 64, 8, 128, 70.55e9, 131072,
                _hf("meta-llama/Llama-3.1-70B") + "; same shape as Llama 3 70B, whose context was 8,192"),
    ModelPreset("llama-3-405b", "Llama 3.1 405B", "GQA", 126, 128, 8, 128, 405.85e9, 131072,
                _hf("meta-llama/Llama-3.1-405B") + "; Llama 3 paper (2024), Table 3"),
    ModelPreset("qwen2.5-7b", "Qwen2.5 7B", "GQA", 28, 28, 4, 128, 7.61e9, 131072,
                _hf("Qwen/Qwen2.5-7B") + "; Qwen2.5 technical report, Table 1 (128K with YaRN, 32K native)"),
    ModelPreset("qwen2.5-14b", "Qwen2.5 14B", "GQA", 48, 40, 8, 128, 14.7e9, 131072,
                _hf("Qwen/Qwen2.5-14B") + "; Qwen2.5 technical report, Table 1"),
    ModelPreset("qwen2.5-32b", "Qwen2.5 32B", "GQA", 64, 40, 8, 128, 32.5e9, 131072,
                _hf("Qwen/Qwen2.5-32B") + "; Qwen2.5 technical report, Table 1"),
    ModelPreset("qwen2.5-72b", "Qwen2.5 72B", "GQA", 80, 64, 8, 128, 72.7e9, 131072,
                _hf("Qwen/Qwen2.5-72B") + "; Qwen2.5 technical report, Table 1"),
    # v0.3: v0.1 used a 4,096-token sliding window, which caps its cache; v0.2 and later do not.
    ModelPreset("mistral-7b", "Mistral 7B v0.3", "GQA", 32, 32, 8, 128, 7.25e9, 32768,
                _hf("mistralai/Mistral-7B-v0.3")),
    ModelPreset("deepseek-67b", "DeepSeek LLM 67B", "GQA", 95, 64, 8, 128, 67e9, 4096,
                "DeepSeek LLM paper (2024), Table 2; " + _hf("deepseek-ai/deepseek-llm-67b-base")),
    ModelPreset("deepseek-v2", "DeepSeek-V2", "MLA", 60, 128, 128, 128, 236e9, 131072,
                "DeepSeek-V2 paper (2024), sec. 2.1 and 3.1.2; " + _hf("deepseek-ai/DeepSeek-V2"),
                kv_latent=512, rope_dim=64, active_params=21e9, v_head_dim=128,
                # config.json: n_routed_experts 160, num_experts_per_tok 6, n_shared_experts 2,
                # first_k_dense_replace 1 (59 MoE layers of 60), moe_intermediate_size 1536, hidden_size 5120;
                # the paper's sec. 3.1.2 (model hyper-parameters) gives the same 2 shared + 160 routed, 6 active
                experts=160, experts_per_token=6, shared_experts=2, moe_layers=59, expert_params=3 * 5120 * 1536),
    ModelPreset("deepseek-v3", "DeepSeek-V3", "MLA", 61, 128, 128, 128, 671e9, 131072,
                "DeepSeek-V3 technical report (2024), sec. 4.2; " + _hf("deepseek-ai/DeepSeek-V3")
                + " (671B main model; the 14B multi-token-prediction module is not counted)",
                kv_latent=512, rope_dim=64, active_params=37e9, v_head_dim=128,
                # config.json: n_routed_experts 256, num_experts_per_tok 8, n_shared_experts 1,
                # first_k_dense_replace 3 (58 MoE layers of 61), moe_intermediate_size 2048, hidden_size 7168;
                # the report's sec. 4.2 (hyper-parameters) gives the same 1 shared + 256 routed, 8 active
                experts=256, experts_per_token=8, shared_experts=1, moe_layers=58, expert_params=3 * 7168 * 2048),
    # Older models, so that every attention kind has a preset, and one a paper computes with.
    ModelPreset("opt-13b", "OPT 13B", "MHA", 40, 40, 40, 128, 12.85e9, 2048,
                _hf("facebook/opt-13b") + "; the PagedAttention paper's example in sec. 3"),
    ModelPreset("llama-2-7b", "Llama 2 7B", "MHA", 32, 32, 32, 128, 6.74e9, 4096,
                _hf("meta-llama/Llama-2-7b-hf")),
    ModelPreset("falcon-7b", "Falcon 7B", "MQA", 32, 71, 1, 64, 6.92e9, 2048,
                _hf("tiiuae/falcon-7b") + " (multi_query: true)"),
    # The models the disaggregation papers measure (Splitwise: Llama-2-70B, BLOOM-176B; DistServe: OPT).
    ModelPreset("llama-2-70b", "Llama 2 70B", "GQA", 80, 64, 8, 128, 68.98e9, 4096,
                _hf("meta-llama/Llama-2-70b-hf") + "; parameters counted from it"),
    ModelPreset("bloom-176b", "BLOOM 176B", "MHA", 70, 112, 112, 128, 176.25e9, 2048,
                _hf("bigscience/bloom") + " (n_embed 14336, n_layer 70, 112 heads); 176B parameters"),
    ModelPreset("opt-66b", "OPT 66B", "MHA", 64, 72, 72, 128, 65.7e9, 2048,
                _hf("facebook/opt-66b") + " (hidden 9216, 72 heads); OPT paper (2022), Table 1"),
    ModelPreset("opt-175b", "OPT 175B", "MHA", 96, 96, 96, 128, 174.6e9, 2048,
                "OPT paper (Zhang et al., 2022), Table 1: 96 layers, 96 heads, d_model 12288 "
                "(weights released on request, not on the Hugging Face hub)"),
]

MODELS: dict[str, ModelPreset] = {m.slug: m for m in _PRESETS}
