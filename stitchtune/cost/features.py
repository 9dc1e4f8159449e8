"""Cost features of a lowered program, derived from its kernel IR (not from a lowering's hand-kept stats).

Contract
--------
* :func:`kernel_features(kernel, grid, device, registers=None, extents=None) -> KernelFeatures` walks one
  kernel of the IR for one launch of ``grid`` blocks; :func:`program_features(program, device,
  registers=None) -> tuple[KernelFeatures, ...]` does it for every launch of a program, in launch order.
  Both are pure, never raise for a well-formed program, and cost milliseconds (the IR is walked once,
  each loop body once, the index expressions evaluated for the threads of one block with numpy).
* The walk does not depend on registers or the device: :func:`kernel_walk` / :func:`program_walk`
  return it (:class:`KernelWalk`, :class:`ProgramWalk`), whose ``features(device, registers)`` adds
  the register-dependent part (occupancy, blocks per SM, waves). :func:`program_walk` is memoised by
  program identity (the last :data:`WALK_MEMO_SIZE` programs), so a search candidate predicted before
  its build, after it and by the emulate runner is walked once.
* ``registers`` maps kernel name -> ptxas registers; without it, the program profile's
  ``est_registers`` (program_features) or 32 (kernel_features) decide the occupancy.

How the features are read from the IR
-------------------------------------
* **Evaluation**: the statements are walked once in order for the ``block`` threads of block 0 (numpy
  arrays over the threads); a loop's variable takes its first value and the loop's body is walked once,
  weighted by its trip count (``(stop - start) / step``, from constant or thread-invariant bounds; a
  bound that cannot be evaluated counts one trip and is counted in ``unknown_trips``). A loop whose
  bounds read the block index (a grid-stride loop, a block's range of tasks) takes its mean trip count
  over every block (:mod:`stitchtune.cost.walk_blocks`), so that block 0 does not stand for the last
  blocks' shorter ranges; an ``If`` on the block index is still block 0's. Values read
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
  have in flight together: a group ends at a barrier, a branch (``If``), the
  start or end of a rolled (not unrolled) loop (one iteration's loads per group; with
  :data:`stitchtune.cost.walk_loops.UNROLL_ROLLED`, off as shipped, the iterations nvcc unrolls of a loop of
  independent loads, :func:`~stitchtune.cost.walk_loops.rolled_unroll`), and before a load
  whose index or predicate depends on a load of the current group (a chain; a value stored to shared
  memory and loaded back carries the dependence). A shared-memory store does not end a group (nvcc
  issues later global loads above it: they cannot alias), but the iterations of an unrolled loop whose
  body stores to shared memory are groups of their own (sm_90 SASS keeps one such iteration's loads in
  flight, not the loop's: results/cost-fit-2026-12-07-s13-walk). Other unrolled loops are expanded
  into one group. ``bytes_in_flight_per_thread`` is the bytes-weighted mean group size; ``loads_in_flight``
  the same in loads; ``chained_loads`` counts the loads that waited on a load. ``load_rounds`` is the
  number of groups a thread issues one after another (each weighted by its trips): the DRAM round
  trips of a thread (a rolled row loop of one load per iteration: its trip count); ``serial_rounds``
  leaves out the rounds of rolled loops whose body has no barrier and no shuffle (nvcc unrolls such a
  loop and its iterations' loads overlap): the rounds on a block's serial chain.
* **Shared memory**: ``smem_requests`` (warp-level shared accesses, trip-weighted, per thread block)
  and ``smem_wavefronts`` (the same counted in conflict-free passes: per 8/16/32-lane phase of a
  128/64/32-bit access, the most distinct 4-byte words one bank serves); ``bank_conflict`` is their
  ratio to the ideal. ``smem_dead_bytes``: shared buffers stored to and never loaded.
* **Arithmetic per thread** (trip-weighted, scaled by the active share of the block): float divisions
  (``div``, ``reciprocal``, ``sigmoid``, ``silu`` and float ``/``), transcendentals (``exp``, ``log``,
  ``tanh``, ``erf``, ``gelu``, ``pow``, ``sin``, ``cos``, ``sqrt``, ``rsqrt``, ...), other float ops.
* **Launch**: ``grid``, ``block``, ``blocks_per_sm`` and ``occupancy`` (:mod:`stitchtune.hardware.occupancy`
  with the device's limits), ``waves = grid / (blocks_per_sm x SMs)``; ``barriers`` per thread;
  ``grid_barriers``: grid-wide barriers per thread; ``shuffles``: warp shuffles per thread; ``load_phases``: barrier-separated parts of a thread's program that issue global loads (at low
  occupancy they cannot overlap, each waits for DRAM).
* **Tasks**: ``task_trips`` is the trip count of the one top-level loop that holds every global access (a
  persistent grid's or a block's task loop), else 1 (:func:`stitchtune.cost.walk_loops.task_trips`).
* **Bytes**: ``unique_bytes`` are the sizes of the parameters the kernel reads or writes, each counted
  once (the DRAM floor of the launch), a parameter counted at most at the bytes its accesses
  request (a gathered table: the rows read).
* **Scratch and atomics**: ``scratch_loads`` counts a thread's loads of scratch parameters that the
  same kernel also writes (partials exchanged between the blocks of one launch) or that every lane of
  a warp reads at the same few words (a row's partials combined by all its threads, from an earlier
  kernel): the cost model's scratch chain (a scratch array read once per thread, coalesced, is not).
  ``l2_requests`` counts the warp-level requests of every scratch load per block (trip-weighted): scratch
  loads bypass L1 (``__ldcg``), so each request is served by the L2, whose request rate per SM limits
  a kernel whose threads combine many partials (a warp reading one broadcast word is one request).
  ``atomics`` counts atomic instructions per thread (a ``float4`` add once, as ``KernelProfile.atomics``),
  except error flags (a constant added under a branch or predicate that depends on data: they almost
  never run).
* **Compiled facts** (not from the IR): ``compiled_bytes_in_flight`` and ``spill_instructions`` are 0
  here; :func:`stitchtune.cost.compiled.with_compiled` sets them from a kernel's SASS when it was built
  (:class:`~stitchtune.cost.compiled.CompiledFacts`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from stitchtune.cost.ir_walk import DIVISION_OPS, TRANSCENDENTAL_OPS, Walker
from stitchtune.cost.walk_loops import UNROLL_BYTES
from stitchtune.hardware.device import Device
from stitchtune.hardware.occupancy import launch_refusal
from stitchtune.ir import kir

__all__ = ["KernelFeatures", "KernelWalk", "ProgramWalk", "kernel_features", "kernel_walk", "program_features",
           "program_walk", "floor_us", "DIVISION_OPS", "UNROLL_BYTES",
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
    load_rounds: float = 0.0        # per thread: load groups one after another (trip-weighted): DRAM round trips
    serial_rounds: float = 0.0      # per thread: the load rounds outside rolled loops free of barriers and shuffles
    shuffles: float = 0.0           # per thread: warp shuffles (trip-weighted)
    l2_requests: float = 0.0        # per block: warp-level requests of scratch loads (trip-weighted)
    task_trips: float = 1.0         # a block's tasks: trips of the top-level loop holding every global access (else 1)
    compiled_bytes_in_flight: float = 0.0   # per thread, read from the compiled code (0: not compiled; cost.compiled)
    spill_instructions: float = 0.0         # LDL + STL in the compiled code (0 also when not compiled)
    per_access: tuple[tuple[str, str, float, float], ...] = field(default=())  # (buffer, kind, trips, sector factor)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        return asdict(self)


# ------------------------------------------------------------------------------------------ evaluation
@dataclass(frozen=True)
class KernelWalk:
    """The register-independent features of one launch: everything the IR walk counts. ``base`` is a
    :class:`KernelFeatures` whose ``registers``, ``blocks_per_sm``, ``occupancy`` and ``waves`` are 0;
    :meth:`features` fills them in for a register count (cheap: one occupancy calculation)."""

    base: KernelFeatures
    uses_grid_sync: bool = False
    cluster: int = 1

    def features(self, device: Device, registers: int | None = None) -> KernelFeatures:
        """The launch's features with ``registers`` per thread (default 32) on ``device``."""
        b = self.base
        regs = int(registers if registers is not None else 32)
        occ, _ = launch_refusal(device, b.block, regs, b.smem_bytes, b.grid, self.uses_grid_sync, self.cluster)
        bps = max(occ.blocks_per_sm, 1)
        return replace(b, registers=regs, blocks_per_sm=occ.blocks_per_sm, occupancy=occ.occupancy,
                       waves=b.grid / (bps * device.sm_count))


def kernel_walk(kernel: kir.Kernel, grid: int, extents: Mapping[str, int] | None = None) -> KernelWalk:
    """The IR walk of one launch of ``kernel`` with ``grid`` blocks (module docstring); no device or
    register count needed."""
    w = Walker(kernel, grid, extents)
    w.walk(kernel.body, np.ones(kernel.block, bool), 1.0)
    w.close_group()
    if w.phase_has_load:
        w.load_phases += 1.0
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
    base = KernelFeatures(
        name=kernel.name, grid=int(grid), block=kernel.block, registers=0, smem_bytes=kernel.smem_bytes,
        blocks_per_sm=0, occupancy=0.0, waves=0.0,
        unique_bytes=int(unique), requested_bytes=w.requested, sector_bytes=w.sector_bytes,
        sector_factor=w.sector_bytes / w.ideal_bytes if w.ideal_bytes else 1.0, excess_sector_bytes=w.excess_bytes,
        global_requests=w.requests, active_lanes=w.lanes / w.requests if w.requests else 1.0,
        bytes_in_flight_per_thread=bif, loads_in_flight=lif, chained_loads=w.chained,
        smem_requests=w.smem_req, smem_wavefronts=w.smem_wave,
        bank_conflict=w.smem_wave / w.smem_ideal if w.smem_ideal else 1.0, smem_dead_bytes=dead,
        divisions=w.div, transcendentals=w.trans, float_ops=w.flops, barriers=w.barriers,
        load_phases=w.load_phases, atomics=w.atomics, scratch_loads=scratch_loads,
        grid_barriers=w.grid_syncs, unknown_indexes=w.unknown_idx,
        unknown_trips=w.unknown_trips, load_rounds=sum(wt for _, _, wt in w.groups),
        serial_rounds=sum(wt for (_, _, wt), p in zip(w.groups, w.pipelined) if not p), shuffles=w.shuffles,
        l2_requests=w.l2_requests, task_trips=w.task_trips(),
        per_access=tuple(w.per_access))
    return KernelWalk(base, bool(kernel.uses_grid_sync), int(kernel.cluster))


def kernel_features(kernel: kir.Kernel, grid: int, device: Device, registers: int | None = None,
                    extents: Mapping[str, int] | None = None) -> KernelFeatures:
    """IR-derived features of one launch of ``kernel`` with ``grid`` blocks (module docstring)."""
    return kernel_walk(kernel, grid, extents).features(device, registers)


@dataclass(frozen=True)
class ProgramWalk:
    """The register-independent features of every launch of a program, in launch order, and the
    program profile's register estimates (the count used for a kernel ``registers`` does not name)."""

    launches: tuple[KernelWalk, ...]
    est_registers: Mapping[str, int] = field(default_factory=dict)

    def features(self, device: Device, registers: Mapping[str, int] | None = None) -> tuple[KernelFeatures, ...]:
        """:class:`KernelFeatures` of every launch with ``registers`` (kernel name -> ptxas registers)."""
        regs = registers or {}
        return tuple(kw.features(device, regs.get(kw.base.name, self.est_registers.get(kw.base.name)))
                     for kw in self.launches)


_WALKS: OrderedDict[int, tuple[kir.Program, ProgramWalk]] = OrderedDict()
_WALKS_LOCK = threading.Lock()
#: programs whose walk is kept (by identity): a search candidate is predicted up to three times
#: (the pipeline before and after its build, the emulate runner), a batch holds a few dozen
WALK_MEMO_SIZE = 64


def program_walk(program: kir.Program) -> ProgramWalk:
    """The walk of every launch of ``program`` (a generic program at its planned extents). Memoised by
    the program object's identity (a :class:`~stitchtune.ir.kir.Program` is frozen), for the last
    :data:`WALK_MEMO_SIZE` programs: predicting one program again with other registers re-walks nothing."""
    with _WALKS_LOCK:
        hit = _WALKS.get(id(program))
        if hit is not None and hit[0] is program:
            _WALKS.move_to_end(id(program))
            return hit[1]
    extents = dict(program.dynamic.planned) if program.dynamic is not None else None
    walk = ProgramWalk(tuple(kernel_walk(program.kernel(l.kernel), l.grid, extents) for l in program.launches),
                       {k.name: k.est_registers for k in program.profile.kernels})
    with _WALKS_LOCK:
        _WALKS[id(program)] = (program, walk)   # the program is held: its id cannot be reused meanwhile
        while len(_WALKS) > WALK_MEMO_SIZE:
            _WALKS.popitem(last=False)
    return walk


def program_features(program: kir.Program, device: Device,
                     registers: Mapping[str, int] | None = None) -> tuple[KernelFeatures, ...]:
    """:func:`kernel_features` of every launch of ``program``, in launch order (a generic program at
    its planned extents); the IR walk is :func:`program_walk`'s (memoised)."""
    return program_walk(program).features(device, registers)


def floor_us(features: tuple[KernelFeatures, ...], device: Device) -> float:
    """The DRAM floor of the launches (µs): their unique bytes at the device's copy bandwidth."""
    return sum(f.unique_bytes for f in features) / device.effective_copy_bandwidth_gbs() / 1000.0
