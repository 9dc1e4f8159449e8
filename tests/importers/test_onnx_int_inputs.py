"""ONNX importer: int64 model inputs inside regions (the attention mask's Cast to bool, a Reshape
view of the token ids before their Gather) and Split onto slices. Each imported graph reproduces
the ONNX values; an int value may leave a region (int arithmetic: tests/importers/test_onnx_int_ops.py)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from helpers.lowering import DEV, emulated_errors
from helpers.onnx_models import check_onnx_numerics, onnx_model, onnx_vi
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.graph.reference import run_reference
from stitchtune.importers.onnx_import import import_onnx
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

B, H, S = 2, 2, 8
_c = lambda v, n, dt=np.int64: nh.from_array(np.array(v, dt), n)  # noqa: E731


_vi = onnx_vi


def _model(nodes, inputs, outputs, inits=()):
    return onnx_model(nodes, inputs, outputs, inits, opset=18)


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_int64_attention_mask_cast_to_bool_is_inside_the_softmax_region():
    """BERT's chain: Cast(mask int64 -> bool), Reshape to [B,1,1,S], Where(m, 0, -big) + scores,
    Softmax: one graph reading the int64 mask; planned and emulated against the reference with mask
    values beyond int32 (2**33 has zero low 32 bits: it must still count as true)."""
    nodes = [h.make_node("Cast", ["mask"], ["mb"], to=TP.BOOL), h.make_node("Reshape", ["mb", "s4"], ["m4"]),
             h.make_node("Where", ["m4", "zero", "neg"], ["bias"]), h.make_node("Add", ["scores", "bias"], ["z"]),
             h.make_node("Softmax", ["z"], ["y"], axis=-1)]
    m = _model(nodes, [_vi("mask", [B, S], TP.INT64), _vi("scores", [B, H, S, S])], [_vi("y", [B, H, S, S])],
               [_c([B, 1, 1, S], "s4"), _c(0.0, "zero", np.float32), _c(-3.4e38, "neg", np.float32)])
    res = import_onnx(m)
    assert [r.status for r in res.regions] == ["whole"] and not res.boundaries, res.boundaries
    g = res.subgraphs[0].graph
    assert dict(g.inputs)["mask"].dtype == "int64" and "cast" in {n.op for n in g.nodes}
    mask = np.resize(np.array([1, 0, 2**33, -1, 1, 1, 0, 1], np.int64), (B, S))
    feeds = {"mask": mask, "scores": _rand((B, H, S, S), 0)}
    assert check_onnx_numerics(res, m, feeds) == 1
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    x = dict(feeds)   # the graph's inputs keep the ONNX names
    ref = run_reference(g, x)
    assert emulated_errors(g, plan, space, heuristic_schedule(plan, DEV, space), x, ref)["y"] < 1e-5


def test_reshape_view_of_token_ids_before_gather_reads_the_ids_themselves():
    """GPT-2's Reshape(input_ids [1,8] -> [-1, 8]) is the same tensor: the Gather indexes by the
    model input; a Reshape that changes the ids' shape is left to the framework (graph.json gathers
    by graph inputs), and the import goes on."""
    for shape, cut in (([1, S], False), ([S], True)):
        nodes = [h.make_node("Reshape", ["ids", "s"], ["v"]), h.make_node("Gather", ["wte", "v"], ["e"]),
                 h.make_node("Add", ["e", "pos"], ["y"])]
        out = [*shape, 16]
        m = _model(nodes, [_vi("ids", [1, S], TP.INT64), _vi("pos", out)], [_vi("y", out)],
                   [_c(shape if not cut else [-1], "s"), nh.from_array(_rand((50, 16), 1), "wte")])
        res = import_onnx(m)
        assert len(res.subgraphs) == 1
        g = res.subgraphs[0].graph
        assert [b.split(":")[1] for b in res.boundaries] == (["Reshape"] if cut else []), res.boundaries
        assert "gather" in {n.op for n in g.nodes}
        assert dict(g.inputs)[[k for k, t in res.subgraphs[0].tensor_names if t == ("v" if cut else "ids")][0]].dtype == "int64"
        ids = np.array([[3, 0, 49, 7, 7, 1, 2, 3]], np.int64)
        assert check_onnx_numerics(res, m, {"ids": ids, "pos": _rand(out, 2)}) == 1


@pytest.mark.parametrize("how", ["num_outputs", "sizes"])
def test_split_maps_to_slices(how: str):
    """GPT-2's c_attn output split into q, k, v along the last axis: one slice per output."""
    sizes = [8, 8, 8] if how == "num_outputs" else [4, 12, 8]
    kw = {"num_outputs": 3} if how == "num_outputs" else {}
    ins = ["x"] if how == "num_outputs" else ["x", "sp"]
    nodes = [h.make_node("Relu", ["x"], ["r"]),
             h.make_node("Split", ["r", *ins[1:]], ["a", "b", "c"], axis=-1, **kw),
             h.make_node("Neg", ["a"], ["ya"]), h.make_node("Exp", ["b"], ["yb"]), h.make_node("Abs", ["c"], ["yc"])]
    m = _model(nodes, [_vi("x", [4, 24])], [_vi("ya", [4, sizes[0]]), _vi("yb", [4, sizes[1]]), _vi("yc", [4, sizes[2]])],
               [_c(sizes, "sp")] if how == "sizes" else [])
    res = import_onnx(m)
    assert [r.status for r in res.regions] == ["whole"] and not res.boundaries, res.boundaries
    sl = [n for n in res.subgraphs[0].graph.nodes if n.op == "slice"]
    assert [(n.axis, n.start, n.stop) for n in sl] == [(1, 0, sizes[0]), (1, sizes[0], sizes[0] + sizes[1]),
                                                       (1, 24 - sizes[2], 24)]
    assert check_onnx_numerics(res, m, {"x": _rand((4, 24), 3)}) == 3


def test_an_int_value_leaves_a_region_and_a_cast_to_int_is_inside():
    nodes = [h.make_node("Transpose", ["ids"], ["t"], perm=[1, 0]), h.make_node("Cast", ["t"], ["tf"], to=TP.FLOAT),
             h.make_node("Mul", ["tf", "x"], ["y"]), h.make_node("Cast", ["y"], ["yi"], to=TP.INT64)]
    m = _model(nodes, [_vi("ids", [4, 2], TP.INT64), _vi("x", [2, 4])], [_vi("y", [2, 4]), _vi("t", [2, 4], TP.INT64),
                                                                          _vi("yi", [2, 4], TP.INT64)])
    res = import_onnx(m)
    assert not res.boundaries, res.boundaries
    g = res.subgraphs[0].graph
    assert sorted(g.spec(o).dtype for o in g.outputs) == ["float32", "int64", "int64"]
    ids = np.array([[1, -2], [2**40, 0], [5, 6], [7, 2**24 + 1]], np.int64)
    assert check_onnx_numerics(res, m, {"ids": ids, "x": _rand((2, 4), 4)}) == 3


def test_concat_with_int_and_one_element_constants_imports_whole():
    """A Concat of an int64 input with an int64 constant (cast to float after), and of a float with
    a one-element constant: the constants become graph inputs (a layout op takes no scalar)."""
    ci = nh.from_array(np.array([[1, 2], [3, -(2**40)]], np.int64), "ci")
    nodes = [h.make_node("Concat", ["ids", "ci"], ["cc"], axis=1), h.make_node("Cast", ["cc"], ["f"], to=TP.FLOAT),
             h.make_node("Mul", ["f", "x"], ["y"]),
             h.make_node("Concat", ["x1", "one"], ["c1"], axis=1), h.make_node("Exp", ["c1"], ["y1"])]
    m = _model(nodes, [_vi("ids", [2, 3], TP.INT64), _vi("x", [2, 5]), _vi("x1", [1, 3])],
               [_vi("y", [2, 5]), _vi("y1", [1, 4])], [ci, _c([[0.5]], "one", np.float32)])
    res = import_onnx(m)
    assert sorted(r.status for r in res.regions) == ["whole", "whole"] and not res.boundaries, res.boundaries
    ids = np.array([[0, 7, -3], [2**33, 1, 5]], np.int64)
    assert check_onnx_numerics(res, m, {"ids": ids, "x": _rand((2, 5), 5), "x1": _rand((1, 3), 6)}) == 2


def test_split_sizes_that_do_not_cut_the_axis_are_a_boundary():
    """A hostile Split (sizes summing past the dim; more outputs than elements) is a named boundary,
    never a failed import (the model's own shape inference does not check this)."""
    for sizes, n in (([4, 30], 2), (None, 5)):
        kw = {} if sizes else {"num_outputs": n}
        ins = ["r", "sp"] if sizes else ["r"]
        outs = [f"o{k}" for k in range(n)]
        nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Split", ins, outs, axis=1, **kw),
                 *[h.make_node("Neg", [o], [f"y{k}"]) for k, o in enumerate(outs)]]
        g = h.make_graph(nodes, "g", [_vi("x", [2, 4])], [_vi(f"y{k}", [2, 2]) for k in range(n)],
                         [_c(sizes, "sp")] if sizes else [], value_info=[_vi(o, [2, 2]) for o in outs])
        m = h.make_model(g, opset_imports=[h.make_opsetid("", 18)])
        res = import_onnx(m)
        why = [b for b in res.boundaries if b.split(":")[1] == "Split"]
        assert len(why) == 1 and f"do not cut dim 4 into {n} non-empty parts" in why[0], res.boundaries


@pytest.mark.parametrize("unsqueeze", [False, True])
def test_gather_elements_of_the_target_log_probability_is_one_region(unsqueeze: bool):
    """Cross entropy as exported: LogSoftmax, GatherElements(axis 1) of the target's log-probability,
    Neg, ReduceMean: one graph with ``gather_elements``, planned with a pick and emulated; an Unsqueeze
    of a [N] target is left to the framework (graph.json gathers by graph inputs)."""
    N, C = 8, 40
    nodes = [h.make_node("LogSoftmax", ["x"], ["lp"], axis=1),
             h.make_node("GatherElements", ["lp", "t1" if unsqueeze else "t"], ["p"], axis=1),
             h.make_node("Neg", ["p"], ["nl"]), h.make_node("ReduceMean", ["nl"], ["loss"], keepdims=1)]
    inits = []
    if unsqueeze:
        nodes.insert(0, h.make_node("Unsqueeze", ["t", "ax"], ["t1"]))
        inits.append(_c([1], "ax"))
    m = _model(nodes, [_vi("x", [N, C]), _vi("t", [N] if unsqueeze else [N, 1], TP.INT64)],
               [_vi("loss", [1, 1])], inits)
    res = import_onnx(m)
    assert len(res.subgraphs) == 1
    g = res.subgraphs[0].graph
    assert "gather_elements" in {n.op for n in g.nodes}
    feeds = {"x": _rand((N, C), 3), "t": np.random.default_rng(4).integers(0, C, [N] if unsqueeze else [N, 1])}
    assert check_onnx_numerics(res, m, feeds) == 1
    plan = make_plan(g)
    assert plan.cross and plan.family == "row"
