"""The stitchtune system under bench: its tuned program for a workload, and a launcher from torch tensors.

Contract
--------
* :func:`tuned_program` returns a :class:`TunedProgram`: the best measured schedule of a graph on a
  device from the tuning database (when there is none and ``trials > 0``, the search runs first;
  without any measured record the heuristic schedule), lowered and built by nvcc; ``origin`` says
  which. Raises ToolchainError when nvcc cannot build the source.
* :class:`CupyLauncher` runs a :class:`~stitchtune.kir.Program` from raw device pointers on the current
  torch stream (cubin loaded with ``cupy.RawModule``; scratch and barrier buffers allocated once, only
  ``zero_init`` scratch and barriers zeroed, the rest poisoned with 0xFF, like the CUDA runner).
  :func:`_to_torch` / :func:`_torch_out` move numpy arrays (bfloat16 included) to and from torch.

torch and cupy are imported inside the functions that use them. Used by :mod:`stitchtune.bench` (which
re-exports everything here) and :mod:`stitchtune.torch`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ToolchainError

if TYPE_CHECKING:
    from .device import Device
    from .graph import Graph

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TunedProgram:
    """The program stitchtune runs for a workload and where it came from (``origin``, for the note)."""

    program: Any  # kir.Program
    cubin_path: str
    origin: str


def tuned_program(graph_path: str, graph: Graph, db: str, trials: int, device: Device) -> TunedProgram:
    """The best measured schedule of ``graph`` on ``device`` from the database ``db``; when there is
    none and ``trials > 0``, :func:`stitchtune.search.run_search` (cuda backend) runs first. Without any
    measured record the heuristic schedule is used (said in ``origin``). Raises ToolchainError when
    nvcc cannot build the source."""
    from .build import NvccBuilder
    from .db import TuningDB
    from .lower import CODEGEN_VERSION, lower
    from .plan import make_plan
    from .render_cuda import render
    from .schedule import Schedule, SearchSpace

    tdb = TuningDB(db)
    plan = make_plan(graph)
    space = SearchSpace.for_plan(plan, device)
    want = {"workload_key": graph.workload_key(), "device_key": device.key, "space_version": str(space.version),
            "codegen_version": str(CODEGEN_VERSION), "backend": "cuda"}
    best = tdb.best(**want)
    if best is None and trials > 0:
        from .search import SearchConfig, run_search

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
        from .heuristic import heuristic_schedule

        schedule = heuristic_schedule(plan, device)
        origin = "heuristic schedule (no measured record in the database)"
    program = lower(graph, plan, schedule, device, space)
    [built] = NvccBuilder().build([render(program)], device.arch)
    if built.status != "ok" or not built.cubin_path:
        raise ToolchainError(f"{graph.name}: nvcc failed on the tuned schedule: {built.error[:500]}")
    return TunedProgram(program=program, cubin_path=str(built.cubin_path), origin=origin)


class CupyLauncher:
    """Runs a :class:`~stitchtune.kir.Program` from raw device pointers on the current torch stream.

    The cubin is loaded with ``cupy.RawModule``; scratch and barrier buffers are allocated (zeroed) once
    here, as the program contract asks. ``__call__(pointers)`` takes the input/output buffer name ->
    device pointer map and enqueues every launch in order.
    """

    def __init__(self, program: Any, cubin_path: str, torch_device: str = "cuda") -> None:
        import cupy
        import torch

        from .cuda_plan import DEFAULT_SMEM_LIMIT, launch_plan

        self._cupy = cupy
        self.plan = launch_plan(program)
        self.module = cupy.RawModule(path=cubin_path)
        self.scratch: dict[str, Any] = {}
        for b in self.plan.buffers:
            if b.role in ("scratch", "barrier"):
                t = torch.zeros(max(b.nbytes, 1), dtype=torch.uint8, device=torch_device)
                if not b.zero_init and b.role == "scratch":
                    t.fill_(0xFF)  # like the runner: only zero_init buffers start at zero
                self.scratch[b.name] = t
        self.io_names = tuple(b.name for b in self.plan.buffers if b.role in ("input", "output"))
        funcs: dict[str, Any] = {}
        self.calls: list[tuple[Any, tuple[int, int, int], tuple[int, int, int], int, tuple[str, ...]]] = []
        for ln in self.plan.launches:
            f = funcs.get(ln.kernel) or self.module.get_function(ln.kernel)
            funcs[ln.kernel] = f
            if ln.smem_bytes > DEFAULT_SMEM_LIMIT:
                f.max_dynamic_shared_size_bytes = max(ln.smem_bytes, f.max_dynamic_shared_size_bytes)
            self.calls.append((f, ln.grid, ln.block, ln.smem_bytes, ln.args))

        sp = int(torch.cuda.current_stream().cuda_stream) if torch_device != "cpu" else 0
        self.stream = cupy.cuda.Stream.null if sp == 0 else cupy.cuda.ExternalStream(sp)

    def bind(self, pointers: dict[str, int]) -> list[tuple[Any, ...]]:
        """The launches with their arguments for one set of input/output pointers (prepared once, so
        that a timed call costs only the launches themselves)."""
        ptrs = {n: int(t.data_ptr()) for n, t in self.scratch.items()}
        ptrs.update(pointers)
        return [(f, grid, block, tuple(np.uint64(ptrs[a]) for a in args), smem)
                for f, grid, block, smem, args in self.calls]

    def run(self, bound: list[tuple[Any, ...]]) -> None:
        """Enqueue every launch of ``bound`` (from :meth:`bind`) on the torch stream of construction time."""
        for f, grid, block, args, smem in bound:
            f(grid, block, args, shared_mem=smem, stream=self.stream)

    def __call__(self, pointers: dict[str, int]) -> None:
        self.run(self.bind(pointers))


def _torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def _to_torch(arr: np.ndarray, device: str = "cuda") -> Any:
    import torch

    a = np.ascontiguousarray(arr)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(a).to(device)


def _torch_out(t: Any) -> np.ndarray:
    return t.float().cpu().numpy()
