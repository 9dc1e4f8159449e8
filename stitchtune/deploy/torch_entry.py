"""PyTorch entry point: ``stitchtune.deploy.torch_entry.compile(fn, db=..., example_inputs=...)``.

Contract
--------
* :func:`compile` imports ``fn`` (a function or ``nn.Module`` of tensors) at the shapes and dtypes of
  ``example_inputs`` with :func:`stitchtune.importers.torch_import.import_torch`, then compiles the
  graph with :func:`stitchtune.deploy.compiled.compile` (schedule from the tuning database ``db``: tuned record,
  nearest shape or heuristic, see :mod:`stitchtune.deploy.selection`). A module's parameters and buffers become
  graph inputs whose values are captured at compile time (compile again after changing them).
* The returned :class:`StitchedFunction` is called like ``fn`` with positional tensors. It returns one
  tensor when the graph has one output, else a tuple in ``fn``'s output order.
* On CUDA (default) the kernels are launched through the one launch path
  (:class:`stitchtune.gpu.launch.Launcher`, cuda-python, the primary context torch uses) from
  ``tensor.data_ptr()`` on the torch stream current at each call
  (``torch.cuda.current_stream().cuda_stream``): no copy goes through the host, nothing is
  synchronised; outputs are new tensors on the inputs' GPU; scratch/barrier buffers are allocated and
  initialised once per GPU and stream (concurrent calls on different streams never share them; the
  first call on a stream must not be inside a CUDA-graph capture: run once before capturing);
  arguments are packed once per set of tensor pointers. The GPU's primary context is pushed for the
  call and popped after it (torch's current device is left alone). A tensor that is not 16-byte
  aligned (a view with a storage offset, ``x[1:]``) is copied first. A graph with gathers reads their
  error flags after the launch (a synchronisation; not while capturing) and raises naming a gather
  that met an out-of-range index. The cubin is :attr:`CompiledGraph.cubin` (built through the nvcc
  builder's cache when missing); no file is written.
* ``emulate=True`` runs the same program in the CPU emulator on CPU tensors (tests, small shapes).
* A tensor the kernels cannot take is refused with :class:`TensorRefused` (a ``StitchtuneError`` and a
  ``ValueError``), one problem per argument: not a tensor, wrong device (CPU tensor without
  ``emulate``, CUDA tensor with it, tensors on different GPUs), wrong dtype, wrong shape (the
  kernels are specialised to the example shapes), or ``requires_grad`` with autograd enabled (no
  backward). Non-contiguous tensors are made contiguous on their device first.

The real ``torch`` is imported inside functions only (``import torch as _torch``; absolute imports
make that the PyTorch package, not this module).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from stitchtune.errors import StitchtuneError, ToolchainError
from stitchtune.tune.dbpath import DEFAULT_DB, DefaultDB

if TYPE_CHECKING:
    from stitchtune.deploy.compiled_graph import CompiledGraph

log = logging.getLogger(__name__)


class TensorRefused(StitchtuneError, ValueError):
    """An argument the compiled kernels cannot take; ``problems`` says why, one line per argument."""


def torch_dtype(name: str) -> Any:
    """The torch dtype of graph dtype ``name``."""
    import torch as _torch

    return {"float32": _torch.float32, "float16": _torch.float16, "bfloat16": _torch.bfloat16,
            "bool": _torch.bool, "int32": _torch.int32, "int64": _torch.int64, "float64": _torch.float64}[name]


def _to_numpy(t: Any, dtype: str) -> np.ndarray:
    import torch as _torch

    from stitchtune.graph.reference import numpy_dtype

    # every graph dtype is exactly representable in float32
    out: np.ndarray = t.detach().to(_torch.float32).cpu().numpy().astype(numpy_dtype(dtype))
    return out


def _from_numpy(a: np.ndarray, dtype: str, device: Any = "cpu") -> Any:
    import torch as _torch

    return _torch.from_numpy(np.ascontiguousarray(a).astype(np.float32)).to(device=device, dtype=torch_dtype(dtype))


@dataclass(frozen=True)
class StitchedFunction:
    """A compiled PyTorch callable (see module docstring). ``compiled`` is the :class:`CompiledGraph`;
    ``arg_names`` the graph inputs fed by positional arguments; ``params`` the captured values of the
    remaining graph inputs (module parameters and buffers)."""

    compiled: CompiledGraph
    arg_names: tuple[str, ...]
    params: tuple[tuple[str, np.ndarray], ...] = field(repr=False)
    emulate: bool = False
    method: str = "export"
    _state: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def __repr__(self) -> str:
        """One line: the arguments, how it runs, and the compiled graph's own one-line repr."""
        where = "CPU emulator" if self.emulate else "CUDA"
        return (f"<StitchedFunction ({', '.join(self.arg_names)}) on {where}, captured with {self.method}, "
                f"{len(self.params)} captured parameter(s): {self.compiled!r}>")

    @property
    def graph(self) -> Any:
        return self.compiled.graph

    @property
    def source(self) -> str:
        """Where the schedule came from: tuned | nearest-shape | heuristic | given."""
        return str(self.compiled.source)

    def check(self, args: Sequence[Any]) -> None:
        """Raise :class:`TensorRefused` listing every argument the kernels cannot take."""
        import torch as _torch

        if len(args) != len(self.arg_names):
            raise TensorRefused(f"{self.graph.name}: expected {len(self.arg_names)} tensor arguments "
                                f"({', '.join(self.arg_names)}), got {len(args)}")
        problems = []
        cuda_index = None
        for name, t in zip(self.arg_names, args):
            spec = self.graph.spec(name)
            if not isinstance(t, _torch.Tensor):
                problems.append(f"argument {name!r}: a torch.Tensor is needed, not {type(t).__name__}")
                continue
            want_dt = torch_dtype(spec.dtype)
            if t.dtype != want_dt:
                problems.append(f"argument {name!r}: dtype {t.dtype}, compiled for {want_dt}")
            if tuple(t.shape) != tuple(spec.shape):
                problems.append(f"argument {name!r}: shape {list(t.shape)}, compiled for {list(spec.shape)} "
                                "(the kernels are specialised to the example shapes: compile again)")
            if self.emulate and t.device.type != "cpu":
                problems.append(f"argument {name!r}: on {t.device}; emulate=True runs on CPU tensors")
            elif not self.emulate and t.device.type != "cuda":
                problems.append(f"argument {name!r}: on {t.device}; the stitched kernels run on CUDA tensors "
                                "(move it with .cuda(), or compile with emulate=True)")
            elif not self.emulate:
                if cuda_index is None:
                    cuda_index = t.device.index
                elif t.device.index != cuda_index:
                    problems.append(f"argument {name!r}: on {t.device}, the others on cuda:{cuda_index}")
            if t.requires_grad and _torch.is_grad_enabled():
                problems.append(f"argument {name!r}: requires grad; the stitched kernels have no backward "
                                "(call under torch.no_grad() or detach it)")
        if problems:
            raise TensorRefused(problems=[f"{self.graph.name}: {p}" for p in problems])

    def __call__(self, *args: Any) -> Any:
        self.check(args)
        outs = self._emulate(args) if self.emulate else self._cuda(args)
        return outs[0] if len(outs) == 1 else tuple(outs)

    # -- CPU emulator --------------------------------------------------------------------------
    def _emulate(self, args: Sequence[Any]) -> list[Any]:
        g = self.graph
        arrays = {n: _to_numpy(t, g.spec(n).dtype) for n, t in zip(self.arg_names, args)}
        arrays.update(dict(self.params))
        out = self.compiled.emulate(**arrays)
        return [_from_numpy(out[o], g.spec(o).dtype) for o in g.outputs]

    # -- CUDA ----------------------------------------------------------------------------------
    def _launcher(self, index: int, stream: int) -> tuple[Any, dict[str, Any], dict[Any, Any]]:
        """(Launcher, {param input: tensor}, bound-arguments cache) for GPU ``index`` and ``stream``, made
        at the first call on them (the cubin from :attr:`compiled`, else built once through the
        builder's cache; the parameters uploaded once per GPU)."""
        key = ("cuda", index, stream)
        hit: tuple[Any, dict[str, Any], dict[Any, Any]] | None = self._state.get(key)
        if hit is not None:
            return hit
        from stitchtune.deploy.device_run import build_cubin as _build
        from stitchtune.gpu.driver import open_driver
        from stitchtune.gpu.launch import Launcher, launch_plan

        cubin = self.compiled.cubin or self._state.get("cubin")
        if cubin is None:
            cubin = self._state["cubin"] = _build(self.compiled.sources, self.compiled.device.arch)[1]
        launcher = Launcher(open_driver(index), launch_plan(self.compiled.program), cubin, stream=stream)
        params = self._state.get(("params", index))
        if params is None:
            params = self._state[("params", index)] = {n: to_torch(a, f"cuda:{index}") for n, a in self.params}
        made: tuple[Any, dict[str, Any], dict[Any, Any]] = (launcher, params, {})
        self._state[key] = made
        return made

    def _cuda(self, args: Sequence[Any]) -> list[Any]:
        import torch as _torch

        device = args[0].device if args else _torch.device("cuda", _torch.cuda.current_device())
        index = device.index if device.index is not None else _torch.cuda.current_device()
        stream = int(_torch.cuda.current_stream(device).cuda_stream)
        launcher, params, bound_cache = self._launcher(index, stream)
        outs = {o: _torch.empty(self.graph.spec(o).shape, dtype=torch_dtype(self.graph.spec(o).dtype),
                                device=device) for o in self.graph.outputs}
        tensors = {n: t.contiguous() for n, t in zip(self.arg_names, args)}
        tensors.update(params)
        self.launch_tensors(launcher, bound_cache, {**tensors, **outs}, stream)
        return [outs[o] for o in self.graph.outputs]

    def launch_tensors(self, launcher: Any, bound_cache: dict[Any, Any], tensors: dict[str, Any],
                       stream: int) -> None:
        """Launch the kernels on ``stream`` for ``tensors`` (every graph input and output by name; any
        not :data:`~stitchtune.gpu.launch.ALIGN`-byte aligned is an input and is copied first),
        arguments packed once per set of pointers; then, for a graph with gathers and outside a
        capture, read their error flags (raises StitchtuneError naming a gather that met a bad index)."""
        from stitchtune.deploy.run_checks import check_launch_gathers
        from stitchtune.gpu.launch import ALIGN

        tensors = {n: t if t.data_ptr() % ALIGN == 0 else t.clone() for n, t in tensors.items()}
        ptrs = {n: int(t.data_ptr()) for n, t in tensors.items()}
        key = tuple(ptrs.values())
        bound = bound_cache.get(key)
        if bound is None:
            if len(bound_cache) >= MAX_BOUND:
                bound_cache.pop(next(iter(bound_cache)))
            bound = bound_cache[key] = launcher.bind(ptrs)
        launcher.launch(bound, stream)
        if self._gathers and not launcher.driver.stream_capturing(stream):
            check_launch_gathers(launcher, self.compiled.program, stream)

    @property
    def _gathers(self) -> bool:
        """Whether the program has gathers (error flags to read after a launch)."""
        hit = self._state.get("gathers")
        if hit is None:
            from stitchtune.lower.gather import gather_flag_buffers

            hit = self._state["gathers"] = bool(gather_flag_buffers(self.compiled.program))
        return bool(hit)


#: packed argument sets kept per GPU (one per distinct set of tensor pointers seen, oldest dropped)
MAX_BOUND = 64


def to_torch(arr: np.ndarray, device: str = "cuda") -> Any:
    """A numpy array (bfloat16 included, as ml_dtypes) as a torch tensor on ``device``."""
    import torch as _torch

    a = np.ascontiguousarray(arr)
    if a.dtype.name == "bfloat16":
        return _torch.from_numpy(a.view(np.int16)).view(_torch.bfloat16).to(device)
    return _torch.from_numpy(a).to(device)


def to_host(t: Any) -> np.ndarray:
    """A tensor's values as a float32 numpy array on the host (every graph dtype fits exactly)."""
    out: np.ndarray = t.float().cpu().numpy()
    return out


def compile(fn: Any, db: str | os.PathLike[str] | None | DefaultDB = DEFAULT_DB,
            example_inputs: Sequence[Any] | Any = (), *, device: Any = None, emulate: bool = False,
            schedule: Any = None, name: str | None = None) -> StitchedFunction:
    """Import ``fn`` at ``example_inputs`` (tensors, positional), compile it with the tuning database
    ``db`` (default ``$STITCHTUNE_DB``, else ``./tuning-db``; None: none) and return a
    :class:`StitchedFunction` (see module docstring). ``device``: a Device or preset
    name for schedule selection (default: the GPU of the example inputs or torch's current GPU; with
    ``emulate=True`` and no GPU, the H200 preset). ``schedule``: use this schedule instead."""
    import torch as _torch

    from stitchtune.deploy.compiled import compile as api_compile
    from stitchtune.importers.torch_import import (
        all_positional,
        import_torch,
        torch_dtype_name,
    )

    examples = (example_inputs,) if isinstance(example_inputs, _torch.Tensor) else tuple(example_inputs)
    if not examples:
        raise StitchtuneError("stitchtune.deploy.torch_entry.compile needs example_inputs (the tensors fn is called with)")
    problems = [f"example input {i}: a torch.Tensor is needed, not {type(t).__name__}"
                for i, t in enumerate(examples) if not isinstance(t, _torch.Tensor)]
    if problems:
        raise TensorRefused(problems=problems)
    positional = all_positional(fn)
    if positional is None:
        names = [f"arg{i}" for i in range(len(examples))]
    elif len(examples) > len(positional):
        raise StitchtuneError(f"{len(examples)} example inputs for {len(positional)} positional parameters")
    else:
        names = positional[: len(examples)]
    spec = {}
    for n, t in zip(names, examples):
        dt = torch_dtype_name(t.dtype)
        if dt is None:
            raise TensorRefused(f"example input {n!r}: dtype {t.dtype} is not supported (float32, float16, bfloat16)")
        spec[n] = (tuple(t.shape), dt)
    imp = import_torch(fn, spec, name=name)
    graph = imp.graph
    arg_names = tuple(n for n, _ in graph.inputs[: len(examples)])
    dev = _select_device(device, examples, emulate)
    cg = api_compile(graph, db=db, device=dev, schedule=schedule, build=False if emulate else None)
    log.info("%s: stitched %d kernel(s), schedule %s (%s)", graph.name, len(cg.program.launches),
             cg.schedule.key(), cg.source)
    return StitchedFunction(cg, arg_names, tuple(imp.params), emulate=emulate, method=imp.method)


def _select_device(name: Any, examples: Sequence[Any], emulate: bool) -> Any:
    """The Device description schedules are selected and lowered for (see :func:`compile`): ``name``
    itself when a Device, the preset it names, else StitchtuneError naming the presets."""
    from stitchtune.hardware.device import get_device
    from stitchtune.gpu.device_query import default_device, query_device

    if name is not None:
        from stitchtune.hardware.device import PRESETS, Device

        if isinstance(name, Device):
            return name
        if not isinstance(name, str):   # get_device names the presets for an unknown string
            raise StitchtuneError(f"device={name!r}: None (the local GPU), a Device or a preset name "
                                  f"({', '.join(PRESETS)})")
        return get_device(name)
    import torch as _torch

    cuda = [t.device for t in examples if t.device.type == "cuda"]
    if not cuda and (emulate or not _torch.cuda.is_available()):
        return default_device()
    index = cuda[0].index if cuda and cuda[0].index is not None else _torch.cuda.current_device()
    try:
        return query_device(index)
    except ToolchainError:
        return get_device(_torch.cuda.get_device_name(index))


# ---------------------------------------------------------------------------- the torch.compile backend
def backend(gm: Any, example_inputs: Sequence[Any], mode: str | None = None, options: Any = None) -> Any:
    """The ``torch.compile`` backend (``torch.compile(model, backend="stitchtune")``; see
    :mod:`stitchtune.deploy.torch_backend`)."""
    from stitchtune.deploy.torch_backend import stitchtune_backend

    return stitchtune_backend(gm, example_inputs, mode=mode, options=options)


def register_backend() -> None:
    """Register ``"stitchtune"`` with torch.compile in this process (the package's
    ``torch_dynamo_backends`` entry point does it for an installed stitchtune)."""
    from stitchtune.deploy.torch_backend import register

    register()


def check_errors(sync: bool = True) -> None:
    """Raise :class:`~stitchtune.errors.StitchtuneError` naming every stitched region whose gather met an
    out-of-range index since the last check (the backend reports them at the region's next call and
    after each call of the compiled graph; this covers the last one). ``sync``: first wait for the
    current GPU's queued work (``torch.cuda.synchronize()``, where CUDA is initialised)."""
    import torch as _torch

    from stitchtune.deploy.torch_flags import check_all

    if sync and _torch.cuda.is_available() and _torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        _torch.cuda.synchronize()
    check_all()


def stats() -> Any:
    """What the ``"stitchtune"`` torch.compile backend built since the last :func:`reset_stats` (or
    :func:`explain`): a :class:`~stitchtune.deploy.torch_stats.TorchStats` (``.builds``,
    ``.selections``, ``.hits``, ``.eager``, ``.regions`` per region; printing it shows a table)."""
    from stitchtune.deploy.torch_stats import stats as _stats

    return _stats()


def reset_stats() -> None:
    """Start :func:`stats` afresh (regions compiled before are no longer listed)."""
    from stitchtune.deploy.torch_stats import reset

    reset()


def explain(model: Any, *example_inputs: Any, **options: Any) -> Any:
    """What ``torch.compile(model, backend="stitchtune")`` stitches and declines on ``example_inputs``,
    called as a compiled call here would be (the caller's grad mode: wrap it in ``torch.no_grad()``
    for the inference graph; ``backward=True`` adds a backward pass): an
    :class:`~stitchtune.deploy.torch_backend.Explanation` (``.stitched``, ``.declined`` with each
    region's schedule source; printing it shows a table). Other ``options`` are the backend's
    (``db=``, ``device=``, ``fallback=``, ...)."""
    from stitchtune.deploy.torch_backend import explain as _explain

    return _explain(model, *example_inputs, **options)
