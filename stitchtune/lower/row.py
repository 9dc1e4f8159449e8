"""Lowering of row reductions and element-wise graphs (``plan.family`` row or elementwise).

Thread mapping: ``tpr`` threads per row, ``block // tpr`` rows per block, ``split`` blocks per row.
Thread ``lane = tid % tpr`` handles the ``vec``-wide vectors ``k = kbase + (i * tpr + lane) * vec`` for
``i < per_thread / vec``. Schemes and the round structure: see :mod:`stitchtune.lower.entry`.

:class:`_RowLowerer` sizes the program and builds each kernel through a :class:`_RowKernel`, which
reads like the kernel: index set-up, the results of earlier kernels, per stage a sweep (loads and
reduce) and the combine of the partials, the output sweep and stores, the round loop. Its fixed
parts are frozen values (:class:`_RowLayout`, :class:`_RowIndex`, :class:`_RowSweep`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import partial

from stitchtune.ir import kir
from stitchtune.graph.parse import Graph
from stitchtune.ir.kir import F32, I32, Assign, Bin, Const, Load, LocalRef, Select, Var
from stitchtune.lower import single_pass as sp
from stitchtune.lower.base import _I, _add, _and, _Ctx, _Lowerer, _mul, _SweepValues, estimate_registers
from stitchtune.lower.cross import (atomic_counts, combine_kernel, cross_accumulate, cross_accumulate_rows,
                                    cross_epilogue, cross_init, cross_layout, small_profile, zero_kernel)
from stitchtune.lower.cluster import (
    STATE_SLOTS,
    cluster_counts,
    cluster_exchange,
    cluster_exchange_merged,
    cluster_shared,
    cluster_size,
)
from stitchtune.lower.remap import RemapValues
from stitchtune.plan.planner import StitchPlan, TensorClass
from stitchtune.plan.single_pass import SinglePassCandidate
from stitchtune.space import Schedule


class _RowLowerer(_Lowerer):
    """Row reductions (and pure element-wise graphs)."""

    def lower(self) -> kir.Program:
        p, s = self.p, self.s
        M, N = p.M, p.N
        # single-pass statistics: first stage of each merged pair -> its candidate
        self.merged = {c.stage: c for c in p.single_pass} if s.single_pass else {}
        if self.merged:  # tensors only the output sweep reads now: computed (or read) there, not cached
            for c in sp.single_sweep_candidates(self.g, p):
                self.reuse[c] = "global" if c in self.in_buf else "recompute"
        tpr, block, S, vec = s.tpr, s.block, s.split, s.vec
        self.rpb = rpb = block // tpr
        step = tpr * vec
        chunk = math.ceil(math.ceil(N / S) / step) * step
        self.chunk, self.per_thread, self.iters = chunk, chunk // tpr, chunk // step
        tasks = math.ceil(M / rpb) if S == 1 else M * S
        kernels, launches, profiles = [], [], []
        segs = self.kernel_segments() if p.nstages else [[]]
        n_reg = sum(1 for r in self.reuse.values() if r == "register")
        n_pf = s.prefetch * sum(1 for n, c in p.classes if c is TensorClass.FULL and n in self.in_buf)
        n_pf += sum(1 for c in p.cross if c.kind == "per_reduced")  # the cross accumulators
        est = estimate_registers(self.per_thread * (n_reg + n_pf), vec, 4)
        self.n_kernels = len(segs)
        for ki, seg in enumerate(segs):
            is_last = ki == len(segs) - 1
            k, prof = self.build_kernel(ki, seg, is_last, tasks, est)
            kernels.append(k)
            launches.append(kir.Launch(k.name, prof.grid, block, k.smem_bytes, tuple(pp.name for pp in k.params)))
            profiles.append(prof)
        if p.cross:
            self.cross_kernels(kernels, launches, profiles)
        profile = kir.ProgramProfile(tuple(profiles), self.g.min_bytes())
        return kir.Program(tuple(kernels), tuple(self.buffers), tuple(launches), profile, self.single_pass_notes())

    def single_pass_notes(self) -> tuple[str, ...]:
        """One line per merged stage pair (what the profile's fewer bytes come from)."""
        return tuple(f"single pass: stages {c.stage + 1} and {c.stage + 2} ({c.first}, {c.second}) in one sweep "
                     f"({'Welford' if c.kind == 'welford' else 'online softmax'}), scheme {self.s.schemes[c.stage]}"
                     for c in self.merged.values())

    def stage_scheme(self, st: int) -> str:
        """The scheme stage ``st`` runs with: its own, or for the second stage of a merged pair the
        first one's (the two are one stage then)."""
        return self.s.schemes[st - 1] if st - 1 in self.merged else self.s.schemes[st]

    def merged_second(self, st: int) -> bool:
        """Whether stage ``st`` is computed by the sweep of the stage before it (single pass)."""
        return st - 1 in self.merged

    def kernel_segments(self) -> list[list[int]]:
        """Stages (0-based) per kernel: a new kernel starts after each independent stage (after the
        second stage of a merged pair whose first stage is independent)."""
        segs: list[list[int]] = [[]]
        for i in range(self.p.nstages):
            segs[-1].append(i)
            if self.stage_scheme(i) == "independent" and i not in self.merged:
                segs.append([])
        return segs

    def build_kernel(self, ki: int, seg: list[int], is_last: bool, tasks: int,
                     est_regs: int) -> tuple[kir.Kernel, kir.KernelProfile]:
        """Kernel ``ki``: the stages ``seg`` (0-based), then the outputs when it is the last one."""
        k = _RowKernel(self, ki, seg, tasks, est_regs)
        k.read_earlier_stages()
        for st in seg:
            if st in self.merged:
                k.reduce_merged(self.merged[st], keep_results=not is_last)
            elif not self.merged_second(st):
                k.reduce_stage(st, keep_results=not is_last)
        if is_last:
            k.write_outputs()
        return k.finish()

    def cross_kernels(self, kernels: list, launches: list, profiles: list) -> None:
        """The small kernels of the cross-block combine: the zeroing kernel before the others
        (``cross_combine`` atomic) or the kernel that sums the partials after them (``kernel``)."""
        mode, parts = self.s.cross_combine, profiles[-1].grid
        if mode == "grid":
            return
        k, grid = zero_kernel(self) if mode == "atomic" else combine_kernel(self, parts)
        at = 0 if mode == "atomic" else len(kernels)
        kernels.insert(at, k)
        launches.insert(at, kir.Launch(k.name, grid, k.block, k.smem_bytes, tuple(pp.name for pp in k.params)))
        profiles.insert(at, small_profile(self, k, grid, parts))

    def needs_block_exchange(self, scheme: str) -> bool:
        """Whether a stage with ``scheme`` combines partials through shared memory."""
        return self.s.tpr > 32 or scheme == "regional"


@dataclass(frozen=True)
class _RowLayout:
    """Where one kernel keeps its reduction exchange and caches, and how it is launched."""

    shared: tuple[kir.SharedBuf, ...]     # sred (the exchange), sc<t> (shared caches)
    locals_: tuple[kir.LocalArray, ...]   # rc<t> (register caches)
    smem_bytes: int
    grid: int
    rounds: int                           # tasks per block, in turn
    needs_sync: bool                      # a global stage: a grid barrier
    cluster: int = 1                      # a cluster stage: blocks per thread-block cluster


def _row_layout(low: _RowLowerer, seg: list[int], tasks: int, est_regs: int, is_last: bool = False) -> _RowLayout:
    """The layout of a kernel of the stages ``seg``; the last kernel also holds the cross reductions' buffers."""
    p, s = low.p, low.s
    wpr = max(1, s.tpr // 32)
    red_slots = max((len(p.stages[i]) if i not in low.merged else (4 if low.merged[i].kind == "welford" else 2)
                     for i in seg), default=0)
    shared: list[kir.SharedBuf] = []
    if red_slots and any(low.needs_block_exchange(low.stage_scheme(i)) for i in seg):
        shared.append(kir.SharedBuf("sred", red_slots * low.rpb * wpr))
    cluster = cluster_size(s.schemes, seg, s.split)
    if cluster > 1:
        shared.append(cluster_shared(max(red_slots, STATE_SLOTS if s.single_pass else 0)))
    for c in p.reuse_candidates:
        if low.reuse[c] == "shared":
            shared.append(kir.SharedBuf(f"sc{low.tid_of[c]}", low.rpb * low.chunk))
    locals_ = [kir.LocalArray(f"rc{low.tid_of[c]}", low.per_thread)
               for c in p.reuse_candidates if low.reuse[c] == "register"]
    cross_sync = False
    if is_last and p.cross:
        x_shared, x_locals, cross_sync = cross_layout(low)
        shared += x_shared
        locals_ += x_locals
    smem_bytes = 4 * sum(x.size for x in shared)
    needs_sync = any(low.stage_scheme(i) == "global" for i in seg) or cross_sync
    grid = low.grid_for(tasks, s.block, smem_bytes, est_regs, s.split if s.split > 1 else 1, needs_sync)
    return _RowLayout(tuple(shared), tuple(locals_), smem_bytes, grid, math.ceil(tasks / grid), needs_sync,
                      cluster)


@dataclass(frozen=True)
class _RowIndex:
    """The index variables of a kernel: the thread's lane in its row and row in its block (set once),
    the round, and the row, split index, row validity and element range of the round's task."""

    lane: Var
    rib: Var
    rd: Var
    row: Var
    sidx: Var
    rvalid: Var
    kbase: Var
    kend: Var


@dataclass(frozen=True)
class _RowSweep:
    """One sweep's loop: the logical iteration index, the thread's first element ``k0`` of the
    iteration and its validity, the loop body being built, and whether the full-size inputs come
    from the prefetch registers (the kernel's first sweep, with prefetch on)."""

    idx: kir.Expr
    k0: Var
    valid: Var
    body: list
    from_prefetch: bool


class _RowKernel:
    """One kernel of a row-family program, built phase by phase: the index set-up (constructor),
    the results of earlier kernels (:meth:`read_earlier_stages`), one sweep + combine per stage
    (:meth:`reduce_stage`), the output sweep and stores (:meth:`write_outputs`), the round loop
    (:meth:`finish`).

    State while building: ``body`` (statements before the round loop), ``rb`` (the round body),
    ``pvals`` (per-row and scalar values available, by tensor name), ``stats`` (what the profile
    counts), ``uses`` (global buffers read and written), ``filled`` (cached tensors written to their
    cache by an earlier sweep), ``prefetched`` (inputs the first sweep takes from prefetch registers).
    """

    def __init__(self, low: _RowLowerer, ki: int, seg: list[int], tasks: int, est_regs: int) -> None:
        self.low, self.ki, self.est_regs = low, ki, est_regs
        s, p = low.s, low.p
        self.cx = cx = _Ctx()
        self.is_last = ki == getattr(low, "n_kernels", 1) - 1
        self.lay = _row_layout(low, seg, tasks, est_regs, self.is_last)
        lane, rib = cx.var("lane", I32), cx.var("rib", I32)
        tid = kir.Special("tid")
        self.body: list = [Assign(lane, Bin("%", tid, _I(s.tpr))), Assign(rib, Bin("/", tid, _I(s.tpr)))]
        rd, row, sidx = cx.var("rd", I32), cx.var("row", I32), cx.var("sidx", I32)
        rvalid, kbase, kend = cx.var("rv", kir.BOOL), cx.var("kb", I32), cx.var("ke", I32)
        self.ix = _RowIndex(lane, rib, rd, row, sidx, rvalid, kbase, kend)
        self.rb: list = self.round_head(tasks)
        self.uses: dict[str, set[str]] = {"in": set(), "out": set()}
        self.pvals: dict[str, kir.Expr] = {}
        self.stats = {"flops": 0, "sfu": 0, "reads": {}}
        self.filled: set[str] = set()
        self.prefetched: list[str] = []
        self.row_bases: dict[str, Var] = {}  # mapped inputs: their row base in this round
        self.gather_rows: dict[str, Var] = {}  # gather nodes: their table row in this round
        self.first_sweep = bool(s.prefetch)  # the next sweep is the kernel's first (with prefetch on)
        self.prev_stages = [i for i in range(p.nstages) if i < (seg[0] if seg else p.nstages)]
        self.cross_acc = cross_init(self) if self.is_last and p.cross else {}  # scalar cross accumulators

    # -- indices ----------------------------------------------------------------------------------
    def round_head(self, tasks: int) -> list:
        """The statements that start a round: its task, and the task's row, split index and range."""
        s, ix, cx = self.low.s, self.ix, self.cx
        S, M, N, chunk = s.split, self.low.p.M, self.low.p.N, self.low.chunk
        rb: list = []
        task = _add(_mul(ix.rd, kir.Special("gdim")), kir.Special("bid"))
        if s.order == "alternate":
            tq = cx.var("tq", I32)
            rb.append(Assign(tq, task))  # reversed by order_tasks when this kernel runs its tasks backwards
            task = tq
        if S == 1:
            rb += [Assign(ix.row, self.row_of(task)), Assign(ix.sidx, _I(0))]
        else:
            tv = cx.var("task", I32)
            rb += [Assign(tv, task), Assign(ix.row, Bin("/", tv, _I(S))), Assign(ix.sidx, Bin("%", tv, _I(S)))]
        rb += [Assign(ix.rvalid, Bin("<", ix.row, _I(M))),
               Assign(ix.kbase, _mul(ix.sidx, _I(chunk))),
               Assign(ix.kend, Bin("min", _add(ix.kbase, _I(chunk)), _I(N)))]
        return rb

    def row_of(self, t: kir.Expr) -> kir.Expr:
        """This thread's row of row group ``t`` (split 1)."""
        return _add(_mul(t, _I(self.low.rpb)), self.ix.rib)

    def f_index(self, r: kir.Expr, k: kir.Expr, name: str | None = None) -> kir.Expr:
        """Element ``k`` of row ``r`` of a full-size tensor (of input ``name``, through its index map
        when it broadcasts along part of the rows)."""
        low = self.low
        if name is not None and low.p.mapped(name):
            return _add(low.row_base(name, Bin("min", r, _I(low.p.M - 1))), k)
        return _add(_mul(Bin("min", r, _I(low.p.M - 1)), _I(low.p.N)), k)

    def round_row_base(self, name: str) -> kir.Expr:
        """The row base of mapped input ``name`` at this round's row, computed once per round (the
        first use appends its assignment to the round body, ahead of the sweep that needs it)."""
        if name not in self.row_bases:
            v = self.cx.var("rb", I32)
            self.rb.append(Assign(v, self.low.row_base(name, Bin("min", self.ix.row, _I(self.low.p.M - 1)))))
            self.row_bases[name] = v
        return self.row_bases[name]

    # -- per-row values ---------------------------------------------------------------------------
    def load_p(self, name: str) -> kir.Expr:
        """A per-row (PER_KEPT) or scalar input value."""
        low, ix = self.low, self.ix
        if name in self.pvals:
            return self.pvals[name]
        v = self.cx.var("p", F32)
        buf = low.in_buf[name]
        self.uses["in"].add(buf)
        per_row = low.cls[name] is TensorClass.PER_KEPT
        idx = ix.row if per_row else _I(0)
        pred = ix.rvalid if per_row else None
        if low.p.mapped(name):  # per-row along part of the row axes: its own row index
            self.rb.append(Assign(v, Load(buf, self.round_row_base(name), pred)))
        else:
            self.rb.append(Assign(v, Load(buf, Bin("min", idx, _I(low.p.M - 1)) if per_row else idx, pred)))
        self.pvals[name] = v
        return v

    def compute_p_nodes(self) -> None:
        """Compute the per-row and scalar nodes whose reductions are all available."""
        for nd, args in self.low.ready_p_nodes(self.pvals, self.load_p, lambda c: Const(c, F32)):
            v = self.cx.var("p", F32)
            self.rb.append(Assign(v, self.low.expr_of_node(nd, args)))
            self.pvals[nd.id] = v

    def read_earlier_stages(self) -> None:
        """The results of the stages of earlier kernels: combined from their partials (an
        independent stage) or the final per-row value an earlier kernel stored."""
        low, ix, p = self.low, self.ix, self.low.p
        for st in self.prev_stages:
            if st in low.merged and low.stage_scheme(st) == "independent":
                self.finish_merged_from_partials(low.merged[st])
                continue
            if low.merged_second(st) and low.stage_scheme(st) == "independent":
                continue  # combined with the first stage of its pair
            for r in p.stages[st]:
                if low.stage_scheme(st) == "independent":
                    self.finish_from_partials(r)
                else:  # finished in an earlier kernel, which stored the final per-row value
                    vb = low.scratch(f"val{low.red_idx[r]}", p.P)
                    self.cx.scratch.add(vb)
                    v = self.cx.var("acc", F32)
                    self.rb.append(Assign(v, Load(vb, Bin("min", ix.row, _I(p.P - 1)), ix.rvalid)))
                    self.pvals[r] = v
        self.compute_p_nodes()

    # -- sweeps -----------------------------------------------------------------------------------
    def prefetch_rows(self, task_expr: kir.Expr, valid_task: kir.Expr | None) -> list:
        """Statements loading the prefetched inputs of the row group ``task_expr`` into pf<t>."""
        low, cx, s = self.low, self.cx, self.low.s
        tpr, vec, M, N = s.tpr, s.vec, low.p.M, low.p.N
        tn, rown, vn = cx.var("tn", I32), cx.var("rown", I32), cx.var("vn", kir.BOOL)
        ip, kp, vp = cx.var("ip", I32), cx.var("kp", I32), cx.var("vp", kir.BOOL)
        row_ok = Bin("<", rown, _I(M))
        out = [Assign(tn, task_expr), Assign(rown, self.row_of(tn)),
               Assign(vn, _and(valid_task, row_ok))]
        lp: list = [Assign(kp, _mul(_add(_mul(ip, _I(tpr)), self.ix.lane), _I(vec))),
                    Assign(vp, Bin("&&", vn, Bin("<", kp, _I(N))))]
        for name in self.prefetched:
            tix = low.tid_of[name]
            if low.p.imap(name).partial_cols:  # through the map's column factors too
                dsts = low.mapped_load(cx, lp, name, low.row_base(name, Bin("min", rown, _I(M - 1))), kp, vp,
                                       f"f{tix}_")
            else:
                dsts = tuple(cx.var(f"f{tix}_", F32) for _ in range(vec))
                lp.append(kir.LoadVec(dsts, low.in_buf[name], self.f_index(rown, kp, name), vp))
            lp += [kir.SetLocal(f"pf{tix}", _add(_mul(ip, _I(vec)), _I(j)), dsts[j]) for j in range(vec)]
        out.append(kir.For(ip, _I(0), _I(low.iters), 1, tuple(lp), unroll=True))
        return out

    def cache_index(self, sw: _RowSweep, j: int) -> kir.Expr:
        return _add(_mul(sw.idx, _I(self.low.s.vec)), _I(j))

    def smem_index(self, sw: _RowSweep, j: int) -> kir.Expr:
        tpr, vec, chunk = self.low.s.tpr, self.low.s.vec, self.low.chunk
        return _add(_mul(self.ix.rib, _I(chunk)), _add(_mul(_add(_mul(sw.idx, _I(vec)), _I(j)), _I(tpr)), self.ix.lane))

    def broadcast(self, name: str) -> list[kir.Expr] | None:
        """The ``vec`` values of a per-row or scalar tensor (None for the others)."""
        if self.low.cls[name].varies_along_reduced:
            return None
        if name in self.low.in_buf and name not in self.pvals:
            self.load_p(name)
        return [self.pvals[name]] * self.low.s.vec

    def load_input(self, sw: _RowSweep, name: str) -> list[kir.Expr]:
        """The ``vec`` values of a full-size or per-reduced-index input at the sweep's element."""
        low, vec = self.low, self.low.s.vec
        buf = low.in_buf[name]
        self.uses["in"].add(buf)
        reads = self.stats["reads"]
        if sw.from_prefetch and low.cls[name] is TensorClass.FULL:
            reads[buf] = reads.get(buf, 0) + 1
            self.prefetched.append(name)
            return [LocalRef(f"pf{low.tid_of[name]}", self.cache_index(sw, j)) for j in range(vec)]
        if low.p.imap(name).partial_cols:  # varies along part of the columns: the map's column factors
            if low.cls[name] is TensorClass.FULL:
                reads[buf] = reads.get(buf, 0) + 1
            base = self.round_row_base(name) if low.cls[name] is TensorClass.FULL else _I(0)
            return low.mapped_load(self.cx, sw.body, name, base, sw.k0, sw.valid, f"t{low.tid_of[name]}_")
        dsts = tuple(self.cx.var(f"t{low.tid_of[name]}_", F32) for _ in range(vec))
        if low.cls[name] is TensorClass.FULL and low.p.mapped(name):  # broadcast along part of the rows
            idx = _add(self.round_row_base(name), sw.k0)
            reads[buf] = reads.get(buf, 0) + 1
        elif low.cls[name] is TensorClass.FULL:
            idx = self.f_index(self.ix.row, sw.k0)
            reads[buf] = reads.get(buf, 0) + 1
        else:  # PER_REDUCED: varies along the row only
            idx = sw.k0
        sw.body.append(kir.LoadVec(dsts, buf, idx, sw.valid))
        return list(dsts)

    def sweep(self, reds: list[str], outputs: list[str], online: sp.OnlineState | None = None,
              cross: bool = False) -> None:
        """One pass over the thread's elements: accumulate ``reds`` and/or store ``outputs``, and fold
        the source of a single-pass candidate into its running state ``online`` (and, with ``cross``,
        the full-size sources of the cross reductions into their accumulators)."""
        low, cx, ix, s = self.low, self.cx, self.ix, self.low.s
        tpr, vec, N = s.tpr, s.vec, low.p.N
        it = cx.var("i", I32)
        idx_it, ii = low.sweep_index(cx, it)
        reads_before = sum(self.stats["reads"].values())  # full-size input loads of earlier sweeps
        from_prefetch, self.first_sweep = self.first_sweep, False
        lb: list = []
        accs = {}
        for r in reds:
            a = cx.var("acc", F32)
            self.rb.append(Assign(a, low.identity(r)))
            accs[r] = a
        k0 = cx.var("k", I32)
        lb.append(Assign(k0, _add(ix.kbase, _mul(_add(_mul(idx_it, _I(tpr)), ix.lane), _I(vec)))))
        valid = cx.var("v", kir.BOOL)
        lb.append(Assign(valid, Bin("&&", ix.rvalid, Bin("<", k0, ix.kend))))
        sw = _RowSweep(idx_it, k0, valid, lb, from_prefetch)
        sv = _SweepValues(low, cx, lb, vec, self.filled, self.broadcast, partial(self.load_input, sw),
                          partial(self.cache_index, sw), partial(self.smem_index, sw), self.stats)
        rv = RemapValues(self, sw, sv)
        sv.index_value = rv.node_value
        for r in reds:
            vals = sv.value(low.nodes[r].args[0])  # type: ignore[arg-type]
            for j in range(vec):
                lb.append(Assign(accs[r], Select(valid, low.combine(r, accs[r], vals[j]), accs[r])))
        if online is not None:
            self.rb.extend(sp.reset(online))
            lb.extend(sp.update_vector(online, list(sv.value(online.cand.source)), valid, cx.var))
            flops, sfu = sp.update_cost(online.cand.kind, vec)
            self.stats["flops"] += flops
            self.stats["sfu"] += sfu
        for o in outputs:
            vals = rv.output_value(o) or sv.value(o)
            buf = low.out_buf[o]
            self.uses["out"].add(buf)
            c = low.cls[o]
            if low.p.mapped(o):  # a permuted (bijective) map: stored through it
                base = low.row_base(o, Bin("min", ix.row, _I(low.p.M - 1))) if c is TensorClass.FULL else _I(0)
                pred = (low.once_pred(o, ix.row, valid) if c is TensorClass.FULL else
                        _and(valid, Bin("==", ix.row, _I(0))))
                low.mapped_store(lb, o, base, k0, list(vals), pred)
            elif c is TensorClass.FULL:
                lb.append(kir.StoreVec(buf, _add(_mul(ix.row, _I(N)), k0), tuple(vals), valid))
            elif c is TensorClass.PER_REDUCED:
                lb.append(kir.StoreVec(buf, k0, tuple(vals), _and(valid, Bin("==", ix.row, _I(0)))))
        if cross:
            cross_accumulate(self, sw, sv, lb)
        unroll = bool(self.lay.locals_) or low.iters <= 8 or from_prefetch
        head = low.order_sweep(ii, it, low.iters, sum(self.stats["reads"].values()) > reads_before)
        self.rb.append(kir.For(it, _I(0), _I(low.iters), 1, tuple(head + lb), unroll=unroll))
        if self.prefetched and from_prefetch:  # the next task's inputs, in flight while this one reduces
            nxt = _add(ix.rd, _I(1))
            self.rb.extend(self.prefetch_rows(_add(_mul(nxt, kir.Special("gdim")), kir.Special("bid")),
                                              Bin("<", nxt, _I(self.lay.rounds))))
        self.filled.update(sv.newly)
        for r in reds:
            self.pvals[r] = accs[r]

    # -- combining the partials of a stage ----------------------------------------------------------
    def exchange(self, reds: list[str], scheme: str) -> None:
        """Combine each thread's partial of ``reds`` into the row result, per ``scheme``: shuffles
        among the lanes of a warp, then (shared memory) across the row's warps, then (global
        scratch) across the row's split blocks."""
        low, s = self.low, self.low.s
        width = min(s.tpr, 32)
        for r in reds:
            acc = self.pvals[r]
            # 1) lanes of one warp (or of the sub-warp group)
            m = width // 2
            while m >= 1:
                self.rb.append(Assign(acc, low.combine(r, acc, kir.Shfl(acc, m, 32))))
                m //= 2
        if scheme == "local":
            return
        if low.needs_block_exchange(scheme):
            self.exchange_in_block(reds)
        if scheme == "cluster":
            cluster_exchange(self, reds)
        if scheme in ("global", "independent"):
            self.store_partials(reds)
            if scheme == "global":
                self.rb.append(kir.GridSync())
                for r in reds:
                    self.finish_from_partials(r, reuse_var=self.pvals[r])

    def exchange_in_block(self, reds: list[str]) -> None:
        """The warps of a row combine their values through ``sred``; one writer per warp (tpr > 32) or
        per sub-warp row group (tpr <= 32)."""
        low, rb, rib = self.low, self.rb, self.ix.rib
        tpr, rpb = low.s.tpr, low.rpb
        wpr = max(1, tpr // 32)
        tid = kir.Special("tid")
        slot = {r: i for i, r in enumerate(reds)}
        writer = Bin("==", Bin("%", tid, _I(min(tpr, 32))), _I(0))
        wir = Bin("/", Bin("%", tid, _I(tpr)), _I(32)) if tpr > 32 else _I(0)
        for r in reds:
            base = _I(slot[r] * rpb * wpr)
            rb.append(kir.StoreVec("sred", _add(base, _add(_mul(rib, _I(wpr)), wir)), (self.pvals[r],), writer))
        rb.append(kir.Barrier())
        for r in reds:
            acc = self.pvals[r]
            base = _I(slot[r] * rpb * wpr)
            rb.append(Assign(acc, low.identity(r)))
            for w in range(wpr):
                rb.append(Assign(acc, low.combine(r, acc, Load("sred", _add(base, _add(_mul(rib, _I(wpr)), _I(w)))))))
        rb.append(kir.Barrier())

    def store_partials(self, reds: list[str]) -> None:
        """Each block's partial of its row piece to ``part<r>`` (one per row and split index)."""
        low, ix = self.low, self.ix
        S, M = low.s.split, low.p.M
        for r in reds:
            part = low.scratch(f"part{low.red_idx[r]}", M * S)
            self.cx.scratch.add(part)
            self.rb.append(kir.StoreVec(part, _add(_mul(Bin("min", ix.row, _I(M - 1)), _I(S)), ix.sidx),
                                        (self.pvals[r],), Bin("&&", ix.rvalid, Bin(
                                            "==", Bin("%", kir.Special("tid"), _I(low.s.tpr)), _I(0)))))

    def finish_from_partials(self, r: str, reuse_var: Var | None = None) -> None:
        """Combine the ``split`` partials of reduction ``r`` for this thread's row from scratch into
        ``reuse_var`` (a fresh variable when None, then finalized)."""
        low, rb, rvalid = self.low, self.rb, self.ix.rvalid
        S_eff = low.s.split
        part = low.scratch(f"part{low.red_idx[r]}", low.p.M * S_eff)
        self.cx.scratch.add(part)
        acc = reuse_var if reuse_var is not None else self.cx.var("acc", F32)
        rb.append(Assign(acc, low.identity(r)))
        base = _mul(Bin("min", self.ix.row, _I(low.p.M - 1)), _I(S_eff))
        if low.s.combine == "warp" and S_eff > 1:
            # the lanes of each warp load the partials together (lane l: partials l, l + 32, ...) and
            # reduce them by shuffles; every warp of a split row lies within one row (tpr == block)
            wl = Bin("%", kir.Special("tid"), _I(32))
            for c in range(math.ceil(S_eff / 32)):
                q = _add(wl, _I(32 * c))
                inside = Bin("<", q, _I(S_eff))
                rb.append(Assign(acc, low.combine(r, acc, Select(inside, Load(
                    part, _add(base, Bin("min", q, _I(S_eff - 1))), Bin("&&", rvalid, inside)), low.identity(r)))))
            m = 16
            while m >= 1:
                rb.append(Assign(acc, low.combine(r, acc, kir.Shfl(acc, m, 32))))
                m //= 2
        else:
            for q in range(S_eff):
                rb.append(Assign(acc, low.combine(r, acc, Load(part, _add(base, _I(q)), rvalid))))
        self.pvals[r] = acc
        if reuse_var is None:
            low.finalize(rb, r, self.pvals)

    # -- single-pass statistics: two stages in one sweep (lower/single_pass.py) -------------------------
    def exchange_merged(self, st: sp.OnlineState, scheme: str) -> None:
        """Merge each thread's running state into the row's, per ``scheme`` (as :meth:`exchange`):
        shuffles among the lanes, then the row's warps through ``sred``, then its split blocks."""
        width, var = min(self.low.s.tpr, 32), self.cx.var
        m = width // 2
        while m >= 1:
            self.rb.extend(sp.merge(st, tuple(kir.Shfl(v, m, 32) for v in st.vars), var))
            m //= 2
        if scheme == "local":
            return
        if self.low.needs_block_exchange(scheme):
            self.exchange_merged_in_block(st)
        if scheme == "cluster":
            cluster_exchange_merged(self, st)
        if scheme in ("global", "independent"):
            self.store_merged_partials(st)
            if scheme == "global":
                self.rb.append(kir.GridSync())
                self.finish_merged_from_partials(st.cand, st)

    def exchange_merged_in_block(self, st: sp.OnlineState) -> None:
        """The warps of a row merge their states through ``sred`` (one slot per state variable, the
        layout of :meth:`exchange_in_block`)."""
        low, rb, rib = self.low, self.rb, self.ix.rib
        tpr, rpb = low.s.tpr, low.rpb
        wpr = max(1, tpr // 32)
        tid = kir.Special("tid")
        writer = Bin("==", Bin("%", tid, _I(min(tpr, 32))), _I(0))
        wir = Bin("/", Bin("%", tid, _I(tpr)), _I(32)) if tpr > 32 else _I(0)
        for i, v in enumerate(st.vars):
            rb.append(kir.StoreVec("sred", _add(_I(i * rpb * wpr), _add(_mul(rib, _I(wpr)), wir)), (v,), writer))
        rb.append(kir.Barrier())
        rb.extend(sp.reset(st))
        for w in range(wpr):
            other = tuple(Load("sred", _add(_I(i * rpb * wpr), _add(_mul(rib, _I(wpr)), _I(w))))
                          for i in range(len(st.vars)))
            rb.extend(sp.merge(st, other, self.cx.var))
        rb.append(kir.Barrier())

    def merged_parts(self, cand: SinglePassCandidate) -> tuple[str, ...]:
        """The scratch buffers of a merged pair's partials (those of its two reductions, and the
        shifts of a Welford pair), in the order of :attr:`~stitchtune.lower.single_pass.OnlineState.stored`."""
        low = self.low
        names = [f"part{low.red_idx[cand.first]}", f"part{low.red_idx[cand.second]}"]
        if cand.kind == "welford":
            names.append(f"pshift{low.red_idx[cand.first]}")
        parts = tuple(low.scratch(n, low.p.M * low.s.split) for n in names)
        self.cx.scratch.update(parts)
        return parts

    def store_merged_partials(self, st: sp.OnlineState) -> None:
        """Each block's state of its row piece to the pair's partials (the count is not stored)."""
        ix, low = self.ix, self.low
        S, M = low.s.split, low.p.M
        leader = Bin("&&", ix.rvalid, Bin("==", Bin("%", kir.Special("tid"), _I(low.s.tpr)), _I(0)))
        for buf, v in zip(self.merged_parts(st.cand), st.stored):
            self.rb.append(kir.StoreVec(buf, _add(_mul(Bin("min", ix.row, _I(M - 1)), _I(S)), ix.sidx), (v,), leader))

    def finish_merged_from_partials(self, cand: SinglePassCandidate, st: sp.OnlineState | None = None) -> None:
        """Merge the ``split`` partials of a pair for this thread's row into ``st`` (fresh when None,
        then its results are taken), with ``combine``'s thread or warp loads."""
        low, rb, rvalid = self.low, self.rb, self.ix.rvalid
        S, N, chunk = low.s.split, low.p.N, low.chunk
        fresh = st is None
        st = st if st is not None else sp.new_state(cand, self.cx.var)
        parts = self.merged_parts(cand)
        base = _mul(Bin("min", self.ix.row, _I(low.p.M - 1)), _I(S))
        rb.extend(sp.reset(st))
        if low.s.combine == "warp" and S > 1:
            wl = Bin("%", kir.Special("tid"), _I(32))
            for c in range(math.ceil(S / 32)):
                q = _add(wl, _I(32 * c))
                inside = Bin("<", q, _I(S))
                loads = tuple(Load(b, _add(base, Bin("min", q, _I(S - 1))), Bin("&&", rvalid, inside)) for b in parts)
                got = sp.partial(st, sp.split_count_expr(N, chunk, q), loads)
                rb.extend(sp.merge(st, tuple(Select(inside, g, e) for g, e in zip(got, sp.identity(st))), self.cx.var))
            m = 16
            while m >= 1:
                rb.extend(sp.merge(st, tuple(kir.Shfl(v, m, 32) for v in st.vars), self.cx.var))
                m //= 2
        else:
            for q in range(S):
                loads = tuple(Load(b, _add(base, _I(q)), rvalid) for b in parts)
                rb.extend(sp.merge(st, sp.partial(st, Const(float(sp.split_count(N, chunk, q)), F32), loads),
                                   self.cx.var))
        if fresh:
            self.take_merged_results(st)

    def take_merged_results(self, st: sp.OnlineState) -> None:
        """The final values of the pair's two reductions (``pvals``), from a complete state."""
        for r, e in zip((st.cand.first, st.cand.second), sp.results(st, self.low.p.K)):
            v = self.cx.var("acc", F32)
            self.rb.append(Assign(v, e))
            self.pvals[r] = v

    def reduce_merged(self, cand: SinglePassCandidate, keep_results: bool) -> None:
        """Stages ``cand.stage`` and ``cand.stage + 1`` in one sweep: the running state, its merge per
        the first stage's scheme, and (unless that is independent) both final values, kept per row
        for a later kernel when ``keep_results``."""
        low, ix, p = self.low, self.ix, self.low.p
        st = sp.new_state(cand, self.cx.var)
        self.sweep([], [], online=st)
        scheme = low.stage_scheme(cand.stage)
        self.exchange_merged(st, scheme)
        if scheme == "independent":
            return
        self.take_merged_results(st)
        if keep_results:
            leader = Bin("&&", Bin("==", Bin("%", kir.Special("tid"), _I(low.s.tpr)), _I(0)), Bin("==", ix.sidx, _I(0)))
            for r in (cand.first, cand.second):
                vb = low.scratch(f"val{low.red_idx[r]}", p.P)
                self.cx.scratch.add(vb)
                self.rb.append(kir.StoreVec(vb, Bin("min", ix.row, _I(p.P - 1)), (self.pvals[r],),
                                            Bin("&&", ix.rvalid, leader)))
        self.compute_p_nodes()

    # -- stages and outputs -----------------------------------------------------------------------
    def reduce_stage(self, st: int, keep_results: bool) -> None:
        """Stage ``st``: its sweep, the combine of the partials, and (unless the stage is independent)
        the final values; ``keep_results``: stored per row for a later kernel."""
        low, ix, p = self.low, self.ix, self.low.p
        reds = list(p.stages[st])
        self.sweep(reds, [])
        scheme = low.s.schemes[st]
        self.exchange(reds, scheme)
        if scheme == "independent":
            return
        for r in reds:
            low.finalize(self.rb, r, self.pvals)
            if keep_results:  # a later kernel needs it: keep the final value per row
                vb = low.scratch(f"val{low.red_idx[r]}", p.P)
                self.cx.scratch.add(vb)
                leader = Bin("&&", Bin("==", Bin("%", kir.Special("tid"), _I(low.s.tpr)), _I(0)),
                             Bin("==", ix.sidx, _I(0)))
                self.rb.append(kir.StoreVec(vb, Bin("min", ix.row, _I(p.P - 1)), (self.pvals[r],),
                                            Bin("&&", ix.rvalid, leader)))
        self.compute_p_nodes()

    def write_outputs(self) -> None:
        """The output sweep (full-size and per-reduced-index outputs), then the per-row and scalar
        outputs, written by the row's first lane of its first split block."""
        low, ix = self.low, self.ix
        crossed = {c.node for c in low.p.cross}
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
            leader = Bin("&&", Bin("==", ix.lane, _I(0)), Bin("==", ix.sidx, _I(0)))
            if c is TensorClass.PER_KEPT and low.p.mapped(o):  # a permuted (bijective) map of the rows
                self.rb.append(kir.StoreVec(buf, low.row_base(o, Bin("min", ix.row, _I(low.p.M - 1))),
                                            (self.pvals[o],), Bin("&&", ix.rvalid, leader)))
            elif c is TensorClass.PER_KEPT:
                self.rb.append(kir.StoreVec(buf, ix.row, (self.pvals[o],), Bin("&&", ix.rvalid, leader)))
            else:
                self.rb.append(kir.StoreVec(buf, _I(0), (self.pvals[o],),
                                            Bin("&&", Bin("==", ix.row, _I(0)), leader)))

    def finish(self) -> tuple[kir.Kernel, kir.KernelProfile]:
        """The round loop (after the first task's prefetch), the kernel and its profile."""
        low, lay = self.low, self.lay
        low.order_tasks(self.rb, bool(self.stats["reads"]), lay.rounds * lay.grid)
        locals_ = list(lay.locals_)
        if self.prefetched:  # the first task's inputs, before the round loop
            locals_ += [kir.LocalArray(f"pf{low.tid_of[n]}", low.per_thread) for n in self.prefetched]
            self.body.extend(self.prefetch_rows(kir.Special("bid"), None))
        self.body.append(kir.For(self.ix.rd, _I(0), _I(lay.rounds), 1, tuple(self.rb)))
        if self.is_last and low.p.cross:
            self.body.extend(cross_epilogue(self))
        kern = low.make_kernel(self.ki, self.uses, self.cx, self.body, list(lay.shared), locals_, lay.needs_sync)
        prof = low.profile(kern, lay.grid, lay.rounds, lay.smem_bytes, self.est_regs, self.stats, self.ki)
        if self.is_last and low.p.cross:
            prof = self.cross_profile(prof)
        if lay.cluster > 1:  # launched as thread-block clusters (stitchtune.lower.cluster)
            kern = dataclasses.replace(kern, cluster=lay.cluster)
            prof = dataclasses.replace(prof, **cluster_counts(kern, lay.rounds))
        return kern, prof

    def cross_profile(self, prof: kir.KernelProfile) -> kir.KernelProfile:
        """The profile with the cross combine counted: its atomics, and its one grid barrier after the
        round loop (the generic count multiplies every grid barrier by the rounds)."""
        atomics, serial = atomic_counts(self.low, self.lay.grid)
        gb = prof.grid_barriers - (self.lay.rounds - 1 if self.low.s.cross_combine == "grid" else 0)
        return dataclasses.replace(prof, atomics=atomics, atomic_serial=serial, grid_barriers=gb)

def lower_row(graph: Graph, plan: StitchPlan, schedule: Schedule, device) -> kir.Program:
    """Lower a row-reduction or element-wise graph (the schedule was already checked against the space)."""
    return _RowLowerer(graph, plan, schedule, device).lower()
