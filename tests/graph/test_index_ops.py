"""The index ops (slice, concat, gather) and int inputs in graph.json: validation (one named line per
problem), normalisation, the graph.json round trip and keys, and the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

from stitchtune.errors import GraphError
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference


def _g(nodes: list[dict], inputs: dict | None = None, outputs: tuple[str, ...] = ("y",)) -> dict:
    ins = inputs or {"x": {"shape": [2, 3, 8], "dtype": "float32"}}
    return {"name": "t", "inputs": ins, "nodes": nodes, "outputs": list(outputs)}


def _problems(d: dict) -> list[str]:
    with pytest.raises(GraphError) as e:
        parse_graph(d)
    return e.value.problems


EMB = {"ids": {"shape": [2, 3], "dtype": "int32"}, "t": {"shape": [10, 4], "dtype": "float32"}}


def test_slice_is_normalised_like_python() -> None:
    g = parse_graph(_g([{"id": "y", "op": "slice", "args": ["x"], "axis": -1, "start": -6, "stop": -2}]))
    nd = g.node("y")
    assert (nd.axis, nd.start, nd.stop, nd.shape) == (2, 2, 6, (2, 3, 4))
    assert parse_graph(g.to_dict()) == g


@pytest.mark.parametrize("start, stop", [(3, 3), (5, 2), (0, 9), (-9, 2), (8, 9)])
def test_empty_or_out_of_range_slice_is_one_named_line(start: int, stop: int) -> None:
    probs = _problems(_g([{"id": "y", "op": "slice", "args": ["x"], "axis": 2, "start": start, "stop": stop}]))
    assert len(probs) == 1 and probs[0].startswith("nodes[0]: slice") and "empty or out of range" in probs[0]


def test_slice_attribute_problems() -> None:
    probs = _problems(_g([{"id": "y", "op": "slice", "args": ["x"], "axis": 3, "start": 0}]))
    assert any("nodes[0].stop: missing" in p for p in probs)
    assert any("nodes[0].axis: axis 3 out of range" in p for p in probs)
    probs = _problems(_g([{"id": "y", "op": "neg", "args": ["x"], "axis": 0}]))
    assert probs == ["nodes[0].axis: only slice, concat, gather and gather_elements take 'axis'; neg does not"]
    probs = _problems(_g([{"id": "y", "op": "slice", "args": ["x"], "axis": 0, "start": 0.5, "stop": 1}]))
    assert any("nodes[0].start: must be an integer" in p for p in probs)


def test_concat_shapes_and_refusals() -> None:
    ins = {"a": {"shape": [2, 3], "dtype": "float32"}, "b": {"shape": [2, 5], "dtype": "float16"},
           "c": {"shape": [3, 5], "dtype": "float32"}, "m": {"shape": [2, 5], "dtype": "bool"}}
    g = parse_graph(_g([{"id": "y", "op": "concat", "args": ["a", "b", "a"], "axis": -1}], ins))
    assert g.node("y").shape == (2, 11) and g.node("y").dtype == "float32" and g.node("y").axis == 1
    assert "concat does not broadcast" in _problems(_g([{"id": "y", "op": "concat", "args": ["a", "c"], "axis": 1}], ins))[0]
    assert "2 to 8 arguments" in _problems(_g([{"id": "y", "op": "concat", "args": ["a"], "axis": 1}], ins))[0]
    assert "all float, all bool" in _problems(_g([{"id": "y", "op": "concat", "args": ["b", "m"], "axis": 0}], ins))[0]
    assert "not a constant" in _problems(_g([{"id": "y", "op": "concat", "args": ["a", 1.0], "axis": 1}], ins))[0]


def test_gather_shape_and_refusals() -> None:
    g = parse_graph(_g([{"id": "y", "op": "gather", "args": ["t", "ids"], "axis": 0}], EMB))
    assert g.node("y").shape == (2, 3, 4) and g.node("y").dtype == "float32"
    assert "axis 0 only" in _problems(_g([{"id": "y", "op": "gather", "args": ["t", "ids"], "axis": 1}], EMB))[0]
    probs = _problems(_g([{"id": "y", "op": "gather", "args": ["t", "t"], "axis": 0}], EMB))
    assert probs == ["nodes[0].args[1]: gather needs an int32/int64 graph input as its index, 't' is float32"]


@pytest.mark.parametrize("node, want", [
    ({"id": "y", "op": "add", "args": ["t", "ids"]}, "nodes[0].args: add cannot mix int and non-int tensors: "
                                                      "'t' (float32), 'ids' (int32)"),
    ({"id": "y", "op": "exp", "args": ["ids"]}, "nodes[0].args[0]: exp cannot take 'ids' (int32)"),
])
def test_int_tensors_are_not_float_operands(node: dict, want: str) -> None:  # int ops: tests/graph/test_int_ops.py
    assert any(want in p for p in _problems(_g([node], EMB)))


def test_int_output_is_accepted() -> None:
    d = _g([{"id": "y", "op": "gather", "args": ["t", "ids"], "axis": 0}], EMB, outputs=("y", "ids"))
    assert parse_graph(d).spec("ids").dtype == "int32"


def test_keys_see_the_attributes() -> None:
    a = parse_graph(_g([{"id": "y", "op": "slice", "args": ["x"], "axis": 2, "start": 0, "stop": 4}]))
    b = parse_graph(_g([{"id": "y", "op": "slice", "args": ["x"], "axis": 2, "start": 4, "stop": 8}]))
    assert a.workload_key() != b.workload_key() and a.structure_key() != b.structure_key()


def test_reference_values() -> None:
    ins = {"q": {"shape": [2, 6], "dtype": "float32"}, **EMB}
    g = parse_graph(_g([
        {"id": "h", "op": "slice", "args": ["q"], "axis": 1, "start": 3, "stop": 6},
        {"id": "l", "op": "slice", "args": ["q"], "axis": 1, "start": 0, "stop": 3},
        {"id": "r", "op": "concat", "args": ["h", "l"], "axis": 1},
        {"id": "e", "op": "gather", "args": ["t", "ids"], "axis": 0}], ins, outputs=("r", "e")))
    x = random_inputs(g, 0)
    assert x["ids"].dtype == np.int32 and ((x["ids"] >= 0) & (x["ids"] < 10)).all()
    x["ids"][0, :] = [-1, 10, 2**31 - 1]
    out = run_reference(g, x)
    np.testing.assert_array_equal(out["r"], np.roll(x["q"], 3, axis=1))
    assert (out["e"][0] == 0).all()
    np.testing.assert_array_equal(out["e"][1], x["t"][x["ids"][1]])


def test_a_null_stop_is_the_axis_end() -> None:
    """``"stop": null`` is Python's ``x[1:]`` (issue 41: a slice to the end of a dynamic axis at every
    extent); resolved to the dim, so the node and its round trip are a plain slice."""
    g = parse_graph(_g([{"id": "y", "op": "slice", "args": ["x"], "axis": 2, "start": 2, "stop": None}]))
    nd = g.node("y")
    assert (nd.start, nd.stop, nd.shape) == (2, 8, (2, 3, 6))
    assert parse_graph(g.to_dict()) == g
    probs = _problems(_g([{"id": "y", "op": "slice", "args": ["x"], "axis": 2, "start": 8, "stop": None}]))
    assert len(probs) == 1 and "empty or out of range" in probs[0]
