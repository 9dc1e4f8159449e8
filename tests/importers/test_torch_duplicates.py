"""``duplicate_outputs`` (issue 39: no region writes the same values twice): an output that is another
output's value moved by reshapes / transposes / same-dtype casts is listed, with whether it keeps the
layout; a copy of an input, an expand and a computed value are not."""

from __future__ import annotations

from typing import Any

from stitchtune.graph.parse import parse_graph
from stitchtune.importers.torch_duplicates import Duplicate, duplicate_outputs

INS = {"x": {"shape": [4, 8], "dtype": "float32"}, "c": {"shape": [1, 8], "dtype": "float32"}}


def _g(nodes: list[dict[str, Any]], outputs: list[str]) -> Any:
    return parse_graph({"name": "dup", "inputs": INS, "nodes": nodes, "outputs": outputs})


Y = {"id": "y", "op": "mul", "args": ["x", "c"]}


def test_a_reshape_of_another_output_is_the_same_values_in_the_same_layout() -> None:
    g = _g([Y, {"id": "v", "op": "reshape", "args": ["y"], "shape": [32]},
            {"id": "w", "op": "cast", "args": ["v"], "to": "float32"}], ["y", "w"])
    assert duplicate_outputs(g) == (Duplicate("w", "y", ("reshape", "cast")),)
    assert duplicate_outputs(g)[0].same_layout


def test_a_transposed_copy_is_listed_in_another_layout() -> None:
    g = _g([Y, {"id": "t", "op": "transpose", "args": ["y"], "perm": [1, 0]}], ["y", "t"])
    (d,) = duplicate_outputs(g)
    assert (d.output, d.same, d.how, d.same_layout) == ("t", "y", ("transpose",), False)


def test_copies_of_inputs_expands_and_computed_values_are_not_duplicates() -> None:
    g = _g([Y, {"id": "t", "op": "transpose", "args": ["x"], "perm": [1, 0]},
            {"id": "e", "op": "expand", "args": ["c"], "shape": [4, 8]},
            {"id": "z", "op": "add", "args": ["y", "c"]},
            {"id": "h", "op": "cast", "args": ["y"], "to": "float16"},
            {"id": "r", "op": "reshape", "args": ["y"], "shape": [1, 4, 8]},
            {"id": "b", "op": "expand", "args": ["r"], "shape": [2, 4, 8]}], ["y", "t", "e", "z", "h", "b"])
    assert duplicate_outputs(g) == ()   # (b: y broadcast, twice its elements: a new tensor, not y again)
