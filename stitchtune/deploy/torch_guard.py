"""What the torch backend registers for each region: :class:`GuardedRegion`, a kernel with its region's
ATen ops to fall back on, and the helpers it shares with the kernels (:func:`eager_outputs`,
:func:`is_index_error`). (:mod:`stitchtune.deploy.torch_ops` registers it; this module imports that one, never the reverse).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from stitchtune.deploy.torch_ops import RegionError, RegionKernel, _device_of, _lock
from stitchtune.deploy.torch_region_protocols import GuardedKernel

__all__ = ["GuardedRegion", "StreamBuffers", "eager_outputs", "is_index_error", "kept_tensors"]

if TYPE_CHECKING:
    from stitchtune.deploy.compiled_graph import CompiledGraph
    from stitchtune.deploy.dynamic import CompiledBucket

log = logging.getLogger("stitchtune.deploy.torch_ops")   # its records keep the op's logger name


def eager_outputs(module: Any, inputs: Sequence[Any], perms: Sequence[Any] | None = None,
                  keep: Sequence[int] | None = None) -> list[Any]:
    """A region's ATen ops (``module``) run on ``inputs``: its outputs ``keep`` (default all), each
    new and row-major in the axis order ``perms[i]`` (None: its own), as a kernel writes it; never a
    view of an input."""
    every = list(module(*inputs))
    outs = []
    for i, o in enumerate(every if keep is None else [every[k] for k in keep]):
        p = perms[i] if perms else None
        o = (o if p is None else o.permute(p)).contiguous()
        if o._base is not None or any(o.data_ptr() == t.data_ptr() for t in inputs):
            o = o.clone()
        outs.append(o)
    return outs


def kept_tensors(device: Any, make: Callable[[], list[Any]], cuda: Any = None) -> list[Any]:
    """``make()``: tensors on ``device`` that a region keeps across its calls (held constants, the
    buffers of bound SymInt inputs), made where no CUDA-graph pool takes their memory. Inductor's
    CUDA-graph trees route every allocation on their stream, their warm-up run included (a region's
    first call), to the graph's private pool and recycle its blocks at their checkpoints, knowing only
    the tensors they track: a tensor kept from there could be handed out again under us. So on a CUDA
    device ``make`` runs on a side stream (after the current stream's work; the trees' pool takes
    only their own stream's allocations), the current stream waits for it (a copy ``make`` enqueued is
    complete before the region's launches), and each tensor is recorded on the current stream
    (freeing it waits for that stream's work). Elsewhere ``make()`` as it is. ``cuda``: the
    ``torch.cuda``-like module (tests pass a fake)."""
    if device.type != "cuda":
        return make()
    cuda = torch.cuda if cuda is None else cuda
    current = cuda.current_stream(device)
    side = cuda.Stream(device)
    side.wait_stream(current)
    with cuda.stream(side):
        made = make()
    current.wait_stream(side)
    for t in made:
        t.record_stream(current)
    return made


class StreamBuffers:
    """Small device buffers a kernel call refills in place instead of allocating per call (the buffers of
    a region's bound SymInt inputs, a cache write's start): :meth:`get` returns, per thread and per
    (device, current stream), the tensors ``make()`` made there at the first call (through
    :func:`kept_tensors`: outside any CUDA-graph pool), the same tensors at every later call there. The
    caller refills them with the stream's own ops (``fill_``, ``copy_``) before it enqueues the launch
    that reads them: a launch an earlier call enqueued on the same thread and stream runs before the
    next refill (stream order), so a value is never overwritten under it; another thread or stream has
    buffers of its own. They are made as normal tensors even inside ``torch.inference_mode`` (an inference
    tensor could not be refilled by a later call outside it). An owner dataclass declares it ``compare=False``."""

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self, device: Any, make: Callable[[], list[Any]]) -> list[Any]:
        """This thread's buffers on ``device`` at its current stream (``make()`` at the first call there)."""
        stream = torch._C._cuda_getCurrentRawStream(device.index if device.index is not None
                                                     else torch.cuda.current_device()) \
            if device.type == "cuda" else 0
        buffers: dict[Any, list[Any]] | None = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = {}
        made = buffers.get((device, stream))
        if made is None:
            with torch.inference_mode(False):   # a normal tensor: refilled outside inference mode too
                made = buffers[(device, stream)] = kept_tensors(device, make)
        return made


def is_index_error(exc: BaseException) -> bool:
    """True for a gather's out-of-range index (a flagged error of the model's input, raised as it is:
    running the ATen ops instead would fail too, and on CUDA with a device-side assert)."""
    return "index out of range" in str(exc)


@dataclass
class GuardedRegion:
    """What the torch backend registers: ``kernel`` (a :class:`RegionKernel` or
    :class:`DynamicRegionKernel`), and the region's ATen ops (``module``) to run instead when the
    kernel fails at run time. The first failure calls ``on_fail(reason)`` (the backend reports the
    region as declined) and is logged once; from then on every call runs ``module`` (its outputs
    made contiguous in the kernel's axis order ``perms``, never aliasing an input). A gather's
    out-of-range index (:func:`is_index_error`) is raised, not hidden. ``held``: (position, tensor)
    for region inputs that are constants (a causal mask, position ids) which the op's caller does not
    pass: they are put back at their positions (on the region's device, below) before every call,
    so no kernel computes them. ``bound``: region inputs made from the call's SymInt ``scalars``
    (``full(shape, value)``, int64, on the region's device; :mod:`stitchtune.importers.torch_symvalues`). ``device``: the device of the graph the region runs in (None: the
    first input's); a region that reads no tensor (an ``iota`` and its arithmetic) runs there, and an
    input on another device (a CPU 0-d tensor beside CUDA ones) is moved there first."""

    kernel: GuardedKernel
    module: Any
    perms: tuple[tuple[int, ...] | None, ...]
    on_fail: Any = None
    #: which of ``module``'s outputs the kernel returns, in its order (None: all)
    keep: tuple[int, ...] | None = None
    failed: str | None = None
    held: tuple[tuple[int, Any], ...] = ()
    device: Any = None
    #: (position, shape, dtype) of the inputs that hold the call's SymInt ``scalars``, in input order
    #: (:func:`~stitchtune.importers.torch_symvalues.bound_inputs`): buffers on the region's device
    #: filled with the values at each call, so a new value is data, never a new kernel; shape None: a
    #: size's carrier (:mod:`~stitchtune.importers.torch_symsizes`), a one-element buffer expanded to
    #: ``(value,)`` (stride 0: its extent is the size; no data, never read, nothing allocated per call)
    bound: tuple[tuple[int, tuple[int, ...] | None, Any], ...] = ()
    _specs: dict[Any, Any] = field(default_factory=dict, repr=False)   # input shapes checked -> specs
    _held_on: dict[Any, list[Any]] = field(default_factory=dict, repr=False)   # device -> held tensors there
    #: the bound inputs' buffers per thread and (device, stream), refilled at each call
    _bound_at: StreamBuffers = field(default_factory=StreamBuffers, repr=False, compare=False)
    #: the thin path (:mod:`~stitchtune.deploy.torch_fast`) once a call has run the full one: a
    #: FastCall, or for a kernel with symbolic shapes a ShapeCalls (one per input shapes); None: none
    _fast: Any = field(default=None, repr=False)

    @property
    def compiled(self) -> CompiledGraph | CompiledBucket | None:
        return self.kernel.compiled

    @property
    def flag_sets(self) -> list[Any]:
        """The kernel's gathers' error flags (:mod:`~stitchtune.deploy.torch_flags`), one set per launcher."""
        return list(self.kernel.flag_sets)

    def describe(self) -> str:
        return self.kernel.describe()

    def _with_held(self, inputs: Sequence[Any], fake: bool = False) -> list[Any]:
        """``inputs`` with the held constants inserted at their positions (``fake``: empty tensors of
        their shapes and strides, made in the active fake mode)."""
        device = _device_of(inputs, self.device)
        inputs = [t if t.device == device else t.to(device) for t in inputs]
        if not self.held:
            return inputs
        if fake:
            consts = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device) for _, t in self.held]
        else:
            with _lock:
                consts = self._held_on.get(device) or kept_tensors(device, lambda: [t.to(device) for _, t in self.held])
                self._held_on[device] = consts
        out = list(inputs)
        for (i, _), t in zip(self.held, consts):
            out.insert(i, t)
        return out

    def _with_bound(self, inputs: Sequence[Any], scalars: Sequence[Any], fake: bool = False) -> list[Any]:
        """``inputs`` (the op's tensors) with the bound inputs, holding ``scalars``, inserted at their
        positions among the passed inputs (the held constants are inserted after: :meth:`_with_held`);
        ``fake``: empty tensors (in the active fake mode; ``scalars`` may be fewer)."""
        if not self.bound:
            return list(inputs)
        if not fake and len(scalars) != len(self.bound):
            raise RegionError(f"{self.describe()}: {len(scalars)} SymInt value(s) for {len(self.bound)} bound input(s)")
        device = _device_of(inputs, self.device)
        if fake:
            made = [torch.empty(shape if shape is not None else (scalars[k] if k < len(scalars) else 1,),
                                dtype=dtype, device=device) for k, (_, shape, dtype) in enumerate(self.bound)]
        else:
            made = []
            for (_, shape, _), t, v in zip(self.bound, self._bound_buffers(device), scalars):
                if shape is None:   # a carrier: its extent is the size
                    made.append(t.expand(int(v)))
                else:
                    t.fill_(int(v))
                    made.append(t)
        held = [i for i, _ in self.held]
        out = list(inputs)
        for (i, _, _), t in zip(self.bound, made):
            out.insert(i - sum(h < i for h in held), t)
        return out

    def _bound_buffers(self, device: Any) -> list[Any]:
        """The bound inputs' buffers on ``device`` for this thread and stream (:class:`StreamBuffers`; the
        caller fills them)."""
        return self._bound_at.get(device, lambda: [torch.empty(shape if shape is not None else (1,), dtype=dtype,
                                                               device=device) for _, shape, dtype in self.bound])

    def fake(self, inputs: Sequence[Any], scalars: Sequence[Any] = ()) -> list[Any]:
        inputs = self._with_bound(inputs, scalars, fake=True)
        return list(self.kernel.fake(self._with_held(inputs, fake=True), self.device))

    def copies(self, inputs: Sequence[Any]) -> int:
        """How many copy kernels a call on ``inputs`` (the op's tensor arguments, real or fake: their
        strides count) launches before the region's kernels."""
        return self.kernel.copies(self._with_held(self._with_bound(inputs, (), fake=True), fake=True))

    def _check(self, inputs: Sequence[Any], outs: Sequence[Any]) -> None:
        """Raise when the kernel's outputs are not what its fake result promised (shape, dtype);
        checked at the first call of a static kernel (its shapes never change), per input shapes of a
        dynamic one."""
        static = isinstance(self.kernel, RegionKernel)
        key = () if static else tuple(tuple(t.shape) for t in inputs)
        if key in self._specs:
            return
        want = [(tuple(f.shape), f.dtype) for f in self.kernel.fake(inputs)]
        got = [(tuple(o.shape), o.dtype) for o in outs]
        if got != want:
            raise RegionError(f"{self.describe()}: outputs {got}, its fake result says {want}")
        self._specs[key] = want

    def _make_fast(self, raw: Sequence[Any], inputs: Sequence[Any]) -> Any:
        """The thin path for later calls, when this call's inputs (``raw``: as passed) were all on the
        region's device (else every call moves one: the full path stays)."""
        device = _device_of(inputs, self.device)
        if any(t.device != device for t in raw):
            return None
        consts = self._held_on.get(device, []) if self.held else []
        return self.kernel.fast_path(device, tuple((i, t) for (i, _), t in zip(self.held, consts)), inputs)

    def _add_fast(self, raw: Sequence[Any], inputs: Sequence[Any]) -> None:
        """Keep the thin path of a region with symbolic shapes for ``raw``'s shapes (once per shapes)."""
        from stitchtune.deploy.torch_fast import ShapeCalls

        calls = self._fast
        if calls is None:
            calls = self._fast = ShapeCalls(self.kernel.counter)
        if ShapeCalls.key(raw) not in calls.calls:
            calls.add(raw, self._make_fast(raw, inputs))

    def eager(self, inputs: Sequence[Any]) -> list[Any]:
        """The region's outputs computed by its ATen ops, laid out as the kernel writes them."""
        return eager_outputs(self.module, inputs, self.perms, self.keep)

    def __call__(self, inputs: Sequence[Any], scalars: Sequence[Any] = ()) -> list[Any]:
        if self.bound:   # the SymInt values in the region's int inputs (filled on its device, as data)
            inputs = self._with_bound(inputs, scalars)
        fast = self._fast
        if fast is not None:
            try:
                outs: list[Any] | None = fast.run(inputs)
            except Exception as exc:  # noqa: BLE001 - the full path below reports or declines it
                if is_index_error(exc):
                    raise
                outs = None
            if outs is not None:
                return outs
        raw = inputs
        inputs = self._with_held(inputs)
        if self.failed is None:
            try:
                outs = list(self.kernel(inputs, self.device))
                self._check(inputs, outs)
                if isinstance(self.kernel, RegionKernel):
                    if fast is None:
                        self._fast = self._make_fast(raw, inputs)
                else:   # symbolic shapes: a thin path per input shapes
                    self._add_fast(raw, inputs)
                return outs
            except Exception as exc:  # noqa: BLE001 - never break a model: the ATen ops run instead
                if is_index_error(exc):
                    raise
                self.failed = f"{type(exc).__name__}: {exc}"
                self._fast = None
                log.warning("%s failed at run time (%s); running its ATen ops from now on",
                            self.describe(), self.failed)
                if self.on_fail is not None:
                    self.on_fail(self.failed)
        return self.eager(inputs)
