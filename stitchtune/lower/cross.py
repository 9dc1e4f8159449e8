"""Lowering of cross reductions (:mod:`stitchtune.plan.cross`) in the last kernel of a row-family program.

Phases (each a function below, called by :class:`stitchtune.lower.row.RowKernel`):

1. :func:`cross_layout`: the per-thread accumulators (``xa<i>``: one row piece of ``per_thread`` floats
   per per-column reduction, in registers; a scalar variable per scalar reduction) and the shared
   exchange buffers (``sxk``: one row piece per warp row group, used by the per-column reductions one
   after another; ``sxs``: one float per warp), sized by
   :func:`stitchtune.space.options.cross_smem_floats` (the space checks the same figure).
2. :func:`cross_init` (before the round loop) zeroes the accumulators; :func:`cross_accumulate`
   (in the output sweep) adds each element of a full-size source to the thread's accumulator of its
   column (or its scalar); :func:`cross_accumulate_rows` (once per task) adds a per-row source's
   value, on the row's first lane.
3. :func:`cross_epilogue` (after the round loop, reached by every thread): the block reduces its
   accumulators (shuffles across the sub-warp rows of a warp, then shared memory across the warp row
   groups: ``sxk`` holds one reduction at a time, element-major so that stores and loads are
   conflict-free, and each thread sums the groups of ``vec`` consecutive columns, stored with one
   vector access; shuffles + shared memory across the warps for a scalar), then combines across blocks per
   ``Schedule.cross_combine``: ``atomic`` adds the block's value (a mean: scaled by ``1 / count``) to
   the output, zeroed by the small kernel of :func:`zero_kernel` launched first; ``grid`` stores it to
   the per-block partials ``xp<i>`` (scratch, ``grid x width`` floats, every element written before it
   is read), passes a grid barrier and sums the partials: the per-column ones by column bands, one
   per block, through ``sxk`` (:func:`~stitchtune.lower.cross_bands.grid_bands`; else one thread per
   column), the scalar ones in block order (:func:`final_sums`); ``kernel`` stores the partials and
   :func:`combine_kernel` (a second launch) sums them: the per-column ones by column bands
   (:mod:`stitchtune.lower.cross_bands`: 128-bit loads, all issued before the first add, summed in a
   fixed order), the scalar ones in block order. ``grid`` and ``kernel`` are bitwise reproducible
   whatever order the blocks run in; ``atomic`` is not.
   ``max`` / ``min`` cross reductions combine with their own op from its neutral element (-inf / +inf)
   at every step (the space allows ``atomic`` for sums and means only: ``cross_atomic``).
4. :func:`epilogue` (``grid`` and ``kernel``, after the final combine): the scalar epilogue nodes
   (``plan.epilogue``) from the scalar results and the one-element inputs it loads (the second kernel
   of ``kernel`` then takes them as parameters), stored by thread 0 of block 0; a cross reduction
   that is not an output is never stored.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from stitchtune.ir import kir
from stitchtune.ir.kir import F32, I32, Assign, Bin, BufferRole, Const, Load, LocalRef, Select, Var
from stitchtune.lower.base import Ctx, I, Lowerer, add, mul
from stitchtune.lower.sweep_values import SweepValues
from stitchtune.lower.builder import RowKernelBuilder, RowSweep
from stitchtune.lower.cross_bands import band_sums, combine_layout, grid_bands
from stitchtune.plan.cross import CrossReduction
from stitchtune.space.option_values import CrossCombine
from stitchtune.space.options import CROSS_COMBINE, cross_smem_floats

_TID, _BID = kir.Special("tid"), kir.Special("bid")


SMALL_KERNEL_REGISTERS = 32
"""The register estimate of the small zeroing and combine kernels (replaced by ptxas figures after the build)."""


def _f(x: float) -> Const:
    return Const(float(x), F32)


def _per_col(low: Lowerer) -> list[tuple[int, CrossReduction]]:
    return [(i, c) for i, c in enumerate(low.p.cross) if c.kind == "per_reduced"]


def _scalars(low: Lowerer) -> list[tuple[int, CrossReduction]]:
    return [(i, c) for i, c in enumerate(low.p.cross) if c.kind == "scalar"]


def _scale(c: CrossReduction) -> float:
    return 1.0 / c.count if c.mean else 1.0


def _ident(c: CrossReduction) -> Const:
    """The neutral element of ``c``'s combine: 0 for sums, -inf for max, +inf for min."""
    return _f({"+": 0.0, "max": -math.inf, "min": math.inf}[c.combine])


def _comb(c: CrossReduction, a: kir.Expr, b: kir.Expr) -> kir.Expr:
    return Bin(c.combine, a, b)


def cross_layout(low: Lowerer) -> tuple[list[kir.SharedBuf], list[kir.LocalArray], bool]:
    """(shared buffers, local arrays, needs a grid barrier) of the cross reductions of ``low``'s plan."""
    s, nk, ns = low.s, len(_per_col(low)), len(_scalars(low))
    shared: list[kir.SharedBuf] = []
    groups = s.block // max(s.tpr, 32)
    if nk and groups > 1:
        shared.append(kir.SharedBuf("sxk", groups * low.chunk))   # one row piece per group, each reduction in turn
    if ns and s.block > 32:
        shared.append(kir.SharedBuf("sxs", ns * (s.block // 32)))
    assert 4 * sum(b.size for b in shared) == 4 * cross_smem_floats(s.tpr, s.block, low.chunk, nk, ns)
    locals_ = [kir.LocalArray(f"xa{i}", low.per_thread) for i, _ in _per_col(low)]
    return shared, locals_, s.option(CROSS_COMBINE) == CrossCombine.GRID


def cross_init(k: RowKernelBuilder) -> dict[int, Var]:
    """Zero the accumulators before the round loop (:meth:`~stitchtune.lower.builder.RowKernelBuilder.emit_before_rounds`); returns the scalar
    accumulator variable of each scalar cross reduction (by index in ``plan.cross``)."""
    low = k.low
    e = k.var("xe", I32)
    for i, c in _per_col(low):
        k.emit_before_rounds(kir.For(e, I(0), I(low.per_thread), 1, (kir.SetLocal(f"xa{i}", e, _ident(c)),), unroll=True))
    accs = {}
    for i, c in _scalars(low):
        accs[i] = k.var("xs", F32)
        k.emit_before_rounds(Assign(accs[i], _ident(c)))
    return accs


def cross_accumulate(k: RowKernelBuilder, sw: RowSweep, sv: SweepValues, body: list[kir.Stmt]) -> None:
    """In the output sweep: each full-size source element into its column's (or the scalar) accumulator."""
    low = k.low
    for i, c in enumerate(low.p.cross):
        if not c.source_full:
            continue
        vals = sv.value(c.source)
        for j in range(low.s.vec):
            if c.kind == "per_reduced":
                idx = k.cache_index(sw, j)
                cur = LocalRef(f"xa{i}", idx)
                body.append(kir.SetLocal(f"xa{i}", idx, Select(sw.valid, _comb(c, cur, vals[j]), cur)))
            else:
                a = k.cross_accumulator(i)
                body.append(Assign(a, Select(sw.valid, _comb(c, a, vals[j]), a)))


def cross_accumulate_rows(k: RowKernelBuilder) -> None:
    """Once per task (round body, after the stages): each per-row source value into its scalar
    accumulator, on the row's first lane of its first split block."""
    low, ix = k.low, k.ix
    lead = Bin("&&", ix.rvalid, Bin("&&", Bin("==", ix.lane, I(0)), Bin("==", ix.sidx, I(0))))
    for i, c in enumerate(low.p.cross):
        if c.source_full:
            continue
        v = k.value_of(c.source)
        v = k.load_p(c.source) if v is None else v
        a = k.cross_accumulator(i)
        k.emit(Assign(a, Select(lead, _comb(c, a, v), a)))


def _column(k: RowKernelBuilder, e: int) -> kir.Expr:
    """The column of accumulator element ``e`` (= i * vec + j) of this thread."""
    s = k.low.s
    i, j = divmod(e, s.vec)
    return add(mul(add(I(i * s.tpr), k.ix.lane), I(s.vec)), I(j))


def _warp_sum(out: list[kir.Stmt], get: Callable[[], kir.Expr], put: Callable[[kir.Expr], kir.Stmt],
              masks: list[int], op: str = "+") -> None:
    """Combine (``op``: ``+``, ``max``, ``min``) across the lanes ``masks`` apart (xor shuffles)."""
    for m in masks:
        out.append(put(Bin(op, get(), kir.Shfl(get(), m, 32))))


def _block_values(k: RowKernelBuilder, out: list[kir.Stmt]) -> list[tuple[int, kir.Expr, tuple[kir.Expr, ...], kir.Expr]]:
    """The block reduce (statements into ``out``); returns, per block value to combine, ``(cross
    index, first column, values of consecutive columns, predicate)``: per-column results ``vec``
    columns at a time (one 128-bit store at ``vec`` 4), a scalar as one value."""
    low, s = k.low, k.low.s
    tpr, block = s.tpr, s.block
    groups = block // max(tpr, 32)
    subwarp = [m for m in (1, 2, 4, 8, 16) if m >= tpr]
    res: list[tuple[int, kir.Expr, tuple[kir.Expr, ...], kir.Expr]] = []
    pcs = _per_col(low)
    for i, c in pcs:  # merge the sub-warp rows of each warp (lanes with the same columns)
        for e in range(low.per_thread):
            # (_warp_sum calls get and put at once: the loop's i and e are the current ones)
            _warp_sum(out, lambda: LocalRef(f"xa{i}", I(e)), lambda v: kir.SetLocal(f"xa{i}", I(e), v), subwarp,
                      c.combine)
    for i, c in _scalars(low):
        a = k.cross_accumulator(i)
        _warp_sum(out, lambda: a, lambda v: Assign(a, v), [16, 8, 4, 2, 1], c.combine)
    writer = Bin("<", Bin("%", _TID, I(32)), I(tpr)) if tpr < 32 else None
    nw = block // 32
    scal = _scalars(low)
    if scal and block > 32:
        for n, (i, _) in enumerate(scal):
            out.append(kir.StoreVec("sxs", add(I(n * nw), Bin("/", _TID, I(32))), (k.cross_accumulator(i),),
                                    Bin("==", Bin("%", _TID, I(32)), I(0))))
    if pcs and groups > 1:
        res += _groups_exchange(k, out, pcs, groups, writer)
    elif scal and block > 32:
        out.append(kir.Barrier())
    if pcs and groups == 1:
        for i, _ in pcs:
            for u in range(low.per_thread // s.vec):   # the thread's vec-wide pieces: columns (u tpr + lane) vec ...
                col = _column(k, u * s.vec)
                vals = tuple(LocalRef(f"xa{i}", I(u * s.vec + j)) for j in range(s.vec))
                ok = Bin("<", add(col, I(s.vec - 1)), I(low.p.N))
                res.append((i, col, vals, ok if writer is None else Bin("&&", writer, ok)))
    for n, (i, c) in enumerate(scal):
        if block > 32:
            v = k.var("xv", F32)
            out.append(Assign(v, _ident(c)))
            for w in range(nw):
                out.append(Assign(v, _comb(c, v, Load("sxs", I(n * nw + w)))))
        else:
            v = k.cross_accumulator(i)
        res.append((i, I(0), (v,), Bin("==", _TID, I(0))))
    return res


def _groups_exchange(k: RowKernelBuilder, out: list[kir.Stmt], pcs: list[tuple[int, CrossReduction]], groups: int,
                     writer: kir.Expr | None) -> list[tuple[int, kir.Expr, tuple[kir.Expr, ...], kir.Expr]]:
    """The warp row groups' per-column sums through ``sxk`` (one row piece per group, reused by each
    reduction in turn), laid out by element: column ``(u tpr + lane) vec + j`` of group ``g`` at ``g
    chunk + j (chunk / vec) + u tpr + lane``, so that a warp's stores and the readers' loads touch
    consecutive words (no bank conflict); thread ``t`` then sums the groups of the ``vec`` columns
    from ``(t + q block) vec`` on, in group order (the first barrier also publishes ``sxs``)."""
    low, s = k.low, k.low.s
    chunk, block, vec = low.chunk, s.block, s.vec
    units = chunk // vec
    slot = Bin("/", _TID, I(max(s.tpr, 32)))
    res: list[tuple[int, kir.Expr, tuple[kir.Expr, ...], kir.Expr]] = []
    for n, (i, c) in enumerate(pcs):
        if n:
            out.append(kir.Barrier())   # the previous reduction's readers are done with sxk
        for e in range(low.per_thread):
            u, j = divmod(e, vec)
            at = add(mul(slot, I(chunk)), add(I(j * units + u * s.tpr), k.ix.lane))
            out.append(kir.StoreVec("sxk", at, (LocalRef(f"xa{i}", I(e)),), writer))
        out.append(kir.Barrier())
        for q in range(math.ceil(units / block)):
            unit = add(_TID, I(q * block))
            inside = Bin("<", unit, I(units))
            vals = []
            for j in range(vec):
                v = k.var("xv", F32)
                out.append(Assign(v, _ident(c)))
                for g in range(groups):
                    out.append(Assign(v, _comb(c, v, Load("sxk", add(I(g * chunk + j * units),
                                                                      Bin("min", unit, I(units - 1))), inside))))
                vals.append(v)
            col = mul(unit, I(vec))
            res.append((i, col, tuple(vals), Bin("<", add(col, I(vec - 1)), I(low.p.N))))
    return res


def _atomic_width(n: int, device_width: int) -> int:
    """Elements per atomic add of ``n`` consecutive values: a float4 / float2 add where the device has
    them (``device_width``, 1 for a 16-bit output) and it divides ``n``, else scalar adds."""
    return next(w for w in (4, 2, 1) if w <= device_width and n % w == 0)


def partial_buf(low: Lowerer, i: int, grid: int) -> str:
    """The per-block partials of cross reduction ``i``: ``grid x width`` floats (scratch)."""
    width = low.p.N if low.p.cross[i].kind == "per_reduced" else 1
    return low.scratch(f"xp{i}", grid * width)


def cross_epilogue(k: RowKernelBuilder, cx: Ctx, uses: dict[str, set[str]]) -> list[kir.Stmt]:
    """The statements after the round loop: block reduce, then the cross-block combine of the schedule
    (``cx``, ``uses``: the kernel's variables and scratch buffers, and its global buffers read and
    written, which the partials and final sums add to; the kernel hands them over as it finishes)."""
    low = k.low
    mode, grid = low.s.option(CROSS_COMBINE), k.layout.grid
    out: list[kir.Stmt] = [kir.Comment("cross reductions: block reduce, then combine across blocks")]
    vw = low.dev.atomic_vector_width
    for i, col, vals, pred in _block_values(k, out):
        c = low.p.cross[i]
        if mode == CrossCombine.ATOMIC:
            buf = low.out_buf[c.node]
            k.use_output(buf)
            vals = tuple(Bin("*", v, _f(_scale(c))) if c.mean else v for v in vals)
            w = _atomic_width(len(vals), vw if low.g.spec(c.node).dtype == "float32" else 1)
            out += [kir.AtomicAdd(buf, add(col, I(j)), vals[j], pred, more=vals[j + 1:j + w])
                    for j in range(0, len(vals), w)]
        else:
            part = partial_buf(low, i, grid)
            cx.scratch.add(part)
            width = low.p.N if c.kind == "per_reduced" else 1
            at = add(mul(_BID, I(width)), col)
            # float32 partials: at most 4 a store (16 bytes; a 16-bit graph's vec of 8 is two stores)
            out += [kir.StoreVec(part, add(at, I(j)) if j else at, vals[j:j + 4], pred) for j in range(0, len(vals), 4)]
    if mode == CrossCombine.GRID:
        out.append(kir.GridSync())
        lay = grid_bands(low, grid)
        if lay is not None:   # every block of the grid a band (sxk is free after the grid barrier)
            pcs = _per_col(low)
            parts_of = [partial_buf(low, i, grid) for i, _ in pcs]
            outs = [low.out_buf[c.node] for _, c in pcs]
            cx.scratch.update(parts_of)
            uses["out"].update(outs)
            out += band_sums(lay, pcs, parts_of, outs, cx, buf="sxk", spare=True)[0]
        out += final_sums(low, cx, uses, grid, grid, per_column=lay is None)
    return out


def final_sums(low: Lowerer, cx: Ctx, uses: dict[str, set[str]], parts: int, nblocks: int,
               per_column: bool = True) -> list[kir.Stmt]:
    """Combine the ``parts`` per-block partials of every cross reduction in block order into its output,
    with ``nblocks`` blocks running this code: per column one thread (skipped with ``per_column``
    false: the combine kernel sums those by bands, :mod:`stitchtune.lower.cross_bands`); a scalar by
    block 0 (every thread a strided share, then shuffles and ``sxs`` across the warps, so that every
    thread of block 0 holds it), then the scalar epilogue (:func:`epilogue`)."""
    s = low.s
    block = s.block
    out: list[kir.Stmt] = []
    gid = cx.var("xg", I32)
    out.append(Assign(gid, add(mul(_BID, I(block)), _TID)))
    g = cx.var("xq", I32)
    finals: dict[str, kir.Expr] = {}
    mine = Bin("==", _BID, I(0))
    for i, c in enumerate(low.p.cross):
        if c.kind == "per_reduced" and not per_column:
            continue
        part = partial_buf(low, i, parts)
        cx.scratch.add(part)
        acc: Var = cx.var("xt", F32)
        if c.kind == "per_reduced":
            buf = low.out_buf[c.node]  # (per-column results are outputs: the planner refuses other readers)
            uses["out"].add(buf)
            N = low.p.N
            for q in range(math.ceil(N / (nblocks * block))):
                col = cx.var("xc", I32)
                ok = cx.var("xok", kir.BOOL)
                out += [Assign(col, add(gid, I(q * nblocks * block))), Assign(ok, Bin("<", col, I(N))),
                        Assign(acc, _ident(c)),
                        kir.For(g, I(0), I(parts), 1, (Assign(acc, _comb(c, acc, Load(
                            part, add(mul(g, I(N)), Bin("min", col, I(N - 1))), ok))),)),
                        kir.StoreVec(buf, col, (Bin("*", acc, _f(_scale(c))) if c.mean else acc,), ok)]
            continue
        idx = cx.var("xi", I32)
        inside = Bin("&&", mine, Bin("<", idx, I(parts)))
        got: kir.Expr = Load(part, Bin("min", idx, I(parts - 1)), inside)  # a masked load reads 0.0
        if c.combine != "+":
            got = Select(inside, got, _ident(c))
        out += [Assign(acc, _ident(c)), kir.For(g, I(0), I(math.ceil(parts / block)), 1, (
            Assign(idx, add(mul(g, I(block)), _TID)), Assign(acc, _comb(c, acc, got))))]
        _warp_sum(out, lambda: acc, lambda v: Assign(acc, v), [16, 8, 4, 2, 1], c.combine)
        if block > 32:
            nw = block // 32
            out += [kir.Barrier(), kir.StoreVec("sxs", Bin("/", _TID, I(32)), (acc,),
                                                Bin("==", Bin("%", _TID, I(32)), I(0))), kir.Barrier(),
                    Assign(acc, _ident(c))]
            for w in range(nw):
                out.append(Assign(acc, _comb(c, acc, Load("sxs", I(w)))))
        final: kir.Expr = Bin("*", acc, _f(_scale(c))) if c.mean else acc
        finals[c.node] = final
        if c.output:
            buf = low.out_buf[c.node]
            uses["out"].add(buf)
            out.append(kir.StoreVec(buf, I(0), (final,), Bin("&&", mine, Bin("==", _TID, I(0)))))
    out += epilogue(low, cx, uses, finals, Bin("&&", mine, Bin("==", _TID, I(0))))
    return out


def epilogue(low: Lowerer, cx: Ctx, uses: dict[str, set[str]], finals: dict[str, kir.Expr],
             writer: kir.Expr) -> list[kir.Stmt]:
    """The scalar epilogue (``plan.epilogue``, graph order) over the final values ``finals`` of the
    scalar cross reductions; each epilogue output stored by ``writer`` (one thread)."""
    out: list[kir.Stmt] = []
    vals = dict(finals)

    def at(a: str) -> kir.Expr:   # a one-element input (loaded) or a node of such inputs, computed here
        if a not in vals:
            if a in low.in_buf:
                uses["in"].add(low.in_buf[a])
                vals[a] = v = cx.var("xe", low.vtype(a))
                out.append(Assign(v, low.load(a, I(0), writer)))
            else:
                nd = low.nodes[a]
                vals[a] = v = cx.var("xe", low.vtype(a))
                out.append(Assign(v, low.expr_of_node(nd, [at(x) if isinstance(x, str) else _f(float(x))
                                                            for x in nd.args])))
        return vals[a]

    for name in low.p.epilogue:
        nd = low.nodes[name]
        args = [at(a) if isinstance(a, str) else _f(float(a)) for a in nd.args]
        v = cx.var("xe", F32)
        out.append(Assign(v, low.expr_of_node(nd, args)))
        vals[name] = v
    for o in dict.fromkeys(low.g.outputs):
        if o in low.p.epilogue:
            buf = low.out_buf[o]
            uses["out"].add(buf)
            out.append(kir.StoreVec(buf, I(0), (vals[o],), writer))
    return out


def _small_kernel(low: Lowerer, name: str, cx: Ctx, uses: dict[str, set[str]], body: list[kir.Stmt],
                  shared: list[kir.SharedBuf]) -> kir.Kernel:
    params = [low.param(b) for b in sorted(uses["in"], key=lambda x: int(x[2:]))]   # (the epilogue's scalars)
    params += [low.param(b) for b in sorted(uses["out"], key=lambda x: int(x[3:]))]
    params += [low.param(b) for b in sorted(cx.scratch)]
    return kir.Kernel(name, tuple(params), tuple(body), low.s.block, tuple(shared), (), 0, None)


def _no_uses() -> dict[str, set[str]]:
    """An empty record of the global buffers a kernel reads ("in") and writes ("out")."""
    return {"in": set(), "out": set()}


def zero_kernel(low: Lowerer) -> tuple[kir.Kernel, int]:
    """(the kernel that zeroes the atomically accumulated outputs, its grid): one element per thread."""

    cx, uses = Ctx(), _no_uses()
    block = low.s.block
    width = max(low.p.N if c.kind == "per_reduced" else 1 for c in low.p.cross)
    gid = cx.var("xg", I32)
    body: list[kir.Stmt] = [Assign(gid, add(mul(_BID, I(block)), _TID))]
    for c in low.p.cross:
        buf = low.out_buf[c.node]
        uses["out"].add(buf)
        w = low.p.N if c.kind == "per_reduced" else 1
        body.append(kir.StoreVec(buf, Bin("min", gid, I(w - 1)), (_f(0),), Bin("<", gid, I(w))))
    return _small_kernel(low, "st_xzero", cx, uses, body, []), math.ceil(width / block)


def combine_kernel(low: Lowerer, parts: int) -> tuple[kir.Kernel, int]:
    """(the second kernel of ``cross_combine`` kernel, its grid): the per-column reductions' ``parts``
    partial rows summed by column bands (:mod:`stitchtune.lower.cross_bands`: one band per block), the
    scalar ones in block order by block 0 (:func:`final_sums`)."""

    cx, uses = Ctx(), _no_uses()
    block = low.s.block
    body: list[kir.Stmt] = []
    shared: list[kir.SharedBuf] = []
    grid = 1
    pcs = _per_col(low)
    if pcs:
        lay = combine_layout(low, parts)
        parts_of = [partial_buf(low, i, parts) for i, _ in pcs]
        outs = [low.out_buf[c.node] for _, c in pcs]  # (per-column results are outputs: see final_sums)
        cx.scratch.update(parts_of)
        uses["out"].update(outs)
        body, shared = band_sums(lay, pcs, parts_of, outs, cx)
        grid = lay.bands
    if _scalars(low) or low.p.epilogue:
        body += final_sums(low, cx, uses, parts, grid, per_column=False)
        if block > 32 and _scalars(low):
            shared.append(kir.SharedBuf("sxs", block // 32))
    return _small_kernel(low, "st_xsum", cx, uses, body, shared), grid


def small_profile(low: Lowerer, kern: kir.Kernel, grid: int, parts: int) -> kir.KernelProfile:
    """The analytic profile of a zeroing or combine kernel: it reads the partials, writes the outputs."""
    specs = {b.name: b for b in low.buffers}
    reads = sum(specs[p.name].nbytes for p in kern.params if p.role == BufferRole.SCRATCH)
    writes = sum(specs[p.name].nbytes for p in kern.params if p.role == BufferRole.OUTPUT)
    in_flight, rounds = _combine_loads(low, parts) if reads else (4, 0)
    return kir.KernelProfile(
        name=kern.name, grid=grid, block=kern.block, smem_bytes=kern.smem_bytes, est_registers=SMALL_KERNEL_REGISTERS,
        dram_read_bytes=int(reads), dram_write_bytes=int(writes), reread_bytes=0, reread_working_set=0,
        flops=int(reads // 4), sfu_ops=0, block_barriers=sum(isinstance(x, kir.Barrier) for x in kir.walk(kern.body)),
        grid_barriers=0, atomics=0, bytes_in_flight_per_thread=in_flight, scratch_loads=rounds)


def _combine_loads(low: Lowerer, parts: int) -> tuple[int, int]:
    """(bytes of partials one thread of the combine has in flight, the rounds of loads it issues one
    after another). Per-column reductions: a band's batch of vector loads, issued before the first add
    (:class:`~stitchtune.lower.cross_bands.BandLayout`); a scalar alone: its strided share of the
    partials, counted 8 in flight (an assumption: the loop is rolled; the in-flight figure as before
    the bands, ``4 x min(parts, 4)``)."""
    if _per_col(low):
        lay = combine_layout(low, parts)
        return 4 * lay.vec * lay.nk * min(lay.batch, lay.passes), lay.rounds
    n = math.ceil(parts / low.s.block) if parts else 0
    return 4 * min(parts, 4), math.ceil(n / 8)


def atomic_counts(low: Lowerer, grid: int) -> tuple[int, int]:
    """(atomic adds of the main kernel, the most of them to one address) under ``cross_combine`` atomic."""
    if low.s.option(CROSS_COMBINE) != CrossCombine.ATOMIC:
        return 0, 0
    width = sum(low.p.N if c.kind == "per_reduced" else 1 for c in low.p.cross)
    return grid * width, grid


def cross_profile(low: Lowerer, grid: int, rounds: int, prof: kir.KernelProfile) -> kir.KernelProfile:
    """The profile of the kernel holding the cross reductions (``grid`` blocks, ``rounds`` rounds) with
    the cross combine counted: its atomics, and its one grid barrier after the round loop (the
    generic count multiplies every grid barrier by the rounds)."""
    atomics, serial = atomic_counts(low, grid)
    gb = prof.grid_barriers - (rounds - 1 if low.s.option(CROSS_COMBINE) == CrossCombine.GRID else 0)
    return dataclasses.replace(prof, atomics=atomics, atomic_serial=serial, grid_barriers=gb)
