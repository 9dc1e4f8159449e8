"""Numpy evaluation for the IR walk (:mod:`stitchtune.cost.ir_walk`): binary operations over the threads of a
block, and :class:`BlockDefs`, the variables' definitions by which a loop bounded by the block index is
counted over every block rather than block 0.

Contract: :meth:`BlockDefs.trips` returns the mean trip count of a loop over the active threads (block 0's
mask) of every block, or of :data:`TRIP_BLOCKS` evenly spaced blocks (the first and last included) of a
larger grid, where the loop's bounds read the block index (directly or through variables defined from it,
their definitions evaluated again per block); None where they do not, or depend on data (the walker then
counts block 0). A variable that two branches of an ``If`` define differently has no definition: a bound
that reads it gives None. Pure numpy, no device.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from stitchtune.ir import kir

#: the most blocks whose trip counts a loop bounded by the block index is averaged over (evenly spaced, the
#: first and the last included); a grid of at most this many is counted block by block
TRIP_BLOCKS = 2048


def as_int(x: np.ndarray) -> Any:
    """``x`` as int64 where it holds integers or booleans, else unchanged."""
    return x.astype(np.int64) if x.dtype.kind in "iub" else x


def bin_op(op: str, a: np.ndarray, b: np.ndarray) -> Any:
    """The IR binary operation ``op`` of ``a`` and ``b`` element by element (C semantics for integer ``/``
    and ``%``, a zero divisor giving 0 / the dividend), or None for an operation it does not evaluate."""
    isint = a.dtype.kind in "iub" and b.dtype.kind in "iub"
    with np.errstate(all="ignore"):
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            if isint:
                bb = np.where(b == 0, 1, b)
                return np.trunc(a / bb).astype(np.int64)
            return a / b
        if op == "%":
            if isint:
                bb = np.where(b == 0, 1, b)
                return np.fmod(a, bb).astype(np.int64)
            return np.fmod(a, b)
        if op == "min":
            return np.minimum(a, b)
        if op == "max":
            return np.maximum(a, b)
        if op == "<":
            return a < b
        if op == "<=":
            return a <= b
        if op == ">":
            return a > b
        if op == ">=":
            return a >= b
        if op == "==":
            return a == b
        if op == "!=":
            return a != b
        if op == "&&":
            return (a != 0) & (b != 0)
        if op == "||":
            return (a != 0) | (b != 0)
        if isint and op == "&":
            return as_int(a) & as_int(b)
        if isint and op == "^":
            return as_int(a) ^ as_int(b)
        if isint and op == ">>":
            return as_int(a) >> np.clip(as_int(b), 0, 63)
        if isint and op == "<<":
            return as_int(a) << np.clip(as_int(b), 0, 63)
    return None


class BlockDefs:
    """The definitions of a walk's variables (an ``Assign``'s value, a loop variable's start; None: a value
    from memory, or two branches' different definitions) for the per-block trip counts (module docstring).
    ``ev`` evaluates an expression for block 0's threads. Recording a definition is a dict store: whether a
    variable depends on the block index is worked out only for a loop's bounds."""

    def __init__(self, threads: int, grid: int, ev: Callable[[kir.Expr], Any]) -> None:
        self.n = threads
        self.grid = grid
        self.ev = ev
        self.defs: dict[str, kir.Expr | None] = {}

    def copy(self) -> "BlockDefs":
        c = BlockDefs(self.n, self.grid, self.ev)
        c.defs = dict(self.defs)
        return c

    def merge(self, other: "BlockDefs") -> None:
        """After an ``If``: ``self`` is one branch's state, ``other`` the other's. A variable they define
        differently has no definition (None)."""
        for name in set(other.defs) | set(self.defs):
            if other.defs.get(name) is not self.defs.get(name):
                self.defs[name] = None

    def define(self, name: str, e: kir.Expr | None) -> None:
        """Record ``name := e`` (None: a value from memory)."""
        self.defs[name] = e

    def dependent(self, e: kir.Expr, memo: dict[str, bool]) -> bool:
        """Whether ``e`` reads the block index, directly or through a variable defined from it (a variable
        without a definition counts as dependent: its per-block value is unknown)."""
        for x in kir.exprs(e):
            if isinstance(x, kir.Special) and x.kind == "bid":
                return True
            if isinstance(x, kir.Var) and x.name in self.defs:
                if x.name not in memo:
                    memo[x.name] = False   # (a definition that reads itself)
                    d = self.defs[x.name]
                    memo[x.name] = d is None or self.dependent(d, memo)
                if memo[x.name]:
                    return True
        return False

    def sample(self) -> np.ndarray:
        """The block indexes a trip count is averaged over (:data:`TRIP_BLOCKS`)."""
        if self.grid <= TRIP_BLOCKS:
            return np.arange(self.grid, dtype=np.int64)
        return np.unique(np.linspace(0, self.grid - 1, TRIP_BLOCKS).round().astype(np.int64))

    def value(self, e: kir.Expr, bids: np.ndarray, deps: dict[str, bool], memo: dict[str, Any]) -> Any:
        """``e`` in every thread of the blocks ``bids`` (blocks x threads), or None where it depends on data
        (``deps``: :meth:`dependent`'s memo; ``memo``: the variables' values)."""
        match e:
            case kir.Special() if e.kind == "bid":
                return np.broadcast_to(bids[:, None], (bids.size, self.n))
            case kir.Var() if e.name in self.defs and self.dependent(e, deps):
                if e.name not in memo:
                    d = self.defs[e.name]
                    memo[e.name] = None   # (a definition that reads itself: unknown)
                    memo[e.name] = None if d is None else self.value(d, bids, deps, memo)
                return memo[e.name]
            case kir.Bin():
                a, b = self.value(e.a, bids, deps, memo), self.value(e.b, bids, deps, memo)
                return None if a is None or b is None else bin_op(e.op, np.asarray(a), np.asarray(b))
            case kir.Select():
                c, a, b = (self.value(x, bids, deps, memo) for x in (e.cond, e.a, e.b))
                return None if c is None or a is None or b is None else np.where(c != 0, a, b)
            case kir.Cast():
                v = self.value(e.expr, bids, deps, memo)
                if v is None:
                    return None
                return v.astype(np.float64) if e.dtype == kir.F32 else np.trunc(v).astype(np.int64)
            case _:
                v = self.ev(e)   # no block index inside: block 0's value stands for every block
                return None if v is None else np.broadcast_to(v[None, :], (bids.size, self.n))

    def trips(self, f: kir.For, mask: np.ndarray) -> float | None:
        """The mean trip count of ``f`` over ``mask``'s threads of every (sampled) block, where its bounds read
        the block index; None otherwise or where they depend on data."""
        deps: dict[str, bool] = {}
        if not (self.dependent(f.start, deps) or self.dependent(f.stop, deps)):
            return None
        bids = self.sample()
        memo: dict[str, Any] = {}
        a, b = self.value(f.start, bids, deps, memo), self.value(f.stop, bids, deps, memo)
        if a is None or b is None:
            return None
        return float(np.maximum(0, np.ceil((b - a)[:, mask] / f.step)).mean())
