"""The AStitch heuristic: the schedule a user gets without tuning, and trial 0 of every search.

Rules (AStitch, ASPLOS'22, sections 4.3-4.4, adapted to this schedule space):

1. **Vector width**: 16-byte accesses where the contiguous length allows (``vec`` = 16 / element
   size, halved until it divides the length).
2. **Adaptive thread mapping** (row family): *task splitting* when there are fewer rows than blocks
   per wave and a row is longer than 1024 elements (``tpr = block = 1024``, ``split`` = blocks per
   wave / rows, rounded down to a power of two); otherwise *task packing*: ``tpr`` = the power of two
   that gives each thread about 8 vectors of a row, at least 4 and at most 1024, and rows are packed
   into 256-thread blocks; element-wise regions alike (short rows packed, ``tpr`` doubled until the grid
   has two waves; a region reading an input along its rows, ``plan.adjacent_rows = G``, at least ``G``
   rows a block, :mod:`stitchtune.plan.adjacent`). Column family: a warp of threads across 32 x ``vec``
   columns, 8 threads down the rows (fewer where there are fewer rows: Llama's 4-row sum over 4 x 1048576
   left half the threads without a row), and the rows split so that tiles x split fills one wave; a
   region reading a full-size input across its rows (a column stride of a sector or more: BERT's
   ``view_59``, planned so by :func:`~stitchtune.plan.planner.stored_across_rows`) 8 threads across the
   columns and 32 down the rows, so that a warp's lanes cover 4 adjacent rows of each column (2x the ideal
   sectors where 32 threads across are 8x).
   A plan with cross reductions (:mod:`stitchtune.plan.cross`) never splits rows (the space requires
   split 1) and takes a persistent grid, so that few per-block partials are combined, by the
   deterministic ``cross_combine`` kernel (its default); when every row fits one block (a training
   step's layer norm backward at a small batch), by ``grid``: that block sums its partials after a
   one-block grid barrier, one launch where ``kernel`` would make two.
3. **Schemes**: ``local`` when a row's threads are within one warp (a shuffle all-reduce keeps the
   result in registers), ``regional`` when the row is within one block (block-locality check), and
   ``global`` when it is split across blocks and the grid can be co-resident; otherwise
   ``independent``.
4. **Reuse**: of the multiply-read tensors, those :func:`~stitchtune.cost.reuse.tensors_to_cache` picks
   (none that a cached later tensor of its chain makes unread; cheap element-wise steps recomputed), the
   latest first, go to registers while the register cache stays within 64 floats per thread, then to
   shared memory while blocks of it keep a quarter of the SM's threads resident, else they are re-read /
   recomputed; a level is taken only while one block still fits an SM with the estimated registers (a
   1024-thread row of 32000 floats cannot cache two tensors).
5. **Launch (assume-relax-apply)**: assume 32 registers and 1024-thread blocks to size a wave; then
   relax the register cap (``__launch_bounds__`` minimum blocks per SM) as far as the estimated
   register need allows without losing co-residency (no cap where its budget is the device's per-thread
   maximum anyway, outside plans with cross reductions: ptxas fills such a budget with hoisted loads); apply.
   5b. **One wave** (:mod:`stitchtune.cost.waves`): a row grid (one task per block) that one wave of at
   most 4 blocks per SM could hold gets that many as ``min_blocks`` (a register cap) where the budget
   covers the estimate; else half the threads per row where that grid is one full wave under such a
   cap; else the cap at 3/4 of the estimate.
   5c. **No spills under the pin**: a grid-barrier schedule is pinned to the blocks per SM its grid needs
   resident (a register cap, :func:`_pin_coresidency`: a one-round column grid ``ceil(grid / SMs)``, any
   other its estimated blocks per SM; the fewest legal ``min_blocks`` at or above that, 3 included); register caches are demoted while that cap is below the
   estimate with the cache counted twice, so that the cap does not turn the cache into spills.
   5e. **No tail wave** (:func:`~stitchtune.cost.waves.tail_free`): a row grid of one task per block that is
   still strictly between one and two waves (estimated registers) takes two tasks per block: one wave, no
   tail, where a block stays on every SM and the first sweep keeps Little's law's bytes in flight per SM
   (GPT-2's and BERT's embedding backwards: 512 blocks at 1.94 waves -> 256 at 0.97).
   5d. **One round** (column family, grid barrier): while the tiles x ``split`` tasks are more than the
   co-resident grid holds (estimated registers), the split is halved (down to 2) where that reaches one
   round: each round of tasks ends in a grid barrier, and the last round may be nearly empty (GPT-2's
   training column sum 4096 x 2304: 18 tiles x 32 = 576 tasks on 512 blocks, two rounds; split 16: one).

6. **Clusters** (devices with thread-block clusters, sm_90, where the space offers the ``cluster``
   scheme): a row reduction whose row, held by one 1024-thread block, needs more registers per thread
   (the lowering's estimate for the register-cached row pieces of every reuse candidate) than the
   target occupancy leaves (``TARGET_OCCUPANCY`` of the SM's threads resident: 64 registers per thread
   on sm_90) and that does not fit one block's shared memory either (float32, the opt-in limit: rule 4
   would keep it there) is split over a cluster of 512-thread blocks: the smallest power of two (up to the
   portable size) that brings a cached tensor to <= 64 floats per thread, else the largest; every
   stage ``cluster``; then the reuse levels of rule 4, demoted until a block of the estimated
   registers fits on an SM.

8. **Transposes** (an element-wise region whose outputs' contiguous axis is a row axis of the view,
   ``plan.transpose``): the transposed outputs go through a shared-memory tile (``transpose`` 64 with
   16-byte accesses where the row and the transposed axis reach 64 and its grid, at the lowering's
   register estimate, keeps the audit's wave criterion, else 32; 256-thread blocks).

7. **Scatters** (an embedding's gradient, :mod:`stitchtune.plan.scatter`) in a plan with cross
   reductions: ``cross_combine`` grid where legal (the persistent grid is co-resident), so that the
   table is zeroed behind that barrier in the one kernel, not by a zero-fill launch before a
   ``kernel`` combine's two (its adds are float atomics anyway).

9. **Row vectors** (:mod:`stitchtune.cost.row_vector_rule`): option ``row_vectors`` on where rule 2's
   mapping allows it and the bytes-weighted sector factors of all full-size tensors are lower with it.

Blocks per wave and co-residency come from :mod:`stitchtune.hardware.occupancy` and the device description.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from typing import Any

from stitchtune.cost.grid_pin import estimated_blocks_per_sm as _estimated_blocks_per_sm
from stitchtune.cost.grid_pin import pin_coresidency as _pin_coresidency
from stitchtune.cost.grid_pin import rule_caps
from stitchtune.cost.reuse import tensors_to_cache
from stitchtune.cost.waves import one_wave, tail_free, waves_ready
from stitchtune.lower.entry import estimate_registers
from stitchtune.lower.transpose import transpose_launch
from stitchtune.cost.row_vector_rule import with_elementwise_row_vectors, with_row_vectors
from stitchtune.hardware.device import Device
from stitchtune.hardware.occupancy import max_resident_blocks
from stitchtune.plan.family import Family
from stitchtune.plan.planner import StitchPlan, TensorClass
from stitchtune.space import (CROSS_COMBINE, PERSISTENT, ROW_VECTORS, CrossCombine, ReuseLevel, Schedule, SchemeName, SearchSpace,
                              uncached_level)

log = logging.getLogger(__name__)

#: rule 6: the share of an SM's threads that should stay resident (sets the register budget per thread)
TARGET_OCCUPANCY = 0.5
#: rule 4: a shared-memory cache is taken only while blocks of it keep this share of an SM's threads resident
SHARED_MIN_OCCUPANCY = 0.25


def _pow2_floor(x: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(1.0, x)))))


def _pow2_ceil(x: float) -> int:
    return 1 << max(0, int(math.ceil(math.log2(max(1.0, x)))))


def _vec(space: SearchSpace, length: int) -> int:
    v = 16 // space.elem_bytes
    while v > 1 and (length % v or v not in space.domains["vec"]):
        v //= 2
    return v


def _reuse(space: SearchSpace, base: Schedule) -> Schedule:
    """Rule 4 over the tensors :func:`~stitchtune.cost.reuse.tensors_to_cache` picks, latest first:
    registers (<= 64 floats/thread), then shared memory while a block of it keeps
    :data:`SHARED_MIN_OCCUPANCY` of the SM's threads resident, else re-read / recompute; never a level that
    leaves a block without an SM to run on (estimated registers)."""
    plan = space.plan
    levels = list(_uncached(plan))
    worth = tensors_to_cache(plan)
    for i in reversed(range(len(plan.reuse_candidates))):
        if plan.reuse_candidates[i] not in worth:
            continue
        for lvl in (ReuseLevel.REGISTER, ReuseLevel.SHARED):
            trial = levels.copy()
            trial[i] = lvl
            s = Schedule(**{**base.to_dict(), "schemes": base.schemes, "reuse": tuple(trial)})
            d = space.derived(s)
            if lvl == ReuseLevel.REGISTER and d["reg_cache_elems"] > 64:
                continue
            per_sm = _estimated_blocks_per_sm(space, s)
            if space.violations(s) or per_sm == 0:  # a block must fit an SM
                continue
            if lvl == ReuseLevel.SHARED and per_sm * s.block < SHARED_MIN_OCCUPANCY * space.device.max_threads_per_sm:
                continue
            levels = trial
            break
    return Schedule(**{**base.to_dict(), "schemes": base.schemes, "reuse": tuple(levels)})


def _relax_registers(space: SearchSpace, s: Schedule) -> Schedule:
    """Assume-relax-apply for the register cap: the largest ``min_blocks`` whose register budget
    (regs per SM / (block * min_blocks)) still covers 1.5x the estimated need; 0 (no cap) otherwise, and 0
    where that budget is the device's per-thread maximum anyway (``__launch_bounds__(256, 1)`` caps nothing
    that ``__launch_bounds__(256)`` does not, but ptxas then fills the registers with hoisted loads: GPT-2's
    and Llama's masked softmax, sm_90, 176 registers and one block per SM against 58 and four uncapped), except
    in plans with cross reductions (persistent grids sized by the estimate; not re-examined)."""
    dev = space.device
    d = space.derived(s)
    need = estimate_registers(d["reg_cache_elems"], s.vec, 4)
    best = 0
    for m in rule_caps(space):
        if m == 0:
            continue
        budget = min(dev.max_regs_per_thread, dev.regs_per_sm // (s.block * m))
        if budget >= max(64, 1.5 * need) and m * s.block <= dev.max_threads_per_sm:
            best = m
    if best and dev.regs_per_sm // (s.block * best) >= dev.max_regs_per_thread and not space.plan.cross:
        best = 0   # (plans with cross reductions keep it: their grids are sized by the estimate, issue 39 open)
    return Schedule(**{**s.to_dict(), "schemes": s.schemes, "reuse": s.reuse, "min_blocks": best})


def _row(space: SearchSpace, plan: StitchPlan, dev: Device) -> Schedule:
    M, N = plan.M, plan.N
    vec = _vec(space, N)
    wave = max_resident_blocks(dev, 1024, 32, 0) or dev.sm_count  # assume 32 regs, 1024 threads
    if plan.family == Family.ELEMENTWISE:
        return _elementwise(space, plan, dev, vec)
    if M < wave and N > 1024 and not plan.cross:  # task splitting
        tpr = block = 1024
        split = max(1, min(max(space.domains["split"]), _pow2_floor(wave / M)))
        split = min(split, math.ceil(N / (tpr * vec)))  # every block keeps a piece of the row
        split = _pow2_floor(split)
        schemes = (SchemeName.GLOBAL if split > 1 else SchemeName.REGIONAL,) * plan.nstages
        return Schedule(tpr, block, split, vec, PERSISTENT if split > 1 else 1, 0, schemes, ())
    tpr = min(1024, max(4, _pow2_ceil(N / (vec * 8))))
    block = max(tpr, 256)
    scheme = SchemeName.LOCAL if tpr <= 32 else SchemeName.REGIONAL
    # cross reductions (column sums, losses): a persistent grid keeps the per-block partials few
    tasks = PERSISTENT if plan.cross else 1
    return Schedule(tpr, block, 1, vec, tasks, 0, (scheme,) * plan.nstages, ())


def _elementwise(space: SearchSpace, plan: StitchPlan, dev: Device, vec: int) -> Schedule:
    """Rule 2 for element-wise regions: about 8 vectors of a row per thread (``tpr`` the power of two, at
    most 1024), short rows packed into 256-thread blocks (a 64-float row: 16 threads, 16 rows a block, no
    idle lanes), then ``tpr`` doubled while the grid is under two waves of such blocks and a thread still
    has a vector of its own; a region still too small for two blocks per SM gets smaller blocks (down to
    one row or one warp). A region reading an input along its rows (``plan.adjacent_rows = G``) gets at
    least ``G`` rows a block (``tpr`` at most ``block / G``), so that its warps can span ``G`` rows."""
    block = 256 if 256 in space.domains["block"] else max(space.domains["block"])
    vectors = math.ceil(plan.N / vec)
    tpr = min(1024, _pow2_ceil(vectors / 8))
    wave = max_resident_blocks(dev, block, 32, 0) or dev.sm_count
    while tpr < min(1024, _pow2_ceil(vectors)) and math.ceil(plan.M / max(1, block // tpr)) < 2 * wave:
        tpr *= 2
    # a small region: smaller blocks until there are two per SM (or a block is one row / one warp)
    while block > max(tpr, 32) and math.ceil(plan.M / max(1, block // tpr)) < 2 * dev.sm_count:
        block //= 2
    G = plan.adjacent_rows   # an input read along the rows: G rows a warp (plan.adjacent), so G rows a block
    if G > 1 and block // max(tpr, 1) < G and block % G == 0 and block // G >= dev.warp_size // G:
        tpr = block // G
    return Schedule(tpr, max(block, tpr), 1, vec, 1, 0, (), ())


def _register_budget(dev: Device) -> int:
    """Registers per thread at :data:`TARGET_OCCUPANCY` (rule 6)."""
    return min(dev.max_regs_per_thread, int(dev.regs_per_sm // (TARGET_OCCUPANCY * dev.max_threads_per_sm)))


def _row_registers(plan: StitchPlan, threads: int, vec: int) -> int:
    """The estimated registers per thread of a row held by ``threads`` threads, every reuse candidate
    cached in registers (at least one row piece: a graph without candidates still holds its loads)."""
    per_thread = math.ceil(plan.N / (threads * vec)) * vec
    return estimate_registers(per_thread * max(1, len(plan.reuse_candidates)), vec, 4)


def _cluster_row(space: SearchSpace, plan: StitchPlan, dev: Device, block: int = 512) -> Schedule | None:
    """Rule 6: the cluster schedule of a row too wide for one block's registers, or None (the row fits,
    or the space offers no cluster). Blocks of ``block`` threads (512: a middle choice; the cost model's
    preference among 128..1024 differs between layernorm_wide, logsoftmax and softmax_wide, and its
    cluster constants are guesses), the smallest cluster that brings one cached tensor to <= 64 floats per
    thread (rule 4's register budget), else the largest."""
    if plan.family != Family.ROW or not plan.nstages or space.max_cluster <= 1 or plan.cross:  # cross: split 1
        return None
    vec = _vec(space, plan.N)
    if 1024 not in space.domains["block"] or _row_registers(plan, 1024, vec) <= _register_budget(dev):
        return None
    if 4 * plan.N <= dev.smem_per_block_optin:  # one block's shared memory holds the row (rule 4 keeps it there)
        return None
    sizes = [c for c in space.domains["split"] if 2 <= c <= min(space.max_cluster, math.ceil(plan.N / (block * vec)))]
    if not sizes:
        return None
    cache = math.ceil(plan.N / (block * vec)) * vec  # floats per thread of one cached tensor, one block
    c = next((c for c in sizes if cache / c <= 64), max(sizes))
    base = Schedule(block, block, c, vec, 1, 0, (SchemeName.CLUSTER,) * plan.nstages, (), cluster=c)
    return _fit_one_block(space, _reuse(space, _with_reuse(plan, base)))


def _uncached(plan: StitchPlan) -> tuple[ReuseLevel, ...]:
    """Every reuse candidate kept nowhere: inputs re-read, intermediates recomputed."""
    inputs = set(plan.input_names)
    return tuple(uncached_level(c in inputs) for c in plan.reuse_candidates)


def _with_reuse(plan: StitchPlan, s: Schedule) -> Schedule:
    """``s`` with every reuse candidate re-read (inputs) or recomputed (intermediates)."""
    return Schedule(**{**s.to_dict(), "schemes": s.schemes, "reuse": _uncached(plan)})


def _demoted(plan: StitchPlan, s: Schedule) -> Schedule | None:
    """``s`` with its last cached tensor one level down (registers -> shared -> re-read / recompute), or
    None when nothing is cached."""
    levels = list(s.reuse)
    idx = next((i for i in reversed(range(len(levels))) if levels[i] in (ReuseLevel.REGISTER, ReuseLevel.SHARED)),
               None)
    if idx is None:
        return None
    is_input = plan.reuse_candidates[idx] in set(plan.input_names)
    levels[idx] = ReuseLevel.SHARED if levels[idx] == ReuseLevel.REGISTER else uncached_level(is_input)
    return Schedule(**{**s.to_dict(), "schemes": s.schemes, "reuse": tuple(levels)})


def _fit_one_block(space: SearchSpace, s: Schedule) -> Schedule:
    """Demote reuse levels (registers -> shared -> re-read / recompute), last tensor first, until a block
    with the estimated registers fits on an SM (rule 6)."""
    while _estimated_blocks_per_sm(space, s) < 1:
        demoted = _demoted(space.plan, s)
        if demoted is None:
            break
        s = demoted
    return s


def _col(space: SearchSpace, plan: StitchPlan, dev: Device) -> Schedule:
    M, N = plan.M, plan.N
    vec = _vec(space, N)
    while vec > 1 and 8 * vec > N:  # a tile of at least 8 column threads must fit the columns
        vec //= 2
    tk = min(8, _pow2_floor(M))  # threads down the rows: no more than there are rows
    tpc = max(8, min(32, _pow2_floor(N / vec)))
    if _read_across_rows(plan):   # a warp over 4 adjacent rows of 8 column threads (rule 2)
        tk, tpc = min(32, _pow2_floor(M)), 8
    block = tk * tpc
    tiles = math.ceil(N / (tpc * vec))
    wave = max_resident_blocks(dev, block, 32, 0) or dev.sm_count
    split = max(1, min(max(space.domains["split"]), _pow2_floor(wave / tiles), _pow2_floor(M / tk)))
    schemes = (SchemeName.GLOBAL if split > 1 else SchemeName.REGIONAL,) * plan.nstages
    return Schedule(tk, block, split, vec, PERSISTENT if split > 1 else 1, 0, schemes, ())


def _read_across_rows(plan: StitchPlan) -> bool:
    """Whether a full-size input of a column plan is read at a column stride of 8 elements or more (one
    32-byte sector per float32 element of a warp's lanes along the columns)."""
    maps, cls = dict(plan.index_maps), dict(plan.classes)
    return any(cls.get(n) is TensorClass.FULL and (m := maps.get(n)) is not None and m.cols.factors
               and m.cols.factors[-1].stride >= 8 for n in plan.input_names)


def _coresident(space: SearchSpace, s: Schedule) -> bool:
    """Whether a grid of ``split`` blocks (one row or tile at a time) fits on the device at once."""
    return _estimated_blocks_per_sm(space, s) * int(space.device.sm_count) >= s.split


def _pinned_need(space: SearchSpace, s: Schedule) -> int:
    """Registers per thread that a grid-barrier kernel with a register cache needs to stay clear of
    spills: the estimate with the cache counted twice (ptxas holds the cached values and the loads that
    fill them live together: GPT-2's training column sum ``view_41``, 4096 x 3072 with five inputs,
    caching 64 floats per thread, is estimated at 120 registers, takes 234 without a cap and spills 2
    instructions under the 128 of two blocks per SM; sm_90 cubin, CPU static analysis)."""
    d = space.derived(s)
    cache = int(d["reg_cache_elems"])
    return estimate_registers(cache, s.vec, 4) + cache


def _without_pinned_spills(space: SearchSpace, s: Schedule) -> Schedule:
    """Rule 5c: a grid-barrier schedule is pinned to its estimated blocks per SM (:func:`_pin_coresidency`),
    which caps ptxas at ``regs_per_sm / (block * blocks)`` registers; register caches are demoted (last
    first, registers -> shared -> re-read / recompute) while that cap is below :func:`_pinned_need`, so that
    the cap does not turn the cache into local-memory spills. A point that is then illegal or no longer
    co-resident keeps ``s``."""
    dev = space.device
    t = s
    while int(space.derived(t)["reg_cache_elems"]) > 0:
        per_sm = max(1, _estimated_blocks_per_sm(space, t))
        if min(dev.max_regs_per_thread, dev.regs_per_sm // (t.block * per_sm)) >= _pinned_need(space, t):
            break
        demoted = _demoted(space.plan, t)
        if demoted is None:
            break
        t = demoted
    if t is s or space.violations(t) or not _coresident(space, t):
        return s
    return t


def _one_round(space: SearchSpace, plan: StitchPlan, s: Schedule) -> Schedule:
    """Rule 5d: a column grid-barrier schedule whose tasks (tiles x ``split``) exceed the co-resident grid
    (the estimated blocks per SM, rounded down to whole splits as the lowering sizes it) has its split
    halved, down to 2, until one round holds them; ``s`` where no split does or the result is illegal."""
    if plan.family != Family.COL or not _grid_barrier(space, s):
        return s
    tiles = math.ceil(plan.N / (s.block // s.tpr * s.vec))

    def one_round(t: Schedule) -> bool:
        cap = _estimated_blocks_per_sm(space, t) * int(space.device.sm_count)
        return tiles * t.split <= (cap // t.split) * t.split

    t = s
    while t.split > 2 and not one_round(t):
        t = dataclasses.replace(t, split=t.split // 2)
    # kept only where it reaches one round (a register cache grows with the rows of a smaller split)
    return t if t is not s and one_round(t) and not space.violations(t) else s


def heuristic_schedule(plan: StitchPlan, device: Device, space: SearchSpace | None = None) -> Schedule:
    """The AStitch default schedule for ``plan`` on ``device`` (always a legal point of the space)."""
    space = space or SearchSpace.for_plan(plan, device)
    clustered = _cluster_row(space, plan, device)
    if clustered is not None:
        return _checked(space, _relax_registers(space, clustered))
    base = _col(space, plan, device) if plan.family == Family.COL else _row(space, plan, device)
    s = _reuse(space, with_elementwise_row_vectors(space, plan, with_row_vectors(space, plan, _with_reuse(plan, base))))
    # global stitching needs a co-resident grid: demote reuse levels (registers -> shared -> re-read)
    # one tensor at a time until it is, and fall back to independent kernels when nothing helps
    if _grid_barrier(space, s):
        while not _coresident(space, s):
            demoted = _demoted(plan, s)
            if demoted is None:
                s = Schedule(**{**s.to_dict(), "reuse": s.reuse,
                                "schemes": tuple(SchemeName.INDEPENDENT if space.schemes[x].grid_barrier else x
                                                 for x in s.schemes)})
                break
            s = demoted
    if _grid_barrier(space, s):
        s = _without_pinned_spills(space, s)
    s = _relax_registers(space, s)
    s = one_wave(space, plan, s, _grid_barrier(space, s))
    s = tail_free(space, plan, s, _grid_barrier(space, s))
    s = _one_round(space, plan, s)
    if _grid_barrier(space, s):
        s = _pin_coresidency(space, s)
    if plan.cross and plan.family == Family.ROW and plan.M <= s.block // min(s.tpr, s.block) and s.split == 1:
        # every row in one block: its partials are the totals, summed after a (one-block) grid barrier
        # in the same kernel rather than by a second launch
        s = dataclasses.replace(s, cross_combine=CrossCombine.GRID)  # type: ignore[call-arg]  # an option (Schedule docs)
    if plan.cross and plan.scatters and s.option(CROSS_COMBINE) != CrossCombine.GRID:
        # rule 7: a scatter's table is zeroed behind the grid combine's barrier (lower/scatter.py): one
        # launch where kernel makes three (zero fill, main, combine); float atomics either way
        g = dataclasses.replace(s, cross_combine=CrossCombine.GRID)  # type: ignore[call-arg]
        if not space.violations(g):
            # its persistent grid (sized by the estimated registers) must stay co-resident: rules 5c and the pin
            s = _pin_coresidency(space, _without_pinned_spills(space, g))
    if plan.transpose is not None and "transpose" in space.table:
        s = _tiled_transpose(space, plan, s, device)
    if "row_vectors" in space.table and s.option(ROW_VECTORS) and space.violations(s):
        s = dataclasses.replace(s, row_vectors=False)  # type: ignore[call-arg]  # (a later rule left no whole row groups)
    return _checked(space, s)


def _tiled_transpose(space: SearchSpace, plan: StitchPlan, s: Schedule, device: Device) -> Schedule:
    """Rule 8: an element-wise region with transposed outputs (``plan.transpose``) stores them through
    a shared-memory tile of 256-thread blocks, one tile per block: the largest edge (64 with 16-byte
    accesses where the vector width is 4 or more and both the view's columns and the transposed axis
    reach 64, else 32) whose grid, at the lowering's register estimate and shared memory
    (:func:`~stitchtune.lower.transpose.transpose_launch`), keeps the audit's wave criterion
    (:func:`~stitchtune.cost.waves.waves_ready`); 32 where none does; ``s`` itself where that point is not legal."""
    tile = plan.transpose
    assert tile is not None
    block = 256 if 256 in space.domains["block"] else max(space.domains["block"])
    edges = [64, 32] if s.vec >= 4 and plan.N >= 64 and tile.dim >= 64 else [32]
    fallback = s
    for edge in edges:
        vec = s.vec
        while vec > 1 and edge * edge < block * vec:
            vec //= 2
        t = dataclasses.replace(s, tpr=block, block=block, vec=vec, split=1, tasks_per_block=1,
                                transpose=edge)  # type: ignore[call-arg]  # an option (Schedule docs)
        if space.violations(t):
            continue
        tasks, regs, smem = transpose_launch(plan, t)
        cap = max(1, max_resident_blocks(device, block, regs, smem) // device.sm_count) * device.sm_count
        if waves_ready(tasks / cap, tasks, device.sm_count):
            return t
        fallback = t
    return fallback


def _grid_barrier(space: SearchSpace, s: Schedule) -> bool:
    """Whether a stage of ``s`` has a scheme with a grid barrier (its grid must be co-resident)."""
    return space.schemes.any(s.schemes, lambda sc: sc.grid_barrier)


def _checked(space: SearchSpace, s: Schedule) -> Schedule:
    """``s`` if legal, else (never expected) a sampled legal schedule, with a warning."""
    problems = space.violations(s)
    if problems:  # never expected; keep the tool usable and say so
        log.warning("heuristic schedule %s is illegal (%s); using a sampled legal schedule", s, "; ".join(problems))
        s = space.sample(random.Random(0))
    return s


def generic_heuristic(fit: Any, device: Device, space: SearchSpace | None = None, candidates: int = 32) -> Schedule:
    """The heuristic schedule of a dynamic graph's bucket (``fit``: a
    :class:`~stitchtune.lower.dynamic.RowFit`) on its representative plan when the generic kernel accepts
    it; else the one of lowest predicted time (cost model, at the bucket's largest extents) among the
    accepted ones of: the heuristic without the single pass, with vector width 1, their variants (one
    option away) and ``candidates`` seeded samples of the space (a dynamic row length refuses vector
    widths, splits and single passes its extents do not allow). ``ScheduleError`` when none is accepted."""
    from stitchtune.cost.model import predict
    from stitchtune.errors import ScheduleError
    from stitchtune.lower.dynamic import check_schedule, lower_dynamic

    space = space or SearchSpace.for_plan(fit.plan, device)
    h = heuristic_schedule(fit.plan, device, space)
    if check_schedule(fit, h) is None:
        return h
    tries = [dataclasses.replace(h, single_pass=0)]  # type: ignore[call-arg]  # an option (Schedule docs)
    tries.append(dataclasses.replace(tries[-1], vec=1))
    tries += [v for t in tries if not space.violations(t) for v in space.variants(t)]
    rng = random.Random(0)
    tries += [space.sample(rng) for _ in range(candidates)]
    best: tuple[float, Schedule] | None = None
    for s in dict.fromkeys(tries):
        if space.violations(s) or check_schedule(fit, s) is not None:
            continue
        prog = lower_dynamic(fit, s, device, space)
        if isinstance(prog, Schedule) or not hasattr(prog, "profile"):
            continue
        pred = predict(prog.profile, device)
        if pred.prune_reason is None and (best is None or pred.time_us < best[0]):
            best = (pred.time_us, s)
    if best is None:
        raise ScheduleError(f"no schedule of the space runs generically for bucket {fit.key.label()}")
    return best[1]
