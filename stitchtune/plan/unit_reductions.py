"""Reductions over extents of 1 only, rewritten as the identities they are.

A reduction whose reduced dims all have extent 1 (a softmax over one key: the scores of a first decode
step without a cache, a sequence of one; a sum over a batch of one) reduces one element per result:
its value is its source's. The planner maps such a reduction to no domain axis at all (axes of extent
1 are no axes), so it would look like a reduction that leaves a full-size result; planned through
:func:`unit_reductions` it is an element-wise node instead, and the graph is planned like the same
graph at other extents without that reduction.

Contract (:func:`unit_reductions`): the graph with every such ``reduce_*`` node replaced by an exact
identity of the same id, shape and dtype (``maximum(x, x)``: the same value, ``-0.0`` and NaN
included; with ``keepdims: false`` a ``reshape`` to the result's shape), and the ids replaced; the
graph itself and ``()`` when there is none. The result has the same inputs and outputs.
"""

from __future__ import annotations

from typing import Any

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Graph, parse_graph

__all__ = ["unit_reductions"]


def unit_reductions(graph: Graph) -> tuple[Graph, tuple[str, ...]]:
    """(graph with its reductions over extents of 1 as identities, their ids); see the module docstring."""
    units = []
    for nd in graph.nodes:
        if OPS[nd.op].kind != "reduce" or not nd.axes:
            continue
        src = graph.spec(str(nd.args[0])).shape
        if all(src[a] == 1 for a in nd.axes):
            units.append(nd.id)
    if not units:
        return graph, ()
    obj: dict[str, Any] = graph.to_dict()
    nodes = []
    for d in obj["nodes"]:
        if d["id"] in units:
            src = d["args"][0]
            d = ({"id": d["id"], "op": "maximum", "args": [src, src]} if d.get("keepdims")
                 else {"id": d["id"], "op": "reshape", "args": [src], "shape": list(graph.spec(d["id"]).shape)})
        nodes.append(d)
    return parse_graph({**obj, "nodes": nodes}), tuple(units)
