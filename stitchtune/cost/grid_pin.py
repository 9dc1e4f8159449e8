"""The heuristic's grid-barrier pin (rule 5c of :mod:`stitchtune.cost.heuristic`).

Contract
--------
* :func:`estimated_blocks_per_sm(space, s, capped=False)`: blocks of ``s`` per SM with the pre-build register
  estimate (what the lowering sizes persistent grids by); ``capped``: held to ``min_blocks``' register budget.
* :func:`grid_blocks_per_sm(space, s, per_sm)`: the blocks per SM a grid-barrier grid of ``s`` needs
  resident (a one-round column grid: ``ceil(tiles x split / SMs)``; any other: ``per_sm``).
* :func:`pin_coresidency(space, s)`: ``s`` with ``min_blocks`` the fewest legal value (the space's
  ``legal_values``, undrawn ones included) at or above that need, at least 2; ``s`` itself where one
  block per SM is estimated, no legal value fits the SM's threads, or ``s`` already asks as many.
* :func:`rule_caps(space)`: the ``min_blocks`` values the heuristic's other register caps (rules 5a, 5d, 5e)
  choose among: the legal ones of :data:`RULE_CAPS`.
"""

from __future__ import annotations

import math

from stitchtune.hardware.occupancy import occupancy
from stitchtune.lower.entry import estimate_registers
from stitchtune.plan.family import Family
from stitchtune.space import Schedule, SearchSpace

__all__ = ["RULE_CAPS", "estimated_blocks_per_sm", "grid_blocks_per_sm", "pin_coresidency", "rule_caps"]

#: the register caps (``min_blocks``) the heuristic's rules 5a, 5d and 5e choose among: the values space version 5
#: drew. Searches draw 3 since space version 6; the heuristic sets it only through the grid pin (rule 5c): whether a
#: 3-block cap beats 2 or 4 for the other rules is not known without a GPU (12 of the 58 examples would go 2 -> 3)
RULE_CAPS = (0, 1, 2, 4)


def rule_caps(space: SearchSpace) -> list[int]:
    """The legal ``min_blocks`` values of :data:`RULE_CAPS`, ascending."""
    return [m for m in space.legal_values("min_blocks") if m in RULE_CAPS]


def estimated_blocks_per_sm(space: SearchSpace, s: Schedule, capped: bool = False) -> int:
    """Blocks of ``s`` per SM with the pre-build register estimate (what the lowering sizes grids by) and the
    shared memory of its caches and reductions; ``capped``: the estimate held to ``min_blocks``' register
    budget where ``s`` sets one (what ``__launch_bounds__`` asks of ptxas)."""
    d = space.derived(s)
    need = estimate_registers(int(d["reg_cache_elems"]), s.vec, 4)
    if capped and s.min_blocks:
        need = min(need, space.device.regs_per_sm // (s.block * s.min_blocks))
    return occupancy(space.device, s.block, need, int(d["smem_cache_bytes"]) + int(d["smem_red_bytes"])).blocks_per_sm


def grid_blocks_per_sm(space: SearchSpace, s: Schedule, per_sm: int) -> int:
    """Blocks per SM that the grid-barrier grid of ``s`` needs resident: a column grid of one round
    holds its tiles x ``split`` tasks (at most the co-resident grid, whole splits), so
    ``ceil(grid / SMs)``; any other grid is sized to ``per_sm`` blocks per SM."""
    if space.plan.family != Family.COL:
        return per_sm
    sms = int(space.device.sm_count)
    tiles = math.ceil(space.plan.N / (s.block // s.tpr * s.vec))
    grid = min(tiles * s.split, (per_sm * sms // s.split) * s.split)
    return max(1, min(per_sm, math.ceil(grid / sms)))


def pin_coresidency(space: SearchSpace, s: Schedule) -> Schedule:
    """A grid-barrier grid is sized for the blocks per SM that the *estimated* registers allow; if the
    compiler then uses more registers, fewer blocks fit and the point is pruned after its build (the
    colsum heuristic on the H200, 2026-11-29: 512 blocks needed, 396 fitted). Launch bounds asking for
    as many blocks per SM as the grid needs resident (:func:`grid_blocks_per_sm`; the fewest legal
    ``min_blocks`` at or above it, undrawn values included: 3) make ptxas keep to a register budget under
    which the grid stays co-resident, and no tighter (GPT-2 train's GELU backward ``view_41``: 384 blocks
    of 256 threads need 3 per SM; pinned to 4, its 64-register cap spilled 2 instructions; sm_90 cubin)."""
    per_sm = estimated_blocks_per_sm(space, s)
    if per_sm < 2:  # one block per SM is always resident once the grid fits the SM count
        return s
    need = max(2, grid_blocks_per_sm(space, s, per_sm))
    ok = [m for m in space.legal_values("min_blocks") if m >= need and m * s.block <= space.device.max_threads_per_sm]
    if not ok or s.min_blocks >= min(ok):
        return s
    return Schedule(**{**s.to_dict(), "schemes": s.schemes, "reuse": s.reuse, "min_blocks": min(ok)})
