"""Column shifts by lane exchange: a concat piece read at a column shift taken from another lane of the warp.

An element-wise row kernel evaluates a ``concat`` / ``slice`` along the view's columns at a *shifted*
position (:mod:`stitchtune.lower.remap`): Llama's rotary gradient reads its rotated half at column
``c + 32`` where ``c < 32`` and at ``c - 32`` where ``c >= 32``, each time loading the inputs under it
again, predicated on the piece. Where those inputs are transposed layout chains loaded with row vectors
(:mod:`stitchtune.plan.adjacent`, ``plan.vector_rows``), each shift is another ``R``-row vector load per
chain and column, held with the unshifted ones: Llama's ``view_68`` reads 4 chains at 3 shifts, 12 loads
per element (188 registers with row vectors, ptxas sm_90), where 4 carry every value it uses.

When the lanes of a row are adjacent lanes of one warp (the row-major order of
:func:`stitchtune.lower.lane_order.thread_coords`) and the whole row is one sweep iteration
(``tpr * vec == N``), the value at column ``c + d`` is the unshifted value of the lane ``d / vec``
lanes further on, in the same rows. :func:`xor_mask` says when that lane is ``lane ^ m`` for every lane
whose columns the shift's conditions select (a butterfly: ``__shfl_xor_sync``, the one shuffle the
kernel IR has), so the shifted value is one shuffle of the unshifted one, computed by every lane anyway.

Contract: :func:`xor_mask` returns ``m`` only for a shift along the innermost domain axis alone, which
is the view's one column axis of ``N = tpr * vec`` columns (``tpr`` a power of two), ``d`` a multiple of ``vec`` with ``m = |d| /
vec`` a power of two below ``tpr`` and the warp, its conditions (on that axis only) selecting whole vectors, and
``L ^ m == L + d / vec`` for every selected lane ``L``; else None. :func:`loads_with` counts the
row-vector loads per element a kernel of ``(tpr, vec)`` makes when every such shift is exchanged
(the other shifts still load). :func:`exchanges` says whether a row-vector kernel of that mapping
exchanges any (the lowering then keeps the row-major lane order).
"""

from __future__ import annotations

from collections.abc import Iterable

from stitchtune.plan.shift import Shift

__all__ = ["ColumnVisit", "xor_mask", "visit_mask", "loads_with", "exchanges"]

#: a transposed chain read at a column shift: (head, d, lo, hi), its columns ``lo <= c < hi`` (the whole row
#: ``0, N`` without a condition), ``d = 0`` for the unshifted read
ColumnVisit = tuple[str, int, int, int]


def xor_mask(sh: Shift, domain: tuple[int, ...], N: int, tpr: int, vec: int, warp: int) -> int | None:
    """The lane mask ``m`` whose butterfly partner holds column ``c + d`` of the same rows for every lane whose
    columns ``sh`` selects (module docstring), or None; ``warp``: the device's lanes per warp (a row's lanes start
    at a multiple of ``min(tpr, warp)`` in it)."""
    D = len(domain)
    if not sh.delta or D == 0 or N != domain[-1] or tpr <= 1 or vec <= 0 or tpr * vec != N:
        return None
    if any(a != D - 1 for a, _ in sh.delta) or any(a != D - 1 for a, _, _ in sh.conds):
        return None
    lo, hi = next(((lo, hi) for _, lo, hi in sh.conds), (0, N))
    return _mask(sh.d(D - 1), lo, hi, tpr, vec, warp)


def _mask(d: int, lo: int, hi: int, tpr: int, vec: int, warp: int) -> int | None:
    if d == 0 or d % vec or tpr & (tpr - 1):   # (a shuffle's segment: a power of two)
        return None
    step = d // vec
    m = abs(step)
    if m & (m - 1) or m >= min(tpr, warp):
        return None
    for lane in range(tpr):
        inside = [lo <= c < hi for c in range(lane * vec, lane * vec + vec)]
        if any(inside) and (not all(inside) or lane ^ m != lane + step):
            return None
    return m


def visit_mask(v: ColumnVisit, tpr: int, vec: int, warp: int) -> int | None:
    """:func:`xor_mask` of a recorded column visit (``N = tpr * vec``)."""
    _, d, lo, hi = v
    return _mask(d, lo, hi, tpr, vec, warp)


def exchanges(visits: Iterable[ColumnVisit], tpr: int, vec: int, warp: int) -> bool:
    """A row-vector kernel of ``tpr`` lanes of ``vec`` columns exchanges some shifted read of ``visits``."""
    return any(visit_mask(v, tpr, vec, warp) is not None for v in visits)


def loads_with(total: int, visits: Iterable[ColumnVisit], tpr: int, vec: int, warp: int) -> int:
    """The row-vector loads per element (``total`` without exchanges, ``plan.vector_loads``) of a kernel of
    ``tpr`` lanes of ``vec`` columns: each exchanged visit loads nothing, and a chain exchanged with no
    unshifted read of its own loads once unshifted (the partner lane's value)."""
    vs = list(visits)
    swapped = [v for v in vs if visit_mask(v, tpr, vec, warp) is not None]
    plain = {h for h, d, _, _ in vs if d == 0}
    return total - len(swapped) + len({h for h, _, _, _ in swapped} - plain)
