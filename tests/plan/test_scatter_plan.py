"""Planning regions with ``scatter_add`` (:mod:`stitchtune.plan.scatter`): the core graph and the
scatters a plan records, and the one-line refusals."""

from __future__ import annotations

from typing import Any

import pytest

from stitchtune.errors import UnsupportedGraphError
from stitchtune.graph.parse import parse_graph
from stitchtune.plan.planner import make_plan
from stitchtune.plan.refusal import Refusal
from stitchtune.plan.scatter import Scatter, core_graph, split_scatters


def _graph(dtype: str = "float32", read: bool = False) -> Any:
    nodes: list[dict[str, Any]] = [
        {"id": "v", "op": "mul", "args": ["dy", 2.0]},
        {"id": "dw", "op": "scatter_add", "args": ["v", "ids"], "shape": [10, 16]}]
    if read:
        nodes.append({"id": "z", "op": "mul", "args": ["dw", 3.0]})
    return parse_graph({"name": "t", "inputs": {"dy": {"shape": [2, 8, 16], "dtype": dtype},
                                                "ids": {"shape": [2, 8], "dtype": "int32"}},
                        "nodes": nodes, "outputs": ["z" if read else "dw"]})


def test_the_plan_is_the_core_graphs_and_lists_the_scatters() -> None:
    g = _graph()
    split = split_scatters(g)
    assert not isinstance(split, Refusal), split
    core, scatters = split
    assert scatters == (Scatter("dw", "v", "ids", 10, 16, "float32"),)
    assert core.outputs == ("v",) and [n for n, _ in core.inputs] == ["dy"]   # the index: only the scatter's
    plan = make_plan(g)
    assert plan.scatters == scatters and plan.M == 16 and plan.N == 16
    assert plan.planned_graph(g) == core == core_graph(core)


def test_a_graph_without_scatters_is_its_own_core() -> None:
    g = parse_graph({"name": "t", "inputs": {"x": {"shape": [4, 8], "dtype": "float32"}},
                     "nodes": [{"id": "y", "op": "exp", "args": ["x"]}], "outputs": ["y"]})
    assert split_scatters(g) == (g, ()) and make_plan(g).scatters == ()


def test_a_table_read_by_a_node_is_refused_in_one_line() -> None:
    with pytest.raises(UnsupportedGraphError) as e:
        make_plan(_graph(read=True))
    assert "scatter_add 'dw' is read by node 'z' (graph 't'); stitched kernels produce a scatter's table as an " \
           "output only" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_tables_are_planned(dtype: str) -> None:
    assert make_plan(_graph(dtype)).scatters[0].dtype == dtype
