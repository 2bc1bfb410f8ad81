"""Catch a kernel that would fail on a GPU, without a GPU.

On CUDA, an op whose tensors sit on two devices raises ("Expected all tensors to be on the same device").
On a CPU-only machine every tensor is on the CPU, so a `torch.ones(...)` that forgot `device=` passes
every test. `SameDevice` is a dispatch mode that raises the same way CUDA would, for any device: run the
kernel with its inputs on PyTorch's `meta` device (shapes only, no data) and any tensor made on the CPU
and mixed with them fails. Explicit moves (`.to(device)`, `copy_`) and 0-dim CPU scalars are allowed,
as they are on CUDA. On `meta` a value read back to Python (`.item()`) has no data; it reads as
`fake_scalar` so the code after it still runs.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_MOVES = {"aten::_to_copy", "aten::copy_", "aten::to", "aten::lift_fresh", "aten::lift_fresh_copy",
          "aten::_local_scalar_dense", "aten::set_", "aten::_copy_from", "aten::_copy_from_and_resize"}


class MixedDevices(RuntimeError):
    pass


class SameDevice(TorchDispatchMode):
    def __init__(self, fake_scalar: float = 0.5):
        super().__init__()
        self.fake_scalar = fake_scalar
        self.ops = 0                       # ops seen, so a test can check the mode really watched something

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        self.ops += 1
        if name == "aten::_local_scalar_dense" and args[0].device.type == "meta":
            return torch.tensor(self.fake_scalar, dtype=args[0].dtype).item()
        if name not in _MOVES:
            devices = {t.device for t in tree_leaves((args, kwargs))
                       if isinstance(t, torch.Tensor) and not (t.dim() == 0 and t.device.type == "cpu")}
            if len(devices) > 1:
                raise MixedDevices(f"{name} mixes tensors on {sorted(str(d) for d in devices)}; "
                                   f"a tensor was made on the wrong device.")
        return func(*args, **kwargs)
