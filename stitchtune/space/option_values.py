"""The values of the schedule options that are names (``order``, ``combine``, ``cross_combine``), as enums.

Each is a :class:`~enum.StrEnum`: a member *is* its string (``Order.ALTERNATE == "alternate"``, equal
hashes, ``json.dumps`` and database columns write the plain string), so a schedule's JSON, its
:meth:`~stitchtune.space.Schedule.key`, the tuning database's ``p_<option>`` columns and the space file's
``choices`` are what they were when the values were bare strings. A :class:`~stitchtune.space.Schedule`
stores the members (its option table decodes a string into one, and rejects a string that is none), so
``s.option(ORDER)`` is an :class:`Order` and code compares against members, not string literals.
"""

from __future__ import annotations

from enum import StrEnum


class Order(StrEnum):
    """``order``: the direction of the sweeps that re-read full-size tensors from memory."""

    FORWARD = "forward"       # every sweep runs forwards
    ALTERNATE = "alternate"   # every other re-reading sweep runs backwards (starts with what L2 still holds)


class Combine(StrEnum):
    """``combine``: how a row split over several blocks combines its partials."""

    THREAD = "thread"   # every thread loads all the partials
    WARP = "warp"       # each warp loads them together and reduces by shuffles


class CrossCombine(StrEnum):
    """``cross_combine``: how the blocks' partials of the cross reductions are combined."""

    ATOMIC = "atomic"   # float atomic adds into the output, zeroed by a small kernel first (not reproducible)
    GRID = "grid"       # per-block partials, a grid barrier, then ordered sums (co-resident grid)
    KERNEL = "kernel"   # per-block partials, then a small second kernel sums them in order
