"""Index maps of the planner: strides, zero strides, div/mod and vector legality of each broadcast
pattern of real models, checked against numpy's broadcasting element by element; and the patterns
still refused, each with one line naming the tensor or node."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.lowering import float_graph as _graph
from stitchtune.errors import UnsupportedGraphError
from stitchtune.plan.index_map import AxisMap, Factor, IndexMap
from stitchtune.plan.planner import TensorClass, make_plan


def _softmax_of(a: str, b: str, op: str = "add") -> list[dict]:
    return [{"id": "z", "op": op, "args": [a, b]},
            {"id": "m", "op": "reduce_max", "args": ["z"], "axes": [-1], "keepdims": True},
            {"id": "d", "op": "sub", "args": ["z", "m"]},
            {"id": "e", "op": "exp", "args": ["d"]},
            {"id": "s", "op": "reduce_sum", "args": ["e"], "axes": [-1], "keepdims": True},
            {"id": "y", "op": "div", "args": ["e", "s"]}]


def _assert_matches_numpy(plan, name: str, shape: list[int], domain: list[int]) -> None:
    """offset(r, c) of every view element is where numpy's broadcasting takes the element from."""
    im = plan.imap(name)
    want = np.broadcast_to(np.arange(int(np.prod(shape))).reshape(shape), domain).reshape(plan.M, plan.N)
    r, c = np.meshgrid(np.arange(plan.M), np.arange(plan.N), indexing="ij")
    got = np.vectorize(im.offset)(r, c)
    np.testing.assert_array_equal(got, want)
    assert got.min() >= 0 and got.max() < im.size


def test_position_embedding_broadcasts_along_the_batch() -> None:
    B, S, H = 3, 5, 8
    g = _graph({"x": [B, S, H], "pos": [1, S, H]}, _softmax_of("x", "pos"), ["y"])
    p = make_plan(g)
    assert (p.family, p.M, p.N) == ("row", B * S, H)
    pos = p.imap("pos")
    assert pos.rows == AxisMap(B * S, (Factor(S, 1, H),)) and pos.rows.needs_mod(pos.rows.factors[0])
    assert pos.vector_contiguous and not pos.plain and p.mapped("pos")
    assert p.cls("pos") is TensorClass.FULL and "pos" in p.input_names
    assert p.imap("x").plain and not p.mapped("x") and p.imap("x").rows == AxisMap(B * S, (Factor(B * S, 1, H),))
    _assert_matches_numpy(p, "pos", [1, S, H], [B, S, H])
    _assert_matches_numpy(p, "x", [B, S, H], [B, S, H])


@pytest.mark.parametrize("mask", [[2, 1, 1, 6], [2, 1, 6, 6], [1, 1, 6, 6], [1, 3, 1, 6]])
def test_attention_masks_against_scores(mask: list[int]) -> None:
    B, Hh, S = 2, 3, 6
    g = _graph({"scores": [B, Hh, S, S], "mask": mask}, _softmax_of("scores", "mask"), ["y"])
    p = make_plan(g)
    assert (p.family, p.M, p.N) == ("row", B * Hh * S, S)
    im = p.imap("mask")
    assert p.cls("mask") is TensorClass.FULL and p.mapped("mask") and im.vector_contiguous
    _assert_matches_numpy(p, "mask", mask, [B, Hh, S, S])
    if mask == [2, 1, 1, 6]:  # one factor: the batch, no modulo (it is the outermost row axis)
        f = im.rows.factors
        assert f == (Factor(B, Hh * S, S),) and not im.rows.needs_mod(f[0])
    if mask == [2, 1, 6, 6]:  # batch and query row: two factors, the head axis skipped (stride 0)
        assert im.rows.factors == (Factor(B, Hh * S, S * S), Factor(S, 1, S))


def test_rotary_cos_sin_elementwise() -> None:
    B, Hh, S, D = 2, 3, 5, 8
    nodes = [{"id": "a", "op": "mul", "args": ["x", "cos"]}, {"id": "b", "op": "mul", "args": ["x", "sin"]},
             {"id": "y", "op": "add", "args": ["a", "b"]}]
    p = make_plan(_graph({"x": [B, Hh, S, D], "cos": [1, 1, S, D], "sin": [1, 1, S, D]}, nodes, ["y"]))
    assert (p.family, p.M, p.N) == ("elementwise", B * Hh * S, D)
    for n in ("cos", "sin"):
        assert p.imap(n).rows.factors == (Factor(S, 1, D),) and p.imap(n).vector_contiguous
        _assert_matches_numpy(p, n, [1, 1, S, D], [B, Hh, S, D])


def test_per_channel_scale_is_a_mapped_per_row_operand() -> None:
    B, C, L = 2, 3, 16
    p = make_plan(_graph({"x": [B, C, L], "w": [1, C, 1]}, _softmax_of("x", "w", "mul"), ["y"]))
    w = p.imap("w")
    assert p.cls("w") is TensorClass.PER_KEPT and p.mapped("w")
    assert w.rows.factors == (Factor(C, 1, 1),) and w.cols.broadcast and not w.vector_contiguous
    _assert_matches_numpy(p, "w", [1, C, 1], [B, C, L])


def test_existing_classes_keep_their_plain_maps() -> None:
    p = make_plan(_graph({"x": [4, 6, 10], "g": [10], "r": [4, 6, 1], "k": [1]},
                         [{"id": "a", "op": "mul", "args": ["x", "g"]}, {"id": "b", "op": "add", "args": ["a", "r"]}]
                         + _softmax_of("b", "k"), ["y"]))
    for n, cls in (("x", TensorClass.FULL), ("g", TensorClass.PER_REDUCED), ("r", TensorClass.PER_KEPT),
                   ("k", TensorClass.SCALAR), ("m", TensorClass.PER_KEPT)):
        assert p.cls(n) is cls and p.imap(n).plain and not p.mapped(n), n
    assert p.imap("k") == IndexMap(AxisMap(24, ()), AxisMap(10, ()), 1)
    assert p.imap("g").vector_contiguous and not p.imap("r").vector_contiguous


def test_group_norm_gamma_varies_along_part_of_the_columns() -> None:
    N, G, Cg, HW = 2, 4, 3, 8
    nodes = [{"id": "a", "op": "mul", "args": ["x", "g"]},
             {"id": "s", "op": "reduce_sum", "args": ["a"], "axes": [2, 3], "keepdims": True},
             {"id": "y", "op": "mul", "args": ["a", "s"]}]
    p = make_plan(_graph({"x": [N, G, Cg, HW], "g": [1, G, Cg, 1]}, nodes, ["y"]))
    assert (p.family, p.M, p.N) == ("row", N * G, Cg * HW)
    g = p.imap("g")
    assert p.cls("g") is TensorClass.FULL and p.mapped("g") and g.partial_cols
    assert g.rows.factors == (Factor(G, 1, Cg),) and g.cols.factors == (Factor(Cg, HW, 1),)
    assert g.vector_mode(4) == "uniform" and g.vector_mode(1) == "vector"
    _assert_matches_numpy(p, "g", [1, G, Cg, 1], [N, G, Cg, HW])
    # varying along the outer column axis only, but contiguously inside it: vectors where dim % vec == 0
    p2 = make_plan(_graph({"x": [N, G, Cg, HW], "g": [1, 1, Cg, HW]}, nodes, ["y"]))
    assert p2.imap("g").cols.factors == (Factor(Cg * HW, 1, 1),) and not p2.mapped("g")


def test_a_middle_axis_reduction_is_a_column_kernel_over_the_kept_axes() -> None:
    B, T, C = 2, 6, 8
    nodes = [{"id": "m", "op": "reduce_mean", "args": ["x"], "axes": [1], "keepdims": True},
             {"id": "y", "op": "sub", "args": ["x", "m"]}]
    p = make_plan(_graph({"x": [B, T, C]}, nodes, ["y", "m"]))
    assert (p.family, p.M, p.N) == ("col", T, B * C)
    x = p.imap("x")
    assert x.rows.factors == (Factor(T, 1, C),) and x.cols.factors == (Factor(B, C, T * C), Factor(C, 1, 1))
    assert p.mapped("x") and p.mapped("y") and not p.mapped("m") and p.imap("y").bijective
    assert x.vector_mode(4) == "vector" and x.vector_mode(8) == "vector"
    assert p.cls("m") is TensorClass.PER_KEPT
    r, c = np.meshgrid(np.arange(T), np.arange(B * C), indexing="ij")  # view (t, b*C + c) of [B, T, C]
    for n, shape in (("x", [B, T, C]), ("y", [B, T, C]), ("m", [B, 1, C])):
        ref = np.broadcast_to(np.arange(int(np.prod(shape))).reshape(shape), (B, T, C))
        np.testing.assert_array_equal(np.vectorize(p.imap(n).offset)(r, c), ref[c // C, r, c % C])
    # C not a multiple of the vector: one scalar load per element
    p3 = make_plan(_graph({"x": [B, T, 6]}, nodes, ["y"]))
    assert p3.imap("x").vector_mode(4) == "scalar" and p3.imap("x").vector_mode(2) == "vector"


def test_channel_scale_in_a_column_reduction_is_mapped() -> None:
    p = make_plan(_graph({"x": [4, 6, 8], "w": [1, 6, 1]}, [
        {"id": "a", "op": "mul", "args": ["x", "w"]},
        {"id": "s", "op": "reduce_sum", "args": ["a"], "axes": [0, 1]},
        {"id": "y", "op": "mul", "args": ["a", "s"]}], ["y"]))
    assert (p.family, p.M, p.N) == ("col", 24, 8) and p.cls("w") is TensorClass.PER_REDUCED and p.mapped("w")
    _assert_matches_numpy(p, "w", [1, 6, 1], [4, 6, 8])


@pytest.mark.parametrize("inputs,nodes,outputs,pattern", [
    # (a full output broadcast along part of the rows, [1, 6, 8] against [4, 6, 8], is stored once
    # since expand: tests/plan/test_expand.py; one broadcast along part of the columns is not)
    ({"x": [4, 6, 8], "pos": [4, 1, 8]}, [{"id": "p2", "op": "mul", "args": ["pos", 2.0]},
                                          {"id": "a", "op": "add", "args": ["x", "p2"]},
                                          {"id": "s", "op": "reduce_sum", "args": ["a"], "axes": [1, 2], "keepdims": True},
                                          {"id": "y", "op": "div", "args": ["a", "s"]}], ["y", "p2"],
     "output 'p2' \\[4, 1, 8\\] broadcasts along part of the axes"),
])
def test_unsupported_patterns_are_one_clear_line(inputs, nodes, outputs, pattern: str) -> None:
    with pytest.raises(UnsupportedGraphError, match=pattern) as e:
        make_plan(_graph(inputs, nodes, outputs))
    assert "\n" not in str(e.value)
