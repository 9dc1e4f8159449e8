"""Lowering of row reductions and element-wise graphs (``plan.family`` row or elementwise): the program.

Thread mapping: ``tpr`` threads per row, ``block // tpr`` rows per block, ``split`` blocks per row.
Thread ``lane = tid % tpr`` handles the ``vec``-wide vectors ``k = kbase + (i * tpr + lane) * vec`` for
``i < per_thread / vec``. Schemes and the round structure: see :mod:`stitchtune.lower.entry`.

:class:`RowLowerer` sizes the program, cuts it into kernels at the kernel boundaries of the stages'
schemes and builds each kernel through a :class:`~stitchtune.lower.row_kernel.RowKernel`; the small
kernels of the cross reductions' combine come last (:mod:`stitchtune.lower.cross`).
"""

from __future__ import annotations

import math

from stitchtune.hardware.device import Device
from stitchtune.ir import kir
from stitchtune.ir.launches import LaunchShape
from stitchtune.graph.parse import Graph
from stitchtune.lower import single_pass as sp
from stitchtune.lower.base import Lowerer, Sizes, estimate_registers
from stitchtune.lower.liveness import kernel_levels, merged_levels, node_args, row_sweeps
from stitchtune.lower.cross import SMALL_KERNEL_REGISTERS, combine_kernel, small_profile, zero_kernel
from stitchtune.lower.row_kernel import RowKernel
from stitchtune.lower.row_layout import row_layout
from stitchtune.lower.row_vectors import elementwise_rows
from stitchtune.lower.symbols import RowSymbols
from stitchtune.plan.planner import StitchPlan, TensorClass
from stitchtune.plan.lane_shifts import loads_with
from stitchtune.space.options import elementwise_row_vector_registers
from stitchtune.space import (CROSS_COMBINE, PREFETCH, SCHEMES, SINGLE_PASS, CrossCombine, ReuseLevel, Schedule,
                              SchemeTable, row_chunk, uncached_level)


class RowLowerer(Lowerer):
    """Row reductions (and pure element-wise graphs)."""

    def __init__(self, graph: Graph, plan: StitchPlan, s: Schedule, device: Device, schemes: SchemeTable = SCHEMES,
                 sym: RowSymbols | None = None) -> None:
        merged = {c.stage: c for c in plan.single_pass} if s.option(SINGLE_PASS) else {}
        #: view rows a thread takes per sweep iteration (element-wise row vectors, lower/row_vectors.py)
        self.rows = elementwise_rows(plan, s, sym is not None)
        super().__init__(graph, plan, s, device, row_sizes(plan, s, self.rows), schemes, sym, merged)
        #: the program's tasks, estimated registers per thread and stages per kernel (:meth:`_size`)
        self.n_tasks, self.est_regs, self.segs = self._size()

    def lower(self) -> kir.Program:
        tasks, est, segs = self.n_tasks, self.est_regs, self.segs
        block = self.s.block
        kernels, launches, profiles = [], [], []
        for ki, seg in enumerate(segs):
            is_last = ki == len(segs) - 1
            k, prof = self.build_kernel(ki, seg, is_last, tasks, est)
            kernels.append(k)
            launches.append(kir.Launch(k.name, prof.grid, block, k.smem_bytes, tuple(pp.name for pp in k.params)))
            profiles.append(prof)
        if self.p.cross:
            self.cross_kernels(kernels, launches, profiles)
        profile = kir.ProgramProfile(tuple(profiles), self.g.min_bytes())
        return kir.Program(tuple(kernels), tuple(self.buffers), tuple(launches), profile, self.single_pass_notes())

    def _size(self) -> tuple[int, int, list[list[int]]]:
        """Size the program before any kernel is built (once, by the constructor): (tasks, estimated
        registers per thread, the stages of each kernel); sets the kernels' reuse levels (the sizes,
        :func:`row_sizes`, and the merged single-pass stages came with the constructor)."""
        p, s = self.p, self.s
        M = p.M
        if self.merged:  # tensors only the output sweep reads now: computed (or read) there, not cached
            for c in sp.single_sweep_candidates(self.g, p):
                self.reuse[c] = uncached_level(c in self.in_buf)
        segs = self.kernel_segments() if p.nstages else [[]]
        # caches no later sweep reads (a later tensor of the chain is cached): never filled
        args = node_args(self.nodes)
        sweeps = row_sweeps(p, args, self.g.outputs, segs, self.merged)
        self.kernel_reuse = kernel_levels(p, args, self.reuse, sweeps)
        self.reuse = merged_levels(self.kernel_reuse, self.reuse)
        S, vec, rpb = s.split, s.vec, self.rpb
        tasks = math.ceil(M / rpb) if S == 1 else M * S
        n_reg = sum(1 for r in self.reuse.values() if r == ReuseLevel.REGISTER)
        n_pf = sum(1 for n, c in p.classes if c is TensorClass.FULL and n in self.in_buf) if s.option(PREFETCH) else 0
        n_pf += sum(1 for c in p.cross if c.kind == "per_reduced")  # the cross accumulators
        est = estimate_registers(self.per_thread * (n_reg + n_pf), vec, 4)
        # the loads of an unrolled sweep are live with the accumulators (the register caches they fill are not,
        # yet): never estimated past one block per SM, since ptxas keeps a block within an SM
        loads = estimate_registers(self.per_thread * (max(n_reg, hoisted_inputs(p, s, self.iters)) + n_pf), vec, 4)
        est = max(est, min(loads, self.dev.max_regs_per_thread, self.dev.regs_per_sm // s.block))
        if self.rows > 1:   # the other rows' values of each row-vector load, loaded with the first row's
            est += elementwise_row_vector_registers(self.rows, vec, loads_with(p.vector_loads, p.vector_visits,
                                                                               s.tpr, vec, self.dev.warp_size))
        if s.min_blocks:  # __launch_bounds__ caps what ptxas may use
            est = min(est, self.dev.regs_per_sm // (s.block * s.min_blocks))
        return tasks, est, segs

    def resources(self) -> tuple[LaunchShape, ...]:
        """The launch shape of every kernel :meth:`lower` would build, in launch order, from the same
        layouts (:func:`~stitchtune.lower.row_layout.row_layout`) without building kernel bodies."""
        tasks, est, segs = self.n_tasks, self.est_regs, self.segs
        out = []
        for ki, seg in enumerate(segs):
            lay = row_layout(self, ki, seg, tasks, est, ki == len(segs) - 1)
            out.append(LaunchShape(f"st_k{ki}", self.s.block, lay.smem_bytes, est, lay.grid, lay.needs_sync,
                                   lay.cluster))
        if self.p.cross and self.s.option(CROSS_COMBINE) != CrossCombine.GRID:
            atomic = self.s.option(CROSS_COMBINE) == CrossCombine.ATOMIC
            k, grid = zero_kernel(self) if atomic else combine_kernel(self, out[-1].grid)
            small = LaunchShape(k.name, k.block, k.smem_bytes, SMALL_KERNEL_REGISTERS, grid, False, 1)
            out.insert(0, small) if atomic else out.append(small)
        return tuple(out)

    def single_pass_notes(self) -> tuple[str, ...]:
        """One line per merged stage pair (what the profile's fewer bytes come from)."""
        return tuple(f"single pass: stages {c.stage + 1} and {c.stage + 2} ({c.first}, {c.second}) in one sweep "
                     f"({'Welford' if c.kind == 'welford' else 'online softmax'}), scheme {self.s.schemes[c.stage]}"
                     for c in self.merged.values())

    def kernel_segments(self) -> list[list[int]]:
        """Stages (0-based) per kernel: a new kernel starts after each independent stage (after the
        second stage of a merged pair whose first stage is independent)."""
        segs: list[list[int]] = [[]]
        for i in range(self.p.nstages):
            segs[-1].append(i)
            if self.stage_scheme(i).kernel_boundary and i not in self.merged:
                segs.append([])
        return segs

    def build_kernel(self, ki: int, seg: list[int], is_last: bool, tasks: int,
                     est_regs: int) -> tuple[kir.Kernel, kir.KernelProfile]:
        """Kernel ``ki``: the stages ``seg`` (0-based), then the outputs when it is the last one."""
        k = RowKernel(self, ki, seg, tasks, est_regs, is_last)
        k.read_earlier_stages()
        for st in seg:
            if not self.merged_second(st):
                k.reduce_stage(st, keep_results=not is_last)
        if is_last:
            k.write_outputs()
        return k.finish()

    def cross_kernels(self, kernels: list[kir.Kernel], launches: list[kir.Launch],
                      profiles: list[kir.KernelProfile]) -> None:
        """The small kernels of the cross-block combine: the zeroing kernel before the others
        (``cross_combine`` atomic) or the kernel that sums the partials after them (``kernel``)."""
        mode, parts = self.s.option(CROSS_COMBINE), profiles[-1].grid
        if mode == CrossCombine.GRID:
            return
        k, grid = zero_kernel(self) if mode == CrossCombine.ATOMIC else combine_kernel(self, parts)
        at = 0 if mode == CrossCombine.ATOMIC else len(kernels)
        kernels.insert(at, k)
        launches.insert(at, kir.Launch(k.name, grid, k.block, k.smem_bytes, tuple(pp.name for pp in k.params)))
        profiles.insert(at, small_profile(self, k, grid, parts))


def hoisted_inputs(plan: StitchPlan, s: Schedule, iters: int) -> int:
    """Row pieces of loads a thread of a persistent row kernel with cross reductions holds at once: its
    full-size inputs (one piece each) where a sweep is unrolled (``iters`` <= 8), since ptxas issues all of
    an unrolled sweep's loads before their first use; 0 for other plans (their grids are not sized by the
    estimate). They are live with the cross accumulators, not with the register caches (filled later):
    the estimate counts the larger of the two (softmax_colsum, one input and one cache: 120, ptxas 91). The estimate sizes the persistent grid (:meth:`Lowerer.grid_for`): without these pieces
    BERT's layer-norm backward (``region_view_50``, 32 threads per row, three full inputs of 24 floats a
    thread, three column sums) was estimated at 128 registers, two blocks per SM, 264 blocks, and compiled
    to 253: one block per SM, two waves and twice the partial rows (sm_90, CPU static analysis)."""
    if not plan.cross or s.split != 1 or not s.persistent or iters > 8:
        return 0
    return sum(1 for n, c in plan.classes if c is TensorClass.FULL and n in set(plan.input_names))


def row_sizes(plan: StitchPlan, s: Schedule, rows: int = 1) -> Sizes:
    """A row program's sizes: ``block // tpr`` rows per block (times ``rows``, the rows a thread takes: row
    vectors); a block's piece of a row (the row, or one of ``split`` pieces, rounded to whole sweeps:
    :func:`~stitchtune.space.row_chunk`), ``chunk // tpr`` elements per thread in ``chunk // (tpr * vec)``
    iterations."""
    tpr, vec = s.tpr, s.vec
    chunk = row_chunk(plan.N, s.split, tpr, vec)
    return Sizes(s.block // tpr * rows, chunk, chunk // tpr, chunk // (tpr * vec))


def lower_row(graph: Graph, plan: StitchPlan, schedule: Schedule, device: Device,
              schemes: SchemeTable = SCHEMES) -> kir.Program:
    """Lower a row-reduction or element-wise graph (the schedule was already checked against the space
    whose scheme table is ``schemes``)."""
    return RowLowerer(graph, plan, schedule, device, schemes).lower()
