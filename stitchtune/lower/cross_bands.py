"""The per-column half of ``cross_combine`` kernel's second launch (``st_xsum``): the per-block partials
of every per-column cross reduction summed by **column bands**.

The row kernel leaves, per per-column cross reduction ``i``, ``parts`` partial rows of ``N`` floats in
the scratch buffer ``xp<i>`` (one per block of its grid, :func:`stitchtune.lower.cross.partial_buf`).
One thread per column summing its ``parts`` partials one after another (the old combine) is a chain
of ``parts`` dependent DRAM round trips in a handful of blocks: longer than the whole region's floor.
Here (:class:`BandLayout`):

* block ``b`` owns the band of ``lanes x vec`` columns starting at ``b x lanes x vec``; its thread
  ``tid`` reads columns ``band + (tid % lanes) x vec`` (one ``vec``-wide access: 128-bit at ``vec``
  4) of the partial rows ``tid // lanes + q x rows`` for ``q < passes`` (``rows = block // lanes``),
  every load issued before the first add (unrolled, in batches of :data:`UNROLL` loads when there
  are more);
* the thread adds its rows in pass order, a warp merges its ``32 // lanes`` rows by xor shuffles
  (lanes ``lanes, 2 lanes, ... 16`` apart), and the warps' sums meet in the shared buffer ``sxb``,
  laid out ``[warp][j][reduction][lane]`` so that the writers (the first ``lanes`` lanes of each warp)
  and the readers (thread ``n x lanes + t`` sums reduction ``n``'s ``vec`` columns of lane ``t`` over
  the warps, in warp order) touch consecutive words (no bank conflict);
* that thread stores the ``vec`` sums with one vector store (a mean scaled by ``1 / count``).

``lanes`` is the warp's width (32) halved while the bands are fewer than the device's SMs, down to
:data:`MIN_BAND_BYTES` per partial row, so that a 768-column layer norm's combine is 48 blocks of
three 128-bit loads per reduction instead of three blocks of 132 scalar loads.

Every sum runs in one fixed order (rows in pass order, the xor butterfly, warps in order), so the
result is bitwise reproducible whatever order the blocks run in (it is not the block-order sum of
the grid combine, which rounds differently). A float atomic add of each block's partial row into a
zeroed output (``cross_combine`` atomic, float4 where ``Device.atomic_vector_width`` allows) would
need no second pass over the partials, but its result depends on the order the blocks arrive in;
training wants the same weight gradients for the same inputs, so the deterministic choice is the
default and atomics stay a searched option. (Liger's layer-norm backward writes the same per-program
partial rows and sums them with a separate column reduction; Inductor's split reductions do the same.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stitchtune.hardware.device import Device
from stitchtune.ir import kir
from stitchtune.ir.kir import F32, I32, Assign, Bin, Const, Load, Var
from stitchtune.lower.base import Ctx, I, Lowerer, add, mul
from stitchtune.plan.cross import CrossReduction

_TID, _BID = kir.Special("tid"), kir.Special("bid")

UNROLL = 24
"""The most partial loads a thread issues together (unrolled) before it adds them."""

MIN_BAND_BYTES = 64
"""The fewest bytes of one partial row a band covers (two full 32-byte sectors)."""


@dataclass(frozen=True)
class BandLayout:
    """How the combine kernel's blocks cover the partials of ``nk`` per-column reductions of ``width``
    columns and ``parts`` partial rows (module docstring)."""

    width: int     # columns of each reduction (the row length N)
    parts: int     # partial rows (the row kernel's grid)
    nk: int        # per-column cross reductions
    block: int     # threads per block
    warp: int      # lanes per warp (the device's)
    vec: int       # columns per thread access (4: 128-bit)
    lanes: int     # threads across one band

    @property
    def band(self) -> int:
        """Columns per band (per block)."""
        return self.lanes * self.vec

    @property
    def bands(self) -> int:
        """Bands, one per block: the grid."""
        return math.ceil(self.width / self.band)

    @property
    def rows(self) -> int:
        """Partial rows a block reads in one pass."""
        return self.block // self.lanes

    @property
    def passes(self) -> int:
        """Passes over the partial rows."""
        return math.ceil(self.parts / self.rows)

    @property
    def batch(self) -> int:
        """Passes whose loads one thread issues together (all of them when ``nk x passes <= UNROLL``)."""
        return self.passes if self.nk * self.passes <= UNROLL else max(1, UNROLL // self.nk)

    @property
    def rounds(self) -> int:
        """Batches a thread issues one after another."""
        return math.ceil(self.passes / self.batch)

    @property
    def warps(self) -> int:
        return self.block // self.warp

    @property
    def smem_floats(self) -> int:
        """Floats of the shared buffer ``sxb`` (0 with one warp per block)."""
        return self.warps * self.nk * self.band if self.warps > 1 else 0


def band_layout(width: int, parts: int, nk: int, block: int, device: Device,
                max_bands: int | None = None) -> BandLayout | None:
    """The combine's layout for ``nk`` per-column reductions of ``width`` columns over ``parts``
    partial rows with ``block`` threads per block on ``device`` (module docstring), with at most
    ``max_bands`` bands (the blocks there are: None, as many as needed); None when that many blocks
    cannot cover the columns."""
    warp = device.warp_size
    vec = 4 if width % 4 == 0 else 2 if width % 2 == 0 else 1
    top = min(warp, block)
    lanes = top
    floor = max(1, MIN_BAND_BYTES // (4 * vec))
    while lanes > floor and math.ceil(width / (lanes * vec)) < device.sm_count:
        lanes //= 2
    while max_bands is not None and lanes < top and math.ceil(width / (lanes * vec)) > max_bands:
        lanes *= 2
    if max_bands is not None and math.ceil(width / (lanes * vec)) > max_bands:
        return None
    return BandLayout(width, parts, nk, block, warp, vec, lanes)


def per_column(low: Lowerer) -> list[tuple[int, CrossReduction]]:
    """The per-column cross reductions of ``low``'s plan (index in ``plan.cross``, reduction)."""
    return [(i, c) for i, c in enumerate(low.p.cross) if c.kind == "per_reduced"]


def combine_layout(low: Lowerer, parts: int) -> BandLayout:
    """The band layout of the combine kernel's per-column sums over ``parts`` partial rows."""
    lay = band_layout(low.p.N, parts, len(per_column(low)), low.s.block, low.dev)
    assert lay is not None   # (no band limit)
    return lay


def grid_bands(low: Lowerer, grid: int) -> BandLayout | None:
    """The band layout of the grid combine's per-column sums in the row kernel's ``grid`` blocks (one
    band per block, the warps' sums through ``sxk``), or None: no per-column reduction, no ``sxk``
    (one warp row group per block) or too small for the layout, or fewer blocks than bands (then one
    thread per column sums in block order, :func:`stitchtune.lower.cross.final_sums`)."""
    pcs, s = per_column(low), low.s
    groups = s.block // max(s.tpr, 32)
    if not pcs or groups < 2:
        return None
    lay = band_layout(low.p.N, grid, len(pcs), s.block, low.dev, max_bands=grid)
    return lay if lay is not None and lay.smem_floats <= groups * low.chunk else None


def band_sums(lay: BandLayout, cross: list[tuple[int, CrossReduction]], parts_of: list[str], outs: list[str],
              cx: Ctx, buf: str = "sxb", spare: bool = False) -> tuple[list[kir.Stmt], list[kir.SharedBuf]]:
    """(statements, shared buffers) of the band combine: the per-column reductions ``cross`` (index in
    the plan, reduction), their partial buffers ``parts_of`` and outputs ``outs`` (same order); block
    ``b`` sums band ``b``. ``buf``: the shared buffer of the warps' sums (at least
    ``lay.smem_floats``); ``spare``: the grid may have blocks beyond the bands (they load and store
    nothing: the grid combine runs this in every block of the row kernel)."""
    out: list[kir.Stmt] = [kir.Comment(f"cross partials by column bands: {lay.lanes} lanes x {lay.vec} columns, "
                                       f"{lay.rows} partial rows per pass, {lay.passes} passes")]
    tx, ty = cx.var("xbx", I32), cx.var("xby", I32)
    col = cx.var("xbc", I32)
    out += [Assign(tx, Bin("%", _TID, I(lay.lanes))), Assign(ty, Bin("/", _TID, I(lay.lanes))),
            Assign(col, add(mul(_BID, I(lay.band)), mul(tx, I(lay.vec))))]
    inside = Bin("<", col, I(lay.width))
    accs = [[cx.var("xba", F32) for _ in range(lay.vec)] for _ in cross]
    for (_, c), acc in zip(cross, accs):
        out += [Assign(a, _ident(c)) for a in acc]
    if lay.rounds == 1:
        out += _batch(lay, cross, parts_of, accs, cx, None, ty, col, inside, spare)
    else:
        o = cx.var("xbo", I32)
        out.append(kir.For(o, I(0), I(lay.rounds), 1,
                           tuple(_batch(lay, cross, parts_of, accs, cx, o, ty, col, inside, spare))))
    for (_, c), acc in zip(cross, accs):   # the rows of a warp: lanes with the same columns are `lanes` apart
        for a in acc:
            m = lay.lanes
            while m < lay.warp:
                out.append(Assign(a, Bin(c.combine, a, kir.Shfl(a, m, lay.warp))))
                m *= 2
    if lay.warps == 1:
        for n, ((_, c), acc) in enumerate(zip(cross, accs)):
            vals = tuple(_scaled(c, a) for a in acc)
            out.append(kir.StoreVec(outs[n], col, vals, Bin("&&", Bin("<", _TID, I(lay.lanes)), inside)))
        return out, []
    return out + _across_warps(lay, cross, outs, accs, cx, buf), [kir.SharedBuf(buf, lay.smem_floats)]


def _batch(lay: BandLayout, cross: list[tuple[int, CrossReduction]], parts_of: list[str], accs: list[list[Var]],
           cx: Ctx, o: Var | None, ty: Var, col: Var, inside: kir.Expr, spare: bool) -> list[kir.Stmt]:
    """One batch of passes (``o``: the batch's loop variable; None: the only batch): every load first,
    then the adds in pass order."""
    loads: list[kir.Stmt] = []
    adds: list[kir.Stmt] = []
    for q in range(lay.batch):
        if o is None:
            first = q * lay.rows    # the pass's first partial row
            row: kir.Expr = add(I(first), ty)
            full = first + lay.rows <= lay.parts and lay.width % lay.band == 0 and not spare
        else:
            row, full = add(mul(add(mul(o, I(lay.batch)), I(q)), I(lay.rows)), ty), False
        ok = None if full else Bin("&&", Bin("<", row, I(lay.parts)), inside)
        index = add(mul(Bin("min", row, I(lay.parts - 1)), I(lay.width)), Bin("min", col, I(lay.width - lay.vec)))
        for (_, c), part, acc in zip(cross, parts_of, accs):
            dst = tuple(cx.var("xbl", F32) for _ in range(lay.vec))
            if ok is not None:
                loads += [Assign(d, _ident(c)) for d in dst]
            loads.append(kir.LoadVec(dst, part, index, ok))
            adds += [Assign(a, Bin(c.combine, a, d)) for a, d in zip(acc, dst)]
    return loads + adds


def _across_warps(lay: BandLayout, cross: list[tuple[int, CrossReduction]], outs: list[str],
                  accs: list[list[Var]], cx: Ctx, buf: str) -> list[kir.Stmt]:
    """The warps' sums through ``sxb`` (``[warp][j][reduction][lane]``), then one vector store per
    (reduction, lane) by thread ``reduction x lanes + lane``."""
    out: list[kir.Stmt] = []
    nkl = lay.nk * lay.lanes
    warp, lane = Bin("/", _TID, I(lay.warp)), Bin("%", _TID, I(lay.warp))
    writer = Bin("<", lane, I(lay.lanes))
    for n, acc in enumerate(accs):
        for j, a in enumerate(acc):
            at = add(add(mul(add(mul(warp, I(lay.vec)), I(j)), I(nkl)), I(n * lay.lanes)), lane)
            out.append(kir.StoreVec(buf, Bin("min", at, I(lay.smem_floats - 1)), (a,), writer))
    out.append(kir.Barrier())
    me = _TID   # (inside the If below: tid < nk x lanes)
    col = add(mul(_BID, I(lay.band)), mul(Bin("%", _TID, I(lay.lanes)), I(lay.vec)))
    for n, (_, c) in enumerate(cross):
        body: list[kir.Stmt] = []
        vals: list[kir.Expr] = []
        for j in range(lay.vec):
            v = cx.var("xbs", F32)
            body.append(Assign(v, _ident(c)))
            for w in range(lay.warps):
                body.append(Assign(v, Bin(c.combine, v, Load(buf, add(I((w * lay.vec + j) * nkl), me)))))
            vals.append(_scaled(c, v))
        body.append(kir.StoreVec(outs[n], col, tuple(vals), Bin("<", col, I(lay.width))))
        out.append(kir.If(Bin("==", Bin("/", _TID, I(lay.lanes)), I(n)), tuple(body)))
    return out


def _ident(c: CrossReduction) -> Const:
    return Const({"+": 0.0, "max": -math.inf, "min": math.inf}[c.combine], F32)


def _scaled(c: CrossReduction, v: kir.Expr) -> kir.Expr:
    return Bin("*", v, Const(1.0 / c.count, F32)) if c.mean else v
