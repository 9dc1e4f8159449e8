"""What the cost model counts in a built kernel: scratch loads per thread and block barriers per round."""

from __future__ import annotations

import math

from stitchtune.ir import kir
from stitchtune.ir.kir import BufferRole


def scratch_loads_per_thread(kern: kir.Kernel) -> int:
    """Loads (:class:`kir.Load` / :class:`kir.LoadVec`) of scratch parameters one thread executes,
    with each loop counted ``trip count`` times (constant bounds; 1 otherwise)."""
    scratch = {pp.name for pp in kern.params if pp.role == BufferRole.SCRATCH}

    def in_expr(x: kir.Expr | kir.Stmt | None) -> int:
        return sum(1 for e in kir.exprs(x) if isinstance(e, kir.Load) and e.buf in scratch)

    def in_stmts(stmts: tuple[kir.Stmt, ...]) -> int:
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
