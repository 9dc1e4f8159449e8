"""Slices and concats along a dynamic axis under ``torch.compile(dynamic=True)`` (issue 41): a plain
slice of the sequence (``x[:, 1:]``, ``x[:, :-1]``: a shift by a constant, the extent ``s - 1``), a
decode step's cache concat with the batch and the past both dynamic (``B * H * (P + 1)`` rows), and a
chunked-prefill step (several new positions concatenated to the past). Each region gets one generic
kernel per bucket (at most 2 builds over the lengths below) and never runs eagerly; the outputs equal
eager's at every call (emulated kernels, CPU)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stitchtune.torch as st_torch  # noqa: E402
from stitchtune.deploy import torch_ops  # noqa: E402
from helpers.torch_models import dynamic_kernels_since  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_backend")

OPTS = {"db": None, "fallback": "eager", "cpu": "emulate"}
H, D = 2, 16


class ShiftedDiff(torch.nn.Module):
    """``exp(x[:, 1:] - x[:, :-1]) * w``: two slices of the sequence axis, one shifted by 1 (``w`` keeps
    the hidden dim static, as a model's weights do)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(32))

    def forward(self, x: Any) -> Any:
        return (x[:, 1:] - x[:, :-1]).exp() * self.w


class LastPositions(torch.nn.Module):
    """``exp(x[:, -2:]) * w``: the last two positions of the sequence (a start counted from its end)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(32))

    def forward(self, x: Any) -> Any:
        return x[:, -2:].exp() * self.w


class CacheStep(torch.nn.Module):
    """``cat(past, new)`` along the positions, the new positions' keys split into heads from the
    projection's rows ``[B, C, H*D]``: one position (decode) or several (chunked prefill)."""

    def forward(self, xk: Any, past: Any) -> Any:
        b, c = xk.shape[0], xk.shape[1]
        k = xk.view(b, c, H, D).transpose(1, 2) * 2.0
        return torch.cat((past, k), 2)


def _check(m: Any, calls: list[tuple[Any, ...]], before: set[Any], max_builds: int) -> None:
    c = torch.compile(m, backend="stitchtune", dynamic=True, options=OPTS)
    with torch.no_grad():
        for args in calls:
            got, want = c(*args), m(*args)
            assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5), [a.shape for a in args]
    kernels = dynamic_kernels_since(before)
    entries = [e for k in kernels for _, _, e in k.entries()]
    assert entries and all(e is not None and e.generic for e in entries), entries
    s = st_torch.stats()
    assert s.eager == 0 and max(r.builds for r in s.regions) <= max_builds, [(r.region, r.builds) for r in s.regions]


def test_a_slice_of_the_sequence_builds_one_generic_kernel_per_bucket() -> None:
    before = set(torch_ops._registry)
    torch.manual_seed(0)
    lengths = (5, 9, 16, 33, 40, 64, 47, 20)   # 4 buckets of the sequence: 5..8, 9..16, 17..32, 33..64
    calls = [(torch.randn(2, s, 32),) for s in lengths]
    _check(ShiftedDiff().eval(), calls, before, max_builds=5)


def test_the_last_positions_of_the_sequence_build_one_generic_kernel_per_bucket() -> None:
    before = set(torch_ops._registry)
    torch.manual_seed(0)
    calls = [(torch.randn(2, s, 32),) for s in (5, 9, 16, 33, 40, 64, 47, 20)]
    _check(LastPositions().eval(), calls, before, max_builds=4)


def test_a_decode_step_with_dynamic_batch_and_past_is_generic() -> None:
    """Batch 1-4 and a growing past: one kernel per (batch bucket, past bucket)."""
    before = set(torch_ops._registry)
    torch.manual_seed(0)
    calls = [(torch.randn(b, 1, H * D), torch.randn(b, H, p, D)) for b, p in
             ((1, 3), (2, 3), (3, 4), (4, 5), (1, 6), (2, 6), (3, 33), (4, 40), (1, 41), (3, 47), (2, 64))]
    _check(CacheStep().eval(), calls, before, max_builds=4)


def test_a_chunked_prefill_step_is_generic() -> None:
    """2-5 new positions concatenated to a past of 3-64 positions (the chunk dynamic too)."""
    before = set(torch_ops._registry)
    torch.manual_seed(0)
    calls = [(torch.randn(1, c, H * D), torch.randn(1, H, p, D)) for c, p in
             ((2, 3), (3, 7), (4, 12), (5, 20), (3, 33), (4, 40), (2, 47), (5, 60))]
    _check(CacheStep().eval(), calls, before, max_builds=4)
