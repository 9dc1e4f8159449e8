"""The lowerers and kernel builders keep their building state to themselves: a ``Lowerer`` is complete at
construction with the sizes its family passes in (``row_sizes``, ``col_sizes``, the transpose's passes),
and a row or column kernel builder's only public field is its frozen index ``ix`` (everything else behind
methods and read-only properties, the Protocols of ``lower/builder.py`` and ``lower/col_exchange.py``)."""

from __future__ import annotations

import random

import pytest

from helpers.lowering import DEV, setup
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.lower.base import Lowerer, Sizes
from stitchtune.lower.builder import RowIndex, RowKernelBuilder
from stitchtune.lower.col import ColLowerer, _ColKernel, col_sizes
from stitchtune.lower.col_exchange import ColIndex
from stitchtune.lower.row import RowLowerer, row_sizes
from stitchtune.lower.row_kernel import RowKernel
from stitchtune.lower.transpose import TransposeLowerer, tile_edge

ROW_EXAMPLES = ("layernorm_small.json", "softmax_odd_small.json", "cross_entropy_small.json", "layernorm_backward_small.json")
COL_EXAMPLES = ("colsum_sigmoid_scale_small.json", "middle_center_small.json", "softmax_colsum_small.json")


def _schedules(name: str, n: int = 6) -> list:
    g, plan, space = setup(name)
    return [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(n)]


def _sizes(low: Lowerer) -> Sizes:
    return Sizes(low.rpb, low.chunk, low.per_thread, low.iters)


@pytest.mark.parametrize("name", ROW_EXAMPLES)
def test_a_row_lowerer_has_its_family_sizes_from_construction(name: str) -> None:
    g, plan, space = setup(name)
    for s in _schedules(name):
        if tile_edge(s):
            continue
        low = RowLowerer(g, plan, s, DEV, space.schemes)
        assert _sizes(low) == row_sizes(plan, s)
        assert _sizes(low).rpb == s.block // s.tpr and low.per_thread * s.tpr == low.chunk
        assert len(low.kernel_reuse) == len(low.segs)   # one set of levels per kernel, set by the constructor


@pytest.mark.parametrize("name", COL_EXAMPLES)
def test_a_col_lowerer_has_its_family_sizes_from_construction(name: str) -> None:
    g, plan, space = setup(name)
    for s in _schedules(name):
        low = ColLowerer(g, plan, s, DEV, space.schemes)
        assert _sizes(low) == col_sizes(plan, s)
        assert low.rpb == 1 and low.chunk * s.split >= plan.M > (low.chunk - 1) * s.split
        assert low.TC == s.block // s.tpr * s.vec and len(low.kernel_reuse) == len(low.segs)


def test_a_transpose_lowerer_has_its_passes_from_construction() -> None:
    g, plan, space = setup("k_transpose_small.json")
    s = heuristic_schedule(plan, DEV, space)
    assert tile_edge(s), "the heuristic tiles this transpose"
    low = TransposeLowerer(g, plan, s, DEV, space.schemes)
    assert low.iters == low.passes == tile_edge(s) ** 2 // (s.vec * s.block)
    assert low.kernel_reuse == [low.reuse]


@pytest.mark.parametrize("name", ROW_EXAMPLES)
def test_a_row_kernel_builder_has_no_public_mutable_field(name: str) -> None:
    g, plan, space = setup(name)
    s = heuristic_schedule(plan, DEV, space)
    low = RowLowerer(g, plan, s, DEV, space.schemes)
    k: RowKernelBuilder = RowKernel(low, 0, low.segs[0], low.n_tasks, low.est_regs, len(low.segs) == 1)
    assert [n for n in vars(k) if not n.startswith("_")] == ["ix"] and isinstance(k.ix, RowIndex)
    assert k.low is low and k.layout.grid >= 1
    with pytest.raises(AttributeError):
        k.layout = k.layout  # type: ignore[misc]  # read-only


@pytest.mark.parametrize("name", COL_EXAMPLES)
def test_a_col_kernel_builder_has_no_public_mutable_field(name: str) -> None:
    g, plan, space = setup(name)
    s = heuristic_schedule(plan, DEV, space)
    low = ColLowerer(g, plan, s, DEV, space.schemes)
    k = _ColKernel(low, 0, low.segs[0], low.n_tasks, low._est_regs)
    assert [n for n in vars(k) if not n.startswith("_")] == ["ix"] and isinstance(k.ix, ColIndex)
