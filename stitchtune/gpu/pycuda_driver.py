"""The :class:`~stitchtune.gpu.driver.Driver` interface over pycuda, for the tuning worker only.

Contract
--------
* :class:`PycudaDriver(ordinal)` initialises pycuda's driver (``pycuda.driver.init``), retains the
  **primary context** of GPU ``ordinal`` and pushes it on the calling thread (the worker's only
  thread; :meth:`close` pops and releases it). Everything else is the :class:`Driver` contract of
  :mod:`stitchtune.gpu.driver`: device memory as plain int pointers, copies, ``memset_d8``, page-locked
  host buffers, modules, dynamic shared memory opt-in, ``launch`` from a packed ``void*[n]``, events,
  synchronisation and the device facts.
* Why only the worker: it is a process of its own that launches on the legacy default stream
  (handle ``0``) and never captures, so pycuda's limits do not matter there: pycuda cannot take a
  foreign ``CUstream`` handle (torch's streams), has no cooperative launch and no capture query.
  So ``launch``/``memset_d8``/``event_record`` on a stream other than 0 raise :class:`DriverError`
  (``CUDA_ERROR_INVALID_HANDLE``), a ``cooperative`` launch is a plain one (the worker's watchdog
  turns a grid-barrier deadlock into a ``timeout`` measurement) and ``stream_capturing`` is always
  False. The deploy paths (CompiledGraph, the torch op, torch_entry) use cuda-python only.
* A failed call raises :class:`DriverError` whose ``call`` is the driver function pycuda names and
  ``name`` the driver's description of the error (pycuda reports ``cuGetErrorString``, not the
  ``CUDA_ERROR_*`` name). No pycuda, no driver or no GPU: :class:`~stitchtune.errors.ToolchainError`.
* pycuda is imported in the constructor only (it is an optional dependency: ``pip install pycuda``
  builds it against the CUDA toolkit's headers).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from stitchtune.errors import ToolchainError
from stitchtune.gpu.driver import Activation, DriverError

__all__ = ["PycudaDriver"]

T = TypeVar("T")


class PycudaDriver:
    """:class:`~stitchtune.gpu.driver.Driver` over pycuda on GPU ``ordinal`` (see module docstring)."""

    backend = "pycuda"

    def __init__(self, ordinal: int = 0) -> None:
        try:
            import pycuda.driver as cuda  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except ImportError as exc:
            raise ToolchainError(f"the pycuda driver needs pycuda (pip install pycuda): {exc}") from None
        except OSError as exc:  # pycuda's extension links libcuda: no driver library
            raise ToolchainError(f"pycuda finds no CUDA driver: {exc}") from None
        self._cu = cuda
        self._call(cuda.init)
        count = self._call(cuda.Device.count)
        if count < 1 or not 0 <= ordinal < count:
            raise ToolchainError(f"pycuda finds no CUDA GPU {ordinal} (the driver sees {count})")
        self.ordinal = int(ordinal)
        self.dev = self._call(cuda.Device, self.ordinal)
        self.context = self._call(self.dev.retain_primary_context)
        self._call(self.context.push)
        self._pushed = True
        self._allocs: dict[int, Any] = {}
        self._modules: list[Any] = []
        self._activation = Activation(self)

    # -- errors ---------------------------------------------------------------------------------
    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self._cu.Error as exc:
            call, _, desc = str(exc).partition(" failed: ")
            raise DriverError(call.strip() or getattr(fn, "__name__", "pycuda"), desc.strip() or str(exc)) from None

    @staticmethod
    def _own_stream(stream: int, call: str) -> None:
        if int(stream):
            raise DriverError(call, "CUDA_ERROR_INVALID_HANDLE",
                              "the pycuda driver runs on the worker's default stream (0) only")

    # -- device facts ---------------------------------------------------------------------------
    def attribute(self, name: str) -> int:
        attr = getattr(self._cu.device_attribute, name, None)
        if attr is None:
            raise DriverError("cuDeviceGetAttribute", "CUDA_ERROR_INVALID_VALUE", f"pycuda has no attribute {name}")
        return int(self._call(self.dev.get_attribute, attr))

    def total_memory(self) -> int:
        return int(self._call(self.dev.total_memory))

    def info(self) -> dict[str, Any]:
        cc = f"{self.attribute('COMPUTE_CAPABILITY_MAJOR')}.{self.attribute('COMPUTE_CAPABILITY_MINOR')}"
        return {"backend": "cuda", "binding": "pycuda", "name": str(self._call(self.dev.name)).strip(), "cc": cc,
                "sm_count": self.attribute("MULTIPROCESSOR_COUNT"), "l2_bytes": self.attribute("L2_CACHE_SIZE"),
                "driver_version": int(self._call(self._cu.get_driver_version))}

    # -- contexts and streams -------------------------------------------------------------------
    def make_current(self) -> None:
        if not self._is_current():
            self._call(self.context.push)

    def _is_current(self) -> bool:
        cur = self._cu.Context.get_current()
        return cur is not None and cur == self.context

    def activate(self) -> Activation:
        return self._activation

    def _push_if_needed(self) -> bool:
        if self._is_current():
            return False
        self._call(self.context.push)
        return True

    def _pop(self) -> None:
        self._call(self._cu.Context.pop)

    def stream_capturing(self, stream: int) -> bool:
        return False  # the worker never captures (and pycuda cannot ask)

    # -- memory ---------------------------------------------------------------------------------
    def mem_alloc(self, nbytes: int) -> int:
        alloc = self._call(self._cu.mem_alloc, max(int(nbytes), 1))
        self._allocs[int(alloc)] = alloc
        return int(alloc)

    def mem_free(self, ptr: int) -> None:
        alloc = self._allocs.pop(int(ptr), None)
        if alloc is None:
            raise DriverError("cuMemFree", "CUDA_ERROR_INVALID_VALUE", f"{ptr:#x} was not allocated here")
        self._call(alloc.free)

    def memset_d8(self, ptr: int, value: int, nbytes: int, stream: int = 0) -> None:
        self._own_stream(stream, "cuMemsetD8Async")
        if nbytes:
            self._call(self._cu.memset_d8_async, int(ptr), int(value), int(nbytes), None)

    def memcpy_htod(self, ptr: int, host: np.ndarray) -> None:
        a = np.ascontiguousarray(host)
        if a.nbytes:
            self._call(self._cu.memcpy_htod, int(ptr), a)

    def memcpy_dtoh(self, host: np.ndarray, ptr: int) -> None:
        if not host.flags.c_contiguous or not host.flags.writeable:
            raise ValueError("memcpy_dtoh needs a writeable C-contiguous host array")
        if host.nbytes:
            self._call(self._cu.memcpy_dtoh, host, int(ptr))

    def host_empty(self, nbytes: int) -> np.ndarray:
        """A page-locked host buffer of ``nbytes`` (uint8), freed with the array."""
        buf: np.ndarray = self._call(self._cu.pagelocked_empty, max(int(nbytes), 1), np.uint8)
        return buf[: int(nbytes)]

    def host_alloc_mapped(self, nbytes: int) -> tuple[np.ndarray, int]:
        """A page-locked host buffer mapped into the device (pycuda's ``DEVICEMAP``) and its device pointer."""
        flags = self._cu.host_alloc_flags.DEVICEMAP | self._cu.host_alloc_flags.PORTABLE
        host = self._call(self._cu.pagelocked_empty, max(int(nbytes), 1), np.uint8, "C", flags)
        return host[: int(nbytes)], int(host.base.get_device_pointer())

    def host_free(self, host: np.ndarray) -> None:
        """Nothing to do: pycuda frees the buffer with the array."""

    # -- modules and launches -------------------------------------------------------------------
    def load_module(self, image: bytes) -> Any:
        module = self._call(self._cu.module_from_buffer, bytes(image))
        self._modules.append(module)
        return module

    def unload_module(self, module: Any) -> None:
        """Drop the module (pycuda unloads it once no function of it is referenced any more)."""
        self._modules = [m for m in self._modules if m is not module]

    def get_function(self, module: Any, name: str) -> Any:
        return self._call(module.get_function, name)

    def set_max_dynamic_smem(self, function: Any, nbytes: int) -> None:
        self._call(function.set_attribute, self._cu.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes))

    def launch(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
               stream: int, params: int, nparams: int, cooperative: bool = False) -> None:
        # pycuda launches from a packed argument buffer (CU_LAUNCH_PARAM_BUFFER_POINTER): every argument
        # of ours is an 8-byte pointer, so the buffer is the values the void*[n] points at, in order
        self._own_stream(stream, "cuLaunchKernel")
        slots = (ctypes.c_uint64 * nparams).from_address(params) if nparams else ()
        buf = np.array([ctypes.c_uint64.from_address(int(s)).value for s in slots], dtype=np.uint64)
        self._call(function._launch_kernel, tuple(grid), tuple(block), buf.tobytes(), int(smem), None)

    # -- events and synchronisation ---------------------------------------------------------------
    def event_create(self) -> Any:
        return self._call(self._cu.Event)

    def event_record(self, event: Any, stream: int = 0) -> None:
        self._own_stream(stream, "cuEventRecord")
        self._call(event.record)

    def event_synchronize(self, event: Any) -> None:
        self._call(event.synchronize)

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self._call(end.time_since, start))

    def synchronize(self) -> None:
        self._call(self._cu.Context.synchronize)

    def close(self) -> None:
        """Drop modules and allocations, pop and release the primary context (best effort)."""
        self._modules.clear()
        for alloc in self._allocs.values():
            try:
                alloc.free()
            except self._cu.Error:
                pass
        self._allocs.clear()
        if self._pushed:
            self._pushed = False
            try:
                self._cu.Context.pop()
                self.context.detach()
            except self._cu.Error:
                pass
