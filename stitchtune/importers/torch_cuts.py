"""PyTorch regions, cuts: where a refused group is split in two rather than giving up a node.

The region finder asks the planner (:func:`plan_check`: :func:`~stitchtune.plan.planner.plan_graph`,
a plan or a :class:`~stitchtune.plan.refusal.Refusal` value; nothing is caught). A refusal that names
nodes which must be in separate regions (its ``apart``: Phi-3's q, k and v, slices of one fused ``qkv``
output viewed with different head counts) reaches the region finder as that :class:`Refusal` (data, not
a message to parse). :func:`chain_cut` finds the edge that splits the group there: the first node is
the head of a chain of views (``permute(view(slice(x)))``); the chain is cut off at the tensor its
slice reads when that tensor is a node of the group read by other nodes of it too. The grouping
(:func:`stitchtune.importers.torch_grouping._groups`) then leaves that edge out, so the chain and
what it feeds become a region of their own that reads the tensor as an input (a view of a region's
input read outside it is an alias: PyTorch views the input again, no copy).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from stitchtune.importers.torch_subgraph import _is_view
from stitchtune.plan.refusal import Refusal

__all__ = ["Accept", "Refusal", "chain_cut", "cut_for", "edge_cuts", "plan_check", "reason_of"]


#: a region's judge: None when it takes the graph, else why not (a line, or a :class:`Refusal`)
Accept = Callable[[Any], "str | Refusal | None"]


def plan_check(graph: Any) -> str | Refusal | None:
    """None when the planner accepts ``graph`` (:func:`~stitchtune.plan.planner.plan_graph`), else its
    reason: a :class:`Refusal` naming the nodes to keep apart, or the line of one that names none (the
    default ``accept`` of :func:`stitchtune.importers.torch_regions.find_regions`)."""
    from stitchtune.plan.planner import plan_graph

    got = plan_graph(graph)
    if not isinstance(got, Refusal):
        return None
    return Refusal(f"planner: {got.reason}", got.apart, got.edges) if got.apart else f"planner: {got.reason}"


def reason_of(why: str | Refusal) -> str:
    """The one-line reason of an ``accept`` result."""
    return why.reason if isinstance(why, Refusal) else why


def chain_cut(head: Any, group: Collection[Any]) -> tuple[Any, Any] | None:
    """The edge ``(source, reader)`` of ``group`` (fx nodes) that cuts the chain of views ending at
    ``head`` off the rest: up from ``head`` through views of the group, the first node whose source is
    a node of the group that other nodes of the group read too. None when the chain reaches a node
    outside the group first (nothing of the group to cut it from) or ``head`` is no view."""
    own = set(group)
    n = head
    while n in own and n.op == "call_function" and _is_view(n) and n.args and hasattr(n.args[0], "op"):
        src = n.args[0]
        if src not in own:
            return None
        if any(u is not n and u in own for u in src.users):
            return src, n
        n = src
    return None


def cut_for(why: str | Refusal, group: Collection[Any],
            done: Collection[tuple[Any, Any]] = ()) -> tuple[Any, Any] | None:
    """The edge of ``group`` to cut for refusal ``why`` (:func:`chain_cut` of the fx node its first
    ``apart`` graph node names), or None: a plain refusal, no such node or chain, or an edge already
    cut (``done``: the refusal stands with the cut, so the caller gives up a node as before)."""
    if not isinstance(why, Refusal) or not why.apart:
        return None
    by_name = {n.name: n for n in group}
    head = _fx_node(why.apart[0], group, by_name)
    cut = chain_cut(head, group) if head is not None else None
    return None if cut is None or cut in done else cut


def edge_cuts(why: str | Refusal, group: Collection[Any],
              done: Collection[tuple[Any, Any]] = ()) -> tuple[tuple[Any, Any], ...]:
    """The fx edges ``(arg, reader)`` of ``group`` to cut all together for refusal ``why``: one per
    ``(reader, source)`` pair of its ``edges`` (the reads between two independent parts of a region and
    the tensors they share, :func:`stitchtune.plan.axes.tensor_axes`), directly or through views of the
    group; empty for a plain refusal, a pair not found, or when every edge is cut already."""
    if not isinstance(why, Refusal) or not why.edges:
        return ()
    by_name = {n.name: n for n in group}
    out: list[tuple[Any, Any]] = []
    for reader, source in why.edges:
        head, src = _fx_node(reader, group, by_name), _fx_node(source, group, by_name)
        edge = _edge_from(src, head, group) if head is not None and src is not None and src is not head else None
        if edge is not None and edge not in out:
            out.append(edge)
    return () if all(e in done for e in out) else tuple(out)


def _edge_from(src: Any, head: Any, group: Collection[Any]) -> tuple[Any, Any] | None:
    """The edge ``(arg, head)`` by which ``head`` reads ``src``: directly, or through views of
    ``group`` (an ``unsqueeze`` the region graph folded); None when it reads it otherwise."""
    own = set(group)
    for arg in getattr(head, "all_input_nodes", ()):
        n = arg
        while n is not src and n in own and n.op == "call_function" and _is_view(n) and n.all_input_nodes:
            n = n.all_input_nodes[0]
        if n is src:
            return arg, head
    return None


def _fx_node(name: str, group: Collection[Any], by_name: dict[str, Any]) -> Any:
    """The fx node of ``group`` that region graph node ``name`` comes from: its own name, or the
    longest fx name that ``name`` extends with ``_<part>`` (a node of a decomposed op); None if none."""
    if name in by_name:
        return by_name[name]
    cands = [n for n in group if name.startswith(n.name + "_")]
    return max(cands, key=lambda n: len(n.name)) if cands else None

