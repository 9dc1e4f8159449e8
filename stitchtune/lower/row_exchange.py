"""The row family's thread layout for the one exchange (:func:`stitchtune.lower.exchange.exchange`).

A row's ``tpr`` lanes are adjacent threads (``lane = tid % tpr``), ``block // tpr`` rows per block, a
split row's pieces in ``split`` blocks. A row thread holds one state per reduction (groups of one). So:

1. :func:`shuffle_tree`: the lanes of a warp (or of a sub-warp row group) by butterfly shuffles;
2. :class:`RowWarps`: the warps of a row through ``sred``, one writer per warp (tpr > 32, or always with
   a scheme's ``block_exchange``);
3. the cluster: :class:`stitchtune.lower.cluster.ClusterMeeting`;
4. the split partials: one per row and split index (``row * split + sidx``), written by the row's first
   lane; combined by every thread loading all of them in order (``combine`` thread) or by the lanes of each
   warp loading them together (lane l: partials l, l + 32, ...) and merging by shuffles (``combine`` warp;
   every warp of a split row lies within one row, tpr == block).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from stitchtune.ir import kir
from stitchtune.ir.kir import F32, Bin, Const, Load
from stitchtune.lower.base import I, add, mul
from stitchtune.lower.builder import ExchangeBuilder
from stitchtune.lower.cluster import ClusterMeeting
from stitchtune.lower.exchange import Body, Meeting, PartialLoads, StateGroup
from stitchtune.lower.single_pass import split_count, split_count_expr
from stitchtune.lower.state import ReductionState, VarMaker
from stitchtune.space.option_values import Combine
from stitchtune.space.options import COMBINE
from stitchtune.space.schemes import Scheme


def shuffle_tree(states: Sequence[ReductionState], width: int, var: VarMaker) -> list[kir.Stmt]:
    """Merge each state across ``width`` lanes (a power of two, at most 32) by shuffles: after it, every
    lane of the group holds the group's state."""
    out: list[kir.Stmt] = []
    for st in states:
        m = width // 2
        while m >= 1:
            out += st.merge(tuple(kir.Shfl(v, m, 32) for v in st.vars), var)
            m //= 2
    return out


@dataclass(frozen=True)
class RowWarps:
    """The warps of a row meeting in ``sred`` (a slot per state variable and warp of each row of the
    block): one writer per warp (tpr > 32) or per sub-warp row group (tpr <= 32)."""

    k: ExchangeBuilder

    @property
    def _wpr(self) -> int:
        return max(1, self.k.schedule.tpr // 32)

    def _at(self, slot: int, warp: kir.Expr) -> kir.Expr:
        wpr = self._wpr
        return add(I(slot * self.k.rows_per_block * wpr), add(mul(self.k.ix.rib, I(wpr)), warp))

    def store(self, slot: int, j: int, value: kir.Expr) -> kir.Stmt:
        tpr, tid = self.k.schedule.tpr, kir.Special("tid")
        writer = Bin("==", Bin("%", tid, I(min(tpr, 32))), I(0))
        wir = Bin("/", Bin("%", tid, I(tpr)), I(32)) if tpr > 32 else I(0)
        return kir.StoreVec("sred", self._at(slot, wir), (value,), writer)

    def load(self, slot: int, peer: kir.Expr, j: int) -> kir.Expr:
        return Load("sred", self._at(slot, peer))

    def sync(self) -> kir.Stmt:
        return kir.Barrier()

    def peers(self, body: Body) -> list[kir.Stmt]:
        return [st for w in range(self._wpr) for st in body(I(w))]


@dataclass(frozen=True)
class RowExchange:
    """The row family's :class:`~stitchtune.lower.exchange.ExchangeLayout` (module docstring)."""

    k: ExchangeBuilder

    def shuffles(self, groups: Sequence[StateGroup]) -> list[kir.Stmt]:
        return shuffle_tree([st for g in groups for st in g], min(self.k.schedule.tpr, 32), self.k.var)

    def block_meeting(self, scheme: Scheme) -> Meeting | None:
        return RowWarps(self.k) if scheme.exchanges_in_block(self.k.schedule.tpr) else None

    def cluster_meeting(self) -> Meeting:
        return ClusterMeeting(self.k.schedule.split)

    def _base(self) -> kir.Expr:
        """The scratch index of this row's first partial."""
        return mul(Bin("min", self.k.ix.row, self.k.last_row()), I(self.k.schedule.split))

    def partial_at(self) -> tuple[kir.Expr, kir.Expr]:
        leader = Bin("&&", self.k.ix.rvalid, Bin("==", Bin("%", kir.Special("tid"), I(self.k.schedule.tpr)), I(0)))
        return add(self._base(), self.k.ix.sidx), leader

    def _by_warp(self) -> bool:
        s = self.k.schedule
        return s.option(COMBINE) == Combine.WARP and s.split > 1

    def over_splits(self, group: StateGroup, body: Body) -> list[kir.Stmt]:
        S = self.k.schedule.split
        if not self._by_warp():
            return [st for q in range(S) for st in body(I(q))]
        wl = Bin("%", kir.Special("tid"), I(32))
        out = [st for c in range(math.ceil(S / 32)) for st in body(add(wl, I(32 * c)))]
        return out + shuffle_tree(group, 32, self.k.var)

    def load_partials(self, parts: tuple[str, ...], q: kir.Expr, n: int) -> PartialLoads:
        S, rvalid, base = self.k.schedule.split, self.k.ix.rvalid, self._base()
        if not self._by_warp():
            return PartialLoads([], [tuple(Load(b, add(base, q), rvalid) for b in parts)] * n)
        inside = Bin("<", q, I(S))
        return PartialLoads([], [tuple(Load(b, add(base, Bin("min", q, I(S - 1))), Bin("&&", rvalid, inside))
                                       for b in parts)] * n, inside)

    def split_count(self, q: kir.Expr) -> kir.Expr:
        N, chunk = self.k.plan.N, self.k.chunk
        if isinstance(q, Const):   # an unrolled loop's constant index: the count folded
            return Const(float(split_count(N, chunk, int(q.value))), F32)
        return split_count_expr(N, chunk, q)
