"""What the cost model counts in a built kernel, from its IR: scratch loads per thread, block barriers
per round, and its sweeps' reads, float and special-function operations (:func:`sweep_counts`, what
:class:`~stitchtune.ir.launches.KernelProfile` is derived from)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, assert_never

from stitchtune.graph.ops import OPS, kernel_op
from stitchtune.ir import kir
from stitchtune.ir.kir import BufferRole

#: the fields of each IR node type that :func:`kir.exprs` descends into (a For's / If's nested
#: statements are the statement walk's, not the expression walk's)
_EXPR_FIELDS: dict[type, tuple[str, ...]] = {}


def _expr_fields(t: type) -> tuple[str, ...]:
    names = _EXPR_FIELDS.get(t)
    if names is None:
        skip = {kir.For: ("body",), kir.If: ("then", "orelse")}.get(t, ())
        names = _EXPR_FIELDS[t] = tuple(f.name for f in dataclasses.fields(t) if f.name not in skip)
    return names


def _count_loads(x: Any, scratch: set[str], memo: dict[int, int]) -> int:
    """The scratch loads among ``kir.exprs(x)`` (counted with multiplicity, as that walk yields them),
    each IR node's count computed once (``memo`` by identity: lowering shares subtrees, and the walk
    met a shared subtree once per place it appears)."""
    if x is None or isinstance(x, (str, int, float, bool)):
        return 0
    if isinstance(x, tuple):
        return sum(_count_loads(y, scratch, memo) for y in x)
    key = id(x)
    n = memo.get(key)
    if n is None:
        n = int(isinstance(x, kir.Load) and x.buf in scratch)
        for name in _expr_fields(type(x)):
            n += _count_loads(getattr(x, name), scratch, memo)
        memo[key] = n
    return n


def scratch_loads_per_thread(kern: kir.Kernel) -> int:
    """Loads (:class:`kir.Load` / :class:`kir.LoadVec`) of scratch parameters one thread executes,
    with each loop counted ``trip count`` times (constant bounds; 1 otherwise)."""
    scratch = {pp.name for pp in kern.params if pp.role == BufferRole.SCRATCH}
    if not scratch:  # nothing to count: skip the walk over every expression
        return 0

    memo: dict[int, int] = {}  # the kernel holds every node alive, so identities stay unique

    def in_expr(x: kir.Expr | kir.Stmt | None) -> int:
        return _count_loads(x, scratch, memo)

    def in_stmts(stmts: tuple[kir.Stmt, ...]) -> int:
        n = 0
        for st in stmts:
            n += in_stmt(st)
        return n

    def in_stmt(st: kir.Stmt) -> int:
        match st:
            case kir.For():
                trip = 1
                if isinstance(st.start, kir.Const) and isinstance(st.stop, kir.Const) and st.step > 0:
                    trip = max(0, math.ceil((int(st.stop.value) - int(st.start.value)) / st.step))
                return trip * (in_stmts(st.body) + in_expr(st.start) + in_expr(st.stop))
            case kir.If():
                return in_expr(st.cond) + max(in_stmts(st.then), in_stmts(st.orelse))
            case kir.LoadVec():
                return int(st.buf in scratch) + in_expr(st)
            case (kir.Assign() | kir.SetLocal() | kir.StoreVec() | kir.AtomicAdd() | kir.RemoteStore()
                  | kir.Barrier() | kir.GridSync() | kir.ClusterSync() | kir.Comment()):
                return in_expr(st)  # the scratch loads among its expressions
            case _:
                assert_never(st)

    return in_stmts(kern.body)


def kern_barriers(kern: kir.Kernel) -> int:
    """Barriers per round (statically counted inside the round loop)."""
    return sum(1 for st in kir.walk(kern.body) if isinstance(st, kir.Barrier))


@dataclass(frozen=True)
class SweepCounts:
    """What a kernel's sweeps do, counted in its IR (:func:`sweep_counts`): ``reads`` maps each
    full-size buffer to the number of sweeps that load it (however many loads one sweep makes);
    ``flops`` / ``sfu`` are the float and special-function operations of one step of every sweep
    (one ``vec``-element group, summed over the sweeps: the profile scales them by ``M*N / vec``)."""

    reads: Mapping[str, int]
    flops: int
    sfu: int


def _op_cost(x: kir.Expr, rcps: set[str]) -> tuple[int, int]:
    """(float ops, special-function ops) of one expression node, its operands not included: a math op
    its op table entry (:func:`stitchtune.graph.ops.kernel_op`), an int op its graph op's entry, a
    multiply by a reciprocal (a variable in ``rcps``) one float op, anything else none."""
    match x:
        case kir.MathOp():
            info = kernel_op(x.op)
            return info.flops, info.sfu
        case kir.IntOp():
            info2 = OPS.get(x.op)
            return (info2.flops, info2.sfu) if info2 is not None else (0, 0)
        case kir.Bin() if x.op == "*" and isinstance(x.b, kir.Var) and x.b.name in rcps:
            return 1, 0
        case kir.Bin() if x.op == "/" and (_is_float(x.a) or _is_float(x.b)):
            return OPS["div"].flops, OPS["div"].sfu
        case _:
            return 0, 0


def _is_float(x: kir.Expr) -> bool:
    """Whether ``x`` is a float constant or variable (the operands of a float division)."""
    return isinstance(x, (kir.Const, kir.Var)) and x.dtype == kir.F32


def _loaded_bufs(stmts: tuple[kir.Stmt, ...]) -> set[str]:
    """The global buffers loaded anywhere in ``stmts``."""
    out: set[str] = set()
    for st in kir.walk(stmts):
        if isinstance(st, kir.LoadVec):
            out.add(st.buf)
        for x in kir.exprs(st):
            if isinstance(x, (kir.Load, kir.IndexLoad)):
                out.add(x.buf)
    return out


def loads_from(stmts: list[kir.Stmt] | tuple[kir.Stmt, ...], bufs: Collection[str]) -> bool:
    """Whether ``stmts`` load from a buffer named in ``bufs`` anywhere (a sweep's body: whether the
    sweep reads memory, for the sweep order)."""
    return bool(_loaded_bufs(tuple(stmts)) & set(bufs))


def sweep_reads(stmts: tuple[kir.Stmt, ...], full: Collection[str]) -> dict[str, int]:
    """The sweeps among ``stmts`` (its loops, not nested in another of its loops) that load each
    buffer named in ``full``, by buffer (a sweep counts once, however many loads it makes)."""
    reads: dict[str, int] = {}
    for sw in _direct_loops(stmts):
        for buf in sorted(_loaded_bufs(sw.body) & set(full)):
            reads[buf] = reads.get(buf, 0) + 1
    return reads


def sweep_counts(kern: kir.Kernel, full: Collection[str]) -> SweepCounts:
    """The sweeps of ``kern`` counted (:class:`SweepCounts`). A sweep is a loop directly inside one of
    the kernel's top-level loops (its round loop); ``full`` names the buffers whose reads count (the
    full-size inputs and gather tables). A prefetch loop (the next task's elements loaded into a local
    array, inside the round loop) is a sweep: it counts the read of the sweep that takes the elements
    from the local array (which loads nothing itself). Float and special-function operations
    (:func:`_op_cost`) are counted statically, each loop body once."""
    rcps = {st.var.name for st in kir.walk(kern.body)
            if isinstance(st, kir.Assign) and isinstance(st.expr, kir.MathOp) and st.expr.op == "fast_rcp"}
    reads: dict[str, int] = {}
    flops = sfu = 0
    for top in kern.body:
        if not isinstance(top, kir.For):
            continue
        for buf, n in sweep_reads(top.body, full).items():
            reads[buf] = reads.get(buf, 0) + n
        for sw in _direct_loops(top.body):
            for st in kir.walk(sw.body):
                for x in kir.exprs(st):
                    f, s = _op_cost(x, rcps)
                    flops, sfu = flops + f, sfu + s
    return SweepCounts(reads, flops, sfu)


def _direct_loops(stmts: tuple[kir.Stmt, ...]) -> Iterator[kir.For]:
    """The loops in ``stmts`` not nested in another loop of ``stmts`` (branches are looked into)."""
    for st in stmts:
        if isinstance(st, kir.For):
            yield st
        elif isinstance(st, kir.If):
            yield from _direct_loops(st.then)
            yield from _direct_loops(st.orelse)
