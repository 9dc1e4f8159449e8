"""Which slices / concats a generic kernel serves (:mod:`stitchtune.lower.dynamic`), as data.

Contract
--------
:func:`shift_refusal` answers, for the representative graph of a bucket and the same dynamic graph
at other extents (the fit's plans), None or the :class:`~stitchtune.graph.dynamic.DynamicRefusal` of the
first slice / concat a generic kernel cannot serve, saying why.

A remap's numbers (:mod:`stitchtune.lower.remap`: a slice's start, a concat piece's offset and range,
the shifted load's offset ``d * stride`` in the input's own strides) are static in the lowering; the
positions ``(row // inner) % dim`` follow the fitted domain extents
(:func:`stitchtune.lower.remap_positions.coord`). So a generic kernel serves:

* a slice / concat along an axis of the iteration domain whose extent, and every extent inside it, is
  the same at every extent of the bucket: along the view's columns (static offsets within a row; the
  rows follow the extents through the symbolic row maps), also beside transpose / reshape (Llama's
  rotate_half after the head split, the columns the innermost axis), and along a row axis of static
  extent with static axes inside it (heads concatenated under a dynamic batch);
* concats along an axis whose extent follows the extents, with static axes inside it, each spanning
  the axis with pieces after the first of one position each (a decode step's key / value cache
  ``[B, H, P, D]`` and the new position ``[B, H, 1, D]``: ``P + 1`` in all; GPT-2's key and value
  concats in one region): the pieces' conditions are the fitted extent minus constants
  (:func:`~stitchtune.lower.remap_positions.moving_bounds`: piece ``k`` of ``n`` ends ``n - 1 - k``
  positions before the extent, the same condition for every such concat, so several share them),
  the later pieces' offsets never reach an address (their size 1 there), the first piece's is 0;
* a layout chain of an input (:func:`~stitchtune.plan.chains.composed_chains`, carried back through its
  shapes) whose members keep their shapes at every extent.

Refused: any other slice / concat along an axis that follows the extents or outside one (a slice
of the sequence ``x[:, 1:]``, a concat of two dynamic pieces or one that does not span the axis:
offsets that would be symbolic), and a
chain whose shapes follow the extents.
"""

from __future__ import annotations

from stitchtune.graph.dynamic import DynamicRefusal
from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Graph, Node
from stitchtune.plan.chains import composed_chains, domain_of

__all__ = ["moving_axes", "shift_refusal"]


def moving_axes(graphs: list[Graph]) -> frozenset[int]:
    """The axes of the iteration domain whose extent differs between ``graphs`` (one dynamic graph at
    several extents); every axis where the domains' ranks differ."""
    doms = [domain_of(g) for g in graphs]
    if len({len(d) for d in doms}) > 1:
        return frozenset(range(max(len(d) for d in doms)))
    return frozenset(a for a in range(len(doms[0])) if len({d[a] for d in doms}) > 1)


def _moved_tensors(g: Graph, others: list[Graph]) -> frozenset[str]:
    """The tensors of ``g`` whose shape differs in some graph of ``others``."""
    names = [n for n, _ in g.inputs] + [nd.id for nd in g.nodes]
    return frozenset(n for n in names if any(tuple(o.spec(n).shape) != tuple(g.spec(n).shape) for o in others))


def _axis(nd: Node, dom: tuple[int, ...]) -> int:
    assert nd.axis is not None  # set, normalised, by the graph's validation
    return len(dom) - len(nd.shape) + nd.axis


def _cache_concat_refusal(g: Graph, nd: Node, dom: tuple[int, ...]) -> DynamicRefusal | None:
    """Why ``nd``, a slice / concat along a domain axis whose extent follows the extents (nothing moving
    inside it), is not a cache concat a generic kernel serves there (module docstring), or None."""
    a = _axis(nd, dom)
    if nd.op != "concat":
        return DynamicRefusal(f"index op {nd.id}", f"a slice along domain axis {a}, which follows the extents: its "
                              "start and stop would be symbolic")
    if nd.shape[nd.axis or 0] != dom[a] or any(g.spec(x).shape[nd.axis or 0] != 1 for x in nd.tensor_args[1:]):
        return DynamicRefusal(f"index op {nd.id}", f"a concat along domain axis {a}, which follows the extents, that "
                              "does not span the axis or whose pieces after the first are not one position each: "
                              "their offsets would be symbolic")
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
        if a in moving:
            why = _cache_concat_refusal(g, nd, dom)
            if why is not None:
                return why
    moved = _moved_tensors(g, others)
    for head, chain in composed_chains(g).items():
        if moved & set(chain):
            return DynamicRefusal(f"index op {shifts[0].id}", f"a slice / concat beside the layout chain of input "
                                  f"{ascii(chain[-1])} (head {ascii(head)}), whose shapes follow the extents: the "
                                  "chain's transposes / reshapes carry positions back through static shapes")
    return None
