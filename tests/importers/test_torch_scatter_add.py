"""An embedding's gradient in torch regions (:mod:`stitchtune.importers.torch_scatter`):
``_unsafe_masked_index_put_accumulate(full(0), mask, [ids], v)`` and ``index_put(zeros, [ids], v,
accumulate=True)`` map to ``scatter_add(where(mask, v, 0), ids)``; each region's reference on the eager
values of its inputs equals eager (``_check_regions``); other index puts are declined with a reason."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from test_torch_int_ops import _aten, _check_regions  # noqa: E402

from stitchtune.importers.torch_regions import find_regions  # noqa: E402


def _masked(pad: int) -> Any:
    """The ATen ops of an embedding's backward with ``padding_idx`` after the backend's decompositions:
    a layer norm's backward-like product, then the masked accumulate into zeros."""
    def f(dy: Any, w: Any, ids: Any) -> Any:
        v = dy * w - (dy * w).sum(-1, keepdim=True)
        mask = ((ids >= 0) & (ids < 20) & (ids != pad)).unsqueeze(-1)
        base = torch.full((20, 16), 0.0)
        return torch.ops.aten._unsafe_masked_index_put_accumulate(base, mask, [ids], v)
    return f


def _plain(dy: Any, ids: Any) -> Any:
    return torch.zeros(20, 16).index_put([ids], dy * 3.0, accumulate=True)


def _args(ids_dtype: Any = torch.int64) -> tuple[Any, ...]:
    torch.manual_seed(0)
    ids = torch.randint(0, 20, (2, 8), dtype=ids_dtype)
    ids[0, :3] = torch.tensor([0, 5, 5], dtype=ids_dtype)   # padding row 0, a repeated row
    return torch.randn(2, 8, 16), torch.randn(16), ids


def test_the_masked_accumulate_is_a_scatter_add_in_the_region() -> None:
    args = _args()
    split = _check_regions(_aten(_masked(0), *args), *args)
    [r] = split.regions
    assert split.declined == ()
    ops = [n.op for n in r.graph.nodes]
    assert ops[-1] == "scatter_add" and "where" in ops
    node = r.graph.nodes[-1]
    assert node.shape == (20, 16) and r.graph.outputs == (node.id,)
    assert {"ids" if spec.dtype == "int64" else spec.dtype for _, spec in r.graph.inputs} >= {"ids"}


def test_index_put_accumulate_into_zeros_maps_without_a_mask() -> None:
    dy, _, ids = _args(torch.int32)
    split = _check_regions(_aten(_plain, dy, ids), dy, ids)
    [r] = split.regions
    assert [n.op for n in r.graph.nodes] == ["mul", "scatter_add"]


@pytest.mark.parametrize("case,why", [
    ("overwrite", "an index copy of several positions"),
    ("base", "not a fresh tensor of zeros"),
    ("two indices", "several index tensors"),
])
def test_other_index_puts_are_declined_with_a_reason(case: str, why: str) -> None:
    def f(dy: Any, ids: Any, t: Any) -> Any:
        v = dy * 2.0
        if case == "overwrite":
            return torch.zeros(20, 16).index_put([ids], v)
        if case == "base":
            return t.index_put([ids], v, accumulate=True)
        return torch.zeros(20, 16).index_put([ids, ids], v[..., 0], accumulate=True)

    dy, _, ids = _args()
    gm = _aten(f, dy, ids, torch.randn(20, 16))
    split = find_regions(gm)
    assert any(d.what == "op aten.index_put" and why in d.reason for d in split.declined), split.declined


def test_a_computed_index_is_left_to_the_framework() -> None:
    """The region scatters by input ids only: ids computed in the graph (``ids + 1``) are computed by
    PyTorch and read as the region's input."""
    def f(dy: Any, ids: Any) -> Any:
        return torch.zeros(21, 16).index_put([ids + 1], dy * 2.0, accumulate=True)

    dy, _, ids = _args()
    split = _check_regions(_aten(f, dy, ids), dy, ids)
    assert any(n.op == "scatter_add" for r in split.regions for n in r.graph.nodes)
    assert any("computes indices" in d.reason for d in split.declined), split.declined


def test_a_16_bit_table_maps() -> None:
    def f(dy: Any, ids: Any) -> Any:
        return torch.zeros(20, 16, dtype=torch.bfloat16).index_put([ids], dy * 2.0, accumulate=True)

    dy, _, ids = _args()
    dy = dy.to(torch.bfloat16)
    split = find_regions(_aten(f, dy, ids))
    [r] = split.regions
    assert r.graph.nodes[-1].op == "scatter_add" and r.graph.nodes[-1].dtype == "bfloat16"


def _expanded_ids(dy: Any, w: Any, tt: Any) -> Any:
    """BERT's token-type gradient as the min-cut partition leaves it: one row of ids (``[1, S]``, a buffer)
    expanded over the batch in the backward graph."""
    v = dy * w
    ids = tt.expand(dy.shape[0], tt.shape[1])
    mask = ((ids >= 0) & (ids < 2) & (ids != -1)).unsqueeze(-1)
    return torch.ops.aten._unsafe_masked_index_put_accumulate(torch.full((2, 16), 0.0), mask, [ids], v)


def test_ids_expanded_over_the_batch_are_a_region_input() -> None:
    """The expand stays with PyTorch and the region reads the expanded ids (declined whole before: values
    [2, 8, 16] against the unexpanded ids [1, 8])."""
    torch.manual_seed(0)
    args = (torch.randn(2, 8, 16), torch.randn(16), torch.randint(0, 2, (1, 8)))
    split = _check_regions(_aten(_expanded_ids, *args), *args)
    [r] = split.regions
    assert [n.op for n in r.graph.nodes][-1] == "scatter_add"
    assert ("int64", (2, 8)) in {(spec.dtype, tuple(spec.shape)) for _, spec in r.graph.inputs}
    assert [d.what for d in split.declined] == ["op aten.expand"]


def _unexpanded_ids(dy: Any, w: Any, ids: Any) -> Any:
    """An ``expand`` to the ids' own shape (a no-op view) read as the scatter's index."""
    e = ids.expand(dy.shape[0], dy.shape[1])
    mask = ((e >= 0) & (e < 2)).unsqueeze(-1)
    return torch.ops.aten._unsafe_masked_index_put_accumulate(torch.full((2, 16), 0.0), mask, [e], dy * w)


def test_an_expand_that_expands_nothing_stays_in_the_region() -> None:
    """Only an expand that broadcasts the ids is left to PyTorch; one to their own shape maps as a view, as
    before the rule (it was declined: one more PyTorch op and an 'op aten.expand' line for nothing)."""
    torch.manual_seed(0)
    args = (torch.randn(2, 8, 16), torch.randn(16), torch.randint(0, 2, (2, 8)))
    split = _check_regions(_aten(_unexpanded_ids, *args), *args)
    [r] = split.regions
    assert [n.op for n in r.graph.nodes][-1] == "scatter_add"
    assert not split.declined
