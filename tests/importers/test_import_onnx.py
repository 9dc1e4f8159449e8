"""ONNX importer: models built with onnx.helper are split into the expected memory-intensive
subgraphs, each of which computes what onnx's own reference evaluator computes."""

from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from helpers.onnx_models import check_onnx_numerics, onnx_vi

from stitchtune.cli import main
from stitchtune.errors import StitchtuneError
from stitchtune.plan.planner import make_plan
from stitchtune.graph.parse import NAME_RE, load_graph
from stitchtune.importers.onnx_import import (
    import_onnx,
    parse_node_range,
    write_subgraphs,
)

N, K, D = 8, 16, 32
RNG = np.random.default_rng(0)


_vi = onnx_vi


def _init(name, arr):
    return nh.from_array(np.asarray(arr), name)


def transformer_ish(batch="batch", opset=18) -> onnx.ModelProto:
    """MatMul -> layernorm written out op by op -> MatMul -> softmax written out op by op."""
    inits = [_init("W1", RNG.standard_normal((K, D)).astype(np.float32)),
             _init("W2", RNG.standard_normal((D, D)).astype(np.float32)),
             _init("gamma", RNG.standard_normal(D).astype(np.float32)),
             _init("beta", RNG.standard_normal(D).astype(np.float32)),
             _init("ax", np.array([-1], np.int64)),
             _init("eps", np.array(1e-5, np.float32))]
    nodes = [h.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
             h.make_node("ReduceMean", ["h", "ax"], ["mu"], keepdims=1),
             h.make_node("Sub", ["h", "mu"], ["hc"]),
             h.make_node("Mul", ["hc", "hc"], ["sq"]),
             h.make_node("ReduceMean", ["sq", "ax"], ["var"], keepdims=1),
             h.make_node("Add", ["var", "eps"], ["ve"]),
             h.make_node("Sqrt", ["ve"], ["sd"]),
             h.make_node("Div", ["hc", "sd"], ["hn"]),
             h.make_node("Mul", ["hn", "gamma"], ["hg"]),
             h.make_node("Add", ["hg", "beta"], ["ln/out:0"]),       # a name that is not an identifier
             h.make_node("MatMul", ["ln/out:0", "W2"], ["s"], name="mm2"),
             h.make_node("ReduceMax", ["s", "ax"], ["smax"], keepdims=1),
             h.make_node("Sub", ["s", "smax"], ["sh"]),
             h.make_node("Exp", ["sh"], ["e"]),
             h.make_node("ReduceSum", ["e", "ax"], ["es"], keepdims=1),
             h.make_node("Div", ["e", "es"], ["y"])]
    g = h.make_graph(nodes, "tiny", [_vi("x", [batch, K])], [_vi("y", [batch, D])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def test_splits_between_matmuls_into_layernorm_and_softmax():
    m = transformer_ish()
    res = import_onnx(m, shapes={"batch": (N,)})
    assert len(res.subgraphs) == 2
    ln, sm = res.subgraphs
    assert [n.op for n in ln.graph.nodes] == ["reduce_mean", "sub", "mul", "reduce_mean", "add", "sqrt",
                                              "div", "mul", "add"]
    assert [n.op for n in sm.graph.nodes] == ["reduce_max", "sub", "exp", "reduce_sum", "div"]
    assert dict(ln.tensor_names)[ln.graph.inputs[0][0]] == "h"
    assert dict(ln.tensor_names)[ln.graph.outputs[0]] == "ln/out:0"
    assert NAME_RE.fullmatch(ln.graph.outputs[0])
    assert {n for n, _ in ln.constants} == {"gamma", "beta"}
    assert ln.graph.spec("h").shape == (N, D)
    assert sm.graph.outputs == ("y",)
    assert [b.split(":")[1] for b in res.boundaries] == ["MatMul", "MatMul"]
    feeds = {"x": RNG.standard_normal((N, K)).astype(np.float32)}
    check_onnx_numerics(res, m, feeds)


def test_dynamic_dim_needs_shapes_and_error_names_it():
    m = transformer_ish()
    with pytest.raises(StitchtuneError) as ei:
        import_onnx(m)
    assert "'batch'" in str(ei.value) and "dynamic" in str(ei.value)
    assert "model input 'x' dim 0" in str(ei.value)
    by_input = import_onnx(m, shapes={"x": (4, K)})
    assert by_input.subgraphs[0].graph.spec("h").shape == (4, D)
    with pytest.raises(StitchtuneError, match="neither a model input"):
        import_onnx(m, shapes={"nope": (4,)})
    with pytest.raises(StitchtuneError, match="rank"):
        import_onnx(m, shapes={"x": (4,)})


def test_node_range_limits_the_subgraphs():
    m = transformer_ish()
    res = import_onnx(m, node_range=(11, None), shapes={"batch": (N,)})
    assert len(res.subgraphs) == 1 and res.subgraphs[0].graph.outputs == ("y",)
    res = import_onnx(m, node_range=(1, 5), shapes={"batch": (N,)})
    assert [n.op for n in res.subgraphs[0].graph.nodes] == ["reduce_mean", "sub", "mul", "reduce_mean"]
    assert parse_node_range("3:") == (3, None)
    with pytest.raises(StitchtuneError):
        parse_node_range("a:b")


def test_residual_through_matmul_is_not_fused_across_it():
    """ln -> MatMul -> Add(mm, ln): the Add depends on the MatMul, so it cannot join ln's subgraph."""
    inits = [_init("W", RNG.standard_normal((D, D)).astype(np.float32)),
             _init("g", np.ones(D, np.float32)), _init("b", np.zeros(D, np.float32))]
    nodes = [h.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1, epsilon=1e-5),
             h.make_node("MatMul", ["ln", "W"], ["mm"]),
             h.make_node("Add", ["mm", "ln"], ["r"]),
             h.make_node("Relu", ["r"], ["y"])]
    g = h.make_graph(nodes, "res", [_vi("x", [N, D])], [_vi("y", [N, D])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    res = import_onnx(m)
    assert len(res.subgraphs) == 2
    first, second = res.subgraphs
    assert first.graph.outputs == ("ln",)
    assert [n.op for n in second.graph.nodes] == ["add", "relu"]
    assert {dict(second.tensor_names)[n] for n, _ in second.graph.inputs} == {"mm", "ln"}
    check_onnx_numerics(res, m, {"x": RNG.standard_normal((N, D)).astype(np.float32)})


def test_independent_matmul_operand_does_not_split():
    """ln(x) + MatMul(y, W): the MatMul does not depend on ln, so ln and the add fuse into one subgraph."""
    inits = [_init("W", RNG.standard_normal((D, D)).astype(np.float32)),
             _init("g", RNG.standard_normal(D).astype(np.float32))]
    nodes = [h.make_node("LayerNormalization", ["x", "g"], ["ln"], axis=-1),
             h.make_node("MatMul", ["y", "W"], ["mm"]),
             h.make_node("Add", ["ln", "mm"], ["r"]),
             h.make_node("Relu", ["r"], ["z"])]
    g = h.make_graph(nodes, "indep", [_vi("x", [N, D]), _vi("y", [N, D])],
                     [_vi("ln", [N, D]), _vi("z", [N, D])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    res = import_onnx(m)
    assert len(res.subgraphs) == 1
    sg = res.subgraphs[0]
    assert {dict(sg.tensor_names)[n] for n, _ in sg.graph.inputs} == {"x", "g", "mm"}
    assert {dict(sg.tensor_names)[o] for o in sg.graph.outputs} == {"ln", "z"}
    feeds = {"x": RNG.standard_normal((N, D)).astype(np.float32), "y": RNG.standard_normal((N, D)).astype(np.float32)}
    check_onnx_numerics(res, m, feeds)


def test_fused_onnx_ops_attribute_axes_casts_and_gelu():
    """opset 20: LayerNormalization, Gelu (both forms), Softmax/LogSoftmax ops, ReduceSum with axes
    input, Cast to float16 and back, Clip, Max, Pow, Reciprocal, Erf, Tanh, Sigmoid."""
    inits = [_init("g", RNG.standard_normal(D).astype(np.float32)),
             _init("ax0", np.array([0], np.int64)),
             _init("two", np.array([2.0], np.float32)),
             _init("lo", np.array(-2.0, np.float32)), _init("hi", np.array(2.0, np.float32))]
    nodes = [h.make_node("LayerNormalization", ["x", "g"], ["ln", "mean", "istd"], axis=-1, epsilon=1e-6),
             h.make_node("Gelu", ["ln"], ["g1"]),
             h.make_node("Gelu", ["ln"], ["g2"], approximate="tanh"),
             h.make_node("Cast", ["g2"], ["g2h"], to=TP.FLOAT16),
             h.make_node("Cast", ["g2h"], ["g2f"], to=TP.FLOAT),
             h.make_node("Add", ["g1", "g2f"], ["a"]),
             h.make_node("Softmax", ["a"], ["sm"], axis=-1),
             h.make_node("LogSoftmax", ["a"], ["lsm"], axis=1),
             h.make_node("ReduceSum", ["sm", "ax0"], ["cs"], keepdims=0),
             h.make_node("Mul", ["lsm", "cs"], ["p"]),
             h.make_node("Clip", ["p", "lo", "hi"], ["c"]),
             h.make_node("Pow", ["c", "two"], ["c2"]),
             h.make_node("Reciprocal", ["istd"], ["sd"]),
             h.make_node("Erf", ["mean"], ["em"]),
             h.make_node("Max", ["c2", "em", "sd"], ["mx"]),
             h.make_node("Tanh", ["mx"], ["t"]),
             h.make_node("Sigmoid", ["t"], ["y"])]
    g = h.make_graph(nodes, "fused", [_vi("x", [N, D])], [_vi("y", [N, D])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 20)])
    onnx.checker.check_model(m)
    res = import_onnx(m)
    assert len(res.subgraphs) == 1 and not res.boundaries
    ops = {n.op for n in res.subgraphs[0].graph.nodes}
    assert {"gelu", "gelu_tanh", "cast", "square", "maximum", "clamp", "erf", "reciprocal"} <= ops
    check_onnx_numerics(res, m, {"x": RNG.standard_normal((N, D)).astype(np.float32)}, tol=1e-3)


def test_opset13_reduce_axes_attribute_and_float16_model():
    nodes = [h.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1),
             h.make_node("Sub", ["x", "m"], ["y"]),
             h.make_node("Transpose", ["y"], ["yt"]),
             h.make_node("Exp", ["yt"], ["z"])]
    g = h.make_graph(nodes, "half", [_vi("x", [N, D], TP.FLOAT16)], [_vi("z", [D, N], TP.FLOAT16)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    res = import_onnx(m)
    assert len(res.subgraphs) == 1  # the Transpose is an index map inside the region
    g0 = res.subgraphs[0].graph
    assert g0.nodes[0].axes == (1,) and "transpose" in {n.op for n in g0.nodes}
    assert g0.spec("z").dtype == "float16" and g0.spec("z").shape == (D, N)
    make_plan(g0)  # the stitched kernel takes it whole (a permuted output)
    check_onnx_numerics(res, m, {"x": RNG.standard_normal((N, D)).astype(np.float16)}, tol=2e-3)


def test_write_and_cli(tmp_path, capsys):
    m = transformer_ish()
    path = tmp_path / "model.onnx"
    onnx.save(m, str(path))
    out = tmp_path / "out"
    rc = main(["import", "onnx", str(path), "--shapes", "batch=8", "-o", str(out)])
    assert rc == 0
    manifest = json.loads((out / "manifest.json").read_text())
    files = [e["graph"] for e in manifest["subgraphs"]]
    assert files == ["tiny_0.json", "tiny_1.json"]
    g0 = load_graph(out / files[0])
    consts = np.load(out / manifest["subgraphs"][0]["constants"])
    assert set(consts.files) == {"gamma", "beta"}
    assert g0.spec("gamma").shape == consts["gamma"].shape
    assert "2 memory-intensive subgraph(s)" in capsys.readouterr().out
    rc = main(["import", "onnx", str(path), "-o", str(tmp_path / "o2")])
    err = capsys.readouterr().err
    assert rc == 2 and "dynamic" in err and "Traceback" not in err
    rc = main(["import", "onnx", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "o3")])
    assert rc == 2
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    assert main(["import", "onnx", str(tmp_path / "junk.onnx"), "-o", str(tmp_path / "o4")]) == 2


def test_write_subgraphs_returns_paths(tmp_path):
    res = import_onnx(transformer_ish(batch=N))
    paths = write_subgraphs(res, tmp_path)
    assert [p.name for p in paths] == ["tiny_0.json", "tiny_1.json"]
    assert all(load_graph(p).workload_key() == sg.graph.workload_key() for p, sg in zip(paths, res.subgraphs))


def test_model_exported_by_torch_onnx(tmp_path):
    """A PyTorch block exported by torch.onnx (Gemm, LayerNormalization, Gelu, Constant, Softmax)."""
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.ln, self.l2 = torch.nn.Linear(K, D), torch.nn.LayerNorm(D), torch.nn.Linear(D, 16)

        def forward(self, x):
            return torch.softmax(self.l2(torch.nn.functional.gelu(self.ln(self.l1(x)))) * 0.125, -1)

    path = tmp_path / "block.onnx"
    try:
        torch.onnx.export(Block().eval(), (torch.randn(N, K),), str(path), dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "batch"}})
    except Exception as e:  # noqa: BLE001 -- exporter unavailable in this torch build
        pytest.skip(f"torch.onnx.export unavailable: {e}")
    res = import_onnx(path, shapes={"batch": (N,)})
    assert [[n.op for n in sg.graph.nodes][-1] for sg in res.subgraphs] == ["gelu", "div"]
    assert all(NAME_RE.fullmatch(n) for sg in res.subgraphs for n, _ in sg.graph.inputs)
    check_onnx_numerics(res, onnx.load(str(path)), {"x": RNG.standard_normal((N, K)).astype(np.float32)}, tol=1e-4)


def test_an_output_behind_a_free_view_has_the_onnx_tensors_shape(tmp_path):
    """Attention's head merge: softmax(scores) @ v -> Add bias per head -> Transpose(0,2,1,3) ->
    Reshape [B,S,H*D] -> MatMul. The region's output is written in the shape of the ONNX tensor its
    manifest names ([B,S,H*D], stored through the view), not the transposed [B,S,H,D] before it;
    the graph plans and emulates, and matches onnxruntime tensor for tensor."""
    from helpers.lowering import check_emulates
    from helpers.onnx_models import onnx_model

    B, H, S, Dh = 2, 4, 8, 16
    inits = [_init("shape", np.array([B, S, H * Dh], np.int64)),
             _init("W", RNG.standard_normal((H * Dh, 8)).astype(np.float32)),
             _init("hb", RNG.standard_normal((H, 1, Dh)).astype(np.float32))]
    nodes = [h.make_node("MatMul", ["p", "v"], ["ctx"]),
             h.make_node("Add", ["ctx", "hb"], ["cb"]),
             h.make_node("Transpose", ["cb"], ["ct"], perm=[0, 2, 1, 3]),
             h.make_node("Reshape", ["ct", "shape"], ["merged"]),
             h.make_node("MatMul", ["merged", "W"], ["y"])]
    m = onnx_model(nodes, [_vi("p", [B, H, S, S]), _vi("v", [B, H, S, Dh])], [_vi("y", [B, S, 8])], inits)
    res = import_onnx(m)
    assert len(res.subgraphs) == 1, res.boundaries
    sg = res.subgraphs[0]
    names = dict(sg.tensor_names)
    (out,) = sg.graph.outputs
    assert names[out] == "merged" and sg.graph.spec(out).shape == (B, S, H * Dh)
    feeds = {"p": RNG.random((B, H, S, S)).astype(np.float32), "v": RNG.standard_normal((B, H, S, Dh)).astype(np.float32)}
    assert check_onnx_numerics(res, m, feeds) == 1
    check_emulates(sg.graph, n_samples=2)
    write_subgraphs(res, tmp_path)
    entry = json.loads((tmp_path / "manifest.json").read_text())["subgraphs"][0]
    written = load_graph(tmp_path / entry["graph"])
    assert entry["onnx_tensors"][written.outputs[0]] == "merged" and written.spec(written.outputs[0]).shape == (B, S, H * Dh)


def test_a_pad_of_nothing_is_the_value_it_pads():
    """Pad with constant zero pads (Swin's ``maybe_pad`` where the windows tile the image) maps to nothing:
    the Exp before it and the Relu after it are one subgraph; a Pad that pads is a boundary."""
    def model(pads):
        nodes = [h.make_node("Exp", ["x"], ["e"]), h.make_node("Pad", ["e", "pads"], ["p"]),
                 h.make_node("Relu", ["p"], ["y"])]
        out = [N, D + sum(pads[1::2])]
        g = h.make_graph(nodes, "pad", [_vi("x", [N, D])], [_vi("y", out)], [_init("pads", np.array(pads, np.int64))])
        return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])

    m = model([0, 0, 0, 0])
    res = import_onnx(m)
    (sg,) = res.subgraphs
    assert [n.op for n in sg.graph.nodes] == ["exp", "relu"]
    check_onnx_numerics(res, m, {"x": RNG.standard_normal((N, D)).astype(np.float32)})
    res = import_onnx(model([0, 0, 0, 1]))
    assert len(res.subgraphs) == 2 and any(":Pad:" in b and "pads (graph.json has no pad)" in b for b in res.boundaries)
