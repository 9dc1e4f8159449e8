"""The in-package fake CUDA driver: a :class:`~stitchtune.gpu.driver.Driver` over numpy memory, for CPU tests.

Contract
--------
* `FakeDriver` is an in-package stand-in for CPU tests of everything above this module: device
  memory is numpy byte arrays (fresh allocations hold the garbage byte ``0xCD``), every call is
  recorded in ``calls`` (``(name, *arguments)``), launches in ``launches`` with their decoded
  arguments, and kernels are Python callables ``fn(driver, args, launch)`` (``kernels``; without any,
  every function name exists and a launch does nothing). It refuses what the GPU refuses: an image not
  starting with ``FAKE`` (``CUDA_ERROR_INVALID_IMAGE``), an unknown function name when ``kernels`` is
  given (``CUDA_ERROR_NOT_FOUND``), dynamic shared memory above 48 KiB without the opt-in
  (``CUDA_ERROR_INVALID_VALUE``); ``fail[call] = name`` makes the next such call fail; a kernel
  may set ``pending`` to an error name that the next synchronising call raises (sticky, as a real
  fault poisons the context); ``capturing`` is the set of stream handles that capture a graph (a
  module load, allocation, synchronous copy or synchronisation then fails with ``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED``,
  as on a GPU); ``host_alloc_mapped`` gives fake memory whose array the host reads as it is (a
  mapped page-locked buffer); ``activate()`` blocks are counted in ``active`` and logged in ``context_calls``.
  Its device facts are ``attrs`` (``CU_DEVICE_ATTRIBUTE_*`` names without the prefix: the L2 size,
  SM count and compute capability from the constructor, plus any given; another name raises
  ``CUDA_ERROR_INVALID_VALUE`` as an unsupported attribute does) and ``memory_bytes``.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stitchtune.gpu.driver import DEFAULT_SMEM_LIMIT, Activation, DriverError


@dataclass(frozen=True)
class FakeLaunch:
    """One launch seen by the :class:`FakeDriver`: the argument values decoded from the packed params."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    stream: int
    args: tuple[int, ...]
    cooperative: bool = False


@dataclass
class FakeFunction:
    name: str
    max_dynamic_smem: int = DEFAULT_SMEM_LIMIT


FakeKernel = Callable[["FakeDriver", tuple[int, ...], FakeLaunch], None]


class FakeDriver:
    """:class:`~stitchtune.gpu.driver.Driver` with numpy "device memory", for CPU tests (see module docstring)."""

    backend = "fake"
    GARBAGE = 0xCD

    def __init__(self, kernels: Mapping[str, FakeKernel] | None = None, *, l2_bytes: int = 1 << 16,
                 sm_count: int = 4, name: str = "Fake GPU", cc: str = "9.0",
                 attrs: Mapping[str, int] | None = None, memory_bytes: int = 1 << 30) -> None:
        self.kernels = dict(kernels) if kernels is not None else None
        self.memory: dict[int, np.ndarray] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.launches: list[FakeLaunch] = []
        self.fail: dict[str, str] = {}
        self.pending: str | None = None
        self.capturing: set[int] = set()
        self.active = 0  # depth of activate() blocks entered
        self.context_calls: list[str] = []  # "push" / "pop" of those blocks (not in ``calls``)
        major, _, minor = cc.partition(".")
        self.attrs = {"L2_CACHE_SIZE": int(l2_bytes), "MULTIPROCESSOR_COUNT": int(sm_count),
                      "COMPUTE_CAPABILITY_MAJOR": int(major), "COMPUTE_CAPABILITY_MINOR": int(minor or 0),
                      **{k: int(v) for k, v in (attrs or {}).items()}}
        self.memory_bytes = int(memory_bytes)
        self._info = {"backend": "fake-driver", "name": name,
                      "cc": f"{self.attrs['COMPUTE_CAPABILITY_MAJOR']}.{self.attrs['COMPUTE_CAPABILITY_MINOR']}",
                      "sm_count": self.attrs["MULTIPROCESSOR_COUNT"], "l2_bytes": self.attrs["L2_CACHE_SIZE"],
                      "driver_version": 13000}
        self._next = 1 << 32

    def _enter(self, call: str, *args: Any) -> None:
        self.calls.append((call, *args))
        err = self.fail.pop(call, None)
        if err:
            raise DriverError(call, err)

    def _sync_point(self, call: str) -> None:
        if self.pending:
            raise DriverError(call, self.pending)

    def buffer(self, ptr: int) -> np.ndarray:
        """The bytes of the allocation holding ``ptr``, from ``ptr`` on (a view: writes reach "the GPU")."""
        for base, mem in self.memory.items():
            if base <= ptr < base + max(mem.size, 1):
                return mem[ptr - base:]
        raise DriverError("memory access", "CUDA_ERROR_ILLEGAL_ADDRESS", f"no allocation holds {ptr:#x}")

    def make_current(self) -> None:
        self._enter("make_current")

    def activate(self) -> Activation:
        return Activation(self)

    def _push_if_needed(self) -> bool:
        self.context_calls.append("push")
        self.active += 1
        return True

    def _pop(self) -> None:
        self.context_calls.append("pop")
        self.active -= 1

    def stream_capturing(self, stream: int) -> bool:
        return int(stream) in self.capturing

    def _no_capture(self, call: str) -> None:
        if self.capturing:
            raise DriverError(call, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")

    def attribute(self, name: str) -> int:
        if name not in self.attrs:  # as the driver answers an attribute it does not support
            raise DriverError("cuDeviceGetAttribute", "CUDA_ERROR_INVALID_VALUE", f"no attribute {name}")
        return self.attrs[name]

    def total_memory(self) -> int:
        return self.memory_bytes

    def info(self) -> dict[str, Any]:
        return dict(self._info)

    def mem_alloc(self, nbytes: int) -> int:
        self._enter("mem_alloc", int(nbytes))
        self._no_capture("cuMemAlloc")
        ptr = self._next
        self._next += (max(int(nbytes), 1) + 511) // 256 * 256
        self.memory[ptr] = np.full(int(nbytes), self.GARBAGE, np.uint8)
        return ptr

    def mem_free(self, ptr: int) -> None:
        self._enter("mem_free", ptr)
        if self.memory.pop(ptr, None) is None:
            raise DriverError("cuMemFree", "CUDA_ERROR_INVALID_VALUE")

    def memset_d8(self, ptr: int, value: int, nbytes: int, stream: int = 0) -> None:
        self._enter("memset_d8", ptr, value, nbytes, stream)
        if nbytes:
            self.buffer(ptr)[:nbytes] = value

    def memcpy_htod(self, ptr: int, host: np.ndarray) -> None:
        self._enter("memcpy_htod", ptr, host.nbytes)
        raw = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        self.buffer(ptr)[: raw.size] = raw

    def memcpy_dtoh(self, host: np.ndarray, ptr: int) -> None:
        self._enter("memcpy_dtoh", ptr, host.nbytes)
        self._no_capture("cuMemcpyDtoH")
        self._sync_point("cuMemcpyDtoH")
        if host.nbytes:
            host.reshape(-1).view(np.uint8)[:] = self.buffer(ptr)[: host.nbytes]

    def host_empty(self, nbytes: int) -> np.ndarray:
        self._enter("host_empty", nbytes)
        return np.empty(int(nbytes), np.uint8)

    def host_alloc_mapped(self, nbytes: int) -> tuple[np.ndarray, int]:
        """A "mapped host" buffer: fake device memory whose array the host reads (kernels write it
        through the pointer, the host sees it without a copy)."""
        self._enter("host_alloc_mapped", int(nbytes))
        self._no_capture("cuMemHostAlloc")
        ptr = self._next
        self._next += (max(int(nbytes), 1) + 511) // 256 * 256
        self.memory[ptr] = np.zeros(int(nbytes), np.uint8)
        return self.memory[ptr], ptr

    def host_free(self, host: np.ndarray) -> None:
        self._enter("host_free")
        for base, mem in list(self.memory.items()):
            if mem is host or (mem.size and mem.ctypes.data == host.ctypes.data):
                del self.memory[base]
                return
        raise DriverError("cuMemFreeHost", "CUDA_ERROR_INVALID_VALUE")

    def load_module(self, image: bytes) -> Any:
        self._enter("load_module", len(image))
        self._no_capture("cuModuleLoadData")
        if not bytes(image).startswith(b"FAKE"):
            raise DriverError("cuModuleLoadData", "CUDA_ERROR_INVALID_IMAGE")
        return {"image": bytes(image)}

    def unload_module(self, module: Any) -> None:
        self._enter("unload_module")

    def get_function(self, module: Any, name: str) -> FakeFunction:
        self._enter("get_function", name)
        if self.kernels is not None and name not in self.kernels:
            raise DriverError("cuModuleGetFunction", "CUDA_ERROR_NOT_FOUND")
        return FakeFunction(name)

    def set_max_dynamic_smem(self, function: FakeFunction, nbytes: int) -> None:
        self._enter("set_max_dynamic_smem", function.name, nbytes)
        function.max_dynamic_smem = int(nbytes)

    def launch(self, function: FakeFunction, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
               stream: int, params: int, nparams: int, cooperative: bool = False) -> None:
        self._enter("launch", function.name, stream)
        if smem > function.max_dynamic_smem:
            raise DriverError("cuLaunchKernel", "CUDA_ERROR_INVALID_VALUE",
                              f"{smem} B of dynamic shared memory without opting in")
        # decode the packed kernelParams as the driver does: void*[n], each pointing at an 8-byte value
        slots = (ctypes.c_uint64 * nparams).from_address(params) if nparams else ()
        args = tuple(ctypes.c_uint64.from_address(int(s)).value for s in slots)
        ln = FakeLaunch(function.name, tuple(grid), tuple(block), int(smem), int(stream), args,  # type: ignore[arg-type]
                        bool(cooperative))
        self.launches.append(ln)
        fn = (self.kernels or {}).get(function.name)
        if fn is not None and not self.pending:
            fn(self, args, ln)

    def event_create(self) -> Any:
        self._enter("event_create")
        return [0.0]

    def event_record(self, event: Any, stream: int = 0) -> None:
        self._enter("event_record", stream)
        event[0] = time.perf_counter()

    def event_synchronize(self, event: Any) -> None:
        self._enter("event_synchronize")
        self._sync_point("cuEventSynchronize")

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        return float(end[0] - start[0]) * 1e3

    def synchronize(self) -> None:
        self._enter("synchronize")
        self._no_capture("cuCtxSynchronize")
        self._sync_point("cuCtxSynchronize")

    def close(self) -> None:
        self._enter("close")
