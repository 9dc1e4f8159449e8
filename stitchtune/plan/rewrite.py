"""Graph rewrites in graph.json form: the node-list helpers the planner's rewrites share
(:mod:`stitchtune.plan.row_moves`, :mod:`stitchtune.plan.row_views`).

Contract
--------
* :func:`fresh_names`: a node id not yet taken, recorded as taken.
* :func:`remade_nodes`: nodes of a validated :class:`Graph` made again (graph.json form) reading other
  values, reductions over the innermost axis with ``keepdims``; the caller names each new node.
* :func:`ordered_nodes`: a node list put in an order where each follows what it reads (stable);
  :func:`live_nodes`: a topological node list without the nodes no output depends on.

Each works on plain lists and dicts and returns new ones (``fresh_names`` and ``remade_nodes`` fill in
the set / dict they are given, as documented); the result of a rewrite is validated again by
:func:`~stitchtune.graph.parse.parse_graph`.
"""

from __future__ import annotations

from typing import Any, Callable

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Node

__all__ = ["fresh_names", "live_nodes", "ordered_nodes", "remade_nodes"]


def fresh_names(names: set[str], stem: str) -> str:
    """A name that is not in ``names`` (``stem``, else ``stem_1``, ...), added to them."""
    name, k = stem, 0
    while name in names:
        k += 1
        name = f"{stem}_{k}"
    names.add(name)
    return name


def remade_nodes(nodes: dict[str, Node], computed: tuple[str, ...], values: dict[str, str],
                 name: Callable[[str], str]) -> list[dict[str, Any]]:
    """The nodes ``computed`` (graph order) made again in the source's layout, reading ``values``
    (tensor -> the name of its value there; filled in); reshapes are no nodes (their argument's value);
    ``name(c)`` the id of the node made for ``c``."""
    out: list[dict[str, Any]] = []
    for c in computed:
        nd = nodes[c]
        if nd.op == "reshape":
            values[c] = values[str(nd.args[0])]
            continue
        d: dict[str, Any] = {"id": name(c), "op": nd.op,
                             "args": [values.get(a, a) if isinstance(a, str) else a for a in nd.args]}
        if OPS[nd.op].kind == "reduce":
            d["axes"], d["keepdims"] = [-1], True
        if nd.op == "cast":
            d["to"] = nd.to
        values[c] = d["id"]
        out.append(d)
    return out


def ordered_nodes(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``nodes`` (graph.json form) in an order where each comes after the nodes it reads (stable)."""
    by = {d["id"]: d for d in nodes}
    done: set[str] = set()
    out: list[dict[str, Any]] = []
    for d in nodes:
        stack = [(d["id"], False)]
        while stack:
            i, ready = stack.pop()
            if i in done or i not in by:
                continue
            if ready:
                done.add(i)
                out.append(by[i])
                continue
            stack.append((i, True))
            stack.extend((a, False) for a in reversed(by[i]["args"]) if isinstance(a, str) and a not in done)
    return out


def live_nodes(nodes: list[dict[str, Any]], outputs: list[str]) -> list[dict[str, Any]]:
    """``nodes`` (graph.json form, topological) without those no output depends on."""
    need = set(outputs)
    keep = []
    for d in reversed(nodes):
        if d["id"] in need:
            keep.append(d)
            need.update(a for a in d["args"] if isinstance(a, str))
    return keep[::-1]
