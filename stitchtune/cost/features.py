"""Cost features of a lowered program, derived from its kernel IR (not from a lowering's hand-kept stats).

Contract
--------
* :func:`kernel_features(kernel, grid, device, registers=None, extents=None) -> KernelFeatures` walks one
  kernel of the IR for one launch of ``grid`` blocks; :func:`program_features(program, device,
  registers=None) -> tuple[KernelFeatures, ...]` does it for every launch of a program, in launch order.
  Both are pure, never raise for a well-formed program, and cost milliseconds (the IR is walked once,
  each loop body once, the index expressions evaluated for the threads of one block with numpy).
* ``registers`` maps kernel name -> ptxas registers; without it, the program profile's
  ``est_registers`` (program_features) or 32 (kernel_features) decide the occupancy.

How the features are read from the IR
-------------------------------------
* **Evaluation**: the statements are walked once in order for the ``block`` threads of block 0 (numpy
  arrays over the threads); a loop's variable takes its first value and the loop's body is walked once,
  weighted by its trip count (``(stop - start) / step``, from constant or thread-invariant bounds; a
  bound that cannot be evaluated counts one trip and is counted in ``unknown_trips``). Values read
  from memory (loads, shuffles, local arrays) are unknown; an index or predicate that depends on one
  (a gather) is *unknown* (sector factor 1 assumed, counted in ``unknown_indexes``). An ``If`` whose
  condition is known narrows the active threads of its branches.
* **Global accesses** (loads, vector loads and stores, atomics of kernel parameters): per warp, the
  32-byte sectors its active threads touch against the ideal ``ceil(active x bytes / 32)``;
  ``sector_factor`` is their ratio summed over warps, accesses and trips (1.0 = every byte of every
  sector useful; a 4-byte store per 32-byte sector gives 8; below 1: lanes share sectors, a broadcast).
  ``requested_bytes`` are the bytes the active threads of all blocks ask for (trip-weighted),
  ``sector_bytes`` the sectors' bytes, ``excess_sector_bytes`` the sectors' bytes beyond each
  access's ideal (strided accesses only).
* **Loads in flight**: the global loads one thread issues are cut into groups that the hardware can
  have in flight together: a group ends at a barrier, a shared-memory store, a branch (``If``), the
  start or end of a rolled (not unrolled) loop (of which :data:`ROLLED_UNROLL` iterations' loads
  are taken to be issued together when its body has no other break), and before a load
  whose index or predicate depends on a load of the current group (a chain). Unrolled loops are
  expanded. ``bytes_in_flight_per_thread`` is the bytes-weighted mean group size; ``loads_in_flight``
  the same in loads; ``chained_loads`` counts the loads that waited on a load.
* **Shared memory**: ``smem_requests`` (warp-level shared accesses, trip-weighted, per thread block)
  and ``smem_wavefronts`` (the same counted in conflict-free passes: per 8/16/32-lane phase of a
  128/64/32-bit access, the most distinct 4-byte words one bank serves); ``bank_conflict`` is their
  ratio to the ideal. ``smem_dead_bytes``: shared buffers stored to and never loaded.
* **Arithmetic per thread** (trip-weighted, scaled by the active share of the block): float divisions
  (``div``, ``reciprocal``, ``sigmoid``, ``silu`` and float ``/``), transcendentals (``exp``, ``log``,
  ``tanh``, ``erf``, ``gelu``, ``pow``, ``sin``, ``cos``, ``sqrt``, ``rsqrt``, ...), other float ops.
* **Launch**: ``grid``, ``block``, ``blocks_per_sm`` and ``occupancy`` (:mod:`stitchtune.hardware.occupancy`
  with the device's limits), ``waves = grid / (blocks_per_sm x SMs)``; ``barriers`` per thread;
  ``grid_barriers``: grid-wide barriers per thread; ``load_phases``: barrier-separated parts of a thread's program that issue global loads (at low
  occupancy they cannot overlap, each waits for DRAM).
* **Bytes**: ``unique_bytes`` are the sizes of the parameters the kernel reads or writes, each counted
  once (the DRAM floor of the launch), a parameter counted at most at the bytes its accesses
  request (a gathered table: the rows read).
* **Scratch and atomics**: ``scratch_loads`` counts a thread's loads of scratch parameters that the
  same kernel also writes (partials exchanged between the blocks of one launch) or that every lane of
  a warp reads at the same few words (a row's partials combined by all its threads, from an earlier
  kernel): the cost model's scratch chain (a scratch array read once per thread, coalesced, is not).
  ``atomics`` counts atomics per thread, except error flags (a constant added under a branch or
  predicate that depends on data: they almost never run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from stitchtune.cost.ir_walk import DIVISION_OPS, ROLLED_UNROLL, TRANSCENDENTAL_OPS, Walker
from stitchtune.hardware.device import Device
from stitchtune.hardware.occupancy import launch_refusal
from stitchtune.ir import kir

__all__ = ["KernelFeatures", "kernel_features", "program_features", "floor_us", "DIVISION_OPS", "ROLLED_UNROLL",
           "TRANSCENDENTAL_OPS"]


@dataclass(frozen=True)
class KernelFeatures:
    """IR-derived features of one kernel launch (see the module docstring for each definition)."""

    name: str
    grid: int
    block: int
    registers: int
    smem_bytes: int
    blocks_per_sm: int
    occupancy: float
    waves: float
    unique_bytes: int
    requested_bytes: float
    sector_bytes: float
    sector_factor: float
    excess_sector_bytes: float      # sectors beyond the ideal of their access (strided), all blocks
    global_requests: float          # warp-level global accesses of one block (trip-weighted)
    active_lanes: float             # active share of the lanes of those requests (0..1)
    bytes_in_flight_per_thread: float
    loads_in_flight: float
    chained_loads: float            # per thread
    smem_requests: float            # per block
    smem_wavefronts: float          # per block
    bank_conflict: float
    smem_dead_bytes: int
    divisions: float                # per thread
    transcendentals: float          # per thread
    float_ops: float                # per thread
    barriers: float                 # per thread
    load_phases: float              # per thread
    atomics: float                  # per thread
    scratch_loads: float            # per thread: loads of scratch parameters
    grid_barriers: float            # per thread: grid-wide barriers passed
    unknown_indexes: int
    unknown_trips: int
    per_access: tuple[tuple[str, str, float, float], ...] = field(default=())  # (buffer, kind, trips, sector factor)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        return asdict(self)


# ------------------------------------------------------------------------------------------ evaluation
def kernel_features(kernel: kir.Kernel, grid: int, device: Device, registers: int | None = None,
                    extents: Mapping[str, int] | None = None) -> KernelFeatures:
    """IR-derived features of one launch of ``kernel`` with ``grid`` blocks (module docstring)."""
    w = Walker(kernel, grid, extents)
    w.walk(kernel.body, np.ones(kernel.block, bool), 1.0)
    w.close_group()
    if w.phase_has_load:
        w.load_phases += 1.0
    regs = int(registers if registers is not None else 32)
    occ, _ = launch_refusal(device, kernel.block, regs, kernel.smem_bytes, grid, kernel.uses_grid_sync,
                            kernel.cluster)
    bps = max(occ.blocks_per_sm, 1)
    gbytes = sum(b * wt for b, _, wt in w.groups)
    bif = sum(b * b * wt for b, _, wt in w.groups) / gbytes if gbytes else 0.0
    lif = sum(b * ld * wt for b, ld, wt in w.groups) / gbytes if gbytes else 0.0

    def nbytes(name: str) -> int:
        p = w.params[name]
        size = p.size * (4 if p.role == "barrier" else kir.ELEM_BYTES[p.dtype])
        return int(min(size, w.per_param.get(name, size)))   # a gathered table: the rows read

    scratch_loads = max(w.scratch_shared, sum(t for b, t in w.scratch_by_buf.items() if b in w.written))

    unique = sum(nbytes(b) for b in w.read | w.written)
    dead = 4 * sum(s.size for s in kernel.shared if s.name in w.smem_stored and s.name not in w.smem_loaded)
    return KernelFeatures(
        name=kernel.name, grid=int(grid), block=kernel.block, registers=regs, smem_bytes=kernel.smem_bytes,
        blocks_per_sm=occ.blocks_per_sm, occupancy=occ.occupancy, waves=grid / (bps * device.sm_count),
        unique_bytes=int(unique), requested_bytes=w.requested, sector_bytes=w.sector_bytes,
        sector_factor=w.sector_bytes / w.ideal_bytes if w.ideal_bytes else 1.0, excess_sector_bytes=w.excess_bytes,
        global_requests=w.requests, active_lanes=w.lanes / w.requests if w.requests else 1.0,
        bytes_in_flight_per_thread=bif, loads_in_flight=lif, chained_loads=w.chained,
        smem_requests=w.smem_req, smem_wavefronts=w.smem_wave,
        bank_conflict=w.smem_wave / w.smem_ideal if w.smem_ideal else 1.0, smem_dead_bytes=dead,
        divisions=w.div, transcendentals=w.trans, float_ops=w.flops, barriers=w.barriers,
        load_phases=w.load_phases, atomics=w.atomics, scratch_loads=scratch_loads,
        grid_barriers=w.grid_syncs, unknown_indexes=w.unknown_idx,
        unknown_trips=w.unknown_trips, per_access=tuple(w.per_access))


def program_features(program: kir.Program, device: Device,
                     registers: Mapping[str, int] | None = None) -> tuple[KernelFeatures, ...]:
    """:func:`kernel_features` of every launch of ``program``, in launch order (a generic program at
    its planned extents)."""
    est = {k.name: k.est_registers for k in program.profile.kernels}
    extents = dict(program.dynamic.planned) if program.dynamic is not None else None
    out = []
    for launch in program.launches:
        regs = (registers or {}).get(launch.kernel, est.get(launch.kernel))
        out.append(kernel_features(program.kernel(launch.kernel), launch.grid, device, regs, extents))
    return tuple(out)


def floor_us(features: tuple[KernelFeatures, ...], device: Device) -> float:
    """The DRAM floor of the launches (µs): their unique bytes at the device's copy bandwidth."""
    return sum(f.unique_bytes for f in features) / device.effective_copy_bandwidth_gbs() / 1000.0
