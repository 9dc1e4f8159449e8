"""The Python API: ``stitchtune.compile(graph_or_path, db=..., device=...) -> CompiledGraph``.

Contract
--------
* :func:`compile` loads/validates the graph, asks :func:`stitchtune.deploy.selection.choose_schedule` for the
  schedule (tuned record, nearest shape, or heuristic; ``schedule=`` overrides it and is checked by
  the space's rules), lowers it, renders the CUDA source and, when nvcc is found (``build=None``) or
  asked for (``build=True``), builds the cubin. A :class:`CompiledGraph` is immutable.
* :attr:`CompiledGraph.manifest` is plain JSON data: the graph, its workload key, the device, the
  versions, the schedule and where it came from (``choice.source`` in tuned|nearest-shape|heuristic|given,
  ``choice.reason``, the database record), the buffers (name, dtype, elements, bytes, role, graph
  tensor, ``zero_init``) and the kernels in launch order (grid, block, dynamic and static shared
  memory, ptxas registers when built, and the arguments in order with buffer, dtype and role).
* :meth:`CompiledGraph.write(dir)` writes ``kernels.cu``, ``kernels.cubin`` (when built) and
  ``manifest.json``; :meth:`CompiledGraph.load(dir)` reads them back, re-lowers the schedule and
  refuses (``StitchtuneError``) a directory whose source this stitchtune would not generate again
  (another code generator version): recompile then.
* ``cg(**arrays)`` runs the kernels on the GPU in this process through the one launch path,
  :mod:`stitchtune.gpu.launch` (cuda-python, the device's primary context, the legacy default
  stream; synchronised before it returns). In: numpy arrays (copied to device buffers allocated at
  the first call and reused), or device arrays exposing ``__cuda_array_interface__`` (torch, cupy;
  C-contiguous and 16-byte aligned, else refused with a StitchtuneError naming it (a view with a
  storage offset such as ``x[1:]`` is not: pass a copy); used in place; a bfloat16 input as its raw
  2-byte bits, e.g. a uint16 view). Out: numpy arrays shaped like the graph's outputs. Scratch and
  barrier buffers are allocated and initialised once, at the first call
  (:meth:`CompiledGraph.device_runner`); calls from several threads are serialised (one set of
  buffers); the driver's context is pushed for the call and popped after it (the thread's current
  context, torch's current device, is left as it was). A driver error is a
  :class:`~stitchtune.gpu.driver.DriverError` (a ToolchainError) naming the call and the error.
  ``cg.emulate(**arrays)`` runs the same program in the numpy SIMT emulator on the CPU (slow: use
  small shapes). Both check every input's name, shape and dtype first.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from stitchtune._version import __version__
from stitchtune.deploy.run_checks import (  # noqa: F401  (check_gather_indices, check_launch_gathers, gather_error: re-exported)
    _check_arrays,
    check_emulated_gathers,
    check_gather_flags,
    check_gather_indices,
    check_launch_gathers,
    gather_error,
    read_gather_flags,
)
from stitchtune.deploy.manifest_io import check_codegen_version, read_manifest, write_kernels
from stitchtune.errors import StitchtuneError, ToolchainError
from stitchtune.tune.dbpath import DEFAULT_DB, DefaultDB, resolve_db

if TYPE_CHECKING:
    from stitchtune.deploy.compiled_dynamic import DynamicCompiledGraph
    from stitchtune.graph.parse import Graph

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1


# ---------------------------------------------------------------------------- the manifest
def _choice_dict(choice: Any) -> dict[str, Any]:
    rec = None
    if choice.record is not None:
        rec = {k: (v if isinstance(v, (str, int, float, bool)) or v is None else str(v))
               for k, v in choice.record.items() if k != "schedule_json"}
    return {"source": choice.source, "reason": choice.reason, "record": rec}


def build_manifest(graph: Any, device: Any, choice: Any, program: Any, space_version: str,
                   codegen_version: str, build: Any = None) -> dict[str, Any]:
    """The manifest (see module docstring) of a lowered program; ``build`` is the BuildResult or None."""
    regs = dict(getattr(build, "registers", {}) or {}) if build is not None else {}
    spills = dict(getattr(build, "spill_bytes", {}) or {}) if build is not None else {}
    static_smem = dict(getattr(build, "smem_bytes", {}) or {}) if build is not None else {}
    bufs = {b.name: b for b in program.buffers}
    kernels = []
    for ln in program.launches:
        k = program.kernel(ln.kernel)
        args = []
        for p, a in zip(k.params, ln.args):
            b = bufs[a]
            args.append({"param": p.name, "buffer": a, "dtype": "uint32" if b.role == "barrier" else b.dtype,
                         "role": b.role, "tensor": b.tensor or None})
        kernels.append({
            "kernel": ln.kernel, "grid": [int(ln.grid), 1, 1], "block": [int(ln.block), 1, 1],
            "dynamic_smem_bytes": int(ln.smem_bytes), "static_smem_bytes": static_smem.get(ln.kernel),
            "launch_bounds_min_blocks": int(k.min_blocks_per_sm),
            "registers": regs.get(ln.kernel), "spill_bytes": spills.get(ln.kernel), "args": args,
        })
    return {
        "format": MANIFEST_FORMAT,
        "stitchtune_version": __version__,
        "graph_name": graph.name,
        "workload_key": graph.workload_key(),
        "structure_key": graph.structure_key(),
        "device": device.to_dict(),
        "device_key": device.key,
        "space_version": str(space_version),
        "codegen_version": str(codegen_version),
        "schedule": choice.schedule.to_dict(),
        "schedule_key": choice.schedule.key(),
        "choice": _choice_dict(choice),
        "inputs": [{"name": n, "shape": list(s.shape), "dtype": s.dtype} for n, s in graph.inputs],
        "outputs": [{"name": o, "shape": list(graph.spec(o).shape), "dtype": graph.spec(o).dtype}
                    for o in graph.outputs],
        "buffers": [{"name": b.name, "dtype": "uint32" if b.role == "barrier" else b.dtype, "size": int(b.size),
                     "nbytes": int(b.nbytes), "role": b.role, "tensor": b.tensor or None,
                     "zero_init": bool(b.zero_init or b.role == "barrier")} for b in program.buffers],
        "kernels": kernels,
        "cubin": "kernels.cubin" if build is not None and getattr(build, "cubin_path", None) else None,
        "arch": device.arch,
        "graph": graph.to_dict(),
    }


# ---------------------------------------------------------------------------- the compiled graph
@dataclass(frozen=True)
class CompiledGraph:
    """Kernels for one graph on one device (see module docstring). ``cubin`` holds the built cubin's
    bytes, None when not built."""

    graph: Any
    device: Any
    choice: Any  # select.Choice (program not kept there)
    program: Any
    sources: str
    manifest: dict[str, Any] = field(compare=False)
    cubin: bytes | None = field(default=None, repr=False, compare=False)
    _state: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __repr__(self) -> str:
        """One line (the generated dataclass repr held the whole IR, source and manifest: ~150 KB)."""
        m = self.manifest
        kernels = len(m.get("kernels", ()))
        return (f"<CompiledGraph {self.graph.name} on {m.get('device_key')}: schedule {m.get('schedule_key')} "
                f"({self.source}), {kernels} kernel{'s' if kernels != 1 else ''}, "
                f"cubin {'built' if self.cubin is not None else 'not built'}>")

    @property
    def schedule(self) -> Any:
        return self.choice.schedule

    @property
    def source(self) -> str:
        """Where the schedule came from: tuned | nearest-shape | heuristic | given."""
        return str(self.manifest["choice"]["source"])

    # -- persistence ------------------------------------------------------------------------------
    def write(self, out_dir: str | os.PathLike[str]) -> list[Path]:
        """Write ``kernels.cu``, ``kernels.cubin`` (when built) and ``manifest.json``; return the paths."""
        out = Path(out_dir)
        try:
            out.mkdir(parents=True, exist_ok=True)
            paths = write_kernels(out, self.sources, self.cubin)
            paths.append(out / "manifest.json")
            paths[-1].write_text(json.dumps(self.manifest, indent=1) + "\n")
        except OSError as exc:   # an existing file at out_dir: the CLI's words for it (cli.checks.out_dir)
            why = "is a file, not a directory" if out.is_file() else exc.strerror or exc
            raise StitchtuneError(f"cannot write to {str(out)!a}: {why}") from None
        return paths

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> CompiledGraph:
        """Read a directory written by :meth:`write` (see module docstring)."""
        from stitchtune.hardware.device import Device
        from stitchtune.graph.parse import Graph
        from stitchtune.lower.entry import lower
        from stitchtune.plan.planner import make_plan
        from stitchtune.gpu.render import render
        from stitchtune.space import Schedule, SearchSpace
        from stitchtune.deploy.selection import Choice

        d = Path(directory)
        where = ascii(str(d))
        raw = read_manifest(d, where)
        try:
            m = json.loads(raw)
            if not isinstance(m, dict) or m.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"unknown manifest format {m.get('format') if isinstance(m, dict) else None!r}")
            if m.get("kind") == "dynamic":   # DynamicCompiledGraph.write: one folder per bucket
                raise StitchtuneError(f"{where} holds the buckets of a graph with dynamic dims: "
                                      "stitchtune.deploy.compiled_dynamic.DynamicCompiledGraph.load reads it")
            graph = Graph.from_dict(m["graph"])
            device = Device.from_dict(m["device"])
            schedule = Schedule.from_dict(m["schedule"])
            ch = m["choice"]
            choice = Choice(schedule, str(ch["source"]), ch.get("record"), str(ch["reason"]))
        except StitchtuneError:
            raise
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise StitchtuneError(f"{where}: not a stitchtune manifest ({exc})") from None
        check_codegen_version(m, where)
        try:
            sources = (d / "kernels.cu").read_text()
        except OSError as exc:
            raise StitchtuneError(f"cannot read compiled graph {where}: {exc.strerror or exc}") from None
        plan = make_plan(graph)
        program = lower(graph, plan, schedule, device, SearchSpace.for_plan(plan, device))
        if render(program) != sources:
            raise StitchtuneError(f"{where}: kernels.cu differs from what this stitchtune generates for its "
                                  "schedule: recompile it")
        cubin = None
        if m.get("cubin"):
            try:
                cubin = (d / "kernels.cubin").read_bytes()
            except OSError as exc:
                raise StitchtuneError(f"cannot read {where}/kernels.cubin: {exc.strerror or exc}") from None
        return cls(graph, device, choice, program, sources, m, cubin)

    # -- execution --------------------------------------------------------------------------------
    def emulate(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        """Run the program in the CPU emulator; ``{output: array}`` shaped and typed like the graph."""
        from stitchtune.emulate.emulator import emulate_program
        from stitchtune.graph.reference import check_inputs
        from stitchtune.gpu.runners import emulator_limits

        check_inputs(self.graph, arrays)
        regs = {k["kernel"]: k.get("registers") for k in self.manifest["kernels"]}
        limit, climit = emulator_limits(self.device, self.program, regs)
        scratch: dict[str, np.ndarray] = {}
        flat = emulate_program(self.program, dict(arrays), coresident_limit=limit, cluster_limit=climit,
                               scratch_out=scratch)
        check_emulated_gathers(self.program, scratch)
        return {o: flat[o].reshape(self.graph.spec(o).shape) for o in self.graph.outputs}

    def __call__(self, **arrays: Any) -> dict[str, np.ndarray]:
        """Run on the GPU through :mod:`stitchtune.gpu.launch` (see module docstring)."""
        return self.device_runner()(self.graph, arrays)

    def device_runner(self, driver: Any = None) -> DeviceRun:
        """The :class:`DeviceRun` that ``cg(**arrays)`` uses: made at the first call over ``driver`` (a
        :class:`~stitchtune.gpu.driver.Driver`; default :func:`~stitchtune.gpu.driver.open_driver`, the
        primary context of ``$STITCHTUNE_CUDA_DEVICE`` or GPU 0), or anew when ``driver`` is given.
        Builds the cubin (nvcc, cached) when the graph was compiled without one."""
        run = self._state.get("run")
        if run is None or driver is not None:
            from stitchtune.gpu.driver import open_driver

            cubin = self.cubin if self.cubin is not None else _build(self.sources, self.device.arch)[1]
            new = DeviceRun(self.program, cubin, driver if driver is not None else open_driver())
            if run is not None:
                run.close()  # the old module and buffers would leak otherwise
            run = self._state["run"] = new
        return run


class DeviceRun:
    """A compiled program on one GPU: its :class:`~stitchtune.gpu.launch.Launcher` (scratch allocated
    and initialised once), device buffers for numpy inputs and for the outputs (allocated at the first
    call, reused), and the packed arguments per set of pointers."""

    MAX_BOUND = 16

    def __init__(self, program: Any, cubin: bytes, driver: Any) -> None:
        from stitchtune.gpu.launch import Launcher, launch_plan

        self.program = program
        self.driver = driver
        self.launcher = Launcher(driver, launch_plan(program), cubin)
        self.staging: dict[tuple[str, str], int] = {}
        self._staged_bytes: dict[tuple[str, str], int] = {}
        self._bound: dict[tuple[tuple[str, int], ...], Any] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """Free the staging buffers, the scratch and the module (best effort)."""
        from stitchtune.gpu.driver import DriverError

        with self._lock:
            self._bound.clear()
            try:
                with self.driver.activate():
                    while self.staging:
                        self.driver.mem_free(self.staging.popitem()[1])
            except DriverError:
                self.staging.clear()
            self.launcher.close()

    def _buffer(self, kind: str, name: str, nbytes: int) -> int:
        """The staging buffer of an input/output, grown when a generic program's call needs more."""
        ptr = self.staging.get((kind, name))
        if ptr is not None and self._staged_bytes.get((kind, name), 0) < nbytes:
            self.driver.mem_free(self.staging.pop((kind, name)))
            self._bound.clear()  # packed arguments may hold the freed pointer
            ptr = None
        if ptr is None:
            ptr = self.staging[(kind, name)] = self.driver.mem_alloc(nbytes)
            self._staged_bytes[(kind, name)] = nbytes
        return ptr

    def __call__(self, graph: Any, arrays: Mapping[str, Any],
                 extents: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        """Outputs of ``graph`` for ``arrays`` (numpy arrays, or device arrays exposing
        ``__cuda_array_interface__``, used in place), as numpy arrays shaped like the graph's outputs.
        A generic program (``program.dynamic``) runs with ``extents`` (``graph`` is the dynamic graph at
        them: its shapes are the call's)."""
        from stitchtune.gpu.launch import device_pointer

        _check_arrays(graph, arrays)
        drv = self.driver
        ptrs: dict[str, int] = {}
        problems = []
        for name, _ in graph.inputs:
            a = arrays[name]
            if not isinstance(a, np.ndarray):
                try:
                    ptrs[name] = device_pointer(a, aligned=True)
                except ValueError as exc:
                    problems.append(f"input {name!r}: {exc}")
        if problems:
            raise StitchtuneError(problems=problems)
        with self._lock, drv.activate():
            return self._run(graph, arrays, ptrs, extents)

    def _run(self, graph: Any, arrays: Mapping[str, Any], ptrs: dict[str, int],
             extents: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        from stitchtune.gpu.driver import DriverError
        from stitchtune.graph.reference import numpy_dtype

        drv = self.driver
        try:
            for name, _ in graph.inputs:
                a = arrays[name]
                if isinstance(a, np.ndarray):
                    ptrs[name] = self._buffer("input", name, a.nbytes)
                    drv.memcpy_htod(ptrs[name], a)
            outs = {o: np.empty(graph.spec(o).shape, numpy_dtype(graph.spec(o).dtype)) for o in graph.outputs}
            for o, host in outs.items():
                ptrs[o] = self._buffer("output", o, host.nbytes)
            key = tuple(sorted(ptrs.items())) + tuple(sorted((extents or {}).items()))
            bound = self._bound.get(key)
            if bound is None:
                if len(self._bound) >= self.MAX_BOUND:
                    self._bound.pop(next(iter(self._bound)))
                bound = self._bound[key] = self.launcher.bind(ptrs, None if extents is None else dict(extents))
            self.launcher.launch(bound, 0)
            drv.synchronize()
            for o, host in outs.items():
                drv.memcpy_dtoh(host, ptrs[o])
            flags = self._read_flags()
        except DriverError as exc:
            raise DriverError(exc.call, exc.name, f"running {graph.name}") from None
        check_gather_flags(self.program, flags)
        return outs

    def _read_flags(self) -> dict[str, float]:
        """The gather error flags of the last launch, zeroed again for the next one."""
        return read_gather_flags(self.driver, self.launcher.scratch, self.program)


# ---------------------------------------------------------------------------- compile
def _build(source: str, arch: str) -> tuple[Any, bytes]:
    """nvcc (cached) -> (BuildResult, cubin bytes); ToolchainError when it fails."""
    from stitchtune.gpu.build import NvccBuilder

    [res] = NvccBuilder().build([source], arch)
    if res.status != "ok" or not res.cubin_path:
        raise ToolchainError(f"nvcc failed ({res.status}): {res.error[:2000]}")
    return res, Path(res.cubin_path).read_bytes()


@overload
def compile(graph_or_path: Graph, db: str | os.PathLike[str] | None | DefaultDB = DEFAULT_DB, device: Any = None, *,
            schedule: Any = None, build: bool | None = None, deterministic: bool = False) -> CompiledGraph: ...
@overload
def compile(graph_or_path: Any, db: str | os.PathLike[str] | None | DefaultDB = DEFAULT_DB, device: Any = None, *,
            schedule: Any = None, build: bool | None = None,
            deterministic: bool = False) -> CompiledGraph | DynamicCompiledGraph: ...
def compile(graph_or_path: Any, db: str | os.PathLike[str] | None | DefaultDB = DEFAULT_DB, device: Any = None, *,
            schedule: Any = None, build: bool | None = None,
            deterministic: bool = False) -> CompiledGraph | DynamicCompiledGraph:
    """Compile a graph (a :class:`~stitchtune.graph.parse.Graph`, a path to graph.json, or its dict) for
    ``device`` (a Device, a preset name, or None: the local GPU, else the H200 preset) with the schedule
    the tuning database ``db`` selects (see :mod:`stitchtune.deploy.selection`; default ``$STITCHTUNE_DB``,
    else ``./tuning-db``; None: no database, the heuristic), or ``schedule`` (a Schedule or its dict) when
    given. ``build``: True builds the cubin (ToolchainError without nvcc), False does not, None builds when
    nvcc is found. ``deterministic``: only a bitwise-reproducible schedule (no float atomics): the
    database's non-deterministic records are passed over, and a given one is refused; a graph with a
    ``scatter_add`` (float atomics whatever the schedule) is refused (:class:`UnsupportedGraphError`).

    Returns a :class:`CompiledGraph`; a graph with dynamic dims (a file or dict with a ``"dynamic"`` section,
    or a :class:`~stitchtune.graph.dynamic.DynamicGraph`) gives a
    :class:`~stitchtune.deploy.compiled_dynamic.DynamicCompiledGraph` instead: every bucket's generic
    kernels, called the same way (``cg(**arrays)``, ``cg.emulate(**arrays)``, ``cg.write(dir)``) with inputs
    of any extent in the declared range."""
    db = resolve_db(db)
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import CODEGEN_VERSION, lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.plan.scatter import nondeterministic
    from stitchtune.errors import UnsupportedGraphError
    from stitchtune.gpu.render import render
    from stitchtune.lower.resources import legal_space
    from stitchtune.space import Schedule
    from stitchtune.deploy.selection import Choice, choose_schedule

    from stitchtune.deploy.compiled_dynamic import compile_buckets, load_any
    from stitchtune.graph.dynamic import DynamicGraph

    graph = load_any(graph_or_path)
    if isinstance(graph, DynamicGraph):   # dynamic dims: every bucket (deploy.compiled_dynamic)
        return compile_buckets(graph, db, device, schedule=schedule, build=build, deterministic=deterministic)
    if device is None:
        from stitchtune.gpu.device_query import default_device

        dev = default_device()
    else:
        dev = get_device(device) if isinstance(device, str) else device
    from stitchtune.hardware.device import check_fits

    check_fits(graph, dev)  # a graph that cannot fit the device is refused with the numbers
    plan = make_plan(graph)
    if deterministic and nondeterministic(plan.scatters):   # every schedule of it adds with float atomics
        raise UnsupportedGraphError(nondeterministic(plan.scatters))
    space = legal_space(graph, plan, dev)  # a given schedule whose kernels do not fit is refused
    if schedule is not None:
        s = schedule if isinstance(schedule, Schedule) else Schedule.from_dict(dict(schedule))
        space.check(s)
        if deterministic and not s.deterministic:
            from stitchtune.errors import ScheduleError

            raise ScheduleError("schedule is not bitwise reproducible (cross_combine atomic uses float atomics); "
                                "--deterministic refuses it")
        choice = Choice(s, "given", None, "schedule given by the caller")
        program = lower(graph, plan, s, dev, space)
    else:
        choice = choose_schedule(graph, db, dev, plan=plan, space=space, deterministic=deterministic)
        program = choice.program if choice.program is not None else lower(graph, plan, choice.schedule, dev, space)
    sources = render(program)
    result, cubin = None, None
    from stitchtune.gpu.build import nvcc_found

    if build or (build is None and nvcc_found()):
        result, cubin = _build(sources, dev.arch)
    bare = Choice(choice.schedule, choice.source, choice.record, choice.reason)
    manifest = build_manifest(graph, dev, bare, program, str(space.version), str(CODEGEN_VERSION), result)
    return CompiledGraph(graph, dev, bare, program, sources, manifest, cubin)
