"""``transpose`` and ``reshape`` in graph.json: validation (one clear problem per mistake), the
round trip through ``to_dict``, numpy semantics in the reference, and workload keys that see the
permutation (while the keys of graphs without these ops are those of before)."""

from __future__ import annotations

import numpy as np
import pytest

from stitchtune.errors import GraphError
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference


def _obj(nodes: list[dict], shape: list[int] | None = None) -> dict:
    return {"name": "t", "inputs": {"x": {"shape": shape or [2, 3, 4], "dtype": "float32"}},
            "nodes": nodes, "outputs": [nodes[-1]["id"]]}


def test_transpose_and_reshape_follow_numpy_and_round_trip() -> None:
    g = parse_graph(_obj([{"id": "t", "op": "transpose", "args": ["x"], "perm": [2, 0, 1]},
                          {"id": "r", "op": "reshape", "args": ["t"], "shape": [4, 6]},
                          {"id": "y", "op": "mul", "args": ["r", 2.0]}]))
    assert g.node("t").shape == (4, 2, 3) and g.node("t").perm == (2, 0, 1)
    assert g.node("r").shape == (4, 6) and g.node("r").perm == ()
    assert parse_graph(g.to_dict()) == g
    assert g.to_dict()["nodes"][0]["perm"] == [2, 0, 1] and g.to_dict()["nodes"][1]["shape"] == [4, 6]
    ins = random_inputs(g, 1)
    want = np.transpose(ins["x"].astype(np.float64), (2, 0, 1)).reshape(4, 6) * 2
    np.testing.assert_allclose(run_reference(g, ins)["y"], want.astype(np.float32))


def test_the_permutation_is_part_of_the_workload_key() -> None:
    a = parse_graph(_obj([{"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 2, 1]},
                          {"id": "y", "op": "exp", "args": ["t"]}], [2, 4, 4]))
    b = parse_graph(_obj([{"id": "t", "op": "transpose", "args": ["x"], "perm": [1, 0, 2]},
                          {"id": "y", "op": "exp", "args": ["t"]}], [4, 4, 2]))
    c = parse_graph(_obj([{"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 1, 2]},
                          {"id": "y", "op": "exp", "args": ["t"]}], [2, 4, 4]))
    assert len({a.workload_key(), b.workload_key(), c.workload_key()}) == 3


@pytest.mark.parametrize("node,problem", [
    ({"id": "t", "op": "transpose", "args": ["x"]}, "nodes[0].perm: missing: transpose needs a permutation"),
    ({"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 1]}, "nodes[0].perm: must be a permutation of 0..2"),
    ({"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 1, 1]}, "nodes[0].perm: must be a permutation"),
    ({"id": "t", "op": "transpose", "args": ["x"], "perm": "012"}, "nodes[0].perm: must be a permutation"),
    ({"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 1, 2.0]}, "nodes[0].perm: must be a permutation"),
    ({"id": "t", "op": "reshape", "args": ["x"]}, "nodes[0].shape: missing: reshape needs a target shape"),
    ({"id": "t", "op": "reshape", "args": ["x"], "shape": [5, 5]}, "nodes[0].shape: reshape to [5, 5] (25 elements)"),
    ({"id": "t", "op": "reshape", "args": ["x"], "shape": [24, 0]}, "nodes[0].shape[1]: dimension must be positive"),
    ({"id": "t", "op": "exp", "args": ["x"], "perm": [0, 1, 2]}, "nodes[0].perm: only transpose takes 'perm'"),
    ({"id": "t", "op": "exp", "args": ["x"], "shape": [24]}, "nodes[0].shape: only reshape, expand, iota and scatter_add take 'shape'"),
])
def test_bad_layout_nodes_are_one_clear_problem(node: dict, problem: str) -> None:
    with pytest.raises(GraphError) as e:
        parse_graph(_obj([node]))
    assert any(p.startswith(problem) for p in e.value.problems), e.value.problems
    assert all("\n" not in p for p in e.value.problems)
