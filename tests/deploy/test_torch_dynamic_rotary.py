"""Llama-style rotary after the head split under ``torch.compile(dynamic=True)`` (issue 41 item 4): the
region that transposes q and k to heads and applies rotate_half (slice / neg / concat along the head dim)
gets one generic kernel per bucket of (batch, length), emulated, equal to eager at every call."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stitchtune.torch as st_torch  # noqa: E402
from stitchtune.deploy import torch_ops  # noqa: E402
from helpers.torch_models import dynamic_kernels_since  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_backend")

H, D = 2, 16


class Rotary(torch.nn.Module):
    """q and k projected, split into heads ``[B, H, S, D]``, rotated by angles ``[S, D]``."""

    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(H * D, H * D, bias=False)
        self.k = torch.nn.Linear(H * D, H * D, bias=False)

    def forward(self, x: Any, ang: Any) -> tuple[Any, Any]:
        b, s, _ = x.shape
        cos, sin = ang.cos(), ang.sin()

        def rot(u: Any) -> Any:
            u = u.view(b, s, H, D).transpose(1, 2)
            return u * cos + torch.cat((-u[..., D // 2:], u[..., :D // 2]), -1) * sin

        return rot(self.q(x)), rot(self.k(x))


def test_the_rotary_region_builds_one_generic_kernel_per_bucket() -> None:
    before = set(torch_ops._registry)   # earlier tests' regions stay registered in this process
    torch.manual_seed(0)
    m = Rotary().eval()
    c = torch.compile(m, backend="stitchtune", dynamic=True,
                      options={"db": None, "fallback": "eager", "cpu": "emulate"})
    # (the backend's buckets: 1, 2..32, 33..64, ...; batch 3 and 4 share 2..32)
    calls = [(3, 5), (4, 9), (3, 17), (4, 32), (3, 33), (4, 47), (3, 64)]
    with torch.no_grad():
        for b, s in calls:
            x, ang = torch.randn(b, s, H * D), torch.randn(s, D)
            for got, want in zip(c(x, ang), m(x, ang)):
                assert torch.allclose(got, want, atol=1e-5), (b, s)
    kernels = dynamic_kernels_since(before)
    rotary = [k for k in kernels if any(e is not None for _, _, e in k.entries())]
    assert rotary
    for k in rotary:
        entries = [e for _, _, e in k.entries()]
        assert entries and all(e is not None and e.generic for e in entries), k.name
    s = st_torch.stats()
    assert s.eager == 0
    # lengths 5..32 and 33..64 (batch 3..4): at most two generic kernels per region, not one per shape
    assert max(r.builds for r in s.regions) <= 2, [(r.region, r.builds) for r in s.regions]
