"""Rows rearranged before a slice / concat and viewed again after it: Swin's roll back after attention.

After its window attention a shifted Swin block reverses the window partition (the projection ``P``
``[nW, w*w, C]`` plus its bias, reshaped to ``[B, H/w, W/w, w, w, C]``, transposed, reshaped to ``[B, H,
W, C]``), rolls the result back (slice + concat along H and W), views it as tokens ``[B, H*W, C]`` and
adds it to the residual before ``layernorm_after``. Every step moves whole rows (the innermost dim
``C`` stays the innermost), so the region is a permutation of ``P``'s rows followed by a row-local
computation. The planner refuses it as given (a reshape of a tensor computed from slice / concat may
only make an output, and a slice along an outer axis may not read through a transpose);
:func:`commute_row_views` rewrites it into a graph it plans:

* *columns below the views*: an element-wise node of one graph input ``X`` and per-column values (a
  bias ``[C]``) that only a chain of reshapes / transposes keeping ``C`` innermost reads, ending in a
  tensor that a slice / concat along an outer axis reads, is made after the chain instead (the chain
  rearranges ``X`` alone): ``reverse(P + b) == reverse(P) + b``. The chain is then one of
  :func:`~stitchtune.plan.chains.composed_chains` (the kernel carries each shifted position back
  through it to ``P``'s offset);
* *the computation in the rows' own layout*: a reshape that keeps the innermost dim of a tensor
  computed from a slice / concat (the tokens view) read by a row-local computation (element-wise ops,
  reductions over the innermost axis with ``keepdims``; its other inputs of the view's shape or constant
  along the rows) is dropped: the computation is made in the reshape's source layout (each input of
  the view's shape viewed there by a reshape), and each of its outputs reshaped back under its own id
  (a trailing map of the stored tensor).

Each rewrite applies only where every condition holds, and leaves the graph as it is otherwise. The
result is a validated :class:`Graph` with the same inputs and outputs whose reference values are those
of ``graph``. :func:`~stitchtune.plan.planner.make_plan` plans it only where it refuses ``graph`` (and
its :func:`~stitchtune.plan.row_moves.commute_row_moves` rewrite), and carries it in the plan
(``StitchPlan.moved_graph``)."""

from __future__ import annotations

from math import prod
from typing import Any

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Graph, Node, parse_graph
from stitchtune.plan.pick import node_axis
from stitchtune.plan.rewrite import fresh_names, live_nodes, ordered_nodes, remade_nodes

__all__ = ["commute_row_views"]

_ELEMENTWISE = ("unary", "binary", "ternary", "cast")


def commute_row_views(graph: Graph) -> Graph:
    """``graph`` with per-column ops moved below the row views they feed and row-local computations of
    a tokens view made in the view's source layout (module docstring); ``graph`` itself when neither
    applies."""
    if not any(nd.op in ("slice", "concat") for nd in graph.nodes):
        return graph
    return _computation_in_rows_layout(_columns_below_views(graph))


def _keeps_inner(graph: Graph, nd: Node) -> bool:
    """Whether layout node ``nd`` keeps its argument's innermost dim innermost (it moves whole rows)."""
    if nd.op == "reshape":
        return graph.spec(str(nd.args[0])).shape[-1:] == tuple(nd.shape[-1:])
    return nd.op == "transpose" and bool(nd.perm) and nd.perm[-1] == len(nd.shape) - 1


def _per_column(graph: Graph, a: Any, inner: int) -> bool:
    """Whether argument ``a`` is a constant or a graph input constant along the rows (every outer dim 1)."""
    if not isinstance(a, str):
        return True
    shape = tuple(graph.spec(a).shape)
    return a in graph.input_names and prod(shape[:-1]) == 1 and shape[-1:] in ((1,), (inner,))


def _outer_moved(nd: Node, graph: Graph) -> bool:
    """Whether a slice / concat along an outer axis reads ``nd``."""
    return any(c.op in ("slice", "concat") and node_axis(c) < len(c.shape) - 1 for c in graph.consumers(nd.id))


def _columns_below_views(graph: Graph) -> Graph:
    """The first rewrite of the module docstring, for every such element-wise node."""
    nodes = {nd.id: nd for nd in graph.nodes}
    outputs = set(graph.outputs)
    body = graph.to_dict()
    out = list(body["nodes"])
    names = set(graph.input_names) | set(nodes)
    changed = False
    for nd in graph.nodes:
        if OPS[nd.op].kind not in _ELEMENTWISE or nd.id in outputs:
            continue
        varying = [a for a in nd.args if not _per_column(graph, a, nd.shape[-1])]
        if len(varying) != 1 or varying[0] not in graph.input_names:
            continue
        x = str(varying[0])
        if tuple(graph.spec(x).shape) != tuple(nd.shape):
            continue
        chain, cur = [], nd
        while len(graph.consumers(cur.id)) == 1 and cur.id not in outputs:
            (nxt,) = graph.consumers(cur.id)
            if OPS[nxt.op].kind != "layout" or not _keeps_inner(graph, nxt):
                break
            chain.append(nxt)
            cur = nxt
        if not chain or cur.id in outputs or not _outer_moved(cur, graph) or any(
                isinstance(a, str) and a != x and graph.spec(a).rank > len(cur.shape) for a in nd.args):
            continue   # (a per-column value of a higher rank than the head would broadcast it further)
        head = cur.id
        new_head = fresh_names(names, f"{head[:48]}_rows")
        by = {d["id"]: d for d in out}
        by[chain[0].id] = dict(by[chain[0].id], args=[x])           # the chain rearranges x alone
        by[head] = dict(by[head], id=new_head)
        by[nd.id] = dict(by[nd.id], id=head, args=[new_head if a == x else a for a in by[nd.id]["args"]])
        out = list(by.values())
        changed = True
    if not changed:
        return graph
    body["nodes"] = live_nodes(ordered_nodes(out), body["outputs"])
    return parse_graph(body)


def _computation_in_rows_layout(graph: Graph) -> Graph:
    """The second rewrite of the module docstring, for the first tokens view it applies to."""
    nodes = {nd.id: nd for nd in graph.nodes}
    after = _after_moves(graph)
    for view in graph.nodes:
        if view.op != "reshape" or not _keeps_inner(graph, view) or str(view.args[0]) not in after:
            continue
        down = _downstream(graph, view)
        if down is None:
            continue
        return _remade_in(graph, nodes, view, down)
    return graph


def _after_moves(graph: Graph) -> set[str]:
    """The nodes computed from a slice / concat (themselves included)."""
    out: set[str] = set()
    for nd in graph.nodes:
        if nd.op in ("slice", "concat") or any(a in out for a in nd.tensor_args):
            out.add(nd.id)
    return out


def _downstream(graph: Graph, view: Node) -> tuple[str, ...] | None:
    """The nodes computed from ``view`` (graph order) when each is row-local over its rows and reads
    only them, inputs of the view's shape and per-column values; None otherwise."""
    rows, inner = tuple(view.shape[:-1]), view.shape[-1]
    down: set[str] = {view.id}
    for nd in graph.nodes:
        if not any(a in down for a in nd.tensor_args):
            continue
        kind = OPS[nd.op].kind
        if kind == "reduce":
            if tuple(nd.axes) != (len(nd.shape) - 1,) or not nd.keepdims:
                return None
        elif kind not in _ELEMENTWISE:
            return None
        if tuple(nd.shape[:-1]) != rows or nd.shape[-1] not in (1, inner):
            return None
        for a in nd.args:
            if isinstance(a, str) and a not in down and not _per_column(graph, a, inner) and not (
                    a in graph.input_names and tuple(graph.spec(a).shape) == tuple(view.shape)):
                return None
        down.add(nd.id)
    down.discard(view.id)
    return tuple(nd.id for nd in graph.nodes if nd.id in down) or None


def _remade_in(graph: Graph, nodes: dict[str, Node], view: Node, down: tuple[str, ...]) -> Graph:
    """``graph`` with the computation ``down`` of ``view`` made in its source's layout (module docstring)."""
    src = tuple(graph.spec(str(view.args[0])).shape)
    names = set(graph.input_names) | set(nodes)
    body = graph.to_dict()
    out = [d for d in body["nodes"] if d["id"] not in set(down)]   # (the view: an output, or dropped as unread)
    values: dict[str, str] = {view.id: str(view.args[0])}
    outputs = set(graph.outputs)
    for c in down:   # each input of the view's shape, viewed in the source's layout
        for a in nodes[c].tensor_args:
            if a not in values and a in graph.input_names and tuple(graph.spec(a).shape) == tuple(view.shape):
                values[a] = fresh_names(names, f"{a[:48]}_rows")
                out.append({"id": values[a], "op": "reshape", "args": [a], "shape": list(src)})
    ids = {c: fresh_names(names, f"{c[:48]}_rows") if c in outputs else c for c in down}
    out += remade_nodes(nodes, down, values, ids.__getitem__)
    out += [{"id": c, "op": "reshape", "args": [ids[c]], "shape": list(nodes[c].shape)} for c in down if c in outputs]
    body["nodes"] = live_nodes(ordered_nodes(out), body["outputs"])
    return parse_graph(body)
