"""Lowering machinery shared by both families (see :mod:`stitchtune.lower.entry` for the contract).

:class:`Lowerer` holds the buffers, reuse levels and helpers every family uses (kernel constructor,
grid sizing, the sweep order and task order of ``Schedule.order``); the per-element values of one
sweep are :class:`stitchtune.lower.sweep_values.SweepValues`, a kernel's profile
:func:`stitchtune.lower.profile.kernel_profile`. The families are :mod:`stitchtune.lower.row` and :mod:`stitchtune.lower.col`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from stitchtune.ir import kir
from stitchtune.graph.parse import Graph, Node
from stitchtune.ir.kir import F32, I32, I64, INT_VTYPE, Assign, Bin, BufferRole, Const, Load, MathOp, Var
from stitchtune.hardware.device import Device
from stitchtune.hardware.occupancy import max_resident_blocks
from stitchtune.ir.launches import grid_size
from stitchtune.lower.guarded_loads import load_vec
from stitchtune.lower.sectors import row_sector_factor
from stitchtune.lower.store_once import first_writer
from stitchtune.lower.symbols import RowSymbols
from stitchtune.graph.fast_ops import FAST_FORM
from stitchtune.graph.ops import OPS, OpInfo
from stitchtune.plan.family import Family
from stitchtune.plan.index_map import AxisMap
from stitchtune.plan.ints import int_registers
from stitchtune.plan.planner import StitchPlan, TensorClass
from stitchtune.plan.chains import composed_chains
from stitchtune.plan.single_pass import SinglePassCandidate
from stitchtune.space import ORDER, SCHEMES, Order, Schedule, Scheme, SchemeTable, exact_math

#: the C comparison of each graph comparison op (int registers compare with kir.Bin)
_CMP_OPS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}

V = TypeVar("V")  # a family's per-row / per-column value (row: one expression; column: vec of them)

def I(v: int) -> Const:  # noqa: E743 (the short name keeps index arithmetic readable)
    """The int32 constant ``v``."""
    return Const(int(v), I32)


def _folded(op: str, unit: int, a: kir.Expr, b: kir.Expr) -> kir.Expr:
    """``a op b``, or the other operand where one is the constant ``unit`` (0 for +, 1 for *)."""
    if isinstance(b, Const) and b.value == unit:
        return a
    if isinstance(a, Const) and a.value == unit:
        return b
    return Bin(op, a, b)


def add(a: kir.Expr, b: kir.Expr) -> kir.Expr:
    return _folded("+", 0, a, b)


def mul(a: kir.Expr, b: kir.Expr) -> kir.Expr:
    return _folded("*", 1, a, b)


def and_(a: kir.Expr | None, b: kir.Expr | None) -> kir.Expr | None:
    if a is None:
        return b
    if b is None:
        return a
    return Bin("&&", a, b)


def _axis_offset(am: AxisMap, i: kir.Expr) -> kir.Expr:
    """``sum(((i // f.inner) % f.dim) * f.stride)`` over the factors of axis map ``am``, without the
    divisions by 1, the ``%`` that cannot wrap and the products by 1 (``0`` for a broadcast axis)."""
    out: kir.Expr = I(0)
    for f in am.factors:
        t = Bin("/", i, I(f.inner)) if f.inner > 1 else i
        if am.needs_mod(f):
            t = Bin("%", t, I(f.dim))
        out = add(out, mul(t, I(f.stride)))
    return out


def estimate_registers(per_thread_cache: int, vec: int, n_live: int) -> int:
    """A pre-compilation register estimate (replaced by ptxas figures after the build)."""
    return int(min(255, 24 + per_thread_cache + 2 * vec * max(1, n_live)))


@dataclass(frozen=True)
class Sizes:
    """How a family cuts a program's work, fixed by its schedule and plan before the shared state
    (:class:`Lowerer`) is built; the family passes it in (``row_sizes`` of :mod:`stitchtune.lower.row`,
    :func:`stitchtune.lower.col.col_sizes`, the transpose's passes)."""

    rpb: int          # rows a block holds at once (row family: block // tpr; 1 in the others)
    chunk: int        # elements of a reduction row (row family) or rows of a column chunk (column family) a block covers per task
    per_thread: int   # of them a thread's (the length of its register caches)
    iters: int        # a sweep's iterations (the transpose: its passes over a tile)


@dataclass
class Ctx:
    """Mutable state while building one kernel: the scratch buffers it uses and the counter that
    numbers its variables (never escapes the lowering)."""

    scratch: set[str] = field(default_factory=set)
    counter: int = 0

    def var(self, prefix: str, dtype: str = F32) -> Var:
        self.counter += 1
        return Var(f"{prefix}{self.counter}", dtype)


class Lowerer:
    """Shared machinery of both families.

    ``kernel_reuse`` (per kernel, the reuse levels with the caches that kernel never reads back dropped,
    :mod:`stitchtune.lower.liveness`) is derived by the family's constructor from this state."""

    kernel_reuse: list[dict[str, str]]
    rows, row_vectors = 1, frozenset[str]()  # view rows per access of inputs row_vectors (lower/row_vectors.py)

    def __init__(self, graph: Graph, plan: StitchPlan, s: Schedule, device: Device, sizes: Sizes,
                 schemes: SchemeTable = SCHEMES, sym: RowSymbols | None = None,
                 merged: Mapping[int, SinglePassCandidate] | None = None) -> None:
        """The shared state of a program's lowering, with the family's ``sizes`` and single-pass pairs
        ``merged`` (first stage of each merged pair -> its candidate; none by default); a family's
        constructor completes it with what it derives from this state (its kernels' reuse levels: nothing
        is set later, :meth:`lower` and :meth:`resources` only read). ``sym``: the view's rows as
        expressions over the kernels' extent arguments for a generic lowering
        (:mod:`stitchtune.lower.dynamic`); None for a static one."""
        graph = plan.planned_graph(graph)   # the row-move rewrite make_plan planned, if any
        self.g, self.p, self.s, self.dev = graph, plan, s, device
        self.schemes = schemes
        self.nodes = {nd.id: nd for nd in graph.nodes}
        self.tid_of = {n: i for i, n in enumerate(list(plan.input_names) + [nd.id for nd in graph.nodes])}
        self.cls = dict(plan.classes)
        #: int tensors held as int registers (:mod:`stitchtune.plan.ints`); empty for most graphs
        self.int_regs = int_registers(graph)
        # global buffers
        self.buffers: list[kir.BufferSpec] = []
        self.in_buf: dict[str, str] = {}
        for i, (name, spec) in enumerate(graph.inputs):
            b = f"in{i}"
            self.in_buf[name] = b
            self.buffers.append(kir.BufferSpec(b, spec.dtype, math.prod(spec.shape), BufferRole.INPUT, name))
        self.out_buf: dict[str, str] = {}
        for j, name in enumerate(dict.fromkeys(graph.outputs)):
            b = f"out{j}"
            self.out_buf[name] = b
            spec = graph.spec(name)
            self.buffers.append(kir.BufferSpec(b, spec.dtype, math.prod(spec.shape), BufferRole.OUTPUT, name))
        self.reuse = dict(zip(plan.reuse_candidates, s.reuse))
        #: exact arithmetic (schedule option ``exact_math``), else the fast forms of :mod:`stitchtune.graph.fast_ops`
        self.exact = exact_math(s)
        self.gather_tables = {nd.args[0] for nd in graph.nodes if nd.op == "gather"}
        #: the input buffers whose sweeps' reads a kernel profile counts (:func:`stitchtune.lower.counts.sweep_counts`):
        #: the full-size inputs and the gather tables
        self.swept_inputs = frozenset(b.name for b in self.buffers if b.role == BufferRole.INPUT and (
            self.cls.get(b.tensor) is TensorClass.FULL or b.tensor in self.gather_tables))
        #: the heads of layout chains of inputs (:func:`~stitchtune.plan.chains.composed_chains`): loaded by
        #: the chain's index arithmetic (:mod:`stitchtune.lower.remap`), also where a sweep reads them as they are
        self.chain_heads = frozenset(composed_chains(graph))
        #: the family's sizes (:class:`Sizes`)
        self.rpb, self.chunk, self.per_thread, self.iters = sizes.rpb, sizes.chunk, sizes.per_thread, sizes.iters
        #: single-pass pairs (``schedule.single_pass``): first stage of each merged pair -> its candidate
        self.merged: dict[int, SinglePassCandidate] = dict(merged or {})
        self.red_idx = {r: i for i, r in enumerate(plan.reductions)}
        # sweep order (schedule.order == Order.ALTERNATE), carried across kernels: the direction of the last
        # sweep that read a full-size tensor from memory, and the task order of the last kernel that did
        # (True = backwards; None before the first)
        self.last_reversed: bool | None = None
        self.last_tasks_reversed: bool | None = None
        #: a generic lowering (:mod:`stitchtune.lower.dynamic`): the view's rows as expressions over the
        #: kernels' extent arguments; None for the static lowering (constants, the kernels of before)
        self.sym = sym

    # -- the view's row count: a constant, or an expression of a generic kernel ----------------------
    def m_expr(self) -> kir.Expr:
        """``M``, the view's rows (in a generic kernel: over its extent arguments)."""
        return I(self.p.M) if self.sym is None else self.sym.expr(self.sym.M)

    def m_last(self) -> kir.Expr:
        """``M - 1``, the last row (what row indices are clamped to)."""
        return I(self.p.M - 1) if self.sym is None else Bin("-", self.sym.expr(self.sym.M), I(1))

    def n_expr(self) -> kir.Expr:
        """``N``, the row length (in a generic kernel with a dynamic row length: over its extent arguments)."""
        return I(self.p.N) if self.sym is None or self.sym.N.static else self.sym.expr(self.sym.N)

    def k_value(self) -> int | kir.Expr:
        """The reductions' length ``K`` (row family: ``N``) as a constant, or an expression of a generic
        kernel with a dynamic row length (a mean then divides by it at run time)."""
        return self.p.K if self.sym is None or self.sym.N.static else self.sym.expr(self.sym.N)

    def rounds_expr(self, rounds: int, rows_per_task: int, split: int) -> kir.Expr:
        """The trip count of the round loop: ``rounds`` in a static kernel; in a generic one the tasks at
        the launch's extents (``ceil(M / rows_per_task)``, or ``M * split``) over the grid, rounded up."""
        if self.sym is None:
            return I(rounds)
        m = self.sym.expr(self.sym.M)
        tasks = Bin("*", m, I(split)) if split > 1 else (
            m if rows_per_task == 1 else Bin("/", Bin("+", m, I(rows_per_task - 1)), I(rows_per_task)))
        g = kir.Special("gdim")
        return Bin("/", Bin("-", Bin("+", tasks, g), I(1)), g)

    # -- schemes ----------------------------------------------------------------------------------
    def stage_scheme(self, st: int) -> Scheme:
        """The scheme stage ``st`` runs with: its own, or for the second stage of a merged pair the
        first one's (the two are one stage then)."""
        return self.schemes[self.s.schemes[st - 1] if st - 1 in self.merged else self.s.schemes[st]]

    def merged_second(self, st: int) -> bool:
        """Whether stage ``st`` is computed by the sweep of the stage before it (single pass)."""
        return st - 1 in self.merged

    # -- sweep order ------------------------------------------------------------------------------
    def sweep_index(self, cx: Ctx, it: Var) -> tuple[kir.Expr, Var | None]:
        """The logical iteration index of a sweep over ``it``: ``it`` itself for forward schedules;
        for ``alternate`` ones a fresh variable whose assignment :meth:`order_sweep` emits once the
        sweep's body is known."""
        if self.s.option(ORDER) != Order.ALTERNATE:
            return it, None
        ii = cx.var("ii", I32)
        return ii, ii

    def order_sweep(self, ii: Var | None, it: Var, iters: int, reads_memory: bool) -> list[kir.Stmt]:
        """The assignment of the logical index ``ii`` (no statement for forward schedules). A sweep that
        reads a full-size tensor from memory runs opposite to the previous such sweep (the first one
        forwards), so that it starts with what the previous one left in L2; other sweeps run forwards."""
        if ii is None:
            return []
        rev = False
        if reads_memory:
            rev = self.last_reversed is False
            self.last_reversed = rev
        return [Assign(ii, Bin("-", I(iters - 1), it) if rev else it)]

    def order_tasks(self, rb: list[kir.Stmt], reads_memory: bool, total: int | kir.Expr) -> None:
        """Alternate order: of consecutive kernels that read full-size tensors from memory, every other
        one takes its tasks backwards (the first forwards), so that a re-read across a kernel boundary
        starts with the tasks whose data the previous kernel left in L2. ``rb[0]`` is the assignment of
        the task index; ``total`` = rounds x grid, so every round still takes an aligned group of
        ``grid`` consecutive tasks (whole rows for a split row, as a grid barrier needs)."""
        if self.s.option(ORDER) != Order.ALTERNATE or not reads_memory:
            return
        rev = self.last_tasks_reversed is False
        self.last_tasks_reversed = rev
        if rev:
            head = rb[0]
            assert isinstance(head, Assign), "the round body starts with the task index's assignment"
            last = I(total - 1) if isinstance(total, int) else Bin("-", total, I(1))  # generic: an expression
            rb[0] = Assign(head.var, Bin("-", last, head.expr))

    # -- index maps -----------------------------------------------------------------------------
    def row_base(self, name: str, r: kir.Expr) -> kir.Expr:
        """The offset of row ``r`` (``0 <= r < M``: callers clamp) in tensor ``name`` through its
        index map: the sum over its row factors of ``((r // inner) % dim) * stride``, without the
        divisions by 1, the ``%`` that cannot wrap and the products by 1."""
        if self.sym is not None:
            return self.sym.row_offset(name, r)
        return _axis_offset(self.p.imap(name).rows, r)

    def col_offset(self, name: str, c: kir.Expr) -> kir.Expr:
        """The offset column ``c`` (``0 <= c < N``) adds in tensor ``name`` through its index map (the
        column factors, as :meth:`row_base`; ``c`` itself for a contiguous map). In a generic kernel the
        symbolic factors where the row length or the map follows the extents (a transposed output whose
        column stride is a dynamic dim)."""
        if self.sym is not None and (not self.sym.N.static or self.sym.cols_follow(name)):
            return self.sym.col_offset(name, c)
        return _axis_offset(self.p.imap(name).cols, c)

    def once_pred(self, name: str, r: kir.Expr, pred: kir.Expr | None) -> kir.Expr | None:
        """``pred`` and, for an output broadcast along part of the rows, row ``r`` its one writer
        (:func:`~stitchtune.lower.store_once.first_writer`)."""
        for cond in first_writer(self.p.imap(name), self.p.M, self.sym, name, r):
            pred = and_(pred, cond)
        return pred

    def mapped_load(self, cx: Ctx, body: list[kir.Stmt], name: str, base: kir.Expr, c: kir.Expr,
                    pred: kir.Expr | None, prefix: str, zeroed: bool = False) -> list[kir.Expr]:
        """Append the loads of the ``vec`` elements ``c .. c + vec - 1`` (``c`` a multiple of ``vec``) of
        input ``name`` at row offset ``base`` to ``body`` and return their values, by the map's
        :meth:`~stitchtune.plan.index_map.IndexMap.vector_mode`: one vector load, one scalar load
        broadcast to the ``vec`` values, or one scalar load per element. ``zeroed``: a guarded vector load
        is preceded by its destinations set to 0 (:func:`load_vec`)."""
        vec, buf, vt = self.s.vec, self.in_buf[name], self.vtype(name)
        mode = self.p.imap(name).vector_mode(vec)
        if mode == "vector":
            dsts = tuple(cx.var(prefix, vt) for _ in range(vec))
            body.extend(load_vec(dsts, buf, add(base, self.col_offset(name, c)), pred, zeroed))
            return list(dsts)
        if mode == "uniform":
            v = cx.var(prefix, vt)
            body.append(Assign(v, self.load(name, add(base, self.col_offset(name, c)), pred)))
            return [v] * vec
        out: list[kir.Expr] = []
        for j in range(vec):
            v = cx.var(prefix, vt)
            body.append(Assign(v, self.load(name, add(base, self.col_offset(name, add(c, I(j)))), pred)))
            out.append(v)
        return out

    def load(self, name: str, index: kir.Expr, pred: kir.Expr | None) -> Load:
        """A scalar load of input ``name`` at ``index``: float32, or its own int width for an int register."""
        vt = self.vtype(name)
        return Load(self.in_buf[name], index, pred) if vt == F32 else Load(self.in_buf[name], index, pred, vt)

    def mapped_store(self, body: list[kir.Stmt], name: str, base: kir.Expr, c: kir.Expr, vals: list[kir.Expr],
                     pred: kir.Expr | None) -> None:
        """Append the stores of the ``vec`` values of output ``name`` at columns ``c .. c + vec - 1``
        and row offset ``base``: one vector store where the map is contiguous there, else one
        scalar store per element (an output's map is bijective: never ``uniform`` for ``vec > 1``)."""
        buf = self.out_buf[name]
        if self.p.imap(name).vector_mode(len(vals)) == "vector":
            body.append(kir.StoreVec(buf, add(base, self.col_offset(name, c)), tuple(vals), pred))
            return
        for j, v in enumerate(vals):
            body.append(kir.StoreVec(buf, add(base, self.col_offset(name, add(c, I(j)))), (v,), pred))

    def sector_factor(self, buf: kir.BufferSpec) -> float:
        """32-byte sectors moved per ideal sector of ``buf`` in a sweep: the sectors of one warp access
        through the tensor's index map (:func:`~stitchtune.lower.sectors.row_sector_factor`: the lanes
        of a warp take ``vec`` adjacent columns each, :meth:`lanes_per_row` of them per view row). 1
        for a coalesced or broadcast tensor; up to 8 for a transposed float32 one (its innermost
        column factor strided), at any size (module docstring of :mod:`stitchtune.lower.sectors`)."""
        name = buf.tensor if buf.role in (BufferRole.INPUT, BufferRole.OUTPUT) else ""
        if not name or not self.p.mapped(name) or name in self.gather_tables:
            return 1.0
        return row_sector_factor(self.p.imap(name), kir.ELEM_BYTES[buf.dtype], self.s.vec, self.lanes_per_row(),
                                 self.rows if name in self.row_vectors else 1, row_step=self.rows)

    def lanes_per_row(self) -> int:
        """The lanes of a warp on one view row (adjacent columns): ``tpr`` (row family), ``block // tpr`` (column)."""
        if self.p.family == Family.COL:
            return min(32, max(1, self.s.block // max(1, self.s.tpr)))
        return min(32, self.s.tpr)

    # -- helpers ------------------------------------------------------------------------------
    def param(self, bufname: str) -> kir.Param:
        b = next(x for x in self.buffers if x.name == bufname)
        return kir.Param(b.name, b.dtype if b.role != BufferRole.BARRIER else "float32", b.size, b.role)

    def scratch(self, name: str, size: int) -> str:
        if not any(b.name == name for b in self.buffers):
            self.buffers.append(kir.BufferSpec(name, "float32", size, BufferRole.SCRATCH, "", zero_init=False))
        return name

    def barrier_buf(self) -> str:
        if not any(b.name == "gbar" for b in self.buffers):
            self.buffers.append(kir.BufferSpec("gbar", "float32", 2, BufferRole.BARRIER, "", zero_init=True))
        return "gbar"

    def red_info(self, r: str) -> OpInfo:
        return OPS[self.nodes[r].op]

    def vtype(self, name: str) -> str:
        """The IR type of tensor ``name``'s values in registers: i32 / i64 for an int register, else f32."""
        return INT_VTYPE[self.g.spec(name).dtype] if name in self.int_regs else F32

    def iota_at(self, name: str, offset: kir.Expr) -> kir.Expr:
        """The value of ``iota`` node ``name`` at element ``offset`` (``< numel``) of its own row-major
        layout: ``(offset // inner) % dim`` along its axis, at its int type."""
        nd = self.nodes[name]
        assert nd.axis is not None
        t = self.sym.iota_at(name, offset) if self.sym is not None else None   # a generic kernel's: symbolic
        if t is None:
            inner = math.prod(nd.shape[nd.axis + 1:])
            t = Bin("/", offset, I(inner)) if inner > 1 else offset
            if nd.axis > 0:
                t = Bin("%", t, I(nd.shape[nd.axis]))
        return t if self.vtype(name) == I32 else kir.Cast(t, self.vtype(name))

    def int_expr(self, nd: Node, args: list[kir.Expr]) -> kir.Expr:
        """The expression of a node that reads or gives int registers (see graph-format.md, "Integer
        values"): int ops at their width, comparisons and ``where`` as C's, casts to / from int."""
        info = OPS[nd.op]
        src = [self.vtype(a) if isinstance(a, str) else None for a in nd.args]
        if info.kind == "layout":
            return args[0]
        if info.result == "float32":   # uniform(seed, counter): int operands, a float32 value
            return MathOp(nd.op, tuple(args))
        if info.kind == "cast":
            to, a, st = nd.to or nd.dtype, args[0], src[0]
            if st in (I32, I64):
                if to in INT_VTYPE:
                    return a if INT_VTYPE[to] == st else kir.Cast(a, INT_VTYPE[to])
                if to == "bool":
                    return kir.Select(Bin("!=", a, Const(0, st)), Const(1.0, F32), Const(0.0, F32))
                f = kir.Cast(a, F32)
                return MathOp(f"round_{to}", (f,)) if to in ("float16", "bfloat16") else f
            return kir.IntOp("from_float", (a,), INT_VTYPE[to])
        ints = [t for t in src if t in (I32, I64)]
        t = I64 if I64 in ints else I32

        def typed(k: int) -> kir.Expr:  # argument k at int type t (constants become int literals)
            a = args[k]
            if isinstance(a, Const):
                return Const(int(a.value), t)
            return a if src[k] == t else kir.Cast(a, t)
        if nd.op == "where":
            return kir.Select(Bin("!=", args[0], Const(0.0, F32)), typed(1), typed(2))
        if info.result == "bool":
            return kir.Select(Bin(_CMP_OPS[nd.op], typed(0), typed(1)), Const(1.0, F32), Const(0.0, F32))
        return kir.IntOp(nd.op, tuple(typed(k) for k in range(len(args))), t)

    def expr_of_node(self, nd: Node, args: list[kir.Expr]) -> kir.Expr:
        info = OPS[nd.op]
        if self.int_regs and (nd.id in self.int_regs or any(a in self.int_regs for a in nd.tensor_args)):
            return self.int_expr(nd, args)
        if info.kind == "layout":  # transpose / reshape: the planner's index maps moved the element
            return args[0]
        if info.kind == "cast":  # float32 registers: a cast to a 16-bit type rounds, as the reference does
            to = nd.to or nd.dtype
            if to == "bool":  # bools are 0.0f / 1.0f in registers (a bool -> float cast is the identity)
                return MathOp("to_bool", (args[0],))
            return MathOp(f"round_{to}", (args[0],)) if to in ("float16", "bfloat16") else args[0]
        if nd.op == "pow" and isinstance(args[1], Const) and (args[1].value == 1 or not self.exact and args[1].value in (2, 3, 4)):
            # x ** 1 is x, also exact (Llama's RMS-norm backward); x ** 2..4 (GPT-2's GELU) products, not powf
            x, k = args[0], int(args[1].value)
            return x if k == 1 else Bin("*", Bin("*", x, x), Bin("*", x, x)) if k == 4 else (
                Bin("*", Bin("*", x, x), x) if k == 3 else Bin("*", x, x))
        return MathOp(nd.op if self.exact else FAST_FORM.get(nd.op, nd.op), tuple(args))

    def combine(self, r: str, a: kir.Expr, b: kir.Expr) -> kir.Expr:
        """``a`` and ``b`` (partials of reduction ``r``) combined by the op table's ``combine_op``."""
        op = self.red_info(r).combine_op
        assert op is not None
        return Bin(op, a, b)

    def identity(self, r: str) -> Const:
        ident = self.red_info(r).identity
        assert ident is not None, f"'{r}' is not a reduction"
        return Const(float(ident), F32)

    def ready_p_nodes(self, pvals: Mapping[str, V], load_p: Callable[[str], V],
                      const: Callable[[float], V]) -> Iterator[tuple[Node, list[V]]]:
        """Yield ``(node, argument values)`` for every per-row/per-column/scalar node not computed yet
        whose arguments are all available (``pvals``, or a per-row/per-column or scalar input loaded
        through ``load_p``); ``const(x)`` turns a constant argument into a value."""
        for nd in self.g.nodes:
            if (self.cls[nd.id].varies_along_reduced or nd.id in pvals or OPS[nd.op].kind == "reduce"
                    or nd.id in self.p.epilogue):  # (the epilogue runs after the cross combine)
                continue
            args: list[V] = []
            for a in nd.args:
                if not isinstance(a, str):
                    args.append(const(float(a)))
                elif a in pvals:
                    args.append(pvals[a])
                elif a in self.in_buf and not self.cls[a].varies_along_reduced:
                    args.append(load_p(a))
                else:
                    break
            else:
                yield nd, args

    def make_kernel(self, ki: int, uses: dict[str, set[str]], cx: Ctx, body: list[kir.Stmt],
                    shared: list[kir.SharedBuf], locals_: list[kir.LocalArray],
                    needs_sync: bool) -> kir.Kernel:
        """Kernel ``st_k<ki>`` with its pointer parameters in a fixed order: inputs, outputs (by index),
        scratch (by name), then the grid-barrier counter when the kernel synchronises the grid."""
        params = [self.param(b) for b in sorted(uses["in"], key=lambda x: int(x[2:]))]
        params += [self.param(b) for b in sorted(uses["out"], key=lambda x: int(x[3:]))]
        params += [self.param(b) for b in sorted(cx.scratch)]
        if needs_sync:
            params.append(self.param(self.barrier_buf()))
        return kir.Kernel(f"st_k{ki}", tuple(params), tuple(body), self.s.block, tuple(shared), tuple(locals_),
                          self.s.min_blocks, "gbar" if needs_sync else None,
                          extents=() if self.sym is None else self.sym.arg_names())

    def kernel_segments(self) -> list[list[int]]:
        """Stages (0-based) per kernel: a new kernel starts after each stage whose scheme has a kernel
        boundary."""
        segs: list[list[int]] = [[]]
        for i, sch in enumerate(self.s.schemes):
            segs[-1].append(i)
            if self.schemes[sch].kernel_boundary:
                segs.append([])
        return segs

    def grid_for(self, tasks: int, block: int, smem: int, est_regs: int, multiple: int, needs_sync: bool) -> int:
        """Blocks of a kernel with ``tasks`` tasks (:func:`stitchtune.ir.launches.grid_size` with the
        blocks of this kernel that are co-resident on the device)."""
        s = self.s
        cores = max_resident_blocks(self.dev, block, est_regs, smem)
        return grid_size(tasks, s.tasks_per_block, s.persistent, needs_sync, multiple, cores)


    def finalize(self, rb: list[kir.Stmt], r: str, accs: list[Var]) -> None:
        """Turn a combined sum (the accumulators ``accs`` of reduction ``r``) into a mean where the
        reduction is a mean."""
        if self.red_info(r).is_mean:
            for v in dict.fromkeys(accs):
                rb.append(Assign(v, Bin("*", v, Const(1.0 / self.p.K, F32))))

    def tasks_in_flight_bytes(self, grid: int) -> int:
        """Bytes of the full-size tensors that one round of ``grid`` blocks touches (the re-read working set)."""
        s = self.s
        rows = grid * self.rpb if s.split == 1 else grid // max(1, s.split)
        return rows * self.p.N * 4
