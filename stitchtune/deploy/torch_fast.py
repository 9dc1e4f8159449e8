"""The thin per-call path of the torch op: a static region's call in a few microseconds of Python.

After the first call of a region has run (slow path: checks, launcher and scratch made, fake result
compared), :class:`~stitchtune.deploy.torch_guard.GuardedRegion` keeps a :class:`FastCall` for it and
every later call goes through it:

Contract
--------
* ``FastCall.run(inputs)`` (a closure over everything precomputed: no attribute lookups per call;
  also the object's ``__call__``) returns the outputs, or None when this call needs the slow path
  (an input unlike those of the call that made it: another count, shape, dtype, device, requires-grad
  flag or non-contiguous strides, checked by one call of dynamo's C++ ``TensorGuards`` where torch
  has it; or a pointer that is not 16-byte aligned); it never changes what a call computes. Per call
  it does only: that check, the pointers read, the held constants' pointers inserted, the outputs
  allocated by Inductor's own entry points (``torch._C._dynamo.guards._empty_strided_cuda``: torch's
  caching allocator on the current device, shapes, strides and dtypes precomputed; on the CPU
  ``_empty_strided_cpu``, malloc), torch's current stream read (``torch._C._cuda_getCurrentRawStream``,
  Inductor's own accessor), the gathers' error flags read from host memory
  (:mod:`~stitchtune.deploy.torch_flags`), the pointers written into the preallocated
  ``kernelParams`` of the stream (packed once: only the pointer slots are rewritten, only when they
  changed; the driver copies the parameters at each launch, so rewriting after it returns is safe,
  also while a CUDA graph captures) and the launches. No dictionary is built, nothing is logged,
  nothing waits.
* A stream met for the first time on a thread gets its launcher and packed arguments from the
  kernel (a first call while that stream captures a CUDA graph raises as the slow path does).
* No lock per call: the packed arguments (the parameter slots rewritten per call) and the call
  count are **per thread** (a ``threading.local`` dict of stream -> :class:`_Stream`), so two
  threads calling one region never share a slot between its rewrite and its launch; only making
  a thread's first :class:`_Stream` of a stream takes the lock. (The GIL alone would not do: a
  thread may be switched out between the rewrite and the launch.)
* The driver's context is made current per call only where it is not (``Activation.push``: the
  real drivers' one ``cuCtxGetCurrent`` check), popped after the launches only where pushed.
* Compiled graphs call their regions without torch's dispatcher:
  :mod:`stitchtune.deploy.torch_direct` (above this module and :mod:`~stitchtune.deploy.torch_ops`).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from functools import reduce
from itertools import starmap
from operator import attrgetter, or_
from typing import Any

__all__ = ["FastCall", "Rebound", "ShapeCalls"]


class Rebound:
    """One packed argument set of a launcher, kept and rewritten in place: :meth:`set` writes new
    pointers (graph inputs then outputs, in graph order) into ``buf``, one contiguous array of them
    that every launch's pointer parameters point into (each launch's ``kernelParams`` slot of an
    input or output holds the address of its entry in ``buf``, not of a copy: one slice assignment
    rewrites them all); ``bound`` is what ``launcher.launch`` takes. A generic kernel's is packed for
    one set of ``extents`` (its grids and ``int`` arguments). The driver copies the parameters at
    each launch, so rewriting them after a launch returned is safe (also while a CUDA graph
    captures)."""

    __slots__ = ("bound", "buf", "last")

    def __init__(self, launcher: Any, names: list[str], pointers: tuple[int, ...] | list[int],
                 extents: Any = None) -> None:
        args = dict(zip(names, pointers))
        self.bound = launcher.bind(args) if extents is None else launcher.bind(args, dict(extents))
        pos = {n: i for i, n in enumerate(names)}
        io = {b.name: pos[b.tensor] for b in launcher.plan.buffers if b.role in ("input", "output")}
        self.buf: Any = (ctypes.c_uint64 * max(len(pointers), 1))(*pointers)
        base = ctypes.addressof(self.buf)
        slots = self.bound._keep[1::2]   # per launch: its values array, then its slots array
        for ln, params in zip(launcher.plan.launches, slots):
            for q, a in enumerate(ln.args):
                if a in io:   # the kernel's parameter q reads the pointer from buf's entry
                    params[q] = base + 8 * io[a]
        self.last = list(pointers)   # what buf holds

    def set(self, pointers: list[int] | tuple[int, ...]) -> None:
        """Point the packed arguments at ``pointers`` (their alignment is the caller's to check)."""
        pointers = list(pointers)
        if pointers != self.last:
            self.buf[:] = pointers   # one C loop, every launch's parameters at once
            self.last = pointers


#: ``t.data_ptr()`` as a function: torch's own method descriptor once a FastCall is made (``map`` calls
#: it without a Python frame per tensor)
_data_ptr: Any = lambda t: int(t.data_ptr())  # noqa: E731


class _Stream:
    """What one stream's calls on one thread launch: (function, grid, block, smem, params, n,
    cooperative) per launch, the :class:`Rebound` arguments, the flags, the driver's ``push`` (makes
    its context current where it is not: True when it pushed) and ``pop``, ``calls`` (the calls
    that launched through it)."""

    __slots__ = ("launches", "args", "flags", "launcher", "push", "pop", "launch", "calls")

    def __init__(self, kernel: Any, index: int, stream: int, pointers: tuple[int, ...], ext: Any = None) -> None:
        launcher, _ = kernel.launcher(index, stream)
        self.flags = kernel._launchers[(index, stream)][2]
        g = kernel._graph_at(ext)
        self.args = Rebound(launcher, [n for n, _ in g.inputs] + list(g.outputs), pointers, ext)
        bound = self.args.bound
        grids = bound.grids or [grid for _, grid, _, _, _ in launcher._calls]   # as Launcher.launch
        self.launches = tuple((func, grid, block, smem, params, n, coop)
                              for (func, _, block, smem, coop), grid, (params, n)
                              in zip(launcher._calls, grids, bound.params))
        self.launcher = launcher
        activation = launcher.driver.activate()
        push = getattr(activation, "push", None)
        if push is None:   # a driver's own activation without push/pop: its with block
            def push() -> bool:
                activation.__enter__()
                return True

            self.pop: Callable[[], Any] = lambda: activation.__exit__(None, None, None)
        else:
            self.pop = activation.pop
        self.push: Callable[[], bool] = push
        self.launch = launcher.driver.launch
        self.calls = 0


class FastCall:
    """The thin per-call path of one static :class:`~stitchtune.deploy.torch_ops.RegionKernel` on the
    launch path (see module docstring): ``device`` the outputs' device, ``held`` (position, tensor)
    constants inserted before the inputs are read, ``first`` the inputs (held ones included) of the
    call that ran the full path: every later input must have its shape, dtype and device, be
    contiguous and 16-byte aligned, or the call takes the slow path (returns None)."""

    def __init__(self, kernel: Any, device: Any, held: Sequence[tuple[int, Any]] = (),
                 first: Sequence[Any] = (), ext: Any = None, order: Sequence[int] | None = None) -> None:
        import torch

        global _data_ptr
        _data_ptr = torch.Tensor.data_ptr   # a C method descriptor: map() calls it without a frame

        self.kernel = kernel
        self.device = device
        self.held = tuple(held)
        self.ext = ext   # a generic kernel's extents (sorted (name, value) pairs): bound as arguments
        self.specs = tuple(kernel.empty_outputs_specs(ext))
        #: which of the kernel's outputs the call returns, in its order (None: all, as they are)
        self.order = None if order is None or tuple(order) == tuple(range(len(self.specs))) else tuple(order)
        heldpos = {i for i, _ in self.held}
        given = [t for i, t in enumerate(first) if i not in heldpos]
        #: per input the op receives: (shape, dtype) it must have (a static region's never change)
        self.checks = tuple((tuple(t.shape), t.dtype) for t in given)
        self.n = len(self.checks) if first else -1
        self._held_ptrs = tuple((i, int(t.data_ptr())) for i, t in self.held)
        guards: Any = torch._C._dynamo.guards   # Inductor's own allocation entry points (no argument parsing)
        self._raw_stream: Any
        self._current: Any
        if device.type == "cuda":
            self.index = device.index if device.index is not None else torch.cuda.current_device()
            self._raw_stream = torch._C._cuda_getCurrentRawStream
            self._current = torch._C._cuda_getDevice
            # on the current device (checked per call), torch's caching allocator
            alloc = getattr(guards, "_empty_strided_cuda", None)
        else:   # CPU tensors with a given driver (tests, the host benchmark): stream 0
            self.index = -1
            self._raw_stream = None
            self._current = None
            alloc = getattr(guards, "_empty_strided_cpu", None) if device.type == "cpu" else None   # malloc
        if alloc is None:   # another device, or a torch without them: torch's own
            def alloc(shape: Any, stride: Any, dtype: Any) -> Any:
                return torch.empty_strided(shape, stride, dtype=dtype, device=device)
        self.alloc = alloc
        self.guard = _tensor_guard(given)
        self.outs = tuple((shape, _row_major(shape), dt) for shape, dt in self.specs)
        self._sync = kernel.check_gather == "sync"
        self._local = threading.local()   # per thread: .streams, its dict stream -> _Stream
        self._all: list[_Stream] = []   # every thread's (appended under the lock): for calls
        self._lock = threading.Lock()   # only while a thread makes a _Stream
        self._when = "at its next call (an earlier call's kernels met it)"
        #: the call itself, a closure over everything above (no attribute lookups per call)
        self.run: Callable[[Sequence[Any]], list[Any] | None] = self._closure()

    @property
    def calls(self) -> int:
        """Calls that launched (all threads)."""
        return sum(st.calls for st in list(self._all))

    def _stream(self, stream: int, ptrs: list[int]) -> _Stream:
        """This thread's :class:`_Stream` of ``stream``, made now (its first call there)."""
        local = self._local
        streams: dict[int, _Stream]
        try:
            streams = local.streams
        except AttributeError:
            streams = local.streams = {}
        st = streams.get(stream)
        if st is None:
            with self._lock:
                st = _Stream(self.kernel, self.index, stream, tuple(ptrs), self.ext)
                self._all.append(st)
            streams[stream] = st
        return st

    def __call__(self, inputs: Sequence[Any]) -> list[Any] | None:
        return self.run(inputs)

    def _closure(self) -> Callable[[Sequence[Any]], list[Any] | None]:
        n_in, guard, held_ptrs, index = self.n, self.guard, self._held_ptrs, self.index
        raw, current, alloc, out_specs = self._raw_stream, self._current, self.alloc, self.outs
        kernel, device, order, sync = self.kernel, self.device, self.order, self._sync
        local, make, when = self._local, self._stream, self._when
        data_ptr = _data_ptr

        def run(inputs: Sequence[Any]) -> list[Any] | None:
            if len(inputs) != n_in or not guard(*inputs):
                return None
            ptrs = list(map(data_ptr, inputs))   # map and starmap: no Python frame per item
            for i, p in held_ptrs:
                ptrs.insert(i, p)
            if raw is None:
                stream = 0
                outs = list(starmap(alloc, out_specs))
            else:
                stream = raw(index)
                if current() == index:   # _empty_strided_cuda allocates on the current device
                    outs = list(starmap(alloc, out_specs))
                else:
                    outs = kernel.empty_outputs(device)
            ptrs += map(data_ptr, outs)
            if reduce(or_, ptrs, 0) & 15:   # a pointer not 16-byte aligned (a view at an odd offset)
                return None
            try:   # this thread's (no lock: nothing here is shared with another thread)
                st = local.streams[stream]
            except (AttributeError, KeyError):   # the thread's first call on this stream
                st = make(stream, ptrs)
            st.calls += 1
            flags = st.flags
            if flags is not None:
                flags.raise_if_set(when)
            args = st.args
            if ptrs != args.last:   # the caching allocator often hands out the same blocks again
                args.set(ptrs)
            launch = st.launch
            pushed = st.push()   # only where the context is not current
            try:
                for func, grid, block, smem, params, n, coop in st.launches:
                    launch(func, grid, block, smem, stream, params, n, coop)
            finally:
                if pushed:
                    st.pop()
            if sync and flags is not None:
                kernel._sync_check(st.launcher, flags, stream)
            if order is not None:
                return [outs[i] for i in order]
            return outs

        return run


class ShapeCalls:
    """The thin paths of a region with symbolic shapes (a
    :class:`~stitchtune.deploy.torch_region_dynamic.DynamicRegionKernel`): one :class:`FastCall` per
    input shapes met, at most ``limit`` (the oldest dropped), None for shapes that need the full path
    (no kernel, the emulator). A call tries the thin path that ran last (its guard checks the shapes),
    then the one kept for its shapes; it returns None (the full path) for shapes without one; each thin
    call is a cache hit of the region: :attr:`hits`, which ``counter`` (a
    :class:`~stitchtune.deploy.torch_stats.RegionCounter`) adds to its own at a snapshot."""

    def __init__(self, counter: Any = None, limit: int = 64) -> None:
        self.calls: dict[Any, FastCall | None] = {}
        self.limit = limit
        self._dropped = 0   # the calls of thin paths dropped from the cache
        if counter is not None:
            counter.thin.append(self)
        calls = self.calls
        last: list[FastCall | None] = [None]   # the thin path that ran last: tried first (its guard checks the shapes)

        def run(inputs: Sequence[Any]) -> list[Any] | None:
            call = last[0]
            if call is not None:
                outs = call.run(inputs)
                if outs is not None:
                    return outs
            call = calls.get(tuple(map(_shape, inputs)))
            if call is None:
                return None
            last[0] = call
            return call.run(inputs)

        #: the call itself, a closure (what GuardedRegion calls)
        self.run: Callable[[Sequence[Any]], list[Any] | None] = run
        self._last = last

    @property
    def hits(self) -> int:
        """Calls that took a thin path."""
        return self._dropped + sum(c.calls for c in list(self.calls.values()) if c is not None)

    @staticmethod
    def key(inputs: Sequence[Any]) -> tuple[Any, ...]:
        """The shapes of ``inputs`` (the op's arguments), as calls are kept by."""
        return tuple(map(_shape, inputs))

    def add(self, inputs: Sequence[Any], call: FastCall | None) -> None:
        if len(self.calls) >= self.limit:
            old = self.calls.pop(next(iter(self.calls)))
            self._dropped += old.calls if old is not None else 0
            if self._last[0] is old:
                self._last[0] = None
        self.calls[self.key(inputs)] = call

    def __call__(self, inputs: Sequence[Any]) -> list[Any] | None:
        return self.run(inputs)


_shape = attrgetter("shape")


def _tensor_guard(first: Sequence[Any]) -> Any:
    """A callable ``guard(*inputs) -> bool``: True when every input has the shape, dtype, device
    and requires-grad flag of its ``first`` counterpart and is contiguous
    (row-major strides; a dimension of size 1 may have any). Dynamo's own C++ tensor check
    (``torch._C._dynamo.guards.TensorGuards``: one call for all inputs) where this torch has it,
    else the same checks in Python."""
    import torch

    sizes = [list(t.shape) for t in first]
    strides = [[None if d == 1 else s for d, s in zip(t.shape, _row_major(t.shape))] for t in first]
    try:
        guards: Any = torch._C._dynamo.guards
        check = guards.TensorGuards(*first, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides).check
    except (AttributeError, TypeError, RuntimeError):   # not in this torch: checked in Python
        specs = tuple((tuple(t.shape), t.dtype, t.device, t.requires_grad) for t in first)

        def check(*inputs: Any) -> bool:
            for t, (shape, dtype, device, grad) in zip(inputs, specs):
                if (t.dtype is not dtype or t.shape != shape or not t.is_contiguous()
                        or t.device != device or t.requires_grad is not grad):
                    return False
            return True

    return check


def _row_major(shape: Sequence[int]) -> tuple[int, ...]:
    """The contiguous strides of ``shape`` (in elements)."""
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(strides))
