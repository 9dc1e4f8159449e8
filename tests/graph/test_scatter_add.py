"""``scatter_add`` in graph.json: parse, one-line errors, the numpy reference (out-of-range indices add
nothing), the workload key and the JSON round trip."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from stitchtune.errors import GraphError
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference


def _graph(rows: int = 10, v_shape: list[int] | None = None, ids_dtype: str = "int64",
           extra: dict[str, Any] | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {"id": "dw", "op": "scatter_add", "args": ["v", "ids"], "shape": [rows, 16]}
    node.update(extra or {})
    return {"name": "emb_bwd",
            "inputs": {"dy": {"shape": v_shape or [2, 8, 16], "dtype": "float32"},
                       "ids": {"shape": [2, 8], "dtype": ids_dtype}},
            "nodes": [{"id": "v", "op": "mul", "args": ["dy", 2.0]}, node],
            "outputs": ["dw"]}


def _error(obj: dict[str, Any]) -> str:
    with pytest.raises(GraphError) as e:
        parse_graph(obj)
    return str(e.value)


def test_parse_infers_the_table_spec_and_round_trips() -> None:
    g = parse_graph(_graph())
    node = g.nodes[-1]
    assert (node.shape, node.dtype) == ((10, 16), "float32")
    assert parse_graph(g.to_dict()) == g
    assert g.to_dict()["nodes"][-1]["shape"] == [10, 16]


def test_the_workload_key_follows_the_table_rows() -> None:
    assert parse_graph(_graph(10)).workload_key() != parse_graph(_graph(11)).workload_key()


@pytest.mark.parametrize("change,where,words", [
    ({"shape": [10, 15]}, "nodes[1].args[0]", "values of shape index shape + table shape[1:] = [2, 8, 15]"),
    ({"shape": "x"}, "nodes[1].shape", "shape must be a list"),
    ({"shape": [10, 0]}, "nodes[1].shape", ""),
    ({"axis": 0}, "nodes[1].axis", "scatter_add does not"),
])
def test_bad_attributes_are_one_line_errors(change: dict[str, Any], where: str, words: str) -> None:
    msg = _error(_graph(extra=change))
    line = next(x for x in msg.splitlines() if x.startswith(where))
    assert words in line


def test_missing_shape_is_named() -> None:
    obj = _graph()
    del obj["nodes"][1]["shape"]
    assert "nodes[1].shape: missing: scatter_add needs the table's shape" in _error(obj)


def test_float_index_and_int_values_are_refused() -> None:
    assert "nodes[1].args[1]: scatter_add needs an int32/int64 graph input as its index, 'ids' is float32" \
        in _error(_graph(ids_dtype="float32"))
    obj = _graph()
    obj["nodes"][1]["args"] = ["ids2", "ids"]
    obj["inputs"]["ids2"] = {"shape": [2, 8, 16], "dtype": "int32"}
    assert "nodes[1].args[0]: scatter_add cannot take 'ids2' (int32)" in _error(obj)


def test_a_computed_index_is_refused() -> None:
    obj = _graph()
    obj["nodes"].insert(1, {"id": "j", "op": "add", "args": ["ids", 1]})
    obj["nodes"][2]["args"] = ["v", "j"]
    assert "scatter_add needs an int32/int64 graph input as its index; 'j' is computed" in _error(obj)


def test_values_of_another_shape_are_refused() -> None:
    msg = _error(_graph(v_shape=[2, 7, 16]))
    assert "index 'ids' [2, 8], table [10, 16]" in msg and "'v' is [2, 7, 16]" in msg


def test_reference_adds_rows_and_skips_out_of_range_indices() -> None:
    g = parse_graph(_graph(rows=5))
    x = random_inputs(g, 0)
    assert x["ids"].min() >= 0 and x["ids"].max() < 5   # random indices are valid rows
    x["ids"] = np.array([[0, 0, 4, -1, 5, 2**40, 3, 0], [1, 1, 1, 2, 2, 3, 4, -7]], np.int64)
    dw = run_reference(g, x)["dw"]
    v = 2.0 * x["dy"].astype(np.float64)
    want = np.zeros((5, 16))
    for (b, s), i in np.ndenumerate(x["ids"]):
        if 0 <= i < 5:
            want[i] += v[b, s]
    assert dw.dtype == np.float32 and np.allclose(dw, want, rtol=1e-6, atol=1e-6)
    assert not np.allclose(want[0], 0.0)   # repeated rows accumulate (three adds into row 0)


def test_reference_of_a_table_no_index_names_is_zero() -> None:
    obj = copy.deepcopy(_graph(rows=3))
    g = parse_graph(obj)
    x = random_inputs(g, 1)
    x["ids"][:] = 7
    assert not run_reference(g, x)["dw"].any()
