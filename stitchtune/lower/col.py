"""Lowering of column reductions (``plan.family == 'col'``): reductions over the leading axis.

Thread mapping: a block is ``tpr`` threads along the reduced rows times ``block // tpr`` threads along the columns;
each thread owns ``vec`` adjacent columns (coalesced, 16 bytes at most). A task is a column tile (``block // tpr *
vec`` columns) times one of ``split`` row chunks. Thread ``tc = tid % tpc`` handles columns ``c0 = tile * TC + tc *
vec``; thread ``tk = tid / tpc`` handles rows ``kbase + it * tpr + tk`` (with row vectors the ``R`` rows from ``kbase +
(it * tpr + tk) * R``: :mod:`stitchtune.lower.row_vectors`).

Schemes: ``local`` (one thread owns a whole column: tpr == 1, split == 1), ``regional`` (the ``tpr`` partials of a
column meet in shared memory), ``global`` (per-chunk partials in global scratch + grid barrier), ``independent``
(partials in scratch, kernel boundary). Per-column values (reduction results, per-column inputs) are ``vec`` values per
thread; per-row inputs are scalars.

:class:`ColLowerer` sizes the program and builds each kernel through a :class:`_ColKernel`, which reads like the
kernel: index set-up, the results of earlier kernels, per stage a sweep (loads and reduce) and the combine of the
partials, the output sweep and stores, the round loop. Its fixed parts are frozen values (:class:`_ColLayout`,
:class:`~stitchtune.lower.col_exchange.ColIndex`, :class:`_ColSweep`); its reductions are states
(:mod:`stitchtune.lower.state`) combined by the one exchange (:mod:`stitchtune.lower.exchange`) over the column layout
(:class:`~stitchtune.lower.col_exchange.ColExchange`).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from functools import partial

from stitchtune.hardware.device import Device
from stitchtune.ir import kir
from stitchtune.ir.launches import LaunchShape
from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.graph.parse import Graph
from stitchtune.ir.kir import F32, I32, Assign, Bin, Const, Load, Var
from stitchtune.lower.base import I, add, and_, Ctx, Lowerer, Sizes, mul, estimate_registers
from stitchtune.lower.builder import KernelState
from stitchtune.lower.profile import kernel_profile
from stitchtune.lower.guarded_loads import load_vec, rows_always_valid
from stitchtune.lower.sweep_values import SweepValues
from stitchtune.lower.col_remap import ColRemapValues
from stitchtune.lower.row_vectors import RowVectorLoads, row_vector_inputs, row_vector_rows
from stitchtune.lower.col_exchange import COMBINE_UNROLL as COMBINE_UNROLL  # (re-exported: its old home)
from stitchtune.lower.col_exchange import ColExchange, ColIndex, ColState
from stitchtune.lower.exchange import combine_partials, exchange, load_f32, store_f32
from stitchtune.lower.state import PlainState, ReductionState, reset
from stitchtune.lower.counts import loads_from, sweep_reads
from stitchtune.lower.liveness import col_sweeps, early_outputs, kernel_levels, merged_levels, node_args
from stitchtune.plan.planner import StitchPlan, TensorClass
from stitchtune.space import SCHEMES, ReuseLevel, Schedule, SchemeTable
from stitchtune.space.options import row_vector_registers


#: rows of a sweep too long to unroll whole (more than 8 per thread, no register cache) unrolled together,
#: so that their loads are in flight at once (their guarded loads start from zeros:
#: :mod:`stitchtune.lower.guarded_loads`): at most ``SWEEP_UNROLL`` rows, and at most
#: ``SWEEP_UNROLL_FLOATS`` loaded floats of them (:func:`sweep_unroll`). BERT's training ``view_47`` (GELU
#: backward + column sum, 4096 x 3072, split 16: 32 rows per thread, 8 floats a row) had one row's two
#: 16-byte loads in flight per thread left to nvcc (23.3 KiB per SM of the 24.9 the H200 needs), unrolled
#: by 4 46.5, by 8 58.2 KiB (64 registers, no spill, with ``__expf``; with the flush-to-zero exponential by 2
#: 46.5, by 4 and by 8 34.9 KiB: ptxas's schedule of the cheaper body); GPT-2's ``view_41`` (5 inputs, 20 floats
#: a row) spills 10 instructions unrolled by 8 under the 64-register cap, none by 2 (sm_90 SASS, CPU static analysis)
SWEEP_UNROLL = 8
SWEEP_UNROLL_FLOATS = 64


def sweep_unroll(floats_per_row: int) -> int:
    """Rows of a long sweep unrolled together: the largest power of two up to :data:`SWEEP_UNROLL` whose
    rows load at most :data:`SWEEP_UNROLL_FLOATS` floats (at least 1)."""
    n = 1
    while n * 2 <= SWEEP_UNROLL and n * 2 * max(floats_per_row, 1) <= SWEEP_UNROLL_FLOATS:
        n *= 2
    return n


class ColLowerer(Lowerer):
    """Column reductions (with slice / concat along the columns: :mod:`stitchtune.lower.col_remap`)."""

    @property
    def index_ops(self) -> bool:
        """Whether the graph has index ops or layout chains of inputs (evaluated by a remap)."""
        return bool(self.chain_heads) or any(OPS[nd.op].kind in INDEX_KINDS for nd in self.g.nodes)

    def __init__(self, graph: Graph, plan: StitchPlan, s: Schedule, device: Device,
                 schemes: SchemeTable = SCHEMES) -> None:
        super().__init__(graph, plan, s, device, col_sizes(plan, s), schemes)
        #: threads along the columns (``block // tpr``) and columns of a task's tile (``tpc * vec``)
        self.tpc = s.block // s.tpr
        self.TC = self.tpc * s.vec
        #: rows of the chunk a thread sweeps (``ceil(chunk / tpr)``, the sweeps' iterations)
        self.rpt = self.iters
        #: rows a thread takes per sweep iteration (``R > 1``: row vectors, :mod:`stitchtune.lower.row_vectors`)
        self.rows = row_vector_rows(self, self.index_ops)
        self.row_vectors = frozenset(row_vector_inputs(self, self.rows)) if self.rows > 1 else frozenset()
        #: the program's tasks, estimated registers per thread and stages per kernel (:meth:`_size`)
        self.n_tasks, self._est_regs, self.segs = self._size()

    def lower(self) -> kir.Program:
        tasks, est, segs = self.n_tasks, self._est_regs, self.segs
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
        registers per thread, the stages of each kernel); sets the kernels' reuse levels (the sizes,
        :func:`col_sizes`, came with the constructor)."""
        p, s = self.p, self.s
        S, vec = s.split, s.vec
        tiles = math.ceil(p.N / self.TC)
        tasks = tiles * S
        segs = self.kernel_segments()
        # caches no later sweep reads (a later tensor of the chain is cached): never filled
        args = node_args(self.nodes)
        #: full-size outputs that follow no reduction: stored by the first sweep of kernel 0
        self.early = early_outputs(p, args, self.g.outputs)
        self.kernel_reuse = kernel_levels(p, args, self.reuse, col_sweeps(p, args, self.g.outputs, segs))
        self.reuse = merged_levels(self.kernel_reuse, self.reuse)
        n_reg = sum(1 for r in self.reuse.values() if r == ReuseLevel.REGISTER)
        # with row vectors, the floats of the unrolled iterations in flight (space.options.row_vector_registers)
        n_full = sum(1 for n in p.input_names if self.cls.get(n) is TensorClass.FULL)
        est = estimate_registers(self.per_thread * n_reg + row_vector_registers(self.rows, vec, self.per_thread, n_full),
                                 vec, 4)
        return tasks, est, segs

    def resources(self) -> tuple[LaunchShape, ...]:
        """The launch shape of every kernel :meth:`lower` would build, from the same layouts
        (:func:`_col_layout`) without building kernel bodies."""
        tasks, est, segs = self.n_tasks, self._est_regs, self.segs
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
    if ki > 0 and s.split > 1:   # the row threads meet after sharing an earlier stage's partials (col_exchange)
        red_slots = max(red_slots, 1)
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
class _ColSweep:
    """One sweep's loop: the logical iteration index, the thread's row ``r`` of the iteration and
    its validity, and the loop body being built."""

    idx: kir.Expr
    r: Var
    valid: Var
    body: list[kir.Stmt]


class _ColKernel(KernelState):
    """One kernel of a column-family program, built phase by phase: the index set-up (constructor),
    the results of earlier kernels (:meth:`read_earlier_stages`), one sweep + combine per stage
    (:meth:`reduce_stage`), the output sweep and stores (:meth:`write_outputs`), the round loop
    (:meth:`finish`).

    Its building state is private: ``_body`` (statements before the round loop), ``_rb`` (the round
    body, appended to through :meth:`emit`), ``_pvals`` (the ``vec`` per-column values available, by
    tensor name), ``_states`` (each reduction's :data:`~stitchtune.lower.col_exchange.ColState`),
    ``_uses`` (global buffers read and written: :meth:`use_input`, :meth:`use_output`), ``_filled``
    (cached tensors written to their cache by an earlier sweep), and the lowerer, variables and layout
    it builds with. It implements :class:`~stitchtune.lower.col_exchange.ColExchangeBuilder`; its only
    public field is ``ix`` (frozen).
    """

    _low: ColLowerer

    def __init__(self, low: ColLowerer, ki: int, seg: list[int], tasks: int, est_regs: int) -> None:
        self._low, self._ki, self._est_regs = low, ki, est_regs
        s, p = low.s, low.p
        self._cx = cx = Ctx()
        self._lay = _col_layout(low, ki, seg, tasks, est_regs)
        tid = kir.Special("tid")
        tc, tk = cx.var("tc", I32), cx.var("tk", I32)
        self._body: list[kir.Stmt] = [Assign(tc, Bin("%", tid, I(low.tpc))), Assign(tk, Bin("/", tid, I(low.tpc)))]
        rd, tile, sidx = cx.var("rd", I32), cx.var("tile", I32), cx.var("sidx", I32)
        c0, cvalid = cx.var("c", I32), cx.var("cv", kir.BOOL)
        kbase, kend = cx.var("kb", I32), cx.var("ke", I32)
        task = cx.var("task", I32)
        cc0 = Bin("min", c0, I(p.N - s.vec))
        self.ix = ColIndex(tc, tk, rd, tile, sidx, c0, cvalid, kbase, kend, task, cc0)
        S, vec = s.split, s.vec
        self._rb: list[kir.Stmt] = [
            Assign(task, add(mul(rd, kir.Special("gdim")), kir.Special("bid"))),
            Assign(tile, Bin("/", task, I(S))), Assign(sidx, Bin("%", task, I(S))),
            Assign(c0, add(mul(tile, I(low.TC)), mul(tc, I(vec)))),
            Assign(cvalid, Bin("&&", Bin("<", c0, I(p.N)), Bin("<", task, I(tasks)))),
            Assign(kbase, mul(sidx, I(low.chunk))),
            Assign(kend, Bin("min", add(kbase, I(low.chunk)), I(p.M)))]
        self._uses: dict[str, set[str]] = {"in": set(), "out": set()}
        self._pvals: dict[str, list[kir.Expr]] = {}
        self._filled: set[str] = set()
        self._states: dict[str, ColState] = {}
        self._prev_stages = [i for i in range(p.nstages) if i < (seg[0] if seg else p.nstages)]

    # -- per-column values ------------------------------------------------------------------------
    def load_p(self, name: str) -> list[kir.Expr]:
        """The ``vec`` values of a per-column (PER_KEPT) or scalar input."""
        low, ix, vec = self._low, self.ix, self._low.s.vec
        if name in self._pvals:
            return self._pvals[name]
        buf = low.in_buf[name]
        self.use_input(buf)
        if low.cls[name] is TensorClass.PER_KEPT and low.p.mapped(name):  # through its column factors
            self._pvals[name] = low.mapped_load(self._cx, self._rb, name, I(0), ix.cc0, ix.cvalid, "p")
        elif low.cls[name] is TensorClass.PER_KEPT:
            dsts = tuple(self._cx.var("p", F32) for _ in range(vec))
            self._rb.append(kir.LoadVec(dsts, buf, ix.cc0, ix.cvalid))
            self._pvals[name] = list(dsts)
        else:
            v = self._cx.var("p", F32)
            self._rb.append(Assign(v, Load(buf, I(0))))
            self._pvals[name] = [v] * vec
        return self._pvals[name]

    def compute_p_nodes(self) -> None:
        """Compute the per-column and scalar nodes whose reductions are all available."""
        low, vec = self._low, self._low.s.vec
        for nd, args in low.ready_p_nodes(self._pvals, self.load_p, lambda c: [Const(c, F32)] * vec):
            vs: list[kir.Expr] = []
            for j in range(vec):
                v = self._cx.var("p", F32)
                self._rb.append(Assign(v, low.expr_of_node(nd, [a[j] for a in args])))
                vs.append(v)
            self._pvals[nd.id] = vs

    def new_state(self, r: str) -> ColState:
        """Fresh states of reduction ``r`` for the thread's ``vec`` columns (not yet reset)."""
        info = self._low.red_info(r)
        return tuple(PlainState(r, self._cx.var("acc", F32), info) for _ in range(self._low.s.vec))

    def keep_state(self, r: str, g: ColState) -> None:
        """Record ``g`` as reduction ``r``'s state; its slots become ``r``'s per-column values."""
        self._states[r] = g
        self._pvals[r] = [st.vars[0] for st in g]

    def finish_state(self, r: str) -> None:
        """The final values of reduction ``r`` from its complete state (a mean's divided in place)."""
        for st in self._states[r]:
            self.emit(*st.finish(self._low.p.K, self.var)[0])

    def read_earlier_stages(self) -> None:
        """The results of the stages of earlier kernels: combined from their partials (an
        independent stage) or the final per-column values an earlier kernel stored."""
        low, ix, cx = self._low, self.ix, self._cx
        for st in self._prev_stages:
            for r in low.p.stages[st]:
                if low.schemes[low.s.schemes[st]].kernel_boundary:
                    g = self.new_state(r)
                    combine_partials(self, ColExchange(self), g)
                    self.keep_state(r, g)
                    self.finish_state(r)
                else:
                    vb = low.scratch(f"val{low.red_idx[r]}", low.p.N)
                    cx.scratch.add(vb)
                    dsts = tuple(cx.var("acc", F32) for _ in range(low.s.vec))
                    self._rb.extend(load_f32(dsts, vb, ix.cc0, ix.cvalid))
                    self._pvals[r] = list(dsts)
        self.compute_p_nodes()

    # -- sweeps -----------------------------------------------------------------------------------
    def cache_index(self, sw: _ColSweep, j: int) -> kir.Expr:
        return add(mul(sw.idx, I(self._low.s.vec)), I(j))

    def smem_index(self, sw: _ColSweep, j: int) -> kir.Expr:
        tk, vec, TC, ix = self._low.s.tpr, self._low.s.vec, self._low.TC, self.ix
        return add(mul(add(mul(sw.idx, I(tk)), ix.tk), I(TC)), add(mul(ix.tc, I(vec)), I(j)))

    def broadcast(self, name: str) -> list[kir.Expr] | None:
        """The ``vec`` values of a per-column or scalar tensor (None for the others)."""
        if self._low.cls[name].varies_along_reduced:
            return None
        return self.load_p(name) if name in self._low.in_buf else self._pvals[name]

    def load_input(self, sw: _ColSweep, name: str) -> list[kir.Expr]:
        """The ``vec`` values of a full-size or per-reduced-index (per-row) input at the sweep's row."""
        low, vec, M, N = self._low, self._low.s.vec, self._low.p.M, self._low.p.N
        buf = low.in_buf[name]
        self.use_input(buf)
        if low.p.mapped(name):  # through its index map
            rbase = low.row_base(name, Bin("min", sw.r, I(M - 1)))
            if low.cls[name] is TensorClass.FULL:
                return low.mapped_load(self._cx, sw.body, name, rbase, self.ix.cc0, sw.valid, f"t{low.tid_of[name]}_",
                                       zeroed=True)
            v = self._cx.var(f"t{low.tid_of[name]}_", F32)
            sw.body.append(Assign(v, Load(buf, rbase, sw.valid)))
            return [v] * vec
        if low.cls[name] is TensorClass.FULL:
            dsts = tuple(self._cx.var(f"t{low.tid_of[name]}_", F32) for _ in range(vec))
            idx = add(mul(Bin("min", sw.r, I(M - 1)), I(N)), self.ix.cc0)
            sw.body.extend(load_vec(dsts, buf, idx, sw.valid, zeroed=True))  # independent loads (rows unrolled)
            return list(dsts)
        v = self._cx.var(f"t{low.tid_of[name]}_", F32)  # PER_REDUCED: one value per row
        sw.body.append(Assign(v, Load(buf, Bin("min", sw.r, I(M - 1)), sw.valid)))
        return [v] * vec

    def sweep(self, reds: list[str], outputs: list[str]) -> None:
        """One pass over the thread's rows of its chunk: accumulate ``reds`` and/or store ``outputs``;
        ``R = low.rows`` rows per iteration (row vectors, :mod:`stitchtune.lower.row_vectors`)."""
        low, cx, ix, R = self._low, self._cx, self.ix, self._low.rows
        it, r_ = cx.var("i", I32), cx.var("r", I32)
        idx_it, ii = low.sweep_index(cx, it)
        valid = cx.var("v", kir.BOOL)
        accs: dict[str, ColState] = {}
        for r in reds:
            accs[r] = self.new_state(r)
            for st in accs[r]:
                self._rb.extend(reset(st))
        exact = rows_always_valid(low.p.M, low.s.split, low.chunk, low.rpt // R, low.s.tpr, R)   # no row guard
        lb: list[kir.Stmt] = [Assign(r_, add(ix.kbase, mul(add(mul(idx_it, I(low.s.tpr)), ix.tk), I(R)))),
                              Assign(valid, ix.cvalid if exact else Bin("&&", ix.cvalid, Bin("<", r_, ix.kend)))]
        rvl = RowVectorLoads(low, cx, lb, R, r_, ix.cc0, valid, self.use_input) if R > 1 else None
        for q in range(R):
            rq = r_ if q == 0 else cx.var("r", I32)
            if q:
                lb.append(Assign(rq, add(r_, I(q))))
            self._sweep_row(_ColSweep(add(mul(idx_it, I(R)), I(q)), rq, valid, lb), reds, accs, outputs, rvl, q)
        iters = low.rpt // R
        head = low.order_sweep(ii, it, iters, loads_from(lb, low.swept_inputs))
        whole = bool(self._lay.locals_) or iters <= 8
        by = 0 if whole else sweep_unroll(_loaded_floats(lb, low.in_buf.values()))
        self._rb.append(kir.For(it, I(0), I(iters), 1, tuple(head + lb), unroll=whole,
                                unroll_by=by if by > 1 else 0))
        for r in reds:
            self.keep_state(r, accs[r])

    def _sweep_row(self, sw: _ColSweep, reds: list[str], accs: dict[str, ColState], outputs: list[str],
                   rvl: RowVectorLoads | None, q: int) -> None:
        """The body of one row ``sw.r`` of a sweep iteration (row ``q`` of its row vector): its values,
        folded into ``accs`` and stored to ``outputs``."""
        low, cx, ix, lb, valid, r_ = self._low, self._cx, self.ix, sw.body, sw.valid, sw.r
        load = partial(self.load_input, sw)
        sv = SweepValues(low, cx, lb, low.s.vec, self._filled, self.broadcast, rvl.loader(q, load) if rvl else load,
                         partial(self.cache_index, sw), partial(self.smem_index, sw), low.kernel_reuse[self._ki])
        if low.index_ops:   # slice / concat along the columns (lower.col_remap)
            sv.index_value = ColRemapValues(low, cx, lb, sv, r_, ix.cc0, valid, self.use_input).node_value
        for r in reds:
            vals = sv.value(str(low.nodes[r].args[0]))
            for j, st in enumerate(accs[r]):
                assert isinstance(st, PlainState)
                lb.append(st.fold(vals[j], valid))
        for o in outputs:
            vals = sv.value(o)
            buf = low.out_buf[o]
            self.use_output(buf)
            if low.p.mapped(o):  # a permuted (bijective) map: stored through it
                rbase = low.row_base(o, Bin("min", r_, I(low.p.M - 1)))
                if low.cls[o] is TensorClass.FULL:
                    low.mapped_store(lb, o, rbase, ix.cc0, list(vals), low.once_pred(o, r_, valid))
                else:
                    lb.append(kir.StoreVec(buf, rbase, (vals[0],), and_(valid, Bin("==", ix.c0, I(0)))))
            elif low.cls[o] is TensorClass.FULL:
                lb.append(kir.StoreVec(buf, add(mul(r_, I(low.p.N)), ix.c0), tuple(vals), valid))
            else:  # PER_REDUCED output: one value per row, written by the first column's threads
                lb.append(kir.StoreVec(buf, r_, (vals[0],), and_(valid, Bin("==", ix.c0, I(0)))))
        if q == low.rows - 1:   # the caches a row wrote are read by the next sweep, not by this one's other rows
            self._filled.update(sv.newly)

    # -- what the column exchange uses (col_exchange.ColExchangeBuilder) ---------------------------
    @property
    def tile_cols(self) -> int:
        """Columns of one task's tile."""
        return self._low.TC

    def state_parts(self, st: ReductionState) -> tuple[str, ...]:
        """The scratch buffers of ``st``'s per-chunk partials (``split x N`` floats each), registered as
        used by this kernel."""
        names = tuple(self._low.scratch(n, self._low.s.split * self._low.p.N) for n in st.part_names(self._low.red_idx))
        self._cx.scratch.update(names)
        return names

    # -- stages and outputs -----------------------------------------------------------------------
    def reduce_stage(self, st: int, keep_results: bool) -> None:
        """Stage ``st``: its sweep (the first stage's also stores the outputs no reduction precedes,
        ``low.early``), the combine of the partials, and (unless the stage is independent) the final
        values; ``keep_results``: stored per column for a later kernel."""
        low, ix = self._low, self.ix
        reds = list(low.p.stages[st])
        scheme = low.schemes[low.s.schemes[st]]
        first = self._ki == 0 and st == 0
        self.sweep(reds, list(low.early) if first else [])
        exchange(self, ColExchange(self), [self._states[r] for r in reds], scheme)
        if not scheme.result_in_kernel:
            return
        for r in reds:
            self.finish_state(r)
            if keep_results:
                vb = low.scratch(f"val{low.red_idx[r]}", low.p.N)
                self._cx.scratch.add(vb)
                self._rb.extend(store_f32(vb, ix.cc0, tuple(self._pvals[r]), Bin("&&", ix.cvalid, Bin(
                    "&&", Bin("==", ix.tk, I(0)), Bin("==", ix.sidx, I(0))))))
        self.compute_p_nodes()

    def write_outputs(self) -> None:
        """The output sweep (full-size and per-reduced-index outputs that follow a reduction; the others
        were stored by the first sweep), then the per-column and scalar
        outputs, written by the first row thread of the first row chunk."""
        low, ix = self._low, self.ix
        outs = list(dict.fromkeys(low.g.outputs))
        f_outs = [o for o in outs if low.cls[o].varies_along_reduced and o not in low.early]
        if f_outs:
            self.sweep([], f_outs)
        for o in outs:
            c = low.cls[o]
            if c.varies_along_reduced:
                continue
            vals = self.load_p(o) if o in low.in_buf else self._pvals[o]
            buf = low.out_buf[o]
            self.use_output(buf)
            lead = Bin("&&", Bin("==", ix.tk, I(0)), Bin("==", ix.sidx, I(0)))
            if c is TensorClass.PER_KEPT and low.p.mapped(o):
                low.mapped_store(self._rb, o, I(0), ix.cc0, list(vals), Bin("&&", ix.cvalid, lead))
            elif c is TensorClass.PER_KEPT:
                self._rb.append(kir.StoreVec(buf, ix.c0, tuple(vals), Bin("&&", ix.cvalid, lead)))
            else:
                self._rb.append(kir.StoreVec(buf, I(0), (vals[0],), Bin("&&", Bin("==", ix.c0, I(0)),
                                                                         Bin("&&", ix.cvalid, lead))))

    def finish(self) -> tuple[kir.Kernel, kir.KernelProfile]:
        """The round loop, the kernel and its profile."""
        low, lay = self._low, self._lay
        low.order_tasks(self._rb, bool(sweep_reads(tuple(self._rb), low.swept_inputs)), lay.rounds * lay.grid)
        self._body.append(kir.For(self.ix.rd, I(0), I(lay.rounds), 1, tuple(self._rb)))
        kern = low.make_kernel(self._ki, self._uses, self._cx, self._body, list(lay.shared), list(lay.locals_),
                               lay.needs_sync)
        return kern, kernel_profile(low, kern, lay.grid, lay.rounds, lay.smem_bytes, self._est_regs, self._ki)


def _loaded_floats(stmts: list[kir.Stmt], inputs: Collection[str]) -> int:
    """Elements one pass of ``stmts`` loads from the buffers ``inputs`` (vector loads and scalar loads)."""
    bufs = set(inputs)
    n = 0
    for st in kir.walk(tuple(stmts)):
        if isinstance(st, kir.LoadVec) and st.buf in bufs:
            n += len(st.dsts)
        n += sum(1 for e in kir.exprs(st) if isinstance(e, kir.Load) and e.buf in bufs)
    return n


def col_sizes(plan: StitchPlan, s: Schedule) -> Sizes:
    """A column program's sizes: one of ``split`` row chunks of ``ceil(M / split)`` rows per task, of
    which a thread sweeps ``ceil(chunk / tpr)`` rows (its iterations) of ``vec`` columns."""
    chunk = math.ceil(plan.M / s.split)
    rpt = math.ceil(chunk / s.tpr)
    return Sizes(1, chunk, rpt * s.vec, rpt)


def lower_col(graph: Graph, plan: StitchPlan, schedule: Schedule, device: Device,
              schemes: SchemeTable = SCHEMES) -> kir.Program:
    """Lower a column-reduction graph (the schedule was already checked against the space whose scheme
    table is ``schemes``)."""
    return ColLowerer(graph, plan, schedule, device, schemes).lower()
