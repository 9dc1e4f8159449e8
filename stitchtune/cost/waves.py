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
where that grid is one full wave (:data:`FULL_WAVE` of the resident capacity, the audit's criterion) and
the last sweep's live floats fit (:data:`LIVE_SHARE`); where the first sweep's (embedding tables) do not
but the register estimate alone fits the cap's budget, a one-output plan takes the halved row uncapped
(under the cap ptxas hoisted the tables' loads and spilled).
Else the cap is taken at 3/4 of the estimate as before (the estimate counts every hoisted load live
at once; ptxas staggers them), and the audit checks the outcome (spills, waves) from the cubin.

Rule 5e (:func:`tail_free`): a row grid that rule 5b leaves strictly between one and two waves (blocks per
SM from the register estimate and the cap, shared memory included) takes two tasks per block, so that its
grid is at most one wave (every block resident at once, no tail wave) where that grid still has a block on
every SM and its first sweep's loads keep Little's law's bytes in flight per SM (the device's bandwidth x
:data:`DRAM_LATENCY_NS` over its SMs). The embedding backwards of GPT-2 and BERT at batch 8 x 512 (4096 x
768, 32 threads per row, 8 rows a block, estimated 104 registers, ptxas 114 / 120 uncapped: 2 blocks per
SM) were 512 blocks, 1.94 waves; two tasks per block make 256 blocks, and BERT's private token-type table is
flushed by half as many blocks. The halved grid takes the register cap that holds it in one wave (2 blocks
per SM: 128 registers, covering the estimate), so that ptxas cannot undo the wave: uncapped, the two-task
kernel of examples/embed_add_layernorm (estimated 88 registers, ptxas 63 with one task) took 132 registers
and 1 block per SM, 1.94 waves again; capped, 128 and no spill (sm_90). Not a tighter cap alone: 4 blocks
per SM (64 registers) spill 127-202 instructions in the embedding backwards; nor smaller blocks: the
resident threads, and so the waves, are bound by the registers whatever the block.

:func:`waves_ready`: the audit's wave criterion (docs/audit.md, 6), the one test of both the audit
(:mod:`stitchtune.analysis.audit`) and heuristic rule 8's tile choice.
"""

from __future__ import annotations

import dataclasses
import math

from stitchtune.cost.grid_pin import estimated_blocks_per_sm, rule_caps
from stitchtune.graph.values import ITEMSIZE
from stitchtune.lower.entry import estimate_registers
from stitchtune.plan.classes import TensorClass
from stitchtune.plan.family import Family
from stitchtune.plan.planner import StitchPlan
from stitchtune.space import ReuseLevel, SchemeName, Schedule, SearchSpace

#: a single wave counts as full from this share of the resident capacity (docs/audit.md, criterion 6)
FULL_WAVE = 0.95
#: rule 4's register-cache budget: floats per thread a halved row may cache
MAX_REG_CACHE = 64
#: the most blocks per SM rule 5b asks for
MAX_WAVE_BLOCKS = 4
#: a halved row is capped only while the floats live in its last sweep (the cached row piece and one piece
#: per per-column input, gamma / beta; an embedding table is read by the first) stay within this share of the cap's budget: ptxas staggers the
#: parameters' loads, but not without limit (sm_90, 128-register cap: Llama's RMS norm, 64 cached + 64 of
#: one weight, and GPT-2's layer norms, 48 + 2 x 48, compile without a spill; examples/embed_add_layernorm,
#: 64 + 2 x 64, spills 4 bytes)
LIVE_SHARE = 1.25
#: rule 5e's assumed loaded DRAM latency (Little's law: the audit's criterion 7, docs/audit.md)
DRAM_LATENCY_NS = 700.0


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
    fits = [m for m in rule_caps(space) if m >= need and m * s.block <= dev.max_threads_per_sm]
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
    thread, give a thread no vector of its own, not fill one wave, or hold more floats in its last sweep
    than :data:`LIVE_SHARE` of the budget (:func:`_live_floats`). Where its first sweep's embedding tables
    overflow that share but the register estimate fits the budget, a one-output plan's halved row uncapped
    (under the cap ptxas hoists the tables' loads into the spare registers and spills)."""
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
    last, first = _live_floats(space, plan, c)
    budget = min(space.device.max_regs_per_thread, space.device.regs_per_sm // (c.block * c.min_blocks))
    if last > LIVE_SHARE * budget:
        return None
    if first <= LIVE_SHARE * budget or len(plan.output_names) != 1 or _estimate(space, t) > budget:
        return c
    return c if space.violations(t) else t


def _live_floats(space: SearchSpace, plan: StitchPlan, s: Schedule) -> tuple[int, int]:
    """The floats a thread of ``s`` holds at once in its last sweep (the register cache and a row piece per
    per-column float input: gamma, beta) and in its first (the cache and a row piece per embedding table,
    :func:`embedding_tables`, whose loads are issued together before the sum that consumes them). BERT's
    region_expand_1 (three tables and a layer norm, one output, 16 threads per row): 128 registers under the
    cap and 4 spill instructions, uncapped 103 for an estimate of 104 and no spill (sm_90); its training
    step's twin (also storing the sum, the mean and rstd) took 149 uncapped (1.94 waves) and compiled without
    a spill under the cap, which it keeps."""
    piece = math.ceil(plan.N / (s.tpr * s.vec)) * s.vec   # floats of a row one thread holds
    floats = {n for n, d in plan.dtypes if d.startswith(("float", "bfloat"))}
    tables = embedding_tables(plan)
    params = sum(plan.cls(n) is TensorClass.PER_REDUCED and n in floats and n not in tables
                 for n in last_sweep_inputs(plan, s))
    cache = int(space.derived(s)["reg_cache_elems"])
    return cache + params * piece, cache + len(tables) * piece


def last_sweep_inputs(plan: StitchPlan, s: Schedule) -> set[str]:
    """The inputs of ``plan`` that a thread of ``s`` still reads after the first sweep: those an output
    depends on through values not kept on chip (a reuse candidate at a cached level stops the walk: the
    later sweep reads it from registers or shared memory). A linear layer's bias added before a layer
    norm's statistics (the backend adds it in the region: importers/torch_bias.py) is read by the first
    sweep only when the sum it feeds is cached."""
    cached = {c for c, lvl in zip(plan.reuse_candidates, s.reuse) if ReuseLevel(lvl).cached}
    args = {name: a for name, _, a in plan.dataflow}
    inputs = set(plan.input_names)
    found: set[str] = set()
    seen: set[str] = set()
    stack = [o for o in plan.output_names if o not in cached]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in inputs:
            found.add(n)
        stack += [a for a in args.get(n, ()) if a not in cached]
    return found


def embedding_tables(plan: StitchPlan) -> set[str]:
    """The embedding tables of ``plan``: inputs read with an integer per-row index (a gather, planned as its
    surrogate, a node of the table and the index); the first sweep reads them, not the last."""
    dtypes = dict(plan.dtypes)
    idx = {n for n in plan.input_names if plan.cls(n) is TensorClass.PER_KEPT and dtypes.get(n, "").startswith("int")}
    return {a for _, _, args in plan.dataflow if set(args) & idx for a in args if a not in idx}


def one_wave(space: SearchSpace, plan: StitchPlan, s: Schedule, grid_barrier: bool) -> Schedule:
    """Rule 5b (module docstring) for a row-family grid of one task per block without a grid barrier
    (``grid_barrier``: whether ``s`` has one); ``s`` itself where it does not apply."""
    if plan.family != Family.ROW or plan.cross or s.split != 1 or s.tasks_per_block != 1 or grid_barrier:
        return s
    return _capped(space, plan, s, 1.0) or _halved(space, plan, s) or _capped(space, plan, s, 0.75) or s


def first_sweep_bytes(plan: StitchPlan, s: Schedule) -> int:
    """Bytes of global loads one thread of ``s`` issues in its first sweep: its row piece of every full-size
    input, each at its dtype's size (a bfloat16 row piece is half a float32 one; the per-column and per-row
    inputs are a few words)."""
    piece = math.ceil(plan.N / (s.tpr * s.vec)) * s.vec
    full = [n for n in plan.input_names if plan.cls(n) is TensorClass.FULL]
    return piece * sum(ITEMSIZE.get(plan.dtype(n), 4) for n in full)


def tail_free(space: SearchSpace, plan: StitchPlan, s: Schedule, grid_barrier: bool) -> Schedule:
    """Rule 5e (module docstring): ``s`` with two tasks per block and ``min_blocks`` = the fewest blocks per SM
    (a choice of the space) that hold the halved grid in one wave, where its row grid of one task per block is
    strictly between one and two waves (:func:`~stitchtune.cost.grid_pin.estimated_blocks_per_sm`, capped), the cap's register budget covers the
    estimate, the halved grid keeps a block on every SM, and ``bandwidth x DRAM_LATENCY_NS / SMs`` bytes of
    first-sweep loads are in flight per SM (:func:`first_sweep_bytes` x the block's threads x the grid's
    average blocks per SM); ``s`` itself otherwise (other families, cross reductions, split rows, several
    tasks per block already, a grid barrier, or an illegal point)."""
    if plan.family != Family.ROW or plan.cross or s.split != 1 or s.tasks_per_block != 1 or grid_barrier:
        return s
    dev = space.device
    per_sm = estimated_blocks_per_sm(space, s, capped=True)
    wave = per_sm * dev.sm_count
    grid = _grid(plan, s)
    if per_sm < 1 or not wave < grid < 2 * wave:
        return s
    halved = math.ceil(grid / 2)
    need = math.ceil(halved / dev.sm_count)
    if halved < dev.sm_count:
        return s
    t = dataclasses.replace(s, tasks_per_block=2)
    estimate = _estimate(space, t)
    caps = [m for m in rule_caps(space) if m >= max(need, s.min_blocks) and m * s.block <= dev.max_threads_per_sm
            and min(dev.max_regs_per_thread, dev.regs_per_sm // (s.block * m)) >= estimate]
    if not caps:
        return s
    t = dataclasses.replace(t, min_blocks=min(caps))
    if space.violations(t) or estimated_blocks_per_sm(space, t, capped=True) * dev.sm_count < halved:
        return s
    needed = dev.dram_bandwidth_gbs * DRAM_LATENCY_NS / dev.sm_count   # GB/s x ns = bytes
    in_flight = first_sweep_bytes(plan, t) * t.block * halved / dev.sm_count
    return t if in_flight >= needed else s


#: the audit's least number of waves of a grid of more than one wave (docs/audit.md, criterion 6)
MIN_WAVES = 2.0


def waves_ready(waves: float, grid: int, sm_count: int, min_waves: float = MIN_WAVES) -> bool:
    """The wave criterion for a ``grid`` of blocks making ``waves`` waves on ``sm_count`` SMs: at least
    ``min_waves`` waves, or at most one wave (every block resident at once) with a block on every SM."""
    return waves >= min_waves or (waves <= 1.0 and grid >= sm_count)
