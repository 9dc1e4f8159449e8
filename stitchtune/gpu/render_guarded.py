"""Guarded vector loads in loops, rendered so that each is independent of the one before.

A ``LoadVec`` with ``pred`` keeps its destinations' values where the guard is false. Written as
``if (pred) { float4 v = load; d = v.x; ... }`` inside a loop, the destination registers carry the previous
iteration's values, and nvcc copies them into the next load's registers before issuing it (``MOV`` before
``@P LDG``): each load waits for the one before. Such a load (in a loop, its destinations not set to 0 by the
statements just before it, as :func:`stitchtune.lower.guarded_loads.load_vec` with ``zeroed`` does) is
rendered into fresh block-local temporaries set to 0, then ``d = pred ? temp : d``, the guard evaluated once:
the IR's meaning, without the chain. Loads whose destinations were just zeroed, and loads outside loops,
render as before.
"""

from __future__ import annotations

from stitchtune.ir import kir


class ZeroRun:
    """The variables set to 0 by the run of ``Assign`` statements just before the current one."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def needs_fresh(self, s: kir.Stmt, in_loop: bool) -> bool:
        """``s`` is a guarded vector load in a loop whose destinations are not all just zeroed."""
        return (isinstance(s, kir.LoadVec) and s.pred is not None and in_loop
                and not all(d.name in self.names for d in s.dsts))

    def after(self, s: kir.Stmt) -> None:
        """Account for ``s``, just rendered."""
        if not isinstance(s, kir.Assign):
            self.names.clear()
            return
        self.names.discard(s.var.name)
        if isinstance(s.expr, kir.Const) and s.expr.value == 0:
            self.names.add(s.var.name)


def fresh_parts(load: kir.LoadVec, n: int) -> tuple[kir.Var, tuple[kir.Var, ...], kir.LoadVec]:
    """The guard variable, the temporaries (named from the renderer's counter ``n``) and the load into them."""
    g = kir.Var(f"_g{n}", kir.BOOL)
    temps = tuple(kir.Var(f"_f{n}_{k}", d.dtype) for k, d in enumerate(load.dsts))
    return g, temps, kir.LoadVec(temps, load.buf, load.index, g)
