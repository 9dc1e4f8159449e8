"""The opaque custom op ``stitchtune::region`` that runs one stitched region inside a torch graph.

Contract
--------
* ``torch.ops.stitchtune.region(key, inputs) -> list[Tensor]`` runs the :class:`RegionKernel`
  registered under ``key`` (:func:`register`) on ``inputs`` (the region's graph inputs, in order) and
  returns new tensors, one per graph output, shaped and typed as the graph says. Its fake (meta)
  implementation returns empty tensors of those shapes on the inputs' device, so Inductor, AOTAutograd
  and CUDA-graph capture treat it as an opaque kernel.
* On CUDA tensors the kernel is launched through the one launch path
  (:class:`stitchtune.gpu.launch.Launcher`): the cubin is loaded and the scratch allocated once per
  GPU and stream (concurrent calls on different streams never share scratch), arguments are packed
  once per set of tensor pointers (:meth:`RegionKernel.launch_pointers`, cached), and each call
  allocates only its outputs (``torch.empty``, torch's caching allocator) and enqueues the launches
  on torch's current stream: no host copy, no synchronisation (capturable once the first call on that
  GPU and stream has run: a first call inside a capture raises a RegionError saying so). The GPU's
  primary context is pushed for the launch and popped after it (torch's current device never
  changes). An input that is not 16-byte aligned (a view with a storage offset, ``x[1:]``) is copied
  first: the kernels' vector loads would fault on it.
* An input that PyTorch holds permuted and the region's graph declares in its memory order
  (``RegionKernel.in_perms``, the region's ``input_perms``: ConvNeXt's channels-last convolution
  outputs) is passed as that permuted view, a free view of its storage; any other strided input (or
  one whose strides differ at run time) is made contiguous first, one copy (``copies`` counts them).
* On CPU tensors it runs the same program in the emulator (``cpu="emulate"``) or the graph's float64
  reference (``cpu="reference"``).
* A failure at run time raises :class:`RegionError` naming the region and its ops; the torch backend
  registers each kernel inside a :class:`GuardedRegion`, which then declines the region and runs its
  ATen ops instead (a gather's out-of-range index is raised).
* Gathers (embedding lookups) with an out-of-range index give zero rows and a :class:`RegionError`
  naming the gather, on every path: the emulator and the CUDA kernels raise their error flag, the
  float64 reference checks the indices on the host. On CUDA (``check_gather=True``, the default) a
  region with a gather synchronises after its launch to read the flag (a 4-byte copy); while a CUDA
  graph is being captured the flag is not read (logged once per region), and ``check_gather=False``
  never reads it (no synchronisation; bad rows are silently zero).

The real ``torch`` is imported by this module (it is only imported by the torch backend).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from stitchtune.errors import StitchtuneError

__all__ = ["Built", "DynamicRegionKernel", "GuardedRegion", "RegionError", "RegionKernel", "register", "region_op"]

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "bool": torch.bool,
           "int32": torch.int32, "int64": torch.int64}
_registry: dict[str, Any] = {}   # key -> RegionKernel | DynamicRegionKernel
_lock = threading.Lock()
#: packed argument sets kept per region and GPU (one per distinct set of pointers, oldest dropped)
MAX_BOUND = 64


class RegionError(StitchtuneError, RuntimeError):
    """A stitched region failed at run time (the message names the region and its ops)."""


@dataclass
class RegionKernel:
    """One compiled region: its graph, :class:`~stitchtune.deploy.compiled.CompiledGraph` and how CPU
    tensors are run (``"emulate"`` | ``"reference"``). ``driver``: a driver to launch CUDA tensors with
    (tests pass a :class:`~stitchtune.gpu.fake_driver.FakeDriver`; then CPU tensors go through the launch
    path too, their pointers passed as they are); None opens the GPU's at the first call.

    A *generic* kernel has ``sym`` (the region's
    :class:`~stitchtune.importers.torch_symbolic.SymbolicRegion`) and ``compiled`` a compiled bucket
    (:class:`~stitchtune.deploy.dynamic.CompiledBucket`): each call reads the extents of the
    symbolic sizes from its inputs and runs the one program at them (the emulator or the float64
    reference at the graph of those extents; on the launch path the extents are bound as kernel
    arguments, so nothing is rebuilt); its output shapes follow the extents."""

    name: str
    ops: tuple[str, ...]
    compiled: Any  # deploy.compiled.CompiledGraph
    cpu: str = "emulate"
    driver: Any = None
    #: PyTorch's output shapes when they differ from the graph's in leading 1s (same row-major bytes)
    out_shapes: tuple[tuple[int, ...], ...] | None = None
    #: read the gathers' error flags after a CUDA launch (see module docstring)
    check_gather: bool = True
    _launchers: dict[Any, Any] = field(default_factory=dict, repr=False)  # per (GPU index, stream)
    _out_specs: dict[Any, Any] = field(default_factory=dict, repr=False)  # per extents (None: static)
    #: whether the program has gathers (an error flag to read after a launch); set from ``compiled``
    _gathers: bool = field(init=False, repr=False, default=False)
    _capture_warned: bool = field(init=False, repr=False, default=False)
    #: a generic kernel's SymbolicRegion (see above); None for a kernel of one shape
    sym: Any = None
    #: per input: None, or the permutation that makes PyTorch's strided input the graph's row-major
    #: one (the region's ``input_perms``: the kernel reads ``t.permute(p)``, a free view)
    in_perms: tuple[tuple[int, ...] | None, ...] = ()
    #: per input: None, or the :class:`~stitchtune.importers.torch_windows.Window` the graph declares
    #: for it (the region's ``input_windows``: the kernel reads ``window.view(t)``, the larger tensor
    #: the part lies in, a free view)
    in_windows: tuple[Any, ...] = ()
    _graphs: dict[Any, Any] = field(default_factory=dict, repr=False)   # extents -> Graph (generic)

    def __post_init__(self) -> None:
        from stitchtune.lower.remap import gather_flag_buffers

        self._gathers = bool(gather_flag_buffers(self.compiled.program))

    @property
    def graph(self) -> Any:
        """The graph of a kernel of one shape (a generic kernel's depends on the extents: :meth:`at`)."""
        return self.compiled.graph

    def at(self, inputs: Sequence[Any]) -> tuple[Any, tuple[tuple[str, int], ...] | None]:
        """(graph, extents) of a call on ``inputs``: :attr:`graph` and None, or for a generic kernel the
        graph at the inputs' extents and those extents (sorted (name, extent) pairs)."""
        if self.sym is None:
            return self.compiled.graph, None
        ext = tuple((name, int(inputs[i].shape[axis])) for name, i, axis in self.sym.where)   # sorted by name
        return self._graph_at(ext), ext

    def _graph_at(self, ext: tuple[tuple[str, int], ...] | None) -> Any:
        """The graph at extents ``ext`` (:attr:`graph` for None), kept in a bounded cache."""
        if ext is None:
            return self.compiled.graph
        g = self._graphs.get(ext)
        if g is None:
            if len(self._graphs) >= MAX_BOUND:
                self._graphs.pop(next(iter(self._graphs)))
            g = self._graphs[ext] = self.compiled.dgraph.at(dict(ext))
        return g

    def _out_shapes(self, g: Any, ext: tuple[tuple[str, int], ...] | None) -> tuple[tuple[int, ...], ...]:
        """PyTorch's output shapes, in the graph's output order."""
        if ext is not None:
            return tuple(self.sym.graph_output_shapes(dict(ext)))
        return self.out_shapes or tuple(tuple(g.spec(o).shape) for o in g.outputs)

    def describe(self) -> str:
        return f"stitched region {self.name} ({', '.join(o.removeprefix('aten.') for o in self.ops)})"

    # -- shapes ------------------------------------------------------------------------------
    def empty_outputs(self, device: Any, inputs: Sequence[Any] = (),
                      ext: tuple[tuple[str, int], ...] | None = None) -> list[Any]:
        """New (uninitialised) output tensors on ``device``, one per graph output (a generic kernel's
        shaped for the extents ``ext``, by default those of ``inputs``)."""
        if self.sym is not None and ext is None:
            ext = self.at(inputs)[1]
        specs = self._out_specs.get(ext)
        if specs is None:
            g = self._graph_at(ext)
            specs = tuple((tuple(sh), _DTYPES[g.spec(o).dtype]) for sh, o in zip(self._out_shapes(g, ext), g.outputs))
            if len(self._out_specs) >= MAX_BOUND:
                self._out_specs.pop(next(iter(self._out_specs)))
            self._out_specs[ext] = specs
        return [torch.empty(shape, dtype=dt, device=device) for shape, dt in specs]

    # -- CPU ---------------------------------------------------------------------------------
    def run_cpu(self, inputs: Sequence[Any]) -> list[Any]:
        """Outputs for CPU tensors, computed by the emulator or the float64 reference."""
        from stitchtune.graph.reference import run_reference

        g, ext = self.at(inputs)
        # PyTorch may hold an input with other leading 1s than the graph (same row-major bytes)
        arrays = {n: _to_numpy(t, spec.dtype).reshape(spec.shape) for (n, spec), t in zip(g.inputs, inputs)}
        if self.cpu == "reference":
            from stitchtune.deploy.run_checks import check_gather_indices

            check_gather_indices(g, arrays)
            out = run_reference(g, arrays)
        elif ext is not None:
            out = self.compiled.emulate(dict(ext), **arrays)
        else:
            out = self.compiled.emulate(**arrays)
        shapes = self._out_shapes(g, ext)
        return [_from_numpy(np.asarray(out[o]).reshape(sh), g.spec(o).dtype) for sh, o in zip(shapes, g.outputs)]

    # -- CUDA --------------------------------------------------------------------------------
    def launcher(self, index: int, stream: int) -> tuple[Any, dict[Any, Any]]:
        """(Launcher, packed-arguments cache) for GPU ``index`` and ``stream``, made at the first call on
        them (scratch is per stream). Raises :class:`~stitchtune.gpu.launch.CaptureError` when that first
        call happens while ``stream`` captures a CUDA graph."""
        hit = self._launchers.get((index, stream))
        if hit is not None:
            return hit
        from stitchtune.deploy.compiled import _build
        from stitchtune.gpu.driver import open_driver
        from stitchtune.gpu.launch import Launcher, launch_plan

        cubin = self.compiled.cubin
        if cubin is None:
            cubin = _build(self.compiled.sources, self.compiled.device.arch)[1]
        driver = self.driver if self.driver is not None else open_driver(index)
        launcher = Launcher(driver, launch_plan(self.compiled.program), cubin, stream=stream)
        self._launchers[(index, stream)] = (launcher, {})
        return self._launchers[(index, stream)]

    def launch_pointers(self, index: int, pointers: tuple[int, ...], stream: int,
                        extents: tuple[tuple[str, int], ...] | None = None) -> None:
        """Enqueue the region's kernels for ``pointers`` (graph inputs then outputs, in graph order) on
        ``stream`` of GPU ``index``: the arguments are packed at the first call with these pointers
        (and, for a generic kernel, these ``extents``). A region with a gather then reads its error
        flag (``check_gather``; raises on a bad index)."""
        launcher, cache = self.launcher(index, stream)
        key = pointers if extents is None else (pointers, extents)
        bound = cache.get(key)
        if bound is None:
            g = self._graph_at(extents)
            names = [n for n, _ in g.inputs] + list(g.outputs)
            if len(cache) >= MAX_BOUND:
                cache.pop(next(iter(cache)))
            args = dict(zip(names, pointers))
            bound = cache[key] = launcher.bind(args) if extents is None else launcher.bind(args, dict(extents))
        launcher.launch(bound, stream)
        if self.check_gather and self._gathers:
            self._check_gather_flags(launcher, stream)

    def run_launch(self, inputs: Sequence[Any], stream: int | None = None, device: Any = None) -> list[Any]:
        """Outputs through the launch path: new tensors on ``device`` (default: the first input's; a
        region that reads no tensor must be given it), the kernels enqueued on torch's current stream
        (``stream`` for CPU tensors with a given driver, default 0). Inputs that are not
        :data:`~stitchtune.gpu.launch.ALIGN`-byte aligned are copied."""
        from stitchtune.gpu.launch import ALIGN

        inputs = [t if t.data_ptr() % ALIGN == 0 else t.clone() for t in inputs]
        dev = device if device is not None else inputs[0].device
        ext = None if self.sym is None else self.at(inputs)[1]
        outs = self.empty_outputs(dev, inputs, ext)
        ptrs = tuple([t.data_ptr() for t in inputs] + [t.data_ptr() for t in outs])
        if dev.type == "cuda":
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            stream = torch.cuda.current_stream(dev).cuda_stream
        else:
            index, stream = -1, int(stream or 0)
        self.launch_pointers(index, ptrs, stream, ext)
        return outs

    def _check_gather_flags(self, launcher: Any, stream: int) -> None:
        """After a launch on ``stream``: read the gathers' error flags (a synchronisation; a set flag is
        reset on ``stream``) and raise if one is set; skipped while ``stream`` captures a CUDA graph
        (module docstring)."""
        from stitchtune.deploy.run_checks import check_launch_gathers

        if launcher.driver.stream_capturing(stream):
            if not self._capture_warned:
                self._capture_warned = True
                log.warning("%s: captured in a CUDA graph; its gather index check is off there", self.describe())
            return
        check_launch_gathers(launcher, self.compiled.program, stream)

    def as_read(self, inputs: Sequence[Any]) -> list[Any]:
        """``inputs`` as the kernels read them: each permuted by its ``in_perms`` entry (a view), and
        made contiguous where that view is not (a copy: a strided input the graph does not declare in
        its memory order, or strides other than those the region was found with)."""
        if self.in_perms:
            inputs = [t if p is None else t.permute(p) for t, p in zip(inputs, self.in_perms)]
        if self.in_windows:
            inputs = [t if w is None else _windowed(w, t) for t, w in zip(inputs, self.in_windows)]
        return [t if t.is_contiguous() else t.contiguous() for t in inputs]

    def copies(self, inputs: Sequence[Any]) -> int:
        """How many of ``inputs`` (real or fake tensors) a call copies before its launch (:meth:`as_read`)."""
        perms = self.in_perms or (None,) * len(inputs)
        wins = self.in_windows or (None,) * len(inputs)
        return sum(w.view(t) is None if w is not None else not (t if p is None else t.permute(p)).is_contiguous()
                   for t, p, w in zip(inputs, perms, wins))

    def __call__(self, inputs: Sequence[Any], device: Any = None) -> list[Any]:
        """The region's outputs for ``inputs`` on ``device`` (default: the first input's, else the CPU):
        launched kernels on a CUDA device (or with a given driver), the emulator on the CPU."""
        inputs = self.as_read(inputs)
        dev = _device_of(inputs, device)
        try:
            if self.driver is not None or dev.type == "cuda":
                return self.run_launch(inputs, device=dev)
            return self.run_cpu(inputs)
        except Exception as exc:
            raise RegionError(f"{self.describe()} failed at run time: {type(exc).__name__}: {exc}") from exc


    def fake(self, inputs: Sequence[Any], device: Any = None) -> list[Any]:
        """The op's fake (meta) result: empty outputs on ``device`` (default: the first input's)."""
        return self.empty_outputs(_device_of(inputs, device), inputs)


def _windowed(window: Any, t: Any) -> Any:
    """``t`` (a part of a larger tensor) as the kernel reads it: ``window.view(t)``, the larger tensor
    (a view), or where ``t`` does not lie in such a window, a new one holding ``t`` at its place (a
    copy; the rest of it is never read)."""
    view = window.view(t)
    if view is not None:
        return view
    out = t.new_zeros(window.full)
    out.narrow(window.dim, window.start, t.shape[window.dim]).copy_(t)
    return out


@dataclass(frozen=True)
class Built:
    """A kernel :class:`DynamicRegionKernel`'s ``build`` made: ``kernel(inputs[, device]) -> outputs`` (a
    :class:`RegionKernel`), ``index[i]`` the position in its outputs of the module's output ``i``, and
    ``generic``: True when it runs every shape of the inputs' bucket (kept for the bucket), False
    when it is specialised to the inputs' shapes (kept for those shapes)."""

    kernel: Any
    index: tuple[int, ...]
    generic: bool = False


@dataclass
class _Entry:
    """One (structure, bucket) of a :class:`DynamicRegionKernel`'s cache: a generic kernel, or
    kernels per shape (None: no kernel for that shape, its ATen ops run)."""

    generic: Built | None = None
    shapes: dict[Any, Built | None] = field(default_factory=dict)


@dataclass
class DynamicRegionKernel:
    """A region with symbolic shapes. ``module`` (its ATen ops) gives the fake result and, where no
    kernel can be made, the eager one. Kernels are cached by (structure, bucket): the structure is
    the inputs' dtypes, device type and ranks; the bucket is ``bucket_of(inputs)`` (None, or when it
    raises: the exact input shapes). A cache miss calls ``build(inputs)`` -> :class:`Built`; a generic
    kernel then serves every shape of its bucket, a specialised one its shapes only. A failing build
    is logged once per shape, and that shape runs the region's ATen ops. ``counter`` (a
    :class:`~stitchtune.deploy.torch_stats.RegionCounter`) counts cache hits and eager calls; ``build``
    counts its own selections and builds."""

    name: str
    ops: tuple[str, ...]
    module: Any
    build: Any   # (inputs) -> Built
    compiled: Any = None   # the CompiledGraph at the example shapes (what explain reports)
    bucket_of: Any = None  # (inputs) -> hashable bucket; None: the exact shapes
    counter: Any = None
    #: per output, the axis order the kernels write it row-major in (the region's ``output_perms``:
    #: PyTorch keeps it permuted in memory); () or None: its own order
    perms: tuple[tuple[int, ...] | None, ...] = ()
    #: which of ``module``'s outputs the kernels return, in their order (None: all); the module also
    #: returns the no-op views a region's ``aliases`` stand for (GPT-2's fused qkv viewed for q beside
    #: the cache concats of k and v), which neither the fake nor the eager result may include
    keep: tuple[int, ...] | None = None
    kernels: dict[Any, _Entry] = field(default_factory=dict, repr=False)

    def describe(self) -> str:
        return f"stitched region {self.name} ({', '.join(o.removeprefix('aten.') for o in self.ops)})"

    def fake(self, inputs: Sequence[Any], device: Any = None) -> list[Any]:
        """Empty outputs shaped as the kernels write them (permuted by ``perms``; on the device the
        region's ATen ops put them, ``device`` unused)."""
        outs = self.module(*inputs)
        outs = outs if self.keep is None else [outs[k] for k in self.keep]
        perms = self.perms or (None,) * len(outs)
        return [torch.empty(o.shape if p is None else o.permute(p).shape, dtype=o.dtype, device=o.device)
                for o, p in zip(outs, perms)]

    def _eager(self, inputs: Sequence[Any]) -> list[Any]:
        return eager_outputs(self.module, inputs, self.perms or None, self.keep)

    def copies(self, inputs: Sequence[Any]) -> int:
        """How many of ``inputs`` a call copies before its launch: every strided one (the kernels of a
        region with symbolic sizes are mapped at contiguous inputs)."""
        return sum(not t.is_contiguous() for t in inputs)

    def _bucket(self, inputs: Sequence[Any], shapes: Any) -> Any:
        if self.bucket_of is None:
            return ("shapes", shapes)
        try:
            return ("bucket", self.bucket_of(inputs))
        except Exception as exc:  # noqa: BLE001 - outside every bucket: kernels per shape
            log.debug("%s: no bucket for shapes %s (%s)", self.describe(), [list(s) for s in shapes], exc)
            return ("shapes", shapes)

    def entries(self) -> list[tuple[Any, Any, Built | None]]:
        """The cache, flat: (bucket or None when keyed by the exact shapes, shapes or None for a
        generic kernel, kernel or None)."""
        out: list[tuple[Any, Any, Built | None]] = []
        for (_, (tag, b)), e in self.kernels.items():
            bucket = b if tag == "bucket" else None
            if e.generic is not None:
                out.append((bucket, None, e.generic))
            out += [(bucket, sh, b) for sh, b in e.shapes.items()]
        return out

    def __call__(self, inputs: Sequence[Any], device: Any = None) -> list[Any]:
        shapes = tuple(tuple(t.shape) for t in inputs)
        key = (tuple((t.dtype, t.device.type, t.dim()) for t in inputs), self._bucket(inputs, shapes))
        entry = self.kernels.get(key)
        if entry is None:
            entry = self.kernels[key] = _Entry()
        built = entry.generic
        if built is None and shapes in entry.shapes:
            built = entry.shapes[shapes]
            if built is None:
                self._count(eager=1)
                return self._eager(inputs)
        if built is not None:
            self._count(hits=1)
        else:
            try:
                built = self.build(inputs)
                log.info("%s: kernels made for shapes %s%s", self.describe(), [list(s) for s in shapes],
                         f" (bucket {key[1][1]})" if built.generic else "")
            except Exception as exc:  # noqa: BLE001 - this shape runs the region's ATen ops instead
                log.warning("%s: no kernel for shapes %s (%s); running its ATen ops", self.describe(),
                            [list(s) for s in shapes], exc)
                entry.shapes[shapes] = None
                self._count(eager=1)
                return self._eager(inputs)
            if built.generic:
                entry.generic = built
            else:
                entry.shapes[shapes] = built
        outs = built.kernel(inputs) if device is None else built.kernel(inputs, device)
        return [outs[i] for i in built.index]

    def _count(self, **n: int) -> None:
        if self.counter is not None:
            self.counter.add(**n)


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
    so no kernel computes them. ``device``: the device of the graph the region runs in (None: the
    first input's); a region that reads no tensor (an ``iota`` and its arithmetic) runs there, and an
    input on another device (a CPU 0-d tensor beside CUDA ones) is moved there first."""

    kernel: Any
    module: Any
    perms: tuple[tuple[int, ...] | None, ...]
    on_fail: Any = None
    #: which of ``module``'s outputs the kernel returns, in its order (None: all)
    keep: tuple[int, ...] | None = None
    failed: str | None = None
    held: tuple[tuple[int, Any], ...] = ()
    device: Any = None
    _specs: dict[Any, Any] = field(default_factory=dict, repr=False)   # input shapes checked -> specs
    _held_on: dict[Any, list[Any]] = field(default_factory=dict, repr=False)   # device -> held tensors there

    @property
    def compiled(self) -> Any:
        return self.kernel.compiled

    def describe(self) -> str:
        return str(self.kernel.describe())

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
                consts = self._held_on.get(device) or [t.to(device) for _, t in self.held]
                self._held_on[device] = consts
        out = list(inputs)
        for (i, _), t in zip(self.held, consts):
            out.insert(i, t)
        return out

    def fake(self, inputs: Sequence[Any]) -> list[Any]:
        return list(self.kernel.fake(self._with_held(inputs, fake=True), self.device))

    def copies(self, inputs: Sequence[Any]) -> int:
        """How many copy kernels a call on ``inputs`` (the op's arguments, real or fake: their strides
        count) launches before the region's kernels."""
        return int(self.kernel.copies(self._with_held(inputs, fake=True)))

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

    def eager(self, inputs: Sequence[Any]) -> list[Any]:
        """The region's outputs computed by its ATen ops, laid out as the kernel writes them."""
        return eager_outputs(self.module, inputs, self.perms, self.keep)

    def __call__(self, inputs: Sequence[Any]) -> list[Any]:
        inputs = self._with_held(inputs)
        if self.failed is None:
            try:
                outs = list(self.kernel(inputs, self.device))
                self._check(inputs, outs)
                return outs
            except Exception as exc:  # noqa: BLE001 - never break a model: the ATen ops run instead
                if is_index_error(exc):
                    raise
                self.failed = f"{type(exc).__name__}: {exc}"
                log.warning("%s failed at run time (%s); running its ATen ops from now on",
                            self.describe(), self.failed)
                if self.on_fail is not None:
                    self.on_fail(self.failed)
        return self.eager(inputs)


def _device_of(inputs: Sequence[Any], device: Any = None) -> Any:
    """``device`` when given, else the first input's device, else the CPU's."""
    if device is not None:
        return device
    return inputs[0].device if inputs else torch.device("cpu")


def register(key: str, kernel: RegionKernel | DynamicRegionKernel | GuardedRegion) -> None:
    """Make ``kernel`` what ``torch.ops.stitchtune.region(key, ...)`` runs."""
    with _lock:
        _registry[key] = kernel


def lookup(key: str) -> Any:
    k = _registry.get(key)
    if k is None:
        raise RegionError(f"no stitched region {key!r} in this process (compiled graphs are not portable "
                          "across processes)")
    return k


def region_op(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run the stitched region ``key`` on ``inputs`` (see module docstring)."""
    return lookup(key)(inputs)


def _region_fake(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return lookup(key).fake(inputs)


# A plain torch.library definition, not ``torch.library.custom_op``: the latter's Python wrappers cost
# ~30 us per call on the host (scripts/torch_overhead.py), this one a few.
_lib = torch.library.Library("stitchtune", "DEF")
_lib.define("region(str key, Tensor[] inputs) -> Tensor[]")
_lib.impl("region", region_op, "CompositeExplicitAutograd")
torch.library.register_fake("stitchtune::region", _region_fake, lib=_lib)


# ---------------------------------------------------------------------------- conversions
def _to_numpy(t: Any, dtype: str) -> np.ndarray:
    from stitchtune.graph.reference import numpy_dtype

    t = t.detach()
    if dtype == "bfloat16":
        return t.contiguous().view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
    if dtype == "bool":
        return t.numpy().astype(bool)
    return t.numpy()


def _from_numpy(a: np.ndarray, dtype: str) -> Any:
    from stitchtune.graph.reference import numpy_dtype

    a = np.asarray(a).astype(numpy_dtype(dtype), order="C", copy=False)   # keeps 0-d (ascontiguousarray does not)
    if dtype == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())
