"""A pulled node the graph returns (the rotary angles a training forward saves for its backward) is
stored by the first region that computes it (``torch_regions._store_saved``): an output of that
region, so that no kernel of the rest computes it once more; where the region with it is refused,
the region stays as it was and the node stays the framework's. The regions' graphs compute what
PyTorch does (reference executor)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stitchtune.graph.reference import run_reference  # noqa: E402
from stitchtune.importers.torch_regions import find_regions  # noqa: E402


def _rotary_pair(q: Any, k: Any, inv: Any) -> Any:
    """Two regions (of different head counts) reading angles made from ``inv``, which the function
    also returns (as a forward returns what it saves)."""
    pos = torch.arange(q.shape[-2], dtype=torch.float32)
    cos = (pos[:, None] * inv[None, :]).cos()   # [S, D]
    return q * cos + 1.0, k * cos - 1.0, cos


def _graph() -> tuple[Any, tuple[Any, ...]]:
    from torch.fx.experimental.proxy_tensor import make_fx

    torch.manual_seed(0)
    args = (torch.randn(1, 4, 8, 8), torch.randn(1, 2, 8, 8), torch.randn(8))
    return make_fx(_rotary_pair, tracing_mode="fake")(*args), args


def _returned_cos(gm: Any) -> Any:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return out.args[0][2]


def test_the_returned_angles_are_an_output_of_the_first_region_that_computes_them() -> None:
    gm, args = _graph()
    split = find_regions(gm)
    cos = _returned_cos(gm)
    owners = [r for r in split.regions if cos in r.outputs]
    assert len(owners) == 1 and cos in owners[0].nodes, [r.ops for r in split.regions]
    others = [r for r in split.regions if r is not owners[0] and "aten.cos" in r.ops]
    assert all(cos in r.pulled for r in others)   # the other region computes the angles again
    r = owners[0]
    ins = {n.name: a for n, a in zip((n for n in gm.graph.nodes if n.op == "placeholder"), args)}
    got = run_reference(r.graph, {name: ins[x.name].numpy() for (name, _), x in zip(r.graph.inputs, r.inputs)})
    want = _rotary_pair(*args)[2].numpy()
    i = r.outputs.index(cos)
    assert np.abs(got[r.graph.outputs[i]].reshape(want.shape) - want).max() < 1e-6


def test_a_refused_union_keeps_the_region_and_leaves_the_angles_to_the_framework() -> None:
    gm, _ = _graph()
    cos = _returned_cos(gm)

    def accept(graph: Any) -> str | None:   # any region that stores a [S, D] tensor: refused
        return "refused" if any(len(graph.spec(o).shape) == 2 for o in graph.outputs) else None

    split = find_regions(gm, accept=accept)
    assert split.regions and not [r for r in split.regions if cos in r.outputs or cos in r.nodes]
    assert all("aten.cos" in r.ops for r in split.regions)   # each still computes them
