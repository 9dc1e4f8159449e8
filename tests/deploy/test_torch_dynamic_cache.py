"""A decode step's key cache concat under ``torch.compile(dynamic=True)`` (issue 41 item 4): the past
``[1, KV, P, D]`` and the new key split from the projection's row (rotated by angles, Llama-style, or
not, GPT-2-style), concatenated along the past axis (``P + 1``), get one generic kernel per bucket of
``P`` instead of one per past length (8, then eager calls); emulated, equal to eager at every step."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stitchtune.torch as st_torch  # noqa: E402
from stitchtune.deploy import torch_ops  # noqa: E402
from helpers.torch_models import dynamic_kernels_since  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_backend")

KV, D = 2, 16


class CacheStep(torch.nn.Module):
    """``cat(past, k)`` along the sequence, ``k`` the new position's key (rotated when ``rotary``)."""

    def __init__(self, rotary: bool) -> None:
        super().__init__()
        self.rotary = rotary

    def forward(self, xk: Any, past: Any, ang: Any) -> Any:
        k = xk.view(1, 1, KV, D).transpose(1, 2)
        if self.rotary:
            k = k * ang.cos() + torch.cat((-k[..., D // 2:], k[..., :D // 2]), -1) * ang.sin()
        return torch.cat((past, k), 2)


@pytest.mark.parametrize("rotary", [False, True])
def test_the_cache_concat_builds_one_generic_kernel_per_bucket(rotary: bool) -> None:
    before = set(torch_ops._registry)   # earlier tests' regions stay registered in this process
    torch.manual_seed(0)
    m = CacheStep(rotary).eval()
    c = torch.compile(m, backend="stitchtune", dynamic=True,
                      options={"db": None, "fallback": "eager", "cpu": "emulate"})
    lengths = (3, 5, 9, 16, 31, 33, 40, 64, 50, 47)   # the backend's buckets 2..32 and 33..64: ten past lengths
    with torch.no_grad():
        for p in lengths:
            args = (torch.randn(1, KV * D), torch.randn(1, KV, p, D), torch.randn(1, 1, 1, D))
            got, want = c(*args), m(*args)
            assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5), p
    kernels = dynamic_kernels_since(before)
    entries = [e for k in kernels for _, _, e in k.entries()]
    assert entries and all(e is not None and e.generic for e in entries)
    s = st_torch.stats()
    assert s.eager == 0 and max(r.builds for r in s.regions) <= 2, [(r.region, r.builds) for r in s.regions]
