"""Test-side shim: Megatron-Core's pipeline schedules on CPU (they allocate on "cuda")."""

import torch
from torch.overrides import TorchFunctionMode

_FACTORIES = {
    torch.zeros,
    torch.ones,
    torch.empty,
    torch.tensor,
    torch.full,
    torch.randn,
    torch.arange,
}


class CudaToCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        dev = kwargs.get("device")
        if dev is not None and "cuda" in str(dev):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def install():
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.is_available = lambda: False
    CudaToCpu().__enter__()
