"""The one exchange path of both families: reduction states (:mod:`stitchtune.lower.state`) combined into
the result of their row (row family) or column (column family), as the stage's
:class:`~stitchtune.space.schemes.Scheme` declares.

A thread holds one :data:`StateGroup` per reduction of a stage (one state in a row thread, one per owned
column in a column thread). :func:`exchange` runs the scheme's steps in order; what differs between the
families is the thread layout, which the family passes in as an :class:`ExchangeLayout` (the row family's
:class:`stitchtune.lower.row_exchange.RowExchange`, the column family's
:class:`stitchtune.lower.col_exchange.ColExchange`):

1. within a warp: the layout's shuffles (a row's lanes: butterfly shuffles; a column's threads lie in
   different warps: none);
2. ``beyond_warp`` False: done;
3. within a block, where the layout says so for the scheme: a :class:`Meeting` in ``sred`` (:func:`meet`:
   the warps of a row, one writer per warp; the row threads of a column, each writing its ``vec`` columns);
4. ``cluster``: the split blocks of a row meet in distributed shared memory (the layout's cluster
   :class:`Meeting`, :class:`stitchtune.lower.cluster.ClusterMeeting`);
5. ``partials``: each block (row piece / column chunk) stores its state to global scratch
   (:func:`store_partials`), then with ``grid_barrier`` a grid barrier and every thread merges the
   ``split`` partials (:func:`combine_partials`; with ``kernel_boundary`` the next kernel does).

Every merge is the state's own (:meth:`~stitchtune.lower.state.ReductionState.merge` after
:func:`~stitchtune.lower.state.reset`); the slots of all the states of a stage are numbered in order
(:func:`slots`), one exchange slot per state variable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from stitchtune.ir import kir
from stitchtune.ir.kir import Select
from stitchtune.lower.base import I, add
from stitchtune.lower.builder import StateBuilder
from stitchtune.lower.state import ReductionState, reset
from stitchtune.space.schemes import Scheme

StateGroup = tuple[ReductionState, ...]
"""One reduction's states in one thread: one state (row family) or one per column the thread owns
(column family: ``vec``); the states of a group share their exchange slots."""

Body = Callable[[kir.Expr], list[kir.Stmt]]
"""The statements of one step of a loop, given the loop's index (a constant or a loop variable)."""


class Meeting(Protocol):
    """A place where the holders of a reduction's partial states meet (:func:`meet`): each holder writes its
    states' slots, a barrier, every holder merges the states of all of them in order, a barrier."""

    def store(self, slot: int, j: int, value: kir.Expr) -> kir.Stmt:
        """The store of this holder's ``value`` of exchange slot ``slot``, state ``j`` of its group."""
        ...

    def load(self, slot: int, peer: kir.Expr, j: int) -> kir.Expr:
        """The value holder ``peer`` stored for slot ``slot``, state ``j`` of its group."""
        ...

    def sync(self) -> kir.Stmt:
        """The barrier between the stores and the loads (and after the loads)."""
        ...

    def peers(self, body: Body) -> list[kir.Stmt]:
        """``body`` for every holder in order (the loop's shape: unrolled over constants, or a loop)."""
        ...


@dataclass(frozen=True)
class PartialLoads:
    """What one step of the loop over the split partials loaded: statements to place first, the stored
    slots of each state of the group (as expressions), and where not None the condition under which the
    step's partial exists (else the state merges its identity)."""

    stmts: list[kir.Stmt]
    loaded: list[tuple[kir.Expr, ...]]
    exists: kir.Expr | None = None


class ExchangeLayout(Protocol):
    """What :func:`exchange` needs to know of a family's thread layout (module docstring)."""

    def shuffles(self, groups: Sequence[StateGroup]) -> list[kir.Stmt]:
        """The merges within a warp, by shuffles (none where a reduction's threads lie in different warps)."""
        ...

    def block_meeting(self, scheme: Scheme) -> Meeting | None:
        """Where the threads of a block that share a reduction meet under ``scheme`` (None: they do not)."""
        ...

    def cluster_meeting(self) -> Meeting:
        """Where the blocks of a cluster meet (a ``cluster`` scheme)."""
        ...

    def partial_at(self) -> tuple[kir.Expr, kir.Expr]:
        """The scratch index of this block's partial (of the thread's first state), and the predicate of
        its one writer."""
        ...

    def over_splits(self, group: StateGroup, body: Body) -> list[kir.Stmt]:
        """``body`` for every split index in order (unrolled over constants, a loop, or the lanes of a warp
        taking 32 at a time: then the shuffles that merge the lanes' states)."""
        ...

    def load_partials(self, parts: tuple[str, ...], q: kir.Expr, n: int) -> PartialLoads:
        """The stored slots (buffers ``parts``) of split index ``q`` for the ``n`` states of a group."""
        ...

    def split_count(self, q: kir.Expr) -> kir.Expr:
        """The element count of split index ``q``'s piece (float32)."""
        ...


def exchange(k: StateBuilder, layout: ExchangeLayout, groups: Sequence[StateGroup], scheme: Scheme) -> None:
    """Combine each thread's ``groups`` (one per reduction of a stage) per ``scheme`` (the module
    docstring's steps). Afterwards every thread holds its reductions' complete states, except with a
    kernel boundary (the partials are stored; the next kernel combines them with :func:`combine_partials`)."""
    k.emit(*layout.shuffles(groups))
    if not scheme.beyond_warp:
        return
    block = layout.block_meeting(scheme)
    if block is not None:
        meet(k, block, groups)
    if scheme.cluster:
        meet(k, layout.cluster_meeting(), groups)
    if scheme.partials:
        store_partials(k, layout, groups)
        if scheme.grid_barrier:
            k.emit(kir.GridSync())
            for g in groups:
                combine_partials(k, layout, g)


def slots(groups: Sequence[StateGroup]) -> list[int]:
    """The first exchange slot of each group (the slots of all groups, numbered in order)."""
    out, n = [], 0
    for g in groups:
        out.append(n)
        n += len(g[0].vars)
    return out


def meet(k: StateBuilder, place: Meeting, groups: Sequence[StateGroup]) -> None:
    """Merge ``groups`` across the holders that meet at ``place`` (:func:`meeting`'s statements)."""
    k.emit(*meeting(k, place, groups))


def meeting(k: StateBuilder, place: Meeting, groups: Sequence[StateGroup]) -> list[kir.Stmt]:
    """The statements that merge ``groups`` across the holders that meet at ``place``: every slot of every
    state stored, a barrier, every holder resets its states and merges those of all holders in order (so
    every holder ends with bitwise the same states), a barrier."""
    out: list[kir.Stmt] = []
    firsts = slots(groups)
    for g, first in zip(groups, firsts):
        for i in range(len(g[0].vars)):
            for j, st in enumerate(g):
                out.append(place.store(first + i, j, st.vars[i]))
    out.append(place.sync())
    for g, first in zip(groups, firsts):
        for st in g:
            out += reset(st)

        def merged(peer: kir.Expr, g: StateGroup = g, first: int = first) -> list[kir.Stmt]:
            got: list[kir.Stmt] = []
            for j, st in enumerate(g):
                got += st.merge(tuple(place.load(first + i, peer, j) for i in range(len(st.vars))), k.var)
            return got
        out += place.peers(merged)
    out.append(place.sync())
    return out


def store_partials(k: StateBuilder, layout: ExchangeLayout, groups: Sequence[StateGroup]) -> None:
    """Each block's state of its piece to its partials (one scratch buffer per stored slot), written by
    the layout's one writer, the states of a group side by side."""
    for g in groups:
        at, writer = layout.partial_at()
        for i, buf in enumerate(k.state_parts(g[0])):
            k.emit(*store_f32(buf, at, tuple(st.stored[i] for st in g), writer))


def combine_partials(k: StateBuilder, layout: ExchangeLayout, group: StateGroup) -> None:
    """Merge the ``split`` partials of ``group``'s reduction into its states (reset first), in the order
    of the split index, over the layout's loop (:meth:`ExchangeLayout.over_splits`)."""
    parts = k.state_parts(group[0])
    for st in group:
        k.emit(*reset(st))

    def merged(q: kir.Expr) -> list[kir.Stmt]:
        got = layout.load_partials(parts, q, len(group))
        count = layout.split_count(q)
        out = list(got.stmts)
        for st, loaded in zip(group, got.loaded):
            other = st.partial(count, loaded)
            if got.exists is not None:
                other = tuple(Select(got.exists, x, e) for x, e in zip(other, st.identity()))
            out += st.merge(other, k.var)
        return out
    k.emit(*layout.over_splits(group, merged))


def load_f32(dsts: tuple[kir.Var, ...], buf: str, idx: kir.Expr, pred: kir.Expr | None) -> list[kir.Stmt]:
    """Loads of a float32 scratch buffer in accesses of at most 16 bytes (4 floats)."""
    return [kir.LoadVec(dsts[k:k + 4], buf, add(idx, I(k)), pred) for k in range(0, len(dsts), 4)]


def store_f32(buf: str, idx: kir.Expr, vals: tuple[kir.Expr, ...], pred: kir.Expr | None) -> list[kir.Stmt]:
    """Stores to a float32 scratch buffer in accesses of at most 16 bytes (4 floats)."""
    return [kir.StoreVec(buf, add(idx, I(k)), vals[k:k + 4], pred) for k in range(0, len(vals), 4)]
