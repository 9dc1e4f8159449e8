"""A slice with no elements (the gradient of Phi-3's ``q_pass`` where the rotary covers the whole head)
is :class:`stitchtune.importers.torch_layout.Empty`: scattered into zeros it is zeros (``Padded`` without
parts) that an ``add`` leaves out, concatenated it is left out; the region keeps the slice and the
scatter instead of declining them (which cut the rotary backward from the permute after it)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from stitchtune.importers.torch_regions import find_regions  # noqa: E402


def _rotary_backward_tail(g: Any) -> Any:
    """``g [2, 3, 8]``: its rotated part (all 8 columns) plus its passed-through part ``g[..., 8:]``
    (empty) scattered back into zeros, then permuted, as AOTAutograd's backward of a full rotary has it."""
    rot = g * 2.0   # (the rotary's own backward: element-wise here)
    passed = g[..., 8:]
    back = torch.ops.aten.slice_scatter.default(torch.zeros(2, 3, 8), passed, 2, 8)
    return (back + rot).permute(0, 2, 1).contiguous().sin()


def test_the_empty_slice_and_its_scatter_stay_in_the_region() -> None:
    g = torch.randn(2, 3, 8)
    gm = make_fx(_rotary_backward_tail, tracing_mode="fake")(g)
    ops = [str(n.target) for n in gm.graph.nodes]
    assert "aten.slice_scatter.default" in ops and "aten.slice.Tensor" in ops
    split = find_regions(gm)
    assert not split.declined, split.declined
    (r,) = split.regions
    assert {"aten.slice", "aten.slice_scatter", "aten.add", "aten.sin"} <= set(r.ops), r.ops
    assert [x.name for x in r.inputs] == ["g_1"]


def test_it_equals_eager_under_the_backend() -> None:
    from stitchtune.deploy import torch_backend

    g = torch.randn(2, 3, 8)
    torch._dynamo.reset()
    torch_backend.LAST_REPORTS.clear()
    try:
        got = torch.compile(_rotary_backward_tail, backend=torch_backend.stitchtune_backend,
                            options={"db": None, "fallback": "eager", "cpu": "emulate"})(g)
        reports = list(torch_backend.LAST_REPORTS)
    finally:
        torch._dynamo.reset()
    assert sum(len(r.stitched) for r in reports) == 1 and not [d for r in reports for d in r.declined]
    assert torch.allclose(got, _rotary_backward_tail(g), atol=1e-6)
