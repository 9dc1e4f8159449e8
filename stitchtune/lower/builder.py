"""The public interface of a kernel builder: what merging reduction states needs in either family
(:class:`StateBuilder`, used by the one exchange, :mod:`stitchtune.lower.exchange`), what the row family's
layout of the exchange (:mod:`stitchtune.lower.row_exchange`) adds (:class:`ExchangeBuilder`), what the
cross reductions (:mod:`stitchtune.lower.cross`), the gathers (:mod:`stitchtune.lower.gather`) and the
index ops (:mod:`stitchtune.lower.remap`) use besides (:class:`RowKernelBuilder`: read-only values and
narrow methods, no mutable field), and the frozen values a row kernel is built from (:class:`RowIndex`,
:class:`RowLayout`, :class:`RowSweep`). :class:`stitchtune.lower.row_kernel.RowKernel` implements the row
Protocols; a test may pass any object that does (``tests/helpers/lowering.FakeStateBuilder``).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from stitchtune.ir import kir
from stitchtune.ir.kir import Var
from stitchtune.ir.kir import F32
from stitchtune.lower.base import Ctx, Lowerer
from stitchtune.plan.planner import StitchPlan
from stitchtune.space import Schedule

if TYPE_CHECKING:
    from stitchtune.lower.state import ReductionState


@dataclass(frozen=True)
class RowIndex:
    """The index variables of a row kernel: the thread's lane in its row and row in its block (set
    once), the round, and the row, split index, row validity and element range of the round's task."""

    lane: Var
    rib: Var
    rd: Var
    row: Var
    sidx: Var
    rvalid: Var
    kbase: Var
    kend: Var


@dataclass(frozen=True)
class RowLayout:
    """Where one kernel keeps its reduction exchange and caches, and how it is launched."""

    shared: tuple[kir.SharedBuf, ...]     # sred (the exchange), sc<t> (shared caches)
    locals_: tuple[kir.LocalArray, ...]   # rc<t> (register caches)
    smem_bytes: int
    grid: int
    rounds: int                           # tasks per block, in turn
    needs_sync: bool                      # a global stage: a grid barrier
    cluster: int = 1                      # a cluster stage: blocks per thread-block cluster


@dataclass(frozen=True)
class RowSweep:
    """One sweep's loop: the logical iteration index, the thread's first element ``k0`` of the
    iteration and its validity, the loop body being built, and whether the full-size inputs come
    from the prefetch registers (the kernel's first sweep, with prefetch on)."""

    idx: kir.Expr
    k0: Var
    valid: Var
    body: list[kir.Stmt]
    from_prefetch: bool


class StateBuilder(Protocol):
    """What merging reduction states needs of the kernel it is built into, in either family: the row
    exchange's :class:`ExchangeBuilder` and the column exchange's
    :class:`stitchtune.lower.col_exchange.ColExchangeBuilder` extend it with their index variables."""

    def emit(self, *stmts: kir.Stmt) -> None:
        """Append ``stmts`` to the current round's statements."""
        ...

    @property
    def schedule(self) -> Schedule:
        """The schedule being lowered."""
        ...

    @property
    def plan(self) -> StitchPlan:
        """The plan being lowered."""
        ...

    @property
    def chunk(self) -> int:
        """Elements of the reduced axis one block covers per task (a split row's piece; in the column
        family the rows of a split chunk)."""
        ...

    def var(self, prefix: str, dtype: str = kir.F32) -> Var:
        """A fresh kernel variable."""
        ...

    def state_parts(self, st: "ReductionState") -> tuple[str, ...]:
        """The scratch buffers of ``st``'s per-block partials (one per stored slot), registered as used
        by this kernel."""
        ...


class ExchangeBuilder(StateBuilder, Protocol):
    """What a row-family reduction-state exchange needs of the kernel it is built into."""

    #: the kernel's index variables
    ix: RowIndex

    @property
    def rows_per_block(self) -> int:
        """Rows a block holds at once (``block // tpr``)."""
        ...

    def last_row(self) -> kir.Expr:
        """The view's last row ``M - 1`` (a constant; in a generic kernel an expression of its extents)."""
        ...


class RowKernelBuilder(ExchangeBuilder, Protocol):
    """What the cross reductions (:mod:`stitchtune.lower.cross`), the gathers (:mod:`stitchtune.lower.gather`)
    and the index ops (:mod:`stitchtune.lower.remap`) use of a row kernel being built, besides the
    exchange's part: read-only values and narrow methods (the kernel's building state stays private)."""

    @property
    def low(self) -> Lowerer:
        """The program's shared machinery (buffers, maps, schedule)."""
        ...

    @property
    def layout(self) -> RowLayout:
        """The kernel's layout (shared buffers, grid, rounds)."""
        ...

    def emit_before_rounds(self, *stmts: kir.Stmt) -> None:
        """Append ``stmts`` to the statements before the round loop."""
        ...

    def use_scratch(self, buf: str) -> None:
        """Record that the kernel uses scratch buffer ``buf`` (it becomes a kernel parameter)."""
        ...

    def gather_row(self, node: str, make: Callable[[], Var]) -> Var:
        """The table row of gather node ``node`` in this round: ``make()``'s variable, made (and its
        statements emitted) the first time it is asked for."""
        ...

    def use_input(self, buf: str) -> None:
        """Record that the kernel reads global buffer ``buf`` (it becomes a kernel parameter)."""
        ...

    def use_output(self, buf: str) -> None:
        """Record that the kernel writes global buffer ``buf`` (it becomes a kernel parameter)."""
        ...

    def value_of(self, name: str) -> kir.Expr | None:
        """The per-row or scalar value of tensor ``name`` in this round, None while it is not computed."""
        ...

    def cross_accumulator(self, i: int) -> Var:
        """The scalar accumulator of the ``i``-th cross reduction (:mod:`stitchtune.lower.cross`)."""
        ...

    def load_p(self, name: str) -> kir.Expr:
        """A per-row or scalar input value (loaded once per round)."""
        ...

    def cache_index(self, sw: RowSweep, j: int) -> kir.Expr:
        """The register-cache index of element ``j`` of the sweep's current vector."""
        ...

    def f_index(self, r: kir.Expr, k: kir.Expr, name: str | None = None) -> kir.Expr:
        """Element ``k`` of row ``r`` of a full-size tensor (through input ``name``'s index map)."""
        ...


def rows_exact(low: Lowerer, lay: RowLayout, tasks: int) -> bool:
    """Whether every task of every round of a row kernel of layout ``lay`` is a real row (piece) of the
    view: a static kernel whose grid x rounds is exactly ``tasks`` and whose row groups divide the rows.
    Then the row guard is the constant ``true`` and ptxas issues a thread's loads without a branch
    between them."""
    return (low.sym is None and lay.grid * lay.rounds == tasks
            and (low.s.split > 1 or tasks * low.rpb == low.p.M))


def cols_exact(low: Lowerer) -> bool:
    """Whether a row kernel's sweeps never pass the end of the row (piece): static, and the pieces of the
    split row, each whole sweeps of ``tpr`` x ``vec`` elements, add up to the row (no padding)."""
    return (low.sym is None or low.sym.N.static) and low.chunk * low.s.split == low.p.N


class KernelState:
    """The building state both families' kernels share, private, set by the kernel's constructor:
    ``_low`` (the lowerer, read only), ``_cx`` (variables and scratch buffers), ``_rb`` (the current
    round's statements) and ``_uses`` (global buffers read and written); the accessors over it that
    :class:`StateBuilder` and the families' builders name alike. Base of
    :class:`stitchtune.lower.row_state.RowKernelState` and the column family's ``_ColKernel``."""

    _low: Lowerer
    _cx: Ctx
    _rb: list[kir.Stmt]
    _uses: dict[str, set[str]]

    @property
    def schedule(self) -> Schedule:
        """The schedule being lowered."""
        return self._low.s

    @property
    def plan(self) -> StitchPlan:
        """The plan being lowered."""
        return self._low.p

    @property
    def chunk(self) -> int:
        """Elements of a reduction row (row family) or rows of a column chunk (column family) one task covers."""
        return self._low.chunk

    def var(self, prefix: str, dtype: str = F32) -> Var:
        """A fresh kernel variable."""
        return self._cx.var(prefix, dtype)

    def emit(self, *stmts: kir.Stmt) -> None:
        """Append ``stmts`` to the current round's statements."""
        self._rb.extend(stmts)

    def use_input(self, buf: str) -> None:
        """Record that the kernel reads global buffer ``buf`` (it becomes a kernel parameter)."""
        self._uses["in"].add(buf)

    def use_output(self, buf: str) -> None:
        """Record that the kernel writes global buffer ``buf`` (it becomes a kernel parameter)."""
        self._uses["out"].add(buf)
