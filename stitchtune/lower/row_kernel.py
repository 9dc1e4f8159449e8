"""One kernel of a row-family program (:mod:`stitchtune.lower.row`), built phase by phase.

:class:`RowKernel` reads like the kernel: index set-up, the results of earlier kernels, per stage a
sweep (loads and reduce) and the exchange of its reduction states (:mod:`stitchtune.lower.exchange`),
the output sweep and stores, the round loop. Its fixed parts are frozen values (:class:`~stitchtune.lower.builder.RowLayout`,
:class:`~stitchtune.lower.builder.RowIndex`, :class:`RowSweep`). It implements
:class:`~stitchtune.lower.builder.RowKernelBuilder`, the interface the exchange, cluster, cross and
remap modules use.
"""

from __future__ import annotations

from functools import partial
from typing import Iterator

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
from stitchtune.lower.counts import loads_from, sweep_reads
from stitchtune.lower.cross import (cross_accumulate, cross_accumulate_rows, cross_epilogue, cross_init,
                                    cross_profile)
from stitchtune.lower.exchange import combine_partials, exchange
from stitchtune.lower.gather import pick_value
from stitchtune.lower.remap import RemapValues
from stitchtune.lower.state import PlainState, ReductionState, reset
from stitchtune.plan.planner import StitchPlan, TensorClass
from stitchtune.space import ORDER, PREFETCH, Order, Schedule


class RowKernel:
    """One kernel of a row-family program, built phase by phase: the index set-up (constructor),
    the results of earlier kernels (:meth:`read_earlier_stages`), one sweep + combine per stage
    (:meth:`reduce_stage`), the output sweep and stores (:meth:`write_outputs`), the round loop
    (:meth:`finish`).

    State while building: ``body`` (statements before the round loop), ``rb`` (the round body),
    ``pvals`` (per-row and scalar values available, by tensor name), ``uses`` (global buffers read and written), ``filled`` (cached tensors written to their
    cache by an earlier sweep), ``prefetched`` (inputs the first sweep takes from prefetch registers).
    """

    def __init__(self, low: Lowerer, ki: int, seg: list[int], tasks: int, est_regs: int) -> None:
        self.low, self.ki, self.est_regs = low, ki, est_regs
        s, p = low.s, low.p
        self.cx = cx = Ctx()
        self.is_last = ki == low.n_kernels - 1
        self.lay = row_layout(low, ki, seg, tasks, est_regs, self.is_last)
        lane, rib = cx.var("lane", I32), cx.var("rib", I32)
        tid = kir.Special("tid")
        self.body: list[kir.Stmt] = [Assign(lane, Bin("%", tid, I(s.tpr))), Assign(rib, Bin("/", tid, I(s.tpr)))]
        rd, row, sidx = cx.var("rd", I32), cx.var("row", I32), cx.var("sidx", I32)
        rvalid, kbase, kend = cx.var("rv", kir.BOOL), cx.var("kb", I32), cx.var("ke", I32)
        self.ix = RowIndex(lane, rib, rd, row, sidx, rvalid, kbase, kend)
        self.rb: list[kir.Stmt] = self.round_head(tasks)
        # a guard that is not the constant true (a persistent grid, ragged rows or pieces): its loads start
        # from zeros, so that each is independent of the one before (lower.guarded_loads)
        self.zero_guarded = not (rows_exact(low, self.lay, tasks) and cols_exact(low))
        self.uses: dict[str, set[str]] = {"in": set(), "out": set()}
        self.pvals: dict[str, kir.Expr] = {}
        self.filled: set[str] = set()
        self.prefetched: list[str] = []
        self.recips: dict[str, Var] = {}  # per-row reciprocals (fast division), by divisor
        self.row_bases: dict[str, Var] = {}  # mapped inputs: their row base in this round
        self.gather_rows: dict[str, Var] = {}  # gather nodes: their table row in this round
        self.first_sweep = bool(s.option(PREFETCH))  # the next sweep is the kernel's first (with prefetch on)
        self.prev_stages = [i for i in range(p.nstages) if i < (seg[0] if seg else p.nstages)]
        self.cross_acc = cross_init(self) if self.is_last and p.cross else {}  # scalar cross accumulators

    # -- the ExchangeBuilder interface (stitchtune.lower.builder) -------------------------------------
    @property
    def schedule(self) -> Schedule:
        return self.low.s

    @property
    def plan(self) -> StitchPlan:
        return self.low.p

    @property
    def rows_per_block(self) -> int:
        return self.low.rpb

    @property
    def chunk(self) -> int:
        return self.low.chunk

    def var(self, prefix: str, dtype: str = F32) -> Var:
        return self.cx.var(prefix, dtype)

    def emit(self, *stmts: kir.Stmt) -> None:
        self.rb.extend(stmts)

    def value_of(self, name: str) -> kir.Expr | None:
        return self.pvals.get(name)

    def use_input(self, buf: str) -> None:
        self.uses["in"].add(buf)

    def use_output(self, buf: str) -> None:
        self.uses["out"].add(buf)

    def cross_accumulator(self, i: int) -> Var:
        return self.cross_acc[i]

    def last_row(self) -> kir.Expr:
        return self.low.m_last()

    def state_parts(self, st: ReductionState) -> tuple[str, ...]:
        low = self.low
        parts = tuple(low.scratch(n, low.p.M * low.s.split) for n in st.part_names(low.red_idx))
        self.cx.scratch.update(parts)
        return parts

    # -- indices ----------------------------------------------------------------------------------
    def round_head(self, tasks: int) -> list[kir.Stmt]:
        """The statements that start a round: its task, and the task's row, split index and range."""
        s, ix, cx = self.low.s, self.ix, self.cx
        S, M, N, chunk = s.split, self.low.p.M, self.low.p.N, self.low.chunk
        rb: list[kir.Stmt] = []
        task = add(mul(ix.rd, kir.Special("gdim")), kir.Special("bid"))
        if s.option(ORDER) == Order.ALTERNATE:
            tq = cx.var("tq", I32)
            rb.append(Assign(tq, task))  # reversed by order_tasks when this kernel runs its tasks backwards
            task = tq
        if S == 1:
            rb += [Assign(ix.row, self.row_of(task)), Assign(ix.sidx, I(0))]
        else:
            tv = cx.var("task", I32)
            rb += [Assign(tv, task), Assign(ix.row, Bin("/", tv, I(S))), Assign(ix.sidx, Bin("%", tv, I(S)))]
        rows_ok: kir.Expr = (Const(True, kir.BOOL) if rows_exact(self.low, self.lay, tasks)
                             else Bin("<", ix.row, self.low.m_expr()))
        rb += [Assign(ix.rvalid, rows_ok),
               Assign(ix.kbase, mul(ix.sidx, I(chunk))),
               Assign(ix.kend, Bin("min", add(ix.kbase, I(chunk)), self.low.n_expr()))]
        return rb

    def rounds(self) -> kir.Expr:
        """The round loop's trip count (a constant; in a generic kernel computed from the extents)."""
        return self.low.rounds_expr(self.lay.rounds, self.low.rpb, self.low.s.split)

    def row_of(self, t: kir.Expr) -> kir.Expr:
        """This thread's row of row group ``t`` (split 1)."""
        return add(mul(t, I(self.low.rpb)), self.ix.rib)

    def f_index(self, r: kir.Expr, k: kir.Expr, name: str | None = None) -> kir.Expr:
        """Element ``k`` of row ``r`` of a full-size tensor (of input ``name``, through its index map
        when it broadcasts along part of the rows)."""
        low = self.low
        if name is not None and low.p.mapped(name):
            return add(low.row_base(name, Bin("min", r, low.m_last())), k)
        return add(mul(Bin("min", r, low.m_last()), low.n_expr()), k)

    def round_row_base(self, name: str) -> kir.Expr:
        """The row base of mapped input ``name`` at this round's row, computed once per round (the
        first use appends its assignment to the round body, ahead of the sweep that needs it)."""
        if name not in self.row_bases:
            v = self.cx.var("rb", I32)
            self.rb.append(Assign(v, self.low.row_base(name, Bin("min", self.ix.row, self.low.m_last()))))
            self.row_bases[name] = v
        return self.row_bases[name]

    # -- per-row values ---------------------------------------------------------------------------
    def load_p(self, name: str) -> kir.Expr:
        """A per-row (PER_KEPT) or scalar input value."""
        low, ix = self.low, self.ix
        if name in self.pvals:
            return self.pvals[name]
        v = self.cx.var("p", low.vtype(name))
        buf = low.in_buf[name]
        self.uses["in"].add(buf)
        per_row = low.cls[name] is TensorClass.PER_KEPT
        idx = ix.row if per_row else I(0)
        pred = ix.rvalid if per_row else None
        if low.p.mapped(name):  # per-row along part of the row axes: its own row index
            self.rb.append(Assign(v, low.load(name, self.round_row_base(name), pred)))
        else:
            self.rb.append(Assign(v, low.load(name, Bin("min", idx, low.m_last()) if per_row else idx, pred)))
        self.pvals[name] = v
        return v

    def compute_p_nodes(self) -> None:
        """Compute the per-row and scalar nodes whose reductions are all available, and the picks
        (``gather_elements``, :func:`~stitchtune.lower.gather.pick_value`) whose per-row values are."""
        picks = [nd for nd in self.low.g.nodes if nd.op == "gather_elements"]
        while True:
            for nd in picks:
                if nd.id not in self.pvals:
                    pv = pick_value(self, nd)
                    if pv is not None:
                        self.pvals[nd.id] = pv
            before = len(self.pvals)
            for nd, args in self.low.ready_p_nodes(self.pvals, self.load_p, lambda c: Const(c, F32)):
                v = self.cx.var("p", self.low.vtype(nd.id))
                if nd.op == "iota":  # per-row (or scalar): its coordinate from the row's offset in it
                    self.rb.append(Assign(v, self.low.iota_at(nd.id, self.round_row_base(nd.id))))
                else:
                    self.rb.append(Assign(v, self.low.expr_of_node(nd, args)))
                self.pvals[nd.id] = v
            if len(self.pvals) == before or all(nd.id in self.pvals for nd in picks):
                return

    def read_earlier_stages(self) -> None:
        """The results of the stages of earlier kernels: combined from their partials (an
        independent stage) or the final per-row value an earlier kernel stored."""
        low, ix, p = self.low, self.ix, self.low.p
        for st in self.prev_stages:
            if low.stage_scheme(st).result_in_kernel:
                self.load_stage_values(st)
            elif not low.merged_second(st):  # (a pair's second stage is combined with its first)
                for state in self.new_states(st):
                    combine_partials(self, state)
                    self.take_results(state)
        self.compute_p_nodes()

    def new_states(self, st: int) -> Iterator[ReductionState]:
        """Fresh reduction states of stage ``st``, one at a time: the running state of its single-pass
        pair, or a one-slot state per reduction."""
        low = self.low
        if st in low.merged:
            yield sp.new_state(low.merged[st], self.cx.var)
            return
        for r in low.p.stages[st]:
            yield PlainState(r, self.cx.var("acc", F32), low.red_info(r))

    def take_results(self, state: ReductionState) -> list[str]:
        """The final values of a complete state's reductions (``pvals``); returns their names."""
        stmts, values = state.finish(self.low.k_value(), self.cx.var)
        self.rb.extend(stmts)
        for r, v in values:
            self.pvals[r] = v
        return [r for r, _ in values]

    def load_stage_values(self, st: int) -> None:
        """The final per-row values of stage ``st``, which an earlier kernel stored."""
        low, ix, p = self.low, self.ix, self.low.p
        for r in p.stages[st]:
            vb = low.scratch(f"val{low.red_idx[r]}", p.P)
            self.cx.scratch.add(vb)
            v = self.cx.var("acc", F32)
            self.rb.append(Assign(v, Load(vb, Bin("min", ix.row, low.m_last()), ix.rvalid)))
            self.pvals[r] = v

    # -- sweeps -----------------------------------------------------------------------------------
    def prefetch_rows(self, task_expr: kir.Expr, valid_task: kir.Expr | None) -> list[kir.Stmt]:
        """Statements loading the prefetched inputs of the row group ``task_expr`` into pf<t>."""
        low, cx, s = self.low, self.cx, self.low.s
        tpr, vec, M, N = s.tpr, s.vec, low.p.M, low.p.N
        tn, rown, vn = cx.var("tn", I32), cx.var("rown", I32), cx.var("vn", kir.BOOL)
        ip, kp, vp = cx.var("ip", I32), cx.var("kp", I32), cx.var("vp", kir.BOOL)
        row_ok = Bin("<", rown, low.m_expr())
        out: list[kir.Stmt] = [Assign(tn, task_expr), Assign(rown, self.row_of(tn)),
                               Assign(vn, row_ok if valid_task is None else Bin("&&", valid_task, row_ok))]
        lp: list[kir.Stmt] = [Assign(kp, mul(add(mul(ip, I(tpr)), self.ix.lane), I(vec))),
                    Assign(vp, Bin("&&", vn, Bin("<", kp, low.n_expr())))]
        for name in self.prefetched:
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
        return add(mul(sw.idx, I(self.low.s.vec)), I(j))

    def smem_index(self, sw: RowSweep, j: int) -> kir.Expr:
        tpr, vec, chunk = self.low.s.tpr, self.low.s.vec, self.low.chunk
        return add(mul(self.ix.rib, I(chunk)), add(mul(add(mul(sw.idx, I(vec)), I(j)), I(tpr)), self.ix.lane))

    def reciprocal(self, name: str) -> kir.Expr:
        """``1 / name`` of a per-row or scalar value (``fast_rcp``), once per round before the first sweep asking."""
        if name not in self.recips:
            vals = self.broadcast(name)
            assert vals is not None, f"{name} varies along the row"
            self.recips[name] = v = self.cx.var("rcp", F32)
            self.rb.append(Assign(v, kir.MathOp("fast_rcp", (vals[0],))))
        return self.recips[name]

    def broadcast(self, name: str) -> list[kir.Expr] | None:
        """The ``vec`` values of a per-row or scalar tensor (None for the others)."""
        if self.low.cls[name].varies_along_reduced:
            return None
        if name in self.low.in_buf and name not in self.pvals:
            self.load_p(name)
        return [self.pvals[name]] * self.low.s.vec

    def load_input(self, sw: RowSweep, name: str) -> list[kir.Expr]:
        """The ``vec`` values of a full-size or per-reduced-index input at the sweep's element."""
        low, vec = self.low, self.low.s.vec
        buf = low.in_buf[name]
        self.uses["in"].add(buf)
        if sw.from_prefetch and low.cls[name] is TensorClass.FULL and name not in low.int_regs:
            self.prefetched.append(name)
            return [LocalRef(f"pf{low.tid_of[name]}", self.cache_index(sw, j)) for j in range(vec)]
        # varies along part of the columns, or a row stride off the vector grid: through the map
        if low.p.imap(name).partial_cols or low.p.imap(name).vector_mode(vec) == "scalar":
            base = self.round_row_base(name) if low.cls[name] is TensorClass.FULL else I(0)
            return low.mapped_load(self.cx, sw.body, name, base, sw.k0, sw.valid, f"t{low.tid_of[name]}_",
                                   zeroed=self.zero_guarded)
        dsts = tuple(self.cx.var(f"t{low.tid_of[name]}_", low.vtype(name)) for _ in range(vec))
        if low.cls[name] is TensorClass.FULL and low.p.mapped(name):  # broadcast along part of the rows
            idx = add(self.round_row_base(name), sw.k0)
        elif low.cls[name] is TensorClass.FULL:
            idx = self.f_index(self.ix.row, sw.k0)
        else:  # PER_REDUCED: varies along the row only
            idx = sw.k0
        sw.body.extend(load_vec(dsts, buf, idx, sw.valid, zeroed=self.zero_guarded))
        return list(dsts)

    def iota_values(self, sw: RowSweep, name: str) -> list[kir.Expr]:
        """The ``vec`` values of a full-size or per-reduced-index ``iota`` at the sweep's element (index
        arithmetic on its map's offset, no memory access)."""
        low = self.low
        base = self.round_row_base(name) if low.cls[name] is TensorClass.FULL else I(0)
        out: list[kir.Expr] = []
        for j in range(low.s.vec):
            v = self.cx.var(f"t{low.tid_of[name]}_", low.vtype(name))
            sw.body.append(Assign(v, low.iota_at(name, add(base, low.col_offset(name, add(sw.k0, I(j)))))))
            out.append(v)
        return out

    def sweep(self, reds: list[str], outputs: list[str], online: sp.OnlineState | None = None,
              cross: bool = False) -> list[ReductionState]:
        """One pass over the thread's elements: accumulate ``reds`` and/or store ``outputs``, and fold
        the source of a single-pass candidate into its running state ``online`` (and, with ``cross``,
        the full-size sources of the cross reductions into their accumulators). Returns the states of
        ``reds`` (one slot each), or ``[online]``."""
        low, cx, ix, s = self.low, self.cx, self.ix, self.low.s
        tpr, vec, N = s.tpr, s.vec, low.p.N
        it = cx.var("i", I32)
        idx_it, ii = low.sweep_index(cx, it)
        from_prefetch, self.first_sweep = self.first_sweep, False
        lb: list[kir.Stmt] = []
        accs = [PlainState(r, cx.var("acc", F32), low.red_info(r)) for r in reds]
        for acc in accs:
            self.rb.extend(reset(acc))
        k0 = cx.var("k", I32)
        lb.append(Assign(k0, add(ix.kbase, mul(add(mul(idx_it, I(tpr)), ix.lane), I(vec)))))
        valid = cx.var("v", kir.BOOL)
        # no bounds guard where the extent divides (cols_exact): the row guard alone, constant true
        # where the grid covers the rows exactly (rows_exact)
        lb.append(Assign(valid, ix.rvalid if cols_exact(self.low) else Bin("&&", ix.rvalid, Bin("<", k0, ix.kend))))
        sw = RowSweep(idx_it, k0, valid, lb, from_prefetch)
        sv = SweepValues(low, cx, lb, vec, self.filled, self.broadcast, partial(self.load_input, sw), partial(
            self.cache_index, sw), partial(self.smem_index, sw), low.kernel_reuse[self.ki])
        rv = RemapValues(self, sw, sv)
        sv.index_value = rv.node_value
        sv.iota_value = partial(self.iota_values, sw)
        sv.reciprocal = self.reciprocal
        for acc in accs:
            vals = sv.value(str(low.nodes[acc.reduction].args[0]))
            lb.extend(acc.fold(vals[j], valid) for j in range(vec))
        if online is not None:
            self.rb.extend(sp.reset(online))
            lb.extend(sp.update_vector(online, list(sv.value(online.cand.source)), valid, cx.var))
        for o in outputs:
            vals = rv.output_value(o) or sv.value(o)
            buf = low.out_buf[o]
            self.uses["out"].add(buf)
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
        unroll = bool(self.lay.locals_) or low.iters <= 8 or from_prefetch
        # the sweep reads memory: it loads a full-size input, or takes the prefetched ones
        reads = loads_from(lb, low.swept_inputs) or (from_prefetch and bool(self.prefetched))
        head = low.order_sweep(ii, it, low.iters, reads)
        self.rb.append(kir.For(it, I(0), I(low.iters), 1, tuple(head + lb), unroll=unroll))
        if self.prefetched and from_prefetch:  # the next task's inputs, in flight while this one reduces
            nxt = add(ix.rd, I(1))
            self.rb.extend(self.prefetch_rows(add(mul(nxt, kir.Special("gdim")), kir.Special("bid")),
                                              Bin("<", nxt, self.rounds())))
        self.filled.update(sv.newly)
        for acc in accs:
            self.pvals[acc.reduction] = acc.acc
        return [online] if online is not None else list(accs)

    # -- stages and outputs -----------------------------------------------------------------------
    def reduce_stage(self, st: int, keep_results: bool) -> None:
        """Stage ``st`` (with the next one, for the first stage of a single-pass pair): its sweep, the
        exchange of its reduction states per the stage's scheme (:func:`stitchtune.lower.exchange.exchange`)
        and, where the scheme leaves the values in this kernel, the final values; ``keep_results``:
        stored per row for a later kernel."""
        low = self.low
        cand = low.merged.get(st)
        if cand is not None:
            states = self.sweep([], [], online=sp.new_state(cand, self.cx.var))
        else:
            states = self.sweep(list(low.p.stages[st]), [])
        scheme = low.stage_scheme(st)
        exchange(self, states, scheme)
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
        low, ix, p = self.low, self.ix, self.low.p
        vb = low.scratch(f"val{low.red_idx[r]}", p.P)
        self.cx.scratch.add(vb)
        leader = Bin("&&", Bin("==", Bin("%", kir.Special("tid"), I(low.s.tpr)), I(0)), Bin("==", ix.sidx, I(0)))
        self.rb.append(kir.StoreVec(vb, Bin("min", ix.row, low.m_last()), (self.pvals[r],),
                                    Bin("&&", ix.rvalid, leader)))

    def write_outputs(self) -> None:
        """The output sweep (full-size and per-reduced-index outputs), then the per-row and scalar
        outputs, written by the row's first lane of its first split block."""
        low, ix = self.low, self.ix
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
            if o not in self.pvals and o in low.in_buf:
                self.load_p(o)
            buf = low.out_buf[o]
            self.uses["out"].add(buf)
            leader = Bin("&&", Bin("==", ix.lane, I(0)), Bin("==", ix.sidx, I(0)))
            if c is TensorClass.PER_KEPT and low.p.mapped(o):  # a permuted (bijective) map of the rows
                self.rb.append(kir.StoreVec(buf, low.row_base(o, Bin("min", ix.row, low.m_last())),
                                            (self.pvals[o],), Bin("&&", ix.rvalid, leader)))
            elif c is TensorClass.PER_KEPT:
                self.rb.append(kir.StoreVec(buf, ix.row, (self.pvals[o],), Bin("&&", ix.rvalid, leader)))
            else:
                self.rb.append(kir.StoreVec(buf, I(0), (self.pvals[o],),
                                            Bin("&&", Bin("==", ix.row, I(0)), leader)))

    def finish(self) -> tuple[kir.Kernel, kir.KernelProfile]:
        """The round loop (after the first task's prefetch), the kernel and its profile."""
        low, lay = self.low, self.lay
        total = lay.rounds * lay.grid if low.sym is None else Bin("*", self.rounds(), kir.Special("gdim"))
        low.order_tasks(self.rb, bool(sweep_reads(tuple(self.rb), low.swept_inputs)), total)
        locals_ = list(lay.locals_)
        if self.prefetched:  # the first task's inputs, before the round loop
            locals_ += [kir.LocalArray(f"pf{low.tid_of[n]}", low.per_thread) for n in self.prefetched]
            self.body.extend(self.prefetch_rows(kir.Special("bid"), None))
        self.body.append(kir.For(self.ix.rd, I(0), self.rounds(), 1, tuple(self.rb)))
        if self.is_last and low.p.cross:
            self.body.extend(cross_epilogue(self, self.uses))
        kern = low.make_kernel(self.ki, self.uses, self.cx, self.body, list(lay.shared), locals_, lay.needs_sync)
        prof = kernel_profile(low, kern, lay.grid, lay.rounds, lay.smem_bytes, self.est_regs, self.ki)
        if self.is_last and low.p.cross:
            prof = cross_profile(low, lay.grid, lay.rounds, prof)
        if lay.cluster > 1:  # launched as thread-block clusters (stitchtune.lower.cluster)
            kern, prof = as_cluster(kern, prof, lay.cluster, lay.rounds)
        return kern, prof
