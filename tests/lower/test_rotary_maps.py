"""Mixed index maps (stitchtune/plan/view_checks.py ``check_mixed``, plan/shift.py ``column_shift``): a region that
splits heads with reshape / transpose and then rotates half of the innermost axis with slice /
concat (Llama's rotary as imported from ONNX) plans, lowers, emulates like the float64 reference
(the emulator faults on any out-of-bounds, unwritten or racy access) and compiles; the mixed
patterns it does not cover are one named line. A transpose / reshape after the rotary (``k^T``) is
a trailing map of the output."""

from __future__ import annotations

import dataclasses
import pytest

from helpers.common import EXAMPLES
from helpers.lowering import check_emulates, DEV, float_graph as _graph, setup
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.errors import UnsupportedGraphError
from stitchtune.gpu.build import NvccBuilder, nvcc_found
from stitchtune.graph.parse import load_graph, parse_graph
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan


def _rotary(B: int, S: int, H: int, D: int, cos_shape: list[int], tail: list[dict] | None = None,
            axis: int = -1, out: str = "out"):
    h = D // 2 if axis == -1 else H // 2
    stop = D if axis == -1 else H
    nodes = [{"id": "xr", "op": "reshape", "args": ["x"], "shape": [B, S, H, D]},
             {"id": "q", "op": "transpose", "args": ["xr"], "perm": [0, 2, 1, 3]},
             {"id": "x2", "op": "slice", "args": ["q"], "axis": axis, "start": h, "stop": stop},
             {"id": "nx2", "op": "neg", "args": ["x2"]},
             {"id": "x1", "op": "slice", "args": ["q"], "axis": axis, "start": 0, "stop": h},
             {"id": "rot", "op": "concat", "args": ["nx2", "x1"], "axis": axis},
             {"id": "qc", "op": "mul", "args": ["q", "cos"]},
             {"id": "rs", "op": "mul", "args": ["rot", "sin"]},
             {"id": "out", "op": "add", "args": ["qc", "rs"]}] + (tail or [])
    return _graph({"x": [B, S, H * D], "cos": cos_shape, "sin": cos_shape}, nodes, [out])


def test_example_plans_with_the_general_map_of_x() -> None:
    g, plan, _ = setup("llama_rotary_small.json")  # B=1, S=8, H=2, D=16
    assert (plan.family, plan.M, plan.N) == ("elementwise", 16, 16)
    assert plan.imap("out").partial_rows  # [B, H, S, D] stored through its permuted map
    assert plan.imap("x").cols.contiguous()
    _, full, _ = setup("llama_rotary.json")
    assert (full.M, full.N) == (8 * 32 * 2048, 128)


def test_example_matches_the_reference() -> None:
    check_emulates(load_graph(EXAMPLES / "llama_rotary_small.json"), 4, 3)


def _mapped_shifted() -> object:
    """q = transpose(x) + y with y [B, H, S, D]: the rows follow x, so the shifted loads of y go
    through its permuted row map (row offset + c + d)."""
    nodes = [{"id": "xt", "op": "transpose", "args": ["x"], "perm": [0, 2, 1, 3]},
             {"id": "q", "op": "add", "args": ["xt", "y"]}] + [
        {"id": "x2", "op": "slice", "args": ["q"], "axis": -1, "start": 4, "stop": 8},
        {"id": "nx2", "op": "neg", "args": ["x2"]},
        {"id": "x1", "op": "slice", "args": ["q"], "axis": -1, "start": 0, "stop": 4},
        {"id": "rot", "op": "concat", "args": ["nx2", "x1"], "axis": -1},
        {"id": "out", "op": "mul", "args": ["rot", "q"]}]
    return _graph({"x": [2, 3, 2, 8], "y": [2, 2, 3, 8]}, nodes, ["out"])


@pytest.mark.parametrize("case", ["cos_2d_odd_half", "then_rmsnorm", "mapped_shifted", "k_transposed",
                                  "heads_merged_back"])
def test_patterns_match_the_reference(case: str) -> None:
    if case == "k_transposed":  # k^T [B, H, D, S] after the rotary: stored through a strided column map
        g = _rotary(2, 4, 2, 8, [1, 1, 4, 8], [{"id": "t", "op": "transpose", "args": ["out"], "perm": [0, 1, 3, 2]}],
                    out="t")
        assert make_plan(g).imap("t").partial_cols
    elif case == "heads_merged_back":  # [B, H, S, D] -> [B, S, H, D] -> [B, S, H*D]
        g = _rotary(2, 4, 2, 8, [4, 8], [
            {"id": "t", "op": "transpose", "args": ["out"], "perm": [0, 2, 1, 3]},
            {"id": "m", "op": "reshape", "args": ["t"], "shape": [2, 4, 16]}], out="m")
    elif case == "mapped_shifted":
        g = _mapped_shifted()
        assert make_plan(g).imap("y").partial_rows  # y is addressed through its permuted map
    elif case == "cos_2d_odd_half":  # cos / sin [S, D], D = 10 (half 5: shifted loads lane by lane)
        g = _rotary(2, 3, 2, 10, [3, 10])
    else:  # a row reduction over D after the rotary (RMSNorm-like)
        g = _rotary(2, 4, 2, 8, [1, 1, 4, 8], [
            {"id": "sq", "op": "mul", "args": ["out", "out"]},
            {"id": "ms", "op": "reduce_mean", "args": ["sq"], "axes": [-1], "keepdims": True},
            {"id": "y", "op": "div", "args": ["out", "ms"]}], out="y")
    check_emulates(g, 3, 3)


def test_a_rotation_along_the_heads_of_an_input_plans_through_its_chain() -> None:
    """Rotate along H, not D, of the head split of an input: the split (reshape + transpose) is a chain of x
    (``plan.chains.composed_chains``) whose shifted positions the kernel carries back to x's offset."""
    for B, cos in ((1, [1, 4, 1, 8]), (2, [1, 4, 4, 8])):
        g = _rotary(B, 4, 4, 8, cos, axis=1)
        plan = make_plan(g)
        assert (plan.family, plan.M, plan.N) == ("elementwise", B * 16, 8)
        check_emulates(g, 2, 3)


def test_unsupported_mixed_patterns_are_one_named_line() -> None:
    body = _rotary(1, 4, 4, 8, [1, 4, 1, 8], axis=1).to_dict()   # rotate along H of a computed tensor's heads
    body["nodes"] = [{"id": "xe", "op": "exp", "args": ["x"]}] + [
        dict(n, args=["xe"]) if n["id"] == "xr" else n for n in body["nodes"]]
    with pytest.raises(UnsupportedGraphError, match="outer axis"):
        make_plan(parse_graph(body))
    g = _rotary(1, 4, 2, 8, [1, 1, 4, 8], [{"id": "t", "op": "transpose", "args": ["out"], "perm": [0, 1, 3, 2]},
                                           {"id": "e", "op": "exp", "args": ["t"]}], out="e")
    with pytest.raises(UnsupportedGraphError, match="node 't' .* is read by 'e'"):
        make_plan(g)


@pytest.mark.slow  # the torch export (~7 s)
def test_onnx_llama_rotary_region_plans(tmp_path) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("torch")
    from importers.test_import_onnx_exported import _export_legacy
    from stitchtune.importers.onnx_import import import_onnx

    path = tmp_path / "llama.onnx"
    _export_legacy("llama", path)
    graphs = [sg.graph for sg in import_onnx(path).subgraphs if {"reshape", "slice"} <= {n.op for n in sg.graph.nodes}]
    assert len(graphs) == 2  # q: head split + rotary, out [B, H, S, D]; k: the same, then k^T [B, H, D, S]
    for g in graphs:
        assert make_plan(g).N == 8  # the head dim D
        check_emulates(g, 1, 3)


@pytest.mark.skipif(not nvcc_found(), reason="nvcc not installed")
def test_renders_and_compiles_for_sm90(tmp_path) -> None:
    from stitchtune.gpu.render import render

    g, plan, space = setup("llama_rotary_small.json")
    s = dataclasses.replace(heuristic_schedule(plan, DEV, space), vec=4)
    assert not space.violations(s)
    src = render(lower(g, plan, s, DEV, space))
    # x at its own element and at c + 8 and c - 8, each one float4 load (D = 16, half 8)
    assert src.count("reinterpret_cast<const float4*>(in0") == 3
    (res,) = NvccBuilder(cache_dir=tmp_path).build([src], arch="sm_90")
    assert res.status == "ok", res.log
