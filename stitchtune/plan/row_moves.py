"""Row moves pushed through row-local computations: Swin's LayerNorm right before its ``roll``.

A ``slice`` / ``concat`` along *outer* axes only (never the innermost one) moves whole rows: the
element at ``(..., j)`` of the result is the element ``(..., j)`` of some source row. Such a move
commutes with every *row-local* computation, one whose value at a row depends on that row alone:
element-wise ops, reductions over the innermost axis (the row's own statistics), broadcasts of
per-row or per-column values. So ``roll(LN(x)) == LN(roll(x))``.

A stitched row kernel computes the statistics of the row it is at, so the planner refuses a
per-row value under a row-axis shift (:func:`~stitchtune.plan.remap.check_remaps`). :func:`commute_row_moves`
rewrites such a graph: the tree of slice / concat nodes (its *root* is the node read
by something else than slice / concat, or an output) over one source tensor ``S`` (a computed
tensor, or reshapes of one that keep its innermost dim: Swin's tokens ``[B, H*W, C]`` viewed as
``[B, H, W, C]``, maybe one such reshape per slice as the ONNX importer makes them) is applied to the inputs that the row-local computation of ``S`` reads and that vary
along the rows (each viewed in ``S``'s layout: ``S``'s outer dims, its own innermost one), and the
computation is made again on the moved values, in ``S``'s layout; its last node takes the root's id,
so every consumer, and the outputs, read it unchanged. Inputs that are constant along the rows (a
per-column weight ``[C]``) are not moved. A node of the computation that is also read in its own
order (an output, or read by another node: the residual sum before Swin's LayerNorm, a training
step's saved mean and 1/std) is made once more from the unmoved inputs in ``S``'s layout and
reshaped back to its own shape under its own id. The nodes of the old computation that nothing
reads any more are dropped, and the nodes are put in an order where each follows what it reads.

It applies only where the computation holds a reduction (an element-wise one under a move is
already planned as remapped loads: :func:`~stitchtune.plan.remap.outer_sources`), and where every
step is row-local: element-wise, casts, a reduction over the innermost axis with ``keepdims``, a
reshape that keeps the innermost dim; every tensor of the computation either of the source's rows
(as many rows; innermost dim the source's, or 1: per row) or constant along the rows (every outer
dim 1); every leaf a graph input, full-size where it varies along the rows (a per-row input, moved,
would be a per-row value under a row shift). Anything else leaves the graph as it is (and the
planner's refusal stands). The result is a validated :class:`Graph` with the same inputs and
outputs, whose reference values are those of ``graph``. The planner
(:func:`~stitchtune.plan.planner.make_plan`) plans it when it refuses ``graph`` itself (so every graph
planned before keeps its plan and kernels: a class token selected at row 0 next to its LayerNorm), and
carries it in the plan (``StitchPlan.moved_graph``); the lowering (:class:`~stitchtune.lower.base.Lowerer`)
then lowers that graph in place of ``graph``, without making the rewrite again.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod
from typing import Any

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Graph, Node, parse_graph
from stitchtune.plan.rewrite import fresh_names, live_nodes, ordered_nodes, remade_nodes

__all__ = ["RowMove", "commute_row_moves", "row_moves"]

_MOVES = ("slice", "concat")
_ROW_LOCAL_KINDS = ("unary", "binary", "ternary", "cast")


@dataclass(frozen=True)
class RowMove:
    """One row move to push down: ``tree`` the slice / concat nodes (graph order, ``root`` last) over
    ``sources``, the tensors of one shape that the tree reads (``S``; one, or several reshapes of the
    same tensor); ``top`` the computed tensor they are or view; ``views`` the reshapes between them
    (``sources`` among them where they are reshapes); ``computed`` the row-local nodes that vary along
    the rows (graph order, ``top`` last; reshapes that keep the innermost dim among them);
    ``moved_inputs`` the inputs among their arguments that vary along the rows; ``kept`` the nodes of
    ``computed`` and ``views`` also read in their own order (outputs, or read by other nodes: a residual
    sum, training's saved statistics), computed once more unmoved in ``S``'s layout and reshaped back."""

    root: str
    tree: tuple[str, ...]
    sources: tuple[str, ...]
    top: str
    views: tuple[str, ...]
    computed: tuple[str, ...]
    moved_inputs: tuple[str, ...]
    kept: tuple[str, ...] = ()


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
    names = set(graph.input_names) | {nd.id for nd in graph.nodes}
    redefined = {m.root for m in moves} | {k for m in moves for k in m.kept}
    out = [d for d, nd in zip(graph.to_dict()["nodes"], graph.nodes) if nd.id not in redefined]
    for m in moves:
        out.extend(_pushed(graph, m, names))
    body = graph.to_dict()
    body["nodes"] = live_nodes(ordered_nodes(out), body["outputs"])
    return parse_graph(body)


def row_moves(graph: Graph) -> tuple[RowMove, ...]:
    """The row moves of ``graph`` that :func:`commute_row_moves` pushes down, in graph order (of two
    moves of one computation, the first)."""
    nodes = {nd.id: nd for nd in graph.nodes}
    out: list[RowMove] = []
    for nd in graph.nodes:
        if nd.op in _MOVES and (nd.id in graph.outputs or any(c.op not in _MOVES for c in graph.consumers(nd.id))):
            move = _move(graph, nodes, nd)
            if move is not None and not any(set(move.computed) & set(m.computed) for m in out):
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
    if not leaves <= set(nodes) or len({nodes[s].shape for s in leaves}) != 1:
        return None
    shape = nodes[next(iter(leaves))].shape
    if any(len(nodes[t].shape) != len(shape) for t in tree):
        return None
    tops, views = set(), set()
    for leaf in leaves:
        top = nodes[leaf]
        while top.op == "reshape" and _keeps_rows(graph, top):   # Swin's tokens viewed as [B, H, W, C]
            views.add(top.id)
            arg = str(top.args[0])
            if arg not in nodes:
                return None   # the roll of an input: planned as remapped loads
            top = nodes[arg]
        tops.add(top)
    if len(tops) != 1:
        return None
    top = tops.pop()
    found = _row_local(graph, nodes, top, tuple(shape))
    if found is None:
        return None
    computed, moved_inputs = found
    if not any(OPS[nodes[c].op].kind == "reduce" for c in computed):
        return None
    inside = set(computed) | views | tree
    read_out = {n for n in [*computed, *views]
                if n in graph.outputs or any(c.id not in inside for c in graph.consumers(n))}

    def ordered(ids: set[str]) -> tuple[str, ...]:
        return tuple(nd.id for nd in graph.nodes if nd.id in ids)

    return RowMove(root=root.id, tree=ordered(tree), sources=ordered(leaves), top=top.id, views=ordered(views),
                   computed=computed, moved_inputs=moved_inputs, kept=ordered(read_out))


def _keeps_rows(graph: Graph, nd: Node) -> bool:
    """Whether reshape ``nd`` keeps the innermost dim (so it maps rows onto rows in row-major order)."""
    return graph.spec(str(nd.args[0])).shape[-1:] == tuple(nd.shape[-1:])


def _row_local(graph: Graph, nodes: dict[str, Node], top: Node, src: tuple[int, ...]
               ) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(the nodes ``top`` is computed from that vary along the rows, the inputs among their arguments
    that do) when every step is row-local (module docstring), else None. ``src``: the source's shape."""
    computed: set[str] = set()
    inputs: set[str] = set()
    stack = [top.id]
    while stack:
        name = stack.pop()
        if name in computed or name in inputs:
            continue
        along = _along_rows(tuple(graph.spec(name).shape), src)
        if along is None:
            return None
        if not along:
            continue   # constant along the rows (a per-column weight): read as it is
        if name not in nodes:
            if graph.spec(name).shape[-1] != src[-1]:
                return None   # a per-row input: moved, it would be a per-row value under a row shift
            inputs.add(name)
            continue
        nd = nodes[name]
        kind = OPS[nd.op].kind
        if kind == "reduce":
            if nd.axes != (len(nd.shape) - 1,) or not nd.keepdims:
                return None
        elif not (kind in _ROW_LOCAL_KINDS or nd.op == "reshape" and _keeps_rows(graph, nd)):
            return None
        computed.add(name)
        stack.extend(nd.tensor_args)
    return tuple(nd.id for nd in graph.nodes if nd.id in computed), tuple(n for n in graph.input_names if n in inputs)


def _along_rows(shape: tuple[int, ...], src: tuple[int, ...]) -> bool | None:
    """Whether a tensor of ``shape`` in the computation of a source of shape ``src`` varies along its
    rows (as many rows as ``src``, its innermost dim ``src``'s or 1), False when it is constant along
    them (every outer dim 1, of rank at most ``src``'s), None otherwise (a partial broadcast along the
    rows, a higher rank)."""
    rows = prod(shape[:-1])
    if rows == 1 and len(shape) <= len(src):
        return False
    if rows == prod(src[:-1]) and shape[-1] in (1, src[-1]):
        return True
    return None


def _pushed(graph: Graph, move: RowMove, names: set[str]) -> list[dict[str, Any]]:
    """The graph.json nodes of ``move`` pushed down: the move applied to each moved input (viewed in
    the source's layout), the row-local computation on the moved values (its last node named
    ``move.root``), and the ``kept`` nodes computed unmoved in the source's layout, reshaped back
    under their own ids."""
    src = tuple(graph.spec(move.sources[0]).shape)
    nodes = {nd.id: nd for nd in graph.nodes}
    out: list[dict[str, Any]] = []

    def fresh(base: str) -> str:
        return fresh_names(names, f"{base[:48]}_{move.root[:8]}")

    def viewed(u: str) -> str:   # input u in the source's layout
        shape = list(src[:-1]) + [graph.spec(u).shape[-1]]
        if tuple(graph.spec(u).shape) == tuple(shape):
            return u
        head = fresh(u)
        out.append({"id": head, "op": "reshape", "args": [u], "shape": shape})
        return head

    moved: dict[str, str] = {}
    for u in move.moved_inputs:
        head = viewed(u)
        local = {s: head for s in move.sources}
        for t in move.tree:
            nd = nodes[t]
            d: dict[str, Any] = {"id": fresh(f"{t}_{u}"), "op": nd.op,
                                 "args": [local[a] for a in nd.tensor_args], "axis": nd.axis}
            if nd.op == "slice":
                d["start"], d["stop"] = nd.start, nd.stop
            local[t] = d["id"]
            out.append(d)
        moved[u] = local[move.root]
    top = move.top
    out += remade_nodes(nodes, move.computed, moved, lambda c: move.root if c == top else fresh(c))
    if move.kept:
        own = {u: viewed(u) for u in move.moved_inputs}
        need = _ancestors(nodes, [top if k in move.views else k for k in move.kept], set(move.computed))
        def own_name(c: str) -> str:   # a kept node of the source's layout is made under its own id
            return c if c in move.kept and nodes[c].shape == (*src[:-1], nodes[c].shape[-1]) else fresh(c)

        out += remade_nodes(nodes, tuple(c for c in move.computed if c in need), own, own_name)
        for k in move.kept:
            image = _image(nodes, top if k in move.views else k, own)
            if image != k:
                out.append({"id": k, "op": "reshape", "args": [image], "shape": list(graph.spec(k).shape)})
    return out


def _image(nodes: dict[str, Node], c: str, values: dict[str, str]) -> str:
    """The name of ``c``'s value in ``values`` (through reshapes to their argument's)."""
    while c not in values and nodes[c].op == "reshape":
        c = str(nodes[c].args[0])
    return values[c]


def _ancestors(nodes: dict[str, Node], names: list[str], within: set[str]) -> set[str]:
    """``names`` and what they are computed from, within ``within``."""
    seen: set[str] = set()
    stack = [n for n in names if n in within]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(a for a in nodes[n].tensor_args if a in within)
    return seen
