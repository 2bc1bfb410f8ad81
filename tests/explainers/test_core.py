"""The shared presets and the one formula for KV bytes per token, pinned to exact numbers."""
from __future__ import annotations

import dataclasses

import pytest

from kvx.explainers.core.dtypes import dtype_bits, dtype_bytes, dtype_label
from kvx.explainers.core.flops import attention_flops, dense_flops, prefill_flops
from kvx.explainers.core.gpus import GPUS
from kvx.explainers.core.links import LINKS
from kvx.explainers.core.models import MODELS, ModelPreset
from kvx.explainers.core.params import Params, ParamError, choice, integer, number
from kvx.explainers.core.units import bytes_both, bytes_iec, bytes_si

# Bytes per token at 2 bytes per number, worked out by hand from each config.json:
# 2 * layers * kv_heads * head_dim * 2 for MHA/GQA/MQA, layers * (latent + rope) * 2 for MLA.
FP16_BYTES_PER_TOKEN = {
    "llama-3-8b": 2 * 32 * 8 * 128 * 2,        # 131,072
    "llama-3-70b": 327_680,                   # the seed figure: 320 KiB
    "llama-3-405b": 2 * 126 * 8 * 128 * 2,    # 516,096
    "qwen2.5-7b": 2 * 28 * 4 * 128 * 2,       # 57,344
    "qwen2.5-14b": 2 * 48 * 8 * 128 * 2,      # 196,608
    "qwen2.5-32b": 2 * 64 * 8 * 128 * 2,      # 262,144
    "qwen2.5-72b": 2 * 80 * 8 * 128 * 2,      # 327,680
    "mistral-7b": 2 * 32 * 8 * 128 * 2,       # 131,072
    "deepseek-67b": 2 * 95 * 8 * 128 * 2,     # 389,120
    "deepseek-v2": 60 * (512 + 64) * 2,       # 69,120
    "deepseek-v3": 61 * (512 + 64) * 2,       # 70,272
    "opt-13b": 819_200,                       # PagedAttention sec. 3: "800 KB" (2 * 5120 * 40 * 2)
    "llama-2-7b": 524_288,                    # the well-known 0.5 MiB per token
    "falcon-7b": 2 * 32 * 1 * 64 * 2,         # 8,192: one KV head (MQA)
    "llama-2-70b": 327_680,                   # same KV shape as Llama 3 70B: 80 layers x 8 KV heads x 128
    "bloom-176b": 2 * 70 * 14_336 * 2,        # 4,014,080: MHA, 112 heads x 128 = 14,336
    "opt-66b": 2 * 64 * 9_216 * 2,            # 2,359,296; x 512 tokens = 1.21 GB = 1.125 GiB (DistServe's "1.13GB")
    "opt-175b": 2 * 96 * 12_288 * 2,          # 4,718,592 = 4.5 MiB
}


def test_every_model_preset_is_pinned():
    assert set(FP16_BYTES_PER_TOKEN) == set(MODELS)


@pytest.mark.parametrize("slug", sorted(FP16_BYTES_PER_TOKEN))
def test_kv_bytes_per_token_fp16(slug):
    assert MODELS[slug].kv_bytes_per_token(dtype_bytes("fp16")) == FP16_BYTES_PER_TOKEN[slug]


def test_gqa_uses_kv_heads_not_query_heads():
    """The mistake online calculators make most: 64 query heads would give 8x the bytes."""
    m = MODELS["llama-3-70b"]
    assert m.q_heads == 64 and m.kv_heads == 8
    wrong = 2 * m.layers * m.q_heads * m.head_dim * 2
    assert wrong == 8 * m.kv_bytes_per_token(2) == 2_621_440


def test_mla_caches_latent_plus_rope_once_per_layer():
    """DeepSeek-V2 paper Table 1: MLA caches (d_c + d_h^R) * l = 4.5 d_h * l numbers per token."""
    m = MODELS["deepseek-v2"]
    assert m.kv_elements_per_token == m.layers * (512 + 64) == 4.5 * m.head_dim * m.layers
    # ... which with 6-bit elements against DeepSeek 67B in BF16 is the paper's "93.3% smaller" figure.
    ratio = m.kv_bytes_per_token(6 / 8) / MODELS["deepseek-67b"].kv_bytes_per_token(2)
    assert round((1 - ratio) * 100, 1) == 93.3


def test_every_attention_kind_has_a_preset():
    assert {m.attention for m in MODELS.values()} == {"MHA", "GQA", "MQA", "MLA"}


@pytest.mark.parametrize("bad", [
    dict(attention="MHA", q_heads=32, kv_heads=8),
    dict(attention="MQA", q_heads=32, kv_heads=2),
    dict(attention="MLA", kv_latent=0, rope_dim=0),
    dict(attention="XYZ"),
])
def test_model_preset_rejects_inconsistent_shapes(bad):
    base = dict(slug="x", title="x", attention="GQA", layers=2, q_heads=4, kv_heads=2, head_dim=8, params=1e6,
                max_context=128, source="test")
    with pytest.raises(ValueError):
        ModelPreset(**{**base, **bad})


def test_gpu_presets_have_datasheet_figures():
    required = {"h100-sxm", "h200", "b200", "a100-80gb", "l40s", "rtx-4090", "mi300x"}
    assert required <= set(GPUS)
    assert GPUS["h100-sxm"].memory_bytes == 80e9
    assert (GPUS["h100-sxm"].bandwidth_gbs, GPUS["h100-sxm"].bf16_tflops) == (3350, 989)
    assert GPUS["mi300x"].memory_gb == 192
    for g in GPUS.values():
        assert g.memory_gb > 0 and g.bandwidth_gbs > 0 and g.bf16_tflops > 0 and g.source


def test_presets_name_their_sources():
    assert all(m.source for m in MODELS.values())


@pytest.mark.parametrize("name,bits", [("fp32", 32), ("bf16", 16), ("fp16", 16), ("fp8", 8), ("int8", 8),
                                        ("int4", 4), ("fp4", 4), ("4.5", 4.5), ("4.25", 4.25), ("1", 1)])
def test_dtype_bits(name, bits):
    assert dtype_bits(name) == bits
    assert dtype_bytes(name) == bits / 8


@pytest.mark.parametrize("bad", ["fp3", "0.5", "33", "", "nan"])
def test_dtype_rejects_unknown_and_out_of_range(bad):
    with pytest.raises(ValueError, match="between 1 and 32"):
        dtype_bits(bad)


def test_dtype_label():
    assert dtype_label("fp8") == "fp8 (1 bytes)"
    assert dtype_label("4.5") == "4.5 bits (0.5625 bytes)"


def test_bytes_say_which_unit():
    assert bytes_si(41_943_040_000) == "41.9 GB"
    assert bytes_iec(41_943_040_000) == "39.1 GiB"
    assert bytes_iec(327_680) == "320.0 KiB"
    assert bytes_both(2 ** 30) == "1.1 GB = 1.0 GiB"


@dataclasses.dataclass(frozen=True)
class Demo(Params):
    n: int = integer(3, unit="tokens", min=1, max=10, help="n")
    x: float = number(0.5, unit="GB", min=0, max=1, help="x")
    c: str = choice("a", ("a", "b"), help="c")
    o: float | None = number(None, unit="GB", min=1, max=2, optional=True, help="o")


@pytest.mark.parametrize("kwargs,field,message", [
    (dict(n=0), "n", "n must be between 1 and 10 tokens; got 0."),
    (dict(n=2.5), "n", "n must be a whole number between 1 and 10 tokens; got 2.5."),
    (dict(n="many"), "n", "n must be a number between 1 and 10 tokens; got 'many'."),
    (dict(x=1.5), "x", "x must be between 0 and 1 GB; got 1.5."),
    (dict(x=float("inf")), "x", "x must be between 0 and 1 GB; got inf."),
    (dict(c="z"), "c", "c must be one of a, b; got 'z'."),
    (dict(o=3), "o", "o must be between 1 and 2 GB; got 3."),
    (dict(n=True), "n", "n must be a number between 1 and 10 tokens; got True."),
])
def test_bad_values_raise_one_sentence_naming_the_field(kwargs, field, message):
    with pytest.raises(ParamError) as err:
        Demo(**kwargs)
    assert err.value.field == field
    assert str(err.value) == message


def test_from_mapping_converts_text_and_keeps_defaults():
    p = Demo.from_mapping({"n": "7", "x": "", "o": "auto"})
    assert (p.n, p.x, p.c, p.o) == (7, 0.5, "a", None)
    assert isinstance(p.n, int)


def test_from_mapping_rejects_unknown_names():
    with pytest.raises(ParamError, match="zz is not a parameter; the parameters are n, x, c, o."):
        Demo.from_mapping({"zz": 1})


def test_an_integer_can_be_optional():
    @dataclasses.dataclass(frozen=True)
    class WithLayers(Params):
        layers: int | None = integer(None, unit="layers", min=1, max=8, help="layers", optional=True)

    assert WithLayers().layers is None and WithLayers.from_mapping({"layers": "auto"}).layers is None
    assert WithLayers.from_mapping({"layers": "3"}).layers == 3
    with pytest.raises(ParamError, match="layers must be a whole number between 1 and 8 layers; got 2.5."):
        WithLayers(layers=2.5)


def test_describe_lists_name_default_bounds_unit_help():
    described = {d["name"]: d for d in Demo.describe()}
    assert described["n"] == {"name": "n", "kind": "integer", "default": 3, "min": 1, "max": 10, "unit": "tokens",
                              "help": "n", "choices": [], "optional": False}
    assert described["c"]["choices"] == ["a", "b"]


# Links, one way, in bytes per second: Gb/s ÷ 8. GPU datasheets print both directions added together.
LINK_BYTES_PER_S = {
    "nvlink-4": 450e9,       # H100 SXM: "900 GB/s" is both directions
    "nvlink-3": 300e9,       # A100 SXM: "600 GB/s" is both directions
    "ib-ndr-400g": 50e9,     # 400 Gb/s
    "ib-hdr-200g": 25e9,     # 200 Gb/s
    "roce-200g": 25e9,
    "roce-100g": 12.5e9,
    "eth-25g": 3.125e9,      # 25 Gb/s
    "pcie-5-x16": 63e9,      # 32 GT/s x 16 x 128/130 / 8
}


def test_every_link_preset_is_pinned_one_way_in_bytes():
    assert set(LINK_BYTES_PER_S) == set(LINKS)
    for slug, bps in LINK_BYTES_PER_S.items():
        assert LINKS[slug].bytes_per_s == bps, slug
        assert LINKS[slug].source and "each way" in LINKS[slug].printed_as
    assert LINKS["ib-ndr-400g"].label() == "InfiniBand NDR 400G: 400 Gb/s = 50 GB/s each way"


def test_prefill_flops_written_out():
    """2 x params x n for the weights, plus causal attention 2 x layers x q_heads x head_dim x n^2."""
    m = MODELS["llama-3-8b"]
    assert dense_flops(m, 1000) == 2 * 8.03e9 * 1000
    assert attention_flops(m, 1000) == 2 * 32 * 32 * 128 * 1000 ** 2 == 262_144_000_000
    assert prefill_flops(m, 1000) == dense_flops(m, 1000) + attention_flops(m, 1000)
    assert dense_flops(MODELS["deepseek-v3"], 1) == 2 * 37e9          # active parameters of a mixture of experts


def test_radix_peek_reads_without_touching():
    """RadixTree.peek (what a router asks a replica's cache): the same length as match, but no edge is
    split and no recency changes, so looking at every replica does not reorder their evictions."""
    from kvx.explainers.core.radix import RadixTree
    tree = RadixTree(100)
    tree.insert((1, 2, 3, 4))
    tree.insert((1, 2, 9))
    before = [(n.tokens, n.last_access) for n in tree.nodes()]
    assert [tree.peek(s) for s in [(1, 2, 3), (1, 2, 3, 4, 5), (1, 2, 9), (1, 5), (7,), ()]] == [3, 4, 3, 1, 0, 0]
    assert [(n.tokens, n.last_access) for n in tree.nodes()] == before
    for s in [(1, 2, 3), (1, 2, 9, 9), (1, 5)]:
        assert tree.peek(s) == tree.match(s)[0]


def test_radix_on_evict_reports_each_evicted_leaf():
    from kvx.explainers.core.radix import RadixTree
    tree, gone = RadixTree(5), []
    tree.on_evict = lambda leaf: gone.append(leaf.tokens)
    tree.insert((1, 2, 3))
    tree.insert((7, 8))
    tree.insert((9, 9, 9))                     # needs 3 more: the least recently used leaf (1, 2, 3) goes
    assert gone == [(1, 2, 3)] and tree.evicted == 3 and tree.size == 5
