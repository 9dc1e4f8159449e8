"""The family of a plan's view (``StitchPlan.family``)."""

from __future__ import annotations

from enum import StrEnum


class Family(StrEnum):
    """The kind of a plan's view: row reductions (reduced axis contiguous), column reductions (reduced
    axis leading), or an element-wise graph (no reduction; mapped like rows)."""

    ROW = "row"
    COL = "col"
    ELEMENTWISE = "elementwise"
