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
"""

from __future__ import annotations

import math

from stitchtune.ir import kir
from stitchtune.graph.parse import Graph
from stitchtune.ir.kir import F32, I32, Assign, Bin, Const, Load, Select
from stitchtune.lower.base import _I, _add, _and, _Ctx, _Lowerer, _mul, _SweepValues, estimate_registers
from stitchtune.plan.planner import StitchPlan
from stitchtune.space import Schedule


def _load_f32(dsts: tuple, buf: str, idx: kir.Expr, pred: kir.Expr | None) -> list:
    """Loads of a float32 scratch buffer in accesses of at most 16 bytes (4 floats)."""
    return [kir.LoadVec(dsts[k:k + 4], buf, _add(idx, _I(k)), pred) for k in range(0, len(dsts), 4)]


def _store_f32(buf: str, idx: kir.Expr, vals: tuple, pred: kir.Expr | None) -> list:
    """Stores to a float32 scratch buffer in accesses of at most 16 bytes (4 floats)."""
    return [kir.StoreVec(buf, _add(idx, _I(k)), vals[k:k + 4], pred) for k in range(0, len(vals), 4)]


class _ColLowerer(_Lowerer):
    def lower(self) -> kir.Program:
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
        n_reg = sum(1 for r in s.reuse if r == "register")
        est = estimate_registers(self.per_thread * n_reg, vec, 4)
        kernels, launches, profiles = [], [], []
        segs = self.kernel_segments()
        for ki, seg in enumerate(segs):
            k, prof = self.build_kernel(ki, seg, ki == len(segs) - 1, tasks, est)
            kernels.append(k)
            launches.append(kir.Launch(k.name, prof.grid, block, k.smem_bytes, tuple(pp.name for pp in k.params)))
            profiles.append(prof)
        return kir.Program(tuple(kernels), tuple(self.buffers), tuple(launches),
                           kir.ProgramProfile(tuple(profiles), self.g.min_bytes()))

    def tasks_in_flight_bytes(self, grid: int) -> int:
        return grid * self.chunk * self.TC * 4

    def build_kernel(self, ki: int, seg: list[int], is_last: bool, tasks: int, est_regs: int):
        p, s, g = self.p, self.s, self.g
        M, N = p.M, p.N
        tk, block, S, vec, tpc, TC = s.tpr, s.block, s.split, s.vec, self.tpc, self.TC
        cx = _Ctx(g, p, s)
        tid, bid, gdim = kir.Special("tid"), kir.Special("bid"), kir.Special("gdim")
        tc, tkk = cx.var("tc", I32), cx.var("tk", I32)
        body: list = [Assign(tc, Bin("%", tid, _I(tpc))), Assign(tkk, Bin("/", tid, _I(tpc)))]
        uses = {"in": set(), "out": set()}
        prev_stages = [i for i in range(p.nstages) if i < (seg[0] if seg else p.nstages)]
        needs_sync = any(s.schemes[i] == "global" for i in seg)
        red_slots = max((len(p.stages[i]) for i in seg), default=0)
        shared: list[kir.SharedBuf] = []
        if red_slots and tk > 1:
            shared.append(kir.SharedBuf("sred", red_slots * tk * TC))
        cache_reg = [c for c in p.reuse_candidates if self.reuse[c] == "register"]
        cache_smem = [c for c in p.reuse_candidates if self.reuse[c] == "shared"]
        for c in cache_smem:
            shared.append(kir.SharedBuf(f"sc{self.tid_of[c]}", self.rpt * tk * TC))
        locals_ = [kir.LocalArray(f"rc{self.tid_of[c]}", self.per_thread) for c in cache_reg]
        smem_bytes = 4 * sum(x.size for x in shared)
        grid = self.grid_for(tasks, block, smem_bytes, est_regs, S if S > 1 else 1, needs_sync)
        rounds = math.ceil(tasks / grid)

        rd, tile, sidx = cx.var("rd", I32), cx.var("tile", I32), cx.var("sidx", I32)
        c0, cvalid = cx.var("c", I32), cx.var("cv", kir.BOOL)
        kbase, kend = cx.var("kb", I32), cx.var("ke", I32)
        task = cx.var("task", I32)
        rb: list = [Assign(task, _add(_mul(rd, gdim), bid)),
                    Assign(tile, Bin("/", task, _I(S))), Assign(sidx, Bin("%", task, _I(S))),
                    Assign(c0, _add(_mul(tile, _I(TC)), _mul(tc, _I(vec)))),
                    Assign(cvalid, Bin("&&", Bin("<", c0, _I(N)), Bin("<", task, _I(tasks)))),
                    Assign(kbase, _mul(sidx, _I(self.chunk))),
                    Assign(kend, Bin("min", _add(kbase, _I(self.chunk)), _I(M)))]
        cc0 = Bin("min", c0, _I(N - vec))  # clamped column for address arithmetic
        pvals: dict[str, list[kir.Expr]] = {}
        stats = {"flops": 0, "sfu": 0, "reads": {}}

        def load_p(name: str) -> list[kir.Expr]:
            if name in pvals:
                return pvals[name]
            buf = self.in_buf[name]
            uses["in"].add(buf)
            if self.cls[name] == "P":
                dsts = tuple(cx.var("p", F32) for _ in range(vec))
                rb.append(kir.LoadVec(dsts, buf, cc0, cvalid))
                pvals[name] = list(dsts)
            else:
                v = cx.var("p", F32)
                rb.append(Assign(v, Load(buf, _I(0))))
                pvals[name] = [v] * vec
            return pvals[name]

        def compute_p_nodes() -> None:
            for nd, args in self.ready_p_nodes(pvals, load_p, lambda c: [Const(c, F32)] * vec):
                vs = []
                for j in range(vec):
                    v = cx.var("p", F32)
                    rb.append(Assign(v, self.expr_of_node(nd, [a[j] for a in args])))
                    vs.append(v)
                pvals[nd.id] = vs

        def read_partials(r: str, target: list[kir.Var] | None = None) -> None:
            part = self.scratch(f"part{self.red_idx[r]}", S * N)
            cx.scratch.add(part)
            accs = target or [cx.var("acc", F32) for _ in range(vec)]
            for a in accs:
                rb.append(Assign(a, self.identity(r)))
            q = cx.var("q", I32)
            tmp = tuple(cx.var("pp", F32) for _ in range(vec))
            loop = _load_f32(tmp, part, _add(_mul(q, _I(N)), cc0), cvalid)
            loop += [Assign(accs[j], self.combine(r, accs[j], tmp[j])) for j in range(vec)]
            rb.append(kir.For(q, _I(0), _I(S), 1, tuple(loop)))
            pvals[r] = list(accs)

        for st in prev_stages:
            for r in p.stages[st]:
                if s.schemes[st] == "independent":
                    read_partials(r)
                    self.finalize(cx, rb, r, pvals)
                else:
                    vb = self.scratch(f"val{self.red_idx[r]}", N)
                    cx.scratch.add(vb)
                    dsts = tuple(cx.var("acc", F32) for _ in range(vec))
                    rb.extend(_load_f32(dsts, vb, cc0, cvalid))
                    pvals[r] = list(dsts)
        compute_p_nodes()
        filled: set[str] = set()

        def sweep(reds: list[str], outputs: list[str]) -> None:
            it, r_ = cx.var("i", I32), cx.var("r", I32)
            idx_it, ii = self.sweep_index(cx, it)
            reads_before = sum(stats["reads"].values())  # full-size input loads of earlier sweeps
            valid = cx.var("v", kir.BOOL)
            accs = {}
            for r in reds:
                accs[r] = [cx.var("acc", F32) for _ in range(vec)]
                for a in accs[r]:
                    rb.append(Assign(a, self.identity(r)))
            lb: list = [Assign(r_, _add(kbase, _add(_mul(idx_it, _I(tk)), tkk))),
                        Assign(valid, Bin("&&", cvalid, Bin("<", r_, kend)))]

            def ci(j: int) -> kir.Expr:
                return _add(_mul(idx_it, _I(vec)), _I(j))

            def si(j: int) -> kir.Expr:
                return _add(_mul(_add(_mul(idx_it, _I(tk)), tkk), _I(TC)), _add(_mul(tc, _I(vec)), _I(j)))

            def broadcast(name: str) -> list[kir.Expr] | None:
                if self.cls[name] not in ("P", "S"):
                    return None
                return load_p(name) if name in self.in_buf else pvals[name]

            def load_input(name: str) -> list[kir.Expr]:
                buf = self.in_buf[name]
                uses["in"].add(buf)
                if self.cls[name] == "F":
                    dsts = tuple(cx.var(f"t{self.tid_of[name]}_", F32) for _ in range(vec))
                    idx = _add(_mul(Bin("min", r_, _I(M - 1)), _I(N)), cc0)
                    lb.append(kir.LoadVec(dsts, buf, idx, valid))
                    stats["reads"][buf] = stats["reads"].get(buf, 0) + 1
                    return list(dsts)
                v = cx.var(f"t{self.tid_of[name]}_", F32)  # K: one value per row
                lb.append(Assign(v, Load(buf, Bin("min", r_, _I(M - 1)), valid)))
                return [v] * vec

            sv = _SweepValues(self, cx, lb, vec, filled, broadcast, load_input, ci, si, stats)
            value = sv.value

            for r in reds:
                vals = value(self.nodes[r].args[0])  # type: ignore[arg-type]
                for j in range(vec):
                    a = accs[r][j]
                    lb.append(Assign(a, Select(valid, self.combine(r, a, vals[j]), a)))
            for o in outputs:
                vals = value(o)
                buf = self.out_buf[o]
                uses["out"].add(buf)
                if self.cls[o] == "F":
                    lb.append(kir.StoreVec(buf, _add(_mul(r_, _I(N)), c0), tuple(vals), valid))
                else:  # K output: one value per row, written by the first column's threads
                    lb.append(kir.StoreVec(buf, r_, (vals[0],), _and(valid, Bin("==", c0, _I(0)))))
            head = self.order_sweep(ii, it, self.rpt, sum(stats["reads"].values()) > reads_before)
            rb.append(kir.For(it, _I(0), _I(self.rpt), 1, tuple(head + lb), unroll=bool(cache_reg) or self.rpt <= 8))
            filled.update(sv.newly)
            for r in reds:
                pvals[r] = accs[r]

        for st in seg:
            reds = list(p.stages[st])
            scheme = s.schemes[st]
            sweep(reds, [])
            if tk > 1:  # partials of the tk row-threads meet in shared memory
                for si_, r in enumerate(reds):
                    base = si_ * tk * TC
                    for j in range(vec):  # scalar shared stores: any vec width, no 16-byte limit
                        rb.append(kir.StoreVec("sred", _add(_I(base), _add(_mul(tkk, _I(TC)), _add(
                            _mul(tc, _I(vec)), _I(j)))), (pvals[r][j],)))
                rb.append(kir.Barrier())
                for si_, r in enumerate(reds):
                    base = si_ * tk * TC
                    accs = pvals[r]
                    for a in accs:
                        rb.append(Assign(a, self.identity(r)))
                    q = cx.var("q", I32)
                    loop = [Assign(accs[j], self.combine(r, accs[j], Load("sred", _add(
                        _I(base), _add(_mul(q, _I(TC)), _add(_mul(tc, _I(vec)), _I(j))))))) for j in range(vec)]
                    rb.append(kir.For(q, _I(0), _I(tk), 1, tuple(loop)))
                rb.append(kir.Barrier())
            if scheme in ("global", "independent"):
                for r in reds:
                    part = self.scratch(f"part{self.red_idx[r]}", S * N)
                    cx.scratch.add(part)
                    rb.extend(_store_f32(part, _add(_mul(sidx, _I(N)), cc0), tuple(pvals[r]),
                                           Bin("&&", cvalid, Bin("==", tkk, _I(0)))))
                if scheme == "global":
                    rb.append(kir.GridSync())
                    for r in reds:
                        read_partials(r, target=pvals[r])
            if scheme != "independent":
                for r in reds:
                    self.finalize(cx, rb, r, pvals)
                    if not is_last:
                        vb = self.scratch(f"val{self.red_idx[r]}", N)
                        cx.scratch.add(vb)
                        rb.extend(_store_f32(vb, cc0, tuple(pvals[r]), Bin("&&", cvalid, Bin(
                            "&&", Bin("==", tkk, _I(0)), Bin("==", sidx, _I(0))))))
                compute_p_nodes()

        if is_last:
            outs = list(dict.fromkeys(g.outputs))
            f_outs = [o for o in outs if self.cls[o] in ("F", "K")]
            if f_outs:
                sweep([], f_outs)
            for o in outs:
                c = self.cls[o]
                if c not in ("P", "S"):
                    continue
                vals = load_p(o) if o in self.in_buf else pvals[o]
                buf = self.out_buf[o]
                uses["out"].add(buf)
                lead = Bin("&&", Bin("==", tkk, _I(0)), Bin("==", sidx, _I(0)))
                if c == "P":
                    rb.append(kir.StoreVec(buf, c0, tuple(vals), Bin("&&", cvalid, lead)))
                else:
                    rb.append(kir.StoreVec(buf, _I(0), (vals[0],), Bin("&&", Bin("==", c0, _I(0)), Bin("&&", cvalid, lead))))

        self.order_tasks(rb, bool(stats["reads"]), rounds * grid)
        body.append(kir.For(rd, _I(0), _I(rounds), 1, tuple(rb)))
        kern = self.make_kernel(ki, uses, cx, body, shared, locals_, needs_sync)
        return kern, self.profile(kern, grid, rounds, smem_bytes, est_regs, stats, seg, ki)


def lower_col(graph: Graph, plan: StitchPlan, schedule: Schedule, device) -> kir.Program:
    """Lower a column-reduction graph (the schedule was already checked against the space)."""
    return _ColLowerer(graph, plan, schedule, device).lower()
