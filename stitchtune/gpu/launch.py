"""The one launch path: a program's cubin loaded, its scratch initialised, its arguments packed once,
its kernels launched on a given CUDA stream.

Every place that runs stitched kernels goes through :class:`Launcher`: the tuning worker
(:mod:`stitchtune.gpu.worker`), ``stitchtune.compile(...)(**arrays)``
(:mod:`stitchtune.deploy.compiled`), the PyTorch entry point (:mod:`stitchtune.deploy.torch_entry`)
and ``stitchtune bench`` (:mod:`stitchtune.bench.measure`).

Why NVIDIA's cuda-python driver bindings (:mod:`stitchtune.gpu.driver`): they take any raw
``CUstream`` handle (torch's current stream as it is), work on the primary context that torch also
uses (pointers of torch tensors are valid as they are), and with pre-packed ``kernelParams`` a launch
is one Cython call into ``cuLaunchKernel`` with no per-call argument conversion (the alternatives
weighed are in docs/architecture.md, "The one launch path").

Contract
--------
* :func:`launch_plan` turns a :class:`stitchtune.ir.kir.Program` (duck-typed) into a frozen
  :class:`LaunchPlan` of :class:`PlanBuffer` and :class:`PlanLaunch` (plain data, picklable): every
  buffer with its byte size, role (``input``/``output``/``scratch``/``barrier``), graph tensor and
  whether it starts zeroed (barriers always do); every launch with its kernel name, grid and block as
  3-tuples, dynamic shared memory, argument buffer names and whether it is ``cooperative`` (it takes a
  grid-barrier buffer: launched with ``cuLaunchCooperativeKernel``, so a grid that cannot be
  co-resident is an error, never a hang). An inconsistent program (a lowering bug) raises ``ValueError``.
* :class:`Launcher(driver, plan, cubin, stream=0)` first refuses to be made while ``stream`` captures a
  CUDA graph (:class:`CaptureError`: module loads and allocations are illegal there and would
  invalidate the capture; run the kernels once before capturing), then loads the cubin into the driver's context, gets each
  kernel once and opts it into dynamic shared memory above the 48 KiB default
  (:data:`DEFAULT_SMEM_LIMIT`; the largest of its launches, and only then), allocates one device
  buffer per scratch/barrier buffer and initialises them on ``stream``: ``zero_init`` scratch and
  barriers are zeroed, other scratch is poisoned with ``0xFF`` bytes (a program that reads scratch it
  did not write then computes NaN instead of passing by luck). :meth:`Launcher.init_scratch` does it
  again. The scratch buffers named in ``mapped`` (the torch op's gather error flags) are page-locked
  host memory mapped into the device (``driver.host_alloc_mapped``), in :attr:`Launcher.host` as
  host arrays: the kernels write them through the device pointer, the host reads them without a copy
  or a synchronisation (initialised on the host).
* :meth:`Launcher.bind` packs the arguments of every launch for one set of input/output pointers
  (``{graph tensor: device pointer}``; inputs and outputs are named by the graph tensors they are
  bound to) into a :class:`Bound` (the ``kernelParams`` arrays, kept alive by it). A pointer that is not
  :data:`ALIGN`-byte aligned is refused with :class:`MisalignedPointer` (a ``ValueError`` naming the
  tensors): the kernels use 16-byte vector loads, and a misaligned one is a sticky
  ``CUDA_ERROR_MISALIGNED_ADDRESS`` that kills the whole CUDA context (torch's with it). Callers copy
  such a tensor (a view with a storage offset, ``x[1:]``) or refuse it.
  :meth:`Launcher.launch(bound, stream)` enqueues every launch in order on ``stream`` and does nothing
  else: no allocation, no synchronisation, no host copy (so it can be captured in a CUDA graph, and a
  repeated call costs only the launches). Errors are :class:`~stitchtune.gpu.driver.DriverError`.
  Every driver call of a Launcher runs inside ``driver.activate()``: its context is current for the
  call and the thread's previous one restored after it (torch's current device never changes).
  One Launcher's scratch serves one stream: concurrent calls on different streams need a Launcher
  each (the torch paths key theirs by GPU and stream).
* :func:`device_pointer` reads the device pointer of an object exposing ``__cuda_array_interface__``
  (torch, cupy, numba arrays), refusing non-contiguous ones and (``aligned=True``) misaligned ones.
* ``ELEM_BYTES`` is the element size per graph dtype (graph/values.py's ``ITEMSIZE``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stitchtune.errors import ToolchainError
from stitchtune.gpu.driver import DEFAULT_SMEM_LIMIT, Driver, DriverError
from stitchtune.graph.values import ITEMSIZE

__all__ = ["ALIGN", "DEFAULT_SMEM_LIMIT", "ELEM_BYTES", "Bound", "CaptureError", "DriverError", "LaunchPlan",
           "Launcher", "MisalignedPointer", "PlanBuffer", "PlanLaunch", "device_pointer", "launch_plan"]

#: byte alignment every input/output pointer needs (the kernels' widest vector load: 16 bytes)
ALIGN = 16


class MisalignedPointer(ValueError):
    """Device pointers that are not :data:`ALIGN`-byte aligned (``tensors``: the graph tensors)."""

    def __init__(self, tensors: dict[str, int]) -> None:
        self.tensors = dict(tensors)
        names = ", ".join(f"{t!r} at {p:#x}" for t, p in sorted(tensors.items()))
        super().__init__(f"device pointers not {ALIGN}-byte aligned: {names} (a view with a storage offset, "
                         f"e.g. x[1:]? pass a copy); the kernels' vector loads would fault")


class CaptureError(ToolchainError):
    """A Launcher was to be made while its stream captures a CUDA graph."""

ELEM_BYTES = ITEMSIZE
POISON = 0xFF  # 0xFF bytes are NaN in every float type


@dataclass(frozen=True)
class PlanBuffer:
    """One global buffer: ``tensor`` names the graph input/output it is bound to ('' for scratch)."""

    name: str
    dtype: str
    nbytes: int
    role: str
    zero_init: bool
    tensor: str


@dataclass(frozen=True)
class PlanLaunch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    args: tuple[str, ...]
    #: the kernel takes a grid-barrier buffer: launched cooperatively (all blocks co-resident or an error)
    cooperative: bool = False


@dataclass(frozen=True)
class LaunchPlan:
    buffers: tuple[PlanBuffer, ...]
    launches: tuple[PlanLaunch, ...]
    #: a generic program's :class:`~stitchtune.ir.launches.DynamicInfo` (extent arguments and grids per
    #: extents; scratch stays sized for the largest extents); None for a static program
    dynamic: Any = None


def _dim3(v: Any) -> tuple[int, int, int]:
    if isinstance(v, (tuple, list)):
        t = tuple(int(x) for x in v) + (1, 1, 1)
        return (t[0], t[1], t[2])
    return (int(v), 1, 1)


def _buffer_nbytes(b: Any) -> int:
    nb = getattr(b, "nbytes", None)
    if isinstance(nb, int):
        return nb
    return int(b.size) * (4 if b.role == "barrier" else ELEM_BYTES[b.dtype])


def launch_plan(program: Any) -> LaunchPlan:
    """Extract the launch plan of a :class:`stitchtune.ir.kir.Program` (duck-typed).

    Raises ``ValueError`` for an inconsistent program (a lowering bug): unknown buffer in a launch,
    an input/output buffer without a graph tensor, an unknown role.
    """
    bufs = []
    names = set()
    barriers = {str(b.name) for b in program.buffers if str(b.role) == "barrier"}
    for b in program.buffers:
        role = str(b.role)
        if role not in ("input", "output", "scratch", "barrier"):
            raise ValueError(f"buffer {b.name!r}: unknown role {role!r}")
        tensor = str(getattr(b, "tensor", "") or "")
        if role in ("input", "output") and not tensor:
            raise ValueError(f"{role} buffer {b.name!r} is not bound to a graph tensor")
        zero = bool(getattr(b, "zero_init", False)) or role == "barrier"
        bufs.append(PlanBuffer(str(b.name), str(b.dtype), _buffer_nbytes(b), role, zero, tensor))
        names.add(str(b.name))
    launches = []
    for ln in program.launches:
        missing = [a for a in ln.args if a not in names]
        if missing:
            raise ValueError(f"launch of {ln.kernel!r} names unknown buffers {missing}")
        launches.append(
            PlanLaunch(str(ln.kernel), _dim3(ln.grid), _dim3(ln.block), int(getattr(ln, "smem_bytes", 0) or 0),
                       tuple(str(a) for a in ln.args), any(str(a) in barriers for a in ln.args))
        )
    return LaunchPlan(tuple(bufs), tuple(launches), getattr(program, "dynamic", None))


# ---------------------------------------------------------------------------- launching
@dataclass(frozen=True, eq=False)
class Bound:
    """The packed arguments of every launch of a plan for one set of pointers (see :meth:`Launcher.bind`).

    ``pointers`` is the buffer name -> device pointer map it was packed from; ``params`` holds per
    launch the address of its ``void*[n]`` and ``n``; ``_keep`` the arrays those addresses point into.
    """

    pointers: Mapping[str, int]
    params: tuple[tuple[int, int], ...]
    _keep: tuple[np.ndarray, ...]
    #: a generic program's grid per launch at the bound extents (None: the plan's grids)
    grids: tuple[tuple[int, int, int], ...] | None = None


class Launcher:
    """A program's kernels loaded into a driver's context, ready to bind and launch (see module docstring).

    Use :meth:`close` (or a ``with`` block) to free the scratch buffers and unload the module.
    """

    def __init__(self, driver: Driver, plan: LaunchPlan, cubin: bytes, stream: int = 0,
                 mapped: Collection[str] = ()) -> None:
        self.driver = driver
        self.plan = plan
        self.module: Any = None
        self.scratch: dict[str, int] = {}
        #: the scratch buffers named in ``mapped``, as host arrays (page-locked, mapped into the device)
        self.host: dict[str, np.ndarray] = {}
        self._mapped = frozenset(mapped)
        self._active = driver.activate()
        with self._active:
            if driver.stream_capturing(stream):
                raise CaptureError("the stitched kernels are loaded and their scratch allocated at the first call, "
                                   "which a stream capturing a CUDA graph forbids: run the function once "
                                   "before capturing it")
            self.module = driver.load_module(cubin)
            self._setup(plan, stream)
        self._io = tuple((b.name, b.tensor) for b in plan.buffers if b.role in ("input", "output"))

    def _setup(self, plan: LaunchPlan, stream: int) -> None:
        driver = self.driver
        try:
            funcs: dict[str, Any] = {}
            smem: dict[str, int] = {}
            for ln in plan.launches:
                if ln.kernel not in funcs:
                    funcs[ln.kernel] = driver.get_function(self.module, ln.kernel)
                smem[ln.kernel] = max(smem.get(ln.kernel, 0), ln.smem_bytes)
            for name, nbytes in smem.items():
                if nbytes > DEFAULT_SMEM_LIMIT:
                    driver.set_max_dynamic_smem(funcs[name], nbytes)
            barriers = {b.name for b in plan.buffers if b.role == "barrier"}
            self._calls = tuple((funcs[ln.kernel], ln.grid, ln.block, ln.smem_bytes,
                                 ln.cooperative or any(a in barriers for a in ln.args)) for ln in plan.launches)
            for b in plan.buffers:
                if b.role == "scratch" and b.name in self._mapped:
                    self.host[b.name], self.scratch[b.name] = driver.host_alloc_mapped(b.nbytes)
                elif b.role in ("scratch", "barrier"):
                    self.scratch[b.name] = driver.mem_alloc(b.nbytes)
            self.init_scratch(stream)
        except BaseException:
            self.close()
            raise

    def init_scratch(self, stream: int = 0) -> None:
        """Zero ``zero_init`` scratch and barriers, poison the other scratch (enqueued on ``stream``)."""
        with self._active:
            for b in self.plan.buffers:
                if b.name in self.host:
                    self.host[b.name][:] = 0 if b.zero_init else POISON   # host memory: written as it is
                elif b.name in self.scratch and b.nbytes:
                    self.driver.memset_d8(self.scratch[b.name], 0 if b.zero_init else POISON, b.nbytes, stream)

    def bind(self, tensors: Mapping[str, int], extents: Mapping[str, int] | None = None) -> Bound:
        """Pack every launch's arguments for ``{graph tensor: device pointer}`` (every input and output of
        the plan; extra names are ignored). Raises ``KeyError`` naming a missing tensor and
        :class:`MisalignedPointer` naming the pointers that are not :data:`ALIGN`-byte aligned.
        A generic program (``plan.dynamic``) also takes ``extents`` (by graph dim name): each kernel gets
        them as its ``int`` arguments after the pointers, and each launch the grid they give (default:
        the planned extents, where its buffers' sizes hold); a static program takes none (``ValueError``)."""
        dyn = self.plan.dynamic
        if dyn is None and extents is not None:
            raise ValueError("extents are bound only for a generic program")
        if dyn is not None and extents is None:
            extents = dict(dyn.planned)
        missing = sorted({t for _, t in self._io if t not in tensors})
        if missing:
            raise KeyError(f"no device pointer for graph tensors {missing}")
        bad = {t: int(tensors[t]) for _, t in self._io if int(tensors[t]) % ALIGN}
        if bad:
            raise MisalignedPointer(bad)
        ptrs = dict(self.scratch)
        ptrs.update({buf: int(tensors[t]) for buf, t in self._io})
        keep: list[np.ndarray] = []
        params = []
        ext = dict(extents or {})
        ints = [int(v) for v in dyn.arg_values(ext)] if dyn is not None else []
        for ln in self.plan.launches:
            # an int argument's slot holds it in its low 4 bytes (little-endian): the driver reads 4
            values = np.array([ptrs[a] for a in ln.args] + ints, dtype=np.uint64)
            n = len(ln.args) + len(ints)
            slots = np.array([values.ctypes.data + 8 * i for i in range(n)], dtype=np.uint64)
            keep += [values, slots]
            params.append((int(slots.ctypes.data) if n else 0, n))
        grids = None if dyn is None else tuple((dyn.grid(i, ext), 1, 1) for i in range(len(self.plan.launches)))
        return Bound(ptrs, tuple(params), tuple(keep), grids)

    def launch(self, bound: Bound, stream: int = 0) -> None:
        """Enqueue every launch of the plan with ``bound``'s arguments on ``stream`` (nothing else)."""
        launch = self.driver.launch
        with self._active:
            for i, ((func, grid, block, smem, coop), (params, n)) in enumerate(zip(self._calls, bound.params)):
                launch(func, grid if bound.grids is None else bound.grids[i], block, smem, stream, params, n, coop)

    def close(self) -> None:
        """Free the scratch buffers and unload the module (best effort: a dead context cannot free)."""
        try:
            with self._active:
                self._free()
        except DriverError:  # the context cannot even be made current
            pass

    def _free(self) -> None:
        while self.scratch:
            name, ptr = self.scratch.popitem()
            try:
                host = self.host.pop(name, None)
                if host is not None:
                    self.driver.host_free(host)
                else:
                    self.driver.mem_free(ptr)
            except DriverError:
                pass
        if self.module is not None:
            module, self.module = self.module, None
            try:
                self.driver.unload_module(module)
            except DriverError:
                pass

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def device_pointer(obj: Any, aligned: bool = False) -> int:
    """The device pointer of ``obj``'s ``__cuda_array_interface__``; ``ValueError`` when it is not
    C-contiguous, or (``aligned``) not :data:`ALIGN`-byte aligned; ``TypeError`` when it has no such
    interface."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if not isinstance(cai, Mapping):
        raise TypeError(f"{type(obj).__name__} exposes no __cuda_array_interface__")
    strides = cai.get("strides")
    if strides is not None:
        acc = np.dtype(cai["typestr"]).itemsize
        for d, st in reversed(tuple(zip(cai["shape"], strides))):
            if int(d) > 1 and int(st) != acc:
                raise ValueError("a C-contiguous device array is needed")
            acc *= int(d)
    ptr = int(cai["data"][0])
    if aligned and ptr % ALIGN:
        raise ValueError(f"device pointer {ptr:#x} is not {ALIGN}-byte aligned (a view with a storage offset, "
                         "e.g. x[1:]?): pass a copy")
    return ptr
