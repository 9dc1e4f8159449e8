"""The column family's thread layout for the one exchange (:func:`stitchtune.lower.exchange.exchange`).

A column thread holds ``vec`` adjacent columns, so a reduction's states in a thread are a :data:`ColState`
(one state per column, a :data:`~stitchtune.lower.exchange.StateGroup` of ``vec``); the ``tpr`` row threads
of a column are ``block // tpr`` threads apart (``tk = tid / tpc``), so they lie in different warps (or
in one warp at different lanes of several columns) and never shuffle. So (:class:`ColExchange`):

1. no shuffles;
2. :class:`ColThreads`: the ``tpr`` row threads of each column meet in ``sred`` (one slot of
   ``tpr x tile_cols`` floats per state variable, scalar stores: any vec width), merged in a loop over
   the row threads; whenever ``tpr > 1`` (a warp-only ``local`` scheme has ``tpr == 1``);
3. no clusters (the ``cluster`` scheme is the row family's);
4. the split partials: one per split index and column (``sidx * N + column``), written by the first row
   thread, the ``vec`` columns side by side; combined by the ``tpr`` row threads of the column together:
   row thread ``tk`` merges split indices ``tk, tk + tpr, ...`` in a loop (unrolled by
   :data:`COMBINE_UNROLL` where longer), each step loading the ``vec`` columns' partials at once, and the
   row threads then meet in ``sred`` as in step 2 (so every thread holds the complete state). Before
   issue 39 every row thread merged all ``split`` partials itself: BERT's training bias gradient
   (4096 x 768, split 64, tpr 8) loaded 64 partials per thread in sequence, every warp of every block
   reading the same lines; now 8 per thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from stitchtune.ir import kir
from stitchtune.ir.kir import I32, Bin, Load, Var
from stitchtune.lower.base import I, add, mul
from stitchtune.lower.builder import StateBuilder
from stitchtune.lower.exchange import Body, Meeting, PartialLoads, StateGroup, load_f32, meeting
from stitchtune.lower.single_pass import split_count_expr
from stitchtune.lower.state import ReductionState
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


@dataclass(frozen=True)
class ColThreads:
    """The ``tpr`` row threads of each column meeting in ``sred`` (:mod:`stitchtune.lower.col_exchange`,
    step 2): slot ``slot`` of row thread ``tk``, column ``tc * vec + j`` of the tile at
    ``slot * tpr * tile_cols + tk * tile_cols + tc * vec + j``; every thread stores (scalar stores), every
    thread merges all ``tpr`` row threads in a loop."""

    k: ColExchangeBuilder

    def _at(self, slot: int, row: kir.Expr, j: int) -> kir.Expr:
        k, TC = self.k, self.k.tile_cols
        return add(I(slot * k.schedule.tpr * TC), add(mul(row, I(TC)), add(mul(k.ix.tc, I(k.schedule.vec)), I(j))))

    def store(self, slot: int, j: int, value: kir.Expr) -> kir.Stmt:
        return kir.StoreVec("sred", self._at(slot, self.k.ix.tk, j), (value,))

    def load(self, slot: int, peer: kir.Expr, j: int) -> kir.Expr:
        return Load("sred", self._at(slot, peer, j))

    def sync(self) -> kir.Stmt:
        return kir.Barrier()

    def peers(self, body: Body) -> list[kir.Stmt]:
        q = self.k.var("q", I32)
        return [kir.For(q, I(0), I(self.k.schedule.tpr), 1, tuple(body(q)))]


@dataclass(frozen=True)
class ColExchange:
    """The column family's :class:`~stitchtune.lower.exchange.ExchangeLayout` (module docstring)."""

    k: ColExchangeBuilder

    def shuffles(self, groups: Sequence[StateGroup]) -> list[kir.Stmt]:
        return []

    def block_meeting(self, scheme: Scheme) -> Meeting | None:
        return ColThreads(self.k) if self.k.schedule.tpr > 1 else None

    def cluster_meeting(self) -> Meeting:
        raise AssertionError("the cluster scheme is the row family's (its rule)")

    def partial_at(self) -> tuple[kir.Expr, kir.Expr]:
        ix = self.k.ix
        return add(mul(ix.sidx, I(self.k.plan.N)), ix.cc0), Bin("&&", ix.cvalid, Bin("==", ix.tk, I(0)))

    def _spread(self) -> bool:
        """Whether the row threads share the split partials (step 4): more than one of each."""
        return self.k.schedule.tpr > 1 and self.k.schedule.split > 1

    def over_splits(self, group: StateGroup, body: Body) -> list[kir.Stmt]:
        # the partials' loads are independent: fully unrolled, ptxas hoists all of them (x vec registers)
        # and spills under a grid barrier's register cap; unrolled by COMBINE_UNROLL it keeps that many
        # in flight
        S, tpr = self.k.schedule.split, self.k.schedule.tpr
        q = self.k.var("q", I32)
        if not self._spread():
            return [kir.For(q, I(0), I(S), 1, tuple(body(q)), unroll_by=COMBINE_UNROLL if S > COMBINE_UNROLL else 0)]
        steps = -(-S // tpr)
        at = add(mul(q, I(tpr)), self.k.ix.tk)   # this row thread's split indices: tk, tk + tpr, ...
        loop = kir.For(q, I(0), I(steps), 1, tuple(body(at)), unroll=steps <= COMBINE_UNROLL,
                       unroll_by=COMBINE_UNROLL if steps > COMBINE_UNROLL else 0)
        return [loop] + meeting(self.k, ColThreads(self.k), [group])

    def load_partials(self, parts: tuple[str, ...], q: kir.Expr, n: int) -> PartialLoads:
        ix, S = self.k.ix, self.k.schedule.split
        tmp = [tuple(self.k.var("pp") for _ in range(n)) for _ in parts]
        ragged = self._spread() and S % self.k.schedule.tpr != 0
        inside = Bin("<", q, I(S)) if ragged else None   # the last step's row threads past the split
        pred = ix.cvalid if inside is None else Bin("&&", ix.cvalid, inside)
        qq = Bin("min", q, I(S - 1)) if ragged else q
        stmts = [st for buf, dsts in zip(parts, tmp)
                 for st in load_f32(dsts, buf, add(mul(qq, I(self.k.plan.N)), ix.cc0), pred)]
        return PartialLoads(stmts, [tuple(t[j] for t in tmp) for j in range(n)], inside)

    def split_count(self, q: kir.Expr) -> kir.Expr:
        return split_count_expr(self.k.plan.M, self.k.chunk, q)
