"""What the cost model counts in a built kernel: scratch loads per thread and block barriers per round."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, assert_never

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
