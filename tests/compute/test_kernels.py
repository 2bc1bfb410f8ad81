"""Each kernel against its naive reference, at stated tolerances (float32 on the CPU)."""
from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from kvx.compute.kernels import crosslayer, crossmodel, eviction, mla, mla_cpu, paged, quant
from kvx.compute.lm.model import LMConfig, TinyLM, rope_tables
from kvx.compute.lm.train import CONFIGS
from kvx.explainers.core.models import ModelPreset

ATOL, RTOL = 1e-5, 1e-4          # float32: two summation orders of the same products


@pytest.fixture(scope="module")
def mla_model():
    torch.manual_seed(0)
    return TinyLM(LMConfig("t-mla", "mla", d_model=64, n_layers=2, n_heads=4, head_dim=16, kv_latent=24,
                           rope_dim=8, max_len=256)).eval()


@pytest.fixture(scope="module")
def gqa_model():
    torch.manual_seed(0)
    return TinyLM(LMConfig("t-gqa", "gqa", d_model=64, n_layers=4, n_heads=4, head_dim=16, n_kv_heads=2,
                           max_len=256)).eval()


@pytest.mark.parametrize("batch,context", [(1, 1), (1, 37), (3, 200)])
def test_mla_absorbed_and_materialized_equal_naive(mla_model, batch, context):
    layer = mla_model.blocks[0].attn
    inp = mla.decode_inputs(layer, batch, context, torch.Generator().manual_seed(batch * 1000 + context))
    reference = mla.naive(layer, inp)
    torch.testing.assert_close(mla.absorbed(layer, inp), reference, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(mla.materialized(layer, inp, mla.materialize(layer, inp)), reference,
                               atol=ATOL, rtol=RTOL)


def test_mla_naive_decode_equals_the_models_own_attention(mla_model):
    """The decode kernel's last-token output is what the full forward computes for that token."""
    layer = mla_model.blocks[0].attn
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 50, 64, generator=g)
    cos, sin = mla_model.cos[:50], mla_model.sin[:50]
    with torch.no_grad():
        full, _, _ = layer(x, cos, sin)
        cache = layer.kv(x[:, :49], cos[:49], sin[:49])
        q_nope, q_rope = layer.split_query(x[:, 49:], cos[49:50], sin[49:50])
    inp = {**cache, "q_nope": q_nope, "q_rope": q_rope}
    torch.testing.assert_close(mla.naive(layer, {**inp, "latent": layer.kv(x, cos, sin)["latent"],
                                                  "k_rope": layer.kv(x, cos, sin)["k_rope"]}),
                               full[:, 49:], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("batch,context", [(1, 1), (2, 300)])
def test_mla_absorbed_is_within_float32_of_a_float64_naive(mla_model, batch, context):
    layer = mla_model.blocks[0].attn
    inp = mla.decode_inputs(layer, batch, context, torch.Generator().manual_seed(context))
    reference = mla.naive(copy.deepcopy(layer).double(), {k: v.double() for k, v in inp.items()})
    assert (mla.absorbed(layer, inp).double() - reference).abs().max() <= 1e-5
    torch.testing.assert_close(mla.absorbed_broadcast(layer, inp), mla.absorbed(layer, inp), atol=ATOL, rtol=RTOL)


def test_mla_cache_bytes_match_the_explainer_formula(mla_model):
    c = mla_model.c
    preset = ModelPreset("t", "t", "MLA", c.n_layers, c.n_heads, c.n_heads, c.head_dim, 1, 1, "test",
                         kv_latent=c.kv_latent, rope_dim=c.rope_dim)
    per_layer = mla.cost(mla_model.blocks[0].attn, 1, 1000, 2)["cache_bytes_per_token"]
    assert per_layer * c.n_layers == preset.kv_bytes_per_token(2) == c.cache_numbers_per_token() * 2
    inp = mla.decode_inputs(mla_model.blocks[0].attn, 1, 10, torch.Generator().manual_seed(0))
    assert inp["latent"].shape[-1] + inp["k_rope"].shape[-1] == c.kv_latent + c.rope_dim


def test_mla_absorbed_reads_fewer_bytes_than_mha_but_does_more_flops():
    """At DeepSeek-V3's shape (128 heads, head_dim 128, latent 512, rope 64), per cached token:
    MHA reads 128 x 256 + 64 numbers and does 2*128*192 + 2*128*128 FLOPs; absorbed MLA reads 576 and
    does 2*128*576 + 2*128*512."""
    layer = TinyLM(LMConfig("v3", "mla", d_model=64, n_layers=1, n_heads=128, head_dim=128, kv_latent=512,
                            rope_dim=64, max_len=8)).blocks[0].attn
    s = 32768
    c = mla.cost(layer, 1, s, 2)
    assert c["materialized_bytes"] / c["absorbed_bytes"] == pytest.approx((128 * 256 + 64) / 576)
    assert c["absorbed_flops"] / c["materialized_flops"] == pytest.approx(
        (2 * 128 * 576 + 2 * 128 * 512) / (2 * 128 * 192 + 2 * 128 * 128), rel=1e-2)   # + the per-step absorb
    assert c["naive_flops"] > c["absorbed_flops"] > c["materialized_flops"]


def _two_token_inputs(layer, batch: int, context: int, seed: int) -> dict:
    """decode_inputs with two new tokens (twice the heads in query rows), the latent a strided slice."""
    c = layer.c
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, context + 2, c.d_model, generator=g)
    cos, sin = rope_tables(context + 2, c.rope_dim, c.rope_base)
    with torch.no_grad():
        cache = layer.kv(x[:, :context], cos[:context], sin[:context])
        q_nope, q_rope = layer.split_query(x[:, context:], cos[context:], sin[context:])
    wide = torch.randn(batch, context, c.kv_latent + 5, generator=g)
    wide[..., 2:2 + c.kv_latent] = cache["latent"]
    return {"latent": wide[..., 2:2 + c.kv_latent], "k_rope": cache["k_rope"], "q_nope": q_nope, "q_rope": q_rope}


def build_fused(layer) -> None:
    """The fused kernel for this layer's shape, built as `kvx build-kernels` builds it (the server only loads it);
    without a compiler the build fails and the test that asked skips."""
    from kvx.site.native import build_mla
    shape = (layer.c.kv_latent, layer.c.rope_dim)
    try:
        build_mla(*shape)
    except RuntimeError:
        return
    mla_cpu._libs.pop(shape, None)               # a load tried before the build is forgotten


@pytest.fixture(scope="module")
def wide_mla_model():
    """Widths that are multiples of 16 (the 16-lane build where the CPU has AVX-512) and 5 heads: 5 and 10 query
    rows leave every tail of the six-row score groups."""
    torch.manual_seed(1)
    return TinyLM(LMConfig("t-mla16", "mla", d_model=48, n_layers=1, n_heads=5, head_dim=16, kv_latent=32,
                           rope_dim=16, max_len=256)).eval()


@pytest.mark.parametrize("model", ["mla_model", "wide_mla_model"])
@pytest.mark.parametrize("batch,context,threads", [(1, 1, 1), (3, 37, 1), (2, 300, 1), (1, 5000, 1), (2, 16400, 2),
                                                   (1, 25000, 3)])
def test_mla_fused_cpu_kernel_equals_the_pytorch_kernel_and_float64(model, batch, context, threads, request):
    """The fused C kernel (float32, CPU) against the PyTorch absorbed kernel and a float64 naive decode: partial
    chunks and 8-token groups, two new tokens, a strided latent, several sequences, tokens split over threads;
    8-lane widths (24 + 8) and 16-lane ones (32 + 16), with 4, 5, 8 and 10 query rows."""
    from kvx.compute.kernel_specs import threads as with_threads
    layer = request.getfixturevalue(model).blocks[0].attn
    build_fused(layer)
    for inp in (mla.decode_inputs(layer, batch, context, torch.Generator().manual_seed(context)),
                _two_token_inputs(layer, batch, context, context)):
        assert mla_cpu.applies(layer, inp)
        with with_threads(threads):
            fused, dispatched = mla_cpu.absorbed(layer, inp), mla.absorbed(layer, inp)
        if fused is None:
            pytest.skip("no C compiler here: absorbed runs the PyTorch kernel")
        width = mla_cpu.vector_width(layer.c.kv_latent, layer.c.rope_dim)
        sixteen = layer.c.kv_latent % 16 == 0 and layer.c.rope_dim % 16 == 0 and "avx512f" in mla_cpu._cpu_flags().split()
        assert width == (16 if sixteen else 8)
        assert mla.absorbed_implementation(layer, inp) == f"{mla_cpu.NAME}, {width}-float vectors"
        wide = copy.deepcopy(layer).double(), {k: v.double() for k, v in inp.items()}
        # naive decodes one new token; for two, the PyTorch absorbed kernel in float64 is the reference
        reference = mla.naive(*wide) if inp["q_nope"].shape[2] == 1 else mla.absorbed_matmul(*wide)
        assert fused.shape == reference.shape and fused.dtype == torch.float32
        torch.testing.assert_close(fused, mla.absorbed_matmul(layer, inp), atol=ATOL, rtol=RTOL)
        assert (fused.double() - reference).abs().max() <= 1e-5
        torch.testing.assert_close(dispatched, fused, atol=0, rtol=0)


def test_mla_fused_kernel_steps_aside_where_it_does_not_apply(mla_model, monkeypatch):
    """Other dtypes, widths that are not multiples of 8, too many query rows, KVX_FUSED_KERNELS=0: the PyTorch
    kernel runs (the meta device is covered by test_kernel_devices)."""
    layer = mla_model.blocks[0].attn
    inp = mla.decode_inputs(layer, 1, 20, torch.Generator().manual_seed(0))
    wide = copy.deepcopy(layer).double()
    assert mla_cpu.absorbed(wide, {k: v.double() for k, v in inp.items()}) is None
    odd = TinyLM(LMConfig("t-odd", "mla", d_model=64, n_layers=1, n_heads=4, head_dim=16, kv_latent=20, rope_dim=8,
                          max_len=64)).eval().blocks[0].attn
    odd_inp = mla.decode_inputs(odd, 1, 20, torch.Generator().manual_seed(0))
    assert not mla_cpu.applies(odd, odd_inp) and mla_cpu.absorbed(odd, odd_inp) is None
    torch.testing.assert_close(mla.absorbed(odd, odd_inp), mla.naive(odd, odd_inp), atol=ATOL, rtol=RTOL)
    many = dict(inp, q_nope=inp["q_nope"].expand(1, 4, 17, -1), q_rope=inp["q_rope"].expand(1, 4, 17, -1))
    assert not mla_cpu.applies(layer, many)                      # 68 rows > 64
    monkeypatch.setenv("KVX_FUSED_KERNELS", "0")
    assert mla_cpu.absorbed(layer, inp) is None
    assert mla.absorbed_implementation(layer, inp).startswith("PyTorch")


def test_mla_fused_kernel_cache_is_private(tmp_path, monkeypatch):
    """A kernel cache another user could write to is not used (a library planted there would be loaded)."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv("KVX_KERNEL_CACHE", str(shared))
    assert mla_cpu.cache_dir() != shared
    private = tmp_path / "private"
    monkeypatch.setenv("KVX_KERNEL_CACHE", str(private))
    assert mla_cpu.cache_dir() == private and private.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("block_size,lens", [(16, [1, 16, 17, 100]), (4, [3, 8]), (32, [200]), (16, [1000, 993, 7])])
def test_paged_decode_equals_float64_reference_with_nan_in_unused_slots(block_size, lens):
    g = torch.Generator().manual_seed(block_size)
    b, s, hkv, d, h = len(lens), max(lens), 2, 16, 4
    k, v = torch.randn(b, s, hkv, d, generator=g), torch.randn(b, s, hkv, d, generator=g)
    q = torch.randn(b, h, d, generator=g)
    need = sum(math.ceil(n / block_size) for n in lens)
    k_pool, table = paged.scatter_to_blocks(k, lens, block_size, need + 5, torch.Generator().manual_seed(1))
    v_pool, table_v = paged.scatter_to_blocks(v, lens, block_size, need + 5, torch.Generator().manual_seed(1))
    assert torch.equal(table, table_v)
    assert torch.isnan(k_pool).any()                      # unused slots really are NaN
    reference = paged.loop_decode(q, k, v, lens, dtype=torch.float64)
    out = paged.paged_decode(q, k_pool, v_pool, table, lens)
    assert not torch.isnan(out).any()
    assert (out.double() - reference).abs().max() <= 1e-6     # float32 against float64
    # The batched SDPA reference, the tensor form of the lengths and the previous kernel agree too.
    seq_lens = torch.tensor(lens)
    assert (paged.contiguous_decode(q, k, v, seq_lens).double() - reference).abs().max() <= 1e-6
    assert (paged.paged_decode(q, k_pool, v_pool, table, seq_lens).double() - reference).abs().max() <= 1e-6
    assert (paged.gather_repeat_decode(q, k_pool, v_pool, table, seq_lens).double() - reference).abs().max() <= 1e-6


def test_contiguous_decode_ignores_what_lies_past_each_sequence():
    g = torch.Generator().manual_seed(3)
    k, v, q = torch.randn(2, 20, 1, 8, generator=g), torch.randn(2, 20, 1, 8, generator=g), torch.randn(2, 2, 8)
    moved = k.clone()
    moved[0, 5:] = 1e4                                        # past sequence 0's end (5 tokens)
    torch.testing.assert_close(paged.contiguous_decode(q, moved, v, [5, 20]), paged.contiguous_decode(q, k, v, [5, 20]))


def test_scatter_places_each_token_where_its_table_says():
    k = torch.arange(2 * 10, dtype=torch.float32).view(2, 10, 1, 1)
    pool, table = paged.scatter_to_blocks(k, [10, 3], 4, 6, torch.Generator().manual_seed(0))
    for b, n in enumerate([10, 3]):
        for t in range(n):
            assert pool[table[b, t // 4], t % 4, 0, 0] == k[b, t, 0, 0]
    assert torch.isnan(pool).sum() == 6 * 4 - 13                # every other slot is the fill


def test_scatter_refuses_a_pool_that_is_too_small():
    with pytest.raises(ValueError, match="num_blocks must be at least 3"):
        paged.scatter_to_blocks(torch.zeros(1, 40, 1, 4), torch.tensor([40]), 16, 2, torch.Generator())


@pytest.mark.parametrize("scheme,bound", [("int8-token", 0.01), ("int8-channel", 0.01), ("int4-token", 0.2),
                                          ("int4-channel", 0.2), ("fp8", 0.05)])
def test_quantization_error_is_bounded_and_ordered(scheme, bound):
    x = torch.randn(2, 4, 256, 64, generator=torch.Generator().manual_seed(0))
    err = quant.relative_error(x, scheme)
    assert 0 < err < bound
    # A symmetric integer code is off by at most half a step per number.
    if scheme != "fp8":
        kind, axis = scheme.split("-")
        levels = {"int8": 127, "int4": 7}[kind]
        scale = x.abs().amax(dim=-1 if axis == "token" else -2, keepdim=True) / levels
        assert ((x - quant.quantize_dequantize(x, scheme)).abs() <= scale / 2 + 1e-6).all()


def test_fewer_bits_more_error():
    x = torch.randn(1, 2, 128, 32, generator=torch.Generator().manual_seed(1))
    assert quant.relative_error(x, "int4-token") > quant.relative_error(x, "int8-token")


def test_bits_per_number_counts_scales():
    assert quant.bits_per_number("int4-token", tokens=100, channels=64) == 4 + 16 / 64
    assert quant.bits_per_number("int8-channel", tokens=100, channels=64) == 8 + 16 / 100


@pytest.mark.parametrize("name", sorted(eviction.POLICIES))
@pytest.mark.parametrize("budget", [1, 5, 13, 40])
def test_each_policy_keeps_exactly_its_budget(name, budget):
    w = torch.rand(2, 3, 40, 40, generator=torch.Generator().manual_seed(budget)).tril()
    keep = eviction.POLICIES[name].keep(w, budget, torch.Generator().manual_seed(0))
    want = 40 if name == "full" else min(budget, 40)
    assert (keep.sum(-1) == want).all()


def test_streaming_llm_keeps_sinks_and_recent():
    keep = eviction.StreamingLLM(sinks=4).keep(torch.rand(1, 1, 20, 20), 10)[0, 0]
    assert keep.nonzero().flatten().tolist() == [0, 1, 2, 3, 14, 15, 16, 17, 18, 19]


def test_h2o_keeps_the_heavy_hitter_and_the_recent_window():
    w = torch.full((1, 1, 20, 20), 0.01).tril()
    w[..., 7] = 5.0                                      # everyone attends to token 7
    keep = eviction.H2O(recent_share=0.5).keep(w.tril(), 4)[0, 0]
    # Accumulated: token 7 gets 5.0 from 13 queries; token 0 the most of the rest (0.01 from all 20).
    assert keep.nonzero().flatten().tolist() == [0, 7, 18, 19]


def test_snapkv_keeps_what_the_window_looks_at():
    w = torch.zeros(1, 1, 30, 30)
    w[..., 25:, 5] = 1.0                                 # the observation window attends to token 5
    keep = eviction.SnapKV(window=5, kernel=1).keep(w, 6)[0, 0]
    assert keep[5] and keep[25:].all() and keep.sum() == 6


@pytest.mark.parametrize("model_name", ["gqa_model", "mla_model"])
def test_full_cache_policy_changes_nothing(request, model_name):
    model = request.getfixturevalue(model_name)
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    r = eviction.evaluate(model, ids, 48, eviction.FullCache(), 1.0)
    assert r["loss"] == pytest.approx(r["full_loss"], abs=1e-5) and r["top1_agreement"] == 1.0


def test_eviction_masks_cut_only_the_continuations_view(gqa_model):
    ids = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(0))
    _, weights, _ = gqa_model(ids, need_weights=True)
    masks, kept = eviction.masks_for(gqa_model, weights, 24, eviction.StreamingLLM(sinks=2), 6)
    m = masks[0][0, 0]
    assert m[:24].all() and m[24:, 24:].all()                     # prefill and continuation untouched
    assert m[24:, :24].sum(-1).eq(6).all()                        # each continuation query sees 6 prefix tokens


def test_cka_is_one_for_rotated_copies_and_cosine_is_not():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 32, generator=g, dtype=torch.float64)
    rotation, _ = torch.linalg.qr(torch.randn(32, 32, generator=g, dtype=torch.float64))
    assert crosslayer.linear_cka(x, x @ rotation) == pytest.approx(1.0, abs=1e-9)
    assert abs(crosslayer.mean_cosine(x, x @ rotation)) < 0.3
    assert crosslayer.linear_cka(x, torch.randn(500, 32, generator=g, dtype=torch.float64)) < 0.2


def test_sharing_at_1_to_1_is_the_model_itself(gqa_model):
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    r = crosslayer.sharing_loss(gqa_model, ids, 1)
    assert r["loss"] == pytest.approx(r["own_loss"], abs=1e-6) and r["memory_fraction"] == 1
    assert crosslayer.sharing_loss(gqa_model, ids, 2)["memory_fraction"] == 0.5
    assert crosslayer.sharing_loss(gqa_model, ids, 4)["memory_fraction"] == 0.25


def test_cross_model_map_of_a_model_onto_itself_is_near_exact(gqa_model):
    ids = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(0))
    fitted = crossmodel.fit(gqa_model, gqa_model, ids, ridge=1e-8)
    r = crossmodel.evaluate(gqa_model, gqa_model, fitted, ids)
    assert r["large_mapped_loss"] == pytest.approx(r["large_own_loss"], abs=1e-3)


def test_training_configs_cache_what_the_formula_says():
    for c in CONFIGS.values():
        ids = torch.randint(0, 256, (1, 8))
        _, _, caches = TinyLM(c)(ids, need_weights=True)
        distinct = {id(cache): cache for cache in caches}.values()        # shared layers hold one cache
        numbers = sum(sum(v.numel() for v in cache.values()) for cache in distinct) // 8
        assert numbers == c.cache_numbers_per_token()


def test_trained_in_sharing_is_imposed_sharing_on_the_same_weights():
    """A kv_share=2 model (followers have no K/V projections) computes exactly what a plain model with
    the same weights computes when its followers are made to reuse their anchor's cache."""
    torch.manual_seed(0)
    shared = TinyLM(LMConfig("t-cla", "gqa", d_model=64, n_layers=4, n_heads=4, head_dim=16, n_kv_heads=2,
                             max_len=64, kv_share=2)).eval()
    plain = TinyLM(dataclasses.replace(shared.c, kv_share=1)).eval()
    missing = plain.load_state_dict(shared.state_dict(), strict=False).missing_keys
    assert sorted(missing) == [f"blocks.{i}.attn.{w}.weight" for i in (1, 3) for w in ("wk", "wv")]
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(shared(ids), plain(ids, kv_transform=crosslayer.sharing_transform(2)),
                               atol=0, rtol=0)
    assert shared.c.cache_numbers_per_token() == plain.c.cache_numbers_per_token() // 2
