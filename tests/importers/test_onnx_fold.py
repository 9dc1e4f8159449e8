"""The ONNX constant folder: each folding rule called the way the folding pass calls it."""

import numpy as np
import pytest

from stitchtune.importers.onnx_fold import evaluate


@pytest.mark.parametrize(("a", "b", "want"), [
    (np.array([7, -7, 6], dtype=np.int64), np.array([2, 2, -4], dtype=np.int64), [3, -3, -1]),  # truncates to 0
    (np.array([1.0, 3.0], dtype=np.float32), np.array([4.0, 2.0], dtype=np.float32), [0.25, 1.5]),
])
def test_div_folds_with_onnx_semantics(a, b, want):
    out = evaluate("Div", {}, [a, b])
    np.testing.assert_array_equal(out, np.array(want, dtype=a.dtype))
    assert out.dtype == a.dtype


def test_mul_and_unsqueeze_fold():
    np.testing.assert_array_equal(evaluate("Mul", {}, [np.array([2, 3]), np.array([4, 5])]), [8, 15])
    assert evaluate("Unsqueeze", {}, [np.zeros((2, 3)), np.array([0])]).shape == (1, 2, 3)


@pytest.mark.parametrize("pieces", [1, 2])
def test_empty_concat_pieces_are_dropped(pieces: int) -> None:
    """``cat([f(x), x[:, 8:]])`` with ``x [2, 8]`` (Phi-3's pass-through piece, empty when the whole head is
    rotated): the empty piece is dropped (the Concat becomes an Identity with one piece left), the empty
    Slice becomes a Constant, and the import plans and matches onnxruntime."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from helpers.onnx_models import check_onnx_numerics, onnx_model, onnx_vi
    from stitchtune.importers.onnx_import import import_onnx
    from stitchtune.plan.planner import make_plan

    ints = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("s", 8), ("e", 8), ("a", 1))]
    nodes = [helper.make_node("Slice", ["x", "s", "e", "a"], ["empty"]),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Sigmoid", ["x"], ["g"]),
             helper.make_node("Concat", (["r", "g"][:pieces] + ["empty"]), ["c"], axis=1),
             helper.make_node("Mul", ["c", "c"], ["y"])]
    model = onnx_model(nodes, [onnx_vi("x", [2, 8])], [onnx_vi("y", [2, 8 * pieces], TensorProto.FLOAT)], ints)
    res = import_onnx(model)
    ops = {n.op for sg in res.subgraphs for n in sg.graph.nodes}
    assert ("concat" in ops) == (pieces == 2) and "slice" not in ops, ops
    assert any(":empty:" in f for f in res.fold.folded)   # the empty Slice, now a Constant
    for sg in res.subgraphs:
        make_plan(sg.graph)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    assert check_onnx_numerics(res, model, feeds) >= 1
