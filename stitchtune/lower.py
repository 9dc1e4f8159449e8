"""Lowering: (Graph, StitchPlan, Schedule, Device) -> :class:`~stitchtune.kir.Program`.

The program is one kernel, or several when a stage's scheme is ``independent`` (a kernel
boundary). Inside a kernel every thread runs the same number of *rounds* (uniform control flow, so
barriers and grid barriers are always reached by everyone); a round gives each block one task
(a group of rows / a row piece / a column tile). Within a task the thread sweeps its elements once
per reduction stage and once more to write the outputs; full-size tensors that several sweeps read
are kept where the schedule's reuse level says (registers, shared memory) or re-read / recomputed.

Row family (``plan.family`` row or elementwise), ``tpr`` threads per row, ``block // tpr`` rows per
block, ``split`` blocks per row. Thread ``lane = tid % tpr`` handles the ``vec``-wide vectors
``k = kbase + (i * tpr + lane) * vec`` for ``i < per_thread / vec``.

Column family, ``tpr`` threads along the reduced (leading) axis, ``block // tpr`` threads along the
columns, each owning ``vec`` adjacent columns; ``split`` row chunks per column tile.

Scheme of a stage: ``local`` (shuffle all-reduce among the row's lanes, or a thread owns the whole
column), ``regional`` (shared memory + ``__syncthreads``), ``global`` (per-block partials in global
scratch + software grid barrier), ``independent`` (partials in global scratch, kernel boundary).

Names in the generated program are generated here (``in0``, ``out1``, ``t3_0`` ...); no string of
the graph file reaches them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from . import kir
from .graph import Graph
from .kir import F32, I32, Assign, Bin, Const, Load, LocalRef, MathOp, Select, Var
from .occupancy import max_resident_blocks
from .ops import OPS
from .plan import StitchPlan
from .schedule import Schedule, SearchSpace

CODEGEN_VERSION = "1"

_I = lambda v: Const(int(v), I32)  # noqa: E731


def _add(a: kir.Expr, b: kir.Expr) -> kir.Expr:
    if isinstance(b, Const) and b.value == 0:
        return a
    if isinstance(a, Const) and a.value == 0:
        return b
    return Bin("+", a, b)


def _mul(a: kir.Expr, b: kir.Expr) -> kir.Expr:
    if isinstance(b, Const) and b.value == 1:
        return a
    if isinstance(a, Const) and a.value == 1:
        return b
    return Bin("*", a, b)


def _and(a: kir.Expr | None, b: kir.Expr | None) -> kir.Expr | None:
    if a is None:
        return b
    if b is None:
        return a
    return Bin("&&", a, b)


def estimate_registers(per_thread_cache: int, vec: int, n_live: int) -> int:
    """A pre-compilation register estimate (replaced by ptxas figures after the build)."""
    return int(min(255, 24 + per_thread_cache + 2 * vec * max(1, n_live)))


@dataclass
class _Ctx:
    """Mutable state while building one kernel (never escapes this module)."""

    graph: Graph
    plan: StitchPlan
    s: Schedule
    body: list = field(default_factory=list)
    scratch: set = field(default_factory=set)
    counter: int = 0

    def var(self, prefix: str, dtype: str = F32) -> Var:
        self.counter += 1
        return Var(f"{prefix}{self.counter}", dtype)


class _SweepValues:
    """Per-element values of the tensors one sweep needs (shared by both families).

    ``broadcast(name)`` returns the values of a per-row/per-column/scalar tensor (or None for a
    full-size or per-reduced-index one); ``load_input(name)`` appends the loads of an input to the
    loop body and returns its ``vec`` values; ``cache_index(j)`` / ``smem_index(j)`` address the
    register / shared-memory cache of element ``j`` of the current vector. A full-size tensor with a
    register or shared reuse level is written to its cache the first time a sweep computes it
    (``newly``) and read from there by later sweeps (``filled``).
    """

    def __init__(self, low: "_Lowerer", cx: _Ctx, body: list, vec: int, filled: set[str], broadcast, load_input,
                 cache_index, smem_index, stats: dict) -> None:
        self.low, self.cx, self.body, self.vec, self.filled = low, cx, body, vec, filled
        self.broadcast, self.load_input = broadcast, load_input
        self.cache_index, self.smem_index, self.stats = cache_index, smem_index, stats
        self.memo: dict[str, list[kir.Expr]] = {}
        self.newly: set[str] = set()

    def value(self, name: str) -> list[kir.Expr]:
        low, vec = self.low, self.vec
        b = self.broadcast(name)
        if b is not None:
            return b
        if name in self.memo:
            return self.memo[name]
        tix = low.tid_of[name]
        level = low.reuse.get(name)
        if name in self.filled:
            vals: list[kir.Expr] = ([LocalRef(f"rc{tix}", self.cache_index(j)) for j in range(vec)]
                                    if level == "register" else
                                    [Load(f"sc{tix}", self.smem_index(j)) for j in range(vec)])
            self.memo[name] = vals
            return vals
        if name in low.in_buf:
            vals = self.load_input(name)
        else:
            nd = low.nodes[name]
            argv = [self.value(a) if isinstance(a, str) else [Const(float(a), F32)] * vec for a in nd.args]
            vals = []
            for j in range(vec):
                v = self.cx.var(f"t{tix}_", F32)
                self.body.append(Assign(v, low.expr_of_node(nd, [a[j] for a in argv])))
                vals.append(v)
            self.stats["flops"] += OPS[nd.op].flops * vec
            self.stats["sfu"] += OPS[nd.op].sfu * vec
        if low.cls[name] == "F" and level in ("register", "shared"):
            for j in range(vec):
                if level == "register":
                    self.body.append(kir.SetLocal(f"rc{tix}", self.cache_index(j), vals[j]))
                else:
                    self.body.append(kir.StoreVec(f"sc{tix}", self.smem_index(j), (vals[j],)))
            self.newly.add(name)
        self.memo[name] = vals
        return vals


class _Lowerer:
    """Shared machinery of both families."""

    def __init__(self, graph: Graph, plan: StitchPlan, s: Schedule, device) -> None:
        self.g, self.p, self.s, self.dev = graph, plan, s, device
        self.nodes = {nd.id: nd for nd in graph.nodes}
        self.tid_of = {n: i for i, n in enumerate(list(plan.input_names) + [nd.id for nd in graph.nodes])}
        self.cls = dict(plan.classes)
        # global buffers
        self.buffers: list[kir.BufferSpec] = []
        self.in_buf: dict[str, str] = {}
        for i, (name, spec) in enumerate(graph.inputs):
            b = f"in{i}"
            self.in_buf[name] = b
            self.buffers.append(kir.BufferSpec(b, spec.dtype, math.prod(spec.shape), "input", name))
        self.out_buf: dict[str, str] = {}
        for j, name in enumerate(dict.fromkeys(graph.outputs)):
            b = f"out{j}"
            self.out_buf[name] = b
            spec = graph.spec(name)
            self.buffers.append(kir.BufferSpec(b, spec.dtype, math.prod(spec.shape), "output", name))
        self.part_buf: dict[str, str] = {}
        self.reuse = dict(zip(plan.reuse_candidates, s.reuse))
        self.rpb = 1
        self.red_idx = {r: i for i, r in enumerate(plan.reductions)}
        # sweep order (schedule.order == "alternate"), carried across kernels: the direction of the last
        # sweep that read a full-size tensor from memory, and the task order of the last kernel that did
        # (True = backwards; None before the first)
        self.last_reversed: bool | None = None
        self.last_tasks_reversed: bool | None = None

    # -- sweep order ------------------------------------------------------------------------------
    def sweep_index(self, cx: _Ctx, it: Var) -> tuple[kir.Expr, Var | None]:
        """The logical iteration index of a sweep over ``it``: ``it`` itself for forward schedules;
        for ``alternate`` ones a fresh variable whose assignment :meth:`order_sweep` emits once the
        sweep's body is known."""
        if self.s.order != "alternate":
            return it, None
        ii = cx.var("ii", I32)
        return ii, ii

    def order_sweep(self, ii: Var | None, it: Var, iters: int, reads_memory: bool) -> tuple[list, bool]:
        """(The assignment of the logical index ``ii``, whether the sweep runs backwards); no statement
        for forward schedules. A sweep that reads
        a full-size tensor from memory runs opposite to the previous such sweep (the first one forwards),
        so that it starts with what the previous one left in L2; other sweeps run forwards."""
        if ii is None:
            return [], False
        rev = False
        if reads_memory:
            rev = self.last_reversed is False
            self.last_reversed = rev
        return [Assign(ii, Bin("-", _I(iters - 1), it) if rev else it)], rev

    def order_tasks(self, rb: list, reads_memory: bool, total: int) -> None:
        """Alternate order: of consecutive kernels that read full-size tensors from memory, every other
        one takes its tasks backwards (the first forwards), so that a re-read across a kernel boundary
        starts with the tasks whose data the previous kernel left in L2. ``rb[0]`` is the assignment of
        the task index; ``total`` = rounds x grid, so every round still takes an aligned group of
        ``grid`` consecutive tasks (whole rows for a split row, as a grid barrier needs)."""
        if self.s.order != "alternate" or not reads_memory:
            return
        rev = self.last_tasks_reversed is False
        self.last_tasks_reversed = rev
        if rev:
            rb[0] = Assign(rb[0].var, Bin("-", _I(total - 1), rb[0].expr))

    # -- helpers ------------------------------------------------------------------------------
    def param(self, bufname: str) -> kir.Param:
        b = next(x for x in self.buffers if x.name == bufname)
        return kir.Param(b.name, b.dtype if b.role != "barrier" else "float32", b.size, b.role)

    def scratch(self, name: str, size: int) -> str:
        if not any(b.name == name for b in self.buffers):
            self.buffers.append(kir.BufferSpec(name, "float32", size, "scratch", "", zero_init=False))
        return name

    def barrier_buf(self) -> str:
        if not any(b.name == "gbar" for b in self.buffers):
            self.buffers.append(kir.BufferSpec("gbar", "float32", 2, "barrier", "", zero_init=True))
        return "gbar"

    def red_info(self, r: str):
        return OPS[self.nodes[r].op]

    def expr_of_node(self, nd, args: list[kir.Expr]) -> kir.Expr:
        info = OPS[nd.op]
        if info.kind == "cast":  # float32 registers: a cast to a 16-bit type rounds, as the reference does
            to = nd.to or nd.dtype
            return MathOp(f"round_{to}", (args[0],)) if to in ("float16", "bfloat16") else args[0]
        return MathOp(nd.op, tuple(args))

    def combine(self, r: str, a: kir.Expr, b: kir.Expr) -> kir.Expr:
        op = self.nodes[r].op
        return Bin({"reduce_max": "max", "reduce_min": "min"}.get(op, "+"), a, b)

    def identity(self, r: str) -> Const:
        return Const(float(self.red_info(r).identity), F32)

    def ready_p_nodes(self, pvals: dict, load_p, const):
        """Yield ``(node, argument values)`` for every per-row/per-column/scalar node not computed yet
        whose arguments are all available (``pvals``, or a P/S input loaded through ``load_p``);
        ``const(x)`` turns a constant argument into a value."""
        for nd in self.g.nodes:
            if self.cls[nd.id] not in ("P", "S") or nd.id in pvals or OPS[nd.op].kind == "reduce":
                continue
            args = []
            for a in nd.args:
                if not isinstance(a, str):
                    args.append(const(float(a)))
                elif a in pvals:
                    args.append(pvals[a])
                elif a in self.in_buf and self.cls[a] in ("P", "S"):
                    args.append(load_p(a))
                else:
                    break
            else:
                yield nd, args

    def make_kernel(self, ki: int, uses: dict, cx: _Ctx, body: list, shared: list, locals_: list,
                    needs_sync: bool) -> kir.Kernel:
        """Kernel ``st_k<ki>`` with its pointer parameters in a fixed order: inputs, outputs (by index),
        scratch (by name), then the grid-barrier counter when the kernel synchronises the grid."""
        params = [self.param(b) for b in sorted(uses["in"], key=lambda x: int(x[2:]))]
        params += [self.param(b) for b in sorted(uses["out"], key=lambda x: int(x[3:]))]
        params += [self.param(b) for b in sorted(cx.scratch)]
        if needs_sync:
            params.append(self.param(self.barrier_buf()))
        return kir.Kernel(f"st_k{ki}", tuple(params), tuple(body), self.s.block, tuple(shared), tuple(locals_),
                          self.s.min_blocks, "gbar" if needs_sync else None)

    def kernel_segments(self) -> list[list[int]]:
        """Stages (0-based) per kernel: a new kernel starts after each independent stage."""
        segs: list[list[int]] = [[]]
        for i, sch in enumerate(self.s.schemes):
            segs[-1].append(i)
            if sch == "independent":
                segs.append([])
        return segs

    def grid_for(self, tasks: int, block: int, smem: int, est_regs: int, multiple: int, needs_sync: bool) -> int:
        tpb = self.s.tasks_per_block
        cores = max_resident_blocks(self.dev, block, est_regs, smem)
        if tpb == 0 or needs_sync:
            if tpb == 0:
                grid = min(tasks, max(cores, 1))
            else:
                grid = math.ceil(tasks / tpb)
            if multiple > 1:
                grid = max(multiple, (grid // multiple) * multiple)
        else:
            grid = math.ceil(tasks / tpb)
            if multiple > 1:
                grid = math.ceil(grid / multiple) * multiple
        return max(1, min(grid, 2**31 - 1))


    # -- analytic profile -------------------------------------------------------------------------
    def profile(self, kern, grid, rounds, smem_bytes, est_regs, stats, stages_here, ki) -> kir.KernelProfile:
        p, s = self.p, self.s
        elems = p.M * p.N
        specs = {b.name: b for b in self.buffers}
        dram_read = 0
        reread = 0
        for buf, n in stats["reads"].items():
            b = specs[buf]
            size = b.size * kir.ELEM_BYTES[b.dtype]
            if ki == 0:
                dram_read += size
                reread += size * (n - 1)
            else:
                reread += size * n
        # small operands (K/P/S inputs): read once
        for name, spec in self.g.inputs:
            if self.cls.get(name) != "F" and self.in_buf[name] in {pp.name for pp in kern.params}:
                dram_read += math.prod(spec.shape) * kir.ELEM_BYTES[spec.dtype]
        writes = sum(specs[pp.name].nbytes for pp in kern.params if pp.role == "output")
        scratch = sum(specs[pp.name].nbytes for pp in kern.params if pp.role == "scratch")
        ws = self.tasks_in_flight_bytes(grid) if ki == 0 else max(
            (specs[b].nbytes for b in stats["reads"]), default=0)
        elem_bytes = min((kir.ELEM_BYTES[specs[b].dtype] for b in stats["reads"]), default=4)
        # up to 4 vector loads of the sweep in flight per thread, register-cached or not: the
        # measured H200 rows contradict the old claim that a register-cached row is all in flight
        # (scripts/model_quality.py)
        in_flight = s.vec * elem_bytes * min(self.iters, 4)
        if any(a.name.startswith("pf") for a in kern.locals):
            # prefetch: the next task's loads are in flight while this task reduces (model assumption)
            in_flight += s.vec * elem_bytes * min(self.iters, 4)
        return kir.KernelProfile(
            name=kern.name, grid=grid, block=s.block, smem_bytes=smem_bytes, est_registers=est_regs,
            dram_read_bytes=int(dram_read), dram_write_bytes=int(writes + scratch),
            reread_bytes=int(reread + scratch), reread_working_set=int(ws),
            flops=int(stats["flops"] * elems / max(1, s.vec)), sfu_ops=int(stats["sfu"] * elems / max(1, s.vec)),
            block_barriers=int(rounds * kern_barriers(kern)), grid_barriers=int(rounds * sum(
                1 for st in kir.walk(kern.body) if isinstance(st, kir.GridSync))),
            atomics=0, bytes_in_flight_per_thread=int(in_flight),
            scratch_loads=int(scratch_loads_per_thread(kern)),
            reversed_rereads=s.order == "alternate" and reread > 0)

    def finalize(self, cx, rb, r, pvals) -> None:
        """Turn a combined sum into a mean where the reduction is a mean (``pvals[r]`` may be a list)."""
        if self.red_info(r).is_mean:
            vs = pvals[r] if isinstance(pvals[r], list) else [pvals[r]]
            for v in dict.fromkeys(vs):
                rb.append(Assign(v, Bin("*", v, Const(1.0 / self.p.K, F32))))

    def tasks_in_flight_bytes(self, grid: int) -> int:
        """Bytes of the full-size tensors that one round of ``grid`` blocks touches (the re-read working set)."""
        s = self.s
        rows = grid * self.rpb if s.split == 1 else grid // max(1, s.split)
        return rows * self.p.N * 4


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
        kernel_reads: list[bool] = []  # whether a sweep of this kernel reads a full-size tensor
        if s.order == "alternate":
            tq = cx.var("tq", I32)
            rb.append(Assign(tq, task))  # reversed by order_tasks when this kernel runs its tasks backwards
            task = tq
        if S == 1:
            rb += [Assign(row, _add(_mul(task, _I(rpb)), rib)), Assign(sidx, _I(0))]
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
        first_sweep = [bool(s.prefetch)]

        def prefetch_rows(task_expr: kir.Expr, valid_task: kir.Expr | None) -> list:
            """Statements loading the prefetched inputs of the row group ``task_expr`` into pf<t>."""
            tn = cx.var("tn", I32)
            rown = cx.var("rown", I32)
            vn = cx.var("vn", kir.BOOL)
            ip = cx.var("ip", I32)
            kp = cx.var("kp", I32)
            vp = cx.var("vp", kir.BOOL)
            row_ok = Bin("<", rown, _I(M))
            out = [Assign(tn, task_expr), Assign(rown, _add(_mul(tn, _I(rpb)), rib)),
                   Assign(vn, _and(valid_task, row_ok))]
            lp: list = [Assign(kp, _mul(_add(_mul(ip, _I(tpr)), lane), _I(vec))),
                        Assign(vp, Bin("&&", vn, Bin("<", kp, _I(N))))]
            for name in prefetched:
                tix = self.tid_of[name]
                dsts = tuple(cx.var(f"f{tix}_", F32) for _ in range(vec))
                lp.append(kir.LoadVec(dsts, self.in_buf[name], _add(_mul(Bin("min", rown, _I(M - 1)), _I(N)), kp), vp))
                lp += [kir.SetLocal(f"pf{tix}", _add(_mul(ip, _I(vec)), _I(j)), dsts[j]) for j in range(vec)]
            out.append(kir.For(ip, _I(0), _I(self.iters), 1, tuple(lp), unroll=True))
            return out

        def sweep(sweep_no: int, reds: list[str], outputs: list[str]) -> None:
            """One pass over the thread's elements: accumulate ``reds`` and/or store ``outputs``."""
            it = cx.var("i", I32)
            idx_it, ii = self.sweep_index(cx, it)
            reads_memory: list[bool] = []
            from_prefetch = first_sweep[0]
            first_sweep[0] = False
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
                    idx = _add(_mul(Bin("min", row, _I(M - 1)), _I(N)), k0)
                    stats["reads"][buf] = stats["reads"].get(buf, 0) + 1
                    reads_memory.append(True)
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
            head, _ = self.order_sweep(ii, it, self.iters, bool(reads_memory))
            kernel_reads.extend(reads_memory)
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

        self.order_tasks(rb, bool(kernel_reads), rounds * grid)
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


def scratch_loads_per_thread(kern: kir.Kernel) -> int:
    """Loads (:class:`kir.Load` / :class:`kir.LoadVec`) of scratch parameters one thread executes,
    with each loop counted ``trip count`` times (constant bounds; 1 otherwise)."""
    scratch = {pp.name for pp in kern.params if pp.role == "scratch"}

    def in_expr(x) -> int:
        if isinstance(x, kir.Load):
            return int(x.buf in scratch) + in_expr(x.index) + in_expr(x.pred)
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return sum(in_expr(getattr(x, f.name)) for f in dataclasses.fields(x))
        if isinstance(x, tuple):
            return sum(in_expr(y) for y in x)
        return 0

    def in_stmts(stmts) -> int:
        n = 0
        for st in stmts:
            if isinstance(st, kir.For):
                trip = 1
                if isinstance(st.start, kir.Const) and isinstance(st.stop, kir.Const) and st.step > 0:
                    trip = max(0, math.ceil((int(st.stop.value) - int(st.start.value)) / st.step))
                n += trip * (in_stmts(st.body) + in_expr(st.start) + in_expr(st.stop))
            elif isinstance(st, kir.If):
                n += in_expr(st.cond) + max(in_stmts(st.then), in_stmts(st.orelse))
            else:
                n += int(isinstance(st, kir.LoadVec) and st.buf in scratch) + in_expr(st)
        return n

    return in_stmts(kern.body)


def kern_barriers(kern: kir.Kernel) -> int:
    """Barriers per round (statically counted inside the round loop)."""
    return sum(1 for st in kir.walk(kern.body) if isinstance(st, kir.Barrier))


def lower(graph: Graph, plan: StitchPlan, schedule: Schedule, device, space: SearchSpace | None = None) -> kir.Program:
    """Lower ``schedule`` for ``graph``; raise :class:`ScheduleError` naming why a point is illegal."""
    space = space or SearchSpace.for_plan(plan, device)
    space.check(schedule)
    if plan.family == "col":
        from .lower_col import lower_col

        return lower_col(graph, plan, schedule, device)
    return _RowLowerer(graph, plan, schedule, device).lower()
