"""Peers (torch eager, torch.compile, JAX jit) against the numpy reference on the small examples (CPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stitchtune.bench import peers
from stitchtune.graph.parse import load_graph, parse_graph
from stitchtune.graph.ops import OPS
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.gpu.runners import check_outputs, output_dtypes

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = sorted(EXAMPLES.glob("*_small.json"))


def _to_torch(arr: np.ndarray):
    import torch

    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.uint16).astype(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(arr))


def _torch_outputs(graph, fn, inputs):
    outs = fn(**{k: _to_torch(v) for k, v in inputs.items()})
    assert len(outs) == len(graph.outputs)
    res = {}
    for name, t in zip(graph.outputs, outs):
        assert str(t.dtype).removeprefix("torch.") == graph.spec(name).dtype
        assert tuple(t.shape) == graph.spec(name).shape
        res[name] = t.float().numpy()
    return res


def _assert_matches(graph, outs, inputs) -> None:
    ref = {k: v.astype(np.float64) for k, v in run_reference(graph, inputs).items()}
    res = check_outputs(outs, ref, output_dtypes(graph))
    assert res.ok, f"{graph.name}: {res.error}"


def test_small_examples_exist() -> None:
    assert len(SMALL) >= 8


@pytest.mark.parametrize("path", SMALL, ids=lambda p: p.stem)
def test_torch_eager_matches_reference(path: Path) -> None:
    pytest.importorskip("torch")
    graph = load_graph(path)
    inputs = random_inputs(graph, seed=3)
    outs = _torch_outputs(graph, peers.torch_function(graph), inputs)
    _assert_matches(graph, outs, inputs)


@pytest.mark.parametrize("path", SMALL, ids=lambda p: p.stem)
def test_jax_jit_matches_reference(path: Path) -> None:
    pytest.importorskip("jax")
    graph = load_graph(path)
    inputs = random_inputs(graph, seed=4)
    outs = peers.jax_function(graph)(**inputs)
    assert len(outs) == len(graph.outputs)
    res = {}
    for name, a in zip(graph.outputs, outs):
        assert str(a.dtype) == graph.spec(name).dtype
        res[name] = np.asarray(a, dtype=np.float32)
    _assert_matches(graph, res, inputs)


def _every_op_graph() -> dict:
    """One graph touching every op of the table, with scalar constants on either side."""
    x = {"shape": [4, 8], "dtype": "float32"}
    nodes: list[dict] = []
    last = "x"
    for i, op in enumerate(sorted(OPS)):
        kind, nid = OPS[op].kind, f"n{i}"
        if op in ("log", "sqrt", "rsqrt", "pow"):  # a positive operand
            nodes += [{"id": f"a{i}", "op": "abs", "args": [last]},
                      {"id": f"p{i}", "op": "add", "args": [f"a{i}", 0.5]}]
        if "b" in OPS[op].arg_types:  # bool operands: comparisons of the running value and of y
            nodes.append({"id": f"b{i}", "op": "gt", "args": [last, 0.0]})
        if OPS[op].arg_types == "bb":
            nodes.append({"id": f"c{i}", "op": "lt", "args": ["y", 0.25]})
        if OPS[op].arg_types in ("b", "bb"):
            nodes.append({"id": nid, "op": op, "args": [f"b{i}", f"c{i}"][: OPS[op].arity]})
        elif kind == "ternary":
            args = [f"b{i}", last, [1.5, "y"][i % 2]] if op == "where" else [last, -0.5, "y"]
            nodes.append({"id": nid, "op": op, "args": args})
        elif kind == "unary":
            nodes.append({"id": nid, "op": op, "args": [f"p{i}" if op in ("log", "sqrt", "rsqrt") else last]})
        elif op == "uniform":  # random numbers of a seed and a counter (both iotas here), added
            nodes += [{"id": f"q{i}", "op": "iota", "args": [], "shape": [4, 8], "axis": 1, "dtype": "int64"},
                      {"id": f"w{i}", "op": op, "args": [f"q{i}", f"q{i}"]},
                      {"id": nid, "op": "add", "args": [f"w{i}", last]}]
        elif kind == "binary":
            a = f"p{i}" if op == "pow" else last
            args = [[a, 1.5], [1.5, a], [a, "y"]][i % 3]
            nodes.append({"id": nid, "op": op, "args": args})
        elif kind == "reduce":
            nodes.append({"id": nid, "op": op, "args": [last], "axes": [-1], "keepdims": True})
        elif kind == "slice":  # the last 6 columns, then back to 8 by a concat of the first 2
            nodes += [{"id": nid, "op": op, "args": [last], "axis": -1, "start": 2, "stop": 8},
                      {"id": f"h{i}", "op": "slice", "args": [last], "axis": 1, "start": 0, "stop": -6},
                      {"id": f"j{i}", "op": "concat", "args": [nid, f"h{i}"], "axis": 1}]
            nid = f"j{i}"
        elif kind == "concat":  # rotate_half
            nodes += [{"id": f"h{i}", "op": "slice", "args": [last], "axis": -1, "start": 4, "stop": 8},
                      {"id": f"l{i}", "op": "slice", "args": [last], "axis": -1, "start": 0, "stop": 4},
                      {"id": nid, "op": op, "args": [f"h{i}", f"l{i}"], "axis": -1}]
        elif op == "iota":  # column coordinates, made float and scaled
            nodes += [{"id": f"q{i}", "op": op, "args": [], "shape": [4, 8], "axis": 1, "dtype": "int32"},
                      {"id": f"r{i}", "op": "cast", "args": [f"q{i}"], "to": "float32"},
                      {"id": f"v{i}", "op": "mul", "args": [f"r{i}", 0.125]},
                      {"id": nid, "op": "add", "args": [f"v{i}", last]}]
        elif op == "gather_elements":  # one column of the running value per row (cross entropy's pick)
            nodes += [{"id": f"g{i}", "op": op, "args": [last, "cols"], "axis": 1},
                      {"id": nid, "op": "add", "args": [f"g{i}", last]}]
        elif kind == "gather":  # rows of y by the index input (a row of zeros for index -1 is in test_gather)
            nodes += [{"id": f"g{i}", "op": op, "args": ["y", "ids"], "axis": 0},
                      {"id": nid, "op": "add", "args": [f"g{i}", last]}]
        elif op == "transpose":  # [4, 8] -> [8, 4] -> back
            nodes += [{"id": f"u{i}", "op": op, "args": [last], "perm": [1, 0]},
                      {"id": nid, "op": op, "args": [f"u{i}"], "perm": [1, 0]}]
        elif op == "reshape":
            nodes += [{"id": f"u{i}", "op": op, "args": [last], "shape": [2, 16]},
                      {"id": nid, "op": op, "args": [f"u{i}"], "shape": [4, 8]}]
        elif op == "expand":  # [4, 8] -> [4, 1, 8] -> [3, 4, 2, 8] -> mean over the grown dims
            nodes += [{"id": f"u{i}", "op": "reshape", "args": [last], "shape": [4, 1, 8]},
                      {"id": f"e{i}", "op": op, "args": [f"u{i}"], "shape": [3, 4, 2, 8]},
                      {"id": nid, "op": "reduce_mean", "args": [f"e{i}"], "axes": [0, 2], "keepdims": False}]
        elif kind == "scatter":  # the running value's rows added at the index input's rows (repeats add up)
            nodes += [{"id": f"g{i}", "op": op, "args": [last, "ids"], "shape": [4, 8]},
                      {"id": nid, "op": "add", "args": [f"g{i}", last]}]
        else:
            nodes.append({"id": nid, "op": "cast", "args": [last], "to": "bfloat16"})
        if OPS[op].result == "bool":  # back to float (0 / 1) for the arithmetic that follows
            nodes.append({"id": f"f{i}", "op": "cast", "args": [nid], "to": "float32"})
            nid = f"f{i}"
        nodes += [{"id": f"m{i}", "op": "mul", "args": [nid, 0.5]},  # keep values bounded
                  {"id": f"t{i}", "op": "tanh", "args": [f"m{i}"]},
                  {"id": f"s{i}", "op": "add", "args": [f"t{i}", "x"]}]
        last = f"s{i}"
    nodes.append({"id": "mx", "op": "maximum", "args": [0.25, last]})
    nodes.append({"id": "out", "op": "cast", "args": ["mx"], "to": "float16"})
    return {"name": "every_op", "inputs": {"x": x, "y": x, "ids": {"shape": [4], "dtype": "int32"},
                                              "cols": {"shape": [4, 1], "dtype": "int64"}},
            "nodes": nodes, "outputs": ["out", last]}


def test_every_op_is_covered() -> None:
    assert {n.op for n in parse_graph(_every_op_graph()).nodes} == set(OPS)


def test_every_op_matches_in_torch() -> None:
    pytest.importorskip("torch")
    graph = parse_graph(_every_op_graph())
    inputs = random_inputs(graph, seed=5)
    _assert_matches(graph, _torch_outputs(graph, peers.torch_function(graph), inputs), inputs)


def test_every_op_matches_in_jax() -> None:
    """Every op has a JAX form (``uniform`` included: the reference's bits, see test_peer_ints.py)."""
    pytest.importorskip("jax")
    graph = parse_graph(_every_op_graph())
    inputs = random_inputs(graph, seed=5)
    outs = peers.jax_function(graph)(**inputs)
    _assert_matches(graph, {n: np.asarray(a, dtype=np.float32) for n, a in zip(graph.outputs, outs)}, inputs)


@pytest.mark.slow
def test_torch_compile_default_matches_reference() -> None:
    """torch.compile (Inductor, CPU C++ backend here) on two small examples, one 16-bit."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch._inductor")
    for stem in ("layernorm_small", "layernorm_bf16_small"):
        graph = load_graph(EXAMPLES / f"{stem}.json")
        inputs = random_inputs(graph, seed=6)
        fn = peers.torch_function(graph, compile_mode="default")
        _assert_matches(graph, _torch_outputs(graph, fn, inputs), inputs)
    torch._dynamo.reset()


def test_build_peers_and_names() -> None:
    graph = load_graph(EXAMPLES / "softmax_small.json")
    got, notes = peers.build_peers(graph, ("eager", "xla"))
    systems = {p.system for p in got} | {n.split(":")[0] for n in notes}
    assert systems == {"torch_eager", "jax_jit"}
    assert peers.parse_peer_names("eager, xla,eager") == ("eager", "xla")
    assert peers.parse_peer_names(None) == peers.PEER_NAMES
    assert peers.parse_peer_names("none") == ()
    with pytest.raises(peers.PeerError) as ei:
        peers.parse_peer_names("eager,tvm")
    assert "tvm" in ei.value.problems[0]


def test_missing_framework_is_skipped_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "jax" or name.startswith("jax."):
            raise ImportError("No module named 'jax'", name="jax")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    graph = load_graph(EXAMPLES / "softmax_small.json")
    got, notes = peers.build_peers(graph, ("xla",))
    assert got == []
    assert notes == ["jax_jit: skipped (jax not installed)"]


@pytest.mark.slow
def test_compiled_peers_of_many_graphs_do_not_share_a_dynamo_cache() -> None:
    """More graphs than dynamo's recompile limit: every compiled peer is really compiled (without a
    fresh code object per peer, dynamo would compile only ``limit`` of them and run the rest eagerly)."""
    pytest.importorskip("torch")
    import torch._dynamo

    stems = ("softmax_small", "layernorm_small", "rmsnorm_small", "bias_gelu_small")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch._dynamo.config.patch(recompile_limit=2):
        for stem in stems:
            graph = load_graph(EXAMPLES / f"{stem}.json")
            inputs = random_inputs(graph, seed=7)
            fn = peers.torch_function(graph, compile_mode="default")
            _assert_matches(graph, _torch_outputs(graph, fn, inputs), inputs)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == len(stems)
    torch._dynamo.reset()


def test_scatter_add_peers_add_nothing_for_out_of_range_indices() -> None:
    """torch's ``index_add`` and JAX's ``.at[].add`` forms of ``scatter_add``: repeated rows add up, an
    index outside the table (-1, rows) adds nothing, as the reference."""
    graph = parse_graph({"name": "s", "inputs": {"v": {"shape": [2, 3, 8], "dtype": "float32"},
                                                  "ids": {"shape": [2, 3], "dtype": "int64"}},
                         "nodes": [{"id": "dw", "op": "scatter_add", "args": ["v", "ids"], "shape": [5, 8]}],
                         "outputs": ["dw"]})
    inputs = random_inputs(graph, seed=1)
    inputs["ids"] = np.array([[1, 1, -1], [5, 4, 0]], dtype=np.int64)
    pytest.importorskip("torch")
    _assert_matches(graph, _torch_outputs(graph, peers.torch_function(graph), inputs), inputs)
    pytest.importorskip("jax")
    outs = peers.jax_function(graph)(**inputs)
    _assert_matches(graph, {n: np.asarray(a, dtype=np.float32) for n, a in zip(graph.outputs, outs)}, inputs)
