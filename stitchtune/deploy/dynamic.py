"""Compiled buckets of a dynamic graph: one program per bucket that runs for every extent in it.

Interface (shared with the torch backend, ``deploy/torch_*``)
-------------------------------------------------------------
``compile_dynamic(dgraph, key, db=DEFAULT_DB, device=None, *, schedule=None, build=None, deterministic=False)
-> DynamicCompiled | DynamicRefusal``

* ``dgraph``: a :class:`~stitchtune.graph.dynamic.DynamicGraph`; ``key``: a
  :class:`~stitchtune.graph.dynamic.BucketKey` of it (``dgraph.key_of(extents)``).
* The program is planned at the bucket's largest extents (``key.largest()``) and lowered with every
  dynamic extent as an ``int`` kernel argument (after the pointers): row guards, the grid (computed at
  launch from the extents) and index maps that need an extent read the argument. One compile (one
  nvcc build) serves every extent of the bucket.
* The schedule is the database's best record for (structure, device, versions, bucket label), else
  the heuristic at the largest extents (``schedule=`` overrides it; one the generic kernel refuses is a
  ScheduleError). ``CompiledBucket.source`` / ``.reason`` say where the schedule came from and why.
* A graph the generic kernel cannot serve (or, with no schedule given, no schedule it accepts) gives a
  :class:`~stitchtune.graph.dynamic.DynamicRefusal` (data, never an exception): the caller compiles
  per extent with :func:`stitchtune.deploy.compiled.compile` instead.

``DynamicCompiled`` (immutable; :class:`CompiledBucket` implements it):
* ``key``, ``dgraph``, ``schedule``, ``program`` (the kir program, buffers sized for the largest extents);
* ``emulate(extents, **arrays) -> dict[str, ndarray]``: the numpy SIMT emulator with buffers of the
  *actual* extents (every access checked against them);
* ``__call__(extents, **arrays)``: the GPU (cuda-python) launch path, the grid computed from ``extents``;
* ``covers(extents) -> bool``: whether ``extents`` lie in ``key`` (calls outside raise GraphError).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from stitchtune.deploy.device_run import DeviceRun, build_cubin
from stitchtune.errors import GraphError
from stitchtune.graph.dynamic import BucketKey, DynamicGraph, DynamicRefusal
from stitchtune.tune.dbpath import DEFAULT_DB, DefaultDB, resolve_db

if TYPE_CHECKING:
    from stitchtune.graph.parse import Graph
    from stitchtune.hardware.device import Device
    from stitchtune.ir.kir import Program
    from stitchtune.space import Schedule

log = logging.getLogger(__name__)


class DynamicCompiled(Protocol):
    """One compiled bucket (module docstring)."""

    key: BucketKey
    dgraph: DynamicGraph
    schedule: Schedule
    program: Program

    def covers(self, extents: Mapping[str, int]) -> bool: ...
    def emulate(self, extents: Mapping[str, int], **arrays: np.ndarray) -> dict[str, np.ndarray]: ...
    def __call__(self, extents: Mapping[str, int], **arrays: Any) -> dict[str, np.ndarray]: ...


@dataclass(frozen=True)
class CompiledBucket:
    """The generic program of one bucket (see module docstring). ``source`` is where its schedule came
    from (tuned | nearest-shape | heuristic | given), ``sources`` the CUDA C, ``cubin`` None when not built."""

    key: BucketKey
    dgraph: DynamicGraph
    device: Device
    schedule: Schedule
    source: str
    program: Program
    sources: str
    cubin: bytes | None = field(default=None, repr=False, compare=False)
    _state: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: why this schedule (the selection's reason; "" when not known)
    reason: str = field(default="", compare=False)
    #: the search space version the schedule was checked in
    space_version: str = field(default="", compare=False)
    #: ptxas registers per kernel when the cubin was built here (``()``: not built)
    registers: tuple[tuple[str, int], ...] = field(default=(), compare=False)

    def __repr__(self) -> str:
        return (f"<CompiledBucket {self.key.label() or 'static'}: schedule {self.schedule.key()} ({self.source}), "
                f"{len(self.program.kernels)} kernel(s), cubin {'built' if self.cubin is not None else 'not built'}>")

    def covers(self, extents: Mapping[str, int]) -> bool:
        return self.key.contains(extents)

    def _graph_at(self, extents: Mapping[str, int]) -> Graph:
        if set(extents) != set(self.dgraph.dim_names) or not self.covers(extents):
            raise GraphError(f"extents {dict(sorted(extents.items()))} are not in bucket {self.key.label()}")
        return self.dgraph.at(extents)

    def emulate(self, extents: Mapping[str, int], **arrays: np.ndarray) -> dict[str, np.ndarray]:
        """The generic program in the CPU emulator at ``extents`` (buffers of those extents: every access
        is checked against them); ``{output: array}`` shaped like the graph at ``extents``. Raises
        :class:`~stitchtune.errors.StitchtuneError` naming each gather whose error flag the run set (an
        index out of range)."""
        from stitchtune.deploy.run_checks import check_emulated_gathers
        from stitchtune.emulate.emulator import emulate_program
        from stitchtune.graph.reference import check_inputs
        from stitchtune.gpu.runners import emulator_limits

        g = self._graph_at(extents)
        check_inputs(g, arrays)
        limit, climit = emulator_limits(self.device, self.program, {})
        scratch: dict[str, np.ndarray] = {}
        flat = emulate_program(self.program, dict(arrays), coresident_limit=limit, cluster_limit=climit,
                               extents=dict(extents), scratch_out=scratch)
        check_emulated_gathers(self.program, scratch)
        return {o: flat[o].reshape(g.spec(o).shape) for o in g.outputs}

    def __call__(self, extents: Mapping[str, int], **arrays: Any) -> dict[str, np.ndarray]:
        """Run on the GPU at ``extents`` (the grid computed from them; no rebuild)."""
        from stitchtune.gpu.driver import open_driver

        g = self._graph_at(extents)
        run = self._state.get("run")
        if run is None:
            cubin = self.cubin if self.cubin is not None else build_cubin(self.sources, self.device.arch)[1]
            run = self._state["run"] = DeviceRun(self.program, cubin, open_driver())
        out: dict[str, np.ndarray] = run(g, arrays, dict(extents))
        return out


def compile_dynamic(dgraph: DynamicGraph, key: BucketKey, db: str | os.PathLike[str] | None | DefaultDB = DEFAULT_DB,
                    device: str | Device | None = None, *, schedule: Schedule | Mapping[str, Any] | None = None, build: bool | None = None,
                    deterministic: bool = False) -> CompiledBucket | DynamicRefusal:
    """Compile bucket ``key`` of ``dgraph`` (module docstring). ``device``: a Device, a preset name, or
    None (the local GPU, else the H200 preset); ``build`` as :func:`stitchtune.deploy.compiled.compile`.
    The schedule: ``schedule`` when given, else the database's best record of this bucket
    (:func:`stitchtune.deploy.selection.choose_schedule` on the representative graph, ``bucket=``), else
    the heuristic; one the generic kernel refuses falls back to the heuristic (logged), a given one is a
    ScheduleError naming the refusal. ``deterministic``: only bitwise-reproducible records (a given schedule
    that is not: ScheduleError)."""
    db = resolve_db(db)
    from stitchtune.deploy.selection import choose_schedule
    from stitchtune.errors import ScheduleError
    from stitchtune.gpu.build import nvcc_found
    from stitchtune.gpu.render import render
    from stitchtune.hardware.device import check_fits, get_device
    from stitchtune.cost.heuristic import generic_heuristic
    from stitchtune.lower.dynamic import fit_rows, lower_dynamic
    from stitchtune.space import Schedule, SearchSpace

    if device is None:
        from stitchtune.gpu.device_query import default_device

        dev = default_device()
    else:
        dev = get_device(device) if isinstance(device, str) else device
    fit = fit_rows(dgraph, key)
    if isinstance(fit, DynamicRefusal):
        return fit
    check_fits(fit.graph, dev)
    space = SearchSpace.for_plan(fit.plan, dev)
    if schedule is not None:
        s = schedule if isinstance(schedule, Schedule) else Schedule.from_dict(dict(schedule))
        source, reason = "given", "schedule given by the caller"
        if deterministic and not s.deterministic:
            raise ScheduleError("schedule is not bitwise reproducible (cross_combine atomic uses float atomics); "
                                "--deterministic refuses it")
    else:
        choice = choose_schedule(fit.graph, db, dev, plan=fit.plan, space=space, bucket=key.label(),
                                 deterministic=deterministic)
        s, source, reason = choice.schedule, choice.source, choice.reason
    program = lower_dynamic(fit, s, dev, space)
    if isinstance(program, DynamicRefusal) and source != "given":
        log.info("bucket %s: schedule %s refused by the generic kernel (%s); the generic heuristic instead",
                 key.label(), s.key(), program)
        reason = f"the generic heuristic: {source} schedule {s.key()} refused by the generic kernel ({program})"
        s, source = generic_heuristic(fit, dev, space), "heuristic"
        program = lower_dynamic(fit, s, dev, space)
    if isinstance(program, DynamicRefusal) and source == "given":
        raise ScheduleError(f"schedule {s.key()}: the generic kernel of bucket {key.label()} refuses it ({program})")
    if isinstance(program, DynamicRefusal):
        return program
    sources = render(program)
    cubin: bytes | None = None
    regs: tuple[tuple[str, int], ...] = ()
    if build or (build is None and nvcc_found()):
        res, cubin = build_cubin(sources, dev.arch)
        regs = tuple(sorted((str(k), int(v)) for k, v in (getattr(res, "registers", None) or {}).items()))
    return CompiledBucket(key, dgraph, dev, s, source, program, sources, cubin, reason=reason,
                          space_version=str(space.version), registers=regs)
