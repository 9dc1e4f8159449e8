"""PyTorch from a test: ``torch_block`` (a small transformer block), ``explain_with_eager`` and
``dynamic_kernels_since`` (the dynamic region kernels a test registered)."""

from __future__ import annotations

from typing import Any


# ---------------------------------------------------------------------------- torch backend
def torch_block(h: int = 16) -> Any:
    """A torch module (torch is imported here): LayerNorm -> Linear -> GELU -> softmax, two
    memory-intensive regions around a matmul, in eval mode."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln = torch.nn.LayerNorm(h)
            self.fc = torch.nn.Linear(h, h)

        def forward(self, x: Any) -> Any:
            return torch.nn.functional.gelu(self.fc(self.ln(x * 2.0 + 1.0))).softmax(-1)

    return Block().eval()


def explain_with_eager(model: Any, *args: Any) -> tuple[Any, Any]:
    """(the torch backend's ``explain`` of ``model(*args)``: regions emulated on the CPU, the rest eager;
    ``model(*args)`` itself), both under ``no_grad``; dynamo's caches are reset afterwards."""
    import torch

    from stitchtune.deploy import torch_backend

    with torch.no_grad():
        want = model(*args)
        try:
            return torch_backend.explain(model, *args, db=None, fallback="eager", cpu="emulate"), want
        finally:
            torch._dynamo.reset()


def dynamic_kernels_since(before: set[Any]) -> list[Any]:
    """The :class:`~stitchtune.deploy.torch_region_dynamic.DynamicRegionKernel`\ s registered since ``before``
    (the region registry's keys then: earlier tests' regions stay registered in the process)."""
    from stitchtune.deploy import torch_ops
    from stitchtune.deploy.torch_region_dynamic import DynamicRegionKernel

    kernels = [getattr(k, "kernel", None) for key, k in torch_ops._registry.items() if key not in before]
    return [k for k in kernels if isinstance(k, DynamicRegionKernel)]
