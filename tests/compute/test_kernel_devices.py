"""Kernels on any device, checked without a GPU; the timing loop's structure, checked with a fake clock.

Every kernel runs on PyTorch's `meta` device under `SameDevice`, which raises as CUDA would when an op
mixes tensors from two devices, so a tensor made on the CPU by mistake fails here, in CI. With
KVX_TEST_DEVICE=cuda (make gpu-check) the agreement tests compare the CPU with the GPU.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

from kvx.compute import kernel_specs
from kvx.compute.kernels import crosslayer, crossmodel, eviction, mla, paged, quant, timing
from kvx.compute.kernels.device_guard import MixedDevices, SameDevice
from kvx.compute.lm.model import LMConfig, TinyLM
from kvx.compute.lm.train import CHECKPOINTS

META = torch.device("meta")
TARGET = torch.device(os.environ.get("KVX_TEST_DEVICE", "cpu"))


def small_models(dev):
    torch.manual_seed(0)
    gqa = TinyLM(LMConfig("t-gqa", "gqa", d_model=64, n_layers=4, n_heads=4, head_dim=16, n_kv_heads=2,
                          max_len=128)).eval().to(dev)
    torch.manual_seed(0)
    small = TinyLM(LMConfig("t-gqa-s", "gqa", d_model=32, n_layers=2, n_heads=2, head_dim=16, n_kv_heads=1,
                            max_len=128)).eval().to(dev)
    torch.manual_seed(0)
    mla_model = TinyLM(LMConfig("t-mla", "mla", d_model=64, n_layers=2, n_heads=4, head_dim=16, kv_latent=24,
                                rope_dim=8, max_len=128)).eval().to(dev)
    return gqa, small, mla_model


def every_kernel(dev) -> dict:
    """Each kernel function once, on inputs on `dev`; returns their outputs by name."""
    gqa, small, mla_model = small_models(dev)
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(0)).to(dev)
    out = {}
    layer = mla_model.blocks[0].attn
    inp = mla.decode_inputs(layer, 2, 40, torch.Generator().manual_seed(0))
    out["mla.naive"] = mla.naive(layer, inp)
    out["mla.absorbed"] = mla.absorbed(layer, inp)
    out["mla.absorbed_matmul"] = mla.absorbed_matmul(layer, inp)         # what absorbed runs off the CPU
    out["mla.absorbed_broadcast"] = mla.absorbed_broadcast(layer, inp)
    out["mla.materialized"] = mla.materialized(layer, inp, mla.materialize(layer, inp))
    g = torch.Generator().manual_seed(1)
    k, v = (torch.randn(2, 40, 2, 8, generator=g).to(dev) for _ in range(2))
    q = torch.randn(2, 4, 8, generator=g).to(dev)
    lens = [40, 29]
    k_pool, table = paged.scatter_to_blocks(k, lens, 16, 6, torch.Generator().manual_seed(2))
    v_pool, _ = paged.scatter_to_blocks(v, lens, 16, 6, torch.Generator().manual_seed(2))
    out["paged.paged_decode"] = paged.paged_decode(q, k_pool, v_pool, table, lens)
    out["paged.contiguous_decode"] = paged.contiguous_decode(q, k, v, lens)
    out["paged.loop_decode"] = paged.loop_decode(q, k, v, lens)
    out["paged.gather_repeat_decode"] = paged.gather_repeat_decode(q, k_pool, v_pool, table,
                                                                   torch.tensor(lens, device=dev))
    for scheme in quant.SCHEMES:
        out[f"quant.{scheme}"] = quant.quantize_dequantize(k, scheme)
    sim = crosslayer.similarity(gqa, ids)
    out["crosslayer.random_cka"] = torch.tensor(sim["k"]["random_cka"])
    out["crosslayer.sharing_loss"] = torch.tensor(crosslayer.sharing_loss(gqa, ids, 2)["loss"])
    fitted = crossmodel.fit(small, gqa, ids)
    out["crossmodel.w"] = fitted["w"]
    out["crossmodel.mapped_loss"] = torch.tensor(crossmodel.evaluate(small, gqa, fitted, ids)["large_mapped_loss"])
    out["eviction.snapkv"] = torch.tensor(eviction.evaluate(gqa, ids, 32, eviction.POLICIES["snapkv"], 0.25)["loss"])
    return out


def test_every_kernel_runs_on_the_meta_device_without_mixing_devices():
    with SameDevice() as guard:
        out = every_kernel(META)
    assert guard.ops > 1000                                  # the guard watched the kernels' ops
    for name in ("mla.absorbed", "paged.paged_decode", "crossmodel.w"):
        assert out[name].device.type == "meta", name


@pytest.mark.parametrize("make", [
    lambda x: torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], dim=-1),       # cross-model's old bias
    lambda x: x.T @ x + torch.eye(x.shape[1], dtype=x.dtype),                        # its old ridge identity
    lambda x: x @ torch.randn(x.shape[1], 3, dtype=x.dtype),                         # cross-layer's old baseline
])
def test_the_guard_catches_a_tensor_made_on_the_cpu(make):
    """The bugs this guard exists for (crossmodel.py and crosslayer.py before the fix) fail under it."""
    x = torch.randn(5, 4, device=META)
    with pytest.raises(MixedDevices, match="mixes tensors on"), SameDevice():
        make(x)


def test_the_guard_allows_moves_and_python_scalars():
    with SameDevice():
        x = torch.randn(3, 3).to(META)
        y = x * 2.0 + torch.tensor(1.0)                   # a 0-dim CPU tensor is fine on CUDA too
        assert y.device.type == "meta" and y.sum().item() == 0.5      # .item() on meta reads as the fake scalar


@pytest.mark.skipif(not (CHECKPOINTS / "gqa-large.pt").exists(), reason="trained checkpoints not present")
@pytest.mark.parametrize("name,body", [
    ("mla", {"context": 64, "repeats": 1}), ("paged", {"context": 40, "batch": 2, "repeats": 1}),
    ("eviction", {"sequences": 1}), ("quantization", {"sequences": 1}), ("cross-layer", {"sequences": 1}),
    ("cross-model", {"fit_sequences": 4, "eval_sequences": 1}), ("decode", {"weight_mb": 1, "kv_mb": 1, "repeats": 1}),
])
def test_every_endpoint_run_on_the_meta_device(monkeypatch, name, body):
    """What the server runs for each endpoint, with the server's device replaced by `meta`."""
    monkeypatch.setattr(kernel_specs, "device", lambda: META)
    for cached in (kernel_specs.trained, kernel_specs._mla_layer, kernel_specs._copy_bandwidth):
        cached.cache_clear()
    try:
        k = kernel_specs.KERNELS[name]
        with SameDevice():
            result = k.run(k.request(**body), lambda *a: None)
        assert result["threads"] >= 1
    finally:
        for cached in (kernel_specs.trained, kernel_specs._mla_layer, kernel_specs._copy_bandwidth):
            cached.cache_clear()


def test_kernels_agree_between_the_cpu_and_the_target_device():
    """On CUDA (KVX_TEST_DEVICE=cuda) the GPU's answers equal the CPU's to float32 tolerances."""
    cpu, there = every_kernel(torch.device("cpu")), every_kernel(TARGET)
    assert set(cpu) == set(there)
    for name, a in cpu.items():
        b = there[name].to("cpu")
        assert b.device.type == "cpu" and a.shape == b.shape, name
        # Losses and fitted maps sum many float32 products in a device's own order; an eviction policy's top-k
        # may break a near tie the other way, so its loss gets the widest tolerance.
        tol = 2e-2 if name.startswith("eviction") else 2e-3 if name.startswith(
            ("crossmodel", "crosslayer", "quant.int4", "quant.fp8")) else 1e-4
        torch.testing.assert_close(b.float(), a.float(), atol=tol, rtol=tol, msg=name)


# ---- the timing loop -----------------------------------------------------------------------------------
class FakeTimer:
    """Records what the timing loop does; each mark is a reading of a clock that `fn` advances."""

    def __init__(self):
        self.log, self.now = [], 0.0

    def mark(self):
        self.log.append("mark")
        return self.now

    def elapsed(self, start, end):
        self.log.append("read")
        return end - start

    def sync(self):
        self.log.append("sync")


def test_timing_loop_warms_up_flushes_outside_and_syncs_once_after_the_repeats():
    timer, durations = FakeTimer(), iter([9.0, 9.0, 3.0, 1.0, 2.0, 5.0, 4.0])     # two warm-ups, then five

    def fn():
        timer.log.append("fn")
        timer.now += next(durations)

    seconds = timing.median_seconds(fn, torch.device("cpu"), repeats=5, warmup=2, timer=timer,
                                    flush=lambda: timer.log.append("flush"))
    assert seconds == 3.0                                    # median of 3, 1, 2, 5, 4; warm-ups not counted
    assert timer.log[:3] == ["fn", "fn", "sync"]
    timed = timer.log[3:]
    assert timed[:20] == ["flush", "mark", "fn", "mark"] * 5   # the flush happens before the start mark
    assert timed[20:] == ["sync"] + ["read"] * 5               # one wait, after every repeat is queued


def test_timer_choice_per_device():
    assert isinstance(timing.timer_for(torch.device("cuda")), timing.CudaEventTimer)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        cpu = timing.timer_for(torch.device("cpu"))
        assert isinstance(cpu, timing.WallTimer) and cpu.clock is __import__("time").thread_time
        assert timing.clock_name(torch.device("cpu")) == "thread CPU time"
    finally:
        torch.set_num_threads(before)


def test_cpu_timing_measures_work():
    """Ten times the work reads as several times the time, on the real clock."""
    x = torch.randn(256, 256)
    with kernel_specs.threads(1):
        one = timing.median_seconds(lambda: x @ x, torch.device("cpu"), repeats=5)
        ten = timing.median_seconds(lambda: [x @ x for _ in range(10)], torch.device("cpu"), repeats=5)
    assert 3 < ten / one < 30


def test_copy_bandwidth_counts_read_and_write():
    bw = timing.copy_bandwidth(torch.device("cpu"), mib=8)
    assert 1e8 < bw < 1e12 and math.isfinite(bw)
