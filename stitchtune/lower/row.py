"""Lowering of row reductions and element-wise graphs (``plan.family`` row or elementwise).

Thread mapping: ``tpr`` threads per row, ``block // tpr`` rows per block, ``split`` blocks per row.
Thread ``lane = tid % tpr`` handles the ``vec``-wide vectors ``k = kbase + (i * tpr + lane) * vec`` for
``i < per_thread / vec``. Schemes and the round structure: see :mod:`stitchtune.lower.entry`.
"""

from __future__ import annotations

import math

from stitchtune.ir import kir
from stitchtune.graph.parse import Graph
from stitchtune.ir.kir import F32, I32, Assign, Bin, Const, Load, LocalRef, Select
from stitchtune.lower.base import _I, _add, _and, _Ctx, _Lowerer, _mul, _SweepValues, estimate_registers
from stitchtune.plan.planner import StitchPlan
from stitchtune.space import Schedule


class _RowLowerer(_Lowerer):
    """Row reductions (and pure element-wise graphs)."""

    def lower(self) -> kir.Program:
        p, s = self.p, self.s
        M, N = p.M, p.N
        tpr, block, S, vec = s.tpr, s.block, s.split, s.vec
        self.rpb = rpb = block // tpr
        step = tpr * vec
        chunk = math.ceil(math.ceil(N / S) / step) * step
        self.chunk, self.per_thread, self.iters = chunk, chunk // tpr, chunk // step
        tasks = math.ceil(M / rpb) if S == 1 else M * S
        kernels, launches, profiles = [], [], []
        segs = self.kernel_segments() if p.nstages else [[]]
        n_reg = sum(1 for r in s.reuse if r == "register")
        n_pf = s.prefetch * sum(1 for n, c in p.classes if c == "F" and n in self.in_buf)
        est = estimate_registers(self.per_thread * (n_reg + n_pf), vec, 4)
        for ki, seg in enumerate(segs):
            is_last = ki == len(segs) - 1
            k, prof = self.build_kernel(ki, seg, is_last, tasks, est)
            kernels.append(k)
            launches.append(kir.Launch(k.name, prof.grid, block, k.smem_bytes, tuple(pp.name for pp in k.params)))
            profiles.append(prof)
        profile = kir.ProgramProfile(tuple(profiles), self.g.min_bytes())
        return kir.Program(tuple(kernels), tuple(self.buffers), tuple(launches), profile)

    # per-element value production ------------------------------------------------------------
    def build_kernel(self, ki: int, seg: list[int], is_last: bool, tasks: int, est_regs: int):
        p, s, g = self.p, self.s, self.g
        M, N = p.M, p.N
        tpr, block, S, vec, rpb = s.tpr, s.block, s.split, s.vec, self.rpb
        cx = _Ctx(g, p, s)
        body = cx.body
        tid = kir.Special("tid")
        bid = kir.Special("bid")
        gdim = kir.Special("gdim")
        lane = cx.var("lane", I32)
        rib = cx.var("rib", I32)
        body += [Assign(lane, Bin("%", tid, _I(tpr))), Assign(rib, Bin("/", tid, _I(tpr)))]
        uses = {"in": set(), "out": set(), "scratch": set()}
        stages_here = seg
        prev_stages = [i for i in range(p.nstages) if i < (seg[0] if seg else p.nstages)]
        needs_sync = any(s.schemes[i] == "global" for i in stages_here)
        multiple = S if S > 1 else 1

        # shared memory: reduction exchange + caches
        wpr = max(1, tpr // 32)
        red_slots = max((len(p.stages[i]) for i in stages_here), default=0)
        shared: list[kir.SharedBuf] = []
        needs_red_smem = any(self.needs_block_exchange(s.schemes[i]) for i in stages_here)
        if red_slots and needs_red_smem:
            shared.append(kir.SharedBuf("sred", red_slots * rpb * wpr))
        cache_reg = [c for c in p.reuse_candidates if self.reuse[c] == "register"]
        cache_smem = [c for c in p.reuse_candidates if self.reuse[c] == "shared"]
        for c in cache_smem:
            shared.append(kir.SharedBuf(f"sc{self.tid_of[c]}", rpb * self.chunk))
        locals_ = [kir.LocalArray(f"rc{self.tid_of[c]}", self.per_thread) for c in cache_reg]
        smem_bytes = 4 * sum(x.size for x in shared)
        grid = self.grid_for(tasks, block, smem_bytes, est_regs, multiple, needs_sync)
        rounds = math.ceil(tasks / grid)

        rd = cx.var("rd", I32)
        row = cx.var("row", I32)
        sidx = cx.var("sidx", I32)
        rvalid = cx.var("rv", kir.BOOL)
        kbase = cx.var("kb", I32)
        kend = cx.var("ke", I32)
        rb = []  # round body
        task = _add(_mul(rd, gdim), bid)
        if s.order == "alternate":
            tq = cx.var("tq", I32)
            rb.append(Assign(tq, task))  # reversed by order_tasks when this kernel runs its tasks backwards
            task = tq
        def row_of(t: kir.Expr) -> kir.Expr:  # this thread's row of row group t (split 1)
            return _add(_mul(t, _I(rpb)), rib)

        def f_index(r: kir.Expr, k: kir.Expr) -> kir.Expr:  # element k of row r of a full-size tensor
            return _add(_mul(Bin("min", r, _I(M - 1)), _I(N)), k)

        if S == 1:
            rb += [Assign(row, row_of(task)), Assign(sidx, _I(0))]
        else:
            tv = cx.var("task", I32)
            rb += [Assign(tv, task), Assign(row, Bin("/", tv, _I(S))), Assign(sidx, Bin("%", tv, _I(S)))]
        rb += [Assign(rvalid, Bin("<", row, _I(M))),
               Assign(kbase, _mul(sidx, _I(self.chunk))),
               Assign(kend, Bin("min", _add(kbase, _I(self.chunk)), _I(N)))]

        # values available per row (P / S class): name -> Var
        pvals: dict[str, kir.Expr] = {}
        stats = {"flops": 0, "sfu": 0, "bb": 0, "gb": 0, "reads": {}, "rereads": 0, "writes": 0}

        def load_p(name: str) -> kir.Expr:
            """A per-row (P) or scalar (S) input value."""
            if name in pvals:
                return pvals[name]
            v = cx.var("p", F32)
            buf = self.in_buf[name]
            uses["in"].add(buf)
            idx = row if self.cls[name] == "P" else _I(0)
            pred = rvalid if self.cls[name] == "P" else None
            rb.append(Assign(v, Load(buf, Bin("min", idx, _I(M - 1)) if self.cls[name] == "P" else idx, pred)))
            pvals[name] = v
            return v

        def compute_p_nodes(upto_stage: int) -> None:
            """Compute P/S-class nodes whose reductions are all available."""
            for nd, args in self.ready_p_nodes(pvals, load_p, lambda c: Const(c, F32)):
                v = cx.var("p", F32)
                rb.append(Assign(v, self.expr_of_node(nd, args)))
                pvals[nd.id] = v

        # results of stages before this kernel: read partials from scratch
        for st in prev_stages:
            for r in p.stages[st]:
                if s.schemes[st] == "independent":
                    self.finish_from_partials(cx, rb, r, row, rvalid, pvals, S_eff=S)
                else:  # finished in an earlier kernel, which stored the final per-row value
                    vb = self.scratch(f"val{self.red_idx[r]}", self.p.P)
                    cx.scratch.add(vb)
                    v = cx.var("acc", F32)
                    rb.append(Assign(v, Load(vb, Bin("min", row, _I(self.p.P - 1)), rvalid)))
                    pvals[r] = v
        compute_p_nodes(-1)

        filled: set[str] = set()  # cached tensors filled in this kernel
        # prefetch (schedule.prefetch, split 1): the kernel's first sweep takes its full-size inputs from
        # the registers pf<t>, which are loaded for the next task right after that sweep
        prefetched: list[str] = []
        first_sweep = bool(s.prefetch)  # the next sweep is the kernel's first (with prefetch on)

        def prefetch_rows(task_expr: kir.Expr, valid_task: kir.Expr | None) -> list:
            """Statements loading the prefetched inputs of the row group ``task_expr`` into pf<t>."""
            tn = cx.var("tn", I32)
            rown = cx.var("rown", I32)
            vn = cx.var("vn", kir.BOOL)
            ip = cx.var("ip", I32)
            kp = cx.var("kp", I32)
            vp = cx.var("vp", kir.BOOL)
            row_ok = Bin("<", rown, _I(M))
            out = [Assign(tn, task_expr), Assign(rown, row_of(tn)),
                   Assign(vn, _and(valid_task, row_ok))]
            lp: list = [Assign(kp, _mul(_add(_mul(ip, _I(tpr)), lane), _I(vec))),
                        Assign(vp, Bin("&&", vn, Bin("<", kp, _I(N))))]
            for name in prefetched:
                tix = self.tid_of[name]
                dsts = tuple(cx.var(f"f{tix}_", F32) for _ in range(vec))
                lp.append(kir.LoadVec(dsts, self.in_buf[name], f_index(rown, kp), vp))
                lp += [kir.SetLocal(f"pf{tix}", _add(_mul(ip, _I(vec)), _I(j)), dsts[j]) for j in range(vec)]
            out.append(kir.For(ip, _I(0), _I(self.iters), 1, tuple(lp), unroll=True))
            return out

        def sweep(sweep_no: int, reds: list[str], outputs: list[str]) -> None:
            """One pass over the thread's elements: accumulate ``reds`` and/or store ``outputs``."""
            it = cx.var("i", I32)
            idx_it, ii = self.sweep_index(cx, it)
            reads_before = sum(stats["reads"].values())  # full-size input loads of earlier sweeps
            nonlocal first_sweep
            from_prefetch, first_sweep = first_sweep, False
            lb: list = []
            accs = {}
            for r in reds:
                a = cx.var("acc", F32)
                rb.append(Assign(a, self.identity(r)))
                accs[r] = a
            k0 = cx.var("k", I32)
            lb.append(Assign(k0, _add(kbase, _mul(_add(_mul(idx_it, _I(tpr)), lane), _I(vec)))))
            valid = cx.var("v", kir.BOOL)
            lb.append(Assign(valid, Bin("&&", rvalid, Bin("<", k0, kend))))

            def cache_index(j: int) -> kir.Expr:
                return _add(_mul(idx_it, _I(vec)), _I(j))

            def smem_index(j: int) -> kir.Expr:
                return _add(_mul(rib, _I(self.chunk)), _add(_mul(_add(_mul(idx_it, _I(vec)), _I(j)), _I(tpr)), lane))

            def broadcast(name: str) -> list[kir.Expr] | None:
                if self.cls[name] not in ("P", "S"):
                    return None
                if name in self.in_buf and name not in pvals:
                    load_p(name)
                return [pvals[name]] * vec

            def load_input(name: str) -> list[kir.Expr]:
                buf = self.in_buf[name]
                uses["in"].add(buf)
                if from_prefetch and self.cls[name] == "F":
                    stats["reads"][buf] = stats["reads"].get(buf, 0) + 1
                    prefetched.append(name)
                    return [LocalRef(f"pf{self.tid_of[name]}", cache_index(j)) for j in range(vec)]
                dsts = tuple(cx.var(f"t{self.tid_of[name]}_", F32) for _ in range(vec))
                if self.cls[name] == "F":
                    idx = f_index(row, k0)
                    stats["reads"][buf] = stats["reads"].get(buf, 0) + 1
                else:  # K class: varies along the row only
                    idx = k0
                lb.append(kir.LoadVec(dsts, buf, idx, valid))
                return list(dsts)

            sv = _SweepValues(self, cx, lb, vec, filled, broadcast, load_input, cache_index, smem_index, stats)
            value = sv.value

            for r in reds:
                src = self.nodes[r].args[0]
                vals = value(src)  # type: ignore[arg-type]
                for j in range(vec):
                    lb.append(Assign(accs[r], Select(valid, self.combine(r, accs[r], vals[j]), accs[r])))
            for o in outputs:
                vals = value(o)
                buf = self.out_buf[o]
                uses["out"].add(buf)
                c = self.cls[o]
                if c == "F":
                    lb.append(kir.StoreVec(buf, _add(_mul(row, _I(N)), k0), tuple(vals), valid))
                elif c == "K":
                    lb.append(kir.StoreVec(buf, k0, tuple(vals), _and(valid, Bin("==", row, _I(0)))))
            unroll = bool(cache_reg) or self.iters <= 8 or from_prefetch
            head = self.order_sweep(ii, it, self.iters, sum(stats["reads"].values()) > reads_before)
            rb.append(kir.For(it, _I(0), _I(self.iters), 1, tuple(head + lb), unroll=unroll))
            if prefetched and from_prefetch:  # the next task's inputs, in flight while this one reduces
                nxt = _add(rd, _I(1))
                rb.extend(prefetch_rows(_add(_mul(nxt, gdim), bid), Bin("<", nxt, _I(rounds))))
            filled.update(sv.newly)
            for r in reds:
                pvals[r] = accs[r]

        for st in stages_here:
            reds = list(p.stages[st])
            sweep(st + 1, reds, [])
            scheme = s.schemes[st]
            self.exchange(cx, rb, reds, scheme, st, row, rvalid, sidx, lane, rib, pvals, stats, S)
            if scheme != "independent":
                for r in reds:
                    self.finalize(cx, rb, r, pvals)
                    if not is_last:  # a later kernel needs it: keep the final value per row
                        vb = self.scratch(f"val{self.red_idx[r]}", self.p.P)
                        cx.scratch.add(vb)
                        leader = Bin("&&", Bin("==", Bin("%", kir.Special("tid"), _I(tpr)), _I(0)),
                                     Bin("==", sidx, _I(0)))
                        rb.append(kir.StoreVec(vb, Bin("min", row, _I(self.p.P - 1)), (pvals[r],),
                                               Bin("&&", rvalid, leader)))
                compute_p_nodes(st)

        if is_last:
            f_outs = [o for o in dict.fromkeys(g.outputs) if self.cls[o] in ("F", "K")]
            if f_outs:
                sweep(p.nstages + 1, [], f_outs)
            for o in dict.fromkeys(g.outputs):
                c = self.cls[o]
                if c in ("P", "S"):
                    if o not in pvals:
                        if o in self.in_buf:
                            load_p(o)
                    buf = self.out_buf[o]
                    uses["out"].add(buf)
                    leader = Bin("&&", Bin("==", lane, _I(0)), Bin("==", sidx, _I(0)))
                    if c == "P":
                        rb.append(kir.StoreVec(buf, row, (pvals[o],), Bin("&&", rvalid, leader)))
                    else:
                        rb.append(kir.StoreVec(buf, _I(0), (pvals[o],), Bin("&&", Bin("==", row, _I(0)), leader)))

        self.order_tasks(rb, bool(stats["reads"]), rounds * grid)
        if prefetched:  # the first task's inputs, before the round loop
            locals_ += [kir.LocalArray(f"pf{self.tid_of[n]}", self.per_thread) for n in prefetched]
            body.extend(prefetch_rows(bid, None))
        body.append(kir.For(rd, _I(0), _I(rounds), 1, tuple(rb)))
        kern = self.make_kernel(ki, uses, cx, body, shared, locals_, needs_sync)
        prof = self.profile(kern, grid, rounds, smem_bytes, est_regs, stats, stages_here, ki)
        return kern, prof

    def needs_block_exchange(self, scheme: str) -> bool:
        """Whether a stage with ``scheme`` combines partials through shared memory."""
        return self.s.tpr > 32 or scheme == "regional"

    # -- reductions across threads --------------------------------------------------------------
    def exchange(self, cx, rb, reds, scheme, st, row, rvalid, sidx, lane, rib, pvals, stats, S) -> None:
        """Combine each thread's partial of ``reds`` into the row result, per ``scheme``."""
        s = self.s
        tpr, rpb = s.tpr, self.rpb
        wpr = max(1, tpr // 32)
        width = min(tpr, 32)
        tid = kir.Special("tid")
        for r in reds:
            acc = pvals[r]
            # 1) lanes of one warp (or of the sub-warp group)
            m = width // 2
            while m >= 1:
                rb.append(Assign(acc, self.combine(r, acc, kir.Shfl(acc, m, 32))))
                m //= 2
        if scheme == "local":
            return
        slot = {r: i for i, r in enumerate(reds)}
        if self.needs_block_exchange(scheme):
            # one writer per warp (tpr > 32) or per sub-warp row group (tpr <= 32)
            writer = Bin("==", Bin("%", tid, _I(width)), _I(0))
            wir = Bin("/", Bin("%", tid, _I(tpr)), _I(32)) if tpr > 32 else _I(0)
            for r in reds:
                base = _I(slot[r] * rpb * wpr)
                rb.append(kir.StoreVec("sred", _add(base, _add(_mul(rib, _I(wpr)), wir)), (pvals[r],), writer))
            rb.append(kir.Barrier())
            for r in reds:
                acc = pvals[r]
                base = _I(slot[r] * rpb * wpr)
                rb.append(Assign(acc, self.identity(r)))
                for w in range(wpr):
                    rb.append(Assign(acc, self.combine(r, acc, Load("sred", _add(base, _add(_mul(rib, _I(wpr)), _I(w)))))))
            rb.append(kir.Barrier())
        if scheme in ("global", "independent"):
            for r in reds:
                part = self.scratch(f"part{self.red_idx[r]}", self.p.M * S)
                cx.scratch.add(part)
                rb.append(kir.StoreVec(part, _add(_mul(Bin("min", row, _I(self.p.M - 1)), _I(S)), sidx), (pvals[r],),
                                       Bin("&&", rvalid, Bin("==", Bin("%", tid, _I(tpr)), _I(0)))))
            if scheme == "global":
                rb.append(kir.GridSync())
                for r in reds:
                    self.finish_from_partials(cx, rb, r, row, rvalid, pvals, S_eff=S, reuse_var=pvals[r])

    def finish_from_partials(self, cx, rb, r, row, rvalid, pvals, S_eff: int, reuse_var=None) -> None:
        """Combine the ``S_eff`` partials of reduction ``r`` for this thread's row from scratch, finalize."""
        part = self.scratch(f"part{self.red_idx[r]}", self.p.M * S_eff)
        cx.scratch.add(part)
        acc = reuse_var if reuse_var is not None else cx.var("acc", F32)
        rb.append(Assign(acc, self.identity(r)))
        base = _mul(Bin("min", row, _I(self.p.M - 1)), _I(S_eff))
        if self.s.combine == "warp" and S_eff > 1:
            # the lanes of each warp load the partials together (lane l: partials l, l + 32, ...) and
            # reduce them by shuffles; every warp of a split row lies within one row (tpr == block)
            wl = Bin("%", kir.Special("tid"), _I(32))
            for c in range(math.ceil(S_eff / 32)):
                q = _add(wl, _I(32 * c))
                inside = Bin("<", q, _I(S_eff))
                rb.append(Assign(acc, self.combine(r, acc, Select(inside, Load(
                    part, _add(base, Bin("min", q, _I(S_eff - 1))), Bin("&&", rvalid, inside)), self.identity(r)))))
            m = 16
            while m >= 1:
                rb.append(Assign(acc, self.combine(r, acc, kir.Shfl(acc, m, 32))))
                m //= 2
        else:
            for q in range(S_eff):
                rb.append(Assign(acc, self.combine(r, acc, Load(part, _add(base, _I(q)), rvalid))))
        pvals[r] = acc
        if reuse_var is None:
            self.finalize(cx, rb, r, pvals)


def lower_row(graph: Graph, plan: StitchPlan, schedule: Schedule, device) -> kir.Program:
    """Lower a row-reduction or element-wise graph (the schedule was already checked against the space)."""
    return _RowLowerer(graph, plan, schedule, device).lower()
