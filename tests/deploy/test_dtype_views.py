"""A dtype view (``Tensor.view(torch.int32)`` of a float tensor: ``aten.view.dtype``) reinterprets the
bits; graph.json's views and casts keep or convert values, so no region holds one (it stays PyTorch's,
a region reads or returns the tensor it views). Before the check, the region mapped it as a shape view
and ``y.view(torch.int32).float()`` came out as ``y`` itself."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stitchtune.deploy import torch_backend  # noqa: E402


def _bits(a: Any, b: Any) -> Any:
    y = torch.tanh(a) * b
    return y, y.view(torch.int32).float() * 2   # the float's bits read as an int, then converted


def _chain(a: Any, b: Any) -> Any:
    return (a * b).view(torch.int32).view(-1, 4) + 1   # a view chain through a dtype view, then int math


@pytest.mark.parametrize("fn", [_bits, _chain])
def test_a_dtype_view_is_left_to_pytorch_and_the_values_are_eagers(fn: Any, fresh_backend: None) -> None:
    g = torch.Generator().manual_seed(0)
    args = tuple(torch.randn(2, 8, 16, generator=g) for _ in range(2))
    want = fn(*args)
    compiled = torch.compile(fn, backend=torch_backend.stitchtune_backend,
                             options={"db": None, "fallback": "eager", "cpu": "emulate"})
    torch_backend.LAST_REPORTS.clear()
    with torch.no_grad():
        got = compiled(*args)
    stitched = [s.ops for r in torch_backend.LAST_REPORTS for s in r.stitched]
    assert stitched and all("aten.view" not in ops or "aten.mul" in ops for ops in stitched), stitched
    declined = [d for r in torch_backend.LAST_REPORTS for d in r.declined]
    assert any("dtype view" in d.reason for d in declined), declined
    for x, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert x.dtype == w.dtype and x.shape == w.shape and x.stride() == w.stride()
        assert torch.equal(x, w) if not x.is_floating_point() else torch.allclose(x, w, atol=1e-5, rtol=1e-5)
