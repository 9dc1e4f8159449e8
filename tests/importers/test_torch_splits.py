"""A ``split`` / ``split_with_sizes`` (``chunk``) read through ``getitem`` becomes one ``slice`` per part
(:func:`stitchtune.importers.torch_fx_util.splits_as_slices`), so a region reads the split tensor
itself (Phi-3's fused ``gate_up_proj`` output, halves of one matmul); a slice of a region's input that
is read outside the region too is an alias of that input (PyTorch views it again), not an output."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from stitchtune.importers.torch_fx_util import splits_as_slices  # noqa: E402
from stitchtune.importers.torch_regions import find_regions  # noqa: E402


def _gate_up(x: object) -> object:
    gate, up = torch.chunk(x, 2, dim=-1)   # (ATen: split)
    return torch.nn.functional.silu(gate) * up


def _ops(gm: object) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]   # type: ignore[attr-defined]


def test_split_parts_are_slices_and_the_region_reads_the_split_tensor() -> None:
    x = torch.randn(2, 3, 8)
    gm = make_fx(_gate_up, tracing_mode="fake")(x)
    assert "aten.split.Tensor" in _ops(gm)
    before = find_regions(gm)
    assert [d.what for d in before.declined] == ["op aten.split"]
    assert [[i.name for i in r.inputs] for r in before.regions] == [["getitem", "getitem_1"]]
    sliced = splits_as_slices(gm)
    assert sliced is not None and "aten.split.Tensor" not in _ops(sliced) and "aten.split.Tensor" in _ops(gm)
    assert _ops(sliced).count("aten.slice.Tensor") == 2
    assert torch.equal(sliced(x), _gate_up(x))
    after = find_regions(sliced)
    assert not after.declined and len(after.regions) == 1
    assert [i.op for i in after.regions[0].inputs] == ["placeholder"]   # x itself, no part copied


def test_uneven_sizes() -> None:
    def f(x: object) -> object:
        parts = torch.split(x, [3, 1, 4], dim=1)
        return parts[0].sum(1, keepdim=True) + parts[2].sum(1, keepdim=True)

    x = torch.randn(2, 8)
    sliced = splits_as_slices(make_fx(f, tracing_mode="fake")(x))
    assert sliced is not None
    bounds = sorted(tuple(n.args[1:]) for n in sliced.graph.nodes if str(n.target) == "aten.slice.Tensor")
    assert bounds[0] == (1, 0, 3) and bounds[-1] == (1, 4, 8) and set(bounds) <= {(1, 0, 3), (1, 3, 4), (1, 4, 8)}
    assert torch.allclose(sliced(x), f(x))


def test_a_graph_without_splits_is_not_copied() -> None:
    gm = make_fx(lambda x: x.sin() * 2, tracing_mode="fake")(torch.randn(4))
    assert splits_as_slices(gm) is None


def test_a_slice_of_an_input_read_outside_the_region_is_an_alias() -> None:
    def f(x: object) -> tuple[object, object]:
        a = x[:, :3]
        return a.sin(), a

    split = find_regions(make_fx(f, tracing_mode="fake")(torch.randn(2, 8)))
    (r,) = split.regions
    assert not split.declined
    assert [(a.name, b.name) for a, b in r.aliases] == [("slice_1", "x_1")]
    assert [o.name for o in r.outputs] == ["sin"]


def test_a_split_along_a_static_dim_of_a_symbolic_tensor_becomes_slices() -> None:
    """GPT-2's prompt graph under dynamic=True: ``c_attn``'s ``[1, s, 192]`` cut in three along its last
    dim (static) with ``s`` symbolic; a split along the symbolic dim stays a split."""
    x = torch.randn(1, 5, 12)   # (a weight's dim is static: the product's last dim, its others symbolic)
    w = torch.eye(12)
    gm = make_fx(lambda t: [p * 2.0 for p in (t @ w).split(4, dim=2)], tracing_mode="symbolic",
                 _allow_non_fake_inputs=True)(x)
    assert "aten.split.Tensor" in _ops(gm)
    sliced = splits_as_slices(gm)
    assert sliced is not None and _ops(sliced).count("aten.slice.Tensor") == 3
    for got, want in zip(sliced(torch.full((1, 7, 12), 1.5)), [torch.full((1, 7, 4), 3.0)] * 3):
        assert torch.equal(got, want)
    along = make_fx(lambda t: [p * 2.0 for p in t.split(2, dim=1)], tracing_mode="symbolic")(torch.randn(1, 4, 12))
    assert splits_as_slices(along) is None
