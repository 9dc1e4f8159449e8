"""ONNX importer on models exported whole by torch.onnx: BERT-like and Llama-like blocks written here,
exported with the legacy (TorchScript) exporter and the dynamo exporter, imported through the CLI.
Also the constant folder and the no-op groups on hand-built graphs."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from helpers.onnx_models import check_onnx_numerics, onnx_vi

from stitchtune.cli import main
from stitchtune.graph.parse import load_graph
from stitchtune.importers.onnx_fold import MAX_FOLD_ELEMENTS
from stitchtune.importers.onnx_import import import_onnx

B, S, D, H, FF = 2, 8, 32, 4, 64
nn, F = torch.nn, torch.nn.functional


class BertBlock(nn.Module):
    """An encoder layer written the way HF BERT writes it: size()/view/expand, additive mask, GELU."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.f1, self.f2 = nn.Linear(D, FF), nn.Linear(FF, D)

    def heads(self, x):
        return x.view(x.size(0), x.size(1), H, D // H).transpose(1, 2)

    def forward(self, x, attention_mask):
        b, s, d = x.size()
        ext = attention_mask[:, None, None, :].expand(b, 1, s, s).to(x.dtype)
        ext = (1.0 - ext) * torch.finfo(x.dtype).min
        q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
        p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D // H) + ext, -1)
        c = (p @ v).transpose(1, 2).contiguous().view(b, s, d)
        x = self.ln1(x + self.o(c))
        return self.ln2(x + self.f2(F.gelu(self.f1(x))))


class LlamaBlock(nn.Module):
    """A decoder layer the way HF Llama writes it: RMSNorm, rotary tables from arange, causal mask
    from full/triu/expand, SiLU-gated MLP, and a same-dtype ``.to()`` before o_proj."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D, bias=False) for _ in range(4))
        self.w1, self.w2, self.w3 = nn.Linear(D, FF, bias=False), nn.Linear(FF, D, bias=False), nn.Linear(D, FF, bias=False)
        self.g1, self.g2 = nn.Parameter(torch.rand(D) + 0.5), nn.Parameter(torch.rand(D) + 0.5)
        dh = D // H
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dh, 2).float() / dh)), persistent=False)

    @staticmethod
    def rms(x, g):
        return g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    @staticmethod
    def rot(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), -1)

    def forward(self, x):
        b, s, _ = x.shape
        pos = torch.arange(s).unsqueeze(0).expand(b, -1)
        freqs = (self.inv_freq[None, :, None].expand(b, -1, 1) @ pos[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), -1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        mask = torch.full((s, s), torch.finfo(x.dtype).min).triu(1)[None, None].expand(b, 1, -1, -1)
        hx = self.rms(x, self.g1)
        q, k, v = (p(hx).view(b, s, H, D // H).transpose(1, 2) for p in (self.q, self.k, self.v))
        q, k = q * cos + self.rot(q) * sin, k * cos + self.rot(k) * sin
        p = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(D // H) + mask, dim=-1)
        a = (p @ v).transpose(1, 2).reshape(b, s, -1)
        x = x + self.o(a.to(x.dtype))
        hx = self.rms(x, self.g2)
        return x + self.w2(F.silu(self.w1(hx)) * self.w3(hx))


def _inputs(kind: str):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, S, D, generator=g)
    if kind == "bert":
        mask = torch.ones(B, S, dtype=torch.int64)
        mask[1, 5:] = 0
        return (x, mask), ["x", "attention_mask"]
    return (x,), ["x"]


def _export_legacy(kind: str, path) -> None:
    torch.manual_seed(0)
    module = (BertBlock() if kind == "bert" else LlamaBlock()).eval()
    args, names = _inputs(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), dynamo=False, input_names=names, output_names=["y"])


def _import_cli(path, out, capsys) -> tuple[dict, str]:
    assert main(["import", "onnx", str(path), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    return json.loads((out / "manifest.json").read_text()), text


def _check_written(manifest, out) -> None:
    """Every graph.json written loads and validates, and its constants match its inputs."""
    assert manifest["subgraphs"]
    for e in manifest["subgraphs"]:
        g = load_graph(out / e["graph"])   # parse + validate
        assert g.nodes
        if "constants" in e:
            consts = np.load(out / e["constants"])
            for n in consts.files:
                assert g.spec(n).shape == consts[n].shape


def _feeds(kind: str) -> dict[str, np.ndarray]:
    args, names = _inputs(kind)
    return {n: a.numpy() for n, a in zip(names, args)}


def test_legacy_bert_block_imports_without_shapes(tmp_path, capsys):
    path = tmp_path / "bert.onnx"
    _export_legacy("bert", path)
    manifest, text = _import_cli(path, tmp_path / "out", capsys)
    _check_written(manifest, tmp_path / "out")
    ops = [[n["op"] for n in json.loads((tmp_path / "out" / e["graph"]).read_text())["nodes"]]
           for e in manifest["subgraphs"]]
    assert any("exp" in o and "reduce_max" in o for o in ops)            # softmax with the additive mask
    assert sum("rsqrt" in o for o in ops) == 2                             # both layer norms
    assert any("gelu" in o for o in ops)
    # the mask's Expand shape came from a ConstantOfShape/Equal/Where chain: folded
    assert {f.split(":")[1] for f in manifest["folded"]} >= {"ConstantOfShape", "Equal", "Where"}
    assert len(manifest["compute_ops"]) == 8 and "compute ops left to the framework: MatMul x8" in text
    status = [r["status"] for r in manifest["regions"]]
    assert status.count("whole") >= 1 and "cut" in status
    # the mask's Expand is an ``expand`` node or a view inside the regions: only MatMuls cut them
    assert {s.split(":")[1] for r in manifest["regions"] for s in r["stopped_by"]} == {"MatMul"}
    assert "regions: " in text and "cut: nodes" in text and "stopped by" in text
    res = import_onnx(path)
    assert check_onnx_numerics(res, onnx.load(str(path)), _feeds("bert"), tol=1e-4) >= len(res.subgraphs)


def test_legacy_llama_block_imports_and_drops_the_noop_cast(tmp_path, capsys):
    path = tmp_path / "llama.onnx"
    _export_legacy("llama", path)
    manifest, text = _import_cli(path, tmp_path / "out", capsys)
    _check_written(manifest, tmp_path / "out")
    graphs = [json.loads((tmp_path / "out" / e["graph"]).read_text()) for e in manifest["subgraphs"]]
    ops = [[n["op"] for n in g["nodes"]] for g in graphs]
    assert sum("sqrt" in o and "reduce_mean" in o for o in ops) == 2      # both RMSNorms (rsqrt: Sqrt, Div)
    assert any("sigmoid" in o for o in ops)                                  # SiLU
    assert any("exp" in o and "reduce_sum" in o for o in ops)               # softmax + causal mask
    # the causal mask and the rotary tables are constants now (folded Trilu/Expand, MatMul/Cos/Sin)
    folded_ops = {f.split(":")[1] for f in manifest["folded"]}
    assert {"Trilu", "Expand", "Cos", "Sin", "MatMul"} <= folded_ops
    assert len(manifest["compute_ops"]) == 9                                # 10 MatMuls, one folded
    # the head-split Reshape/Transpose and the rotary rotate_half (Slice, Neg, Concat) are index maps
    # inside the regions now, and the no-op Cast travels with them; what is still dropped (if anything)
    # is a no-op group of Casts/Reshapes, never fatal
    assert sum("slice" in o and "concat" in o and "transpose" in o for o in ops) == 2  # rotary of q and k
    groups = manifest["dropped_noop_groups"]
    ops = [n.split(":")[1] for g in groups for n in g.split(", ")]
    assert set(ops) <= {"Cast", "Reshape"}
    assert f"dropped no-op groups: {len(groups)}" in text
    in_regions = {n for r in manifest["regions"] for n in r["nodes"]}   # each dropped node is in a region
    assert all(n in in_regions for g in groups for n in g.split(", "))
    res = import_onnx(path)
    assert check_onnx_numerics(res, onnx.load(str(path)), _feeds("llama"), tol=1e-4) >= len(res.subgraphs)


def test_legacy_export_with_dynamic_axes_still_takes_shapes(tmp_path, capsys):
    """Genuinely dynamic inputs: the error names the input symbol; --shapes fixes it, then the
    Shape/Gather chains on the now static input fold."""
    torch.manual_seed(0)
    args, names = _inputs("bert")
    path = tmp_path / "bert_dyn.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(BertBlock().eval(), args, str(path), dynamo=False, input_names=names,
                          output_names=["y"], dynamic_axes={"x": {0: "batch"}, "attention_mask": {0: "batch"}})
    assert main(["import", "onnx", str(path), "-o", str(tmp_path / "o1")]) == 2
    err = capsys.readouterr().err
    assert "'batch'" in err and "--shapes" in err and not (tmp_path / "o1").exists()
    assert main(["import", "onnx", str(path), "--shapes", f"batch={B}", "-o", str(tmp_path / "o2")]) == 0
    manifest = json.loads((tmp_path / "o2" / "manifest.json").read_text())
    _check_written(manifest, tmp_path / "o2")
    assert "Shape" in {f.split(":")[1] for f in manifest["folded"]}


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_dynamo_exported_blocks_import(tmp_path, capsys, kind):
    pytest.importorskip("onnxscript", reason="the dynamo ONNX exporter needs onnxscript")
    torch.manual_seed(0)
    module = (BertBlock() if kind == "bert" else LlamaBlock()).eval()
    args, names = _inputs(kind)
    path = tmp_path / f"{kind}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(module, args, dynamo=True, input_names=names, output_names=["y"],
                                 external_data=False)
    prog.save(str(path))
    manifest, text = _import_cli(path, tmp_path / f"out_{kind}", capsys)
    _check_written(manifest, tmp_path / f"out_{kind}")
    assert manifest["compute_ops"] and "regions: " in text
    res = import_onnx(path)
    assert check_onnx_numerics(res, onnx.load(str(path)), _feeds(kind), tol=1e-4) >= len(res.subgraphs)


# ---------------------------------------------------------------------------- hand-built graphs
_vi = onnx_vi


def test_folds_the_legacy_expand_chain_and_bounds_what_it_folds():
    """Expand(x, Where(Equal(c, ConstantOfShape*-1), ConstantOfShape, c)) as the legacy exporter
    writes it: the shape folds, the Expand gets a static shape; a ConstantOfShape of 2**30 elements
    is left unfolded (and reported), not allocated."""
    c = nh.from_array(np.array([4, 1, 8], np.int64), "c")
    big = nh.from_array(np.array([2**15, 2**15], np.int64), "big")
    nodes = [h.make_node("ConstantOfShape", ["three"], ["ones"], value=nh.from_array(np.array([1], np.int64))),
             h.make_node("Constant", [], ["three"], value=nh.from_array(np.array([3], np.int64))),
             h.make_node("Mul", ["ones", "minus1"], ["m1"]),
             h.make_node("Equal", ["c", "m1"], ["eq"]),
             h.make_node("Where", ["eq", "ones", "c"], ["shape"]),
             h.make_node("Expand", ["x", "shape"], ["xe"]),
             h.make_node("Exp", ["xe"], ["y"]),
             h.make_node("ConstantOfShape", ["big"], ["huge"]),
             h.make_node("Shape", ["huge"], ["hs"])]
    nodes = [nodes[1], nodes[0], *nodes[2:]]
    g = h.make_graph(nodes, "chain", [_vi("x", [1, 8])], [_vi("y", [4, 1, 8]), _vi("hs", [2], TP.INT64)],
                     [c, big, nh.from_array(np.array(-1, np.int64), "minus1")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    res = import_onnx(m)
    assert [f.split(":")[1] for f in res.fold.folded][:4] == ["ConstantOfShape", "Mul", "Equal", "Where"]
    assert any(":ConstantOfShape:" in u and str(MAX_FOLD_ELEMENTS) in u for u in res.fold.unfolded)
    g = res.subgraphs[0].graph   # the Expand (now static) is a view; y leaves expanded to [4, 1, 8]
    assert len(res.subgraphs) == 1 and g.spec(g.inputs[0][0]).shape == (1, 8)
    assert [n.op for n in g.nodes] == ["exp", "expand"] and g.spec(g.outputs[0]).shape == (4, 1, 8)


def test_noop_groups_are_dropped_not_fatal(tmp_path, capsys):
    """Identity, a float->float Cast and a Reshape to the same shape between MatMuls: no graph, a
    line in the summary; a no-op Reshape inside a real group is simply passed through."""
    W = nh.from_array(np.eye(8, dtype=np.float32), "W")
    same = nh.from_array(np.array([4, 8], np.int64), "same")
    nodes = [h.make_node("MatMul", ["x", "W"], ["a"]),
             h.make_node("Identity", ["a"], ["b"]),
             h.make_node("MatMul", ["b", "W"], ["c"]),
             h.make_node("Cast", ["c"], ["d"], to=TP.FLOAT),
             h.make_node("MatMul", ["d", "W"], ["e"]),
             h.make_node("Reshape", ["e", "same"], ["f"]),
             h.make_node("MatMul", ["f", "W"], ["g"]),
             h.make_node("Relu", ["g"], ["r"]),
             h.make_node("Reshape", ["r", "same"], ["y"])]
    graph = h.make_graph(nodes, "noops", [_vi("x", [4, 8])], [_vi("y", [4, 8])], [W, same])
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    res = import_onnx(m)
    assert [d.split(":")[1] for d in res.dropped] == ["Identity", "Cast", "Reshape"]
    assert len(res.subgraphs) == 1 and [n.op for n in res.subgraphs[0].graph.nodes] == ["relu"]
    assert dict(res.subgraphs[0].tensor_names)[res.subgraphs[0].graph.outputs[0]] in ("r", "y")
    assert sorted(r.status for r in res.regions) == ["dropped", "dropped", "dropped", "whole"]
    path = tmp_path / "noops.onnx"
    onnx.save(m, str(path))
    assert main(["import", "onnx", str(path), "-o", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert "dropped no-op groups: 3" in text and "3 dropped as no-ops" in text and "1 imported whole" in text
    assert check_onnx_numerics(res, m, {"x": np.ones((4, 8), np.float32)}) == 1
