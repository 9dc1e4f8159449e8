"""A numpy lockstep SIMT emulator of the kernel IR (:mod:`stitchtune.ir.kir`).

Contract
--------
:func:`emulate_kernel` runs one launch of a :class:`~stitchtune.ir.kir.Kernel` in place on named numpy
buffers; :func:`emulate_program` allocates a :class:`~stitchtune.ir.kir.Program`'s buffers, runs its
launches in order and returns its outputs. A bug in a generated kernel raises :class:`EmulatorFault`
(``kind`` + message naming kernel, statement, buffer, element, block and thread); a malformed IR
(unknown variable, bad types) raises ``ValueError``.

Execution model
---------------
All ``T = grid * block`` threads of a launch run in lockstep as numpy arrays of length ``T``
(thread ``t``: ``bid = t // block``, ``tid = t % block``). Variables are ``[T]`` arrays (f32 ->
float32, i32 -> int32, bool); local arrays are ``[T, size]`` float32. Control flow carries an
active mask: ``If`` splits it, ``For`` loops while an active thread has ``var < stop`` (the body
runs under ``mask & (var < stop)``; a thread that leaves never comes back), ``Select``, ``&&`` and
``||`` evaluate their lazy operand only where C would (so loads in them behave as in C).

Memory checks (each one an :class:`EmulatorFault` kind):

* ``out_of_bounds``: an active access outside the buffer (global: ``Param.size``; shared:
  ``SharedBuf.size`` per block; local arrays: their size), or a launch with less dynamic shared
  memory than the kernel's shared buffers;
* ``uninitialized_read``: a load (or atomic) of a global / shared element nothing wrote;
* ``bad_alignment``: a vector access whose index is not a multiple of its width, or wider than 16 B
  (also for shared buffers, as kir states, although the renderer splits those into scalar accesses);
* ``shared_race``: within one barrier interval, a shared element written by one thread and read or
  written by another thread of the same block;
* ``global_race``: within one grid-sync interval of a launch, a global element written by one block
  and read or written by another block (atomic adds from several blocks do not race each other;
  an atomic add races with a plain read or write from another block);
* ``divergent_barrier``: ``Barrier`` reached by some but not all threads of a block, ``GridSync``
  reached by some but not all threads of the launch;
* ``inactive_shuffle``: ``Shfl`` executed by some but not all lanes of a warp;
* ``grid_not_coresident``: ``GridSync`` executed with ``grid > coresident_limit``;
* ``cluster_out_of_range``: a remote shared-memory access (``RemoteLoad`` / ``RemoteStore``) to a
  rank outside the block's cluster;
* ``cluster_race``: a remote access before the cluster's first ``ClusterSync``; a shared element
  accessed by two blocks of a cluster (local or remote, one of them a write) without a
  ``ClusterSync`` in between (a read before the cluster barrier); a remote access after the last
  ``ClusterSync`` of the kernel (the owning block may have exited);
* ``cluster_not_resident``: a cluster kernel launched with a grid that is not a multiple of its
  cluster size, or whose cluster cannot be resident (``cluster_limit`` 0, the clusters the device
  holds at once; see :func:`stitchtune.hardware.occupancy.max_active_clusters`).

Also ``global_race``: one store statement in which two threads write the same global element (the
lost update of a non-atomic accumulation by several threads of one block).

Block order: lockstep lanes run every statement for all blocks at once, so the only results that
depend on the order in which blocks run are those of float atomic adds to one address. By default
those are applied in thread order; with ``block_order_seed`` the blocks' adds to each address are
applied in a seeded random order of the blocks (a fresh one per launch), so that an order-dependent
result shows up as different bits across seeds, while a deterministic schedule's outputs stay
bitwise equal.

Arithmetic: floats are float32 (C's ``fminf``/``fmaxf``/``fmodf`` for min/max/%), integers int32 with C
truncating division and remainder, mixed int/float operands promote to float32 as in C. Graph
operators (:class:`~stitchtune.ir.kir.MathOp`) use ``stitchtune.graph.ops.OPS[name].np_fn`` on float32
arrays. Int registers (i32 / i64) hold int buffers' elements at their width (raw loads; stores to
int32/int64 outputs), and :class:`~stitchtune.ir.kir.IntOp` computes with wrapping numpy ints at that
width (``stitchtune.graph.int_ops.int_np``). float16 / bfloat16 buffers are widened to float32 on load and rounded to nearest even on
store (``np.float16`` / ``ml_dtypes.bfloat16``), like ``__float2half_rn`` / ``__float2bfloat16_rn``.
``bool`` buffers (``numpy.bool_``, inputs only) load as 0.0 / 1.0.
Variables start at zero (the renderer declares them ``= 0`` at the top of the kernel); local arrays
are not initialised in CUDA, so here they start as NaN and a missing initialisation shows in the
output.

Modules
-------
This module is the public API (:func:`emulate_kernel`, :func:`emulate_program`, and re-exported
:class:`EmulatorFault`, :data:`FAULT_KINDS`, :data:`NP_ELEM`, :func:`elem_dtype`). The launch state,
memory checks and race trackers are in :mod:`stitchtune.emulate.memory`; the compilation of IR trees
into closures is in :mod:`stitchtune.emulate.translate`.
"""

from __future__ import annotations

import dataclasses

import logging
from collections.abc import Callable

import numpy as np

from stitchtune.emulate.translate import _compiled
from stitchtune.emulate.trace import AccessSink, MemoryAccess
from stitchtune.emulate.memory import (
    FAULT_KINDS,
    NP_ELEM,
    EmulatorFault,
    _State,
    elem_dtype,
)
from stitchtune.ir.kir import Kernel, Program

log = logging.getLogger(__name__)

__all__ = ["FAULT_KINDS", "NP_ELEM", "AccessSink", "EmulatorFault", "MemoryAccess", "elem_dtype", "emulate_kernel", "emulate_program"]


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------


def emulate_kernel(kernel: Kernel, grid: int, buffers: dict[str, np.ndarray], *,
                   written: dict[str, np.ndarray] | None = None,
                   coresident_limit: int | None = None, cluster_limit: int | None = None,
                   block_order_seed: int | None = None, extents: dict[str, int] | None = None,
                   trace: AccessSink | None = None, blocks: int | None = None) -> None:
    """Run one launch ``kernel<<<grid, kernel.block>>>`` in place on ``buffers``.

    ``buffers`` maps each parameter name to a 1-D numpy array of the parameter's element type
    (:func:`elem_dtype`) with at least ``Param.size`` elements. ``written[name]`` (optional, bool,
    same length) says which elements hold data; loads of other elements fault, and stores set it
    (updated in place). A missing entry means fully written. ``coresident_limit``: the most blocks
    that can be co-resident; a ``GridSync`` in a larger grid raises ``grid_not_coresident``.
    ``cluster_limit`` (cluster kernels): the clusters that can be resident at once; 0 raises
    ``cluster_not_resident`` (None: not checked). ``block_order_seed``: apply atomic adds in a seeded
    random order of the blocks (see the module docstring). ``extents``: a generic kernel's ``int``
    arguments by name (exactly ``kernel.extents``); its buffers may then be smaller than ``Param.size``
    and every access is checked against the buffer given. ``trace`` (default None: off, no
    cost): a sink (a list, or anything with ``append``) that receives a frozen
    :class:`~stitchtune.emulate.trace.MemoryAccess` per global and shared access statement executed,
    with the statement's path (:mod:`stitchtune.emulate.sectors` counts 32-byte sectors per warp
    request in it; :mod:`stitchtune.analysis.sectors` also bank wavefronts).
    ``blocks`` (optional, ``1 <= blocks <= grid``): emulate only blocks ``0 .. blocks - 1`` of the
    ``grid``-block launch (``gridDim.x`` is still ``grid``): a slice whose per-warp accesses are the
    full launch's, for audits of launches too large to emulate whole. Other blocks' writes never
    happen, so a slice is for addresses, not results (pass no ``written`` to read anything).
    Raises :class:`EmulatorFault` on a kernel bug (buffers are then partly updated).
    """
    if grid < 1 or grid * kernel.block >= 2**31:
        raise ValueError(f"grid {grid} x block {kernel.block} is not an emulable launch")
    if blocks is not None and not 1 <= blocks <= grid:
        raise ValueError(f"blocks {blocks} is not a slice of a grid of {grid}")
    _check_cluster_launch(kernel, grid, cluster_limit)
    ck = _compiled(kernel)
    run = grid if blocks is None else blocks
    st = _State(ck, run, buffers, written or {}, coresident_limit, extents, gdim=grid, trace=trace)
    if block_order_seed is not None:
        st.block_rank = np.random.default_rng(block_order_seed).permutation(grid).astype(np.int32)
    with np.errstate(all="ignore"):
        ck.body(st, st.full)
    if st.remote_pending:
        raise EmulatorFault("cluster_race", f"kernel {kernel.name}: distributed shared memory accessed after "
                            "the last cluster barrier (the owning block may exit while it is read)")


def _check_cluster_launch(kernel: Kernel, grid: int, cluster_limit: int | None) -> None:
    """A cluster launch needs a grid that is a multiple of the cluster and a cluster that fits."""
    if kernel.cluster <= 1:
        return
    if grid % kernel.cluster:
        raise EmulatorFault("cluster_not_resident", f"kernel {kernel.name}: grid {grid} is not a multiple of its "
                            f"cluster of {kernel.cluster} blocks")
    if cluster_limit is not None and cluster_limit < 1:
        raise EmulatorFault("cluster_not_resident", f"kernel {kernel.name}: a cluster of {kernel.cluster} blocks "
                            f"of {kernel.block} threads and {kernel.smem_bytes} B of shared memory cannot be "
                            "resident on one GPC of the device")


def emulate_program(program: Program, inputs: dict[str, np.ndarray], *,
                    coresident_limit: Callable[[Kernel], int] | None = None,
                    cluster_limit: Callable[[Kernel], int] | None = None,
                    scratch_out: dict[str, np.ndarray] | None = None,
                    block_order_seed: int | None = None,
                    extents: dict[str, int] | None = None,
                    trace: AccessSink | None = None) -> dict[str, np.ndarray]:
    """Run every launch of ``program`` on fresh buffers; return ``{output tensor: flat array}``.

    Inputs are taken from ``inputs`` by ``BufferSpec.tensor`` (any shape, flattened in C order and
    converted to the buffer dtype). Outputs start as NaN and unwritten; scratch buffers with
    ``zero_init`` start as zeros (written), others as NaN (unwritten); barrier buffers are zeroed
    uint32. ``cluster_limit(kernel)``: the clusters of a cluster kernel the device holds at once
    (None: not checked). Returned arrays are 1-D in the buffer dtype (the caller reshapes to the graph shape).
    ``scratch_out``, when given, receives a copy of every scratch buffer after the last launch (the
    error flags of gathers among them, see :func:`stitchtune.lower.gather.gather_flag_buffers`).
    ``block_order_seed``: launch ``i`` runs its atomic adds in the block order of seed
    ``(block_order_seed, i)`` (see the module docstring).
    ``extents`` (a generic program, ``program.dynamic``; by graph dim name; default its planned extents):
    buffers sized and grids computed for them (:class:`~stitchtune.ir.launches.DynamicInfo`), the kernels given them as arguments.
    ``trace``: receives the accesses of every launch (see :func:`emulate_kernel`).
    """
    dyn = program.dynamic
    if dyn is None and extents is not None:
        raise ValueError("extents are given only for a generic program (program.dynamic)")
    if dyn is not None and extents is None:
        extents = dict(dyn.planned)
    kargs: dict[str, int] = {}
    if dyn is not None and extents is not None:
        kargs = dict(zip(dyn.args, dyn.arg_values(dict(extents))))
    arrays: dict[str, np.ndarray] = {}
    written: dict[str, np.ndarray] = {}
    for b in program.buffers:
        if dyn is not None and extents is not None:
            b = dataclasses.replace(b, size=dyn.size(b.name, b.size, dict(extents)))
        dt = elem_dtype(b.dtype, b.role)
        if b.role == "input":
            if b.tensor not in inputs:
                raise ValueError(f"no input for tensor {b.tensor!r} (buffer {b.name})")
            src = np.asarray(inputs[b.tensor]).ravel()
            if src.size != b.size:
                raise ValueError(f"input {b.tensor!r} has {src.size} elements, buffer {b.name} {b.size}")
            arrays[b.name] = src.astype(dt)
            written[b.name] = np.ones(b.size, bool)
        elif b.role == "barrier" or (b.role == "scratch" and b.zero_init):
            arrays[b.name] = np.zeros(b.size, dt)
            written[b.name] = np.ones(b.size, bool)
        elif b.role in ("output", "scratch"):
            fill = np.iinfo(dt).min if dt.kind == "i" else np.nan  # int outputs: a sentinel, never NaN
            arrays[b.name] = np.full(b.size, fill, dt if dt.kind == "i" else np.float32).astype(dt)
            written[b.name] = np.zeros(b.size, bool)
        else:
            raise ValueError(f"buffer {b.name} has unknown role {b.role!r}")
    for i, launch in enumerate(program.launches):
        kernel = program.kernel(launch.kernel)
        if launch.block != kernel.block:
            raise ValueError(f"launch {i} of {kernel.name}: block {launch.block} != kernel block {kernel.block}")
        if launch.smem_bytes < kernel.smem_bytes:
            raise EmulatorFault("out_of_bounds", f"launch {i} of {kernel.name}: {launch.smem_bytes} B of dynamic "
                                f"shared memory for {kernel.smem_bytes} B of shared buffers")
        if len(launch.args) != len(kernel.params):
            raise ValueError(f"launch {i} of {kernel.name}: {len(launch.args)} args for "
                             f"{len(kernel.params)} parameters")
        kb = {p.name: arrays[a] for p, a in zip(kernel.params, launch.args)}
        kw = {p.name: written[a] for p, a in zip(kernel.params, launch.args)}
        limit = coresident_limit(kernel) if coresident_limit is not None else None
        log.debug("emulating launch %d: %s<<<%d, %d>>>", i, kernel.name, launch.grid, launch.block)
        climit = cluster_limit(kernel) if cluster_limit is not None and kernel.cluster > 1 else None
        seed = None if block_order_seed is None else hash((int(block_order_seed), i)) & 0x7FFFFFFF
        grid = launch.grid if dyn is None or extents is None else dyn.grid(i, dict(extents))
        emulate_kernel(kernel, grid, kb, written=kw, coresident_limit=limit, cluster_limit=climit,
                       block_order_seed=seed, extents={x: kargs[x] for x in kernel.extents} or None, trace=trace)
    if scratch_out is not None:
        scratch_out.update({b.name: arrays[b.name].copy() for b in program.buffers if b.role == "scratch"})
    return {b.tensor: arrays[b.name].copy() for b in program.buffers if b.role == "output"}
