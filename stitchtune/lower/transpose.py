"""The tiled shared-memory transpose: an element-wise region whose outputs' contiguous axis is a row
axis of the view (``plan.transpose``, :mod:`stitchtune.plan.transpose`), with ``transpose = E`` > 0.

One task is a tile of ``E`` positions ``t`` of the transposed row axis by ``E`` view columns ``c`` at
fixed outer / inner row coordinates ``(hi, lo)`` (view row ``r = (hi * dim + t) * inner + lo``). Per
task, two phases separated by a block barrier:

1. **load** (coalesced along ``c``): the element-wise values at ``(r, c)`` computed as the
   element-wise kernel computes them (:class:`~stitchtune.lower.sweep_values.SweepValues`), each lane ``vec``
   adjacent columns; a warp covers 32 columns x ``vec`` rows of the tile (``32 / vec`` lanes per row:
   every global row segment a whole number of sectors). The transposed outputs go to their tile
   ``tp<j>[t][c]`` in shared memory, every other output is stored at once through its map. An input
   or computed tensor whose address does not depend on ``t``
   (:meth:`~stitchtune.plan.transpose.TransposeTile.fixed_along`: a linear layer's bias added before a
   head split, or its slices) is loaded or computed once per tile, before the passes, where a lane reads
   the same columns in every pass (the block's warps a multiple of ``E / 32``;
   :meth:`TransposeLowerer.tile_fixed`): BERT's K^T copy with its bias loaded the bias in each of its 4
   passes, 56 registers (4 blocks per SM, 1.45 waves, sm_90), once per tile 40 (6 blocks, 0.97 waves).
2. **store** (coalesced along ``t``): a warp covers 32 positions ``t`` x ``sv`` columns; each lane
   reads ``sv`` consecutive ``t`` of one column from the tile and stores them with one vector store:
   ``sv = vec`` where every tiled output's map allows it (``dim % vec == 0``, the other strides
   multiples of ``vec``), else ``sv = 1`` (32 consecutive positions per warp, one element a lane).

Tile rows are padded to ``E + 1`` floats: with ``E`` a multiple of 32 a row starts one bank later
than the previous one, so the load phase's writes (``vec`` rows x 32 columns of a warp) and the store
phase's reads (32 rows x ``vec`` columns) touch 32 distinct banks: no bank conflict
(:func:`bank_conflicts` counts them; ``tests/lower/test_transpose.py`` checks it). Ragged edges
(``dim`` or ``N`` not multiples of ``E``) are masked element by element (vector by vector: ``N % vec
== 0`` by the space's rule, and a store vector is all in or all out when ``dim % vec == 0``, else
the stores are scalar), so no access leaves a tensor whatever the shapes; an axis that the tiles
divide has no guard and no clamp (only the task's ``task < tasks`` remains). A block barrier also ends
every round, before the next task's tile is written. The grid, rounds and ``tasks_per_block`` follow
:func:`~stitchtune.ir.launches.grid_size` as in the row family.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

from stitchtune.ir import kir
from stitchtune.ir.kir import F32, I32, Assign, Bin, Var
from stitchtune.ir.launches import LaunchShape
from stitchtune.graph.ops import OPS
from stitchtune.hardware.device import Device
from stitchtune.graph.parse import Graph
from stitchtune.lower.base import I, Ctx, Lowerer, Sizes, add, and_, estimate_registers, mul
from stitchtune.lower.builder import RowSweep
from stitchtune.lower.profile import kernel_profile
from stitchtune.lower.remap import RemapValues
from stitchtune.lower.sweep_values import SweepValues
from stitchtune.lower.sectors import sector_factor_of
from stitchtune.plan.planner import StitchPlan
from stitchtune.plan.transpose import TransposeTile
from stitchtune.space import SCHEMES, Schedule, SchemeTable

__all__ = ["TransposeLowerer", "tile_edge", "bank_conflicts", "tile_pitch", "transpose_launch"]


def tile_edge(schedule: Any) -> int:
    """The schedule's ``transpose`` tile edge (0 = untiled; also for a schedule whose option table
    has no ``transpose``)."""
    return int(dict(schedule.options).get("transpose", 0))


def transpose_launch(plan: StitchPlan, s: Schedule) -> tuple[int, int, int]:
    """(tasks, estimated registers, shared bytes) of the tiled transpose of ``plan`` (``plan.transpose``
    set) under ``s`` (``transpose`` > 0): what :class:`TransposeLowerer` sizes its one kernel by, before
    its body is built (the heuristic's tile rule reads it too)."""
    tile, E = plan.transpose, tile_edge(s)
    assert tile is not None and E > 0, "a tiled transpose needs plan.transpose and an edge"
    tasks = (plan.M // tile.dim) * math.ceil(tile.dim / E) * math.ceil(plan.N / E)
    return tasks, estimate_registers(0, s.vec, 4), 4 * len(tile.outputs) * E * tile_pitch(E)


def tile_pitch(edge: int) -> int:
    """Floats per tile row: ``edge + 1`` (one bank of padding)."""
    return edge + 1


def _load_slot(q: int, lane: int, edge: int, vec: int) -> tuple[int, int]:
    """(t, c) in the tile of lane ``lane`` of warp slot ``q`` in the load phase (first of its ``vec`` columns)."""
    per = 32 // vec
    return (q // (edge // 32)) * vec + lane // per, (q % (edge // 32)) * 32 + (lane % per) * vec


def _store_slot(q: int, lane: int, edge: int, vec: int) -> tuple[int, int]:
    """(t, c) in the tile of lane ``lane`` of warp slot ``q`` in the store phase (first of its ``vec`` rows)."""
    per = 32 // vec
    return (q % (edge // 32)) * 32 + (lane % per) * vec, (q // (edge // 32)) * vec + lane // per


def bank_conflicts(edge: int, vec: int) -> tuple[int, int]:
    """The worst bank conflict (accesses to the most used of the 32 banks by one warp's shared access,
    1 = none) of the load phase's tile writes and of the store phase's tile reads, over every warp
    slot of a tile and every element ``k < vec`` of a lane's vector."""
    pitch, worst = tile_pitch(edge), [1, 1]
    for q in range(edge * edge // (32 * vec)):
        for k in range(vec):
            wr = [_load_slot(q, ln, edge, vec) for ln in range(32)]
            rd = [_store_slot(q, ln, edge, vec) for ln in range(32)]
            for i, addrs in enumerate(([t * pitch + c + k for t, c in wr], [(t + k) * pitch + c for t, c in rd])):
                banks = [a % 32 for a in addrs]
                worst[i] = max(worst[i], max(banks.count(b) for b in set(banks)))
    return worst[0], worst[1]


class TransposeLowerer(Lowerer):
    """The tiled transpose of an element-wise plan with ``plan.transpose`` (module docstring)."""

    def __init__(self, graph: Graph, plan: StitchPlan, s: Schedule, device: Device,
                 schemes: SchemeTable = SCHEMES) -> None:
        tile = plan.transpose
        assert tile is not None and tile_edge(s) > 0, "a tiled transpose needs plan.transpose and an edge"
        #: passes of a block over one tile per phase (the sweeps' iterations)
        passes = tile_edge(s) ** 2 // (s.vec * s.block)
        assert passes >= 1, "the space's rule: transpose * transpose >= block * vec"
        super().__init__(graph, plan, s, device, Sizes(1, 0, 0, passes), schemes)
        self.kernel_reuse = [self.reuse]   # one kernel, no reuse cache
        self.tile: TransposeTile = tile
        self.edge = tile_edge(self.s)
        self.pitch = tile_pitch(self.edge)
        self.passes = passes
        #: the kernel's tasks, estimated registers and shared bytes (:func:`transpose_launch`, as the heuristic sees them)
        self.n_tasks, self.est_regs, self.smem_bytes = transpose_launch(self.p, self.s)

    # -- sizes --------------------------------------------------------------------------------------

    def shared(self) -> list[kir.SharedBuf]:
        return [kir.SharedBuf(f"tp{j}", self.edge * self.pitch) for j in range(len(self.tile.outputs))]

    def resources(self) -> tuple[LaunchShape, ...]:
        """The launch shape :meth:`lower` gives its one kernel, without building its body."""
        tasks, est, smem = self.n_tasks, self.est_regs, self.smem_bytes
        grid = self.grid_for(tasks, self.s.block, smem, est, 1, False)
        return (LaunchShape("st_k0", self.s.block, smem, est, grid, False, 1),)

    def tile_fixed(self) -> frozenset[str]:
        """The tensors loaded or computed once per tile, before the load phase's passes (module
        docstring): every input or node with one value per column of the tile (its index map
        :meth:`~stitchtune.plan.transpose.TransposeTile.fixed_along` the transposed axis: a bias, a slice
        of one) where a lane reads the same columns in every pass (the block's warps a multiple of the
        tile's ``E / 32`` column slots) and there is more than one pass; empty otherwise."""
        warps, wide = self.s.block // 32, self.edge // 32
        if self.passes <= 1 or warps % wide:
            return frozenset()
        return frozenset(n for n, m in self.p.index_maps if n not in self.g.outputs and self.tile.fixed_along(m))

    def store_vec(self, name: str) -> int:
        """The width of the store phase's global stores to output ``name``: ``vec`` where ``vec``
        consecutive ``t`` are one aligned run (``dim % vec == 0`` and every other stride of its map a
        multiple of ``vec``), else 1."""
        vec, m = self.s.vec, self.p.imap(name)
        f = self.tile.factor()
        others = [g.stride for g in m.rows.factors if g != f] + [g.stride for g in m.cols.factors]
        return vec if self.tile.dim % vec == 0 and all(st % vec == 0 for st in others) else 1

    def store_width(self) -> int:
        """The positions ``t`` a lane of the store phase stores (the same for every tiled output):
        the smallest :meth:`store_vec` of the tiled outputs."""
        return min(self.store_vec(o) for o in self.tile.outputs)

    def sector_factor(self, buf: kir.BufferSpec) -> float:
        """The sectors of the tiled accesses: a load-phase warp slot for inputs and directly stored
        outputs, a store-phase slot for the transposed outputs (each at the tile's first position)."""
        name = buf.tensor
        if not name or not self.p.mapped(name):
            return 1.0
        m, eb, E, vec = self.p.imap(name), kir.ELEM_BYTES[buf.dtype], self.edge, self.s.vec
        t_ext, dim, inner, sv = min(E, self.tile.dim), self.tile.dim, self.tile.inner, self.store_width()
        offs: list[int] = []
        for lane in range(32):
            if name in self.tile.outputs:
                t, c = _store_slot(0, lane, E, sv)
                cells = [(t + k, c) for k in range(sv)]
            else:
                t, c = _load_slot(0, lane, E, vec)
                cells = [(t, c + k) for k in range(vec)]
            offs += [m.offset(tt * inner, cc) for tt, cc in cells if tt < t_ext and cc < self.p.N and tt < dim]
        return sector_factor_of(offs, eb)

    # -- the program --------------------------------------------------------------------------------
    def lower(self) -> kir.Program:
        tasks, passes, est = self.n_tasks, self.passes, self.est_regs
        k, prof = _TransposeKernel(self, tasks, passes, est).build()
        launches = (kir.Launch(k.name, prof.grid, k.block, k.smem_bytes, tuple(pp.name for pp in k.params)),)
        notes = (f"tiled transpose: {self.edge}x{self.edge} tile (rows padded to {self.pitch} floats) along "
                 f"view rows (r // {self.tile.inner}) % {self.tile.dim} for {', '.join(self.tile.outputs)}",)
        return kir.Program((k,), tuple(self.buffers), launches, kir.ProgramProfile((prof,), self.g.min_bytes()), notes)


class _RemapHost:
    """The part of a row kernel builder :class:`~stitchtune.lower.remap.RemapValues` reads (``low``,
    ``ix.row``, ``f_index``, :meth:`var`, :meth:`use_input`), for the tile's load phase."""

    def __init__(self, low: Lowerer, cx: Ctx, ix: Any, uses: dict[str, set[str]], f_index: Any) -> None:
        self.low, self.ix, self.f_index = low, ix, f_index
        self._cx, self._uses = cx, uses

    def var(self, prefix: str, dtype: str = F32) -> Var:
        return self._cx.var(prefix, dtype)

    def use_input(self, buf: str) -> None:
        self._uses["in"].add(buf)


class _TransposeKernel:
    """One tiled-transpose kernel, built phase by phase: the task's tile (:meth:`task`), the load phase
    (:meth:`load_phase`), the store phase (:meth:`store_phase`), the round loop (:meth:`build`)."""

    def __init__(self, low: TransposeLowerer, tasks: int, passes: int, est: int) -> None:
        self.low, self.tasks, self.passes, self.est = low, tasks, passes, est
        self.cx = Ctx()
        self.shared = low.shared()
        self.smem = low.smem_bytes
        assert self.smem == 4 * sum(b.size for b in self.shared), "transpose_launch sizes the shared tiles"
        self.grid = low.grid_for(tasks, low.s.block, self.smem, est, 1, False)
        self.rounds = math.ceil(tasks / self.grid)
        self.uses: dict[str, set[str]] = {"in": set(), "out": set()}
        cx = self.cx
        self.lane, self.warp = cx.var("lane", I32), cx.var("warp", I32)
        self.rd, self.tv = cx.var("rd", I32), cx.var("tv", kir.BOOL)
        self.hi, self.lo, self.t0, self.c0 = (cx.var(n, I32) for n in ("hi", "lo", "t0", "c0"))

    def t_inside(self, t: kir.Expr) -> kir.Expr | None:
        """``t < dim``, or None where the tiles divide the axis (``dim % E == 0``: always true)."""
        dim = self.low.tile.dim
        return None if dim % self.low.edge == 0 else Bin("<", t, I(dim))

    def c_inside(self, c: kir.Expr) -> kir.Expr | None:
        """``c < N``, or None where the tiles divide the columns (``N % E == 0``: always true)."""
        n = self.low.p.N
        return None if n % self.low.edge == 0 else Bin("<", c, I(n))

    def clamped(self, t: kir.Expr) -> kir.Expr:
        """``min(t, dim - 1)`` (a row inside the tensor for a masked lane of a ragged tile), or ``t``
        where the tiles divide the axis."""
        dim = self.low.tile.dim
        return t if dim % self.low.edge == 0 else Bin("min", t, I(dim - 1))

    def row_of(self, t: kir.Expr) -> kir.Expr:
        """View row ``(hi * dim + t) * inner + lo`` of position ``t`` of the transposed axis."""
        tile = self.low.tile
        return add(mul(add(mul(self.hi, I(tile.dim)), t), I(tile.inner)), self.lo)

    def task(self) -> list[kir.Stmt]:
        """The round's task and its tile: columns fastest, then positions ``t``, then ``lo``, ``hi``."""
        low, cx = self.low, self.cx
        E, dim, inner = low.edge, low.tile.dim, low.tile.inner
        n_c, n_t = math.ceil(low.p.N / E), math.ceil(dim / E)
        task, rest = cx.var("task", I32), cx.var("rest", I32)
        return [Assign(task, add(mul(self.rd, kir.Special("gdim")), kir.Special("bid"))),
                Assign(self.tv, Bin("<", task, I(self.tasks))),
                Assign(self.c0, mul(Bin("%", task, I(n_c)), I(E))),
                Assign(self.t0, mul(Bin("%", Bin("/", task, I(n_c)), I(n_t)), I(E))),
                Assign(rest, Bin("/", task, I(n_c * n_t))),
                Assign(self.lo, Bin("%", rest, I(inner)) if inner > 1 else I(0)),
                Assign(self.hi, Bin("/", rest, I(inner)) if inner > 1 else rest)]

    def slot_exprs(self, p: kir.Expr, load: bool, vec: int) -> tuple[kir.Expr, kir.Expr]:
        """(t, c) of this lane's first cell in pass ``p`` (tile coordinates) of a phase whose lanes take
        ``vec`` cells each (:func:`_load_slot`, :func:`_store_slot`)."""
        E = self.low.edge
        per, wide = 32 // vec, E // 32
        q = add(mul(p, I(self.low.s.block // 32)), self.warp)
        if load:
            return (add(mul(Bin("/", q, I(wide)), I(vec)), Bin("/", self.lane, I(per))),
                    add(mul(Bin("%", q, I(wide)), I(32)), mul(Bin("%", self.lane, I(per)), I(vec))))
        return (add(mul(Bin("%", q, I(wide)), I(32)), mul(Bin("%", self.lane, I(per)), I(vec))),
                add(mul(Bin("/", q, I(wide)), I(vec)), Bin("/", self.lane, I(per))))

    def slot(self, p: Var, load: bool, vec: int) -> tuple[Var, Var, list[kir.Stmt]]:
        """Variables (t, c) of :meth:`slot_exprs` and their assignments."""
        t, c = self.cx.var("tl", I32), self.cx.var("cl", I32)
        ts, cs = self.slot_exprs(p, load, vec)
        return t, c, [Assign(t, ts), Assign(c, cs)]

    def sweep(self, body: list[kir.Stmt], row: kir.Expr, c: kir.Expr, pred: kir.Expr | None,
              hoisted: Callable[[str], list[kir.Expr] | None]) -> SweepValues:
        """The element-wise values at view row ``row``, columns ``c .. c + vec - 1``: their loads (guarded
        by ``pred``) and computations appended to ``body`` when first asked; ``hoisted(name)``: the values
        of a tensor computed elsewhere, or None."""
        low, cx = self.low, self.cx

        def load_input(name: str) -> list[kir.Expr]:
            self.uses["in"].add(low.in_buf[name])
            return low.mapped_load(cx, body, name, low.row_base(name, row), c, pred, f"x{low.tid_of[name]}_")

        def nothing(j: int) -> kir.Expr:
            raise AssertionError("no reuse cache in a tiled transpose")

        sv = SweepValues(low, cx, body, low.s.vec, set(), hoisted, load_input, nothing, nothing)
        if any(OPS[nd.op].kind == "slice" for nd in low.g.nodes):   # (plan.transpose admits slices only)
            sv.index_value = self.remap_values(body, row, c, pred, sv).node_value
        return sv

    def once_sweep(self, pre: list[kir.Stmt]) -> SweepValues:
        """The sweep of the tensors computed once per tile (:meth:`TransposeLowerer.tile_fixed`), into
        ``pre`` (the statements before the load phase's passes): at the columns this lane reads in every
        pass (the first pass's) and the tile's first row (their addresses do not depend on ``t``); lanes
        whose columns lie beyond ``N`` or whose task is past the last load nothing, as in every pass."""
        c_once = self.cx.var("cl", I32)
        pre.append(Assign(c_once, self.slot_exprs(I(0), load=True, vec=self.low.s.vec)[1]))
        c = add(self.c0, c_once)
        return self.sweep(pre, self.row_of(I(0)), c, and_(self.tv, self.c_inside(c)), lambda n: None)

    def load_phase(self) -> list[kir.Stmt]:
        """Load, compute and write the tile (and store the untransposed outputs): the tensors computed
        once per tile (:meth:`TransposeLowerer.tile_fixed`, :meth:`once_sweep`), then the passes."""
        low, cx, vec = self.low, self.cx, self.low.s.vec
        p = cx.var("pa", I32)
        tl, cl, body = self.slot(p, load=True, vec=vec)
        t, c = add(self.t0, tl), add(self.c0, cl)
        pred = and_(self.tv, and_(self.t_inside(t), self.c_inside(c)))
        row = self.row_of(self.clamped(t))
        fixed = low.tile_fixed()
        pre: list[kir.Stmt] = []        # the statements of the once-per-tile sweep
        once: list[SweepValues] = []    # that sweep, made when first asked

        def hoisted(name: str) -> list[kir.Expr] | None:
            if name not in fixed:
                return None
            if not once:
                once.append(self.once_sweep(pre))
            return once[0].value(name)

        sv = self.sweep(body, row, c, pred, hoisted)
        for name in dict.fromkeys(low.g.outputs):
            vals = sv.value(name)
            if name in low.tile.outputs:
                j = low.tile.outputs.index(name)
                for k in range(vec):
                    body.append(kir.StoreVec(f"tp{j}", add(add(mul(tl, I(low.pitch)), cl), I(k)), (vals[k],), pred))
            else:
                self.uses["out"].add(low.out_buf[name])
                low.mapped_store(body, name, low.row_base(name, row), c, vals, low.once_pred(name, row, pred))
        return [*pre, kir.For(p, I(0), I(self.passes), 1, tuple(body), unroll=True)]

    def remap_values(self, body: list[kir.Stmt], row: kir.Expr, c: kir.Expr, pred: kir.Expr | None,
                     sv: SweepValues) -> RemapValues:
        """The values of the graph's ``slice`` nodes at the load phase's element ``(row, c)``, as the row
        kernel computes them (:class:`~stitchtune.lower.remap.RemapValues`: a fused projection's columns
        read through the chain's index arithmetic, one vector load where it keeps vectors aligned)."""
        low, cx = self.low, self.cx
        k0, valid = cx.var("k", I32), cx.var("v", kir.BOOL)
        body += [Assign(k0, c), Assign(valid, pred if pred is not None else kir.Const(True, kir.BOOL))]

        def f_index(r: kir.Expr, k: kir.Expr, name: str | None = None) -> kir.Expr:
            if name is not None and low.p.mapped(name):
                return add(low.row_base(name, Bin("min", r, low.m_last())), k)
            return add(mul(Bin("min", r, low.m_last()), low.n_expr()), k)

        kern = _RemapHost(low, cx, SimpleNamespace(row=row), self.uses, f_index)
        return RemapValues(cast(Any, kern), RowSweep(I(0), k0, valid, body, False), sv)

    def store_phase(self) -> kir.For:
        """Read the tile down its columns and store the transposed outputs along ``t``, ``sv`` positions
        per lane (:meth:`TransposeLowerer.store_width`): one vector store each, or ``sv`` = 1 with 32
        consecutive positions per warp where a vector would not be one aligned run."""
        low, cx = self.low, self.cx
        sv = low.store_width()
        p = cx.var("pb", I32)
        tl, cl, body = self.slot(p, load=False, vec=sv)
        t, c = add(self.t0, tl), add(self.c0, cl)
        live = and_(self.tv, self.c_inside(c))
        ins = [and_(live, self.t_inside(add(t, I(k)))) for k in range(sv)]
        for j, name in enumerate(low.tile.outputs):
            buf = low.out_buf[name]
            self.uses["out"].add(buf)
            vals: list[kir.Expr] = []
            for k in range(sv):
                v = cx.var(f"y{j}_", F32)
                body.append(Assign(v, kir.Load(f"tp{j}", add(mul(add(tl, I(k)), I(low.pitch)), cl), ins[k])))
                vals.append(v)
            at = add(low.row_base(name, self.row_of(self.clamped(t))), low.col_offset(name, c))
            body.append(kir.StoreVec(buf, at, tuple(vals), ins[0]))
        passes = low.edge * low.edge // (sv * low.s.block)
        return kir.For(p, I(0), I(passes), 1, tuple(body), unroll=True)

    def build(self) -> tuple[kir.Kernel, kir.KernelProfile]:
        low = self.low
        tid = kir.Special("tid")
        head: list[kir.Stmt] = [Assign(self.lane, Bin("%", tid, I(32))), Assign(self.warp, Bin("/", tid, I(32)))]
        rb = self.task() + self.load_phase() + [kir.Barrier(), self.store_phase(), kir.Barrier()]
        body = head + [kir.For(self.rd, I(0), I(self.rounds), 1, tuple(rb))]
        kern = low.make_kernel(0, self.uses, self.cx, body, self.shared, [], False)
        prof = kernel_profile(low, kern, self.grid, self.rounds, self.smem, self.est, 0)
        return kern, prof
