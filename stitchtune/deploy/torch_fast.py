"""The thin per-call path of the torch op: a static region's call in a few microseconds of Python.

After the first call of a region has run (slow path: checks, launcher and scratch made, fake result
compared), :class:`~stitchtune.deploy.torch_guard.GuardedRegion` keeps a :class:`FastCall` for it and
every later call goes through it:

Contract
--------
* :meth:`FastCall.__call__(inputs)` returns the outputs, or None when this call needs the slow path
  (an input that is not contiguous, or a pointer that is not 16-byte aligned); it never changes what a
  call computes. Per call it does only: the held constants inserted, one ``torch.empty`` per output
  (torch's caching allocator; shapes and dtypes precomputed), the pointers read, torch's current
  stream read (``torch._C._cuda_getCurrentRawStream``, Inductor's own accessor), the gathers' error
  flags read from host memory (:mod:`~stitchtune.deploy.torch_flags`), the pointers written into the
  preallocated ``kernelParams`` of the stream (packed once: only the pointer slots are rewritten; the
  driver copies the parameters at each launch, so rewriting after it returns is safe, also while a
  CUDA graph captures) and the launches. No dictionary is built, nothing is logged, nothing waits.
* A stream met for the first time gets its launcher and packed arguments from the kernel (a first
  call while that stream captures a CUDA graph raises as the slow path does).
* Concurrent calls are serialised per :class:`FastCall` (the parameter slots are shared).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["FastCall", "Rebound"]


class Rebound:
    """One packed argument set of a launcher, kept and rewritten in place: :meth:`set` writes new
    pointers (graph inputs then outputs, in graph order) into its pointer slots, only those that
    changed; ``bound`` is what ``launcher.launch`` takes. A generic kernel's is packed for one set of
    ``extents`` (its grids and ``int`` arguments). The driver copies the parameters at each launch,
    so rewriting them after a launch returned is safe (also while a CUDA graph captures)."""

    __slots__ = ("bound", "slots", "last")

    def __init__(self, launcher: Any, names: list[str], pointers: tuple[int, ...] | list[int],
                 extents: Any = None) -> None:
        args = dict(zip(names, pointers))
        self.bound = launcher.bind(args) if extents is None else launcher.bind(args, dict(extents))
        pos = {n: i for i, n in enumerate(names)}
        io = {b.name: pos[b.tensor] for b in launcher.plan.buffers if b.role in ("input", "output")}
        self.slots: list[tuple[Any, int, int]] = []
        values = self.bound._keep[0::2]   # per launch: its values array, then its slots array
        for ln, vals in zip(launcher.plan.launches, values):
            arr = (ctypes.c_uint64 * len(vals)).from_buffer(vals)
            self.slots += [(arr, q, io[a]) for q, a in enumerate(ln.args) if a in io]
        self.last = list(pointers)   # what the slots hold

    def set(self, pointers: list[int] | tuple[int, ...]) -> None:
        """Point the packed arguments at ``pointers`` (their alignment is the caller's to check)."""
        if list(pointers) != self.last:
            for arr, q, i in self.slots:
                arr[q] = pointers[i]
            self.last = list(pointers)


class _Stream:
    """What one stream's calls launch: (function, grid, block, smem, params, n, cooperative) per
    launch, the :class:`Rebound` arguments, the flags."""

    __slots__ = ("launches", "args", "flags", "launcher", "activation", "launch")

    def __init__(self, kernel: Any, index: int, stream: int, pointers: tuple[int, ...]) -> None:
        launcher, _ = kernel.launcher(index, stream)
        self.flags = kernel._launchers[(index, stream)][2]
        g = kernel.graph
        self.args = Rebound(launcher, [n for n, _ in g.inputs] + list(g.outputs), pointers)
        bound = self.args.bound
        self.launches = tuple((func, grid, block, smem, params, n, coop)
                              for (func, grid, block, smem, coop), (params, n) in zip(launcher._calls, bound.params))
        self.launcher = launcher
        self.activation = launcher.driver.activate()
        self.launch = launcher.driver.launch


class FastCall:
    """The thin per-call path of one static :class:`~stitchtune.deploy.torch_ops.RegionKernel` on the
    launch path (see module docstring): ``device`` the outputs' device, ``held`` (position, tensor)
    constants inserted before the inputs are read."""

    def __init__(self, kernel: Any, device: Any, held: Sequence[tuple[int, Any]] = ()) -> None:
        import torch

        self.kernel = kernel
        self.device = device
        self.held = tuple(held)
        self.specs = tuple(kernel.empty_outputs_specs())
        self.empty = torch.empty
        if device.type == "cuda":
            self.index = device.index if device.index is not None else torch.cuda.current_device()
            raw = torch._C._cuda_getCurrentRawStream
            index = self.index
            self.stream: Callable[[], int] = lambda: int(raw(index))
        else:   # CPU tensors with a given driver (tests): stream 0
            self.index = -1
            self.stream = lambda: 0
        self._streams: dict[int, _Stream] = {}
        self._lock = threading.Lock()
        self._when = "at its next call (an earlier call's kernels met it)"

    def __call__(self, inputs: Sequence[Any]) -> list[Any] | None:
        if self.held:
            inputs = list(inputs)
            for i, t in self.held:
                inputs.insert(i, t)
        ptrs = []
        for t in inputs:
            p = t.data_ptr()
            if p & 15 or not t.is_contiguous():
                return None
            ptrs.append(p)
        empty, dev = self.empty, self.device
        outs = [empty(shape, dtype=dt, device=dev) for shape, dt in self.specs]
        for o in outs:
            p = o.data_ptr()
            if p & 15:
                return None
            ptrs.append(p)
        stream = self.stream()
        with self._lock:
            st = self._streams.get(stream)
            if st is None:
                st = self._streams[stream] = _Stream(self.kernel, self.index, stream, tuple(ptrs))
            if st.flags is not None:
                st.flags.raise_if_set(self._when)
            st.args.set(ptrs)   # the caching allocator often hands out the same blocks again: then nothing
            launch = st.launch
            with st.activation:
                for func, grid, block, smem, params, n, coop in st.launches:
                    launch(func, grid, block, smem, stream, params, n, coop)
        if st.flags is not None and self.kernel.check_gather == "sync":
            self.kernel._sync_check(st.launcher, st.flags, stream)
        return outs
