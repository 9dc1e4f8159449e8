"""Comparisons, logical ops, where, clamp and the bool dtype in graph.json: validation (one line per
problem, naming the node's JSON path and the offending argument), dtype rules and the reference's
semantics (IEEE comparisons, NaN propagation of clamp, -inf through where)."""

from __future__ import annotations

import numpy as np
import pytest

from stitchtune.errors import GraphError
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference

NAN, INF = float("nan"), float("inf")


def _g(nodes: list[dict], outputs: list[str] | None = None, dtypes: dict[str, str] | None = None) -> dict:
    dt = {"x": "float32", "y": "float32", "m": "bool", **(dtypes or {})}
    return {"name": "g", "inputs": {"x": {"shape": [2, 4], "dtype": dt["x"]}, "y": {"shape": [2, 4], "dtype": dt["y"]},
                                    "m": {"shape": [1, 4], "dtype": dt["m"]}},
            "nodes": nodes, "outputs": outputs or [nodes[-1]["id"]]}


def _problems(obj: dict) -> list[str]:
    with pytest.raises(GraphError) as ei:
        parse_graph(obj)
    return ei.value.problems


def _run(nodes: list[dict], x, y, m) -> np.ndarray:
    g = parse_graph(_g(nodes))
    ins = {"x": np.array(x, np.float32).reshape(2, 4), "y": np.array(y, np.float32).reshape(2, 4),
           "m": np.array(m, bool).reshape(1, 4)}
    return run_reference(g, ins)[g.outputs[0]]


X = [NAN, INF, -INF, 0.0, 1.0, -1.0, 2.0, NAN]
Y = [1.0, INF, 0.0, -0.0, 1.0, 3.0, NAN, NAN]
M = [True, False, True, False]


@pytest.mark.parametrize("op,fn", [("lt", np.less), ("le", np.less_equal), ("gt", np.greater),
                                   ("ge", np.greater_equal), ("eq", np.equal), ("ne", np.not_equal)])
def test_comparisons_are_ieee(op: str, fn) -> None:
    out = _run([{"id": "c", "op": op, "args": ["x", "y"]}, {"id": "o", "op": "cast", "args": ["c"], "to": "float32"}],
               X, Y, M)
    want = fn(np.array(X), np.array(Y)).astype(np.float32).reshape(2, 4)
    np.testing.assert_array_equal(out, want)
    nan_pairs = np.isnan(np.array(X)) | np.isnan(np.array(Y))
    assert np.all(out.ravel()[nan_pairs] == (1.0 if op == "ne" else 0.0))  # NaN compares false, except ne


def test_logical_ops_where_and_masks_broadcast() -> None:
    nodes = [{"id": "p", "op": "gt", "args": ["x", 0.5]}, {"id": "a", "op": "logical_and", "args": ["p", "m"]},
             {"id": "q", "op": "lt", "args": ["x", -0.5]},
             {"id": "r", "op": "logical_or", "args": ["a", "q"]}, {"id": "n", "op": "logical_not", "args": ["r"]},
             {"id": "o", "op": "where", "args": ["n", "x", -INF]}]
    out = _run(nodes, X, Y, M)
    xa = np.array(X, np.float32).reshape(2, 4)
    keep = ~((xa > 0.5) & np.array(M).reshape(1, 4) | (xa < -0.5))
    np.testing.assert_array_equal(out, np.where(keep, xa, -np.inf).astype(np.float32))
    assert out.dtype == np.float32 and np.all(np.isneginf(out[~keep])) and (~keep).sum() == 4


def test_clamp_propagates_nan_and_lo_above_hi_gives_hi() -> None:
    out = _run([{"id": "o", "op": "clamp", "args": ["x", -0.5, "y"]}], X, Y, M).ravel()
    want = np.minimum(np.maximum(np.array(X), -0.5), np.array(Y))
    np.testing.assert_array_equal(out, want.astype(np.float32))
    assert np.isnan(out[0]) and np.isnan(out[6]) and np.isnan(out[7]) and out[5] == -0.5 and out[1] == INF
    lohi = _run([{"id": "o", "op": "clamp", "args": ["x", 1.0, -1.0]}], X, Y, M).ravel()
    assert np.isnan(lohi[0]) and np.all(lohi[1:7] == -1.0)


def test_cast_to_and_from_bool() -> None:
    nodes = [{"id": "b", "op": "cast", "args": ["x"], "to": "bool"}, {"id": "o", "op": "cast", "args": ["b"], "to": "float32"}]
    out = _run(nodes, X, Y, M).ravel()
    np.testing.assert_array_equal(out, [1, 1, 1, 0, 1, 1, 1, 1])  # NaN is true, 0 is false
    m = _run([{"id": "o", "op": "cast", "args": ["m"], "to": "float16"}], X, Y, M)
    assert m.dtype == np.float16 and m.ravel().tolist() == [1, 0, 1, 0]


def test_dtype_rules() -> None:
    g = parse_graph(_g([{"id": "c", "op": "lt", "args": ["x", "y"]},
                        {"id": "w", "op": "where", "args": ["c", "x", "y"]},
                        {"id": "k", "op": "where", "args": ["m", 1.0, 0.0]},
                        {"id": "h", "op": "clamp", "args": ["y", 0.0, 1.0]},
                        {"id": "o", "op": "add", "args": ["w", "k"]}], ["o", "h"], {"x": "float16", "y": "bfloat16"}))
    d = {n.id: (n.dtype, n.shape) for n in g.nodes}
    assert d["c"] == ("bool", (2, 4))
    assert d["w"] == ("float32", (2, 4))   # float16 + bfloat16 promote as binary ops do
    assert d["k"] == ("float32", (1, 4))   # constants only: float32; shape from the mask
    assert d["h"] == ("bfloat16", (2, 4))
    assert parse_graph(g.to_dict()) == g


@pytest.mark.parametrize("node,want", [
    ({"id": "o", "op": "where", "args": ["m", "x"]}, "nodes[0].args: wrong arity: where takes 3 argument(s), got 2"),
    ({"id": "o", "op": "clamp", "args": ["x"]}, "nodes[0].args: wrong arity: clamp takes 3 argument(s), got 1"),
    ({"id": "o", "op": "lt", "args": ["x", "y", "x"]}, "nodes[0].args: wrong arity: lt takes 2 argument(s), got 3"),
    ({"id": "o", "op": "where", "args": ["x", "x", 0.0]}, "nodes[0].args[0]: where needs a bool tensor here; 'x' is float32"),
    ({"id": "o", "op": "where", "args": [1.0, "x", 0.0]}, "nodes[0].args[0]: where needs a bool tensor, not a constant"),
    ({"id": "o", "op": "where", "args": ["m", "m", 0.0]},
     "nodes[0].args[1]: where needs a float or int tensor here; 'm' is bool (cast it to a float or int dtype first)"),
    ({"id": "o", "op": "add", "args": ["x", "m"]},
     "nodes[0].args[1]: add needs a float or int tensor here; 'm' is bool (cast it to a float or int dtype first)"),
    ({"id": "o", "op": "reduce_mean", "args": ["m"], "axes": [1]},
     "nodes[0].args[0]: reduce_mean needs a float tensor here; 'm' is bool (cast it to a float dtype first)"),
    ({"id": "o", "op": "logical_and", "args": ["m", "x"]}, "nodes[0].args[1]: logical_and needs a bool tensor here; 'x' is float32"),
    ({"id": "o", "op": "logical_not", "args": [0.0]}, "nodes[0].args[0]: logical_not needs a bool tensor, not a constant"),
    ({"id": "o", "op": "lt", "args": ["m", 0.5]},
     "nodes[0].args[0]: lt needs a float or int tensor here; 'm' is bool (cast it to a float or int dtype first)"),
    ({"id": "o", "op": "clamp", "args": ["x", "m", 1.0]},
     "nodes[0].args[1]: clamp needs a float tensor here; 'm' is bool (cast it to a float dtype first)"),
])
def test_wrong_arity_and_types_are_one_line_naming_the_node(node: dict, want: str) -> None:
    assert _problems(_g([node], ["o"])) == [want]


def test_bool_outputs_are_numpy_bools_of_their_mask() -> None:
    """A comparison, a cast to bool (NaN is true) and a bool input may be outputs: numpy bools."""
    g = parse_graph({**_g([{"id": "o", "op": "gt", "args": ["x", "y"]},
                           {"id": "c", "op": "cast", "args": ["x"], "to": "bool"}]), "outputs": ["o", "c", "m"]})
    assert [g.spec(o).dtype for o in g.outputs] == ["bool", "bool", "bool"]
    x = np.array([[1, 0, np.nan, -2], [3, 0, 1, 1]], np.float32)
    y = np.array([[0, 0, 1, -3], [4, -1, np.nan, 1]], np.float32)
    m = np.array([[True, False, True, False]])
    out = run_reference(g, {"x": x, "y": y, "m": m})
    assert all(v.dtype == np.bool_ for v in out.values())
    assert out["o"].tolist() == [[True, False, False, True], [False, True, False, False]]
    assert out["c"].tolist() == [[True, False, True, True], [True, False, True, True]]
    assert np.array_equal(out["m"], m)


def test_bool_inputs_are_drawn_as_numpy_bools() -> None:
    g = parse_graph(_g([{"id": "o", "op": "where", "args": ["m", "x", "y"]}]))
    a, b = random_inputs(g, 5), random_inputs(g, 5)
    assert a["m"].dtype == np.bool_ and a["m"].shape == (1, 4)
    assert np.array_equal(a["m"], b["m"])
    big = parse_graph({**_g([{"id": "o", "op": "where", "args": ["m", "x", "y"]}]),
                       "inputs": {"x": {"shape": [4096], "dtype": "float32"}, "y": {"shape": [4096], "dtype": "float32"},
                                  "m": {"shape": [4096], "dtype": "bool"}}})
    assert 0.7 < random_inputs(big, 1)["m"].mean() < 0.8
