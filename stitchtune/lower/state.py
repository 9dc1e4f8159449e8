"""Reduction states as mergeable values: what one thread holds of a reduction while it sweeps, and how
two such states merge.

A :class:`ReductionState` is a tuple of float variables (its *slots*), an identity (the empty state)
and a merge (``state = merge(state, other)`` for another state given as expressions: shuffles, shared
or distributed-shared-memory loads, loads of stored partials). A plain ``reduce_sum`` / ``max`` /
``min`` / ``mean`` is a one-slot state (:class:`PlainState`, its merge the op table's
``combine_op``); Welford's ``(n, mean, M2, shift)`` and online softmax's ``(max, sum)`` are larger
ones (:class:`stitchtune.lower.single_pass.OnlineState`). The exchange of :mod:`stitchtune.lower.exchange`
moves and merges any of them the same way: shuffle tree, shared memory, cluster DSMEM, split partials.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

from stitchtune.graph.ops import OpInfo
from stitchtune.ir import kir
from stitchtune.ir.kir import F32, Assign, Bin, Const, Select, Var

VarMaker = Callable[..., Var]
"""``var(prefix, dtype=F32)``: a fresh kernel variable (:meth:`stitchtune.lower.base.Ctx.var`)."""


class ReductionState(Protocol):
    """A mergeable per-thread reduction state (see the module docstring)."""

    @property
    def vars(self) -> tuple[Var, ...]:
        """The state's slots (the variables the thread holds)."""
        ...

    @property
    def stored(self) -> tuple[Var, ...]:
        """The slots a block's partial keeps in scratch (one scratch buffer each, :meth:`part_names`)."""
        ...

    def identity(self) -> tuple[kir.Expr, ...]:
        """The empty state, one expression per slot."""
        ...

    def merge(self, other: tuple[kir.Expr, ...], var: VarMaker) -> list[kir.Stmt]:
        """Statements for ``state = merge(state, other)`` (``other``: one expression per slot)."""
        ...

    def partial(self, count: kir.Expr, loaded: tuple[kir.Expr, ...]) -> tuple[kir.Expr, ...]:
        """The state of a stored partial from the loaded :attr:`stored` slots and the element count of
        its row piece (a state that does not keep a count ignores it)."""
        ...

    def part_names(self, red_idx: Mapping[str, int]) -> tuple[str, ...]:
        """The scratch buffer names of the stored slots (``red_idx``: reduction name -> its index)."""
        ...

    def finish(self, K: int | kir.Expr, var: VarMaker) -> tuple[list[kir.Stmt], tuple[tuple[str, Var], ...]]:
        """Statements computing the final values of the reductions a complete state holds (``K`` the
        reduced length: a constant, or an i32 expression in a generic kernel with a dynamic row
        length), and (reduction name, variable holding its value) for each."""
        ...


def reset(st: ReductionState) -> list[kir.Stmt]:
    """``state = empty``."""
    return [Assign(v, c) for v, c in zip(st.vars, st.identity())]


@dataclass(frozen=True)
class PlainState:
    """A one-slot state: the running value ``acc`` of reduction ``reduction`` (op ``info``)."""

    reduction: str
    acc: Var
    info: OpInfo

    @property
    def vars(self) -> tuple[Var, ...]:
        return (self.acc,)

    @property
    def stored(self) -> tuple[Var, ...]:
        return (self.acc,)

    def identity(self) -> tuple[kir.Expr, ...]:
        assert self.info.identity is not None
        return (Const(float(self.info.identity), F32),)

    def combined(self, other: kir.Expr) -> kir.Expr:
        """``acc`` combined with ``other`` by the op table's operator."""
        assert self.info.combine_op is not None
        return Bin(self.info.combine_op, self.acc, other)

    def merge(self, other: tuple[kir.Expr, ...], var: VarMaker) -> list[kir.Stmt]:
        return [Assign(self.acc, self.combined(other[0]))]

    def fold(self, x: kir.Expr, valid: kir.Expr) -> kir.Stmt:
        """One element ``x`` folded in where ``valid``."""
        return Assign(self.acc, Select(valid, self.combined(x), self.acc))

    def partial(self, count: kir.Expr, loaded: tuple[kir.Expr, ...]) -> tuple[kir.Expr, ...]:
        return loaded

    def part_names(self, red_idx: Mapping[str, int]) -> tuple[str, ...]:
        return (f"part{red_idx[self.reduction]}",)

    def finish(self, K: int | kir.Expr, var: VarMaker) -> tuple[list[kir.Stmt], tuple[tuple[str, Var], ...]]:
        """The combined value in ``acc`` itself, a mean's divided by ``K`` in place (``K`` an i32
        expression in a generic kernel with a dynamic row length: divided at run time)."""
        scale: kir.Expr = (Const(1.0 / K, F32) if isinstance(K, int)
                           else Bin("/", Const(1.0, F32), kir.Cast(K, F32)))
        stmts: list[kir.Stmt] = ([Assign(self.acc, Bin("*", self.acc, scale))]
                                 if self.info.is_mean else [])
        return stmts, ((self.reduction, self.acc),)
