"""graph.json validation: each kind of problem is reported with its JSON path; inference; round trip."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from stitchtune.graph import checks
from stitchtune.graph import parse as G
from stitchtune.errors import GraphError, StitchtuneError
from stitchtune.graph.parse import Graph, load_graph, parse_graph, parse_graph_bytes


def base() -> dict[str, Any]:
    return {
        "name": "ln",
        "inputs": {"x": {"shape": [8, 16], "dtype": "float32"},
                   "g": {"shape": [16], "dtype": "float32"}},
        "nodes": [
            {"id": "m", "op": "reduce_mean", "args": ["x"], "axes": [-1], "keepdims": True},
            {"id": "c", "op": "sub", "args": ["x", "m"]},
            {"id": "y", "op": "mul", "args": ["c", "g"]},
        ],
        "outputs": ["y"],
    }


def problems(obj: Any) -> list[str]:
    with pytest.raises(GraphError) as ei:
        parse_graph(obj)
    assert isinstance(ei.value, StitchtuneError)
    assert ei.value.problems
    return ei.value.problems


def one(obj: Any, path: str, words: str) -> None:
    """Exactly the expected problem is among those reported."""
    ps = problems(obj)
    assert any(p.startswith(path + ":") and words in p for p in ps), ps


def mutated(**changes: Any) -> dict[str, Any]:
    g = base()
    for k, v in changes.items():
        g[k] = v
    return g


def with_node(i: int, **fields: Any) -> dict[str, Any]:
    g = base()
    g["nodes"][i].update(fields)
    return g


# ---------------------------------------------------------------------------- valid graphs
def test_base_parses_and_infers() -> None:
    g = parse_graph(base())
    assert isinstance(g, Graph)
    assert g.node("m").shape == (8, 1) and g.node("m").axes == (1,)
    assert g.node("y").shape == (8, 16) and g.node("y").dtype == "float32"
    assert g.spec("g").shape == (16,)
    assert [n.id for n in g.consumers("x")] == ["m", "c"]
    assert g.consumers("y") == ()
    assert g.min_bytes() == (8 * 16 + 16 + 8 * 16) * 4


def test_upstream_walks_up_only_through_the_nodes_it_is_let() -> None:
    g = parse_graph(base())
    assert g.upstream(["y"]) == {"y", "c", "g", "m", "x"}
    assert g.upstream(["c"], lambda nd: nd.op != "reduce_mean") == {"c", "x", "m"}   # m kept, not walked
    assert g.upstream(["y"], lambda nd: False) == {"y"}
    assert g.upstream(["g", "m"]) == {"g", "m", "x"} and g.upstream([]) == frozenset()


def test_to_dict_round_trip(small_examples: list[Path]) -> None:
    for path in small_examples:
        g = load_graph(path)
        d = g.to_dict()
        assert parse_graph(json.loads(json.dumps(d))) == g
        assert Graph.from_dict(d) == g


def test_dtype_promotion_and_cast() -> None:
    g = base()
    g["inputs"]["h"] = {"shape": [16], "dtype": "float16"}
    g["inputs"]["b"] = {"shape": [16], "dtype": "bfloat16"}
    g["nodes"] += [
        {"id": "hh", "op": "add", "args": ["h", 2.0]},
        {"id": "hb", "op": "add", "args": ["h", "b"]},
        {"id": "hx", "op": "mul", "args": ["hh", "y"]},
        {"id": "cb", "op": "cast", "args": ["hx"], "to": "bfloat16"},
        {"id": "rb", "op": "reduce_max", "args": ["b"], "axes": [0], "keepdims": True},
    ]
    g["outputs"] = ["y", "hh", "hb", "cb", "rb", "x"]
    gr = parse_graph(g)
    assert gr.node("hh").dtype == "float16"  # constants do not promote
    assert gr.node("hb").dtype == "float32"  # float16 + bfloat16 -> float32
    assert gr.node("hx").dtype == "float32"
    assert gr.node("cb").dtype == "bfloat16" and gr.node("cb").to == "bfloat16"
    assert gr.node("rb").dtype == "bfloat16" and gr.node("rb").shape == (1,)
    assert gr.outputs[-1] == "x"  # an output may be an input


def test_infinite_constants_and_ints_accepted() -> None:
    g = with_node(2, op="maximum", args=["c", -math.inf])
    assert parse_graph(g).node("y").args == ("c", -math.inf)
    g = parse_graph_bytes(json.dumps(with_node(2, op="add", args=["c", 3])).encode())
    assert g.node("y").args == ("c", 3.0) and isinstance(g.node("y").args[1], float)
    g = parse_graph_bytes(b'{"name":"a","inputs":{"x":{"shape":[2],"dtype":"float32"}},'
                          b'"nodes":[{"id":"y","op":"minimum","args":["x",1e999]}],"outputs":["y"]}')
    assert g.node("y").args[1] == math.inf


def test_reduce_axes_normalised_sorted_and_keepdims_default() -> None:
    g = base()
    g["inputs"]["t"] = {"shape": [2, 3, 4, 5], "dtype": "float32"}
    g["nodes"].append({"id": "r", "op": "reduce_sum", "args": ["t"], "axes": [-1, 1]})
    g["outputs"].append("r")
    n = parse_graph(g).node("r")
    assert n.axes == (1, 3) and n.keepdims is False and n.shape == (2, 4)


def test_broadcast_shapes() -> None:
    assert G.broadcast_shapes((8, 1), (16,)) == (8, 16)
    assert G.broadcast_shapes((3, 1, 5), (4, 1)) == (3, 4, 5)
    assert G.broadcast_shapes((3,), (4,)) is None


# ---------------------------------------------------------------------------- each problem kind
def test_not_json_and_not_utf8() -> None:
    with pytest.raises(GraphError, match="not JSON"):
        parse_graph_bytes(b"{nope")
    with pytest.raises(GraphError, match="not UTF-8"):
        parse_graph_bytes(b'{"name": "\xff"}')
    with pytest.raises(GraphError, match="nested too deeply"):
        parse_graph_bytes(b"[" * 100000)


def test_top_level_types() -> None:
    one([1, 2], "(top level)", "must be a JSON object")
    one(mutated(inputs=[]), "inputs", "must be an object")
    one(mutated(nodes={}), "nodes", "must be a list")
    one(mutated(outputs="y"), "outputs", "must be a list")
    one({"name": "a"}, "inputs", "missing")
    one(mutated(extra=1), "extra", "unknown key")


def test_duplicate_json_keys() -> None:
    raw = b'{"name":"a","name":"b","inputs":{"x":{"shape":[2],"dtype":"float32"}},' \
          b'"nodes":[{"id":"y","op":"exp","args":["x"]}],"outputs":["y"]}'
    with pytest.raises(GraphError, match="duplicate key 'name'"):
        parse_graph_bytes(raw)


def test_unknown_op_and_arity() -> None:
    one(with_node(1, op="frobnicate"), "nodes[1].op", "unknown op 'frobnicate'")
    one(with_node(1, args=["x"]), "nodes[1].args", "wrong arity")
    one(with_node(1, op="exp"), "nodes[1].args", "wrong arity")


def test_unknown_duplicate_and_forward_names() -> None:
    one(with_node(1, args=["x", "foo"]), "nodes[1].args[1]", "unknown tensor 'foo'")
    one(with_node(1, id="x"), "nodes[1].id", "duplicate name 'x'")
    one(with_node(2, id="m"), "nodes[2].id", "duplicate name 'm'")
    one(with_node(0, args=["c"]), "nodes[0].args[0]", "cycle")
    one(with_node(1, args=["x", "c"]), "nodes[1].args[1]", "cycle")
    g = base()
    g["nodes"].insert(0, {"id": "early", "op": "exp", "args": ["m"]})
    g["outputs"].append("early")
    one(g, "nodes[0].args[0]", "forward reference")
    one(mutated(outputs=["nope"]), "outputs[0]", "unknown tensor 'nope'")
    one(mutated(outputs=["y", "y"]), "outputs[1]", "duplicate output")
    one(mutated(outputs=[]), "outputs", "empty")


def test_bad_names() -> None:
    for bad in ["", "1x", "a b", "a\nb", 'q"', "*/", "x;y", "a" * 65, "é"]:
        one(with_node(2, id=bad), "nodes[2].id", "invalid node id")
    one(mutated(name="my graph"), "name", "invalid graph name")
    g = base()
    g["inputs"]["bad-name"] = {"shape": [2], "dtype": "float32"}
    one(g, "inputs['bad-name']", "invalid input name")


def test_impossible_broadcast() -> None:
    g = base()
    g["inputs"]["g"]["shape"] = [15]
    one(g, "nodes[2].args", "impossible broadcast")


def test_reduce_axes_problems() -> None:
    one(with_node(0, axes=[2]), "nodes[0].axes[0]", "out of range")
    one(with_node(0, axes=[-3]), "nodes[0].axes[0]", "out of range")
    one(with_node(0, axes=[1, -1]), "nodes[0].axes[1]", "duplicate axis")
    one(with_node(0, axes=[]), "nodes[0].axes", "non-empty list")
    one(with_node(0, axes=[True]), "nodes[0].axes[0]", "must be an integer")
    one(with_node(0, axes=[0, 1], keepdims=False), "nodes[0]", "reduces to a scalar")
    one(with_node(0, keepdims="yes"), "nodes[0].keepdims", "true or false")
    g = base()
    del g["nodes"][0]["axes"]
    one(g, "nodes[0].axes", "missing")
    one(with_node(1, axes=[0]), "nodes[1].axes", "only reductions")


def test_dtype_and_shape_problems() -> None:
    g = base()
    g["inputs"]["x"]["dtype"] = "complex64"
    one(g, "inputs.x.dtype", "unsupported dtype 'complex64'")
    g = base()
    g["inputs"]["x"]["shape"] = [8, 0]
    one(g, "inputs.x.shape[1]", "must be positive")
    g["inputs"]["x"]["shape"] = [8, -3]
    one(g, "inputs.x.shape[1]", "must be positive")
    g["inputs"]["x"]["shape"] = [8, 2.0]
    one(g, "inputs.x.shape[1]", "must be an integer")
    g["inputs"]["x"]["shape"] = [1, 1, 1, 1, 1, 1, 16]
    one(g, "inputs.x.shape", "rank 7")
    g["inputs"]["x"]["shape"] = []
    one(g, "inputs.x.shape", "rank 0")
    one(with_node(1, op="cast", args=["x"], to="int8"), "nodes[1].to", "unsupported dtype")
    one(with_node(1, op="cast", args=["x"]), "nodes[1].to", "missing")


def test_constant_problems() -> None:
    one(with_node(1, args=["x", True]), "nodes[1].args[1]", "boolean")
    one(with_node(1, args=["x", math.nan]), "nodes[1].args[1]", "NaN")
    one(with_node(1, args=["x", 1e39]), "nodes[1].args[1]", "outside float32 range")
    one(with_node(1, args=["x", "nan"]), "nodes[1].args[1]", "unknown tensor 'nan'")
    one(with_node(1, args=["x", None]), "nodes[1].args[1]", "must be a tensor name or a number")
    one(with_node(1, args=[1.0, 2.0]), "nodes[1].args", "at least one tensor")
    one(with_node(0, args=[1.0]), "nodes[0].args[0]", "needs a tensor argument")


def test_dead_node_rejected() -> None:
    g = base()
    g["nodes"].append({"id": "unused", "op": "exp", "args": ["x"]})
    one(g, "nodes[3]", "does not contribute to any output")


def test_all_problems_reported_at_once() -> None:
    g = base()
    g["inputs"]["x"]["dtype"] = "int8"
    g["nodes"][1]["op"] = "nope"
    g["nodes"][2]["args"] = ["c", "zzz"]
    g["outputs"] = ["qq"]
    ps = problems(g)
    assert any(p.startswith("inputs.x.dtype:") for p in ps)
    assert any(p.startswith("nodes[1].op:") for p in ps)
    assert any(p.startswith("outputs[0]:") for p in ps)
    assert all("\n" not in p for p in ps)


# ---------------------------------------------------------------------------- limits
def test_limits_nodes_inputs_elements_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    g = base()
    g["nodes"] = [copy.deepcopy(g["nodes"][0])] * (G.MAX_NODES + 1)
    one(g, "nodes", "too many nodes")
    g = base()
    g["inputs"] = {f"i{k}": {"shape": [1], "dtype": "float32"} for k in range(G.MAX_INPUTS + 1)}
    one(g, "inputs", "too many inputs")
    g = base()
    g["inputs"]["x"]["shape"] = [65536, 65536]
    one(g, "inputs.x.shape", "too large")
    g = base()
    g["inputs"]["x"]["shape"] = [10**400, 2]
    one(g, "inputs.x.shape", "too large")
    # broadcast that explodes the element count
    g = base()
    g["inputs"]["a"] = {"shape": [65536, 1], "dtype": "float32"}
    g["inputs"]["b"] = {"shape": [1, 65536], "dtype": "float32"}
    g["nodes"].append({"id": "ab", "op": "add", "args": ["a", "b"]})
    g["outputs"].append("ab")
    one(g, "nodes[3]", "too large")
    monkeypatch.setattr(checks, "MAX_TOTAL_BYTES", 1000)   # read where the total-bytes check lives
    one(base(), "(top level)", "too large")


def test_file_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "big.json"
    p.write_bytes(b" " * 2048 + json.dumps(base()).encode())
    monkeypatch.setattr(G, "MAX_FILE_BYTES", 1024)
    with pytest.raises(GraphError, match="too large"):
        load_graph(p)
    with pytest.raises(GraphError, match="cannot read"):
        load_graph(tmp_path / "missing.json")


def test_examples_validate(examples_dir: Path, small_examples: list[Path],
                           full_examples: list[Path]) -> None:
    names = {p.stem for p in full_examples}
    assert {"layernorm", "rmsnorm", "softmax", "softmax_tiny_rows", "bias_gelu", "layernorm_wide",
            "colsum_sigmoid_scale", "layernorm_bf16"} <= names
    for name in names:
        assert (examples_dir / f"{name}_small.json").exists(), name
    for path in small_examples + full_examples:
        g = load_graph(path)
        assert g.name == path.stem
        small = path.stem.endswith("_small")
        if not small:  # the small variant has the same structure, smaller shapes
            s = load_graph(examples_dir / f"{path.stem}_small.json")
            assert [n.op for n in s.nodes] == [n.op for n in g.nodes]
            assert s.min_bytes() < g.min_bytes()
        else:
            assert g.min_bytes() <= 4 * 1024 * 1024


ISSUE_SHAPES = {  # issue 2: the full-size workloads, (input 'x' shape, dtype)
    "layernorm": ([16384, 1024], "float32"), "rmsnorm": ([16384, 4096], "float32"),
    "softmax": ([98304, 512], "float32"), "softmax_tiny_rows": ([1048576, 32], "float32"),
    "bias_gelu": ([16384, 4096], "float32"), "layernorm_wide": ([64, 262144], "float32"),
    "colsum_sigmoid_scale": ([65536, 1024], "float32"), "layernorm_bf16": ([16384, 1024], "bfloat16"),
}


@pytest.mark.parametrize("name", sorted(ISSUE_SHAPES))
def test_full_examples_have_issue_shapes(name: str, load_example: Any) -> None:
    g = load_example(name)
    shape, dtype = ISSUE_SHAPES[name]
    assert g.spec("x") == G.TensorSpec(tuple(shape), dtype)
    assert all(s.dtype == dtype for _, s in g.inputs)
    ops = [n.op for n in g.nodes]
    if name.startswith("softmax"):
        assert ops == ["reduce_max", "sub", "exp", "reduce_sum", "div"]
    if name == "bias_gelu":
        assert ops == ["add", "gelu_tanh"] and g.spec("b").shape == (4096,)
    if name == "colsum_sigmoid_scale":
        assert g.node("s").axes == (0,) and ops == ["reduce_sum", "sigmoid", "mul"]


def test_python_dict_with_odd_keys_is_reported_not_crashing() -> None:
    g = base()
    g["inputs"][3] = {"shape": [2], "dtype": "float32"}  # only possible from Python callers
    one(g, "inputs[3]", "input name must be a string")
