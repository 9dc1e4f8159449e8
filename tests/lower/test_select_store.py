"""A stored size-1 slice (BERT's pooler input / ViT's class token: ``x[:, 0:1, :]`` of a LayerNorm
output, an output next to the LayerNorm): ``stitchtune.plan.remap.root_shift`` limits its evaluation
to the positions that store it (coordinate 0 of the sliced axis), where the slice is a one-position
piece moved by its start. The emulator (faults on out-of-bounds, unwritten or racy accesses) matches
the float64 reference for the heuristic and sampled schedules; a size-1 slice used inside a
computation, and a non-zero start of a value computed from per-row reductions, stay one named line."""

from __future__ import annotations


import pytest

from helpers.lowering import check_emulates, float_graph as _graph
from helpers.nvcc import check_compiles_sm90
from stitchtune.errors import UnsupportedGraphError
from stitchtune.gpu.build import nvcc_found
from stitchtune.plan.planner import make_plan
from stitchtune.plan.chains import domain_of
from stitchtune.plan.remap import root_shift
from stitchtune.plan.shift import Shift


def _layernorm_select(B: int, S: int, H: int, start: int = 0, extra: bool = False):
    nodes = [{"id": "a", "op": "add", "args": ["x", "y"]},
             {"id": "m", "op": "reduce_mean", "args": ["a"], "axes": [2], "keepdims": True},
             {"id": "xc", "op": "sub", "args": ["a", "m"]},
             {"id": "sq", "op": "mul", "args": ["xc", "xc"]},
             {"id": "v", "op": "reduce_mean", "args": ["sq"], "axes": [2], "keepdims": True},
             {"id": "ve", "op": "add", "args": ["v", 1e-12]},
             {"id": "rs", "op": "rsqrt", "args": ["ve"]},
             {"id": "xn", "op": "mul", "args": ["xc", "rs"]},
             {"id": "ln", "op": "mul", "args": ["xn", "w"]},
             {"id": "sel", "op": "slice", "args": ["ln"], "axis": 1, "start": start, "stop": start + 1}]
    outs = ["ln", "sel"]
    if extra:
        nodes.append({"id": "sel2", "op": "mul", "args": ["sel", 2.0]})
        outs.append("sel2")
    return _graph({"x": [B, S, H], "y": [B, S, H], "w": [H]}, nodes, outs)


def test_root_shift_limits_a_stored_select_to_the_stored_positions() -> None:
    g = _layernorm_select(2, 8, 32)
    dom = domain_of(g)
    assert root_shift(g, "sel", dom, (0, 1)) == Shift(conds=((1, 0, 1),))
    assert root_shift(g, "ln", dom, (0, 1)).identity  # spans the axis: evaluated at its own element


@pytest.mark.parametrize("B,extra", [(1, False), (3, True)])
def test_layernorm_and_its_class_token_are_one_kernel(B: int, extra: bool) -> None:
    g = _layernorm_select(B, 8, 32, extra=extra)
    plan = make_plan(g)
    assert plan.family == "row" and (plan.M, plan.N) == (B * 8, 32)
    assert plan.imap("sel").plain if B == 1 else plan.imap("sel").store_once
    check_emulates(g, 4, 4)


def test_a_select_at_another_start_of_an_elementwise_value() -> None:
    g = _graph({"x": [3, 8, 32]}, [{"id": "e", "op": "exp", "args": ["x"]},
                                   {"id": "s", "op": "slice", "args": ["e"], "axis": 1, "start": 5, "stop": 6},
                                   {"id": "s2", "op": "add", "args": ["s", 1.0]}], ["e", "s2"])
    check_emulates(g, 4, 4)


def test_what_stays_refused_is_one_line() -> None:
    with pytest.raises(UnsupportedGraphError, match="per-row value under a slice/concat along a row axis"):
        make_plan(_layernorm_select(2, 8, 32, start=3))  # row 0 would need row 3's statistics
    g = _graph({"x": [2, 8, 32]}, [{"id": "s", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": 1},
                                   {"id": "y", "op": "sub", "args": ["x", "s"]}], ["y"])
    with pytest.raises(UnsupportedGraphError, match="has size 1 along axis 1 and is broadcast"):
        make_plan(g)


@pytest.mark.slow  # nvcc
@pytest.mark.skipif(not nvcc_found(), reason="nvcc not installed")
def test_renders_and_compiles_for_sm90(tmp_path) -> None:
    check_compiles_sm90(_layernorm_select(8, 197, 768), 2, tmp_path)
