"""A region input that is a part of a larger row-major tensor (a split part: Phi-3's ``gate`` and ``up``
halves of the ``gate_up_proj`` output, saved for the backward as two strided views) is declared by the
region's graph as the whole tensor and read through a slice (``TorchRegion.input_windows``); the region
op hands the kernel ``Window.view(part)``, an ``as_strided`` view of the part's storage (no copy), and
the result equals eager. A part that does not lie where the region was found with it is copied into a
new window instead, with the same result."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from stitchtune.deploy.compiled import compile as compile_graph  # noqa: E402
from stitchtune.deploy.torch_ops import RegionKernel  # noqa: E402
from stitchtune.importers.torch_regions import find_regions  # noqa: E402
from stitchtune.importers.torch_windows import Window, held_window  # noqa: E402


def _silu_backward(g: Any, gate: Any, up: Any) -> Any:
    """SwiGLU's backward into the fused gate_up gradient: reads both halves of one saved tensor."""
    s = torch.sigmoid(gate)
    d_up = g * gate * s
    d_gate = g * up * s * (1 + gate * (1 - s))
    return torch.cat([d_gate, d_up], dim=-1)


def _parts(seed: int = 0) -> tuple[Any, Any, Any]:
    gen = torch.Generator().manual_seed(seed)
    fused = torch.randn(2, 3, 16, generator=gen)
    gate, up = fused.split(8, dim=-1)
    return torch.randn(2, 3, 8, generator=gen), gate, up


def test_held_window_of_split_parts() -> None:
    _, gate, up = _parts()
    assert held_window(gate) == Window((2, 3, 16), 2, 0) and held_window(up) == Window((2, 3, 16), 2, 8)
    assert held_window(gate.contiguous()) is None
    assert held_window(torch.randn(4, 6)[:, ::2]) is None   # a step: no row-major window
    w = held_window(up)
    assert w is not None
    view = w.view(up)
    assert view is not None and view.data_ptr() == gate.data_ptr() and torch.equal(view[..., 8:], up)
    assert w.view(up.contiguous()) is None and w.view(gate[:1]) is None


@pytest.fixture(scope="module")
def region() -> Any:
    gm = make_fx(_silu_backward, tracing_mode="fake")(*_parts())
    [r] = find_regions(gm).regions
    assert [w is not None for w in r.input_windows] == [x.name != "g_1" for x in r.inputs]
    return r


@pytest.mark.parametrize("cpu", ["emulate", "reference"])
def test_the_kernel_reads_the_window_and_equals_eager(region: Any, cpu: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cg = compile_graph(region.graph, db=None, device="h200", build=False)
    k = RegionKernel(region.name, region.ops, cg, cpu=cpu, out_shapes=region.output_shapes,
                     in_perms=region.input_perms, in_windows=region.input_windows)
    read: list[list[Any]] = []
    as_read = RegionKernel.as_read
    monkeypatch.setattr(RegionKernel, "as_read", lambda self, ins: read.append(as_read(self, ins)) or read[-1])
    g, gate, up = _parts(1)
    by_name = {"g": g, "gate": gate, "up": up}
    ins = [by_name[x.name.split("_")[0]] for x in region.inputs]
    assert k.copies(ins) == 0
    (got,) = k(ins)
    assert torch.allclose(got, _silu_backward(g, gate, up), atol=1e-5)
    assert {t.data_ptr() for t, x in zip(read[0], region.inputs) if x.name != "g_1"} == {gate.data_ptr()}
    # parts that are not where the region was found with them (contiguous copies): copied into a window
    ins = [t.contiguous() for t in ins]
    assert k.copies(ins) == 2
    (again,) = k(ins)
    assert torch.allclose(again, got, atol=1e-6)
