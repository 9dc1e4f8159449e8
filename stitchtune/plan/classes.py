"""The class of a tensor over a plan's ``[M, N]`` view (:mod:`stitchtune.plan.planner`'s docstring)."""

from __future__ import annotations

from enum import Enum

from stitchtune.plan.family import Family

__all__ = ["TensorClass"]


class TensorClass(Enum):
    """How a tensor varies over the plan's ``[M, N]`` view (the value is the letter used in docs)."""

    FULL = "F"         # full [M, N]
    PER_KEPT = "P"     # one value per independent row (row family) / column (col family)
    PER_REDUCED = "K"  # one value per position along the reduced axis (gamma of a layernorm)
    SCALAR = "S"       # one value

    @property
    def varies_along_reduced(self) -> bool:
        """``FULL`` and ``PER_REDUCED``: produced element by element by a sweep along the reduced
        axis. ``PER_KEPT`` and ``SCALAR`` are one value per reduction (row/column), broadcast along it."""
        return self in (TensorClass.FULL, TensorClass.PER_REDUCED)

    def varies_along_cols(self, family: Family) -> bool:
        """Whether a tensor of this class varies along the view's columns in a plan of ``family``: the
        reduced axis of the row family (and element-wise), the kept one of the column family."""
        return self is TensorClass.FULL or self is (TensorClass.PER_KEPT if family == Family.COL
                                                     else TensorClass.PER_REDUCED)
