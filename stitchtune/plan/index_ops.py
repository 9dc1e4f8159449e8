"""The primitives of planning a region with index ops (``slice``, ``concat``, ``gather``,
``gather_elements``) that both the layout chains (:mod:`stitchtune.plan.chains`) and the remaps
(:mod:`stitchtune.plan.remap`) read: whether a graph has index or layout ops, its gather tables, a
tensor's surrogate shape, and which nodes come after the index ops (and which feed a layout node
before them) given the nodes loaded by index arithmetic like an input."""

from __future__ import annotations

from stitchtune.errors import UnsupportedGraphError
from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.graph.parse import Graph

__all__ = ["has_index_ops", "has_layout_ops", "gather_tables", "surrogate_shape", "after_index_ops", "feeds_layout"]


def has_index_ops(graph: Graph) -> bool:
    return any(OPS[n.op].kind in INDEX_KINDS for n in graph.nodes)


def has_layout_ops(graph: Graph) -> bool:
    """Whether ``graph`` has a transpose or reshape (a general index map)."""
    return any(OPS[n.op].kind == "layout" for n in graph.nodes)


def gather_tables(graph: Graph) -> dict[str, str]:
    """Gather node id -> its table input."""
    return {n.id: str(n.args[0]) for n in graph.nodes if n.op == "gather"}


def surrogate_shape(shape: tuple[int, ...], domain: tuple[int, ...], name: str) -> tuple[int, ...]:
    """The surrogate shape of tensor ``name``: ``shape`` with each dimension other than 1 replaced by
    the iteration domain's (right-aligned); :class:`UnsupportedGraphError` when its rank is higher."""
    off = len(domain) - len(shape)
    if off < 0:
        raise UnsupportedGraphError(f"tensor '{name}' {list(shape)} has a higher rank than the iteration "
                                    f"domain {list(domain)}")
    return tuple(1 if s == 1 else domain[off + k] for k, s in enumerate(shape))


def after_index_ops(graph: Graph, loaded: frozenset[str]) -> set[str]:
    """The nodes computed from the result of a slice, concat or gather (the index ops included). The
    nodes in ``loaded`` (the members of :func:`~stitchtune.plan.chains.sliced_chains`:
    :func:`~stitchtune.plan.chains.sliced_members`) are loaded by index arithmetic like an input, so
    they and their head count as before the index ops."""
    out: set[str] = set()
    for nd in graph.nodes:
        if nd.id in loaded:
            continue
        if OPS[nd.op].kind in INDEX_KINDS or any(a in out for a in nd.tensor_args):
            out.add(nd.id)
    return out


def feeds_layout(graph: Graph, loaded: frozenset[str]) -> set[str]:
    """The nodes before the index ops that a transpose / reshape / expand before the index ops is
    computed from (they keep their own shapes: :func:`~stitchtune.plan.chains.layout_part`);
    ``loaded`` as for :func:`after_index_ops`."""
    after = after_index_ops(graph, loaded)
    out: set[str] = set()
    for nd in reversed(graph.nodes):
        if nd.id in after:
            continue
        if any(c.id in out or (OPS[c.op].kind == "layout" and c.id not in after) for c in graph.consumers(nd.id)):
            out.add(nd.id)
    return out
