"""Which slices / concats a generic kernel serves (:mod:`stitchtune.lower.dynamic`), as data.

Contract
--------
:func:`shift_refusal` answers, for the representative graph of a bucket and the same dynamic graph
at other extents (the fit's plans), None or the :class:`~stitchtune.graph.dynamic.DynamicRefusal` of the
first slice / concat a generic kernel cannot serve, saying why.

A remap's numbers (:mod:`stitchtune.lower.remap`: a slice's start, a concat piece's offset and range,
the shifted load's offset ``d * stride`` in the input's own strides) are the representative's; the
positions ``(row // inner) % dim`` follow the fitted domain extents
(:func:`stitchtune.lower.remap_positions.coord`), and so do, along an axis whose extent follows the
extents, a concat's pieces (their fitted extents: :attr:`RowSymbols.pieces
<stitchtune.lower.symbols.RowSymbols.pieces>`). So a generic kernel serves:

* a slice / concat along an axis of the iteration domain whose extent, and every extent inside it, is
  the same at every extent of the bucket, with the same start / piece extents at every extent: along
  the view's columns (static offsets within a row; the rows follow the extents through the symbolic
  row maps), also beside transpose / reshape (Llama's rotate_half after the head split, the columns
  the innermost axis), and along a row axis of static extent with static axes inside it (heads
  concatenated under a dynamic batch);
* a slice along an axis whose extent follows the extents, with static axes inside it, whose start is
  the same at every extent and whose result spans the domain's axis (``x[:, 1:]``, ``x[:, :-1]`` of
  the sequence: a constant shift, no condition);
* a concat along such an axis spanning it, with any pieces (a decode step's key / value cache
  ``[B, H, P, D]`` and the new position ``[B, H, 1, D]``, a chunked prefill's ``[B, H, C, D]`` with
  ``C`` static or dynamic; GPT-2's key and value concats in one region): piece ``k``'s condition
  ``[o_k, o_k + n_k)`` and its shift ``-o_k`` are sums of the fitted piece extents
  (:func:`~stitchtune.lower.remap_positions.moving_bounds`, :func:`~stitchtune.lower.remap_positions.moving_deltas`);
  the only negative shifts along such an axis are these (a slice's start is >= 0 and a slice inside a
  piece does not span the axis), so the lowering knows each shift's symbolic form;
* a layout chain of an input (:func:`~stitchtune.plan.chains.composed_chains`), also where its shapes
  follow the extents (:attr:`RowSymbols.shapes <stitchtune.lower.symbols.RowSymbols.shapes>`: positions
  carried back through the fitted dims).

* a slice whose start counts from the end of an axis that follows the extents (``x[:, -3:]``: ``s - 3``,
  fitted: :attr:`RowSymbols.starts <stitchtune.lower.symbols.RowSymbols.starts>`) whose result spans a
  static domain axis, alone along it, in a region without transpose / reshape or gather
  (:func:`_end_slice_refusal`).

Refused: other slices counted from an axis's end, a concat along a static axis whose pieces' extents
follow the extents, a slice / concat along an axis that follows the extents that does not span it (a
larger tensor sets the domain: conditions that would be symbolic), and one along an axis with a moving
axis inside it.
"""

from __future__ import annotations

from stitchtune.graph.dynamic import DynamicRefusal
from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Graph, Node
from stitchtune.plan.chains import domain_of, mixed_layout

__all__ = ["moving_axes", "shift_refusal"]


def moving_axes(graphs: list[Graph]) -> frozenset[int]:
    """The axes of the iteration domain whose extent differs between ``graphs`` (one dynamic graph at
    several extents); every axis where the domains' ranks differ."""
    doms = [domain_of(g) for g in graphs]
    if len({len(d) for d in doms}) > 1:
        return frozenset(range(max(len(d) for d in doms)))
    return frozenset(a for a in range(len(doms[0])) if len({d[a] for d in doms}) > 1)


def _axis(nd: Node, dom: tuple[int, ...]) -> int:
    assert nd.axis is not None  # set, normalised, by the graph's validation
    return len(dom) - len(nd.shape) + nd.axis


def _static_offsets_refusal(g: Graph, nd: Node, others: list[Graph], a: int) -> DynamicRefusal | None:
    """Why the offsets of slice / concat ``nd`` along domain axis ``a`` are not the same at every extent
    of the bucket, or None: a slice's start (``x[:, -3:]`` of a dynamic axis: ``s - 3``) and, along
    an axis whose extent stays, every piece's extent (along one that follows the extents the cache
    concat's rule decides)."""
    for o in others:
        on = o.node(nd.id)
        if nd.op == "slice" and on.start != nd.start:
            why = _end_slice_refusal(g, nd, others, a)
            if why is not None:
                return why
        if nd.op == "concat" and a not in moving_axes([g, o]) and any(
                o.spec(x).shape[nd.axis or 0] != g.spec(x).shape[nd.axis or 0] for x in nd.tensor_args):
            return DynamicRefusal(f"index op {nd.id}", f"a concat along domain axis {a} whose pieces' extents follow "
                                  "the extents: their offsets would be symbolic")
    return None


def _end_slice_refusal(g: Graph, nd: Node, others: list[Graph], a: int) -> DynamicRefusal | None:
    """Why slice ``nd``, whose start counts from the end of an axis that follows the extents (``x[:, -3:]``:
    ``s - 3``), is not one a generic kernel serves, or None: served where its result spans domain axis
    ``a`` and that axis's extent stays (a constant number of the last positions), it is the region's only
    slice / concat along ``a``, and the region has no transpose / reshape and no gather (its shift is
    then the fitted start, :attr:`RowSymbols.starts <stitchtune.lower.symbols.RowSymbols.starts>`, added
    alone along ``a`` to loads in their own strides or a layout chain's coordinates)."""
    why = f"a slice along domain axis {a} whose start counts from the end of an axis that follows the extents"
    dom = domain_of(g)
    if a in moving_axes([g, *others]) or nd.shape[nd.axis or 0] != dom[a]:
        return DynamicRefusal(f"index op {nd.id}", f"{why}, and whose result does not span a static domain axis: its "
                              "offset and conditions would be symbolic")
    if any(OPS[n.op].kind in ("slice", "concat") and n.id != nd.id and _axis(n, dom) == a for n in g.nodes):
        return DynamicRefusal(f"index op {nd.id}", f"{why}, beside another slice / concat along that axis: their "
                              "offsets would combine symbolically")
    if mixed_layout(g) or any(OPS[n.op].kind in ("gather", "gather_elements") for n in g.nodes):
        return DynamicRefusal(f"index op {nd.id}", f"{why}, in a region with transpose / reshape or a gather: its "
                              "symbolic offset is added to loads in their own strides only")
    return None


def _slice_refusal(g: Graph, nd: Node, others: list[Graph]) -> DynamicRefusal | None:
    """Why ``nd``, a slice along a domain axis whose extent follows the extents (nothing moving inside
    it), is not one a generic kernel serves (module docstring: the same start at every extent, its
    result spanning the domain's axis), or None."""
    a = _axis(nd, domain_of(g))
    for o in (g, *others):
        if o.node(nd.id).shape[nd.axis or 0] != domain_of(o)[a]:
            return DynamicRefusal(f"index op {nd.id}", f"a slice along domain axis {a}, which follows the extents, "
                                  "that does not span the axis (a larger tensor sets the domain): its conditions "
                                  "would be symbolic")
    return None


def _cache_concat_refusal(g: Graph, nd: Node, dom: tuple[int, ...]) -> DynamicRefusal | None:
    """Why ``nd``, a concat along a domain axis whose extent follows the extents (nothing moving
    inside it), is not a cache concat a generic kernel serves there (module docstring), or None."""
    a = _axis(nd, dom)
    if nd.shape[nd.axis or 0] != dom[a]:
        return DynamicRefusal(f"index op {nd.id}", f"a concat along domain axis {a}, which follows the extents, that "
                              "does not span the axis (a larger tensor sets the domain): its pieces' conditions "
                              "would not follow from their extents")
    return None


def shift_refusal(graph: Graph, others: list[Graph]) -> DynamicRefusal | None:
    """Why the slices / concats of representative graph ``graph`` keep it from a generic kernel, or None
    (module docstring); ``others``: the dynamic graph at the fit's other extents."""
    g = graph
    shifts = [nd for nd in g.nodes if OPS[nd.op].kind in ("slice", "concat")]
    if not shifts:
        return None
    moving = moving_axes([g, *others])
    dom = domain_of(g)
    for nd in shifts:
        a = _axis(nd, dom)
        inside = sorted(moving & set(range(a + 1, len(dom))))
        if inside:
            return DynamicRefusal(f"index op {nd.id}", f"a slice / concat along domain axis {a}, where axis "
                                  f"{inside[0]} inside it follows the extents: its offsets and conditions would be "
                                  "symbolic")
        why = _static_offsets_refusal(g, nd, others, a)
        if why is not None:
            return why
        if a in moving:
            why = _slice_refusal(g, nd, others) if nd.op == "slice" else _cache_concat_refusal(g, nd, dom)
            if why is not None:
                return why
    return None
