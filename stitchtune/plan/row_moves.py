"""Row moves pushed through row-local computations: Swin's LayerNorm right before its ``roll``.

A ``slice`` / ``concat`` along *outer* axes only (never the innermost one) moves whole rows: the
element at ``(..., j)`` of the result is the element ``(..., j)`` of some source row. Such a move
commutes with every *row-local* computation, one whose value at a row depends on that row alone:
element-wise ops, reductions over the innermost axis (the row's own statistics), broadcasts of
per-row or per-column values. So ``roll(LN(x)) == LN(roll(x))``.

A stitched row kernel computes the statistics of the row it is at, so the planner refuses a
per-row value under a row-axis shift (:func:`~stitchtune.plan.remap.check_remaps`). :func:`commute_row_moves`
rewrites such a graph before planning: the tree of slice / concat nodes (its *root* is the node read
by something else than slice / concat, or an output) over one source tensor ``S`` (a computed
tensor, or a reshape of one that keeps its innermost dim: Swin's tokens ``[B, H*W, C]`` viewed as
``[B, H, W, C]``) is applied to the inputs that the row-local computation of ``S`` reads and that vary
along the rows (each viewed as ``S``'s outer dims first), and the computation is made again on the
moved values, in the root's shape; its last node takes the root's id, so every consumer, and the
outputs, read it unchanged. Inputs that are constant along the rows (a per-column weight ``[C]``)
are not moved. The nodes of the old computation that nothing reads any more are dropped.

It applies only where the computation holds a reduction (an element-wise one under a move is
already planned as remapped loads: :func:`~stitchtune.plan.remap.outer_sources`), and where every
step is row-local: element-wise, casts, a
reduction over the innermost axis with ``keepdims``; every tensor of the computation either of the
source's shape, per row (the source's outer dims, innermost 1), or constant along the outer dims;
every leaf a graph input, full-size where it varies along the rows (a per-row input, moved, would be a
per-row value under a row shift). Anything else leaves the graph as it is (and the planner's refusal
stands). The result is a validated :class:`Graph` with the same inputs and outputs, whose reference
values are those of ``graph``; the planner (:func:`~stitchtune.plan.planner.make_plan`) and the
lowering (:class:`~stitchtune.lower.base.Lowerer`) both see it in place of ``graph``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Graph, Node, parse_graph

__all__ = ["RowMove", "commute_row_moves", "row_moves"]

_MOVES = ("slice", "concat")
_ROW_LOCAL_KINDS = ("unary", "binary", "ternary", "cast")


@dataclass(frozen=True)
class RowMove:
    """One row move to push down: ``tree`` the slice / concat nodes (graph order, ``root`` last) over
    the one ``source`` tensor; ``view`` the reshape ``source`` is of (None: ``source`` is computed);
    ``computed`` the row-local nodes that vary along the rows (graph order, the tensor the move reads
    last); ``moved_inputs`` the inputs among their arguments that vary along the rows."""

    root: str
    tree: tuple[str, ...]
    source: str
    view: str | None
    computed: tuple[str, ...]
    moved_inputs: tuple[str, ...]


def commute_row_moves(graph: Graph) -> Graph:
    """``graph`` with each :func:`row_moves` move pushed below its row-local computation (module
    docstring); ``graph`` itself when there is none."""
    if not any(nd.op in _MOVES for nd in graph.nodes):
        return graph
    return _commuted(graph)


@lru_cache(maxsize=32)
def _commuted(graph: Graph) -> Graph:
    moves = row_moves(graph)
    if not moves:
        return graph
    by_root = {m.root: m for m in moves}
    names = set(graph.input_names) | {nd.id for nd in graph.nodes}
    out: list[dict[str, Any]] = []
    for d, nd in zip(graph.to_dict()["nodes"], graph.nodes):
        if nd.id in by_root:
            out.extend(_pushed(graph, by_root[nd.id], names))
        else:
            out.append(d)
    body = graph.to_dict()
    body["nodes"] = _live(out, body["outputs"])
    return parse_graph(body)


def row_moves(graph: Graph) -> tuple[RowMove, ...]:
    """The row moves of ``graph`` that :func:`commute_row_moves` pushes down, in graph order."""
    nodes = {nd.id: nd for nd in graph.nodes}
    out = []
    for nd in graph.nodes:
        if nd.op in _MOVES and (nd.id in graph.outputs or any(c.op not in _MOVES for c in graph.consumers(nd.id))):
            move = _move(graph, nodes, nd)
            if move is not None:
                out.append(move)
    return tuple(out)


def _move(graph: Graph, nodes: dict[str, Node], root: Node) -> RowMove | None:
    """The :class:`RowMove` rooted at ``root``, or None where the rewrite does not apply."""
    tree, leaves, stack = {root.id}, set(), [root.id]
    while stack:
        nd = nodes[stack.pop()]
        if nd.axis is None or nd.axis == len(nd.shape) - 1:
            return None   # a move along the innermost axis changes a row's own elements
        for a in nd.args:
            if not isinstance(a, str):
                return None
            if a in nodes and nodes[a].op in _MOVES:
                if a not in tree:
                    tree.add(a)
                    stack.append(a)
            else:
                leaves.add(a)
    if len(leaves) != 1 or next(iter(leaves)) not in nodes:
        return None
    source = nodes[next(iter(leaves))]
    view: str | None = None
    top = source
    if source.op == "reshape":
        arg = str(source.args[0])
        if arg not in nodes or graph.spec(arg).shape[-1:] != source.shape[-1:]:
            return None
        view, top = source.id, nodes[arg]
    if any(len(nodes[t].shape) != len(source.shape) for t in tree):
        return None
    found = _row_local(graph, nodes, top)
    if found is None:
        return None
    computed, moved_inputs = found
    if not any(OPS[nodes[c].op].kind == "reduce" for c in computed):
        return None
    return RowMove(root=root.id, tree=tuple(nd.id for nd in graph.nodes if nd.id in tree), source=source.id,
                   view=view, computed=computed, moved_inputs=moved_inputs)


def _row_local(graph: Graph, nodes: dict[str, Node], top: Node) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(the nodes ``top`` is computed from that vary along the rows, the inputs among their arguments
    that do) when every step is row-local (module docstring), else None."""
    full = tuple(top.shape)
    computed: set[str] = set()
    inputs: set[str] = set()
    stack = [top.id]
    while stack:
        name = stack.pop()
        if name in computed or name in inputs:
            continue
        along = _along_rows(tuple(graph.spec(name).shape), full)
        if along is None:
            return None
        if not along:
            continue   # constant along the rows (a per-column weight): read as it is
        if name not in nodes:
            if graph.spec(name).shape[-1] != full[-1]:
                return None   # a per-row input: moved, it would be a per-row value under a row shift
            inputs.add(name)
            continue
        nd = nodes[name]
        kind = OPS[nd.op].kind
        if kind == "reduce":
            if nd.axes != (len(nd.shape) - 1,) or not nd.keepdims or len(nd.shape) != len(full):
                return None
        elif kind not in _ROW_LOCAL_KINDS:
            return None
        computed.add(name)
        stack.extend(nd.tensor_args)
    return tuple(nd.id for nd in graph.nodes if nd.id in computed), tuple(n for n in graph.input_names if n in inputs)


def _along_rows(shape: tuple[int, ...], full: tuple[int, ...]) -> bool | None:
    """Whether a tensor of ``shape`` read in a computation of ``full``'s shape varies along its rows
    (its outer dims are ``full``'s, its innermost ``full``'s or 1), False when it is constant along
    them (outer dims all 1), None otherwise (a partial broadcast along the rows, a higher rank)."""
    if len(shape) > len(full):
        return None
    pad = (1,) * (len(full) - len(shape)) + shape
    if all(d == 1 for d in pad[:-1]):
        return False
    if pad[:-1] == full[:-1] and pad[-1] in (1, full[-1]):
        return True
    return None


def _pushed(graph: Graph, move: RowMove, names: set[str]) -> list[dict[str, Any]]:
    """The graph.json nodes that replace ``move.root``: the move applied to each moved input (viewed
    in the source's outer dims first), then the row-local computation on the moved values, its last
    node named ``move.root``."""
    src = graph.spec(move.source).shape
    nodes = {nd.id: nd for nd in graph.nodes}
    renamed: dict[str, str] = {}
    out: list[dict[str, Any]] = []

    def fresh(base: str) -> str:
        stem, k = f"{base[:48]}_{move.root[:8]}", 0
        name = stem
        while name in names:
            k += 1
            name = f"{stem}_{k}"
        names.add(name)
        return name

    for u in move.moved_inputs:
        shape = list(src[:-1]) + [graph.spec(u).shape[-1]]
        head = u
        if tuple(graph.spec(u).shape) != tuple(shape):
            head = fresh(u)
            out.append({"id": head, "op": "reshape", "args": [u], "shape": shape})
        local = {move.source: head}
        for t in move.tree:
            nd = nodes[t]
            d: dict[str, Any] = {"id": fresh(f"{t}_{u}"), "op": nd.op,
                                 "args": [local[a] for a in nd.tensor_args], "axis": nd.axis}
            if nd.op == "slice":
                d["start"], d["stop"] = nd.start, nd.stop
            local[t] = d["id"]
            out.append(d)
        renamed[u] = local[move.root]
    for c in move.computed:
        nd = nodes[c]
        top = c == move.computed[-1]
        d = {"id": move.root if top else fresh(c), "op": nd.op,
             "args": [renamed.get(a, a) if isinstance(a, str) else a for a in nd.args]}
        if OPS[nd.op].kind == "reduce":
            d["axes"], d["keepdims"] = [-1], True
        if nd.op == "cast":
            d["to"] = nd.to
        renamed[c] = d["id"]
        out.append(d)
    return out


def _live(nodes: list[dict[str, Any]], outputs: list[str]) -> list[dict[str, Any]]:
    """``nodes`` (graph.json form, topological) without those no output depends on."""
    need = set(outputs)
    keep = []
    for d in reversed(nodes):
        if d["id"] in need:
            keep.append(d)
            need.update(a for a in d["args"] if isinstance(a, str))
    return keep[::-1]
