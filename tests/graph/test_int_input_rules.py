"""Int graph inputs beyond gather indices: ``cast`` of an int32/int64 input to bool or a float dtype,
and the index maps (transpose, reshape, slice, concat) of one. Validation (one named line per
misuse), result dtypes, and the float64 reference's values (exact bools at any value, float casts
through float32)."""

from __future__ import annotations

import numpy as np
import pytest

from stitchtune.errors import GraphError
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import bfloat16_dtype, run_reference

INS = {"x": {"shape": [2, 4], "dtype": "float32"}, "m": {"shape": [2, 4], "dtype": "int64"},
       "k": {"shape": [2, 4], "dtype": "int32"}, "t": {"shape": [10, 4], "dtype": "float32"}}


def _g(nodes: list[dict], outputs: tuple[str, ...] = ("y",)) -> dict:
    return {"name": "t", "inputs": INS, "nodes": nodes, "outputs": list(outputs)}


def _problems(d: dict) -> list[str]:
    with pytest.raises(GraphError) as e:
        parse_graph(d)
    return e.value.problems


def test_int_inputs_cast_and_index_maps_are_accepted() -> None:
    g = parse_graph(_g([
        {"id": "r", "op": "reshape", "args": ["m"], "shape": [2, 1, 4]},
        {"id": "tr", "op": "transpose", "args": ["r"], "perm": [1, 0, 2]},
        {"id": "s", "op": "slice", "args": ["tr"], "axis": 2, "start": 0, "stop": 2},
        {"id": "c", "op": "concat", "args": ["s", "s"], "axis": 2},
        {"id": "b", "op": "cast", "args": ["c"], "to": "bool"},
        {"id": "f", "op": "cast", "args": ["k"], "to": "float16"},
        {"id": "w", "op": "where", "args": ["b", "f", -1.0]},
        {"id": "y", "op": "add", "args": ["w", "x"]}]))
    assert [g.spec(n).dtype for n in ("r", "tr", "s", "c", "b", "f")] == \
        ["int64", "int64", "int64", "int64", "bool", "float16"]
    assert g.spec("y").dtype == "float32" and g.spec("y").shape == (1, 2, 4)
    assert parse_graph(g.to_dict()) == g


@pytest.mark.parametrize("node, want", [
    ({"id": "y", "op": "add", "args": ["x", "m"]},
     "nodes[0].args: add cannot mix int and non-int tensors: 'x' (float32), 'm' (int64); cast one of them first"),
    ({"id": "y", "op": "add", "args": ["m", 0.5]}, "nodes[0].args[1]: add on int tensors needs an integer constant"),
    ({"id": "y", "op": "mul", "args": ["k", 2.0**31]}, "nodes[0].args[1]: constant 2147483648 is outside the range of int32"),
    ({"id": "y", "op": "div", "args": ["m", 2.0]}, "nodes[0].args[0]: div cannot take 'm' (int64): an int tensor is read "
                                                   "by the int ops"),
    ({"id": "y", "op": "iota", "args": [], "shape": [4], "axis": 1}, "nodes[0].axis: must be an integer in [-1, 1)"),
    ({"id": "y", "op": "iota", "args": ["m"], "shape": [4], "axis": 0}, "nodes[0].args: iota takes no arguments"),
    ({"id": "y", "op": "iota", "args": [], "shape": [4], "axis": 0, "dtype": "float32"},
     "nodes[0].dtype: iota's dtype must be int32 or int64"),
    ({"id": "y", "op": "iota", "args": [], "axis": 0}, "nodes[0].shape: missing: iota needs a shape"),
    ({"id": "y", "op": "add", "args": ["m", 1], "dtype": "int32"}, "nodes[0].dtype: only iota takes 'dtype'; add does not"),
    ({"id": "y", "op": "where", "args": ["m", "x", 0.0]}, "nodes[0].args[0]: where cannot take 'm' (int64)"),
    ({"id": "y", "op": "logical_not", "args": ["k"]}, "logical_not cannot take 'k' (int32)"),
    ({"id": "y", "op": "reduce_sum", "args": ["m"], "axes": [1]}, "reduce_sum cannot take 'm' (int64)"),
    ({"id": "y", "op": "exp", "args": ["m"]}, "nodes[0].args[0]: exp cannot take 'm' (int64)"),
    ({"id": "y", "op": "concat", "args": ["m", "k"], "axis": 1},
     "concat needs all float, all bool or all int tensors of one int dtype, got int64, int32"),
    ({"id": "y", "op": "concat", "args": ["m", "x"], "axis": 1}, "got int64, float32"),
])
def test_int_misuse_is_one_named_line(node: dict, want: str) -> None:
    probs = _problems(_g([node]))
    assert len(probs) == 1 and want in probs[0], probs


def test_computed_gather_indices_are_refused() -> None:
    probs = _problems(_g([{"id": "r", "op": "reshape", "args": ["k"], "shape": [8]},
                          {"id": "y", "op": "gather", "args": ["t", "r"], "axis": 0}]))
    assert probs == ["nodes[1].args[1]: gather needs an int32/int64 graph input as its index; 'r' is computed "
                     "(index with the input it is a view of)"]


def test_a_computed_gather_elements_index_is_accepted() -> None:
    """A pick's index may be computed (cross entropy's ``where(t != ignore, t, 0)``); the reference
    gathers by its values (out-of-range ones give 0.0)."""
    d = _g([{"id": "v", "op": "ne", "args": ["m", -1]}, {"id": "c", "op": "where", "args": ["v", "m", 0]},
            {"id": "y", "op": "gather_elements", "args": ["x", "c"], "axis": 1}])
    m = np.array([[0, -1, 3, 5], [2, 2, -1, 1]])
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y = run_reference(parse_graph(d), {"x": x, "m": m, "k": m.astype(np.int32), "t": np.zeros((10, 4), np.float32)})["y"]
    assert y.tolist() == [[0.0, 0.0, 3.0, 0.0], [6.0, 6.0, 4.0, 5.0]]


def _cast_all(to: str) -> tuple[object, dict[str, np.ndarray]]:
    g = parse_graph(_g([{"id": "r", "op": "transpose", "args": ["m"], "perm": [1, 0]},
                        {"id": "b", "op": "cast", "args": ["r"], "to": to},
                        {"id": "y", "op": "cast", "args": ["b"], "to": "float32"}]))
    m = np.array([[0, 1, -1, 2**33], [2**40 + 3, -(2**62), 2**24 + 1, 2**25 + 2**17 + 1]], np.int64)
    x = {"x": np.ones((2, 4), np.float32), "m": m, "k": np.zeros((2, 4), np.int32), "t": np.zeros((10, 4), np.float32)}
    return g, x


def test_reference_bool_cast_is_exact_beyond_int32() -> None:
    g, x = _cast_all("bool")
    y = run_reference(g, x)["y"]
    np.testing.assert_array_equal(y, (x["m"] != 0).T.astype(np.float32))  # 2**33 has zero low 32 bits: still true


def test_reference_float_casts_go_through_float32() -> None:
    g, x = _cast_all("float32")
    np.testing.assert_array_equal(run_reference(g, x)["y"], x["m"].T.astype(np.float32))
    assert run_reference(g, x)["y"][2, 1] == 2.0**24  # the nearest float32 (ties to even)
    g, x = _cast_all("bfloat16")
    y = run_reference(g, x)["y"]
    # documented double rounding: 2**25 + 2**17 + 1 -> float32 2**25 + 2**17 -> bfloat16 (tie, even) 2**25
    assert y[3, 1] == 2.0**25
    np.testing.assert_array_equal(y, x["m"].T.astype(np.float32).astype(bfloat16_dtype()).astype(np.float32))
