"""The reuse levels of a schedule (``Schedule.reuse``: one per reuse candidate of the plan), as names."""

from __future__ import annotations

from enum import StrEnum


class ReuseLevel(StrEnum):
    """Where a full-size tensor that several sweeps read is kept between them (``Schedule.reuse``)."""

    REGISTER = "register"     # register cache of the thread's row piece
    SHARED = "shared"         # shared-memory cache of the block's rows
    GLOBAL = "global"         # re-read from global memory (inputs only)
    RECOMPUTE = "recompute"   # recomputed from its inputs (intermediates only)

    @property
    def cached(self) -> bool:
        """Whether the level keeps the values on chip (registers or shared memory)."""
        return self in (ReuseLevel.REGISTER, ReuseLevel.SHARED)


def uncached_level(is_input: bool) -> ReuseLevel:
    """The level of a tensor kept nowhere: an input is re-read, an intermediate recomputed."""
    return ReuseLevel.GLOBAL if is_input else ReuseLevel.RECOMPUTE
