"""Shifted evaluations of a remapped region (:mod:`stitchtune.plan.remap`): a :class:`Shift` (evaluate
at domain position ``p + delta`` under conditions on ``p``) and the bounds proofs of its loads.

Contract
--------
* :func:`offset_of`: the element offset of a shift in a tensor of a given shape, or the
  :class:`~stitchtune.plan.refusal.Refusal` naming the node unless every position the conditions
  allow, shifted, lies inside the tensor.
* :func:`column_offset`: in a mixed region, the column offset of a shift that may move the innermost
  domain axis only (refused otherwise, or when a shifted column falls outside the domain).
* :func:`spans`: whether a tensor spans the domain (each dim 1 or the domain's);
  :func:`size1_slice_refusal`: a size-1 slice broadcast over several positions is refused.
* :func:`shift_offset`, :func:`column_shift`, :func:`check_size1_slice`: the same, raising
  :class:`~stitchtune.errors.UnsupportedGraphError` with the refusal's message: for the lowering
  (:mod:`stitchtune.lower.remap`, :mod:`stitchtune.lower.col_remap`), which loads what the planner's
  walk (:func:`stitchtune.plan.remap.check_remaps`) proved, so that a refusal there is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from stitchtune.graph.parse import Graph, Node
from stitchtune.plan.pick import node_axis as _axis
from stitchtune.plan.refusal import Refusal

__all__ = ["Shift", "check_size1_slice", "column_offset", "column_shift", "offset_of", "shift_offset", "size1_slice_refusal",
           "spans"]


@dataclass(frozen=True)
class Shift:
    """Evaluate at domain position ``p + delta`` for positions with ``lo <= p[axis] < hi``."""

    delta: tuple[tuple[int, int], ...] = ()       # (domain axis, d), sorted, d != 0
    conds: tuple[tuple[int, int, int], ...] = ()  # (domain axis, lo, hi), one per axis, sorted

    @property
    def identity(self) -> bool:
        return not self.delta and not self.conds

    def d(self, axis: int) -> int:
        return dict(self.delta).get(axis, 0)

    def moved(self, axis: int, by: int) -> "Shift":
        dd = dict(self.delta)
        dd[axis] = dd.get(axis, 0) + by
        return replace(self, delta=tuple(sorted((a, v) for a, v in dd.items() if v)))

    def limited(self, axis: int, lo: int, hi: int, dim: int) -> "Shift | None":
        """With ``lo <= p[axis] < hi`` added (None when no position of ``[0, dim)`` is left)."""
        cs = dict((a, (l, h)) for a, l, h in self.conds)
        ol, oh = cs.get(axis, (0, dim))
        lo, hi = max(lo, ol, 0), min(hi, oh, dim)
        if lo >= hi:
            return None
        if lo == 0 and hi == dim:
            cs.pop(axis, None)
        else:
            cs[axis] = (lo, hi)
        return replace(self, conds=tuple(sorted((a, l, h) for a, (l, h) in cs.items())))

    def axes(self) -> set[int]:
        return {a for a, _ in self.delta} | {a for a, _, _ in self.conds}


def shift_offset(who: str, shape: tuple[int, ...], sh: Shift, domain: tuple[int, ...]) -> int:
    """The element offset of ``sh``'s delta in a tensor of ``shape`` (right-aligned to ``domain``,
    its own strides), for the lowering, where the planner has proven the load (:func:`offset_of`):
    :class:`UnsupportedGraphError` naming ``who`` where it is not."""
    off = offset_of(who, shape, sh, domain)
    if isinstance(off, Refusal):
        raise off.error()
    return off


def offset_of(who: str, shape: tuple[int, ...], sh: Shift, domain: tuple[int, ...]) -> int | Refusal:
    """The element offset of :func:`shift_offset`, or the :class:`~stitchtune.plan.refusal.Refusal`
    naming ``who`` unless every position the conditions allow, shifted, lies inside the tensor (an
    axis of size 1 broadcasts: no offset)."""
    off = len(domain) - len(shape)
    conds = {a: (lo, hi) for a, lo, hi in sh.conds}
    delta = 0
    for k, dim in enumerate(shape):
        a = off + k
        if dim == 1:
            continue
        lo, hi = conds.get(a, (0, domain[a]))
        d = sh.d(a)
        if lo + d < 0 or hi - 1 + d > dim - 1:
            return Refusal(
                f"node '{who}': positions [{lo + d}, {hi + d}) along axis {a} fall outside its size {dim}; "
                "a slice/concat that reads outside a tensor is not supported")
        delta += d * prod(shape[k + 1:])
    return delta


def spans(graph: Graph, name: str, domain: tuple[int, ...]) -> bool:
    shape = graph.spec(name).shape
    off = len(domain) - len(shape)
    return all(s == 1 or s == domain[off + k] for k, s in enumerate(shape))


def column_shift(who: str, sh: Shift, domain: tuple[int, ...], width: int | None = None) -> int:
    """The column offset of :func:`column_offset`, for the lowering, where the planner has proven the
    load: :class:`UnsupportedGraphError` naming ``who`` where it is not."""
    d = column_offset(who, sh, domain, width)
    if isinstance(d, Refusal):
        raise d.error()
    return d


def column_offset(who: str, sh: Shift, domain: tuple[int, ...], width: int | None = None) -> int | Refusal:
    """In a mixed region (:func:`~stitchtune.plan.view_checks.check_mixed`): the column offset of ``sh``, which may shift and
    limit the innermost domain axis (the view's columns) only; the :class:`~stitchtune.plan.refusal.Refusal` naming
    ``who`` unless every column the conditions allow, shifted, lies in ``[0, domain[-1])``. The load
    of view element ``(r, c + d)`` is then in bounds by the index map's contract. ``width``: an input
    wider than the domain along that axis (:func:`~stitchtune.plan.chains.wide_inputs`, its own row
    strides), whose columns ``[0, width)`` are in bounds."""
    last = len(domain) - 1
    if sh.axes() - {last}:
        return Refusal(
            f"node '{who}': a slice/concat along an outer axis reads it through a transpose / reshape (or "
            "it does not have the iteration domain's layout); there slice and concat may act along the innermost "
            "axis only")
    lo, hi = {a: (l, h) for a, l, h in sh.conds}.get(last, (0, domain[last]))
    d = sh.d(last)
    size = domain[last] if width is None else width
    if lo + d < 0 or hi - 1 + d > size - 1:
        return Refusal(
            f"node '{who}': positions [{lo + d}, {hi + d}) along the innermost axis fall outside its size "
            f"{size}; a slice/concat that reads outside a tensor is not supported")
    return d


def check_size1_slice(nd: Node, sh: Shift, domain: tuple[int, ...]) -> None:
    """:class:`UnsupportedGraphError` where :func:`size1_slice_refusal` refuses."""
    refused = size1_slice_refusal(nd, sh, domain)
    if refused is not None:
        raise refused.error()


def size1_slice_refusal(nd: Node, sh: Shift, domain: tuple[int, ...]) -> Refusal | None:
    """A size-1 slice evaluated over several positions of its axis (broadcast) is refused (the
    :class:`~stitchtune.plan.refusal.Refusal` naming it); None otherwise."""
    a = len(domain) - len(nd.shape) + _axis(nd)
    lo, hi = {x: (l, h) for x, l, h in sh.conds}.get(a, (0, domain[a]))
    if nd.shape[_axis(nd)] == 1 and hi - lo > 1:
        return Refusal(
            f"slice '{nd.id}' has size 1 along axis {nd.axis} and is broadcast against the iteration "
            f"domain {list(domain)} there; not supported (a size-1 slice may be a concat piece, or be stored)")
    return None
