"""The stitchtune system under bench: its tuned program for a workload, and a launcher from torch tensors.

Contract
--------
* :func:`tuned_program` returns a :class:`TunedProgram`: the best measured schedule of a graph on a
  device from the tuning database (when there is none and ``trials > 0``, the search runs first;
  without any measured record the heuristic schedule), lowered and built by nvcc; ``origin`` says
  which. Raises ToolchainError when nvcc cannot build the source.
* :class:`CupyLauncher` runs a :class:`~stitchtune.ir.kir.Program` from raw device pointers on the current
  torch stream (cubin loaded with ``cupy.RawModule``; scratch and barrier buffers allocated once, only
  ``zero_init`` scratch and barriers zeroed, the rest poisoned with 0xFF, like the CUDA runner).
  :func:`_to_torch` / :func:`_torch_out` move numpy arrays (bfloat16 included) to and from torch.

torch and cupy are imported inside the functions that use them. Used by :mod:`stitchtune.bench.measure` (which
re-exports everything here) and :mod:`stitchtune.deploy.torch_entry`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any


from stitchtune.errors import ToolchainError
from stitchtune.gpu.cupy_launch import CupyLauncher, _to_torch, _torch_dtype, _torch_out  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from stitchtune.hardware.device import Device
    from stitchtune.graph.parse import Graph

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TunedProgram:
    """The program stitchtune runs for a workload and where it came from (``origin``, for the note)."""

    program: Any  # kir.Program
    cubin_path: str
    origin: str


def tuned_program(graph_path: str, graph: Graph, db: str, trials: int, device: Device) -> TunedProgram:
    """The best measured schedule of ``graph`` on ``device`` from the database ``db``; when there is
    none and ``trials > 0``, :func:`stitchtune.tune.search.run_search` (cuda backend) runs first. Without any
    measured record the heuristic schedule is used (said in ``origin``). Raises ToolchainError when
    nvcc cannot build the source."""
    from stitchtune.gpu.build import NvccBuilder
    from stitchtune.tune.database import TuningDB
    from stitchtune.lower.entry import CODEGEN_VERSION, lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.gpu.render import render
    from stitchtune.space import Schedule, SearchSpace

    tdb = TuningDB(db)
    plan = make_plan(graph)
    space = SearchSpace.for_plan(plan, device)
    want = {"workload_key": graph.workload_key(), "device_key": device.key, "space_version": str(space.version),
            "codegen_version": str(CODEGEN_VERSION), "backend": "cuda"}
    best = tdb.best(**want)
    if best is None and trials > 0:
        from stitchtune.tune.search import SearchConfig, run_search

        log.info("%s: no tuned record for %s, searching %d trials", graph.name, device.key, trials)
        # a queried device is what `stitchtune search` finds by itself (device=None); a preset goes by name
        dev_name = None if getattr(device, "source", "preset") == "pycuda" else device.name
        res = run_search(SearchConfig(graph_path=str(graph_path), trials=trials, backend="cuda", device=dev_name,
                                      db=str(db), progress=False))
        log.info("%s: search stopped (%s) after %d trials", graph.name, res.stopped, res.trials_run)
        best = tdb.best(**want)
    if best is not None:
        schedule = Schedule.from_json(str(best["schedule_json"]))
        origin = (f"tuned: schedule {best.get('schedule_key')} from the database "
                  f"(search measured {float(best['measured_us']):.1f} us)")
    else:
        from stitchtune.cost.heuristic import heuristic_schedule

        schedule = heuristic_schedule(plan, device)
        origin = "heuristic schedule (no measured record in the database)"
    program = lower(graph, plan, schedule, device, space)
    [built] = NvccBuilder().build([render(program)], device.arch)
    if built.status != "ok" or not built.cubin_path:
        raise ToolchainError(f"{graph.name}: nvcc failed on the tuned schedule: {built.error[:500]}")
    return TunedProgram(program=program, cubin_path=str(built.cubin_path), origin=origin)
