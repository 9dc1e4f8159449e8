"""Integer values computed inside a graph: ``iota``, int arithmetic (wrapping at the dtype's width),
comparisons, ``where`` with int branches, casts to and from int, a bool ``reduce_sum`` as a count.
Validation (one named line per misuse) and the reference's exactness against Python integers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from stitchtune.errors import GraphError
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference

_BITS = {"int32": 32, "int64": 64}


def _wrap(v: int, dtype: str) -> int:
    """``v`` reduced to ``dtype``'s two's-complement range (what the int ops define)."""
    n = _BITS[dtype]
    return (v + 2 ** (n - 1)) % 2**n - 2 ** (n - 1)


def _graph(dtype: str, op: str, n: int) -> dict:
    return {"name": "t", "inputs": {"a": {"shape": [n], "dtype": dtype}, "b": {"shape": [n], "dtype": dtype}},
            "nodes": [{"id": "y", "op": op, "args": ["a", "b"]}], "outputs": ["y"]}


_PY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
       "maximum": max, "minimum": min}


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(["int32", "int64"]), op=st.sampled_from(sorted(_PY)), data=st.data())
def test_int_arithmetic_is_exact_and_wraps(dtype: str, op: str, data: st.DataObject) -> None:
    n = _BITS[dtype]
    ints = st.integers(-(2 ** (n - 1)), 2 ** (n - 1) - 1)
    a = data.draw(st.lists(ints, min_size=1, max_size=6))
    b = data.draw(st.lists(ints, min_size=len(a), max_size=len(a)))
    g = parse_graph(_graph(dtype, op, len(a)))
    assert g.spec("y").dtype == dtype
    y = run_reference(g, {"a": np.array(a, dtype), "b": np.array(b, dtype)})["y"]
    assert y.dtype == np.dtype(dtype)
    assert y.tolist() == [_wrap(_PY[op](x, z), dtype) for x, z in zip(a, b)]


@settings(max_examples=30, deadline=None)
@given(a=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=6), c=st.integers(-(2**53), 2**53))
def test_int64_compare_and_constants_are_exact_beyond_float(a: list[int], c: int) -> None:
    """Comparisons of int64 values that float64 cannot tell apart, and an exact int constant."""
    g = parse_graph({"name": "t", "inputs": {"a": {"shape": [len(a)], "dtype": "int64"}},
                     "nodes": [{"id": "s", "op": "add", "args": ["a", c]},
                               {"id": "lt", "op": "lt", "args": ["s", "a"]},
                               {"id": "y", "op": "cast", "args": ["lt"], "to": "float32"}],
                     "outputs": ["s", "y"]})
    out = run_reference(g, {"a": np.array(a, np.int64)})
    s = [_wrap(x + c, "int64") for x in a]
    assert out["s"].tolist() == s
    assert out["y"].tolist() == [1.0 if u < x else 0.0 for u, x in zip(s, a)]


def test_mixed_widths_promote_to_int64_and_where_keeps_ints() -> None:
    g = parse_graph({"name": "t", "inputs": {"a": {"shape": [3], "dtype": "int32"}, "b": {"shape": [3], "dtype": "int64"},
                                             "x": {"shape": [3], "dtype": "float32"}},
                     "nodes": [{"id": "s", "op": "add", "args": ["a", "b"]},
                               {"id": "ne", "op": "ne", "args": ["b", -100]},
                               {"id": "w", "op": "where", "args": ["ne", "b", 0]},
                               {"id": "f", "op": "where", "args": ["ne", "x", 0.0]}],
                     "outputs": ["s", "w", "f"]})
    assert [g.spec(n).dtype for n in ("s", "ne", "w", "f")] == ["int64", "bool", "int64", "float32"]
    b = np.array([2**40 + 1, -100, 7], np.int64)
    out = run_reference(g, {"a": np.array([1, 2, -3], np.int32), "b": b, "x": np.ones(3, np.float32)})
    assert out["s"].tolist() == [2**40 + 2, -98, 4]
    assert out["w"].tolist() == [2**40 + 1, 0, 7] and out["f"].tolist() == [1.0, 0.0, 1.0]


def test_iota_causal_mask_and_count() -> None:
    """A causal mask from two iotas (the Llama pattern) and a bool count."""
    g = parse_graph({"name": "t", "inputs": {"x": {"shape": [2, 4, 4], "dtype": "float32"}},
                     "nodes": [{"id": "r", "op": "iota", "args": [], "shape": [4, 1], "axis": 0},
                               {"id": "c", "op": "iota", "args": [], "shape": [4], "axis": 0, "dtype": "int32"},
                               {"id": "ok", "op": "le", "args": ["c", "r"]},
                               {"id": "y", "op": "where", "args": ["ok", "x", -np.inf]},
                               {"id": "n", "op": "reduce_sum", "args": ["ok"], "axes": [1]}],
                     "outputs": ["y", "n", "r"]})
    assert g.spec("r").dtype == "int64" and g.spec("c").dtype == "int32" and g.spec("n").dtype == "float32"
    x = random_inputs(g, 0)["x"]
    out = run_reference(g, {"x": x})
    want = np.where(np.tril(np.ones((4, 4), bool)), x, -np.inf).astype(np.float32)
    np.testing.assert_array_equal(out["y"], want)
    assert out["n"].tolist() == [1.0, 2.0, 3.0, 4.0] and out["r"].tolist() == [[0], [1], [2], [3]]
    assert parse_graph(g.to_dict()) == g


def test_casts_to_int() -> None:
    """float -> int truncates toward zero, NaN -> 0, beyond the range -> the nearest limit; int64 ->
    int32 keeps the low 32 bits; bool -> int is 0 / 1."""
    g = parse_graph({"name": "t", "inputs": {"x": {"shape": [7], "dtype": "float32"}, "m": {"shape": [7], "dtype": "int64"}},
                     "nodes": [{"id": "xi", "op": "cast", "args": ["x"], "to": "int32"},
                               {"id": "xl", "op": "cast", "args": ["x"], "to": "int64"},
                               {"id": "mi", "op": "cast", "args": ["m"], "to": "int32"},
                               {"id": "b", "op": "ne", "args": ["m", 0]},
                               {"id": "bi", "op": "cast", "args": ["b"], "to": "int64"}],
                     "outputs": ["xi", "xl", "mi", "bi"]})
    x = np.array([2.7, -2.7, np.nan, 3e9, -3e9, np.inf, 1e30], np.float32)
    m = np.array([2**32 + 5, -1, 2**31, 0, 7, -(2**63), 2**63 - 1], np.int64)
    out = run_reference(g, {"x": x, "m": m})
    assert out["xi"].tolist() == [2, -2, 0, 2**31 - 1, -(2**31), 2**31 - 1, 2**31 - 1]
    assert out["xl"].tolist() == [2, -2, 0, 3000000000, -3000000000, 2**63 - 1, 2**63 - 1]
    assert out["mi"].tolist() == [5, -1, -(2**31), 0, 7, 0, -1]
    assert out["bi"].tolist() == [1, 1, 1, 0, 1, 1, 1]


@pytest.mark.parametrize("nodes, want", [
    ([{"id": "c", "op": "lt", "args": ["m", 0]}, {"id": "y", "op": "where", "args": ["c", "m", "x"]}],
     "nodes[1].args: where cannot mix int and non-int tensors: 'm' (int64), 'x' (float32)"),
    ([{"id": "y", "op": "where", "args": ["b", "m", 0.5]}], "nodes[0].args[2]: where on int tensors needs an integer constant"),
    ([{"id": "y", "op": "reduce_sum", "args": ["m"], "axes": [0]}], "nodes[0].args[0]: reduce_sum cannot take 'm' (int64)"),
    ([{"id": "y", "op": "reduce_sum", "args": ["big"], "axes": [0]}],
     "nodes[0].axes: a reduce_sum of a bool tensor counts in float32, exact up to 2**24 elements"),
])
def test_int_misuse_names_the_node(nodes: list[dict], want: str) -> None:
    ins = {"x": {"shape": [4], "dtype": "float32"}, "m": {"shape": [4], "dtype": "int64"},
           "b": {"shape": [4], "dtype": "bool"}, "big": {"shape": [2**24 + 1], "dtype": "bool"}}
    with pytest.raises(GraphError) as e:
        parse_graph({"name": "t", "inputs": ins, "nodes": nodes, "outputs": ["y"]})
    assert any(p.startswith(want) for p in e.value.problems), e.value.problems
