"""Lowering of column reductions (``plan.family == 'col'``): reductions over the leading axis.

Thread mapping: a block is ``tpr`` threads along the reduced rows times ``block // tpr`` threads along
the columns; each thread owns ``vec`` adjacent columns (coalesced, 16 bytes at most). A task is a
column tile (``block // tpr * vec`` columns) times one of ``split`` row chunks. Thread ``tc = tid %
tpc`` handles columns ``c0 = tile * TC + tc * vec``; thread ``tk = tid / tpc`` handles rows
``kbase + it * tpr + tk``.

Schemes: ``local`` (one thread owns a whole column: tpr == 1, split == 1), ``regional`` (the
``tpr`` partials of a column meet in shared memory), ``global`` (per-chunk partials in global
scratch + grid barrier), ``independent`` (partials in scratch, kernel boundary). Per-column values
(reduction results, per-column inputs) are ``vec`` values per thread; per-row inputs are scalars.

:class:`ColLowerer` sizes the program and builds each kernel through a :class:`_ColKernel`, which
reads like the kernel: index set-up, the results of earlier kernels, per stage a sweep (loads and
reduce) and the combine of the partials, the output sweep and stores, the round loop. Its fixed
parts are frozen values (:class:`_ColLayout`, :class:`_ColIndex`, :class:`_ColSweep`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

from stitchtune.hardware.device import Device
from stitchtune.ir import kir
from stitchtune.ir.launches import LaunchShape
from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.graph.parse import Graph
from stitchtune.ir.kir import F32, I32, Assign, Bin, Const, Load, Select, Var
from stitchtune.lower.base import I, add, and_, Ctx, Lowerer, mul, estimate_registers
from stitchtune.lower.profile import kernel_profile
from stitchtune.lower.sweep_values import SweepValues
from stitchtune.lower.col_remap import ColRemapValues
from stitchtune.lower.counts import loads_from, sweep_reads
from stitchtune.lower.liveness import col_sweeps, kernel_levels, merged_levels, node_args
from stitchtune.plan.planner import StitchPlan, TensorClass
from stitchtune.space import SCHEMES, ReuseLevel, Schedule, Scheme, SchemeTable

#: iterations of the loop over a column stage's ``split`` partials unrolled together (their loads in flight
#: at once): GPT-2's training column sum 4096 x 2304 (split 32, vec 4) fully unrolled takes 150 registers
#: and spills 424 bytes under the 64 of its grid barrier's cap; unrolled by 8: 56 registers, no spills
#: (sm_90 cubin, ptxas -v, CPU static analysis)
COMBINE_UNROLL = 8


def _load_f32(dsts: tuple[Var, ...], buf: str, idx: kir.Expr, pred: kir.Expr | None) -> list[kir.Stmt]:
    """Loads of a float32 scratch buffer in accesses of at most 16 bytes (4 floats)."""
    return [kir.LoadVec(dsts[k:k + 4], buf, add(idx, I(k)), pred) for k in range(0, len(dsts), 4)]


def _store_f32(buf: str, idx: kir.Expr, vals: tuple[kir.Expr, ...], pred: kir.Expr | None) -> list[kir.Stmt]:
    """Stores to a float32 scratch buffer in accesses of at most 16 bytes (4 floats)."""
    return [kir.StoreVec(buf, add(idx, I(k)), vals[k:k + 4], pred) for k in range(0, len(vals), 4)]


class ColLowerer(Lowerer):
    """Column reductions (with slice / concat along the columns: :mod:`stitchtune.lower.col_remap`)."""

    @property
    def index_ops(self) -> bool:
        """Whether the graph has index ops or layout chains of inputs (evaluated by a remap)."""
        return bool(self.chain_heads) or any(OPS[nd.op].kind in INDEX_KINDS for nd in self.g.nodes)

    def __init__(self, graph: Graph, plan: StitchPlan, s: Schedule, device: Device,
                 schemes: SchemeTable = SCHEMES) -> None:
        super().__init__(graph, plan, s, device, schemes)
        #: the program's tasks, estimated registers per thread and stages per kernel (:meth:`_size`)
        self.n_tasks, self.est_regs, self.segs = self._size()

    def lower(self) -> kir.Program:
        tasks, est, segs = self.n_tasks, self.est_regs, self.segs
        block = self.s.block
        kernels, launches, profiles = [], [], []
        for ki, seg in enumerate(segs):
            k, prof = self.build_kernel(ki, seg, ki == len(segs) - 1, tasks, est)
            kernels.append(k)
            launches.append(kir.Launch(k.name, prof.grid, block, k.smem_bytes, tuple(pp.name for pp in k.params)))
            profiles.append(prof)
        return kir.Program(tuple(kernels), tuple(self.buffers), tuple(launches),
                           kir.ProgramProfile(tuple(profiles), self.g.min_bytes()))

    def _size(self) -> tuple[int, int, list[list[int]]]:
        """Size the program before any kernel is built (once, by the constructor): (tasks, estimated
        registers per thread, the stages of each kernel); sets the tile sizes and the kernels' reuse levels."""
        p, s = self.p, self.s
        M, N = p.M, p.N
        tk, block, S, vec = s.tpr, s.block, s.split, s.vec
        self.tpc = block // tk
        self.TC = self.tpc * vec
        self.chunk = math.ceil(M / S)
        self.rpt = math.ceil(self.chunk / tk)
        self.per_thread = self.rpt * vec
        self.iters = self.rpt
        self.rpb = 1
        tiles = math.ceil(N / self.TC)
        tasks = tiles * S
        segs = self.kernel_segments()
        # caches no later sweep reads (a later tensor of the chain is cached): never filled
        args = node_args(self.nodes)
        self.kernel_reuse = kernel_levels(p, args, self.reuse, col_sweeps(p, args, self.g.outputs, segs))
        self.reuse = merged_levels(self.kernel_reuse, self.reuse)
        n_reg = sum(1 for r in self.reuse.values() if r == ReuseLevel.REGISTER)
        est = estimate_registers(self.per_thread * n_reg, vec, 4)
        return tasks, est, segs

    def resources(self) -> tuple[LaunchShape, ...]:
        """The launch shape of every kernel :meth:`lower` would build, from the same layouts
        (:func:`_col_layout`) without building kernel bodies."""
        tasks, est, segs = self.n_tasks, self.est_regs, self.segs
        out = []
        for ki, seg in enumerate(segs):
            lay = _col_layout(self, ki, seg, tasks, est)
            out.append(LaunchShape(f"st_k{ki}", self.s.block, lay.smem_bytes, est, lay.grid, lay.needs_sync))
        return tuple(out)

    def tasks_in_flight_bytes(self, grid: int) -> int:
        return grid * self.chunk * self.TC * 4

    def build_kernel(self, ki: int, seg: list[int], is_last: bool, tasks: int,
                     est_regs: int) -> tuple[kir.Kernel, kir.KernelProfile]:
        """Kernel ``ki``: the stages ``seg`` (0-based), then the outputs when it is the last one."""
        k = _ColKernel(self, ki, seg, tasks, est_regs)
        k.read_earlier_stages()
        for st in seg:
            k.reduce_stage(st, keep_results=not is_last)
        if is_last:
            k.write_outputs()
        return k.finish()


@dataclass(frozen=True)
class _ColLayout:
    """Where one kernel keeps its reduction exchange and caches, and how it is launched."""

    shared: tuple[kir.SharedBuf, ...]     # sred (the exchange, tpr > 1), sc<t> (shared caches)
    locals_: tuple[kir.LocalArray, ...]   # rc<t> (register caches)
    smem_bytes: int
    grid: int
    rounds: int                           # tasks per block, in turn
    needs_sync: bool                      # a global stage: a grid barrier


def _col_layout(low: ColLowerer, ki: int, seg: list[int], tasks: int, est_regs: int) -> _ColLayout:
    p, s = low.p, low.s
    levels = low.kernel_reuse[ki]
    red_slots = max((len(p.stages[i]) for i in seg), default=0)
    shared: list[kir.SharedBuf] = []
    if red_slots and s.tpr > 1:
        shared.append(kir.SharedBuf("sred", red_slots * s.tpr * low.TC))
    for c in p.reuse_candidates:
        if levels[c] == ReuseLevel.SHARED:
            shared.append(kir.SharedBuf(f"sc{low.tid_of[c]}", low.rpt * s.tpr * low.TC))
    locals_ = [kir.LocalArray(f"rc{low.tid_of[c]}", low.per_thread)
               for c in p.reuse_candidates if levels[c] == ReuseLevel.REGISTER]
    smem_bytes = 4 * sum(x.size for x in shared)
    needs_sync = any(low.schemes[s.schemes[i]].grid_barrier for i in seg)
    grid = low.grid_for(tasks, s.block, smem_bytes, est_regs, s.split if s.split > 1 else 1, needs_sync)
    return _ColLayout(tuple(shared), tuple(locals_), smem_bytes, grid, math.ceil(tasks / grid), needs_sync)


@dataclass(frozen=True)
class _ColIndex:
    """The index variables of a kernel: the thread's column group ``tc`` and row thread ``tk`` (set
    once), the round, and the task, tile, split index, first column, column validity and row range
    of the round's task."""

    tc: Var
    tk: Var
    rd: Var
    tile: Var
    sidx: Var
    c0: Var
    cvalid: Var
    kbase: Var
    kend: Var
    task: Var
    cc0: kir.Expr  # the first column clamped for address arithmetic


@dataclass(frozen=True)
class _ColSweep:
    """One sweep's loop: the logical iteration index, the thread's row ``r`` of the iteration and
    its validity, and the loop body being built."""

    idx: kir.Expr
    r: Var
    valid: Var
    body: list[kir.Stmt]


class _ColKernel:
    """One kernel of a column-family program, built phase by phase: the index set-up (constructor),
    the results of earlier kernels (:meth:`read_earlier_stages`), one sweep + combine per stage
    (:meth:`reduce_stage`), the output sweep and stores (:meth:`write_outputs`), the round loop
    (:meth:`finish`).

    State while building: ``body`` (statements before the round loop), ``rb`` (the round body),
    ``pvals`` (the ``vec`` per-column values available, by tensor name), ``uses`` (global buffers read and written), ``filled`` (cached tensors written to their
    cache by an earlier sweep).
    """

    def __init__(self, low: ColLowerer, ki: int, seg: list[int], tasks: int, est_regs: int) -> None:
        self.low, self.ki, self.est_regs = low, ki, est_regs
        s, p = low.s, low.p
        self.cx = cx = Ctx()
        self.lay = _col_layout(low, ki, seg, tasks, est_regs)
        tid = kir.Special("tid")
        tc, tk = cx.var("tc", I32), cx.var("tk", I32)
        self.body: list[kir.Stmt] = [Assign(tc, Bin("%", tid, I(low.tpc))), Assign(tk, Bin("/", tid, I(low.tpc)))]
        rd, tile, sidx = cx.var("rd", I32), cx.var("tile", I32), cx.var("sidx", I32)
        c0, cvalid = cx.var("c", I32), cx.var("cv", kir.BOOL)
        kbase, kend = cx.var("kb", I32), cx.var("ke", I32)
        task = cx.var("task", I32)
        cc0 = Bin("min", c0, I(p.N - s.vec))
        self.ix = _ColIndex(tc, tk, rd, tile, sidx, c0, cvalid, kbase, kend, task, cc0)
        S, vec = s.split, s.vec
        self.rb: list[kir.Stmt] = [
            Assign(task, add(mul(rd, kir.Special("gdim")), kir.Special("bid"))),
            Assign(tile, Bin("/", task, I(S))), Assign(sidx, Bin("%", task, I(S))),
            Assign(c0, add(mul(tile, I(low.TC)), mul(tc, I(vec)))),
            Assign(cvalid, Bin("&&", Bin("<", c0, I(p.N)), Bin("<", task, I(tasks)))),
            Assign(kbase, mul(sidx, I(low.chunk))),
            Assign(kend, Bin("min", add(kbase, I(low.chunk)), I(p.M)))]
        self.uses: dict[str, set[str]] = {"in": set(), "out": set()}
        self.pvals: dict[str, list[kir.Expr]] = {}
        self.filled: set[str] = set()
        self.prev_stages = [i for i in range(p.nstages) if i < (seg[0] if seg else p.nstages)]

    # -- per-column values ------------------------------------------------------------------------
    def load_p(self, name: str) -> list[kir.Expr]:
        """The ``vec`` values of a per-column (PER_KEPT) or scalar input."""
        low, ix, vec = self.low, self.ix, self.low.s.vec
        if name in self.pvals:
            return self.pvals[name]
        buf = low.in_buf[name]
        self.uses["in"].add(buf)
        if low.cls[name] is TensorClass.PER_KEPT and low.p.mapped(name):  # through its column factors
            self.pvals[name] = low.mapped_load(self.cx, self.rb, name, I(0), ix.cc0, ix.cvalid, "p")
        elif low.cls[name] is TensorClass.PER_KEPT:
            dsts = tuple(self.cx.var("p", F32) for _ in range(vec))
            self.rb.append(kir.LoadVec(dsts, buf, ix.cc0, ix.cvalid))
            self.pvals[name] = list(dsts)
        else:
            v = self.cx.var("p", F32)
            self.rb.append(Assign(v, Load(buf, I(0))))
            self.pvals[name] = [v] * vec
        return self.pvals[name]

    def compute_p_nodes(self) -> None:
        """Compute the per-column and scalar nodes whose reductions are all available."""
        low, vec = self.low, self.low.s.vec
        for nd, args in low.ready_p_nodes(self.pvals, self.load_p, lambda c: [Const(c, F32)] * vec):
            vs: list[kir.Expr] = []
            for j in range(vec):
                v = self.cx.var("p", F32)
                self.rb.append(Assign(v, low.expr_of_node(nd, [a[j] for a in args])))
                vs.append(v)
            self.pvals[nd.id] = vs

    def acc_vars(self, r: str) -> list[kir.Var]:
        """The accumulators of reduction ``r`` (its ``pvals``: variables, combined in place)."""
        accs = [v for v in self.pvals[r] if isinstance(v, kir.Var)]
        assert len(accs) == len(self.pvals[r]), f"reduction '{r}' has values that are not variables"
        return accs

    def read_partials(self, r: str, target: list[kir.Var] | None = None) -> None:
        """Combine the ``split`` partials of reduction ``r`` for this thread's columns from scratch
        into ``target`` (fresh variables when None)."""
        low, ix, cx = self.low, self.ix, self.cx
        S, N, vec = low.s.split, low.p.N, low.s.vec
        part = low.scratch(f"part{low.red_idx[r]}", S * N)
        cx.scratch.add(part)
        accs = target or [cx.var("acc", F32) for _ in range(vec)]
        for a in accs:
            self.rb.append(Assign(a, low.identity(r)))
        q = cx.var("q", I32)
        tmp = tuple(cx.var("pp", F32) for _ in range(vec))
        loop = _load_f32(tmp, part, add(mul(q, I(N)), ix.cc0), ix.cvalid)
        loop += [Assign(accs[j], low.combine(r, accs[j], tmp[j])) for j in range(vec)]
        # the partials' loads are independent: fully unrolled, ptxas hoists all S of them (S x vec
        # registers) and spills under a grid barrier's register cap; unrolled by COMBINE_UNROLL it keeps
        # that many in flight
        self.rb.append(kir.For(q, I(0), I(S), 1, tuple(loop), unroll_by=COMBINE_UNROLL if S > COMBINE_UNROLL else 0))
        self.pvals[r] = list(accs)

    def read_earlier_stages(self) -> None:
        """The results of the stages of earlier kernels: combined from their partials (an
        independent stage) or the final per-column values an earlier kernel stored."""
        low, ix, cx = self.low, self.ix, self.cx
        for st in self.prev_stages:
            for r in low.p.stages[st]:
                if low.schemes[low.s.schemes[st]].kernel_boundary:
                    self.read_partials(r)
                    low.finalize(self.rb, r, self.acc_vars(r))
                else:
                    vb = low.scratch(f"val{low.red_idx[r]}", low.p.N)
                    cx.scratch.add(vb)
                    dsts = tuple(cx.var("acc", F32) for _ in range(low.s.vec))
                    self.rb.extend(_load_f32(dsts, vb, ix.cc0, ix.cvalid))
                    self.pvals[r] = list(dsts)
        self.compute_p_nodes()

    # -- sweeps -----------------------------------------------------------------------------------
    def cache_index(self, sw: _ColSweep, j: int) -> kir.Expr:
        return add(mul(sw.idx, I(self.low.s.vec)), I(j))

    def smem_index(self, sw: _ColSweep, j: int) -> kir.Expr:
        tk, vec, TC, ix = self.low.s.tpr, self.low.s.vec, self.low.TC, self.ix
        return add(mul(add(mul(sw.idx, I(tk)), ix.tk), I(TC)), add(mul(ix.tc, I(vec)), I(j)))

    def broadcast(self, name: str) -> list[kir.Expr] | None:
        """The ``vec`` values of a per-column or scalar tensor (None for the others)."""
        if self.low.cls[name].varies_along_reduced:
            return None
        return self.load_p(name) if name in self.low.in_buf else self.pvals[name]

    def load_input(self, sw: _ColSweep, name: str) -> list[kir.Expr]:
        """The ``vec`` values of a full-size or per-reduced-index (per-row) input at the sweep's row."""
        low, vec, M, N = self.low, self.low.s.vec, self.low.p.M, self.low.p.N
        buf = low.in_buf[name]
        self.uses["in"].add(buf)
        if low.p.mapped(name):  # through its index map
            rbase = low.row_base(name, Bin("min", sw.r, I(M - 1)))
            if low.cls[name] is TensorClass.FULL:
                return low.mapped_load(self.cx, sw.body, name, rbase, self.ix.cc0, sw.valid, f"t{low.tid_of[name]}_")
            v = self.cx.var(f"t{low.tid_of[name]}_", F32)
            sw.body.append(Assign(v, Load(buf, rbase, sw.valid)))
            return [v] * vec
        if low.cls[name] is TensorClass.FULL:
            dsts = tuple(self.cx.var(f"t{low.tid_of[name]}_", F32) for _ in range(vec))
            idx = add(mul(Bin("min", sw.r, I(M - 1)), I(N)), self.ix.cc0)
            sw.body.append(kir.LoadVec(dsts, buf, idx, sw.valid))
            return list(dsts)
        v = self.cx.var(f"t{low.tid_of[name]}_", F32)  # PER_REDUCED: one value per row
        sw.body.append(Assign(v, Load(buf, Bin("min", sw.r, I(M - 1)), sw.valid)))
        return [v] * vec

    def sweep(self, reds: list[str], outputs: list[str]) -> None:
        """One pass over the thread's rows of its chunk: accumulate ``reds`` and/or store ``outputs``."""
        low, cx, ix = self.low, self.cx, self.ix
        tk, vec, N = low.s.tpr, low.s.vec, low.p.N
        it, r_ = cx.var("i", I32), cx.var("r", I32)
        idx_it, ii = low.sweep_index(cx, it)
        valid = cx.var("v", kir.BOOL)
        accs = {}
        for r in reds:
            accs[r] = [cx.var("acc", F32) for _ in range(vec)]
            for a in accs[r]:
                self.rb.append(Assign(a, low.identity(r)))
        lb: list[kir.Stmt] = [Assign(r_, add(ix.kbase, add(mul(idx_it, I(tk)), ix.tk))),
                    Assign(valid, Bin("&&", ix.cvalid, Bin("<", r_, ix.kend)))]
        sw = _ColSweep(idx_it, r_, valid, lb)
        sv = SweepValues(low, cx, lb, vec, self.filled, self.broadcast, partial(self.load_input, sw),
                          partial(self.cache_index, sw), partial(self.smem_index, sw),
                          low.kernel_reuse[self.ki])
        if low.index_ops:   # slice / concat along the columns (lower.col_remap)
            sv.index_value = ColRemapValues(low, cx, lb, sv, r_, ix.cc0, valid, self.uses["in"]).node_value
        for r in reds:
            vals = sv.value(str(low.nodes[r].args[0]))
            for j in range(vec):
                a = accs[r][j]
                lb.append(Assign(a, Select(valid, low.combine(r, a, vals[j]), a)))
        for o in outputs:
            vals = sv.value(o)
            buf = low.out_buf[o]
            self.uses["out"].add(buf)
            if low.p.mapped(o):  # a permuted (bijective) map: stored through it
                rbase = low.row_base(o, Bin("min", r_, I(low.p.M - 1)))
                if low.cls[o] is TensorClass.FULL:
                    low.mapped_store(lb, o, rbase, ix.cc0, list(vals), low.once_pred(o, r_, valid))
                else:
                    lb.append(kir.StoreVec(buf, rbase, (vals[0],), and_(valid, Bin("==", ix.c0, I(0)))))
            elif low.cls[o] is TensorClass.FULL:
                lb.append(kir.StoreVec(buf, add(mul(r_, I(N)), ix.c0), tuple(vals), valid))
            else:  # PER_REDUCED output: one value per row, written by the first column's threads
                lb.append(kir.StoreVec(buf, r_, (vals[0],), and_(valid, Bin("==", ix.c0, I(0)))))
        head = low.order_sweep(ii, it, low.rpt, loads_from(lb, low.swept_inputs))
        self.rb.append(kir.For(it, I(0), I(low.rpt), 1, tuple(head + lb),
                               unroll=bool(self.lay.locals_) or low.rpt <= 8))
        self.filled.update(sv.newly)
        for r in reds:
            self.pvals[r] = list(accs[r])

    # -- combining the partials of a stage ----------------------------------------------------------
    def exchange_in_block(self, reds: list[str]) -> None:
        """The partials of the ``tpr`` row threads of each column meet in shared memory (scalar
        stores: any vec width, no 16-byte limit)."""
        low, ix, rb = self.low, self.ix, self.rb
        tk, vec, TC = low.s.tpr, low.s.vec, low.TC
        for si_, r in enumerate(reds):
            base = si_ * tk * TC
            for j in range(vec):
                rb.append(kir.StoreVec("sred", add(I(base), add(mul(ix.tk, I(TC)), add(
                    mul(ix.tc, I(vec)), I(j)))), (self.pvals[r][j],)))
        rb.append(kir.Barrier())
        for si_, r in enumerate(reds):
            base = si_ * tk * TC
            accs = self.acc_vars(r)
            for a in accs:
                rb.append(Assign(a, low.identity(r)))
            q = self.cx.var("q", I32)
            loop = [Assign(accs[j], low.combine(r, accs[j], Load("sred", add(
                I(base), add(mul(q, I(TC)), add(mul(ix.tc, I(vec)), I(j))))))) for j in range(vec)]
            rb.append(kir.For(q, I(0), I(tk), 1, tuple(loop)))
        rb.append(kir.Barrier())

    def exchange(self, reds: list[str], scheme: Scheme) -> None:
        """Combine the partials of ``reds``: across the row threads of a block (tpr > 1), then, where the
        scheme has partials (global scratch), across the split row chunks of a column tile."""
        low, ix = self.low, self.ix
        if low.s.tpr > 1:
            self.exchange_in_block(reds)
        if scheme.partials:
            for r in reds:
                part = low.scratch(f"part{low.red_idx[r]}", low.s.split * low.p.N)
                self.cx.scratch.add(part)
                self.rb.extend(_store_f32(part, add(mul(ix.sidx, I(low.p.N)), ix.cc0), tuple(self.pvals[r]),
                                          Bin("&&", ix.cvalid, Bin("==", ix.tk, I(0)))))
            if scheme.grid_barrier:
                self.rb.append(kir.GridSync())
                for r in reds:
                    self.read_partials(r, target=self.acc_vars(r))

    # -- stages and outputs -----------------------------------------------------------------------
    def reduce_stage(self, st: int, keep_results: bool) -> None:
        """Stage ``st``: its sweep, the combine of the partials, and (unless the stage is independent)
        the final values; ``keep_results``: stored per column for a later kernel."""
        low, ix = self.low, self.ix
        reds = list(low.p.stages[st])
        scheme = low.schemes[low.s.schemes[st]]
        self.sweep(reds, [])
        self.exchange(reds, scheme)
        if not scheme.result_in_kernel:
            return
        for r in reds:
            low.finalize(self.rb, r, self.acc_vars(r))
            if keep_results:
                vb = low.scratch(f"val{low.red_idx[r]}", low.p.N)
                self.cx.scratch.add(vb)
                self.rb.extend(_store_f32(vb, ix.cc0, tuple(self.pvals[r]), Bin("&&", ix.cvalid, Bin(
                    "&&", Bin("==", ix.tk, I(0)), Bin("==", ix.sidx, I(0))))))
        self.compute_p_nodes()

    def write_outputs(self) -> None:
        """The output sweep (full-size and per-reduced-index outputs), then the per-column and scalar
        outputs, written by the first row thread of the first row chunk."""
        low, ix = self.low, self.ix
        outs = list(dict.fromkeys(low.g.outputs))
        f_outs = [o for o in outs if low.cls[o].varies_along_reduced]
        if f_outs:
            self.sweep([], f_outs)
        for o in outs:
            c = low.cls[o]
            if c.varies_along_reduced:
                continue
            vals = self.load_p(o) if o in low.in_buf else self.pvals[o]
            buf = low.out_buf[o]
            self.uses["out"].add(buf)
            lead = Bin("&&", Bin("==", ix.tk, I(0)), Bin("==", ix.sidx, I(0)))
            if c is TensorClass.PER_KEPT and low.p.mapped(o):
                low.mapped_store(self.rb, o, I(0), ix.cc0, list(vals), Bin("&&", ix.cvalid, lead))
            elif c is TensorClass.PER_KEPT:
                self.rb.append(kir.StoreVec(buf, ix.c0, tuple(vals), Bin("&&", ix.cvalid, lead)))
            else:
                self.rb.append(kir.StoreVec(buf, I(0), (vals[0],), Bin("&&", Bin("==", ix.c0, I(0)),
                                                                         Bin("&&", ix.cvalid, lead))))

    def finish(self) -> tuple[kir.Kernel, kir.KernelProfile]:
        """The round loop, the kernel and its profile."""
        low, lay = self.low, self.lay
        low.order_tasks(self.rb, bool(sweep_reads(tuple(self.rb), low.swept_inputs)), lay.rounds * lay.grid)
        self.body.append(kir.For(self.ix.rd, I(0), I(lay.rounds), 1, tuple(self.rb)))
        kern = low.make_kernel(self.ki, self.uses, self.cx, self.body, list(lay.shared), list(lay.locals_),
                               lay.needs_sync)
        return kern, kernel_profile(low, kern, lay.grid, lay.rounds, lay.smem_bytes, self.est_regs, self.ki)


def lower_col(graph: Graph, plan: StitchPlan, schedule: Schedule, device: Device,
              schemes: SchemeTable = SCHEMES) -> kir.Program:
    """Lower a column-reduction graph (the schedule was already checked against the space whose scheme
    table is ``schemes``)."""
    return ColLowerer(graph, plan, schedule, device, schemes).lower()
