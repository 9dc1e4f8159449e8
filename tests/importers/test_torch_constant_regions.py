"""Constant tensors of an fx graph (position ids, causal masks) inside the regions that read them:
computed again by each region (int registers) or resolved at import time (a range of embedding ids is
a slice of the table), never an input that the framework computes in a kernel of its own."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stitchtune.graph.reference import run_reference  # noqa: E402
from stitchtune.importers.torch_regions import find_regions  # noqa: E402
from tests.helpers import check_emulates  # noqa: E402


def _aten(fn: Any, *args: Any) -> Any:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*args)


def _values(gm: Any, args: tuple[Any, ...]) -> dict[Any, Any]:
    """Every fx node's value when ``gm`` runs on ``args``."""
    from torch.fx import Interpreter

    env: dict[Any, Any] = {}

    class _Record(Interpreter):
        def run_node(self, n: Any) -> Any:
            env[n] = out = super().run_node(n)
            return out

    _Record(gm).run(*args)
    return env


def _check_against_torch(gm: Any, split: Any, args: tuple[Any, ...]) -> None:
    """Each region's graph (numpy reference) computes what PyTorch computes for its outputs."""
    env = _values(gm, args)
    for r in split.regions:
        ins = {name: env[x].numpy() for (name, _), x in zip(r.graph.inputs, r.inputs)}
        got = run_reference(r.graph, ins)
        for o, name in zip(r.outputs, r.graph.outputs):
            assert np.abs(got[name].reshape(env[o].shape) - env[o].numpy()).max() < 1e-5, (r.name, name)


def _embed(ids: Any, wte: Any, wpe: Any, g: Any, b: Any, step: int = 1) -> Any:
    """GPT-2's embeddings: token rows plus position rows of ``arange(S) * step``, then a layer norm."""
    pos = (torch.arange(ids.shape[1]) * step).unsqueeze(0)
    h = torch.nn.functional.embedding(ids, wte) + torch.nn.functional.embedding(pos, wpe)
    return torch.nn.functional.layer_norm(h, (wte.shape[1],), g, b)


def _embed_args() -> tuple[Any, ...]:
    torch.manual_seed(0)
    return torch.randint(0, 50, (2, 8)), torch.randn(50, 32), torch.randn(24, 32), torch.randn(32), torch.randn(32)


def test_position_ids_that_are_a_range_of_rows_read_a_slice_of_the_table() -> None:
    args = _embed_args()
    gm = _aten(lambda ids, wte, wpe, g, b: _embed(ids, wte, wpe, g, b), *args)
    split = find_regions(gm)
    [r] = split.regions
    assert not split.declined, split.declined
    assert not [x for x in r.inputs if x in split.constants]      # no position ids computed by PyTorch
    ops = [n.op for n in r.graph.nodes]
    assert ops.count("gather") == 1 and "slice" in ops and "iota" not in ops   # rows [0, 8) of wpe
    _check_against_torch(gm, split, args)
    check_emulates(r.graph, n_samples=2)


def test_constant_ids_that_are_not_a_range_stay_an_input_of_the_gather() -> None:
    args = _embed_args()
    gm = _aten(lambda ids, wte, wpe, g, b: _embed(ids, wte, wpe, g, b, step=2), *args)
    split = find_regions(gm)
    [r] = split.regions
    assert [n.op for n in r.graph.nodes].count("gather") == 2
    assert [x for x in r.inputs if x in split.constants]          # the ids [0, 2, 4, ...]: an input
    _check_against_torch(gm, split, args)


def _causal(s: Any, v: Any) -> Any:
    """A causal mask from aranges (``le``, ``& True``, ``where``) added to two attention layers' scores."""
    n = s.shape[-1]
    rows, cols = torch.arange(n), torch.arange(n)
    causal = (cols[None, None, None, :] <= rows[None, None, :, None]) & torch.ones((), dtype=torch.bool)
    mask = torch.where(causal, torch.zeros(()), torch.finfo(torch.float32).min)
    p = (s * 0.5 + mask).softmax(-1)
    return ((p @ v) + mask).softmax(-1)


def test_a_causal_mask_of_aranges_is_computed_by_each_region_that_reads_it() -> None:
    torch.manual_seed(0)
    args = (torch.randn(1, 2, 8, 8), torch.randn(1, 2, 8, 8))
    gm = _aten(_causal, *args)
    split = find_regions(gm)
    assert [d.what for d in split.declined] == ["op aten.bmm"], split.declined
    assert len(split.regions) == 2
    for r in split.regions:
        assert [n.name for n in r.inputs if n in split.constants] == []
        ops = {n.op for n in r.graph.nodes}
        assert {"iota", "le", "where"} <= ops and "logical_and" not in ops   # ``& True`` is the mask itself
        check_emulates(r.graph, n_samples=2)
    _check_against_torch(gm, split, args)


def _rotate(x: Any) -> Any:
    """rotate_half (slice, neg, concat) times the cosine of float positions from an arange."""
    pos = torch.arange(x.shape[-2]).float()[:, None]
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1) * torch.cos(pos * 0.5) + x


def test_positions_beside_a_concat_are_computed_in_the_region() -> None:
    torch.manual_seed(0)
    args = (torch.randn(2, 8, 16), torch.randn(16, 16))
    gm = _aten(lambda x, w: _rotate(x @ w), *args)
    split = find_regions(gm)
    [r] = split.regions
    assert "aten.cat" in r.ops and [d.what for d in split.declined] == ["op aten.mm"], split.declined
    assert not [x for x in r.inputs if x in split.constants]
    assert {"iota", "cos", "concat"} <= {n.op for n in r.graph.nodes}
    _check_against_torch(gm, split, args)
    check_emulates(r.graph, n_samples=2)


def test_a_region_that_cannot_compute_its_constants_reads_them_as_inputs() -> None:
    """The planner refuses a gather by input ids in a region that computes with ints (naming the
    gather): rather than leaving the embedding out, the region maps again with the constant (a
    position mask of aranges) as an input, computed by the framework as before constants were pulled."""
    args = _embed_args()[:2]

    def f(ids: Any, wte: Any) -> Any:
        keep = (torch.arange(ids.shape[1]) < ids.shape[1] - 1)[None, :, None]
        return (torch.nn.functional.embedding(ids, wte) * keep.float()).softmax(-1)

    gm = _aten(f, *args)
    split = find_regions(gm)
    [r] = split.regions
    assert not split.declined, split.declined
    assert "aten.embedding" in r.ops and [x for x in r.inputs if x in split.constants]
    assert "iota" not in {n.op for n in r.graph.nodes}
    _check_against_torch(gm, split, args)


def test_index_grid_rotation_finds_one_axis_rolls_only() -> None:
    from stitchtune.importers.index_grid import rotation

    grid = np.arange(4 * 6 * 8).reshape(4, 6, 8)
    assert rotation(np.roll(grid, -2, axis=1), (4, 6, 8)) == (1, 2)
    assert rotation(np.roll(grid, 3, axis=2), (4, 6, 8)) == (2, 5)     # roll by +3: starts at 8 - 3
    assert rotation(grid, (4, 6, 8)) is None                           # no rotation: a reshape
    assert rotation(np.roll(np.roll(grid, 1, axis=0), 1, axis=2), (4, 6, 8)) is None   # two axes at once
    assert rotation(grid[:, ::-1], (4, 6, 8)) is None


def test_a_roll_of_constant_indices_is_two_slices_and_a_concat() -> None:
    """Swin's cyclic shift: ``torch.roll`` along the outer (spatial) axes, which torch decomposes into
    ``index`` by ``(arange + shift) % n`` (``fmod`` of constants, folded): each roll is mapped onto a
    concat of two slices of the rolled axis, so the shift sits in the region (no int64 index)."""
    torch.manual_seed(0)
    args = (torch.randn(1, 4, 6, 8), torch.randn(8, 8))

    def f(x: Any, w: Any) -> Any:
        return torch.roll((x @ w) * 2.0, shifts=(-1, 2), dims=(1, 2)) + 1.0

    from torch._inductor.decomposition import select_decomp_table   # (the backend's decompositions)
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(f, decomposition_table=select_decomp_table(), tracing_mode="fake")(*args)
    assert any("fmod" in str(n.target) or "remainder" in str(n.target) for n in gm.graph.nodes), gm.graph
    split = find_regions(gm)
    [r] = split.regions
    assert [d.what for d in split.declined] == ["op aten.mm"], split.declined
    ops = [n.op for n in r.graph.nodes]
    assert ops.count("concat") == 2 and ops.count("slice") == 4
    _check_against_torch(gm, split, args)
    check_emulates(r.graph, n_samples=2)
