"""The one exchange path of the row family: reduction states (:mod:`stitchtune.lower.state`) combined
into the row's result, as the stage's :class:`~stitchtune.space.schemes.Scheme` declares.

Every function takes the kernel being built as an :class:`~stitchtune.lower.builder.ExchangeBuilder`
and a list of states (the one-slot states of a stage's reductions, or the state of a single-pass pair),
and appends to its round body. The slots of all the states are numbered in order (the shared-memory
and DSMEM exchanges keep one slot each); each state is merged in turn.

1. :func:`shuffle_tree`: the lanes of a warp (or of a sub-warp row group) by butterfly shuffles;
2. :func:`exchange_in_block`: the warps of a row through ``sred``, one writer per warp;
3. :func:`stitchtune.lower.cluster.cluster_exchange`: the split blocks of a row through DSMEM;
4. :func:`store_partials` / :func:`combine_partials`: the split blocks of a row through global scratch
   (after a grid barrier, or in the next kernel), with ``combine`` thread or warp loads.
"""

from __future__ import annotations

import math

from stitchtune.ir import kir
from stitchtune.ir.kir import F32, Bin, Const, Load, Select
from stitchtune.lower.base import I, add, mul
from stitchtune.lower.builder import ExchangeBuilder
from stitchtune.lower.cluster import cluster_exchange
from stitchtune.lower.single_pass import split_count, split_count_expr
from stitchtune.lower.state import ReductionState, reset
from stitchtune.space.option_values import Combine
from stitchtune.space.options import COMBINE
from stitchtune.space.schemes import Scheme


def shuffle_tree(k: ExchangeBuilder, states: list[ReductionState], width: int) -> None:
    """Merge each state across ``width`` lanes (a power of two, at most 32) by shuffles: after it, every
    lane of the group holds the group's state."""
    for st in states:
        m = width // 2
        while m >= 1:
            k.emit(*st.merge(tuple(kir.Shfl(v, m, 32) for v in st.vars), k.var))
            m //= 2


def exchange(k: ExchangeBuilder, states: list[ReductionState], scheme: Scheme) -> None:
    """Combine each thread's ``states`` into the row's, per ``scheme`` (the module docstring's steps).
    Afterwards every thread of the row holds the row's state, except with a kernel boundary (the
    partials are stored; the next kernel combines them with :func:`combine_partials`)."""
    s = k.schedule
    shuffle_tree(k, states, min(s.tpr, 32))
    if not scheme.beyond_warp:
        return
    if scheme.exchanges_in_block(s.tpr):
        exchange_in_block(k, states)
    if scheme.cluster:
        cluster_exchange(k, states)
    if scheme.partials:
        store_partials(k, states)
        if scheme.grid_barrier:
            k.emit(kir.GridSync())
            for st in states:
                combine_partials(k, st)


def exchange_in_block(k: ExchangeBuilder, states: list[ReductionState]) -> None:
    """The warps of a row merge their states through ``sred`` (a slot per state variable and warp of
    each row of the block); one writer per warp (tpr > 32) or per sub-warp row group (tpr <= 32)."""
    rib = k.ix.rib
    tpr, rpb = k.schedule.tpr, k.rows_per_block
    wpr = max(1, tpr // 32)
    tid = kir.Special("tid")
    writer = Bin("==", Bin("%", tid, I(min(tpr, 32))), I(0))
    wir = Bin("/", Bin("%", tid, I(tpr)), I(32)) if tpr > 32 else I(0)
    slots = _slots(states)
    for st, first in zip(states, slots):
        for i, v in enumerate(st.vars):
            k.emit(kir.StoreVec("sred", add(I((first + i) * rpb * wpr), add(mul(rib, I(wpr)), wir)), (v,), writer))
    k.emit(kir.Barrier())
    for st, first in zip(states, slots):
        k.emit(*reset(st))
        for w in range(wpr):
            other = tuple(Load("sred", add(I((first + i) * rpb * wpr), add(mul(rib, I(wpr)), I(w))))
                          for i in range(len(st.vars)))
            k.emit(*st.merge(other, k.var))
    k.emit(kir.Barrier())


def _slots(states: list[ReductionState]) -> list[int]:
    """The first exchange slot of each state (the slots of all states, numbered in order)."""
    out, n = [], 0
    for st in states:
        out.append(n)
        n += len(st.vars)
    return out


def store_partials(k: ExchangeBuilder, states: list[ReductionState]) -> None:
    """Each block's state of its row piece to its partials (one per row and split index), written by
    the row's first lane."""
    ix, S = k.ix, k.schedule.split
    for st in states:
        leader = Bin("&&", ix.rvalid, Bin("==", Bin("%", kir.Special("tid"), I(k.schedule.tpr)), I(0)))
        for buf, v in zip(k.state_parts(st), st.stored):
            k.emit(kir.StoreVec(buf, add(mul(Bin("min", ix.row, k.last_row()), I(S)), ix.sidx), (v,), leader))


def combine_partials(k: ExchangeBuilder, st: ReductionState) -> None:
    """Merge the ``split`` partials of ``st`` for this thread's row into ``st`` (reset first): every
    thread loads all of them in order (``combine`` thread), or the lanes of each warp load them together
    (lane l: partials l, l + 32, ...) and merge them by shuffles (``combine`` warp; every warp of a split
    row lies within one row, tpr == block)."""
    rvalid, s = k.ix.rvalid, k.schedule
    S, N, chunk = s.split, k.plan.N, k.chunk
    parts = k.state_parts(st)
    base = mul(Bin("min", k.ix.row, k.last_row()), I(S))
    k.emit(*reset(st))
    if s.option(COMBINE) == Combine.WARP and S > 1:
        wl = Bin("%", kir.Special("tid"), I(32))
        for c in range(math.ceil(S / 32)):
            lane_q = add(wl, I(32 * c))
            inside = Bin("<", lane_q, I(S))
            loads = tuple(Load(b, add(base, Bin("min", lane_q, I(S - 1))), Bin("&&", rvalid, inside)) for b in parts)
            got = st.partial(split_count_expr(N, chunk, lane_q), loads)
            k.emit(*st.merge(tuple(Select(inside, g, e) for g, e in zip(got, st.identity())), k.var))
        shuffle_tree(k, [st], 32)
    else:
        for q in range(S):
            loads = tuple(Load(b, add(base, I(q)), rvalid) for b in parts)
            k.emit(*st.merge(st.partial(Const(float(split_count(N, chunk, q)), F32), loads), k.var))
