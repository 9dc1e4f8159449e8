"""Guarded vector loads whose destinations do not carry the previous iteration's values, and where a column
sweep needs no row guard at all (:func:`rows_always_valid`)."""

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


def rows_always_valid(m: int, split: int, chunk: int, iters: int, tpr: int, rows: int) -> bool:
    """Whether a column sweep's row ``kbase + (it * tpr + tk) * rows + q`` (``it < iters``, ``tk < tpr``,
    ``q < rows``) is always inside its chunk ``[kbase, min(kbase + chunk, m))``: every one of the ``split``
    chunks whole (``m == split * chunk``) and the sweep covering it exactly (``iters * tpr * rows == chunk``).
    Then the sweep needs no ``r < ke`` guard per row: ptxas keeps more of the unrolled rows' loads in flight
    under a register cap (sm_90: BERT train view_47, the erf GELU backward's column sum at 72 registers,
    80 -> 96 B; at 64, 48 -> 64 B; results/walk-guarded-2026-12-07-s15/README.md)."""
    return m == split * chunk == split * iters * tpr * rows
