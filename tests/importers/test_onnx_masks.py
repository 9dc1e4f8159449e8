"""ONNX importer: the mask chain (comparisons, logical ops, Where, Clip, Expand/Reshape views, bool
Casts) maps onto graph.json ops, stays inside the region that reads it, and never leaves a region as
a bool or a broadcast value."""

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
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

from stitchtune.graph.ops import OPS
from stitchtune.importers.onnx_import import import_onnx

B, H, S = 2, 3, 8


_vi = onnx_vi


_model = onnx_model


def _mask_nodes(scores: str, out: str, tag: str) -> list:
    """scores * 0.25 + where(not(unsqueeze(mask)), -1e9, 0), softmax: as BERT builds it."""
    return [h.make_node("Mul", [scores, "scale"], [f"{tag}_sc"]),
            h.make_node("Add", [f"{tag}_sc", "bias"], [f"{tag}_z"]),
            h.make_node("Softmax", [f"{tag}_z"], [out], axis=-1)]


def _mask_chain() -> tuple[list, list]:
    inits = [nh.from_array(np.array([B, 1, 1, S], np.int64), "m4s"), nh.from_array(np.array(0.25, np.float32), "scale"),
             nh.from_array(np.array(-1e9, np.float32), "neg"), nh.from_array(np.array(0.0, np.float32), "zero"),
             nh.from_array(np.array([B, 1, S, S], np.int64), "full")]
    nodes = [h.make_node("Reshape", ["mask", "m4s"], ["m4"]),            # [B,1,1,S]: the same tensor
             h.make_node("Cast", ["m4"], ["mb"], to=TP.BOOL),              # bool -> bool: a no-op
             h.make_node("Not", ["mb"], ["pad"]),
             h.make_node("Expand", ["pad", "full"], ["pade"]),             # [B,1,S,S]: a broadcast view
             h.make_node("Where", ["pade", "neg", "zero"], ["bias"])]
    return nodes, inits


def _feeds(rng, two: bool = False):
    mask = rng.random((B, 1, 1, S)) > 0.3
    mask[..., 0] = True
    f = {"mask": mask, "scores": rng.standard_normal((B, H, S, S)).astype(np.float32)}
    if two:
        f["w"] = rng.standard_normal((S, S)).astype(np.float32)
    return f


def test_mask_chain_is_inside_the_softmax_region():
    chain, inits = _mask_chain()
    m = _model([*chain, *_mask_nodes("scores", "y", "a")], [_vi("mask", [B, 1, 1, S], TP.BOOL), _vi("scores", [B, H, S, S])],
               [_vi("y", [B, H, S, S])], inits)
    res = import_onnx(m)
    assert len(res.subgraphs) == 1 and not res.boundaries, res.boundaries
    assert [r.status for r in res.regions] == ["whole"]
    g = res.subgraphs[0].graph
    ops = [n.op for n in g.nodes]
    assert {"logical_not", "where"} <= set(ops) and "cast" not in ops
    assert dict(g.inputs)["mask"].dtype == "bool" and dict(g.inputs)["mask"].shape == (B, 1, 1, S)
    assert all(g.spec(o).dtype != "bool" for o in g.outputs)
    assert check_onnx_numerics(res, m, _feeds(np.random.default_rng(0))) == 1


@pytest.mark.parametrize("elem", [TP.BOOL, TP.INT64])
def test_one_mask_chain_feeding_two_layers_is_recomputed_in_each(elem):
    """The mask is read by two softmaxes with a MatMul between them: each region computes it
    itself (no bool tensor, no mask tensor handed between graphs), and both are whole. An int64
    mask (as the exporters give it) is cast to bool inside each graph (graph.json casts int inputs):
    both graphs read the int64 mask itself."""
    chain, inits = _mask_chain()
    first = [h.make_node("Cast", ["mask"], ["mask_b"], to=TP.BOOL)] if elem == TP.INT64 else []
    if first:
        chain[0] = h.make_node("Reshape", ["mask_b", "m4s"], ["m4"])
    nodes = [*first, *chain, *_mask_nodes("scores", "p0", "a"),
             h.make_node("MatMul", ["p0", "w"], ["s1"]), *_mask_nodes("s1", "y", "b")]
    m = _model(nodes, [_vi("mask", [B, 1, 1, S], elem), _vi("scores", [B, H, S, S]), _vi("w", [S, S])],
               [_vi("y", [B, H, S, S])], inits)
    res = import_onnx(m)
    assert len(res.subgraphs) == 2
    assert sorted(r.status for r in res.regions) == ["whole", "whole"], res.regions
    for sg in res.subgraphs:
        assert "where" in {n.op for n in sg.graph.nodes}
        assert all(sg.graph.spec(o).dtype != "bool" for o in sg.graph.outputs)
        assert "mask" in set(dict(sg.tensor_names).values())   # the mask itself, not a mask
        assert dict(sg.graph.inputs)["mask"].dtype == ("int64" if first else "bool")
    feeds = _feeds(np.random.default_rng(1), two=True)
    if first:
        feeds["mask"] = feeds["mask"].astype(np.int64)
    assert check_onnx_numerics(res, m, feeds) == 2


def test_comparisons_and_logical_ops_map_and_a_bool_model_output_is_a_graph_output():
    """Less/GreaterOrEqual/Equal/And/Or -> lt/ge/eq/logical_*; a bool model output is a bool graph
    output (one byte per element), equal to onnxruntime's."""
    nodes = [h.make_node("Less", ["x", "zero"], ["lt"]),
             h.make_node("GreaterOrEqual", ["x", "y"], ["ge"]),
             h.make_node("Equal", ["lt", "ge"], ["eq"]),
             h.make_node("Or", ["eq", "ge"], ["o"]),
             h.make_node("And", ["o", "lt"], ["a"]),
             h.make_node("Where", ["a", "x", "y"], ["w"]),
             h.make_node("Exp", ["w"], ["out"])]
    m = _model(nodes, [_vi("x", [4, 8]), _vi("y", [4, 8])], [_vi("out", [4, 8])],
               [nh.from_array(np.array(0.0, np.float32), "zero")])
    res = import_onnx(m)
    assert len(res.subgraphs) == 1 and [r.status for r in res.regions] == ["whole"]
    ops = {n.op for n in res.subgraphs[0].graph.nodes}
    assert {"lt", "ge", "eq", "logical_or", "logical_and", "where", "exp"} <= ops
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((4, 8)).astype(np.float32), "y": rng.standard_normal((4, 8)).astype(np.float32)}
    assert check_onnx_numerics(res, m, feeds) == 1

    m2 = _model(nodes[:2], [_vi("x", [4, 8]), _vi("y", [4, 8])], [_vi("lt", [4, 8], TP.BOOL), _vi("ge", [4, 8], TP.BOOL)],
                [nh.from_array(np.array(0.0, np.float32), "zero")])
    res2 = import_onnx(m2)
    assert not res2.boundaries and [r.status for r in res2.regions] == ["whole", "whole"]
    assert [sg.graph.spec(o).dtype for sg in res2.subgraphs for o in sg.graph.outputs] == ["bool", "bool"]
    assert check_onnx_numerics(res2, m2, feeds) == 2


def test_clip_maps_to_clamp_with_tensor_bounds_and_infinite_missing_ones():
    nodes = [h.make_node("Clip", ["x", "lo", ""], ["c"]), h.make_node("Clip", ["c", "", "hi"], ["y"])]
    m = _model(nodes, [_vi("x", [4, 8]), _vi("lo", [4, 1]), _vi("hi", [8])], [_vi("y", [4, 8])])
    res = import_onnx(m)
    g = res.subgraphs[0].graph
    assert [n.op for n in g.nodes] == ["clamp", "clamp"]
    assert float("inf") in g.nodes[0].args and float("-inf") in g.nodes[1].args
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((4, 8)).astype(np.float32), "lo": rng.standard_normal((4, 1)).astype(np.float32),
             "hi": rng.standard_normal(8).astype(np.float32)}
    assert check_onnx_numerics(res, m, feeds) == 1


def test_a_broadcast_view_that_a_reduction_needs_whole_is_expanded():
    """Expand(x[1,8] -> [4,8]) read by ReduceSum over axis 0: the reduction needs the view whole, so
    it reads an ``expand`` node (an index map; nothing is cut); the graph plans and its heuristic
    schedule emulates to the reference."""
    nodes = [h.make_node("Expand", ["x", "shape"], ["xe"]), h.make_node("Exp", ["xe"], ["e"]),
             h.make_node("ReduceSum", ["e", "axes"], ["y"], keepdims=1)]
    m = _model(nodes, [_vi("x", [1, 8])], [_vi("y", [1, 8])],
               [nh.from_array(np.array([4, 8], np.int64), "shape"), nh.from_array(np.array([0], np.int64), "axes")])
    res = import_onnx(m)
    assert not res.boundaries and [r.status for r in res.regions] == ["whole"], res.boundaries
    g = res.subgraphs[0].graph
    assert "expand" in {n.op for n in g.nodes} and dict(g.inputs)["x"].shape == (1, 8)
    x = {"x": np.random.default_rng(4).standard_normal((1, 8)).astype(np.float32)}
    assert check_onnx_numerics(res, m, x) == 1
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    assert emulated_errors(g, plan, space, heuristic_schedule(plan, DEV, space), x, run_reference(g, x))["y"] < 1e-5


def _needs(*ops: str) -> None:
    missing = [o for o in ops if o not in OPS]
    if missing:
        pytest.skip(f"graph.json has no {', '.join(missing)} op yet")


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_transpose_and_reshape_map_once_graph_json_has_them():
    _needs("transpose", "reshape")
    nodes = [h.make_node("Exp", ["x"], ["e"]), h.make_node("Transpose", ["e"], ["t"], perm=[1, 0]),
             h.make_node("Reshape", ["t", "s"], ["r"]), h.make_node("ReduceSum", ["r", "ax"], ["y"], keepdims=1)]
    m = _model(nodes, [_vi("x", [4, 8])], [_vi("y", [2, 1])],
               [nh.from_array(np.array([2, 16], np.int64), "s"), nh.from_array(np.array([-1], np.int64), "ax")])
    res = import_onnx(m)
    assert len(res.subgraphs) == 1 and not res.boundaries, res.boundaries
    ops = [n.op for n in res.subgraphs[0].graph.nodes]
    assert "transpose" in ops and "reshape" in ops
    assert check_onnx_numerics(res, m, {"x": _rand((4, 8), 7)}) == 1


def test_rotate_half_maps_to_slice_and_concat_once_graph_json_has_them():
    """Llama's rotary: x * cos + concat(-x[..., D/2:], x[..., :D/2]) * sin, in one graph."""
    _needs("slice", "concat")
    c = lambda v, n: nh.from_array(np.array(v, np.int64), n)  # noqa: E731
    nodes = [h.make_node("Slice", ["x", "h", "end", "ax"], ["x2"]), h.make_node("Slice", ["x", "z", "h", "ax"], ["x1"]),
             h.make_node("Neg", ["x2"], ["nx2"]), h.make_node("Concat", ["nx2", "x1"], ["rot"], axis=-1),
             h.make_node("Mul", ["x", "cos"], ["a"]), h.make_node("Mul", ["rot", "sin"], ["b"]),
             h.make_node("Add", ["a", "b"], ["y"])]
    m = _model(nodes, [_vi("x", [B, H, S, 16]), _vi("cos", [S, 16]), _vi("sin", [S, 16])], [_vi("y", [B, H, S, 16])],
               [c([8], "h"), c([0], "z"), c([1 << 62], "end"), c([-1], "ax")])
    res = import_onnx(m)
    assert len(res.subgraphs) == 1 and not res.boundaries, res.boundaries
    assert {"slice", "concat"} <= {n.op for n in res.subgraphs[0].graph.nodes}
    feeds = {"x": _rand((B, H, S, 16), 8), "cos": _rand((S, 16), 9), "sin": _rand((S, 16), 10)}
    assert check_onnx_numerics(res, m, feeds) == 1


def test_embedding_gather_add_layernorm_is_one_graph_once_graph_json_has_gather():
    _needs("gather")
    nodes = [h.make_node("Gather", ["table", "ids"], ["e"], axis=0), h.make_node("Add", ["e", "pos"], ["a"]),
             h.make_node("LayerNormalization", ["a", "g", "bb"], ["y"], axis=-1)]
    inits = [nh.from_array(_rand((50, 16), 11), "table"), nh.from_array(_rand((S, 16), 12), "pos"),
             nh.from_array(np.ones(16, np.float32), "g"), nh.from_array(np.zeros(16, np.float32), "bb")]
    m = _model(nodes, [_vi("ids", [B, S], TP.INT64)], [_vi("y", [B, S, 16])], inits)
    res = import_onnx(m)
    assert len(res.subgraphs) == 1 and [r.status for r in res.regions] == ["whole"], res.boundaries
    assert "gather" in {n.op for n in res.subgraphs[0].graph.nodes}
    ids = np.random.default_rng(13).integers(0, 50, (B, S)).astype(np.int64)
    assert check_onnx_numerics(res, m, {"ids": ids}) == 1


def test_legacy_bert_mask_chain_through_rank5_gather_is_a_view():
    """The legacy exporter's padding mask: Flatten -> Gather(constant indices, a rank-5 result) ->
    Reshape -> Reshape -> And(causal table) -> Expand -> Where: all views and mask ops, in the
    softmax's graph; the mask is read as the [1, S] bool input it is."""
    inits = [nh.from_array(np.arange(S, dtype=np.int64).reshape(1, 1, 1, S), "idx"),
             nh.from_array(np.array([-1], np.int64), "flat"), nh.from_array(np.array([1, 1, 1, S], np.int64), "m4s"),
             nh.from_array(np.tril(np.ones((S, S), bool))[None, None], "causal"),
             nh.from_array(np.array([1, 1, S, S], np.int64), "full"),
             nh.from_array(np.array(0.0, np.float32), "zero"), nh.from_array(np.array(-3.4e38, np.float32), "neg")]
    nodes = [h.make_node("Flatten", ["mask"], ["f"], axis=2),
             h.make_node("Gather", ["f", "idx"], ["g5"], axis=0),
             h.make_node("Reshape", ["g5", "flat"], ["r1"]),
             h.make_node("Reshape", ["r1", "m4s"], ["r4"]),
             h.make_node("And", ["causal", "r4"], ["a"]),
             h.make_node("Expand", ["a", "full"], ["ae"]),
             h.make_node("Where", ["ae", "zero", "neg"], ["bias"]),
             h.make_node("Add", ["scores", "bias"], ["z"]),
             h.make_node("Softmax", ["z"], ["y"], axis=-1)]
    m = _model(nodes, [_vi("mask", [1, S], TP.BOOL), _vi("scores", [1, H, S, S])], [_vi("y", [1, H, S, S])], inits)
    res = import_onnx(m)
    assert len(res.subgraphs) == 1 and not res.boundaries, res.boundaries
    g = res.subgraphs[0].graph
    assert dict(g.inputs)["mask"].shape == (1, S) and {"logical_and", "where"} <= {n.op for n in g.nodes}
    rng = np.random.default_rng(5)
    feeds = {"mask": rng.random((1, S)) > 0.3, "scores": rng.standard_normal((1, H, S, S)).astype(np.float32)}
    feeds["mask"][0, 0] = True
    assert check_onnx_numerics(res, m, feeds) == 1


def test_reshapes_into_and_out_of_a_region_cost_nothing():
    """GPT-2's Conv1D: Gemm [2S, 4D] -> Reshape [2, S, 4D] -> gelu -> Reshape [2S, 4D] -> Gemm: one
    graph on [2S, 4D] (the reshaped frame), its output the second Reshape's tensor (the same
    elements). Mixed with an operand of the model's shape, the frame is not taken: the framed
    value is reshaped back inside the graph (a ``reshape`` node, an index map), nothing is cut."""
    inits = [nh.from_array(np.array([2, S, 16], np.int64), "s3"), nh.from_array(np.array([2 * S, 16], np.int64), "s2"),
             nh.from_array(np.eye(16, dtype=np.float32), "W"), nh.from_array(_rand((S, 16), 14), "bias")]
    nodes = [h.make_node("Gemm", ["x", "W"], ["a"]),
             h.make_node("Reshape", ["a", "s3"], ["a3"]),
             h.make_node("Tanh", ["a3"], ["t"]),
             h.make_node("Mul", ["t", "a3"], ["u"]),
             h.make_node("Reshape", ["u", "s2"], ["u2"]),
             h.make_node("Gemm", ["u2", "W"], ["y"])]
    m = _model(nodes, [_vi("x", [2 * S, 16])], [_vi("y", [2 * S, 16])], inits[:3])
    res = import_onnx(m)
    assert len(res.subgraphs) == 1 and [r.status for r in res.regions] == ["whole"], res.regions
    sg = res.subgraphs[0]
    assert dict(sg.graph.inputs)["a"].shape == (2 * S, 16) and sg.graph.spec(sg.graph.outputs[0]).shape == (2 * S, 16)
    assert dict(sg.tensor_names)[sg.graph.outputs[0]] == "u2"
    feeds = {"x": _rand((2 * S, 16), 6)}
    assert check_onnx_numerics(res, m, feeds) == 1

    nodes[3] = h.make_node("Add", ["t", "bias"], ["u"])
    m2 = _model(nodes, [_vi("x", [2 * S, 16])], [_vi("y", [2 * S, 16])], inits)
    res2 = import_onnx(m2)
    assert [r.status for r in res2.regions] == ["whole"] and len(res2.subgraphs) == 1, res2.boundaries
    assert "reshape" in {n.op for n in res2.subgraphs[0].graph.nodes}
    assert check_onnx_numerics(res2, m2, feeds) == 1


def test_repeat_kv_unsqueeze_expand_reshape_maps_onto_expand():
    """Llama's grouped K/V heads: k [1,2,S,D] (after its rotary) -> Unsqueeze [1,2,1,S,D] -> Expand
    [1,2,2,S,D] -> Reshape [1,4,S,D] -> MatMul: one graph with reshape/expand/reshape (rank 5 inside),
    and an Expand of a model input leaving a region is written expanded; both plan and emulate."""
    _needs("expand")
    c = lambda v, n: nh.from_array(np.array(v, np.int64), n)  # noqa: E731
    nodes = [h.make_node("Mul", ["k", "cos"], ["kr"]), h.make_node("Unsqueeze", ["kr", "ax2"], ["k5"]),
             h.make_node("Expand", ["k5", "s5"], ["ke"]), h.make_node("Reshape", ["ke", "s4"], ["kk"]),
             h.make_node("MatMul", ["q", "kk"], ["y"]),
             h.make_node("Expand", ["b", "sb"], ["be"]), h.make_node("MatMul", ["be", "w"], ["y2"])]
    m = _model(nodes, [_vi("k", [1, 2, S, 16]), _vi("cos", [S, 16]), _vi("q", [1, 4, 16, S]), _vi("b", [1, 16]),
                       _vi("w", [16, 4])], [_vi("y", [1, 4, 16, 16]), _vi("y2", [8, 4])],
               [c([2], "ax2"), c([1, 2, 2, S, 16], "s5"), c([1, 4, S, 16], "s4"), c([8, 16], "sb")])
    res = import_onnx(m)
    assert sorted(r.status for r in res.regions) == ["whole", "whole"], res.boundaries
    feeds = {"k": _rand((1, 2, S, 16), 12), "cos": _rand((S, 16), 13), "q": _rand((1, 4, 16, S), 14),
             "b": _rand((1, 16), 15), "w": _rand((16, 4), 16)}
    assert check_onnx_numerics(res, m, feeds) == 2
    for sg in res.subgraphs:
        g = sg.graph
        assert "expand" in {n.op for n in g.nodes}
        x = {n: feeds[t] for n, t in sg.tensor_names if n in dict(g.inputs)}
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, DEV)
        s = heuristic_schedule(plan, DEV, space)
        assert max(emulated_errors(g, plan, space, s, x, run_reference(g, x)).values()) < 1e-5
