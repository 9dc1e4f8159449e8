"""What one search run is given: its configuration, its stages (real or fake), and the backend it runs on.

* :class:`SearchConfig`: everything one ``stitchtune search`` run needs (the CLI flags, one to one),
  checked on construction (``backend`` in :data:`BACKENDS`, ``sampler`` in :data:`SAMPLERS`, ...).
* :class:`Components`: the stages :func:`stitchtune.tune.search.run_search` calls;
  :func:`default_components` gives the real ones (imported lazily), tests pass fakes. With the emulate
  backend and no nvcc (or ``--no-build``) the builder is a :class:`SkipBuilder`.
* :func:`resolve_backend`: ``auto`` -> ``cuda`` when cuda-python finds a GPU, else ``emulate``.

:mod:`stitchtune.tune.search` (the loop) re-exports these names; import them from either module.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stitchtune.errors import StitchtuneError, ToolchainError
from stitchtune.tune.dbpath import default_db
from stitchtune.tune.pipeline import Stages, default_stages
from stitchtune.tune.protocols import DeviceLike, GraphLike, PlanLike, ScheduleLike, SpaceLike

if TYPE_CHECKING:
    from stitchtune.gpu.build import Builder
    from stitchtune.gpu.runners import Runner

__all__ = [
    "BACKENDS",
    "SAMPLERS",
    "Components",
    "SearchConfig",
    "SkipBuilder",
    "default_components",
    "resolve_backend",
]

BACKENDS = ("auto", "cuda", "emulate")
SAMPLERS = ("tpe", "gp", "cmaes", "random", "grid")


@dataclass(frozen=True)
class SearchConfig:
    """Everything one ``stitchtune search`` run needs (the CLI flags, one to one)."""

    graph_path: str
    trials: int = 64
    timeout_s: float | None = None
    backend: str = "auto"
    device: str | None = None
    db: str = field(default_factory=default_db)   # $STITCHTUNE_DB, else ./tuning-db
    storage: str | None = None
    study: str | None = None
    sampler: str = "tpe"
    seed: int | None = None
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)
    early_stop: int | None = None
    prune_factor: float = 3.0
    build: bool = True            # emulate backend: compile with nvcc when it is on PATH
    progress: bool = True         # tqdm bar on stderr
    dup_wait_s: float = 600.0     # longest wait for another worker's trial of the same schedule
    deterministic: bool = False   # only bitwise-reproducible schedules (no float atomics)
    #: a bucket of a dynamic graph (``BucketKey.label()``; "" for a static search): every row records it
    #: in the ``bucket`` column, the study is the bucket's own and only rows of the bucket are reused
    bucket: str = ""

    def __post_init__(self) -> None:
        problems = []
        if self.trials < 1:
            problems.append(f"--trials must be >= 1 (got {self.trials})")
        if self.jobs < 1:
            problems.append(f"--jobs must be >= 1 (got {self.jobs})")
        if self.timeout_s is not None and not self.timeout_s > 0:
            problems.append(f"--timeout must be > 0 seconds (got {self.timeout_s})")
        if self.early_stop is not None and self.early_stop < 1:
            problems.append(f"--early-stop must be >= 1 (got {self.early_stop})")
        if not (self.prune_factor > 1.0 and math.isfinite(self.prune_factor)):
            problems.append(f"--prune-factor must be a finite number > 1 (got {self.prune_factor})")
        if self.backend not in BACKENDS:
            problems.append(f"--backend must be one of {', '.join(BACKENDS)} (got {self.backend!r})")
        if self.sampler not in SAMPLERS:
            problems.append(f"--sampler must be one of {', '.join(SAMPLERS)} (got {self.sampler!r})")
        if problems:
            raise StitchtuneError(problems=problems)


@dataclass(frozen=True)
class Components:
    """The stages run_search calls; :func:`default_components` gives the real ones, tests pass fakes."""

    load_graph: Callable[[str], GraphLike]
    make_plan: Callable[[Any], PlanLike]
    space_for_plan: Callable[[Any, Any], SpaceLike]
    heuristic_schedule: Callable[[Any, Any], ScheduleLike]
    get_device: Callable[[str | None], DeviceLike]
    make_builder: Callable[[SearchConfig, Any, str], Builder]
    make_runner: Callable[[str, Any, Any], Runner]
    stages: Callable[[], Stages]
    cuda_available: Callable[[], bool]
    #: ``legal_space(graph, plan, device, space) -> space``: the space that offers only schedules whose
    #: kernels fit the device (``lower.resources.legal_space``); None: the space as ``space_for_plan`` gives it
    legal_space: Callable[[Any, Any, Any, Any], SpaceLike] | None = None


# ---------------------------------------------------------------------------------------- components
class SkipBuilder:
    """Builder used with the emulate backend when nvcc is absent (or --no-build): compiles nothing."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def build(self, sources: list[str], arch: str | None = None) -> list[Any]:
        import hashlib

        from stitchtune.gpu.build import DEFAULT_ARCH, BuildResult, BuildStatus

        arch = arch or DEFAULT_ARCH
        return [BuildResult(status=BuildStatus.OK, source_hash=hashlib.sha256(s.encode()).hexdigest(), cubin_path=None,
                            arch=arch, registers={}, smem_bytes={}, spill_bytes={}, stack_bytes={},
                            compile_s=0.0, error="") for s in sources]


def _default_builder(config: SearchConfig, device: Any, backend: str) -> Builder:
    """nvcc (the one finder and cache of :mod:`stitchtune.gpu.build`); with the emulate backend and no
    nvcc (or ``--no-build``) a :class:`SkipBuilder`."""
    from stitchtune.gpu.build import NvccBuilder, nvcc_found

    if backend == "emulate" and (not config.build or not nvcc_found()):
        return SkipBuilder("no nvcc" if config.build else "--no-build")
    return NvccBuilder(jobs=config.jobs, timeout_s=120.0)


def _default_runner(backend: str, graph: Any, device: Any) -> Runner:
    if backend == "cuda":
        from stitchtune.gpu.runner import CudaRunner

        return CudaRunner(graph, device)
    from stitchtune.gpu.runners import EmulateRunner

    return EmulateRunner(graph, device)


def _get_device(name: str | None) -> DeviceLike:
    from stitchtune.gpu.device_query import default_device
    from stitchtune.hardware.device import get_device

    return get_device(name) if name else default_device()


def _cuda_available() -> bool:
    from stitchtune.gpu.runner import cuda_available

    return bool(cuda_available())


def default_components() -> Components:
    """The real stages, imported lazily."""
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.graph.parse import load_graph
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    return Components(load_graph=load_graph, make_plan=make_plan, space_for_plan=SearchSpace.for_plan,
                      heuristic_schedule=heuristic_schedule, get_device=_get_device,
                      make_builder=_default_builder, make_runner=_default_runner, stages=default_stages,
                      cuda_available=_cuda_available, legal_space=legal_space)


def resolve_backend(requested: str, cuda_available: Callable[[], bool] | None = None) -> tuple[str, str]:
    """``auto`` -> ``cuda`` when cuda-python finds a GPU, else ``emulate``; returns (backend, one-line reason)."""
    check = cuda_available or _cuda_available
    if requested == "cuda":
        if not check():
            raise ToolchainError("--backend cuda: cuda-python cannot find a CUDA GPU")
        return "cuda", "backend cuda (requested): kernels are timed on the GPU"
    if requested == "emulate":
        return "emulate", ("backend emulate (requested): correctness by the emulator, times are the "
                           "cost model's predictions (estimated)")
    if check():
        return "cuda", "backend auto -> cuda: cuda-python found a GPU; kernels are timed on it"
    return "emulate", ("backend auto -> emulate: no CUDA GPU/cuda-python here; correctness by the emulator, "
                       "times are the cost model's predictions (estimated)")
