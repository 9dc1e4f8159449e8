"""Float64 scalar arithmetic inside regions (issue 41 item 3). Under ``torch.compile(dynamic=True)``
dynamo does not specialise Python floats: an RMSNorm's ``eps``, rotary's ``attention_scaling`` and the
``math.pi`` of GPT-2's GELU reach the backend as 0-d float64 inputs, cast to float32 (and, for GELU's
``sqrt(2 / pi)``, computed on in float64 first). Those casts and that arithmetic were left out of every
region ("reads dtype float64"); now a region reads the scalar as a float64 input (loaded rounded to
float32) and computes on it in float32: nothing of it is declined, and the results equal eager's."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stitchtune.deploy import torch_backend  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_backend")


class _Norm(torch.nn.Module):
    def forward(self, x: Any, eps: float, c: float) -> Any:
        v = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(v + eps) * math.sqrt(2.0 / c)


def _compiled(m: Any) -> Any:
    return torch.compile(m, backend="stitchtune", dynamic=True,
                         options={"db": None, "fallback": "eager", "cpu": "emulate"})


def test_float64_scalars_and_their_arithmetic_are_in_the_region() -> None:
    m = _Norm()
    c = _compiled(m)
    torch_backend.LAST_REPORTS.clear()
    with torch.no_grad():
        for n in (3, 5):
            x = torch.randn(n, 64, generator=torch.Generator().manual_seed(n))
            torch.testing.assert_close(c(x, 1e-6, math.pi), m(x, 1e-6, math.pi), rtol=1e-5, atol=1e-6)
        # another value of the scalars: read at run time, not folded into the kernel
        torch.testing.assert_close(c(x, 0.5, 2.0), m(x, 0.5, 2.0), rtol=1e-5, atol=1e-6)
    declined = [d for r in torch_backend.LAST_REPORTS for d in r.declined]
    assert not declined, declined
    ops = [op for r in torch_backend.LAST_REPORTS for s in r.stitched for op in s.ops]
    assert "aten.true_divide" in ops and "aten.sqrt" in ops and "prims.convert_element_type" in ops, ops
    # the region's graph declares the scalars as float64 inputs (one element each)
    shapes = [(sh, s.ops) for r in torch_backend.LAST_REPORTS for s in r.stitched for sh in s.shapes]
    assert any(sh == (1,) for sh, _ in shapes), shapes


def test_a_float64_tensor_that_is_not_a_scalar_stays_out() -> None:
    """A float64 tensor with elements (not a framework's scalar) is still left to PyTorch: kernels
    compute in float32 and would round what PyTorch computes in float64."""

    def f(x: Any) -> Any:
        return (x.double() * 3.0).exp().float() + 1.0

    c = _compiled(f)
    torch_backend.LAST_REPORTS.clear()
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(c(x), f(x))
    reasons = [d.reason for r in torch_backend.LAST_REPORTS for d in r.declined]
    assert any("float64" in why for why in reasons), reasons
