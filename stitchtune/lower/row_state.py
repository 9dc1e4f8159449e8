"""The building state of a row kernel (:class:`stitchtune.lower.row_kernel.RowKernel`) and the narrow
interface over it that the exchange, the cross reductions, the gathers and the index ops use (the Protocols
of :mod:`stitchtune.lower.builder`): :class:`RowKernelState`, the kernel's base class.
"""

from __future__ import annotations

from collections.abc import Callable

from stitchtune.ir import kir
from stitchtune.ir.kir import Var
from stitchtune.lower.base import Ctx, Lowerer
from stitchtune.lower.builder import KernelState, RowIndex, RowLayout
from stitchtune.lower.state import ReductionState


class RowKernelState(KernelState):
    """A row kernel's building state, private, set by the kernel's constructor: ``_low`` and ``_lay``
    (the lowerer and layout it builds with, read only: :attr:`low`, :attr:`layout`), ``_cx`` (variables and
    scratch buffers: :meth:`var`, :meth:`use_scratch`), ``_body`` (statements before the round loop:
    :meth:`emit_before_rounds`), ``_rb`` (the round body: :meth:`emit`), ``_pvals`` (per-row and scalar
    values available, by tensor name: :meth:`value_of`), ``_uses`` (global buffers read and written:
    :meth:`use_input`, :meth:`use_output`), ``_gather_rows`` (:meth:`gather_row`), ``_cross_acc``
    (:meth:`cross_accumulator`); the public ``ix`` is frozen. It implements the methods of
    :class:`~stitchtune.lower.builder.RowKernelBuilder` that only read or append to that state."""

    ix: RowIndex
    _low: Lowerer
    _lay: RowLayout
    _cx: Ctx
    _body: list[kir.Stmt]
    _rb: list[kir.Stmt]
    _pvals: dict[str, kir.Expr]
    _uses: dict[str, set[str]]
    _gather_rows: dict[str, Var]
    _cross_acc: dict[int, Var]

    @property
    def low(self) -> Lowerer:
        return self._low

    @property
    def layout(self) -> RowLayout:
        return self._lay

    @property
    def rows_per_block(self) -> int:
        return self._low.rpb

    def value_of(self, name: str) -> kir.Expr | None:
        return self._pvals.get(name)

    def use_scratch(self, buf: str) -> None:
        self._cx.scratch.add(buf)

    def emit_before_rounds(self, *stmts: kir.Stmt) -> None:
        self._body.extend(stmts)

    def gather_row(self, node: str, make: Callable[[], Var]) -> Var:
        if node not in self._gather_rows:
            self._gather_rows[node] = make()
        return self._gather_rows[node]

    def cross_accumulator(self, i: int) -> Var:
        return self._cross_acc[i]

    def last_row(self) -> kir.Expr:
        return self._low.m_last()

    def state_parts(self, st: ReductionState) -> tuple[str, ...]:
        low = self._low
        parts = tuple(low.scratch(n, low.p.M * low.s.split) for n in st.part_names(low.red_idx))
        self._cx.scratch.update(parts)
        return parts
