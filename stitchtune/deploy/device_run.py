"""A compiled program on one GPU (:class:`DeviceRun`: launcher, staging buffers, packed arguments) and
the cubin build (:func:`build_cubin`) that static and dynamic compiled graphs share.

Contract: ``DeviceRun(program, cubin, driver)(graph, arrays, extents=None)`` runs ``program`` through
:mod:`stitchtune.gpu.launch` and returns the graph's outputs as numpy arrays (see
:mod:`stitchtune.deploy.compiled` for what inputs it takes); :func:`build_cubin` builds a source with nvcc
(cached) or raises :class:`~stitchtune.errors.ToolchainError`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stitchtune.deploy.run_checks import _check_arrays, check_gather_flags, read_gather_flags
from stitchtune.errors import StitchtuneError, ToolchainError

if TYPE_CHECKING:
    from stitchtune.gpu.build import BuildResult
    from stitchtune.gpu.driver import Driver
    from stitchtune.graph.parse import Graph
    from stitchtune.ir.kir import Program


class DeviceRun:
    """A compiled program on one GPU: its :class:`~stitchtune.gpu.launch.Launcher` (scratch allocated
    and initialised once), device buffers for numpy inputs and for the outputs (allocated at the first
    call, reused), and the packed arguments per set of pointers."""

    MAX_BOUND = 16

    def __init__(self, program: Program, cubin: bytes, driver: Driver) -> None:
        from stitchtune.gpu.launch import Launcher, launch_plan

        self.program = program
        self.driver = driver
        self.launcher = Launcher(driver, launch_plan(program), cubin)
        self.staging: dict[tuple[str, str], int] = {}
        self._staged_bytes: dict[tuple[str, str], int] = {}
        self._bound: dict[tuple[tuple[str, int], ...], Any] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """Free the staging buffers, the scratch and the module (best effort)."""
        from stitchtune.gpu.driver import DriverError

        with self._lock:
            self._bound.clear()
            try:
                with self.driver.activate():
                    while self.staging:
                        self.driver.mem_free(self.staging.popitem()[1])
            except DriverError:
                self.staging.clear()
            self.launcher.close()

    def _buffer(self, kind: str, name: str, nbytes: int) -> int:
        """The staging buffer of an input/output, grown when a generic program's call needs more."""
        ptr = self.staging.get((kind, name))
        if ptr is not None and self._staged_bytes.get((kind, name), 0) < nbytes:
            self.driver.mem_free(self.staging.pop((kind, name)))
            self._bound.clear()  # packed arguments may hold the freed pointer
            ptr = None
        if ptr is None:
            ptr = self.staging[(kind, name)] = self.driver.mem_alloc(nbytes)
            self._staged_bytes[(kind, name)] = nbytes
        return ptr

    def __call__(self, graph: Graph, arrays: Mapping[str, Any],
                 extents: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        """Outputs of ``graph`` for ``arrays`` (numpy arrays, or device arrays exposing
        ``__cuda_array_interface__``, used in place), as numpy arrays shaped like the graph's outputs.
        A generic program (``program.dynamic``) runs with ``extents`` (``graph`` is the dynamic graph at
        them: its shapes are the call's)."""
        from stitchtune.gpu.launch import device_pointer

        _check_arrays(graph, arrays)
        drv = self.driver
        ptrs: dict[str, int] = {}
        problems = []
        for name, _ in graph.inputs:
            a = arrays[name]
            if not isinstance(a, np.ndarray):
                try:
                    ptrs[name] = device_pointer(a, aligned=True)
                except ValueError as exc:
                    problems.append(f"input {name!r}: {exc}")
        if problems:
            raise StitchtuneError(problems=problems)
        with self._lock, drv.activate():
            return self._run(graph, arrays, ptrs, extents)

    def _run(self, graph: Graph, arrays: Mapping[str, Any], ptrs: dict[str, int],
             extents: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        from stitchtune.gpu.driver import DriverError
        from stitchtune.graph.reference import numpy_dtype

        drv = self.driver
        try:
            for name, _ in graph.inputs:
                a = arrays[name]
                if isinstance(a, np.ndarray):
                    ptrs[name] = self._buffer("input", name, a.nbytes)
                    drv.memcpy_htod(ptrs[name], a)
            outs = {o: np.empty(graph.spec(o).shape, numpy_dtype(graph.spec(o).dtype)) for o in graph.outputs}
            for o, host in outs.items():
                ptrs[o] = self._buffer("output", o, host.nbytes)
            key = tuple(sorted(ptrs.items())) + tuple(sorted((extents or {}).items()))
            bound = self._bound.get(key)
            if bound is None:
                if len(self._bound) >= self.MAX_BOUND:
                    self._bound.pop(next(iter(self._bound)))
                bound = self._bound[key] = self.launcher.bind(ptrs, None if extents is None else dict(extents))
            self.launcher.launch(bound, 0)
            drv.synchronize()
            for o, host in outs.items():
                drv.memcpy_dtoh(host, ptrs[o])
            flags = self._read_flags()
        except DriverError as exc:
            raise DriverError(exc.call, exc.name, f"running {graph.name}") from None
        check_gather_flags(self.program, flags)
        return outs

    def _read_flags(self) -> dict[str, float]:
        """The gather error flags of the last launch, zeroed again for the next one."""
        return read_gather_flags(self.driver, self.launcher.scratch, self.program)



def build_cubin(source: str, arch: str) -> tuple[BuildResult, bytes]:
    """nvcc (cached) -> (BuildResult, cubin bytes); ToolchainError when it fails."""
    from stitchtune.gpu.build import BuildStatus, NvccBuilder

    [res] = NvccBuilder().build([source], arch)
    if res.status != BuildStatus.OK or not res.cubin_path:
        raise ToolchainError(f"nvcc failed ({res.status}): {res.error[:2000]}")
    return res, Path(res.cubin_path).read_bytes()

