"""A region that would store an output across its rows is planned in that output's layout (issue 39).

BERT's training ``region_view_59``: K's gradient ``[B*H, D, S]`` viewed ``[B, S, H*D]`` (the transposed
copy) and summed over ``B*S`` (the bias gradient). In the input's layout the sum runs along ``S``, the
input's stride-1 axis: a row plan (``768 x 4096``) whose copy is stored 768 floats apart along the
view's columns, every 4-byte store a sector of its own (8.00x, the worst sectors of BERT's training
audit). In the copy's layout it is a column plan (``4096 x 768``): the copy is stored 16 bytes a lane,
whole sectors, and the input is read across the rows, which a column tile of 8 threads (a warp over
4 adjacent rows) reads at 2.00x (``cost.heuristic`` rule 2).
"""

from __future__ import annotations

from typing import Any

import pytest

from helpers.lowering import DEV, check_emulates, float_graph
from stitchtune.analysis.audit import audit_graph
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.plan.family import Family
from stitchtune.plan.planner import StitchPlan, _plan_layout, make_plan, stored_across_rows
from stitchtune.space import SearchSpace


def k_grad_bias(b: int = 8, h: int = 12, d: int = 64, s: int = 512) -> Any:
    """``region_view_59``'s ops: ``[B*H, D, S]`` -> ``[B, S, H*D]`` -> ``[B*S, H*D]`` and its column sum."""
    return float_graph({"x": [b * h, d, s]}, [
        {"id": "v", "op": "reshape", "args": ["x"], "shape": [b, h, d, s]},
        {"id": "p", "op": "transpose", "args": ["v"], "perm": [0, 3, 1, 2]},
        {"id": "m", "op": "reshape", "args": ["p"], "shape": [b, s, h * d]},
        {"id": "y", "op": "reshape", "args": ["m"], "shape": [b * s, h * d]},
        {"id": "db", "op": "reduce_sum", "args": ["y"], "axes": [0], "keepdims": True}], ["y", "db"])


def test_the_default_layout_would_store_the_copy_across_rows() -> None:
    default = _plan_layout(k_grad_bias(), None)
    assert isinstance(default, StitchPlan)
    assert default.family == Family.ROW and stored_across_rows(default) == ("y",)


def test_the_region_is_planned_in_the_copy_layout() -> None:
    plan = make_plan(k_grad_bias())
    assert plan.family == Family.COL and (plan.M, plan.N) == (4096, 768)
    assert stored_across_rows(plan) == ()
    assert dict(plan.index_maps)["y"].vector_contiguous


def test_a_plan_storing_nothing_across_rows_keeps_its_layout() -> None:
    """A layer norm (row plan, outputs along the columns) is planned as always."""
    g = float_graph({"x": [64, 256]}, [
        {"id": "m", "op": "reduce_mean", "args": ["x"], "axes": [-1], "keepdims": True},
        {"id": "y", "op": "sub", "args": ["x", "m"]}], ["y"])
    plan = make_plan(g)
    assert plan.family == Family.ROW and stored_across_rows(plan) == ()


def test_the_heuristic_gives_a_warp_four_adjacent_rows() -> None:
    plan = make_plan(k_grad_bias())
    s = heuristic_schedule(plan, DEV, SearchSpace.for_plan(plan, DEV))
    assert s.block // s.tpr == 8 and s.tpr == 32


def test_sectors_8x_to_1x() -> None:
    a = audit_graph(k_grad_bias(), DEV, sass=False, slice_blocks=2)
    (k,) = a.kernels
    stores = [x for x in k.accesses if x.op == "store" and x.buf == "out0"]
    loads = [x for x in k.accesses if x.op == "load" and x.buf == "in0"]
    assert stores and all(x.ratio == 1.0 and x.access_bits == 128 for x in stores)   # was 8.00x, 32-bit
    # the loads, across the planned layout, were 2.00x 32-bit; the column family's row vectors (4 rows per lane)
    # make them 128-bit at their ideal sectors where the rows divide (lower/row_vectors.py)
    assert loads and max(x.ratio for x in loads) == 1.0 and any(x.access_bits == 128 for x in loads)


@pytest.mark.parametrize("shape", [(2, 3, 8, 16), (1, 2, 16, 40)])
def test_small_shapes_emulate_the_reference(shape: tuple[int, int, int, int]) -> None:
    check_emulates(k_grad_bias(*shape), n_samples=3)
