"""The public interface of a row-family kernel builder: what the exchange
(:mod:`stitchtune.lower.exchange`), the cluster scheme (:mod:`stitchtune.lower.cluster`), the cross
reductions (:mod:`stitchtune.lower.cross`) and the index ops (:mod:`stitchtune.lower.remap`) may use of
the kernel being built. :class:`stitchtune.lower.row.RowKernel` implements it; tests may pass any
object that does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from stitchtune.ir import kir
from stitchtune.ir.kir import Var
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


class ExchangeBuilder(Protocol):
    """What a reduction-state exchange needs of the kernel it is built into."""

    #: the statements of the current round (the exchange appends to it)
    rb: list[kir.Stmt]
    #: the kernel's index variables
    ix: RowIndex

    @property
    def schedule(self) -> Schedule:
        """The schedule being lowered."""
        ...

    @property
    def plan(self) -> StitchPlan:
        """The plan being lowered."""
        ...

    @property
    def rows_per_block(self) -> int:
        """Rows a block holds at once (``block // tpr``)."""
        ...

    @property
    def chunk(self) -> int:
        """Elements of a row one block covers per task (a split row's piece)."""
        ...

    def var(self, prefix: str, dtype: str = kir.F32) -> Var:
        """A fresh kernel variable."""
        ...

    def state_parts(self, st: "ReductionState") -> tuple[str, ...]:
        """The scratch buffers of ``st``'s per-block partials (one per stored slot), registered as used
        by this kernel."""
        ...
