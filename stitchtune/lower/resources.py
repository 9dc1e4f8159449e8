"""What a schedule's kernels need of the device, and whether they get it, without building the kernels.

The space of a graph offers only schedules that run (:func:`legal_space`): ``SearchSpace.violations``
asks a resource check (:func:`resource_check`) after the space's own rules, so ``sample``, ``grid``,
``variants`` and ``suggest`` (which repairs a point that does not fit) never offer a schedule whose
kernels the device refuses.

* :func:`launch_shapes`: each kernel's :class:`~stitchtune.ir.launches.LaunchShape` (block, shared
  memory, estimated registers, grid, grid barrier, cluster), sized by the lowering itself
  (``RowLowerer.resources`` / ``ColLowerer.resources``: the same ``size`` step and layout functions
  that :func:`~stitchtune.lower.entry.lower` runs, without the kernel bodies; about 0.1 ms instead of
  several ms). Equal to the same fields of the lowered program's profile (``tests/lower/test_resources.py``).
* :func:`resource_refusal`: the first kernel the device refuses, judged by
  :func:`~stitchtune.hardware.occupancy.launch_refusal`, the rules the cost model prunes with (block
  size, shared memory, zero occupancy, co-residency of a grid barrier, clusters).

Registers are the lowering's estimate (``estimate_registers``), as in the cost model's prediction
before compiling; a kernel that ptxas gives more registers than estimated can still be pruned after
the build (its ``registers`` column says so).
"""

from __future__ import annotations

from typing import Callable

from stitchtune.graph.parse import Graph
from stitchtune.hardware.device import Device
from stitchtune.hardware.occupancy import launch_refusal
from stitchtune.ir.launches import LaunchShape
from stitchtune.lower.col import ColLowerer
from stitchtune.lower.row import RowLowerer
from stitchtune.lower.transpose import TransposeLowerer, tile_edge
from stitchtune.plan.family import Family
from stitchtune.plan.planner import StitchPlan
from stitchtune.space import SCHEMES, Schedule, SchemeTable, SearchSpace

ResourceCheck = Callable[[Schedule], "str | None"]


def launch_shapes(graph: Graph, plan: StitchPlan, schedule: Schedule, device: Device,
                  schemes: SchemeTable = SCHEMES) -> tuple[LaunchShape, ...]:
    """The launch shape of every kernel of ``schedule``'s program, in launch order (the schedule must
    satisfy the space's rules: ``SearchSpace.violations`` without the resource check)."""
    if plan.family != Family.COL and tile_edge(schedule):
        return TransposeLowerer(graph, plan, schedule, device, schemes).resources()
    lowerer = ColLowerer if plan.family == Family.COL else RowLowerer
    return lowerer(graph, plan, schedule, device, schemes).resources()


def resource_refusal(shapes: tuple[LaunchShape, ...], device: Device) -> str | None:
    """Why ``device`` cannot run these launches (the first refused kernel, named), or None."""
    for k in shapes:
        _, reason = launch_refusal(device, k.block, k.registers, k.smem_bytes, k.grid, k.grid_barrier, k.cluster)
        if reason is not None:
            return f"kernel {k.name}: {reason}"
    return None


def resource_check(graph: Graph, plan: StitchPlan, device: Device, schemes: SchemeTable = SCHEMES) -> ResourceCheck:
    """``check(schedule) -> reason | None`` for ``SearchSpace.with_resources``: :func:`resource_refusal`
    of :func:`launch_shapes`."""
    def check(schedule: Schedule) -> str | None:
        return resource_refusal(launch_shapes(graph, plan, schedule, device, schemes), device)
    return check


def legal_space(graph: Graph, plan: StitchPlan, device: Device, space: SearchSpace | None = None) -> SearchSpace:
    """The space of ``graph`` on ``device`` that offers only schedules whose kernels fit the device:
    ``space`` (default: ``SearchSpace.for_plan(plan, device)``) with :func:`resource_check`."""
    space = space if space is not None else SearchSpace.for_plan(plan, device)
    return space.with_resources(resource_check(graph, plan, device, space.schemes))
