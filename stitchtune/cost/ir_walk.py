"""The one pass over a kernel's IR behind :mod:`stitchtune.cost.features` (see its docstring for what
is counted and how): :class:`Walker` evaluates index expressions for the threads of one block with
numpy and accumulates the per-access, load-group, shared-memory and arithmetic counts.

Block 0 stands for every block, except in a loop's trip count: a loop whose bounds depend on the block
index (a grid-stride loop, a persistent grid's task loop, a block's tasks ``[bid x t, min((bid + 1) x t,
tasks))``) is counted with its mean trip count over the blocks (:meth:`Walker.trip_count`; the variables its
bounds read are evaluated again from their definitions for each block). Block 0 alone counted BERT's
embedding-gradient zero fill (three tables, one grid of 1056 x 256 threads) as 1056 x 1024 elements of the
2 x 768 token-type table."""

from __future__ import annotations

from typing import Any, Mapping, assert_never

import numpy as np

from stitchtune.cost.walk_blocks import BlockDefs, as_int, bin_op
from stitchtune.cost import walk_loops
from stitchtune.cost.walk_loops import rolled_unroll, static_expr, stores_shared, task_trips
from stitchtune.ir.sectors import warp_sectors
from stitchtune.ir import kir

#: float math ops that compile to a division (a reciprocal and a correction, or the slow path)
#: the statements that move data (the walk's other statements are control flow, barriers and comments)
_Access = kir.Assign | kir.LoadVec | kir.StoreVec | kir.AtomicAdd | kir.RemoteStore | kir.SetLocal

DIVISION_OPS = frozenset({"div", "reciprocal", "sigmoid", "silu"})
#: float math ops that go to the special function unit or a long polynomial
TRANSCENDENTAL_OPS = frozenset({"exp", "log", "tanh", "sin", "cos", "erf", "gelu", "gelu_tanh", "pow", "sqrt",
                                "rsqrt", "sigmoid", "silu", "log1p", "expm1", "exp2", "log2",
                                # the fast forms (graph/fast_ops.py): MUFU.EX2 / MUFU.RCP, no division slow path
                                "fast_exp", "fast_div", "fast_rcp", "fast_sigmoid", "fast_silu"})
_MAX_UNROLL = 256   # an unrolled loop longer than this is treated as rolled when grouping loads


class Walker:
    """One pass over a kernel's statements for the threads of block 0 (module docstring)."""

    def __init__(self, kernel: kir.Kernel, grid: int, extents: Mapping[str, int] | None) -> None:
        self.k = kernel
        self.n = kernel.block
        self.grid = grid
        self.extents = dict(extents or {})
        self.params = {p.name: p for p in kernel.params}
        self.shared = {s.name for s in kernel.shared}
        self.tid = np.arange(self.n, dtype=np.int64)
        self.guarded = 0   # depth of branches whose condition depends on data (error checks)
        self.env: dict[str, np.ndarray | None] = {}
        #: each variable's definition, for the trip counts of loops bounded by the block index
        self.blocks = BlockDefs(self.n, grid, self.ev)
        # accumulators
        self.requested = 0.0
        self.sector_bytes = 0.0
        self.ideal_bytes = 0.0
        self.excess_bytes = 0.0
        self.requests = 0.0
        self.lanes = 0.0
        self.read: set[str] = set()
        self.written: set[str] = set()
        self.smem_req = 0.0
        self.smem_wave = 0.0
        self.smem_ideal = 0.0
        self.smem_loaded: set[str] = set()
        self.smem_stored: set[str] = set()
        self.div = 0.0
        self.trans = 0.0
        self.flops = 0.0
        self.shuffles = 0.0
        self.l2_requests = 0.0      # warp-level requests of scratch loads (L1 bypassed: each goes to the L2)
        self.barriers = 0.0
        self.atomics = 0.0
        self.scratch_loads = 0.0
        self.scratch_by_buf: dict[str, float] = {}
        self.scratch_shared = 0.0
        self.per_param: dict[str, float] = {}
        self.grid_syncs = 0.0
        self.unknown_idx = 0
        self.unknown_trips = 0
        self.per_access: list[tuple[str, str, float, float]] = []
        # load grouping: groups as (bytes, loads, weight); the open group's vars and bytes
        self.groups: list[tuple[float, int, float]] = []
        #: per group: formed in a rolled loop whose body has no barrier or shuffle (its iterations' loads can
        #: overlap: nvcc unrolls such a loop); the other groups are the rounds of a block's serial chain
        self.pipelined: list[bool] = []
        self.open_bytes = 0.0
        self.open_loads = 0
        self.open_weight = 0.0
        self.tainted: set[str] = set()
        #: the variables each load's index and predicate read, in walk order (a rolled loop's loads that read a
        #: variable its body defines from a load wait on the previous iteration: nvcc cannot overlap them)
        self.load_deps: list[set[str]] = []
        #: per load, in walk order: whether it is a guarded vector load (``if (pred) { v = load }``). Rendered by
        #: code generator versions <= 4, its destinations carried the previous iteration's value into the next
        #: load's (``MOV R20, R12`` before ``@P0 LDG R20``): each waited for the one before. Since version 5 it
        #: does not (walk_loops.GUARDED_LOADS_WAIT). (A guarded scalar ``Load`` is ``pred ? load : 0``: no wait)
        self.load_guarded: list[bool] = []
        #: shared arrays stored with a value that depends on an open-group load (no barrier since): a load of
        #: one of them carries the taint on to what it defines
        self.tainted_shared: set[str] = set()
        self.chained = 0.0
        #: the kernel's top-level loops as (trip count, global accesses inside); with ``accesses`` (all of the
        #: walk's global accesses) they give :meth:`task_trips`
        self.top_loops: list[tuple[float, int]] = []
        self.accesses = 0
        self.depth = 0
        self.phase_has_load = False
        self.load_phases = 0.0

    # ---------------------------------------------------------------- expressions
    def ev(self, e: kir.Expr | None) -> Any:
        """The value of ``e`` in every thread of the block (a numpy array), or None when it depends on data."""
        if e is None:
            return None
        match e:
            case kir.Const():
                return np.full(self.n, e.value, dtype=np.float64 if e.dtype == kir.F32 else np.int64)
            case kir.Var():
                return self.env.get(e.name)
            case kir.Special():
                return {"tid": self.tid, "bid": np.zeros(self.n, np.int64), "bdim": np.full(self.n, self.n, np.int64),
                        "gdim": np.full(self.n, self.grid, np.int64)}[e.kind]
            case kir.Bin():
                a, b = self.ev(e.a), self.ev(e.b)
                return None if a is None or b is None else bin_op(e.op, a, b)
            case kir.Select():
                c, a, b = self.ev(e.cond), self.ev(e.a), self.ev(e.b)
                return None if c is None or a is None or b is None else np.where(c != 0, a, b)
            case kir.Cast():
                v = self.ev(e.expr)
                if v is None:
                    return None
                return v.astype(np.float64) if e.dtype == kir.F32 else np.trunc(v).astype(np.int64)
            case kir.Extent():
                return np.full(self.n, self.extents[e.name], np.int64) if e.name in self.extents else None
            case kir.ClusterRank():
                return np.zeros(self.n, np.int64)
            case (kir.MathOp() | kir.IntOp() | kir.Load() | kir.IndexLoad() | kir.LocalRef() | kir.Shfl()
                  | kir.RemoteLoad()):
                return None   # loads, shuffles, local arrays, math on data: unknown
            case _:
                assert_never(e)

    def reads(self, x: Any) -> set[str]:
        return {e.name for e in kir.exprs(x) if isinstance(e, kir.Var)}

    # ---------------------------------------------------------------- load groups
    def close_group(self) -> None:
        if self.open_loads:
            self.groups.append((self.open_bytes, self.open_loads, self.open_weight))
            self.pipelined.append(False)
        self.open_bytes, self.open_loads, self.open_weight = 0.0, 0, 0.0
        self.tainted = set()
        self.tainted_shared = set()

    def add_load(self, nbytes: float, deps: set[str], dsts: set[str], weight: float,
                 guarded: bool = False) -> None:
        if deps & self.tainted:
            self.chained += weight
            self.close_group()
        self.open_bytes += nbytes
        self.open_loads += 1
        self.open_weight = max(self.open_weight, weight)
        self.load_deps.append(deps)
        self.load_guarded.append(guarded)
        self.tainted |= dsts
        self.phase_has_load = True

    # ---------------------------------------------------------------- accesses
    def global_access(self, buf: str, index: kir.Expr, width: int, pred: kir.Expr | None, mask: np.ndarray,
                      trips: float, kind: str) -> None:
        p = self.params[buf]
        eb = 4 if p.role == "barrier" else kir.ELEM_BYTES[p.dtype]
        nbytes = width * eb
        pv = self.ev(pred) if pred is not None else None
        act = mask & (pv != 0) if pv is not None else mask
        if pred is not None and pv is None:
            act = mask
        idx = self.ev(index)
        self.accesses += 1
        (self.written if kind in ("store", "atomic") else self.read).add(buf)
        if kind == "load" and p.role == "scratch":
            self.scratch_by_buf[buf] = self.scratch_by_buf.get(buf, 0.0) + trips
        n_act = int(act.sum())
        if n_act == 0:
            return
        if idx is None:
            self.unknown_idx += 1
        lanes = np.flatnonzero(act)
        # per warp: its active lanes' bytes in whole sectors (the ideal here counts every lane's bytes,
        # so lanes that share a sector, a broadcast, go below 1.0)
        per_warp = np.unique(lanes // 32, return_counts=True)[1]
        warps = int(per_warp.size)
        ideal = int((-(-per_warp * nbytes // 32)).sum())
        if idx is None:
            sectors = ideal
        else:
            first = as_int(idx[lanes])
            if first.dtype.kind == "f":
                first = np.floor(first).astype(np.int64)
            e = (first[:, None] + np.arange(width)[None, :]).ravel() if width > 1 else first
            sectors = warp_sectors(np.repeat(lanes // 32, width), e, eb).sectors
        blocks = self.grid
        self.requested += trips * n_act * nbytes * blocks
        self.per_param[buf] = self.per_param.get(buf, 0.0) + trips * n_act * nbytes * blocks
        self.sector_bytes += trips * sectors * 32 * blocks
        self.excess_bytes += trips * max(0, sectors - ideal) * 32 * blocks
        self.ideal_bytes += trips * ideal * 32 * blocks
        self.requests += trips * warps
        if kind == "load" and p.role == "scratch":
            self.l2_requests += trips * warps
        self.lanes += trips * n_act / 32.0
        self.per_access.append((buf, kind, trips, sectors / ideal if ideal else 1.0))
        if kind == "load" and p.role == "scratch" and idx is not None and ideal and sectors * 4 <= ideal:
            self.scratch_shared += trips    # a warp's lanes read the same few words: partials combined

    def shared_access(self, buf: str, index: kir.Expr, width: int, mask: np.ndarray, trips: float,
                      store: bool) -> None:
        (self.smem_stored if store else self.smem_loaded).add(buf)
        idx = self.ev(index)
        phase = 32 // max(1, min(width, 4)) if width > 1 else 32
        for w0 in range(0, self.n, 32):
            a = mask[w0:w0 + 32]
            if not a.any():
                continue
            self.smem_req += trips
            if idx is None:
                self.smem_wave += trips * (32 // phase)
                self.smem_ideal += trips * (32 // phase)
                continue
            base = as_int(idx[w0:w0 + 32])
            waves = 0
            for p0 in range(0, 32, phase):
                sel = a[p0:p0 + phase]
                if not sel.any():
                    continue
                words = (base[p0:p0 + phase][sel][:, None] + np.arange(width)[None, :]).ravel()
                words = np.unique(words)
                _, counts = np.unique(words % 32, return_counts=True)
                waves += int(counts.max())
            self.smem_wave += trips * waves
            self.smem_ideal += trips * max(1, -(-int(a.sum()) * width // 32))

    def expr_accesses(self, es: list[Any], mask: np.ndarray, trips: float, frac: float) -> None:
        """Loads and math inside the expressions ``es`` (``kir.exprs`` of one statement)."""
        for e in es:
            if isinstance(e, (kir.Load, kir.IndexLoad)):
                if e.buf in self.params:
                    self.global_access(e.buf, e.index, 1, e.pred, mask, trips, "load")
                elif e.buf in self.shared:
                    pv = self.ev(e.pred) if e.pred is not None else None
                    self.shared_access(e.buf, e.index, 1, mask & (pv != 0) if pv is not None else mask, trips, False)
            elif isinstance(e, kir.MathOp):
                if e.op in DIVISION_OPS:
                    self.div += trips * frac
                if e.op in TRANSCENDENTAL_OPS:
                    self.trans += trips * frac
                self.flops += trips * frac
            elif isinstance(e, kir.Bin) and e.op == "/" and self._is_float(e):
                self.div += trips * frac
            elif isinstance(e, kir.Shfl):
                self.shuffles += trips

    def _is_float(self, e: kir.Bin) -> bool:
        for x in (e.a, e.b):
            if isinstance(x, (kir.Const, kir.Var)) and x.dtype == kir.F32:
                return True
            if isinstance(x, (kir.MathOp, kir.Load, kir.LocalRef, kir.Shfl)):
                return True
        return False

    def reads_tainted_shared(self, es: list[Any]) -> bool:
        """Whether the expressions ``es`` load a shared array whose stored value waits on an open-group load."""
        return any(isinstance(e, (kir.Load, kir.IndexLoad)) and e.buf in self.tainted_shared for e in es)

    def global_loads_in(self, es: list[Any]) -> list[kir.Load | kir.IndexLoad]:
        """The loads of kernel parameters among the expressions ``es``."""
        return [e for e in es if isinstance(e, (kir.Load, kir.IndexLoad)) and e.buf in self.params]

    # ---------------------------------------------------------------- statements
    def walk(self, stmts: tuple[kir.Stmt, ...], mask: np.ndarray, trips: float, grouping: bool = True) -> None:
        frac = float(mask.mean()) if mask.size else 0.0
        for s in stmts:
            match s:
                case kir.For():
                    self.walk_for(s, mask, trips)
                case kir.If():
                    self.walk_if(s, mask, trips)
                case kir.Barrier() | kir.GridSync() | kir.ClusterSync():
                    self.sync(s, trips)
                case kir.Comment():
                    pass
                case (kir.Assign() | kir.LoadVec() | kir.StoreVec() | kir.AtomicAdd() | kir.RemoteStore()
                      | kir.SetLocal()):
                    self.access(s, mask, trips, frac, grouping)
                case _:
                    assert_never(s)

    def sync(self, s: kir.Barrier | kir.GridSync | kir.ClusterSync, trips: float) -> None:
        """A barrier: it closes the open load group and the load phase."""
        self.barriers += trips
        if isinstance(s, kir.GridSync):
            self.grid_syncs += trips
        self.close_group()
        if self.phase_has_load:
            self.load_phases += trips
        self.phase_has_load = False

    def access(self, s: _Access, mask: np.ndarray, trips: float, frac: float, grouping: bool) -> None:
        """A statement that moves data: its expressions' loads and math, then its own access."""
        # loads inside the statement's expressions (and for a LoadVec, the vector load itself)
        es = list(kir.exprs(s))   # once per statement: the walk's hot path
        loads = self.global_loads_in(es)
        if grouping:
            for ld in loads:
                p = self.params[ld.buf]
                self.add_load(kir.ELEM_BYTES[p.dtype], self.reads((ld.index, ld.pred)), set(), trips)
        self.expr_accesses(es, mask, trips, frac)
        match s:
            case kir.Assign():
                if grouping and (self.reads(s.expr) & self.tainted or loads or self.reads_tainted_shared(es)):
                    self.tainted.add(s.var.name)
                self.env[s.var.name] = self.ev(s.expr)
                self.blocks.define(s.var.name, s.expr)
            case kir.LoadVec():
                for d in s.dsts:
                    self.env[d.name] = None
                    self.blocks.define(d.name, None)
                if s.buf in self.params:
                    p = self.params[s.buf]
                    self.global_access(s.buf, s.index, len(s.dsts), s.pred, mask, trips, "load")
                    if grouping:
                        self.add_load(len(s.dsts) * kir.ELEM_BYTES[p.dtype], self.reads((s.index, s.pred)),
                                      {d.name for d in s.dsts}, trips, s.pred is not None)
                elif s.buf in self.shared:
                    self.shared_access(s.buf, s.index, len(s.dsts), mask, trips, False)
                    if grouping and (s.buf in self.tainted_shared or self.reads((s.index, s.pred)) & self.tainted):
                        self.tainted |= {d.name for d in s.dsts}
            case kir.StoreVec():
                if s.buf in self.params:
                    self.global_access(s.buf, s.index, len(s.values), s.pred, mask, trips, "store")
                elif s.buf in self.shared:
                    pv = self.ev(s.pred) if s.pred is not None else None
                    self.shared_access(s.buf, s.index, len(s.values), mask & (pv != 0) if pv is not None else mask,
                                       trips, True)
                    # not the end of the load group: the compiler issues later global loads above a shared
                    # store (they cannot alias it); only a barrier (sync) ends the group. A later load that
                    # reads this array back depends on the stored value's loads (tainted_shared)
                    if grouping and (self.reads(s.values) & self.tainted or self.reads_tainted_shared(es)):
                        self.tainted_shared.add(s.buf)
            case kir.AtomicAdd():
                # an error flag (a constant added under a data-dependent predicate or branch) almost never runs
                flag = isinstance(s.value, kir.Const) and (self.guarded or (s.pred is not None and self.ev(s.pred) is None))
                if s.buf in self.params:
                    self.atomics += 0.0 if flag else trips * frac
                    self.global_access(s.buf, s.index, s.width, s.pred, mask, trips, "atomic")
                elif s.buf in self.shared:   # a block-private copy: a shared-memory access, not a global atomic
                    pv = self.ev(s.pred) if s.pred is not None else None
                    self.shared_access(s.buf, s.index, s.width, mask & (pv != 0) if pv is not None else mask,
                                       trips, True)
            case kir.RemoteStore():
                self.close_group()
            case kir.SetLocal():
                pass
            case _:
                assert_never(s)

    def trip_count(self, f: kir.For, mask: np.ndarray) -> float:
        """The loop's trips per thread, averaged over the active threads of block 0, or, where its bounds read
        the block index, over those threads of every block (:meth:`BlockDefs.trips`)."""
        a, b = self.ev(f.start), self.ev(f.stop)
        if a is None or b is None or not mask.any():
            self.unknown_trips += 1
            return 1.0
        per_block = self.blocks.trips(f, mask)
        if per_block is not None:
            return per_block
        n = np.maximum(0, np.ceil((b[mask] - a[mask]) / f.step))
        return float(n.mean())

    def task_trips(self) -> float:
        """A block's tasks (:func:`stitchtune.cost.walk_loops.task_trips` of the walk's top-level loops)."""
        return task_trips(self.top_loops, self.accesses)

    def walk_for(self, f: kir.For, mask: np.ndarray, trips: float) -> None:
        if self.depth == 0:
            before = self.accesses
            self.depth += 1
            try:
                n = self._walk_for(f, mask, trips)
            finally:
                self.depth -= 1
            self.top_loops.append((n, self.accesses - before))
            return
        self.depth += 1
        try:
            self._walk_for(f, mask, trips)
        finally:
            self.depth -= 1

    def _walk_for(self, f: kir.For, mask: np.ndarray, trips: float) -> float:
        """Walk the loop ``f``'s body (load groups as in the module docstring); its trip count per thread."""
        n = self.trip_count(f, mask)
        start = self.ev(f.start)
        self.env[f.var.name] = start
        self.blocks.define(f.var.name, f.start)
        unrolled = f.unroll and n <= _MAX_UNROLL
        if not unrolled:
            self.close_group()
            before, deps_before = len(self.groups), len(self.load_deps)
            syncs = self.barriers + self.shuffles
            static = static_expr(f.start, self.blocks.defs) and static_expr(f.stop, self.blocks.defs)
            self.walk(f.body, mask, trips * n)
            # the iterations' loads overlap where the body ends no group (no barrier, branch, shuffle, chain) and
            # no load reads a value the body loaded (the next iteration would wait on it): nvcc unrolls the loop
            carried = any(d & self.tainted for d in self.load_deps[deps_before:])
            # a guarded vector load waits for the previous iteration's where the renderer carries it (load_guarded)
            predicated = walk_loops.GUARDED_LOADS_WAIT and any(self.load_guarded[deps_before:])
            free = (len(self.groups) == before and self.barriers + self.shuffles == syncs and not carried
                    and not predicated)
            u = 1
            if free and self.open_loads and walk_loops.UNROLL_ROLLED:
                u = rolled_unroll(f, n, self.open_bytes, static)
            if u > 1:
                # one group per iteration, and the compiler's unrolling puts u iterations' loads together
                self.groups.append((self.open_bytes * u, int(self.open_loads * u), self.open_weight / u))
                self.pipelined.append(False)
                self.open_bytes, self.open_loads, self.open_weight = 0.0, 0, 0.0
                self.tainted = set()
            self.close_group()
            if self.barriers + self.shuffles == syncs:
                self.pipelined[before:] = [True] * (len(self.groups) - before)
            return n
        # an unrolled loop: its iterations' loads can join one group unless the body breaks it. A body that
        # stores to shared memory keeps each iteration's loads together but not the iterations' (nvcc issues
        # an iteration's loads above its shared stores, not the next iteration's: sm_90 SASS of the fit's kernels)
        staged = stores_shared(f.body, self.shared)
        before = len(self.groups)
        open_before, bytes_before, weight_before = self.open_loads, self.open_bytes, self.open_weight
        self.walk(f.body, mask, trips * n)
        broke = len(self.groups) > before
        if staged and not broke and n > 1 and self.open_loads > open_before:
            # the first iteration's loads stay in the open group; each further iteration is a group of its own
            # (n rounds in all, as when the body's own groups repeat)
            added, added_bytes = self.open_loads - open_before, self.open_bytes - bytes_before
            self.open_weight = max(weight_before, trips)
            self.groups.extend([(added_bytes, added, trips)] * (int(round(n)) - 1))
            self.pipelined.extend([False] * (int(round(n)) - 1))
        elif not broke and n > 1 and self.open_loads > open_before:
            # the body's loads repeat n times in one group
            added = self.open_loads - open_before
            per_load = self.open_bytes / max(self.open_loads, 1)
            self.open_loads += int(round(added * (n - 1)))
            self.open_bytes += per_load * added * (n - 1)
        elif broke and n > 1:
            # each iteration formed its own groups: repeat the groups recorded for the body
            body, flags = self.groups[before:], self.pipelined[before:]
            self.groups.extend(body * (int(round(n)) - 1))
            self.pipelined.extend(flags * (int(round(n)) - 1))
            self.groups[before:] = [(b, ld, w / n) for b, ld, w in self.groups[before:]]
        return n

    def walk_if(self, s: kir.If, mask: np.ndarray, trips: float) -> None:
        c = self.ev(s.cond)
        self.close_group()
        saved = dict(self.env)
        saved_defs = self.blocks.copy()
        m_then = mask & (c != 0) if c is not None else mask
        m_else = mask & ~(c != 0) if c is not None else mask
        self.guarded += c is None
        self.walk(s.then, m_then, trips)
        self.close_group()
        env_then = self.env
        defs_then = self.blocks
        self.env = dict(saved)
        self.blocks = saved_defs
        if s.orelse:
            self.walk(s.orelse, m_else, trips)
            self.close_group()
        env_else = self.env
        self.guarded -= c is None
        self.blocks.merge(defs_then)
        merged: dict[str, np.ndarray | None] = {}
        for name in set(env_then) | set(env_else):
            t, e = env_then.get(name), env_else.get(name)
            if t is e:
                merged[name] = t
            elif c is not None and t is not None and e is not None:
                merged[name] = np.where(c != 0, t, e)
            else:
                merged[name] = t if t is not None else e
        self.env = merged


