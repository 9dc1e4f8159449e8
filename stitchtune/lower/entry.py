"""Lowering: (Graph, StitchPlan, Schedule, Device) -> :class:`~stitchtune.ir.kir.Program`.

The program is one kernel, or several when a stage's scheme is ``independent`` (a kernel
boundary). Inside a kernel every thread runs the same number of *rounds* (uniform control flow, so
barriers and grid barriers are always reached by everyone); a round gives each block one task
(a group of rows / a row piece / a column tile). Within a task the thread sweeps its elements once
per reduction stage and once more to write the outputs; full-size tensors that several sweeps read
are kept where the schedule's reuse level says (registers, shared memory) or re-read / recomputed.

Row family (``plan.family`` row or elementwise), ``tpr`` threads per row, ``block // tpr`` rows per
block, ``split`` blocks per row. Thread ``lane = tid % tpr`` handles the ``vec``-wide vectors
``k = kbase + (i * tpr + lane) * vec`` for ``i < per_thread / vec``.

Column family, ``tpr`` threads along the reduced (leading) axis, ``block // tpr`` threads along the
columns, each owning ``vec`` adjacent columns; ``split`` row chunks per column tile.

Scheme of a stage: ``local`` (shuffle all-reduce among the row's lanes, or a thread owns the whole
column), ``regional`` (shared memory + ``__syncthreads``), ``global`` (per-block partials in global
scratch + software grid barrier), ``independent`` (partials in global scratch, kernel boundary),
``cluster`` (row family, sm_90: the ``split`` blocks of a row form one thread-block cluster and combine
their partials through distributed shared memory after a cluster barrier; see
:mod:`stitchtune.lower.cluster`).

Options (at their defaults the kernels are those without them): ``order`` alternate runs every other sweep
that reads a full-size tensor backwards and every other such kernel's tasks in reverse; ``prefetch``
(row reductions) loads the next task's full-size inputs into registers right after the first sweep;
``combine`` warp (split rows) has the lanes of each warp load a row's partials together.
Cross reductions (``plan.cross``: column sums, losses over the rows) are accumulated per thread over
the block's tasks in the last kernel, reduced across the block and combined across blocks per
``cross_combine`` (atomic / grid / kernel; :mod:`stitchtune.lower.cross`).

Names in the generated program are generated here (``in0``, ``out1``, ``t3_0`` ...); no string of
the graph file reaches them.

Modules: this one is the entry point (:func:`lower`, ``CODEGEN_VERSION``); the shared machinery is in
:mod:`stitchtune.lower.base`, the families in :mod:`stitchtune.lower.row` and :mod:`stitchtune.lower.col`,
the cluster exchange of the row family in :mod:`stitchtune.lower.cluster`.
"""

from __future__ import annotations

from stitchtune.hardware.device import Device
from stitchtune.ir import kir
from stitchtune.ir.verify import verify
from stitchtune.graph.parse import Graph
from stitchtune.lower.base import estimate_registers
from stitchtune.lower.counts import kern_barriers, scratch_loads_per_thread
from stitchtune.lower.col import lower_col
from stitchtune.lower.row import lower_row
from stitchtune.lower.scatter import apply_scatters
from stitchtune.lower.transpose import TransposeLowerer, tile_edge
from stitchtune.plan.family import Family
from stitchtune.plan.planner import StitchPlan
from stitchtune.space import Schedule, SearchSpace

#: The code generator's version, recorded with every tuning record and compiled manifest. Bumped when
#: the kernels built for the same schedule change: "2" (2026-12-07): fast arithmetic, packed element-wise
#: rows, tiled transposes, no dead reuse caches, no row / bounds guards where the grid and the row
#: divide (issue 39). "3" (2026-12-07, later): column kernels' 128-bit row vectors, norm-backward row kernels
#: sized to their compiled registers with per-column inputs loaded once, small scatter tables through a block's
#: shared-memory copy, column-band combines, fast-math PTX exp / division / tanh. "4" (2026-12-07, later): row
#: vectors only where the schedule asks for them (option ``row_vectors``, space version 4): a schedule without
#: the option lowers to the row-by-row sweep of versions 1 and 2 where version 3 took row vectors. "5"
#: (2026-12-07, later): a guarded vector load in a loop whose destinations are not zeroed just before loads
#: into fresh temporaries (``gpu.render``'s docstring), so that nvcc no longer serialises it behind the previous
#: load (the column combine after a grid barrier; colsum_sigmoid_scale, k_transpose). "6" (2026-12-07, later): a
#: row-vector schedule whose row is one sweep iteration of adjacent lanes takes the column shifts of its concat
#: pieces from other lanes (``plan/lane_shifts.py``, ``lower/lane_exchange.py``: a shuffle instead of loading the
#: inputs again; the row-major lane order): Llama's training rotary gradient; every other schedule as in "5". "7"
#: (2026-12-07, later): a column sweep has no per-row ``r < ke`` guard where every chunk is whole and the sweep
#: covers it exactly (``lower.guarded_loads.rows_always_valid``): ptxas keeps more rows' loads in flight under a cap;
#: and (merged under "6" without a bump of its own, no record measured in between) an atomic add into a float32
#: buffer is a PTX reduction (``gpu.render_atomics``: ``REDG`` where ``atomicAdd`` ahead of a grid barrier's fence
#: was a returning ``ATOMG``), so a record of "6" or earlier timed the ``atomicAdd`` kernel; and a tiled transpose
#: loads or computes a tensor whose address does not depend on the transposed axis (a bias added before a head
#: split, its slices) once per tile, with no guard or clamp along an axis its tiles divide (``lower/transpose.py``).
CODEGEN_VERSION = "7"

#: Earlier code generator versions whose tuning records stay usable (``deploy.selection``): their schedule
#: is still a point of the space, so it is re-validated (legality, lowering, the cost model's hard limits)
#: like any record, ranked after every record of today's version, and the choice's reason says that its
#: time was recorded for the earlier kernel. A compiled manifest of another version is refused
#: (``deploy.manifest_io``: recompile it). Empty it to ignore old records instead.
COMPATIBLE_CODEGEN_VERSIONS: tuple[str, ...] = ("6", "5", "4", "3", "2", "1")

__all__ = ["CODEGEN_VERSION", "COMPATIBLE_CODEGEN_VERSIONS", "estimate_registers", "kern_barriers", "lower", "scratch_loads_per_thread"]


def lower(graph: Graph, plan: StitchPlan, schedule: Schedule, device: Device, space: SearchSpace | None = None) -> kir.Program:
    """Lower ``schedule`` for ``graph``; raise :class:`ScheduleError` naming why a point is illegal. The
    program is checked by :func:`stitchtune.ir.verify.verify` (a defect is a bug: ``IRVerifyError``)."""
    space = space or SearchSpace.for_plan(plan, device)
    space.check(schedule)
    if plan.family == Family.COL:
        program = lower_col(graph, plan, schedule, device, space.schemes)
    elif tile_edge(schedule):   # transposed outputs through a shared-memory tile (lower/transpose.py)
        program = TransposeLowerer(graph, plan, schedule, device, space.schemes).lower()
    else:
        program = lower_row(graph, plan, schedule, device, space.schemes)
    return verify(apply_scatters(program, graph, plan.scatters, device))   # scattered values' stores: adds
