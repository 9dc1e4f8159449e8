"""The column family's exchange: reduction states (:mod:`stitchtune.lower.state`) combined across the
row threads of a column and the split row chunks of a column tile, as the stage's
:class:`~stitchtune.space.schemes.Scheme` declares.

The row family's exchange (:mod:`stitchtune.lower.exchange`) merges one state per reduction held by
the lanes of a row; a column thread holds ``vec`` adjacent columns, so here a reduction is a
:data:`ColState`: one state per column of the thread (``vec`` of them). The moves differ with the
layout (no shuffles: the threads of a column lie in different warps), the merges are the states' own
(:meth:`~stitchtune.lower.state.ReductionState.merge`, :func:`~stitchtune.lower.state.reset`):

1. :func:`exchange_in_block`: the ``tpr`` row threads of each column through ``sred`` (scalar stores,
   a loop over the row threads);
2. :func:`store_partials` / :func:`combine_partials`: the split row chunks of a column tile through
   global scratch (after a grid barrier, or in the next kernel).

The slots of all the states of a stage are numbered in order, reduction by reduction (a one-slot
state: one ``sred`` slot of ``tpr x tile_cols`` floats per reduction, as the layout sizes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from stitchtune.ir import kir
from stitchtune.ir.kir import I32, Bin, Load, Var
from stitchtune.lower.base import I, add, mul
from stitchtune.lower.builder import StateBuilder
from stitchtune.lower.single_pass import split_count_expr
from stitchtune.lower.state import ReductionState, reset
from stitchtune.space.schemes import Scheme

#: iterations of the loop over a column stage's ``split`` partials unrolled together (their loads in flight
#: at once): GPT-2's training column sum 4096 x 2304 (split 32, vec 4) fully unrolled takes 150 registers
#: and spills 424 bytes under the 64 of its grid barrier's cap; unrolled by 8: 56 registers, no spills
#: (sm_90 cubin, ptxas -v, CPU static analysis). Re-exported as ``stitchtune.lower.col.COMBINE_UNROLL``.
COMBINE_UNROLL = 8

ColState = tuple[ReductionState, ...]
"""One reduction's state in a column thread: one state per column of the thread (``vec``)."""


@dataclass(frozen=True)
class ColIndex:
    """The index variables of a column kernel: the thread's column group ``tc`` and row thread ``tk``
    (set once), the round, and the task, tile, split index, first column, column validity and row
    range of the round's task."""

    tc: Var
    tk: Var
    rd: Var
    tile: Var
    sidx: Var
    c0: Var
    cvalid: Var
    kbase: Var
    kend: Var
    task: Var
    cc0: kir.Expr  # the first column clamped for address arithmetic


class ColExchangeBuilder(StateBuilder, Protocol):
    """What the column exchange needs of the kernel it is built into, besides :class:`StateBuilder`'s
    part (``chunk``: the rows of a column one split chunk covers)."""

    #: the kernel's index variables
    ix: ColIndex

    @property
    def tile_cols(self) -> int:
        """Columns of one task's tile (``block // tpr * vec``)."""
        ...


def load_f32(dsts: tuple[Var, ...], buf: str, idx: kir.Expr, pred: kir.Expr | None) -> list[kir.Stmt]:
    """Loads of a float32 scratch buffer in accesses of at most 16 bytes (4 floats)."""
    return [kir.LoadVec(dsts[k:k + 4], buf, add(idx, I(k)), pred) for k in range(0, len(dsts), 4)]


def store_f32(buf: str, idx: kir.Expr, vals: tuple[kir.Expr, ...], pred: kir.Expr | None) -> list[kir.Stmt]:
    """Stores to a float32 scratch buffer in accesses of at most 16 bytes (4 floats)."""
    return [kir.StoreVec(buf, add(idx, I(k)), vals[k:k + 4], pred) for k in range(0, len(vals), 4)]


def _slots(states: list[ColState]) -> list[int]:
    """The first ``sred`` slot of each reduction (the slots of all reductions, numbered in order)."""
    out, n = [], 0
    for g in states:
        out.append(n)
        n += len(g[0].vars)
    return out


def exchange(k: ColExchangeBuilder, states: list[ColState], scheme: Scheme) -> None:
    """Combine each thread's ``states`` (one :data:`ColState` per reduction of a stage) per ``scheme``:
    across the row threads of the block (tpr > 1), then, where the scheme has partials, across the
    split row chunks (a grid barrier: every thread then holds its columns' state; a kernel boundary:
    the partials are stored, the next kernel combines them with :func:`combine_partials`)."""
    if k.schedule.tpr > 1:
        exchange_in_block(k, states)
    if scheme.partials:
        store_partials(k, states)
        if scheme.grid_barrier:
            k.emit(kir.GridSync())
            for g in states:
                combine_partials(k, g)


def exchange_in_block(k: ColExchangeBuilder, states: list[ColState]) -> None:
    """The states of the ``tpr`` row threads of each column meet in ``sred`` (scalar stores: any vec
    width, no 16-byte limit); every row thread then merges all of them in order."""
    ix, s, TC = k.ix, k.schedule, k.tile_cols
    tk, vec = s.tpr, s.vec

    def at(slot: int, row: kir.Expr, j: int) -> kir.Expr:
        return add(I(slot * tk * TC), add(mul(row, I(TC)), add(mul(ix.tc, I(vec)), I(j))))

    firsts = _slots(states)
    for g, first in zip(states, firsts):
        for i in range(len(g[0].vars)):
            for j, st in enumerate(g):
                k.emit(kir.StoreVec("sred", at(first + i, ix.tk, j), (st.vars[i],)))
    k.emit(kir.Barrier())
    for g, first in zip(states, firsts):
        for st in g:
            k.emit(*reset(st))
        q = k.var("q", I32)
        loop: list[kir.Stmt] = []
        for j, st in enumerate(g):
            loop += st.merge(tuple(Load("sred", at(first + i, q, j)) for i in range(len(st.vars))), k.var)
        k.emit(kir.For(q, I(0), I(tk), 1, tuple(loop)))
    k.emit(kir.Barrier())


def store_partials(k: ColExchangeBuilder, states: list[ColState]) -> None:
    """Each chunk's state of its columns to its partials (one per split index and column), written by
    the first row thread."""
    ix, N = k.ix, k.plan.N
    for g in states:
        for i, buf in enumerate(k.state_parts(g[0])):
            k.emit(*store_f32(buf, add(mul(ix.sidx, I(N)), ix.cc0), tuple(st.stored[i] for st in g),
                              Bin("&&", ix.cvalid, Bin("==", ix.tk, I(0)))))


def combine_partials(k: ColExchangeBuilder, g: ColState) -> None:
    """Merge the ``split`` partials of the thread's columns into ``g`` (reset first), in order, in a
    loop over the split index (unrolled by :data:`COMBINE_UNROLL` where longer)."""
    ix, S, N = k.ix, k.schedule.split, k.plan.N
    parts = k.state_parts(g[0])
    for st in g:
        k.emit(*reset(st))
    q = k.var("q", I32)
    tmp = [tuple(k.var("pp") for _ in g) for _ in parts]
    loop: list[kir.Stmt] = []
    for buf, dsts in zip(parts, tmp):
        loop += load_f32(dsts, buf, add(mul(q, I(N)), ix.cc0), ix.cvalid)
    count = split_count_expr(k.plan.M, k.chunk, q)
    for j, st in enumerate(g):
        loop += st.merge(st.partial(count, tuple(t[j] for t in tmp)), k.var)
    # the partials' loads are independent: fully unrolled, ptxas hoists all S of them (S x vec
    # registers) and spills under a grid barrier's register cap; unrolled by COMBINE_UNROLL it keeps
    # that many in flight
    k.emit(kir.For(q, I(0), I(S), 1, tuple(loop), unroll_by=COMBINE_UNROLL if S > COMBINE_UNROLL else 0))
