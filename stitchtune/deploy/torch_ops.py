"""The opaque custom op ``stitchtune::region`` that runs one stitched region inside a torch graph.

Contract
--------
* ``torch.ops.stitchtune.region(key, inputs, scalars=[]) -> list[Tensor]`` runs the :class:`RegionKernel`
  registered under ``key`` (:func:`register`) on ``inputs`` (the region's graph inputs, in order) and
  returns new tensors, one per graph output, shaped and typed as the graph says. ``scalars``: SymInt
  values (a decode step's past length) that the registered :class:`~stitchtune.deploy.torch_guard.GuardedRegion`
  fills into the int64 inputs it binds (``bound``, :mod:`stitchtune.importers.torch_symvalues`) on each call. Its fake (meta)
  implementation returns empty tensors of those shapes on the inputs' device, so Inductor, AOTAutograd
  and CUDA-graph capture treat it as an opaque kernel.
* On CUDA tensors the kernel is launched through the one launch path
  (:class:`stitchtune.gpu.launch.Launcher`): the cubin is loaded and the scratch allocated once per
  GPU and stream (concurrent calls on different streams never share scratch), arguments are packed
  once (:meth:`RegionKernel.launch_pointers`: later calls rewrite the pointers), and each call
  allocates only its outputs (``torch.empty``, torch's caching allocator) and enqueues the launches
  on torch's current stream: no host copy, no synchronisation (capturable once the first call on that
  GPU and stream has run: a first call inside a capture raises a RegionError saying so). The GPU's
  primary context is pushed for the launch and popped after it (torch's current device never
  changes). An input that is not 16-byte aligned (a view with a storage offset, ``x[1:]``) is copied
  first: the kernels' vector loads would fault on it; an input whose size differs from the region's
  raises a :class:`RegionError` (no kernel reads past it). After a first call has run this full
  path, the region's :class:`GuardedRegion` calls it through the thin path of
  :mod:`stitchtune.deploy.torch_fast` (same result, a few microseconds of Python; one per input shapes
  for a region with symbolic shapes); a graph run as it is calls :func:`region_op` without the
  dispatcher (:func:`~stitchtune.deploy.torch_direct.direct_calls`).
* :func:`stand_in_driver` makes every kernel without a driver of its own launch through a given
  driver, CPU tensors too (CPU tests of the launch path under the backend).
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
  naming the region, the gather and its index input, on every path: the emulator and the CUDA kernels
  raise their error flag, the float64 reference checks the indices on the host. On the launch path
  (``check_gather=True``, the default) the flags are mapped host memory, read without a
  synchronisation or a copy: a flag set by a call is raised at the region's next call, after the
  compiled graph's call (the backend) or at ``stitchtune.torch.check_errors()``
  (:mod:`stitchtune.deploy.torch_flags`); ``check_gather="sync"`` (debug) also waits for each launch
  and raises at once; ``check_gather=False`` never reads them (bad rows are silently zero).

The real ``torch`` is imported by this module (it is only imported by the torch backend).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from stitchtune.deploy.torch_region_protocols import RegisteredRegion
from stitchtune.errors import StitchtuneError

if TYPE_CHECKING:
    from stitchtune.deploy.compiled_graph import CompiledGraph
    from stitchtune.deploy.dynamic import CompiledBucket
    from stitchtune.gpu.driver import Driver
    from stitchtune.graph.parse import Graph
    from stitchtune.importers.torch_symbolic import SymbolicRegion

__all__ = ["RegionError", "RegionKernel", "RegisteredRegion", "register", "region_op"]

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "bool": torch.bool,
           "int32": torch.int32, "int64": torch.int64, "float64": torch.float64}
_registry: dict[str, "RegisteredRegion"] = {}
_lock = threading.Lock()
#: packed argument sets kept per region, GPU and stream (one per set of extents, oldest dropped)
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
    compiled: CompiledGraph | CompiledBucket   # a CompiledBucket exactly where ``sym`` is set
    cpu: str = "emulate"
    driver: Driver | None = None
    #: PyTorch's output shapes when they differ from the graph's in leading 1s (same row-major bytes)
    out_shapes: tuple[tuple[int, ...], ...] | None = None
    #: the gathers' error flags: True (read from mapped host memory at later calls), "sync" (also wait
    #: for each launch and read them at once: a debug option), False (never read; see module docstring)
    check_gather: bool | str = True
    _launchers: dict[Any, Any] = field(default_factory=dict, repr=False)  # per (GPU index, stream)
    _out_specs: dict[Any, Any] = field(default_factory=dict, repr=False)  # per extents (None: static)
    #: whether the program has gathers (an error flag to read after a launch); set from ``compiled``
    _gathers: bool = field(init=False, repr=False, default=False)
    _capture_warned: bool = field(init=False, repr=False, default=False)
    #: the GatherFlags of every launcher made (checked after each call of the compiled graph)
    flag_sets: list[Any] = field(init=False, repr=False, default_factory=list)
    #: a generic kernel's SymbolicRegion (see above); None for a kernel of one shape
    sym: SymbolicRegion | None = None
    #: per input: None, or the permutation that makes PyTorch's strided input the graph's row-major
    #: one (the region's ``input_perms``: the kernel reads ``t.permute(p)``, a free view)
    in_perms: tuple[tuple[int, ...] | None, ...] = ()
    #: per input: None, or the :class:`~stitchtune.importers.torch_windows.Window` the graph declares
    #: for it (the region's ``input_windows``: the kernel reads ``window.view(t)``, the larger tensor
    #: the part lies in, a free view)
    in_windows: tuple[Any, ...] = ()
    _graphs: dict[Any, Any] = field(default_factory=dict, repr=False)   # extents -> Graph (generic)

    def __post_init__(self) -> None:
        from stitchtune.lower.gather import gather_flag_buffers

        self._gathers = bool(gather_flag_buffers(self.compiled.program))

    @property
    def graph(self) -> Graph:
        """The graph of a kernel of one shape (a generic kernel's depends on the extents: :meth:`at`)."""
        return self._one_shape().graph

    def _one_shape(self) -> CompiledGraph:
        """``compiled`` of a kernel of one shape (``ValueError`` for a generic one)."""
        from stitchtune.deploy.compiled_graph import CompiledGraph

        if not isinstance(self.compiled, CompiledGraph):
            raise ValueError(f"{self.describe()} is a generic kernel: its graph depends on the extents")
        return self.compiled

    def _generic(self) -> tuple[CompiledBucket, SymbolicRegion]:
        """``compiled`` and ``sym`` of a generic kernel (``ValueError`` for a kernel of one shape)."""
        from stitchtune.deploy.dynamic import CompiledBucket

        if self.sym is None or not isinstance(self.compiled, CompiledBucket):
            raise ValueError(f"{self.describe()} is a kernel of one shape, not a generic one")
        return self.compiled, self.sym

    def at(self, inputs: Sequence[Any]) -> tuple[Any, tuple[tuple[str, int], ...] | None]:
        """(graph, extents) of a call on ``inputs``: :attr:`graph` and None, or for a generic kernel the
        graph at the inputs' extents and those extents (sorted (name, extent) pairs)."""
        if self.sym is None:
            return self._one_shape().graph, None
        ext = tuple((name, int(inputs[i].shape[axis])) for name, i, axis in self.sym.where)   # sorted by name
        return self._graph_at(ext), ext

    def _graph_at(self, ext: tuple[tuple[str, int], ...] | None) -> Any:
        """The graph at extents ``ext`` (:attr:`graph` for None), kept in a bounded cache."""
        if ext is None:
            return self._one_shape().graph
        g = self._graphs.get(ext)
        if g is None:
            if len(self._graphs) >= MAX_BOUND:
                self._graphs.pop(next(iter(self._graphs)))
            g = self._graphs[ext] = self._generic()[0].dgraph.at(dict(ext))
        return g

    def _out_shapes(self, g: Any, ext: tuple[tuple[str, int], ...] | None) -> tuple[tuple[int, ...], ...]:
        """PyTorch's output shapes, in the graph's output order."""
        if ext is not None:
            return tuple(self._generic()[1].graph_output_shapes(dict(ext)))
        return self.out_shapes or tuple(tuple(g.spec(o).shape) for o in g.outputs)

    def describe(self) -> str:
        return f"stitched region {self.name} ({', '.join(o.removeprefix('aten.') for o in self.ops)})"

    # -- shapes ------------------------------------------------------------------------------
    def empty_outputs_specs(self, ext: tuple[tuple[str, int], ...] | None = None) -> tuple[Any, ...]:
        """(shape, torch dtype) per graph output (a generic kernel's at the extents ``ext``)."""
        specs = self._out_specs.get(ext)
        if specs is None:
            g = self._graph_at(ext)
            specs = tuple((tuple(sh), _DTYPES[g.spec(o).dtype]) for sh, o in zip(self._out_shapes(g, ext), g.outputs))
            if len(self._out_specs) >= MAX_BOUND:
                self._out_specs.pop(next(iter(self._out_specs)))
            self._out_specs[ext] = specs
        return specs

    def empty_outputs(self, device: Any, inputs: Sequence[Any] = (),
                      ext: tuple[tuple[str, int], ...] | None = None) -> list[Any]:
        """New (uninitialised) output tensors on ``device``, one per graph output (a generic kernel's
        shaped for the extents ``ext``, by default those of ``inputs``)."""
        if self.sym is not None and ext is None:
            ext = self.at(inputs)[1]
        return [torch.empty(shape, dtype=dt, device=device) for shape, dt in self.empty_outputs_specs(ext)]

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
            out = self._generic()[0].emulate(dict(ext), **arrays)
        else:
            out = self._one_shape().emulate(**arrays)
        shapes = self._out_shapes(g, ext)
        return [_from_numpy(np.asarray(out[o]).reshape(sh), g.spec(o).dtype) for sh, o in zip(shapes, g.outputs)]

    # -- CUDA --------------------------------------------------------------------------------
    def launcher(self, index: int, stream: int) -> tuple[Any, dict[Any, Any]]:
        """(Launcher, packed-arguments cache) for GPU ``index`` and ``stream``, made at the first call on
        them (scratch is per stream; the gathers' error flags in mapped host memory,
        :mod:`~stitchtune.deploy.torch_flags`). Raises :class:`~stitchtune.gpu.launch.CaptureError`
        when that first call happens while ``stream`` captures a CUDA graph."""
        hit = self._launchers.get((index, stream))
        if hit is not None:
            return hit[0], hit[1]
        return self._make_launcher(index, stream)[:2]

    def _make_launcher(self, index: int, stream: int,
                       extents: tuple[tuple[str, int], ...] | None = None) -> tuple[Any, dict[Any, Any], Any]:
        from stitchtune.deploy.device_run import build_cubin as _build
        from stitchtune.deploy.torch_flags import GatherFlags
        from stitchtune.gpu.driver import open_driver
        from stitchtune.gpu.launch import Launcher, launch_plan
        from stitchtune.lower.gather import gather_flag_buffers

        stand_in = _STAND_IN[0]
        cubin = self.compiled.cubin
        if cubin is None:
            cubin = stand_in[1](self.compiled) if stand_in else _build(self.compiled.sources, self.compiled.device.arch)[1]
        driver = self.driver if self.driver is not None else stand_in[0] if stand_in else open_driver(index)
        buffers = gather_flag_buffers(self.compiled.program) if self.check_gather else {}
        plan = launch_plan(self.compiled.program)
        launcher = Launcher(driver, plan, cubin, stream=stream, mapped=buffers)
        flags = None
        if buffers:
            if self.sym is not None and extents is None:
                extents = tuple(sorted((str(k), int(v)) for k, v in plan.dynamic.planned.items()))
            flags = GatherFlags.of(self.describe(), launcher, buffers, self._graph_at(extents))
            self.flag_sets.append(flags)
        made: tuple[Any, dict[Any, Any], Any] = (launcher, {}, flags)
        self._launchers[(index, stream)] = made
        return made

    def launch_pointers(self, index: int, pointers: tuple[int, ...], stream: int,
                        extents: tuple[tuple[str, int], ...] | None = None) -> None:
        """Enqueue the region's kernels for ``pointers`` (graph inputs then outputs, in graph order) on
        ``stream`` of GPU ``index``: the arguments are packed once per stream (and, for a generic
        kernel, per ``extents``), later calls only rewrite the pointers that changed
        (:class:`~stitchtune.deploy.torch_fast.Rebound`). No synchronisation, no copy: a region with a
        gather first raises for a flag an earlier launch set (read from host memory), and only with
        ``check_gather="sync"`` waits for its launches and reads the flag at once."""
        hit = self._launchers.get((index, stream))
        launcher, cache, flags = hit if hit is not None else self._make_launcher(index, stream, extents)
        if flags is not None:
            flags.raise_if_set("at its next call (an earlier call's kernels met it)")
        rebound = cache.get(extents)
        if rebound is None:
            from stitchtune.deploy.torch_fast import Rebound

            g = self._graph_at(extents)
            if len(cache) >= MAX_BOUND:
                cache.pop(next(iter(cache)))
            rebound = cache[extents] = Rebound(launcher, [n for n, _ in g.inputs] + list(g.outputs), pointers, extents)
        else:
            from stitchtune.gpu.launch import MisalignedPointer

            if any(int(p) % 16 for p in pointers):   # what bind refuses (it checks a first call's)
                g = self._graph_at(extents)
                names = [n for n, _ in g.inputs] + list(g.outputs)
                raise MisalignedPointer({n: int(p) for n, p in zip(names, pointers) if int(p) % 16})
            rebound.set(pointers)
        launcher.launch(rebound.bound, stream)
        if flags is not None and self.check_gather == "sync":
            self._sync_check(launcher, flags, stream)

    def _sync_check(self, launcher: Any, flags: Any, stream: int) -> None:
        """``check_gather="sync"``: wait for the launches and raise for a set flag (not while ``stream``
        captures a CUDA graph, where waiting is illegal: logged once, checked later as by default)."""
        drv = launcher.driver
        with drv.activate():
            if drv.stream_capturing(stream):
                if not self._capture_warned:
                    self._capture_warned = True
                    log.warning("%s: captured in a CUDA graph; its gather check runs after the graph, not "
                                "after each launch", self.describe())
                return
            drv.synchronize()
        flags.raise_if_set("right after its launch (check_gather='sync')")

    def run_launch(self, inputs: Sequence[Any], stream: int | None = None, device: Any = None) -> list[Any]:
        """Outputs through the launch path: new tensors on ``device`` (default: the first input's; a
        region that reads no tensor must be given it), the kernels enqueued on torch's current stream
        (``stream`` for CPU tensors with a given driver, default 0). Inputs that are not
        :data:`~stitchtune.gpu.launch.ALIGN`-byte aligned are copied."""
        from stitchtune.gpu.launch import ALIGN

        inputs = [t if t.data_ptr() % ALIGN == 0 else t.clone() for t in inputs]
        dev = device if device is not None else inputs[0].device
        g, ext = self.at(inputs)
        _check_sizes(g, inputs)
        outs = self.empty_outputs(dev, inputs, ext)
        ptrs = tuple([t.data_ptr() for t in inputs] + [t.data_ptr() for t in outs])
        if dev.type == "cuda":
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            stream = torch.cuda.current_stream(dev).cuda_stream
        else:
            index, stream = -1, int(stream or 0)
        self.launch_pointers(index, ptrs, stream, ext)
        return outs

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
            if self.launches_on(dev):
                return self.run_launch(inputs, device=dev)
            return self.run_cpu(inputs)
        except Exception as exc:
            raise RegionError(f"{self.describe()} failed at run time: {type(exc).__name__}: {exc}") from exc


    def launches_on(self, device: Any) -> bool:
        """Whether calls on ``device`` go through the launch path (CUDA, a given driver or a stand-in)."""
        return device.type == "cuda" or self.driver is not None or _STAND_IN[0] is not None

    @property
    def counter(self) -> None:
        """None: a kernel of one region's shape counts nothing itself (the backend counts its builds,
        a :class:`~stitchtune.deploy.torch_region_dynamic.DynamicRegionKernel` its buckets' calls)."""
        return None

    def fast_path(self, device: Any, held: Sequence[tuple[int, Any]] = (), first: Sequence[Any] = (),
                  order: Sequence[int] | None = None) -> Any:
        """A :class:`~stitchtune.deploy.torch_fast.FastCall` for later calls on ``device`` (with the
        ``held`` constants inserted) whose inputs are like ``first`` (the inputs, held ones included, of
        a call that ran the full path: shapes, dtypes, device; a generic kernel's is bound to their
        extents), returning the outputs ``order`` (None: all), or None where every call needs the full
        path (permuted or windowed inputs, the emulator)."""
        if (any(p is not None for p in self.in_perms) or any(w is not None for w in self.in_windows)
                or not self.launches_on(device) or (self.sym is not None and not first)):
            return None
        from stitchtune.deploy.torch_fast import FastCall

        ext = None if self.sym is None else self.at(first)[1]
        return FastCall(self, device, held, first, ext, order)

    def fake(self, inputs: Sequence[Any], device: Any = None) -> list[Any]:
        """The op's fake (meta) result: empty outputs on ``device`` (default: the first input's)."""
        return self.empty_outputs(_device_of(inputs, device), inputs)


def _check_sizes(g: Any, inputs: Sequence[Any]) -> None:
    """Raise when an input has not the elements and element size its graph input has (PyTorch may
    hold it with other leading 1s): the kernels would read past its end."""
    from stitchtune.graph.values import ITEMSIZE

    if len(inputs) != len(g.inputs):
        raise RegionError(f"{len(inputs)} input(s) given, the region reads {len(g.inputs)}")
    for i, ((name, spec), t) in enumerate(zip(g.inputs, inputs)):
        if t.numel() != spec.numel or t.element_size() != ITEMSIZE[spec.dtype]:
            raise RegionError(f"input {i} ({name}): {list(t.shape)} {t.dtype}, the region reads "
                              f"{list(spec.shape)} {spec.dtype}")


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


def _device_of(inputs: Sequence[Any], device: Any = None) -> Any:
    """``device`` when given, else the first input's device, else the CPU's."""
    if device is not None:
        return device
    return inputs[0].device if inputs else torch.device("cpu")


#: (driver, image of a CompiledGraph) that every RegionKernel without a driver of its own launches
#: through, CPU tensors too (:func:`stand_in_driver`); [None]: the GPU's
_STAND_IN: list[Any] = [None]


@contextlib.contextmanager
def stand_in_driver(driver: Any, image: Any) -> Iterator[None]:
    """Within the block, kernels without a driver of their own launch through ``driver`` (a
    :class:`~stitchtune.gpu.fake_driver.FakeDriver`: CPU tests of the launch path under the backend),
    ``image(compiled)`` their module image where no cubin is built; launchers made then keep it."""
    old = _STAND_IN[0]
    _STAND_IN[0] = (driver, image)
    try:
        yield
    finally:
        _STAND_IN[0] = old


def register(key: str, kernel: RegisteredRegion) -> None:
    """Make ``kernel`` what ``torch.ops.stitchtune.region(key, ...)`` runs."""
    with _lock:
        _registry[key] = kernel


def lookup(key: str) -> Any:   # Any: callers use the concrete kernel's own methods (``copies``, ``kernel``)
    k = _registry.get(key)
    if k is None:
        raise RegionError(f"no stitched region {key!r} in this process (compiled graphs are not portable "
                          "across processes)")
    return k


def region_op(key: str, inputs: list[torch.Tensor], scalars: Sequence[int] = ()) -> list[torch.Tensor]:
    """Run the stitched region ``key`` on ``inputs`` and the SymInt values ``scalars`` (see module docstring)."""
    k: Any = _registry.get(key)   # Any: with ``scalars``, a GuardedRegion with bound inputs
    k = k if k is not None else lookup(key)
    return k(inputs, scalars) if scalars else k(inputs)  # type: ignore[no-any-return]


def _region_fake(key: str, inputs: list[torch.Tensor], scalars: Sequence[Any] = ()) -> list[torch.Tensor]:
    k = lookup(key)
    out: list[torch.Tensor] = k.fake(inputs, scalars) if scalars else k.fake(inputs)
    return out


# A plain torch.library definition, not ``torch.library.custom_op``: the latter's Python wrappers cost
# ~30 us per call on the host (scripts/torch_overhead.py), this one a few.
_lib = torch.library.Library("stitchtune", "DEF")  # type: ignore[no-untyped-call]  # torch.library is untyped
_lib.define("region(str key, Tensor[] inputs, SymInt[] scalars=[]) -> Tensor[]")  # type: ignore[no-untyped-call]
_lib.impl("region", region_op, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
torch.library.register_fake("stitchtune::region", _region_fake, lib=_lib)


# ---------------------------------------------------------------------------- conversions
def _to_numpy(t: Any, dtype: str) -> np.ndarray:
    from stitchtune.graph.reference import numpy_dtype

    t = t.detach()
    out: np.ndarray
    if dtype == "bfloat16":
        out = t.contiguous().view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
    elif dtype == "bool":
        out = t.numpy().astype(bool)
    else:
        out = t.numpy()
    return out


def _from_numpy(a: np.ndarray, dtype: str) -> Any:
    from stitchtune.graph.reference import numpy_dtype

    a = np.asarray(a).astype(numpy_dtype(dtype), order="C", copy=False)   # keeps 0-d (ascontiguousarray does not)
    if dtype == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())
