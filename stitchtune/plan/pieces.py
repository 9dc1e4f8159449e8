"""Concat pieces and broadcast values under outer-axis shifts (:mod:`stitchtune.plan.remap`): the
rules that let a decoding step's key / value cache concat plan in a region with transpose / reshape
(issue 41). A cache ``[B, H, P, D]`` concatenated with the new position's key ``[B, H, 1, D]`` along the
sequence is an input *piece* of the iteration domain (:func:`concat_pieces`), loaded through its own
strides at positions shifted along that outer axis; a one-position cache spans that axis too
(:func:`unit_pieces`); a tensor computed without index ops that broadcasts along a shifted outer axis
(rotary angles of one position) is evaluated where it is (:func:`layout_reader_shift`,
:func:`index_free`). The planner's walk (:func:`stitchtune.plan.remap.check_remaps`) and the lowering
(:class:`stitchtune.lower.remap.RemapValues`) apply the same rules.
"""

from __future__ import annotations

from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.graph.parse import Graph
from stitchtune.plan.index_ops import surrogate_shape
from stitchtune.plan.pick import node_axis as _axis
from stitchtune.plan.shift import Shift

__all__ = ["concat_pieces", "index_free", "layout_reader_shift", "unit_pieces"]


def concat_pieces(graph: Graph, domain: tuple[int, ...]) -> frozenset[str]:
    """The inputs of a region that only concatenations read, each a piece of the iteration domain:
    of the domain's rank and shape but along the concat's axis (a decode step's key / value cache
    ``[B, H, P, D]`` before the new position, concatenated to ``[B, H, P + 1, D]``). In a mixed region
    (:func:`~stitchtune.plan.view_checks.check_mixed`) such a piece is loaded at a position shifted along that (outer) axis in the
    row-major strides of its own shape (:func:`outer_sources`; :func:`real_index_maps`), each load
    proven in bounds by :func:`~stitchtune.plan.shift.shift_offset`."""
    out = set()
    for name, spec in graph.inputs:
        shape, cons = tuple(spec.shape), graph.consumers(name)
        if not cons or len(shape) != len(domain) or any(c.op != "concat" or tuple(c.shape) != tuple(domain)
                                                       for c in cons):
            continue
        if all(all(shape[k] == domain[k] for k in range(len(domain)) if k != _axis(c) + len(domain) - len(c.shape))
               for c in cons):
            out.add(name)
    return frozenset(out)


def layout_reader_shift(graph: Graph, keep: set[str] | frozenset[str], name: str, sh: Shift,
                        domain: tuple[int, ...], per_row: bool, free: frozenset[str]) -> Shift:
    """The shift tensor ``name`` of a mixed region is evaluated at: ``sh`` without the outer axes along
    which it broadcasts (its own dim 1, right-aligned, or absent) where it is a node outside
    :func:`~stitchtune.plan.chains.layout_part` computed without index ops (``free``,
    :func:`index_free`: a size-1 slice is a piece, not a broadcast), or an input that does not vary along the columns
    (``per_row``: a scalar; refused under a row-axis shift otherwise); ``sh`` for every other tensor.
    Its value is the same at every position along such an axis, so its evaluation there never moves:
    rotary angles ``[1, 1, 1, D]`` computed in the region from a layout part, scaled by a scalar, and
    applied to the new key that a concat along the sequence appends to the cache. Applied alike by
    the planner's walk and the lowering (:class:`stitchtune.lower.remap.RemapValues`)."""
    is_input = name in graph.input_names
    if not sh.axes() or name in keep or not (name in free or is_input and per_row):
        return sh
    shape = graph.spec(name).shape
    off = len(domain) - len(shape)
    flat = {a for a in range(len(domain) - 1) if a < off or shape[a - off] == 1}
    if not sh.axes() & flat:
        return sh
    return Shift(tuple((a, d) for a, d in sh.delta if a not in flat), tuple(c for c in sh.conds if c[0] not in flat))


def index_free(graph: Graph) -> frozenset[str]:
    """The nodes of ``graph`` with no slice / concat / gather among what they are computed from
    (themselves included): their value at a position is their arguments' there, never a moved one."""
    out: set[str] = set()
    for nd in graph.nodes:
        if OPS[nd.op].kind not in INDEX_KINDS and all(a in out or a in graph.input_names for a in nd.tensor_args):
            out.add(nd.id)
    return frozenset(out)


def unit_pieces(graph: Graph, domain: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Surrogate shapes of the input pieces of a concat whose every piece has size 1 along its axis
    (a decode step's one-position key cache ``[B, H, 1, D]`` and the new key ``[B, H, 1, D]``): such
    an input spans the concat's axis of the domain (its own size 1 there is a position, not a
    broadcast), so that the concat's result spans it; loaded through its own strides
    (:func:`real_index_maps`, :func:`concat_pieces`)."""
    out: dict[str, tuple[int, ...]] = {}
    inputs = set(graph.input_names)
    for nd in graph.nodes:
        if nd.op != "concat" or tuple(nd.shape) != tuple(domain):
            continue
        a = _axis(nd)
        if any(graph.spec(x).shape[a] != 1 for x in nd.tensor_args):
            continue
        for x in nd.tensor_args:
            shape = tuple(graph.spec(x).shape)
            if x in inputs and len(shape) == len(domain) and all(c.op == "concat" for c in graph.consumers(x)):
                out[x] = surrogate_shape(shape[:a] + (domain[a],) + shape[a + 1:], domain, x)
    return out
