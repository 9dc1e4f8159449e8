"""The primitives of planning a region with index ops (``slice``, ``concat``, ``gather``,
``gather_elements``) that both the layout chains (:mod:`stitchtune.plan.chains`) and the remaps
(:mod:`stitchtune.plan.remap`) read: whether a graph has index or layout ops, its gather tables, a
tensor's surrogate shape (and the gather tables' and indices'), and which nodes come after the index
ops (and which feed a layout node before them) given the nodes loaded by index arithmetic like an input."""

from __future__ import annotations

from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.graph.parse import Graph
from stitchtune.plan.refusal import Refusal

__all__ = ["has_index_ops", "has_layout_ops", "gather_tables", "gather_shapes", "aligned_shape", "align_refusal",
           "surrogate_shape",
           "spans_shape", "after_index_ops", "feeds_layout", "unit_reshapes"]


def has_index_ops(graph: Graph) -> bool:
    return any(OPS[n.op].kind in INDEX_KINDS for n in graph.nodes)


def has_layout_ops(graph: Graph) -> bool:
    """Whether ``graph`` has a transpose or reshape (a general index map)."""
    return any(OPS[n.op].kind == "layout" for n in graph.nodes)


def unit_reshapes(graph: Graph) -> frozenset[str]:
    """The reshape nodes that only add or drop leading extents of 1 (GPT-2's ONNX ``[1, S, C]`` viewed
    as ``[S, C]``): the same tensor right-aligned, so no layout change for the planner's right-aligned
    surrogate; they are neither chains, tails nor part of a mixed region's layout part, and a region
    whose only layout nodes they are is not mixed. A reshape that moves a 1 between other extents
    (``[S, 1, C]`` -> ``[S, C]``) is not one: it does not keep the right alignment."""
    def core(shape: tuple[int, ...]) -> tuple[int, ...]:
        k = 0
        while k < len(shape) and shape[k] == 1:
            k += 1
        return tuple(shape[k:])
    return frozenset(n.id for n in graph.nodes if n.op == "reshape"
                     and core(tuple(n.shape)) == core(tuple(graph.spec(n.tensor_args[0]).shape)))


def gather_tables(graph: Graph) -> dict[str, str]:
    """Gather node id -> its table input."""
    return {n.id: str(n.args[0]) for n in graph.nodes if n.op == "gather"}


def aligned_shape(shape: tuple[int, ...], domain: tuple[int, ...], name: str) -> tuple[int, ...] | Refusal:
    """The surrogate shape of tensor ``name``: ``shape`` with each dimension other than 1 replaced by
    the iteration domain's (right-aligned); the :class:`~stitchtune.plan.refusal.Refusal` naming it
    when its rank is higher."""
    off = len(domain) - len(shape)
    if off < 0:
        return Refusal(f"tensor '{name}' {list(shape)} has a higher rank than the iteration domain {list(domain)}")
    return tuple(1 if s == 1 else domain[off + k] for k, s in enumerate(shape))


def align_refusal(shape: tuple[int, ...], domain: tuple[int, ...], name: str, why: str) -> Refusal | None:
    """None when ``shape`` (tensor ``name``'s) is its own surrogate shape against ``domain``
    (:func:`aligned_shape`: right-aligned, every dim 1 or the domain's); else the refusal of a higher
    rank, or ``Refusal("tensor '<name>' [<shape>] <why>")`` (``why``: what reads it and why that needs it
    aligned)."""
    sur = aligned_shape(shape, domain, name)
    if isinstance(sur, Refusal):
        return sur
    return None if sur == shape else Refusal(f"tensor '{name}' {list(shape)} {why}")


def gather_shapes(graph: Graph, domain: tuple[int, ...]) -> dict[str, tuple[int, ...]] | Refusal:
    """Surrogate shapes of the gather tables (one row) and their indices (per row), or the refusal of
    a table read by another op or stored, an index used with tables of two ranks, or a rank higher
    than the domain's."""
    out: dict[str, tuple[int, ...]] = {}
    tables = set(gather_tables(graph).values())
    for n in graph.nodes:
        if n.op != "gather":
            if any(a in tables for a in n.tensor_args):
                return Refusal(f"node '{n.id}' reads gather table '{next(a for a in n.tensor_args if a in tables)}'; "
                               "a gather table may only be read by gather")
            continue
        table, idx = n.args
        tspec, ispec = graph.spec(str(table)), graph.spec(str(idx))
        isur = aligned_shape(tuple(ispec.shape) + (1,) * (tspec.rank - 1), domain, str(idx))
        if isinstance(isur, Refusal):
            return isur
        if out.setdefault(str(idx), isur) != isur:
            return Refusal(f"gather '{n.id}': index '{idx}' is used with tables of different ranks")
        tsur = aligned_shape(tuple(tspec.shape[1:]), domain, str(table))
        if isinstance(tsur, Refusal):
            return tsur
        out[str(table)] = tsur
    for o in graph.outputs:
        if o in tables:
            return Refusal(f"output '{o}' is a gather table; a table may only be read by gather")
    return out


def surrogate_shape(shape: tuple[int, ...], domain: tuple[int, ...], name: str) -> tuple[int, ...]:
    """:func:`aligned_shape` for callers where the rank fits (checked by the caller, or decided by the
    planner before: a refusal there is a bug); raises its :class:`~stitchtune.errors.UnsupportedGraphError`
    otherwise (the planner's stages call :func:`aligned_shape`)."""
    got = aligned_shape(shape, domain, name)
    if isinstance(got, Refusal):
        raise got.error()
    return got


def spans_shape(shape: tuple[int, ...], domain: tuple[int, ...]) -> bool:
    """Whether ``shape`` is its own surrogate shape against ``domain`` (right-aligned, every dim 1 or
    the domain's); False for a higher rank."""
    return len(shape) <= len(domain) and surrogate_shape(shape, domain, "") == tuple(shape)


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
