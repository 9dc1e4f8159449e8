"""stitchtune.importers.torch_regions: memory-intensive regions of ATen fx graphs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stitchtune.graph.reference import run_reference  # noqa: E402
from stitchtune.importers.torch_regions import find_regions  # noqa: E402


def _aten(fn: Any, *args: Any) -> Any:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*args)


def _ln_mm_gelu(x: Any, w: Any, g: Any, b: Any) -> Any:
    h = torch.nn.functional.layer_norm(x + 1.0, (x.shape[-1],), g, b)
    y = h @ w
    return torch.nn.functional.gelu(y * 0.5).softmax(-1)


def _args() -> tuple[Any, ...]:
    torch.manual_seed(0)
    return torch.randn(6, 16), torch.randn(16, 8), torch.randn(16), torch.randn(16)


def test_regions_stop_at_compute_ops_and_map_what_pytorch_computes() -> None:
    args = _args()
    gm = _aten(_ln_mm_gelu, *args)
    split = find_regions(gm)
    assert len(split.regions) == 2
    first, second = split.regions
    assert "aten.native_layer_norm" in first.ops and "aten.add" in first.ops
    assert {"aten.gelu", "aten._softmax", "aten.mul"} <= set(second.ops)
    assert any(d.what == "op aten.mm" and "compute" in d.reason for d in split.declined)
    # the first region's graph computes what PyTorch computes for its fx inputs
    x, w, g, b = args
    ins = {name: t.numpy() for (name, _), t in zip(first.graph.inputs, [x, g, b])}
    assert [n.name for n in first.inputs] == ["x_1", "g_1", "b_1"]
    out = run_reference(first.graph, ins)[first.graph.outputs[0]]
    want = torch.nn.functional.layer_norm(x + 1.0, (16,), g, b).numpy()
    assert np.abs(out - want).max() < 1e-5


def test_an_unmappable_node_splits_the_region_and_is_declined_with_its_reason() -> None:
    def f(x: Any) -> Any:
        y = (x * 2.0).exp()
        z = y.transpose(0, 1).contiguous()   # moves elements: not a graph.json op
        return z.softmax(-1) + 1.0

    gm = _aten(f, torch.randn(4, 8))
    split = find_regions(gm)
    assert [r.ops for r in split.regions] == [("aten.mul", "aten.exp"), ("aten.clone", "aten._softmax", "aten.add")]
    assert any(d.what == "op aten.transpose" for d in split.declined)


def test_non_convex_groups_are_split() -> None:
    def f(x: Any, w: Any) -> Any:
        a = x.relu()
        b = a @ w            # a -> mm -> c and a -> c: {a, c} is not convex
        return (a * 2.0) + b

    gm = _aten(f, torch.randn(4, 4), torch.randn(4, 4))
    split = find_regions(gm)
    for r in split.regions:
        inside = set(r.nodes)
        for n in r.inputs:
            assert n not in inside
    assert len(split.regions) == 2


def test_the_planner_can_refuse_a_region() -> None:
    gm = _aten(lambda x: (x.exp() * 3.0).sum(0, keepdim=True) + x.sum(1, keepdim=True), torch.randn(4, 8))
    split = find_regions(gm, accept=lambda g: "refused for the test")
    assert split.regions == ()
    assert any(d.what.startswith("region ") and d.reason == "refused for the test" for d in split.declined)


def test_symbolic_shapes_and_integer_tensors_are_declined() -> None:
    gm = _aten(lambda x, i: x.exp() + i.float(), torch.randn(4, 8), torch.ones(4, 8, dtype=torch.int64))
    split = find_regions(gm)
    assert any("int64" in d.reason for d in split.declined)
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: (x.exp() * 2.0).softmax(-1), tracing_mode="symbolic")(torch.randn(4, 8))
    split = find_regions(gm)
    assert split.regions == ()
    assert any("dynamic shape" in d.reason for d in split.declined)


def test_a_refusal_naming_a_node_declines_that_node_and_keeps_the_rest() -> None:
    def f(x: Any) -> Any:   # row sums and a column sum in one group: the planner takes one kind
        return x * x.sum(-1, keepdim=True) + (x * 2.0).sum(0, keepdim=True)

    gm = _aten(f, torch.randn(4, 8))
    split = find_regions(gm)
    assert split.regions, split.declined
    assert any(d.what.startswith("op aten.sum") and "other axes" in d.reason for d in split.declined)
    assert not any(d.what.startswith("region ") for d in split.declined)


def test_outputs_may_differ_from_pytorch_in_leading_ones_only() -> None:
    gm = _aten(lambda x: (x.exp() * 2.0).view(1, 4, 8), torch.randn(4, 8))
    [r] = find_regions(gm).regions
    assert r.output_shapes == ((1, 4, 8),)
    assert r.graph.spec(r.graph.outputs[0]).shape == (4, 8)
    gm = _aten(lambda x: (x.exp() * 2.0).view(8, 4), torch.randn(4, 8))   # moves rows: not the same tensor
    [r] = find_regions(gm).regions
    assert r.output_shapes == ((4, 8),) and "aten.view" not in r.ops
