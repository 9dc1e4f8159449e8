"""ONNX importer: int arithmetic on runtime values inside regions (a causal mask from a folded
``Range`` plus a runtime offset, position ids, an ``ignore_index``-style ``Where`` of labels, casts to
int). Each imported graph reproduces onnxruntime's values: int outputs bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

from helpers.lowering import DEV, emulated_errors  # noqa: E402
from helpers.onnx_models import onnx_model, onnx_values, onnx_vi  # noqa: E402
from stitchtune.cost.heuristic import heuristic_schedule  # noqa: E402
from stitchtune.graph.reference import run_reference  # noqa: E402
from stitchtune.importers.onnx_import import import_onnx  # noqa: E402
from stitchtune.plan.planner import make_plan  # noqa: E402
from stitchtune.space import SearchSpace  # noqa: E402

B, H, S = 2, 2, 8


def _c(v: object, n: str, dt: type = np.int64) -> object:
    return nh.from_array(np.array(v, dt), n)


def _mask_model() -> object:
    """``cache = Range(0, S) + past``; ``ok = k_pos <= cache[:, None]``; ``Softmax(Where(ok, scores, -inf))``;
    position ids ``cache * 3 - 1`` (int64 out), labels with -100 replaced by 0 (int64 out), a float
    cast to int32 (out)."""
    nodes = [
        h.make_node("Range", ["zero", "s", "one"], ["r"]),
        h.make_node("Add", ["r", "past"], ["cache"]),
        h.make_node("Unsqueeze", ["cache", "ax1"], ["q"]),
        h.make_node("Unsqueeze", ["r", "ax0"], ["k"]),
        h.make_node("LessOrEqual", ["k", "q"], ["ok"]),
        h.make_node("Where", ["ok", "scores", "ninf"], ["z"]),
        h.make_node("Softmax", ["z"], ["y"], axis=-1),
        h.make_node("Mul", ["cache", "three"], ["c3"]),
        h.make_node("Sub", ["c3", "one"], ["pid"]),
        h.make_node("Equal", ["labels", "ign"], ["isign"]),
        h.make_node("Where", ["isign", "zero", "labels"], ["lab"]),
        h.make_node("Mul", ["scores", "hundred"], ["s100"]),
        h.make_node("Cast", ["s100"], ["sq"], to=TP.INT32),
    ]
    inits = [_c(0, "zero"), _c(S, "s"), _c(1, "one"), _c(3, "three"), _c(-100, "ign"), _c([1], "ax1"),
             _c([0], "ax0"), _c(-np.inf, "ninf", np.float32), _c(100.0, "hundred", np.float32)]
    return onnx_model(nodes, [onnx_vi("scores", [B, H, S, S]), onnx_vi("past", [1], TP.INT64),
                              onnx_vi("labels", [B, S], TP.INT64)],
                      [onnx_vi("y", [B, H, S, S]), onnx_vi("pid", [S], TP.INT64), onnx_vi("lab", [B, S], TP.INT64),
                       onnx_vi("sq", [B, H, S, S], TP.INT32)], inits, opset=18)


def _feeds() -> dict[str, np.ndarray]:
    labels = np.array([[3, -100, 2**40, 0, -100, 7, 1, -5]] * B, np.int64)
    return {"scores": np.random.default_rng(0).standard_normal((B, H, S, S)).astype(np.float32),
            "past": np.array([2], np.int64), "labels": labels}


def test_int_ops_import_and_match_onnxruntime_exactly() -> None:
    m = _mask_model()
    res = import_onnx(m)
    assert not [b for b in res.boundaries if "int" in str(b)], res.boundaries
    feeds = _feeds()
    values = {**onnx_values(m, feeds), **feeds}
    seen = set()
    for sg in res.subgraphs:
        names, consts = dict(sg.tensor_names), dict(sg.constants)
        x = {n: (consts[n] if n in consts else values[names[n]]) for n, _ in sg.graph.inputs}
        got = run_reference(sg.graph, x)
        for o in sg.graph.outputs:
            want = np.asarray(values[names[o]])
            assert got[o].dtype == want.dtype, (o, got[o].dtype, want.dtype)
            if want.dtype.kind == "i":
                assert np.array_equal(got[o], want), o
            else:
                nan = np.isnan(want)
                assert np.array_equal(np.isnan(got[o]), nan) and np.abs(got[o][~nan] - want[~nan]).max() < 1e-6, o
            seen.add(names[o])
    assert {"y", "pid", "lab", "sq"} <= seen
    ops = {n.op for sg in res.subgraphs for n in sg.graph.nodes}
    assert {"add", "mul", "sub", "le", "eq", "where", "cast"} <= ops


def test_imported_int_region_emulates_exactly() -> None:
    m = _mask_model()
    res = import_onnx(m)
    feeds = _feeds()
    values = {**onnx_values(m, feeds), **feeds}
    for sg in res.subgraphs:
        names, consts = dict(sg.tensor_names), dict(sg.constants)
        x = {n: (consts[n] if n in consts else values[names[n]]) for n, _ in sg.graph.inputs}
        plan = make_plan(sg.graph)
        space = SearchSpace.for_plan(plan, DEV)
        ref = run_reference(sg.graph, x)
        errs = emulated_errors(sg.graph, plan, space, heuristic_schedule(plan, DEV, space), x, ref)
        assert all(e < 1e-5 for e in errs.values()), errs
