"""Rule 5b of the AStitch heuristic (:mod:`stitchtune.cost.heuristic`): one full wave of a row grid.

A row grid of one task per block that one wave of at most 4 blocks per SM could hold gets that many
blocks per SM as ``min_blocks`` (a register cap): one full wave, not 1.x waves and a tail. The cap is
taken only where its budget covers the whole register estimate (:func:`~stitchtune.lower.entry.estimate_registers`).
Below that ptxas fills the budget with hoisted loads and spills: at the GPU script's shapes (sm_90
cubins, CPU static analysis) a cap of 64 registers spilled 2 instructions in GPT-2's two-output layer
norms (estimate 80) and 2-4 in Llama's RMS norms (estimate 88), while the estimate does not tell those
from the layer norms that fit.

Where the cap does not cover the estimate, the row's threads are halved (``tpr`` / 2, the row still
within one warp, each thread's register cache at most 64 floats): a thread then holds twice the row
but the per-thread overhead (addresses, indices, the accumulators) is paid by half as many threads, and
the grid halves, so one wave needs half the blocks per SM and each has twice the registers. Llama's
4096 x 1024 RMS norms: 32 threads per row, 80-90 registers, 2-3 blocks per SM, 1.29-1.94 waves; 16
threads per row under the cap of 2 blocks (128 registers): 0.97 waves, no spill (ptxas, sm_90). Only
where that grid is one full wave (:data:`FULL_WAVE` of the resident capacity, the audit's criterion).
Else the cap is taken at 3/4 of the estimate as before (the estimate counts every hoisted load live
at once; ptxas staggers them), and the audit checks the outcome (spills, waves) from the cubin.
"""

from __future__ import annotations

import dataclasses
import math

from stitchtune.lower.entry import estimate_registers
from stitchtune.plan.family import Family
from stitchtune.plan.planner import StitchPlan
from stitchtune.space import SchemeName, Schedule, SearchSpace

#: a single wave counts as full from this share of the resident capacity (docs/audit.md, criterion 6)
FULL_WAVE = 0.95
#: rule 4's register-cache budget: floats per thread a halved row may cache
MAX_REG_CACHE = 64
#: the most blocks per SM rule 5b asks for
MAX_WAVE_BLOCKS = 4


def _grid(plan: StitchPlan, s: Schedule) -> int:
    return math.ceil(plan.M / max(1, s.block // s.tpr))


def _estimate(space: SearchSpace, s: Schedule) -> int:
    return estimate_registers(int(space.derived(s)["reg_cache_elems"]), s.vec, 4)


def _capped(space: SearchSpace, plan: StitchPlan, s: Schedule, share: float) -> Schedule | None:
    """``s`` with ``min_blocks`` = the fewest blocks per SM (<= :data:`MAX_WAVE_BLOCKS`, a choice of the
    space) that hold its grid in one wave, where that cap's register budget is at least 48 and
    ``share`` x the estimate and the point is legal; None otherwise."""
    dev = space.device
    grid = _grid(plan, s)
    need = math.ceil(grid / dev.sm_count)
    if grid <= dev.sm_count or need > MAX_WAVE_BLOCKS:
        return None
    if s.min_blocks and s.min_blocks >= need:
        return s
    fits = [m for m in space.domains["min_blocks"] if m >= need and m * s.block <= dev.max_threads_per_sm]
    if not fits:
        return None
    m = min(fits)
    budget = min(dev.max_regs_per_thread, dev.regs_per_sm // (s.block * m))
    if budget < max(48, share * _estimate(space, s)):
        return None
    t = dataclasses.replace(s, min_blocks=m)
    return None if space.violations(t) else t


def _halved(space: SearchSpace, plan: StitchPlan, s: Schedule) -> Schedule | None:
    """``s`` with half the threads per row, capped to one full wave (the cap covering the whole estimate),
    or None where the row would leave a warp's shuffle scheme, cache over :data:`MAX_REG_CACHE` floats per
    thread, give a thread no vector of its own, or not fill one wave."""
    tpr = s.tpr // 2
    if s.tpr > 32 or tpr < 4 or tpr not in space.domains["tpr"] or plan.N < tpr * s.vec:
        return None
    if any(x != SchemeName.LOCAL for x in s.schemes):
        return None
    t = dataclasses.replace(s, tpr=tpr, min_blocks=0)
    if space.violations(t) or int(space.derived(t)["reg_cache_elems"]) > MAX_REG_CACHE:
        return None
    c = _capped(space, plan, t, 1.0)
    if c is None or _grid(plan, c) < FULL_WAVE * c.min_blocks * space.device.sm_count:
        return None
    return c


def one_wave(space: SearchSpace, plan: StitchPlan, s: Schedule, grid_barrier: bool) -> Schedule:
    """Rule 5b (module docstring) for a row-family grid of one task per block without a grid barrier
    (``grid_barrier``: whether ``s`` has one); ``s`` itself where it does not apply."""
    if plan.family != Family.ROW or plan.cross or s.split != 1 or s.tasks_per_block != 1 or grid_barrier:
        return s
    return _capped(space, plan, s, 1.0) or _halved(space, plan, s) or _capped(space, plan, s, 0.75) or s
