"""Guarded vector loads whose destinations do not carry the previous iteration's values."""

from __future__ import annotations

from stitchtune.ir import kir
from stitchtune.ir.kir import F32, Assign, Const, Var


def load_vec(dsts: tuple[Var, ...], buf: str, index: kir.Expr, pred: kir.Expr | None,
             zeroed: bool = False) -> list[kir.Stmt]:
    """A vector load of ``buf[index ..]`` into ``dsts`` if ``pred``; with ``zeroed`` (and a ``pred``)
    the destinations are set to 0 first.

    A guarded load that is not taken keeps its destinations' values. The renderer declares every
    variable once at the top of the kernel, so in an unrolled sweep whose iterations each load a row (a
    column sweep) the compiler copies the previous load's registers into the next load's destinations
    before issuing it: each load waits for the one before it, one load in flight per thread. With the
    destinations zeroed the loads are independent and all of them are issued before the first is used
    (``LDG`` in flight, :mod:`stitchtune.gpu.sass`); the emulator sees the same values (0 where
    the guard is false, as a guarded scalar :class:`~stitchtune.ir.kir.Load` gives)."""
    if not zeroed or pred is None or any(d.dtype != F32 for d in dsts):  # int registers load one by one
        return [kir.LoadVec(dsts, buf, index, pred)]
    return [*(Assign(d, Const(0.0)) for d in dsts), kir.LoadVec(dsts, buf, index, pred)]
