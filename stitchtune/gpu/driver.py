"""The CUDA driver, as the few calls stitchtune needs: NVIDIA's cuda-python bindings.

Contract
--------
* :class:`Driver` is the interface: device memory (:meth:`~Driver.mem_alloc`, ``mem_free``, copies,
  ``memset_d8`` on a stream), page-locked host buffers, modules and functions (``load_module``,
  ``get_function``, ``set_max_dynamic_smem``), ``launch`` of a function with pre-packed parameters on
  a stream handle, events, synchronisation and the device facts of :class:`DeviceFacts`
  (``attribute``, ``total_memory``, ``info``), whether a stream is capturing a CUDA graph
  (``stream_capturing``) and ``activate()``: a ``with`` block during which the driver's context is
  current on the calling thread, the caller's current context restored after it (nothing pushed when
  it is current already). Pointers, streams and events are
  plain ints / opaque handles; a stream handle is any ``CUstream`` value (``0``: the legacy default
  stream; ``torch.cuda.current_stream().cuda_stream`` works as it is).
* ``host_alloc_mapped(nbytes)`` returns ``(host array, device pointer)`` of one page-locked host buffer
  mapped into the device's address space (``cuMemHostAlloc`` with ``DEVICEMAP``): kernels write it
  through the device pointer and the host reads it as it is, with no copy and no synchronisation
  (what the torch op's gather error flags use); ``host_free(host)`` frees it.
* Every failed driver call raises :class:`DriverError` (a :class:`~stitchtune.errors.ToolchainError`)
  whose ``call`` is the driver function and ``name`` the driver's error name
  (``CUDA_ERROR_ILLEGAL_ADDRESS``...). Errors of kernels surface, as on a GPU, at the next
  synchronising call (``synchronize``, ``event_synchronize``, a synchronous copy).
* :class:`CudaDriver` is the real one: ``cuda.bindings.driver`` (package ``cuda-bindings``; the older
  ``from cuda import cuda`` layout works too), imported in its constructor. It initialises the driver,
  retains the **primary context** of GPU ``ordinal`` (the one torch and cupy use, so pointers and
  streams of torch tensors are valid here) and, with ``current=True`` (what a worker process wants),
  makes it current on the calling thread. Code that shares the thread with torch never sets a context
  current for good (``cuCtxSetCurrent`` of GPU k would change torch's current device): it runs its
  calls inside ``activate()`` (push/pop), as :class:`~stitchtune.gpu.launch.Launcher` does. Launches of
  kernels with grid barriers are cooperative (``cuLaunchCooperativeKernel``): a grid the GPU cannot
  hold co-resident is refused with ``CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`` instead of hanging. No
  driver library, no GPU or no cuda-python: :class:`~stitchtune.errors.ToolchainError` with the reason.
* :class:`PycudaDriver` (:mod:`stitchtune.gpu.pycuda_driver`) is the same interface over pycuda, for
  the tuning worker only (its own process, the legacy default stream):
  :func:`stitchtune.gpu.worker_driver.worker_driver` picks it
  when asked (``$STITCHTUNE_CUDA_DRIVER=pycuda``) or when cuda-python is missing and pycuda is present.
* :class:`~stitchtune.gpu.fake_driver.FakeDriver` (:mod:`stitchtune.gpu.fake_driver`) is an in-package
  stand-in for CPU tests of everything above this module.
* :func:`open_driver` returns a :class:`CudaDriver` for ``ordinal`` (default ``$STITCHTUNE_CUDA_DEVICE``
  or 0), one per ordinal and process, **not** made current (use ``activate()``). :func:`open_device` returns a :class:`CudaDevice`: the same
  device facts without retaining a context (what describing the GPU needs).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from stitchtune.errors import ToolchainError

DEVICE_ENV = "STITCHTUNE_CUDA_DEVICE"
#: which binding the tuning worker uses: ``cuda-python`` | ``pycuda`` (default: cuda-python when it imports)
DRIVER_ENV = "STITCHTUNE_CUDA_DRIVER"
DRIVERS = ("cuda-python", "pycuda")
#: dynamic shared memory a launch gets without opting in (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
DEFAULT_SMEM_LIMIT = 48 * 1024


class DriverError(ToolchainError):
    """A CUDA driver call failed: ``call`` (e.g. ``cuLaunchKernel``) and ``name`` (the driver's error
    name, e.g. ``CUDA_ERROR_ILLEGAL_ADDRESS``)."""

    def __init__(self, call: str, name: str, detail: str = "") -> None:
        self.call, self.name = call, name
        super().__init__(f"{call} failed: {name}" + (f" ({detail})" if detail else ""))


class DeviceFacts(Protocol):
    """What a GPU reports about itself, without a context (the part :mod:`stitchtune.gpu.device_query` uses).

    * ``attribute(name)``: ``cuDeviceGetAttribute`` of ``CU_DEVICE_ATTRIBUTE_<name>`` (e.g.
      ``"MULTIPROCESSOR_COUNT"``); :class:`DriverError` when the driver or its bindings do not know it.
    * ``total_memory()``: ``cuDeviceTotalMem``, bytes of global memory.
    * ``info()``: ``{"backend", "name", "cc": "9.0", "sm_count", "l2_bytes", "driver_version"}``.
    """

    def info(self) -> dict[str, Any]: ...
    def attribute(self, name: str) -> int: ...
    def total_memory(self) -> int: ...


class Driver(DeviceFacts, Protocol):
    """The CUDA driver calls of the launch path and the worker (see module docstring)."""

    def mem_alloc(self, nbytes: int) -> int: ...
    def mem_free(self, ptr: int) -> None: ...
    def memset_d8(self, ptr: int, value: int, nbytes: int, stream: int = 0) -> None: ...
    def memcpy_htod(self, ptr: int, host: np.ndarray) -> None: ...
    def memcpy_dtoh(self, host: np.ndarray, ptr: int) -> None: ...
    def host_empty(self, nbytes: int) -> np.ndarray: ...
    def host_alloc_mapped(self, nbytes: int) -> tuple[np.ndarray, int]: ...
    def host_free(self, host: np.ndarray) -> None: ...
    def load_module(self, image: bytes) -> Any: ...
    def unload_module(self, module: Any) -> None: ...
    def get_function(self, module: Any, name: str) -> Any: ...
    def set_max_dynamic_smem(self, function: Any, nbytes: int) -> None: ...
    def launch(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
               stream: int, params: int, nparams: int, cooperative: bool = False) -> None: ...
    def stream_capturing(self, stream: int) -> bool: ...
    def activate(self) -> Any: ...
    def event_create(self) -> Any: ...
    def event_record(self, event: Any, stream: int = 0) -> None: ...
    def event_synchronize(self, event: Any) -> None: ...
    def event_elapsed_ms(self, start: Any, end: Any) -> float: ...
    def synchronize(self) -> None: ...
    def make_current(self) -> None: ...
    def close(self) -> None: ...


# ---------------------------------------------------------------------------- cuda-python
def _binding() -> Any:
    """``cuda.bindings.driver`` (cuda-bindings >= 12.6), else the older ``cuda.cuda`` module."""
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python < 12.6
        except ImportError as exc:
            raise ToolchainError(f"running kernels needs NVIDIA's cuda-python driver bindings "
                                 f"(pip install cuda-bindings): {exc}") from None
    return driver


class CudaDevice:
    """:class:`DeviceFacts` of GPU ``ordinal`` over cuda-python: ``cuInit`` and the device handle, **no
    context** (nothing is allocated on the GPU). ToolchainError without cuda-python, driver or GPU."""

    backend = "cuda-python"

    def __init__(self, ordinal: int = 0) -> None:
        cu = self._cu = _binding()
        self._ok = cu.CUresult.CUDA_SUCCESS
        try:
            self._call("cuInit", 0)
        except DriverError:
            raise
        except Exception as exc:  # noqa: BLE001 - no libcuda: the bindings raise their own loader error
            raise ToolchainError(f"cuda-python finds no CUDA driver: {type(exc).__name__}: {exc}") from None
        count = int(self._call("cuDeviceGetCount"))
        if count < 1 or not 0 <= ordinal < count:
            raise ToolchainError(f"cuda-python finds no CUDA GPU {ordinal} (the driver sees {count})")
        self.ordinal = int(ordinal)
        self.device = self._call("cuDeviceGet", self.ordinal)

    def _error_name(self, err: Any) -> str:
        try:
            res = self._cu.cuGetErrorName(err)
            if res[0] == self._ok and res[1]:
                return res[1].decode() if isinstance(res[1], bytes) else str(res[1])
        except Exception:  # noqa: BLE001 - the code alone still names the error
            pass
        return getattr(err, "name", str(err))

    def _call(self, name: str, *args: Any) -> Any:
        """``cu<name>(*args)``; the returned value(s) without the error code, DriverError on failure."""
        res = getattr(self._cu, name)(*args)
        err = res[0] if isinstance(res, tuple) else res
        if err != self._ok:
            raise DriverError(name, self._error_name(err))
        vals = res[1:] if isinstance(res, tuple) else ()
        return vals[0] if len(vals) == 1 else (vals or None)

    def attribute(self, name: str) -> int:
        attr = getattr(self._cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}", None)
        if attr is None:
            raise DriverError("cuDeviceGetAttribute", "CUDA_ERROR_INVALID_VALUE",
                              f"these cuda-python bindings have no CU_DEVICE_ATTRIBUTE_{name}")
        return int(self._call("cuDeviceGetAttribute", attr, self.device))

    def total_memory(self) -> int:
        return int(self._call("cuDeviceTotalMem", self.device))

    def info(self) -> dict[str, Any]:
        raw = self._call("cuDeviceGetName", 256, self.device)
        name = (raw.split(b"\0", 1)[0].decode() if isinstance(raw, bytes) else str(raw)).strip()
        cc = f"{self.attribute('COMPUTE_CAPABILITY_MAJOR')}.{self.attribute('COMPUTE_CAPABILITY_MINOR')}"
        return {"backend": "cuda", "name": name, "cc": cc, "sm_count": self.attribute("MULTIPROCESSOR_COUNT"),
                "l2_bytes": self.attribute("L2_CACHE_SIZE"),
                "driver_version": int(self._call("cuDriverGetVersion"))}


class Activation:
    """``with driver.activate():`` its context current for the block, the caller's restored after it.

    ``push()`` (the driver's ``_push_if_needed``) answers whether it pushed (False: the context was
    current already: one cheap check, nothing pushed); ``pop()`` undoes a push: a caller that pairs
    them itself (``pushed = a.push()`` ... ``if pushed: a.pop()`` in a ``finally``) skips the
    ``with`` block's per-thread stack (the torch op's thin path does). A plain class, not a generator
    context manager: a launch pays two attribute calls."""

    __slots__ = ("_driver", "_local", "push", "pop")

    def __init__(self, driver: Any) -> None:
        self._driver = driver
        self._local = threading.local()  # per thread: a stack of "pushed?" for nested blocks
        self.push: Callable[[], bool] = driver._push_if_needed
        self.pop: Callable[[], None] = driver._pop

    def __enter__(self) -> None:
        pushed = self._driver._push_if_needed()
        try:
            self._local.stack.append(pushed)
        except AttributeError:
            self._local.stack = [pushed]

    def __exit__(self, *exc: object) -> None:
        if self._local.stack.pop():
            self._driver._pop()


class CudaDriver(CudaDevice):
    """:class:`Driver` over cuda-python on the primary context of GPU ``ordinal`` (see module docstring).

    ``current=True`` makes the context current on the calling thread (a process of its own, e.g. the
    tuning worker); ``current=False`` leaves the thread's context alone (use :meth:`activate`)."""

    def __init__(self, ordinal: int = 0, *, current: bool = True) -> None:
        super().__init__(ordinal)
        self._launch = self._cu.cuLaunchKernel
        self._launch_coop = getattr(self._cu, "cuLaunchCooperativeKernel", None)
        self._get_current = self._cu.cuCtxGetCurrent
        self._pinned: list[int] = []
        self.context = self._call("cuDevicePrimaryCtxRetain", self.device)
        self._ctx_id = int(self.context)
        self._activation = Activation(self)
        if current:
            self.make_current()

    def make_current(self) -> None:
        """Make the context current on the calling thread for good (``cuCtxSetCurrent``)."""
        self._call("cuCtxSetCurrent", self.context)

    def activate(self) -> Activation:
        """A ``with`` block with this context current (pushed only when it is not; popped after)."""
        return self._activation

    def _push_if_needed(self) -> bool:
        # every launch of the torch op passes here: the binding's function directly, not _call
        err, cur = self._get_current()
        if err != self._ok:
            raise DriverError("cuCtxGetCurrent", self._error_name(err))
        if cur is not None and int(cur) == self._ctx_id:
            return False
        self._call("cuCtxPushCurrent", self.context)
        return True

    def _pop(self) -> None:
        self._call("cuCtxPopCurrent")

    def stream_capturing(self, stream: int) -> bool:
        """Whether ``stream`` is capturing a CUDA graph (``cuStreamIsCapturing``; the legacy stream
        while another stream captures in global mode counts as capturing)."""
        try:
            status = self._call("cuStreamIsCapturing", stream)
        except DriverError as exc:
            if exc.name == "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT":
                return True
            raise
        return int(status) != 0

    def mem_alloc(self, nbytes: int) -> int:
        return int(self._call("cuMemAlloc", max(int(nbytes), 1)))

    def mem_free(self, ptr: int) -> None:
        self._call("cuMemFree", int(ptr))

    def memset_d8(self, ptr: int, value: int, nbytes: int, stream: int = 0) -> None:
        if nbytes:
            self._call("cuMemsetD8Async", int(ptr), int(value), int(nbytes), stream)

    def memcpy_htod(self, ptr: int, host: np.ndarray) -> None:
        a = np.ascontiguousarray(host)
        if a.nbytes:
            self._call("cuMemcpyHtoD", int(ptr), a.ctypes.data, a.nbytes)

    def memcpy_dtoh(self, host: np.ndarray, ptr: int) -> None:
        if not host.flags.c_contiguous or not host.flags.writeable:
            raise ValueError("memcpy_dtoh needs a writeable C-contiguous host array")
        if host.nbytes:
            self._call("cuMemcpyDtoH", host.ctypes.data, int(ptr), host.nbytes)

    def host_empty(self, nbytes: int) -> np.ndarray:
        """A page-locked host buffer of ``nbytes`` (uint8), freed by :meth:`close`."""
        n = max(int(nbytes), 1)
        ptr = int(self._call("cuMemAllocHost", n))
        self._pinned.append(ptr)
        return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))[: int(nbytes)]

    def host_alloc_mapped(self, nbytes: int) -> tuple[np.ndarray, int]:
        """A page-locked host buffer of ``nbytes`` (uint8) mapped into the device's address space, and its
        device pointer (``cuMemHostAlloc(PORTABLE | DEVICEMAP)``, ``cuMemHostGetDevicePointer``)."""
        n = max(int(nbytes), 1)
        ptr = int(self._call("cuMemHostAlloc", n, 0x01 | 0x02))   # CU_MEMHOSTALLOC_PORTABLE | _DEVICEMAP
        try:
            dev = int(self._call("cuMemHostGetDevicePointer", ptr, 0))
        except DriverError:
            self._call("cuMemFreeHost", ptr)
            raise
        return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))[: int(nbytes)], dev

    def host_free(self, host: np.ndarray) -> None:
        """Free a buffer of :meth:`host_alloc_mapped`."""
        self._call("cuMemFreeHost", int(host.ctypes.data))

    def load_module(self, image: bytes) -> Any:
        return self._call("cuModuleLoadData", bytes(image))

    def unload_module(self, module: Any) -> None:
        self._call("cuModuleUnload", module)

    def get_function(self, module: Any, name: str) -> Any:
        return self._call("cuModuleGetFunction", module, name.encode())

    def set_max_dynamic_smem(self, function: Any, nbytes: int) -> None:
        attr = self._cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        self._call("cuFuncSetAttribute", function, attr, int(nbytes))

    def launch(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
               stream: int, params: int, nparams: int, cooperative: bool = False) -> None:
        # one call into cuLaunchKernel: ``params`` is the address of a packed void*[nparams]
        if cooperative:
            if self._launch_coop is None:
                raise DriverError("cuLaunchCooperativeKernel", "CUDA_ERROR_NOT_SUPPORTED",
                                  "these cuda-python bindings have no cooperative launch")
            err = self._launch_coop(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem,
                                    stream, params)
            call = "cuLaunchCooperativeKernel"
        else:
            err = self._launch(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, stream,
                               params, 0)
            call = "cuLaunchKernel"
        err = err[0] if isinstance(err, tuple) else err
        if err != self._ok:
            raise DriverError(call, self._error_name(err))

    def event_create(self) -> Any:
        return self._call("cuEventCreate", 0)

    def event_record(self, event: Any, stream: int = 0) -> None:
        self._call("cuEventRecord", event, stream)

    def event_synchronize(self, event: Any) -> None:
        self._call("cuEventSynchronize", event)

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self._call("cuEventElapsedTime", start, end))

    def synchronize(self) -> None:
        self._call("cuCtxSynchronize")

    def close(self) -> None:
        """Free the page-locked buffers and release the primary context (best effort)."""
        while self._pinned:
            try:
                self._call("cuMemFreeHost", self._pinned.pop())
            except DriverError:
                pass
        try:
            self._call("cuDevicePrimaryCtxRelease", self.device)
        except DriverError:
            pass


_open_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _open_cached(ordinal: int) -> CudaDriver:
    return CudaDriver(ordinal, current=False)


def default_ordinal() -> int:
    """The GPU stitchtune uses unless told: ``$STITCHTUNE_CUDA_DEVICE``, else 0. A value that is not a whole
    number >= 0 is a :class:`ToolchainError` naming the variable."""
    text = os.environ.get(DEVICE_ENV, "0").strip() or "0"
    if not text.isdigit():
        raise ToolchainError(f"${DEVICE_ENV} must be a GPU ordinal, a whole number >= 0 (got {text[:40]!a})")
    return int(text)


def _driver_library_loads() -> bool:
    """Whether the CUDA driver library can be loaded at all. Without it no binding finds a GPU, so
    :func:`open_device` says so at once instead of importing cuda-python first (about 50 ms: the
    start-up of every command that only asks which device it is on)."""
    import ctypes

    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False


def open_device(ordinal: int | None = None) -> CudaDevice:
    """:class:`CudaDevice` (facts, no context) of GPU ``ordinal`` (default :func:`default_ordinal`).
    Raises ToolchainError without the CUDA driver library, cuda-python or a GPU."""
    if not _driver_library_loads():
        raise ToolchainError("no GPU through cuda-python: the CUDA driver library (libcuda) is not installed")
    return CudaDevice(default_ordinal() if ordinal is None else int(ordinal))


def open_driver(ordinal: int | None = None) -> CudaDriver:
    """The process's :class:`CudaDriver` for GPU ``ordinal`` (default ``$STITCHTUNE_CUDA_DEVICE`` or 0).
    It is not made current (the thread's context, and so torch's current device, stay as they are):
    run driver calls inside ``activate()``. Raises ToolchainError without cuda-python, driver or GPU."""
    o = default_ordinal() if ordinal is None else int(ordinal)
    with _open_lock:
        return _open_cached(o)
