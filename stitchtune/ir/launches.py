"""The program-level records of the kernel IR: global buffers, launches and the launches' cost profiles.

Frozen dataclasses (``BufferRole`` a string enum) that :class:`stitchtune.ir.kir.Program` holds besides
its kernels; :mod:`stitchtune.ir.kir` re-exports every name (``kir.BufferSpec``, ``kir.KernelProfile``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from stitchtune.graph.dynamic import SymInt
from stitchtune.graph.values import ITEMSIZE as ELEM_BYTES


class BufferRole(StrEnum):
    """What a global buffer of a program holds (``BufferSpec.role``, ``Param.role``)."""

    INPUT = "input"       # a graph input
    OUTPUT = "output"     # a graph output
    SCRATCH = "scratch"   # partials, per-row values, flags between kernels or blocks
    BARRIER = "barrier"   # the grid barrier's counters


@dataclass(frozen=True)
class BufferSpec:
    """A global buffer of a program. ``tensor`` is the graph tensor it holds ('' for scratch)."""

    name: str
    dtype: str
    size: int
    role: str  # a BufferRole: input | output | scratch | barrier
    tensor: str = ""
    zero_init: bool = False

    @property
    def nbytes(self) -> int:
        return self.size * (4 if self.role == "barrier" else ELEM_BYTES[self.dtype])

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "size": self.size, "role": self.role,
                "tensor": self.tensor, "zero_init": self.zero_init}


@dataclass(frozen=True)
class Launch:
    """One kernel launch: ``kernel<<<grid, block, smem_bytes>>>(*args)``; args are buffer names."""

    kernel: str
    grid: int
    block: int
    smem_bytes: int
    args: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "grid": self.grid, "block": self.block,
                "smem_bytes": self.smem_bytes, "args": list(self.args)}


@dataclass(frozen=True)
class KernelProfile:
    """What the cost model needs to know about one launch: counted in the kernel's IR (its sweeps'
    reads and operations, barriers, scratch loads: :mod:`stitchtune.lower.counts`) and sized through
    the plan by the lowering (:func:`stitchtune.lower.profile.kernel_profile`)."""

    name: str
    grid: int
    block: int
    smem_bytes: int
    est_registers: int
    dram_read_bytes: int
    dram_write_bytes: int
    reread_bytes: int
    reread_working_set: int
    flops: int
    sfu_ops: int
    block_barriers: int
    grid_barriers: int
    #: atomic instructions per launch (one per thread per ``AtomicAdd`` executed): a ``float2`` / ``float4``
    #: add counts once, as one L2 request of up to 16 bytes, as the IR walk's ``atomics`` feature counts them
    #: (:mod:`stitchtune.cost.features`); the committed GPU data has scalar adds only, so what a vector add
    #: costs beside a scalar one is an assumption (cost model item 5)
    atomics: int
    bytes_in_flight_per_thread: int
    #: loads of scratch (partials / per-row values written earlier in the launch or by an earlier
    #: kernel) one thread issues per launch, summed over its rounds and loops (see the cost model's
    #: scratch chain; default 0: profiles stored before this field existed)
    scratch_loads: int = 0
    #: the re-reads run opposite to the read before them (schedule order ``alternate``), so they start
    #: with what that read left in L2 (default False: forward, and profiles stored before the field)
    reversed_rereads: bool = False
    #: the most float atomic adds one address receives in this launch (they serialise at the L2:
    #: the per-block adds of a cross reduction's column or scalar; default 0: none, and profiles
    #: stored before the field existed)
    atomic_serial: int = 0
    #: thread-block clusters (the ``cluster`` scheme): blocks per cluster, cluster barriers one block
    #: passes and remote (distributed) shared-memory loads one thread issues per launch (defaults:
    #: no cluster, and profiles stored before these fields existed)
    cluster: int = 1
    cluster_barriers: int = 0
    dsmem_loads: int = 0
    #: integer divisions / remainders by a runtime value (a generic kernel's extents, the grid size) one
    #: thread executes per launch: a constant divisor compiles to a multiply-shift, a runtime one to a
    #: ~20-instruction sequence (default 0: static kernels, and profiles stored before the field)
    runtime_divs: int = 0


@dataclass(frozen=True)
class LaunchShape:
    """The resources of one launch, all the device's limits judge (a kernel's block, shared memory,
    registers per thread, grid, whether it has a grid barrier, blocks per cluster): what
    ``lower.resources`` computes before any kernel body is built, equal to the same fields of the
    :class:`KernelProfile` the lowering produces (``grid_barrier``: its ``grid_barriers > 0``)."""

    name: str
    block: int
    smem_bytes: int
    registers: int
    grid: int
    grid_barrier: bool
    cluster: int = 1

    @classmethod
    def of(cls, k: KernelProfile) -> "LaunchShape":
        """The shape of a lowered kernel's profile (its estimated registers)."""
        return cls(k.name, k.block, k.smem_bytes, k.est_registers, k.grid, k.grid_barriers > 0, k.cluster)


@dataclass(frozen=True)
class ProgramProfile:
    kernels: tuple[KernelProfile, ...]
    min_bytes: int


def grid_size(tasks: int, tasks_per_block: int, persistent: bool, needs_sync: bool, multiple: int,
              cores: int) -> int:
    """Blocks of a kernel with ``tasks`` tasks: as many as are co-resident (``cores``, a persistent
    schedule), else ``tasks / tasks_per_block``. A grid that must stay co-resident (persistent, or with
    a grid barrier) is rounded *down* to a multiple of ``multiple`` (the blocks of one split row; at
    least one such multiple), any other one up; at least 1, at most 2**31 - 1."""
    if persistent or needs_sync:
        grid = min(tasks, max(cores, 1)) if persistent else -(-tasks // tasks_per_block)
        if multiple > 1:
            grid = max(multiple, (grid // multiple) * multiple)
    else:
        grid = -(-tasks // tasks_per_block)
        if multiple > 1:
            grid = -(-grid // multiple) * multiple
    return max(1, min(grid, 2**31 - 1))


@dataclass(frozen=True)
class GridRule:
    """How a generic launch's grid follows the extents: ``rows`` view rows (a monomial of the extents),
    ``rows_per_block`` rows per task (split 1) or ``split`` tasks per row, then :func:`grid_size`."""

    rows: SymInt
    rows_per_block: int
    split: int
    tasks_per_block: int
    persistent: bool
    needs_sync: bool
    multiple: int
    cores: int
    fixed: int = 0   # > 0: the grid does not follow the extents (a small combine kernel)

    def tasks(self, extents: dict[str, int]) -> int:
        m = self.rows.value(extents)
        return -(-m // self.rows_per_block) if self.split == 1 else m * self.split

    def grid(self, extents: dict[str, int]) -> int:
        if self.fixed:
            return self.fixed
        return grid_size(self.tasks(extents), self.tasks_per_block, self.persistent, self.needs_sync,
                         self.multiple, self.cores)


@dataclass(frozen=True)
class DynamicInfo:
    """What a generic program needs at launch: ``dims`` (graph dim names, sorted) and the kernel
    argument of each (``args``, generated identifiers ``ext0``...); the size of each buffer whose size
    follows the extents (others keep ``BufferSpec.size``); one :class:`GridRule` per launch; the
    ``planned`` extents (``BufferSpec.size`` and ``Launch.grid`` are theirs)."""

    dims: tuple[str, ...]
    args: tuple[str, ...]
    sizes: tuple[tuple[str, SymInt], ...]
    grids: tuple[GridRule, ...]
    #: the extents the program was planned and its buffers sized at (each dim at its bucket's largest):
    #: what a launch without explicit extents runs at (the tuning worker, the emulate runner)
    planned: tuple[tuple[str, int], ...] = ()

    def arg_values(self, extents: dict[str, int]) -> tuple[int, ...]:
        """The ``int`` arguments of every kernel, in order."""
        return tuple(int(extents[d]) for d in self.dims)

    def size(self, buffer: str, default: int, extents: dict[str, int]) -> int:
        for name, sym in self.sizes:
            if name == buffer:
                return sym.value(extents)
        return default

    def grid(self, launch: int, extents: dict[str, int]) -> int:
        return self.grids[launch].grid(extents)
