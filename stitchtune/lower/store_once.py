"""The one writer of each element of an output broadcast along part of the rows.

An output whose :attr:`~stitchtune.plan.index_map.IndexMap.store_once` is set repeats along some of the view's
rows (a query next to a cache concat that sets the domain, a per-batch statistic in a per-row region): every
repeat computes the same value, and only the row at coordinate 0 along each repeat stores it.
"""
from __future__ import annotations

from stitchtune.ir import kir
from stitchtune.ir.kir import I32, Bin, Const
from stitchtune.lower.symbols import RowSymbols
from stitchtune.plan.index_map import IndexMap


def first_writer(im: IndexMap, M: int, sym: RowSymbols | None, name: str, r: kir.Expr) -> list[kir.Expr]:
    """The conditions that view row ``r`` writes tensor ``name`` (index map ``im``, ``M`` view rows): ``r`` at
    coordinate 0 along each row repeat, ``(r // inner) % dim == 0`` (the ``%`` left out where ``inner * dim``
    covers every row); in a generic kernel (``sym``) over the symbolic repeats
    (:meth:`~stitchtune.lower.symbols.RowSymbols.first_repeat`). ``[]`` for a tensor stored by every row."""
    if not im.store_once:
        return []
    if sym is not None:
        return sym.first_repeat(name, r)
    out: list[kir.Expr] = []
    for dim, inner in im.row_repeats:
        t = Bin("/", r, Const(int(inner), I32)) if inner > 1 else r
        if inner * dim < M:
            t = Bin("%", t, Const(int(dim), I32))
        out.append(Bin("==", t, Const(0, I32)))
    return out
