"""One kernel of a row-family program (:mod:`stitchtune.lower.row`), built phase by phase.

:class:`RowKernel` reads like the kernel: index set-up, the results of earlier kernels, per stage a
sweep (loads and reduce) and the exchange of its reduction states (:mod:`stitchtune.lower.exchange`),
the output sweep and stores, the round loop. Its fixed parts are frozen values (:class:`~stitchtune.lower.builder.RowLayout`,
:class:`~stitchtune.lower.builder.RowIndex`, :class:`RowSweep`). It implements
:class:`~stitchtune.lower.builder.RowKernelBuilder`, the interface the exchange's row layout, the cross
reductions, the gathers and the remaps use (its state and the narrow methods over it:
:class:`~stitchtune.lower.row_state.RowKernelState`).
"""

from __future__ import annotations

from functools import partial
from collections.abc import Iterator

from stitchtune.ir import kir
from stitchtune.ir.kir import F32, I32, Assign, Bin, Const, Load, LocalRef, Var
from stitchtune.lower import single_pass as sp
from stitchtune.lower.guarded_loads import load_vec
from stitchtune.lower.base import I, add, and_, Ctx, Lowerer, mul
from stitchtune.lower.profile import kernel_profile
from stitchtune.lower.row_layout import row_layout
from stitchtune.lower.sweep_values import SweepValues
from stitchtune.lower.builder import RowIndex, RowSweep, cols_exact, rows_exact
from stitchtune.lower.cluster import as_cluster
from stitchtune.lower.column_cache import cached_columns, column_array, load_columns
from stitchtune.lower.counts import loads_from, sweep_reads
from stitchtune.lower.cross import (cross_accumulate, cross_accumulate_rows, cross_epilogue, cross_init,
                                    cross_profile)
from stitchtune.lower.exchange import combine_partials, exchange
from stitchtune.lower.gather import pick_value
from stitchtune.lower.lane_order import piece_lanes, thread_coords
from stitchtune.lower.remap import RemapValues
from stitchtune.lower.row_exchange import RowExchange
from stitchtune.lower.row_state import RowKernelState
from stitchtune.lower.row_vectors import RowGroupLoads
from stitchtune.lower.state import PlainState, ReductionState, reset
from stitchtune.plan.planner import TensorClass
from stitchtune.space import ORDER, PREFETCH, Order


class RowKernel(RowKernelState):
    """One kernel of a row-family program, built phase by phase: the index set-up (constructor),
    the results of earlier kernels (:meth:`read_earlier_stages`), one sweep + combine per stage
    (:meth:`reduce_stage`), the output sweep and stores (:meth:`write_outputs`), the round loop
    (:meth:`finish`). Its building state is private (:class:`~stitchtune.lower.row_state.RowKernelState`:
    the state and the narrow interface over it); its only public field is ``ix`` (frozen). Besides:
    ``_filled`` (cached tensors written to their cache by an earlier sweep), ``_prefetched`` (inputs the
    first sweep takes from prefetch registers), the per-round row bases and reciprocals.
    """

    def __init__(self, low: Lowerer, ki: int, seg: list[int], tasks: int, est_regs: int, is_last: bool) -> None:
        """Kernel ``ki`` of ``low``'s program, running stages ``seg`` (``is_last``: the program's last
        kernel, which writes the outputs), over ``tasks`` tasks."""
        self._low, self._ki, self._est_regs = low, ki, est_regs
        s, p = low.s, low.p
        self._cx = cx = Ctx()
        self._is_last = is_last
        self._lay = row_layout(low, ki, seg, tasks, est_regs, self._is_last)
        lane, rib = cx.var("lane", I32), cx.var("rib", I32)
        # row-major lanes, or piece-major (concat pieces narrower than a warp, inputs read along the rows)
        #: view rows per thread and sweep iteration (row vectors, lower/row_vectors.py): its first row ``rowg``
        self._R = low.rows
        self._rowg = cx.var("rowg", I32) if self._R > 1 else kir.Var("rowg", I32)   # (numbered only where used)
        #: while a sweep evaluates one of its ``R`` rows: that row's row bases and where they are assigned
        self._q_bases: dict[str, Var] = {}
        self._q_body: list[kir.Stmt] | None = None
        pieces = piece_lanes(low.g, p, s, low.dev.warp_size, low.sym is not None, self._R)
        lane_e, rib_e = thread_coords(kir.Special("tid"), s.tpr, low.dev.warp_size, pieces)
        self._body: list[kir.Stmt] = [Assign(lane, lane_e), Assign(rib, rib_e)]
        rd, row, sidx = cx.var("rd", I32), cx.var("row", I32), cx.var("sidx", I32)
        rvalid, kbase, kend = cx.var("rv", kir.BOOL), cx.var("kb", I32), cx.var("ke", I32)
        self.ix = RowIndex(lane, rib, rd, row, sidx, rvalid, kbase, kend)
        self._rb: list[kir.Stmt] = self.round_head(tasks)
        # a guard that is not the constant true (a persistent grid, ragged rows or pieces): its loads start
        # from zeros, so that each is independent of the one before (lower.guarded_loads)
        self._zero_guarded = not (rows_exact(low, self._lay, tasks) and cols_exact(low))
        self._uses: dict[str, set[str]] = {"in": set(), "out": set()}
        self._pvals: dict[str, kir.Expr] = {}
        self._filled: set[str] = set()
        self._prefetched: list[str] = []
        #: per-column inputs read from registers loaded once before the task loop (lower.column_cache)
        self._columns = cached_columns(low, self._lay.rounds)
        self._columns_read: set[str] = set()
        self._recips: dict[str, Var] = {}  # per-row reciprocals (fast division), by divisor
        self._row_bases: dict[str, Var] = {}  # mapped inputs: their row base in this round
        self._gather_rows: dict[str, Var] = {}  # gather nodes: their table row in this round
        self._first_sweep = s.option(PREFETCH)  # the next sweep is the kernel's first (with prefetch on)
        self._prev_stages = [i for i in range(p.nstages) if i < (seg[0] if seg else p.nstages)]
        self._cross_acc = cross_init(self) if self._is_last and p.cross else {}  # scalar cross accumulators

    # -- indices ----------------------------------------------------------------------------------
    def round_head(self, tasks: int) -> list[kir.Stmt]:
        """The statements that start a round: its task, and the task's row, split index and range."""
        s, ix, cx = self._low.s, self.ix, self._cx
        S, M, N, chunk = s.split, self._low.p.M, self._low.p.N, self._low.chunk
        rb: list[kir.Stmt] = []
        task = add(mul(ix.rd, kir.Special("gdim")), kir.Special("bid"))
        if s.option(ORDER) == Order.ALTERNATE:
            tq = cx.var("tq", I32)
            rb.append(Assign(tq, task))  # reversed by order_tasks when this kernel runs its tasks backwards
            task = tq
        if S == 1 and self._R > 1:   # the thread's first row; each row of the group is assigned per sweep copy
            rb += [Assign(self._rowg, self.row_of(task)), Assign(ix.row, self._rowg), Assign(ix.sidx, I(0))]
        elif S == 1:
            rb += [Assign(ix.row, self.row_of(task)), Assign(ix.sidx, I(0))]
        else:
            tv = cx.var("task", I32)
            rb += [Assign(tv, task), Assign(ix.row, Bin("/", tv, I(S))), Assign(ix.sidx, Bin("%", tv, I(S)))]
        rows_ok: kir.Expr = (Const(True, kir.BOOL) if rows_exact(self._low, self._lay, tasks)
                             else Bin("<", ix.row, self._low.m_expr()))
        rb += [Assign(ix.rvalid, rows_ok),
               Assign(ix.kbase, mul(ix.sidx, I(chunk))),
               Assign(ix.kend, Bin("min", add(ix.kbase, I(chunk)), self._low.n_expr()))]
        return rb

    def rounds(self) -> kir.Expr:
        """The round loop's trip count (a constant; in a generic kernel computed from the extents)."""
        return self._low.rounds_expr(self._lay.rounds, self._low.rpb, self._low.s.split)

    def row_of(self, t: kir.Expr) -> kir.Expr:
        """This thread's (first) row of row group ``t`` (split 1)."""
        return add(mul(t, I(self._low.rpb)), mul(self.ix.rib, I(self._R)) if self._R > 1 else self.ix.rib)

    def f_index(self, r: kir.Expr, k: kir.Expr, name: str | None = None) -> kir.Expr:
        """Element ``k`` of row ``r`` of a full-size tensor (of input ``name``, through its index map
        when it broadcasts along part of the rows)."""
        low = self._low
        if name is not None and low.p.mapped(name):
            return add(low.row_base(name, Bin("min", r, low.m_last())), k)
        return add(mul(Bin("min", r, low.m_last()), low.n_expr()), k)

    def round_row_base(self, name: str) -> kir.Expr:
        """The row base of mapped input ``name`` at this round's row, computed once per round (the
        first use appends its assignment to the round body, ahead of the sweep that needs it); with row
        vectors, once per row of the sweep's group, in the sweep's body."""
        if self._q_body is not None:
            if name not in self._q_bases:
                v = self._cx.var("rb", I32)
                self._q_body.append(Assign(v, self._low.row_base(name, Bin("min", self.ix.row, self._low.m_last()))))
                self._q_bases[name] = v
            return self._q_bases[name]
        if name not in self._row_bases:
            v = self._cx.var("rb", I32)
            self._rb.append(Assign(v, self._low.row_base(name, Bin("min", self.ix.row, self._low.m_last()))))
            self._row_bases[name] = v
        return self._row_bases[name]

    # -- per-row values ---------------------------------------------------------------------------
    def load_p(self, name: str) -> kir.Expr:
        """A per-row (PER_KEPT) or scalar input value."""
        low, ix = self._low, self.ix
        if name in self._pvals:
            return self._pvals[name]
        v = self._cx.var("p", low.vtype(name))
        buf = low.in_buf[name]
        self._uses["in"].add(buf)
        per_row = low.cls[name] is TensorClass.PER_KEPT
        idx = ix.row if per_row else I(0)
        pred = ix.rvalid if per_row else None
        if low.p.mapped(name):  # per-row along part of the row axes: its own row index
            self._rb.append(Assign(v, low.load(name, self.round_row_base(name), pred)))
        else:
            self._rb.append(Assign(v, low.load(name, Bin("min", idx, low.m_last()) if per_row else idx, pred)))
        self._pvals[name] = v
        return v

    def compute_p_nodes(self) -> None:
        """Compute the per-row and scalar nodes whose reductions are all available, and the picks
        (``gather_elements``, :func:`~stitchtune.lower.gather.pick_value`) whose per-row values are."""
        picks = [nd for nd in self._low.g.nodes if nd.op == "gather_elements"]
        while True:
            for nd in picks:
                if nd.id not in self._pvals:
                    pv = pick_value(self, nd)
                    if pv is not None:
                        self._pvals[nd.id] = pv
            before = len(self._pvals)
            for nd, args in self._low.ready_p_nodes(self._pvals, self.load_p, lambda c: Const(c, F32)):
                v = self._cx.var("p", self._low.vtype(nd.id))
                if nd.op == "iota":  # per-row (or scalar): its coordinate from the row's offset in it
                    self._rb.append(Assign(v, self._low.iota_at(nd.id, self.round_row_base(nd.id))))
                else:
                    self._rb.append(Assign(v, self._low.expr_of_node(nd, args)))
                self._pvals[nd.id] = v
            if len(self._pvals) == before or all(nd.id in self._pvals for nd in picks):
                return

    def read_earlier_stages(self) -> None:
        """The results of the stages of earlier kernels: combined from their partials (an
        independent stage) or the final per-row value an earlier kernel stored."""
        low, ix, p = self._low, self.ix, self._low.p
        for st in self._prev_stages:
            if low.stage_scheme(st).result_in_kernel:
                self.load_stage_values(st)
            elif not low.merged_second(st):  # (a pair's second stage is combined with its first)
                for state in self.new_states(st):
                    combine_partials(self, RowExchange(self), (state,))
                    self.take_results(state)
        self.compute_p_nodes()

    def new_states(self, st: int) -> Iterator[ReductionState]:
        """Fresh reduction states of stage ``st``, one at a time: the running state of its single-pass
        pair, or a one-slot state per reduction."""
        low = self._low
        if st in low.merged:
            yield sp.new_state(low.merged[st], self._cx.var)
            return
        for r in low.p.stages[st]:
            yield PlainState(r, self._cx.var("acc", F32), low.red_info(r))

    def take_results(self, state: ReductionState) -> list[str]:
        """The final values of a complete state's reductions (``pvals``); returns their names."""
        stmts, values = state.finish(self._low.k_value(), self._cx.var)
        self._rb.extend(stmts)
        for r, v in values:
            self._pvals[r] = v
        return [r for r, _ in values]

    def load_stage_values(self, st: int) -> None:
        """The final per-row values of stage ``st``, which an earlier kernel stored."""
        low, ix, p = self._low, self.ix, self._low.p
        for r in p.stages[st]:
            vb = low.scratch(f"val{low.red_idx[r]}", p.P)
            self._cx.scratch.add(vb)
            v = self._cx.var("acc", F32)
            self._rb.append(Assign(v, Load(vb, Bin("min", ix.row, low.m_last()), ix.rvalid)))
            self._pvals[r] = v

    # -- sweeps -----------------------------------------------------------------------------------
    def prefetch_rows(self, task_expr: kir.Expr, valid_task: kir.Expr | None) -> list[kir.Stmt]:
        """Statements loading the prefetched inputs of the row group ``task_expr`` into pf<t>."""
        low, cx, s = self._low, self._cx, self._low.s
        tpr, vec, M, N = s.tpr, s.vec, low.p.M, low.p.N
        tn, rown, vn = cx.var("tn", I32), cx.var("rown", I32), cx.var("vn", kir.BOOL)
        ip, kp, vp = cx.var("ip", I32), cx.var("kp", I32), cx.var("vp", kir.BOOL)
        row_ok = Bin("<", rown, low.m_expr())
        out: list[kir.Stmt] = [Assign(tn, task_expr), Assign(rown, self.row_of(tn)),
                               Assign(vn, row_ok if valid_task is None else Bin("&&", valid_task, row_ok))]
        lp: list[kir.Stmt] = [Assign(kp, mul(add(mul(ip, I(tpr)), self.ix.lane), I(vec))),
                    Assign(vp, Bin("&&", vn, Bin("<", kp, low.n_expr())))]
        for name in self._prefetched:
            tix = low.tid_of[name]
            dsts: list[kir.Expr]
            if low.p.imap(name).partial_cols or low.p.imap(name).vector_mode(vec) == "scalar":  # through the map
                dsts = low.mapped_load(cx, lp, name, low.row_base(name, Bin("min", rown, low.m_last())), kp, vp,
                                       f"f{tix}_")
            else:
                loaded = tuple(cx.var(f"f{tix}_", F32) for _ in range(vec))
                lp.append(kir.LoadVec(loaded, low.in_buf[name], self.f_index(rown, kp, name), vp))
                dsts = list(loaded)
            lp += [kir.SetLocal(f"pf{tix}", add(mul(ip, I(vec)), I(j)), dsts[j]) for j in range(vec)]
        out.append(kir.For(ip, I(0), I(low.iters), 1, tuple(lp), unroll=True))
        return out

    def cache_index(self, sw: RowSweep, j: int) -> kir.Expr:
        return add(mul(sw.idx, I(self._low.s.vec)), I(j))

    def smem_index(self, sw: RowSweep, j: int) -> kir.Expr:
        tpr, vec, chunk = self._low.s.tpr, self._low.s.vec, self._low.chunk
        return add(mul(self.ix.rib, I(chunk)), add(mul(add(mul(sw.idx, I(vec)), I(j)), I(tpr)), self.ix.lane))

    def reciprocal(self, name: str) -> kir.Expr:
        """``1 / name`` of a per-row or scalar value (``fast_rcp``), once per round before the first sweep asking."""
        if name not in self._recips:
            vals = self.broadcast(name)
            assert vals is not None, f"{name} varies along the row"
            self._recips[name] = v = self._cx.var("rcp", F32)
            self._rb.append(Assign(v, kir.MathOp("fast_rcp", (vals[0],))))
        return self._recips[name]

    def broadcast(self, name: str) -> list[kir.Expr] | None:
        """The ``vec`` values of a per-row or scalar tensor (None for the others)."""
        if self._low.cls[name].varies_along_reduced:
            return None
        if name in self._low.in_buf and name not in self._pvals:
            self.load_p(name)
        return [self._pvals[name]] * self._low.s.vec

    def load_input(self, sw: RowSweep, name: str) -> list[kir.Expr]:
        """The ``vec`` values of a full-size or per-reduced-index input at the sweep's element."""
        low, vec = self._low, self._low.s.vec
        buf = low.in_buf[name]
        self._uses["in"].add(buf)
        if name in self._columns:
            self._columns_read.add(name)
            return [LocalRef(column_array(low, name), self.cache_index(sw, j)) for j in range(vec)]
        if sw.from_prefetch and low.cls[name] is TensorClass.FULL and name not in low.int_regs:
            self._prefetched.append(name)
            return [LocalRef(f"pf{low.tid_of[name]}", self.cache_index(sw, j)) for j in range(vec)]
        # varies along part of the columns, or a row stride off the vector grid: through the map
        if low.p.imap(name).partial_cols or low.p.imap(name).vector_mode(vec) == "scalar":
            base = self.round_row_base(name) if low.cls[name] is TensorClass.FULL else I(0)
            return low.mapped_load(self._cx, sw.body, name, base, sw.k0, sw.valid, f"t{low.tid_of[name]}_",
                                   zeroed=self._zero_guarded)
        dsts = tuple(self._cx.var(f"t{low.tid_of[name]}_", low.vtype(name)) for _ in range(vec))
        if low.cls[name] is TensorClass.FULL and low.p.mapped(name):  # broadcast along part of the rows
            idx = add(self.round_row_base(name), sw.k0)
        elif low.cls[name] is TensorClass.FULL:
            idx = self.f_index(self.ix.row, sw.k0)
        else:  # PER_REDUCED: varies along the row only
            idx = sw.k0
        sw.body.extend(load_vec(dsts, buf, idx, sw.valid, zeroed=self._zero_guarded))
        return list(dsts)

    def iota_values(self, sw: RowSweep, name: str) -> list[kir.Expr]:
        """The ``vec`` values of a full-size or per-reduced-index ``iota`` at the sweep's element (index
        arithmetic on its map's offset, no memory access)."""
        low = self._low
        base = self.round_row_base(name) if low.cls[name] is TensorClass.FULL else I(0)
        out: list[kir.Expr] = []
        for j in range(low.s.vec):
            v = self._cx.var(f"t{low.tid_of[name]}_", low.vtype(name))
            sw.body.append(Assign(v, low.iota_at(name, add(base, low.col_offset(name, add(sw.k0, I(j)))))))
            out.append(v)
        return out

    def sweep(self, reds: list[str], outputs: list[str], online: sp.OnlineState | None = None,
              cross: bool = False) -> list[ReductionState]:
        """One pass over the thread's elements: accumulate ``reds`` and/or store ``outputs``, and fold
        the source of a single-pass candidate into its running state ``online`` (and, with ``cross``,
        the full-size sources of the cross reductions into their accumulators). Returns the states of
        ``reds`` (one slot each), or ``[online]``."""
        low, cx, ix, s = self._low, self._cx, self.ix, self._low.s
        tpr, vec, N = s.tpr, s.vec, low.p.N
        it = cx.var("i", I32)
        idx_it, ii = low.sweep_index(cx, it)
        from_prefetch, self._first_sweep = self._first_sweep, False
        lb: list[kir.Stmt] = []
        accs = [PlainState(r, cx.var("acc", F32), low.red_info(r)) for r in reds]
        for acc in accs:
            self._rb.extend(reset(acc))
        k0 = cx.var("k", I32)
        lb.append(Assign(k0, add(ix.kbase, mul(add(mul(idx_it, I(tpr)), ix.lane), I(vec)))))
        valid = cx.var("v", kir.BOOL)
        # no bounds guard where the extent divides (cols_exact): the row guard alone, constant true
        # where the grid covers the rows exactly (rows_exact)
        lb.append(Assign(valid, ix.rvalid if cols_exact(self._low) else Bin("&&", ix.rvalid, Bin("<", k0, ix.kend))))
        sw = RowSweep(idx_it, k0, valid, lb, from_prefetch)
        if self._R > 1:   # row vectors: the element of each of the thread's R rows (lower/row_vectors.py)
            assert not accs and online is None and not cross, "row vectors are for element-wise plans"
            group = RowGroupLoads(self._R, lb, cx.var)
            for q in range(self._R):
                lb.append(Assign(ix.row, add(self._rowg, I(q))))
                self._q_bases, self._q_body = {}, lb
                self.element(sw, accs, online, outputs, cross, (group, q))
            self._q_body = None
        else:
            sv = self.element(sw, accs, online, outputs, cross, None)
            self._filled.update(sv.newly)
        unroll = bool(self._lay.locals_) or low.iters <= 8 or from_prefetch or bool(self._columns_read)
        # the sweep reads memory: it loads a full-size input, or takes the prefetched ones
        reads = loads_from(lb, low.swept_inputs) or (from_prefetch and bool(self._prefetched))
        head = low.order_sweep(ii, it, low.iters, reads)
        self._rb.append(kir.For(it, I(0), I(low.iters), 1, tuple(head + lb), unroll=unroll))
        if self._prefetched and from_prefetch:  # the next task's inputs, in flight while this one reduces
            nxt = add(ix.rd, I(1))
            self._rb.extend(self.prefetch_rows(add(mul(nxt, kir.Special("gdim")), kir.Special("bid")),
                                              Bin("<", nxt, self.rounds())))
        for acc in accs:
            self._pvals[acc.reduction] = acc.acc
        return [online] if online is not None else list(accs)

    def element(self, sw: RowSweep, accs: list[PlainState], online: sp.OnlineState | None, outputs: list[str],
                cross: bool, group: tuple[RowGroupLoads, int] | None) -> SweepValues:
        """The sweep iteration's work at the element of row ``ix.row``: fold ``accs`` / ``online``, store
        ``outputs``, accumulate the cross reductions; ``group``: the row-vector loads and this row's index
        in the thread's rows (row vectors), else None. Returns the element's values."""
        low, cx, ix, vec = self._low, self._cx, self.ix, self._low.s.vec
        lb, k0, valid = sw.body, sw.k0, sw.valid
        sv = SweepValues(low, cx, lb, vec, self._filled, self.broadcast, partial(self.load_input, sw), partial(
            self.cache_index, sw), partial(self.smem_index, sw), low.kernel_reuse[self._ki])
        rv = RemapValues(self, sw, sv, group)
        sv.index_value = rv.node_value
        sv.iota_value = partial(self.iota_values, sw)
        sv.reciprocal = self.reciprocal
        for acc in accs:
            vals = sv.value(str(low.nodes[acc.reduction].args[0]))
            lb.extend(acc.fold(vals[j], valid) for j in range(vec))
        if online is not None:
            self._rb.extend(sp.reset(online))
            lb.extend(sp.update_vector(online, list(sv.value(online.cand.source)), valid, cx.var))
        for o in outputs:
            vals = rv.output_value(o) or sv.value(o)
            buf = low.out_buf[o]
            self._uses["out"].add(buf)
            c = low.cls[o]
            if low.p.mapped(o):  # a permuted (bijective) map: stored through it
                base = low.row_base(o, Bin("min", ix.row, low.m_last())) if c is TensorClass.FULL else I(0)
                pred = (low.once_pred(o, ix.row, valid) if c is TensorClass.FULL else
                        and_(valid, Bin("==", ix.row, I(0))))
                low.mapped_store(lb, o, base, k0, list(vals), pred)
            elif c is TensorClass.FULL:
                lb.append(kir.StoreVec(buf, add(mul(ix.row, low.n_expr()), k0), tuple(vals), valid))
            elif c is TensorClass.PER_REDUCED:
                lb.append(kir.StoreVec(buf, k0, tuple(vals), and_(valid, Bin("==", ix.row, I(0)))))
        if cross:
            cross_accumulate(self, sw, sv, lb)
        return sv

    # -- stages and outputs -----------------------------------------------------------------------
    def reduce_stage(self, st: int, keep_results: bool) -> None:
        """Stage ``st`` (with the next one, for the first stage of a single-pass pair): its sweep, the
        exchange of its reduction states per the stage's scheme (:func:`stitchtune.lower.exchange.exchange`)
        and, where the scheme leaves the values in this kernel, the final values; ``keep_results``:
        stored per row for a later kernel."""
        low = self._low
        cand = low.merged.get(st)
        if cand is not None:
            states = self.sweep([], [], online=sp.new_state(cand, self._cx.var))
        else:
            states = self.sweep(list(low.p.stages[st]), [])
        scheme = low.stage_scheme(st)
        exchange(self, RowExchange(self), [(st,) for st in states], scheme)
        if not scheme.result_in_kernel:
            return
        for state in states:
            for r in self.take_results(state):
                if keep_results:  # a later kernel needs it: keep the final value per row
                    self.store_value(r)
        self.compute_p_nodes()

    def store_value(self, r: str) -> None:
        """The final value of reduction ``r`` per row to ``val<r>``, written by the row's first lane of
        its first split block."""
        low, ix, p = self._low, self.ix, self._low.p
        vb = low.scratch(f"val{low.red_idx[r]}", p.P)
        self._cx.scratch.add(vb)
        leader = Bin("&&", Bin("==", Bin("%", kir.Special("tid"), I(low.s.tpr)), I(0)), Bin("==", ix.sidx, I(0)))
        self._rb.append(kir.StoreVec(vb, Bin("min", ix.row, low.m_last()), (self._pvals[r],),
                                    Bin("&&", ix.rvalid, leader)))

    def write_outputs(self) -> None:
        """The output sweep (full-size and per-reduced-index outputs), then the per-row and scalar
        outputs, written by the row's first lane of its first split block."""
        low, ix = self._low, self.ix
        crossed = {c.node for c in low.p.cross} | set(low.p.epilogue)  # stored after the cross combine
        outs = [o for o in dict.fromkeys(low.g.outputs) if o not in crossed]
        f_outs = [o for o in outs if low.cls[o].varies_along_reduced]
        x_full = any(c.source_full for c in low.p.cross)
        if f_outs or x_full:
            self.sweep([], f_outs, cross=x_full)
        if low.p.cross:
            cross_accumulate_rows(self)
        for o in outs:
            c = low.cls[o]
            if c.varies_along_reduced:
                continue
            if o not in self._pvals and o in low.in_buf:
                self.load_p(o)
            buf = low.out_buf[o]
            self._uses["out"].add(buf)
            leader = Bin("&&", Bin("==", ix.lane, I(0)), Bin("==", ix.sidx, I(0)))
            if c is TensorClass.PER_KEPT and low.p.mapped(o):  # a permuted (bijective) map of the rows
                self._rb.append(kir.StoreVec(buf, low.row_base(o, Bin("min", ix.row, low.m_last())),
                                            (self._pvals[o],), Bin("&&", ix.rvalid, leader)))
            elif c is TensorClass.PER_KEPT:
                self._rb.append(kir.StoreVec(buf, ix.row, (self._pvals[o],), Bin("&&", ix.rvalid, leader)))
            else:
                self._rb.append(kir.StoreVec(buf, I(0), (self._pvals[o],),
                                            Bin("&&", Bin("==", ix.row, I(0)), leader)))

    def finish(self) -> tuple[kir.Kernel, kir.KernelProfile]:
        """The round loop (after the first task's prefetch), the kernel and its profile."""
        low, lay = self._low, self._lay
        total = lay.rounds * lay.grid if low.sym is None else Bin("*", self.rounds(), kir.Special("gdim"))
        low.order_tasks(self._rb, bool(sweep_reads(tuple(self._rb), low.swept_inputs)), total)
        locals_ = list(lay.locals_)
        if self._prefetched:  # the first task's inputs, before the round loop
            locals_ += [kir.LocalArray(f"pf{low.tid_of[n]}", low.per_thread) for n in self._prefetched]
            self._body.extend(self.prefetch_rows(kir.Special("bid"), None))
        cols = tuple(n for n in self._columns if n in self._columns_read)
        locals_ += [kir.LocalArray(column_array(low, n), low.per_thread) for n in cols]
        self._body.extend(load_columns(low, self._cx, self.ix.lane, cols))
        self._body.append(kir.For(self.ix.rd, I(0), self.rounds(), 1, tuple(self._rb)))
        if self._is_last and low.p.cross:
            self._body.extend(cross_epilogue(self, self._cx, self._uses))
        kern = low.make_kernel(self._ki, self._uses, self._cx, self._body, list(lay.shared), locals_, lay.needs_sync)
        prof = kernel_profile(low, kern, lay.grid, lay.rounds, lay.smem_bytes, self._est_regs, self._ki)
        if self._is_last and low.p.cross:
            prof = cross_profile(low, lay.grid, lay.rounds, prof)
        if lay.cluster > 1:  # launched as thread-block clusters (stitchtune.lower.cluster)
            kern, prof = as_cluster(kern, prof, lay.cluster, lay.rounds)
        return kern, prof
