"""Slice / concat along the columns of a column-reduction region (``plan.col_remap``,
``lower.col_remap``): GPT-2's q/k/v gradient concat (each gradient read through its head merge, a
layout chain) with the c_attn bias gradient (the column sum of the concat) is one column kernel;
slices of a wider input, element-wise work under a moved column, per-row values and several column
axes emulate like the float64 reference for the heuristic and sampled schedules (the emulator faults
on any out-of-bounds, unwritten or racy access); what a column kernel cannot evaluate is refused in
one line that names the column reduction first."""

from __future__ import annotations

import pytest

from helpers.lowering import check_emulates, float_graph as _graph, plan_or_refused
from helpers.nvcc import check_compiles_sm90
from stitchtune.errors import UnsupportedGraphError
from stitchtune.gpu.build import nvcc_found
from stitchtune.plan.planner import TensorClass, make_plan
from stitchtune.plan.family import Family


def _qkv_grad(nh: int = 4, S: int = 8, D: int = 8):
    """GPT-2's backward of c_attn's split: the q, k and v gradients ``[nh, S, D]`` (k's transposed, as
    the scores' backward gives it) merged back to ``[1, S, nh*D]``, concatenated along the columns, and
    the bias gradient: their sum over the tokens."""
    nodes = []
    for i, perm in enumerate(([0, 2, 1, 3], [0, 3, 1, 2], [0, 2, 1, 3])):
        nodes += [{"id": f"r{i}", "op": "reshape", "args": [f"g{i}"], "shape": [1, nh, S, D] if i != 1 else [1, nh, D, S]},
                  {"id": f"t{i}", "op": "transpose", "args": [f"r{i}"], "perm": perm},
                  {"id": f"h{i}", "op": "reshape", "args": [f"t{i}"], "shape": [1, S, nh * D]}]
    nodes += [{"id": "cat", "op": "concat", "args": ["h0", "h1", "h2"], "axis": 2},
              {"id": "db", "op": "reduce_sum", "args": ["cat"], "axes": [1], "keepdims": True}]
    shapes = {"g0": [nh, S, D], "g1": [nh, D, S], "g2": [nh, S, D]}
    return _graph(shapes, nodes, ["cat", "db"])


def test_gpt2_qkv_gradient_concat_and_bias_gradient_are_one_column_kernel() -> None:
    g = _qkv_grad()
    plan = make_plan(g)
    assert (plan.family, plan.M, plan.N) == (Family.COL, 8, 96)
    assert plan.cls("db") is TensorClass.PER_KEPT
    check_emulates(g, 6, 2)


def test_slices_of_a_wider_input_and_work_under_a_moved_column() -> None:
    # x [6, 40]: two column slices, one scaled, concatenated in the other order, times a per-row
    # value (the same at any column) plus a bias read at the sweep's own column; column sums
    nodes = [{"id": "a", "op": "slice", "args": ["x"], "axis": 1, "start": 4, "stop": 20},
             {"id": "b", "op": "slice", "args": ["x"], "axis": 1, "start": 24, "stop": 40},
             {"id": "b2", "op": "mul", "args": ["b", "w"]},
             {"id": "e", "op": "exp", "args": ["b2"]},
             {"id": "c", "op": "concat", "args": ["e", "a"], "axis": 1},
             {"id": "y", "op": "add", "args": ["c", "bias"]},
             {"id": "s", "op": "reduce_sum", "args": ["y"], "axes": [0], "keepdims": True},
             {"id": "m", "op": "reduce_max", "args": ["y"], "axes": [0], "keepdims": True},
             {"id": "z", "op": "sub", "args": ["y", "m"]}]
    g = _graph({"x": [6, 40], "w": [6, 1], "bias": [1, 32]}, nodes, ["z", "s"])
    plan = make_plan(g)
    assert (plan.family, plan.M, plan.N) == (Family.COL, 6, 32)
    check_emulates(g, 6, 3)


def test_a_concat_over_several_row_axes_with_a_per_row_value() -> None:
    # [B, T, C] summed over B and T (rows B*T, columns C); a per-row scale [B, T, 1] is the same at
    # every column, so it is read under the moved column as the sweep's own value
    nodes = [{"id": "pw", "op": "mul", "args": ["p", "w"]},
             {"id": "c", "op": "concat", "args": ["pw", "q"], "axis": 2},
             {"id": "y", "op": "mul", "args": ["c", "c"]},
             {"id": "s", "op": "reduce_sum", "args": ["y"], "axes": [0, 1], "keepdims": True}]
    g = _graph({"p": [3, 5, 12], "q": [3, 5, 4], "w": [3, 5, 1]}, nodes, ["s", "c"])
    plan = make_plan(g)
    assert (plan.family, plan.M, plan.N) == (Family.COL, 15, 16)
    check_emulates(g, 6, 5)


@pytest.mark.parametrize("case, words", [
    ("reduced_then_moved", "varies along the columns only"),
    ("along_rows", "innermost axis"),
])
def test_what_a_column_kernel_cannot_evaluate_is_refused_naming_the_reduction(case: str, words: str) -> None:
    if case == "reduced_then_moved":   # a column sum read at a moved column: another thread's value
        nodes = [{"id": "s", "op": "reduce_sum", "args": ["x"], "axes": [0], "keepdims": True},
                 {"id": "d", "op": "sub", "args": ["x", "s"]},
                 {"id": "a", "op": "slice", "args": ["d"], "axis": 1, "start": 0, "stop": 8},
                 {"id": "b", "op": "slice", "args": ["d"], "axis": 1, "start": 8, "stop": 16},
                 {"id": "c", "op": "concat", "args": ["b", "a"], "axis": 1}]
        obj_inputs, outs = {"x": [6, 16]}, ["c"]
    else:   # a concat along the reduced rows
        nodes = [{"id": "c", "op": "concat", "args": ["p", "q"], "axis": 0},
                 {"id": "s", "op": "reduce_sum", "args": ["c"], "axes": [0], "keepdims": True}]
        obj_inputs, outs = {"p": [4, 16], "q": [2, 16]}, ["s"]
    g = _graph(obj_inputs, nodes, outs)
    with pytest.raises(UnsupportedGraphError) as err:
        make_plan(g)
    msg = str(err.value)
    assert "\n" not in msg and words in msg and msg.startswith("column reduction 's' next to "), msg


def test_a_column_reduction_with_a_gather_stays_refused() -> None:
    obj = {"name": "t", "inputs": {"tab": {"shape": [10, 16], "dtype": "float32"},
                                   "ids": {"shape": [6], "dtype": "int64"}},
           "nodes": [{"id": "e", "op": "gather", "args": ["tab", "ids"], "axis": 0},
                     {"id": "s", "op": "reduce_sum", "args": ["e"], "axes": [0], "keepdims": True}],
           "outputs": ["s"]}
    _, plan = plan_or_refused(obj)
    assert plan is None


@pytest.mark.slow  # nvcc
@pytest.mark.skipif(not nvcc_found(), reason="nvcc not installed")
def test_the_qkv_gradient_concat_compiles_for_sm90(tmp_path) -> None:
    check_compiles_sm90(_qkv_grad(12, 64, 64), 3, tmp_path)
