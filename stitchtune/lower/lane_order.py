"""Piece-major lanes: an element-wise kernel whose row is cut into concat pieces keeps every warp in one piece.

The row family gives thread ``tid`` the lane ``tid % tpr`` of row ``tid / tpr`` of its block (the
lanes of a row adjacent in a warp). A concat along the view's columns is evaluated per lane under the
condition that selects its piece (:mod:`stitchtune.lower.remap`): each piece's loads are predicated
on ``c`` in the piece's range. With pieces narrower than a warp's columns (Llama's rotate_half: two
pieces of 32 floats in a 64-float row, 8 lanes each at ``vec = 4``) every warp request of a piece's
load has only the lanes of that piece active: 16 of 32 lanes per load in the rotary kernels
(78% active lanes over the kernel, issue 39).

*Piece-major* order maps the block's threads so that the 32 lanes of a warp hold the same piece of
``32 / P`` consecutive rows (``P`` lanes per piece): a load predicated on the piece is then either
taken by every lane of a warp or by none (no request). The rows' elements, the vectors and so the
values and addresses are the same; only which thread holds which (row, lane) changes, a bijection
within the block. Each piece of a row is a whole number of 32-byte sectors (:func:`piece_lanes`
requires it), so every request stays at its ideal sectors.

The same order serves a region that reads an input along the view's rows (``plan.adjacent_rows = G``,
:mod:`stitchtune.plan.adjacent`: GPT-2's k gradient in its training concat): ``P = warp / G`` lanes a
row, so a warp's scalar loads of that input cover ``G`` consecutive rows, one sector, per lane column
(was: one sector per element, 8x), and its accesses along the columns ``P * vec`` elements a row.

A row-vector kernel whose mapping takes column shifts from other lanes (:mod:`stitchtune.plan.lane_shifts`:
a butterfly shuffle between the lanes of one row) keeps the row-major order: :func:`piece_lanes` returns None.

Contract: :func:`piece_lanes` returns ``warp / G`` for a plan with ``adjacent_rows = G`` under the
same conditions below (pieces of ``P * vec`` columns), else ``P`` only for a static element-wise plan (no reductions, no
cross reductions, no scatters' row reductions: nothing exchanges values between the lanes of a row)
of split 1 whose concat piece boundaries along the view's columns (and the slice starts that move
them) are all multiples of ``P * vec`` columns, with ``P`` a divisor of the device's warp size
smaller than it, ``tpr`` a multiple of ``P`` larger than it, the block's rows a multiple of
``warp / P``, and a piece at least one sector of every tensor's element size; else None (the
row-major order). :func:`thread_coords` gives the (lane, row in block) expressions of either order.
"""

from __future__ import annotations

from functools import reduce
from math import gcd, prod

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Graph
from stitchtune.ir import kir
from stitchtune.ir.kir import Bin
from stitchtune.ir.sectors import SECTOR_BYTES
from stitchtune.lower.base import I, add, mul
from stitchtune.lower.index_chain import node_axis, split_axes
from stitchtune.plan.chains import domain_of, mixed_layout
from stitchtune.plan.family import Family
from stitchtune.plan.lane_shifts import exchanges
from stitchtune.plan.planner import StitchPlan
from stitchtune.space import Schedule

__all__ = ["column_period", "piece_lanes", "thread_coords"]

def column_period(graph: Graph, plan: StitchPlan) -> int | None:
    """The largest column count that divides every concat piece boundary along the view's columns and
    every slice start along them (in view columns); None without a concat along the columns."""
    domain = domain_of(graph)
    D = len(domain)
    col_axes = (D - 1,) if mixed_layout(graph) else split_axes(domain, plan.M)[1]
    cuts: list[int] = []
    has_concat = False
    for nd in graph.nodes:
        if OPS[nd.op].kind not in ("concat", "slice"):
            continue
        a = D - len(nd.shape) + node_axis(nd)
        if a not in col_axes:
            continue
        inner = prod(domain[b] for b in col_axes if b > a)
        if nd.op == "slice":
            cuts.append(int(nd.start) * inner)
            continue
        has_concat = True
        o = 0
        for arg in nd.tensor_args[:-1]:
            o += graph.spec(arg).shape[node_axis(nd)]
            cuts.append(o * inner)
    cuts = [c for c in cuts if c]
    if not has_concat or not cuts:
        return None
    return reduce(gcd, cuts)


def piece_lanes(graph: Graph, plan: StitchPlan, s: Schedule, warp: int, dynamic: bool = False,
                rows: int = 1) -> int | None:
    """Lanes per piece for the piece-major order (module docstring), or None for the row-major one: the
    lanes of ``plan.adjacent_rows`` rows in a warp where the plan has an input read along its rows
    (:mod:`stitchtune.plan.adjacent`), else the lanes of a concat piece. ``rows``: the view rows a thread
    takes (row vectors, :mod:`stitchtune.lower.row_vectors`): a warp then spans ``adjacent_rows / rows`` of
    its threads' row groups."""
    if (dynamic or plan.family != Family.ELEMENTWISE or plan.reductions or plan.cross or s.split != 1
            or s.tpr <= 0 or s.vec <= 0):
        return None
    if rows > 1 and exchanges(plan.vector_visits, s.tpr, s.vec, warp):
        return None   # a row's lanes adjacent in one warp: column shifts taken by shuffles (plan/lane_shifts.py)
    G = plan.adjacent_rows // max(1, rows)
    if G > 1 and warp % G == 0 and _fits(graph, s, warp, warp // G, (warp // G) * s.vec):
        return warp // G
    w = column_period(graph, plan)
    if w is None or w % s.vec:
        return None
    P = w // s.vec
    return P if _fits(graph, s, warp, P, w) else None


def _fits(graph: Graph, s: Schedule, warp: int, P: int, w: int) -> bool:
    """``P`` lanes per piece of ``w`` columns: a divisor of the warp below it, of ``tpr`` below it, the
    block's rows a whole number of ``warp / P`` row groups, ``w`` columns whole sectors of every tensor."""
    if not (0 < P < warp and warp % P == 0 and s.tpr % P == 0 and s.tpr > P):
        return False
    rows = s.block // s.tpr
    if rows <= 0 or rows % (warp // P):
        return False
    dtypes = [sp.dtype for _, sp in graph.inputs] + [graph.spec(o).dtype for o in graph.outputs]
    return not any((w * kir.ELEM_BYTES.get(d, 4)) % SECTOR_BYTES for d in dtypes)


def thread_coords(tid: kir.Expr, tpr: int, warp: int, P: int | None) -> tuple[kir.Expr, kir.Expr]:
    """(lane in its row, row in the block) of thread ``tid``: row-major (``tid % tpr``, ``tid / tpr``)
    for ``P`` None; piece-major for ``P`` lanes per piece: the threads form groups of ``G = warp / P``
    consecutive rows (``G * tpr`` threads); warp ``w`` of a group holds piece ``w`` of the group's rows,
    thread ``tid`` lane ``tid % P`` of that piece on row ``(tid / P) % G`` of its group. A bijection
    of the block's threads onto (row, lane) whenever :func:`piece_lanes` allows ``P``."""
    if P is None:
        return Bin("%", tid, I(tpr)), Bin("/", tid, I(tpr))
    G = warp // P
    sub = Bin("%", tid, I(P))
    r_in = Bin("%", Bin("/", tid, I(P)), I(G))
    piece = Bin("%", Bin("/", tid, I(warp)), I(tpr // P))
    group = Bin("/", tid, I(G * tpr))
    return add(mul(piece, I(P)), sub), add(mul(group, I(G)), r_in)
