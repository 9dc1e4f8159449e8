"""The Python API: ``stitchtune.compile(graph_or_path, db=..., device=...) -> CompiledGraph``.

Contract
--------
* :func:`compile` loads/validates the graph, asks :func:`stitchtune.deploy.selection.choose_schedule` for the
  schedule (tuned record, nearest shape, or heuristic; ``schedule=`` overrides it and is checked by
  the space's rules), lowers it, renders the CUDA source and, when nvcc is found (``build=None``) or
  asked for (``build=True``), builds the cubin. A :class:`CompiledGraph` is immutable.
* :attr:`CompiledGraph.manifest` is plain JSON data: the graph, its workload key, the device, the
  versions, the schedule and where it came from (``choice.source`` in tuned|nearest-shape|heuristic,
  ``choice.reason``, the database record), the buffers (name, dtype, elements, bytes, role, graph
  tensor, ``zero_init``) and the kernels in launch order (grid, block, dynamic and static shared
  memory, ptxas registers when built, and the arguments in order with buffer, dtype and role).
* :meth:`CompiledGraph.write(dir)` writes ``kernels.cu``, ``kernels.cubin`` (when built) and
  ``manifest.json``; :meth:`CompiledGraph.load(dir)` reads them back, re-lowers the schedule and
  refuses (``StitchtuneError``) a directory whose source this stitchtune would not generate again
  (another code generator version): recompile then.
* ``cg(**arrays)`` runs the kernels on the GPU through pycuda in this process (the device's primary
  context; numpy arrays, or pycuda ``GPUArray``s, in; numpy arrays out, shaped like the graph's
  outputs). Scratch and barrier buffers are allocated and zeroed once, at the first call.
  ``cg.emulate(**arrays)`` runs the same program in the numpy SIMT emulator on the CPU (slow: use
  small shapes). Both check every input's name, shape and dtype first.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stitchtune import __version__
from stitchtune.errors import StitchtuneError, ToolchainError

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
MAX_MANIFEST_BYTES = 16 * 1024 * 1024


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
            "dynamic_smem_bytes": int(ln.smem_bytes), "static_smem_bytes": int(k.smem_bytes),
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
            paths = [out / "kernels.cu"]
            paths[0].write_text(self.sources)
            if self.cubin is not None:
                paths.append(out / "kernels.cubin")
                paths[-1].write_bytes(self.cubin)
            paths.append(out / "manifest.json")
            paths[-1].write_text(json.dumps(self.manifest, indent=1) + "\n")
        except OSError as exc:
            raise StitchtuneError(f"cannot write to {str(out)!a}: {exc.strerror or exc}") from None
        return paths

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> CompiledGraph:
        """Read a directory written by :meth:`write` (see module docstring)."""
        from stitchtune.hardware.device import Device
        from stitchtune.graph.parse import Graph
        from stitchtune.lower.entry import CODEGEN_VERSION, lower
        from stitchtune.plan.planner import make_plan
        from stitchtune.gpu.render import render
        from stitchtune.space import Schedule, SearchSpace
        from stitchtune.deploy.selection import Choice

        d = Path(directory)
        where = ascii(str(d))
        try:
            raw = (d / "manifest.json").read_bytes()[: MAX_MANIFEST_BYTES + 1]
            sources = (d / "kernels.cu").read_text()
        except OSError as exc:
            raise StitchtuneError(f"cannot read compiled graph {where}: {exc.strerror or exc}") from None
        if len(raw) > MAX_MANIFEST_BYTES:
            raise StitchtuneError(f"{where}: manifest.json is too large")
        try:
            m = json.loads(raw)
            if not isinstance(m, dict) or m.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"unknown manifest format {m.get('format') if isinstance(m, dict) else None!r}")
            graph = Graph.from_dict(m["graph"])
            device = Device.from_dict(m["device"])
            schedule = Schedule.from_dict(m["schedule"])
            ch = m["choice"]
            choice = Choice(schedule, str(ch["source"]), ch.get("record"), str(ch["reason"]))
        except StitchtuneError:
            raise
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise StitchtuneError(f"{where}: not a stitchtune manifest ({exc})") from None
        if str(m.get("codegen_version")) != str(CODEGEN_VERSION):
            raise StitchtuneError(f"{where} was compiled by code generator version {m.get('codegen_version')!a}; "
                                  f"this stitchtune has {CODEGEN_VERSION}: recompile it")
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
        from stitchtune.hardware.occupancy import max_resident_blocks
        from stitchtune.graph.reference import check_inputs

        check_inputs(self.graph, arrays)
        regs = {k["kernel"]: k.get("registers") for k in self.manifest["kernels"]}
        est = {k.name: k.est_registers for k in self.program.profile.kernels}

        def limit(kernel: Any) -> int:
            r = regs.get(kernel.name) or est.get(kernel.name) or 32
            return max_resident_blocks(self.device, kernel.block, int(r), int(kernel.smem_bytes))

        flat = emulate_program(self.program, dict(arrays), coresident_limit=limit)
        return {o: flat[o].reshape(self.graph.spec(o).shape) for o in self.graph.outputs}

    def __call__(self, **arrays: Any) -> dict[str, np.ndarray]:
        """Run on the GPU through pycuda (see module docstring)."""
        launcher = self._state.get("launcher")
        if launcher is None:
            cubin = self.cubin if self.cubin is not None else _build(self.sources, self.device.arch)[1]
            launcher = _PycudaLauncher(self.program, cubin)
            self._state["launcher"] = launcher
        return launcher(self.graph, arrays)


class _PycudaLauncher:
    """Loads a cubin into the primary context of GPU 0 and runs a program's launches on arrays."""

    def __init__(self, program: Any, cubin: bytes) -> None:
        try:
            import pycuda.driver as drv
        except ImportError as exc:
            raise ToolchainError(f"running compiled kernels needs pycuda ({exc})") from None
        from stitchtune.gpu.runner import DEFAULT_SMEM_LIMIT, launch_plan

        self.drv = drv
        try:
            drv.init()
            if drv.Device.count() < 1:
                raise ToolchainError("no CUDA GPU found")
            self.ctx = drv.Device(int(os.environ.get("STITCHTUNE_CUDA_DEVICE", "0"))).retain_primary_context()
        except drv.Error as exc:
            raise ToolchainError(f"cannot use the GPU: {exc}") from None
        self.plan = launch_plan(program)
        self.ctx.push()
        try:
            self.module = drv.module_from_buffer(cubin)
            self.scratch: dict[str, Any] = {}
            for b in self.plan.buffers:
                if b.role in ("scratch", "barrier"):
                    mem = drv.mem_alloc(max(b.nbytes, 1))
                    if b.nbytes:
                        drv.memset_d8(int(mem), 0 if b.zero_init else 0xFF, b.nbytes)
                    self.scratch[b.name] = mem
            self.funcs: dict[str, Any] = {}
            for ln in self.plan.launches:
                if ln.kernel not in self.funcs:
                    f = self.module.get_function(ln.kernel)
                    self.funcs[ln.kernel] = f
                if ln.smem_bytes > DEFAULT_SMEM_LIMIT:
                    self.funcs[ln.kernel].set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                        ln.smem_bytes)
            drv.Context.synchronize()
        finally:
            drv.Context.pop()

    def __call__(self, graph: Any, arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
        from stitchtune.graph.reference import numpy_dtype

        drv = self.drv
        specs = dict(graph.inputs)
        problems = [f"input {n!r}: missing (expected shape {list(s.shape)}, dtype {s.dtype})"
                    for n, s in graph.inputs if n not in arrays]
        problems += [f"input {n!a}: not an input of graph {graph.name!r}" for n in arrays if n not in specs]
        for n, a in arrays.items():
            s = specs.get(n)
            if s is None or n not in specs:
                continue
            if tuple(getattr(a, "shape", ())) != s.shape:
                problems.append(f"input {n!r}: shape {list(getattr(a, 'shape', ()))}, expected {list(s.shape)}")
            dt = getattr(a, "dtype", None)
            if dt is None or np.dtype(dt) != numpy_dtype(s.dtype):
                problems.append(f"input {n!r}: dtype {getattr(a, 'dtype', None)}, expected {s.dtype}")
            if not isinstance(a, np.ndarray) and not hasattr(a, "gpudata"):
                problems.append(f"input {n!r}: a numpy array or a pycuda GPUArray, not {type(a).__name__}")
        if problems:
            raise StitchtuneError(problems=problems)
        self.ctx.push()
        temps: list[Any] = []
        try:
            ptrs: dict[str, int] = {n: int(m) for n, m in self.scratch.items()}
            outs: dict[str, tuple[Any, int]] = {}
            for b in self.plan.buffers:
                if b.role == "input":
                    a = arrays[b.tensor]
                    if isinstance(a, np.ndarray):
                        host = np.ascontiguousarray(a)
                        mem = drv.mem_alloc(max(host.nbytes, 1))
                        temps.append(mem)
                        if host.nbytes:
                            drv.memcpy_htod(int(mem), host.view(np.uint8).ravel())
                        ptrs[b.name] = int(mem)
                    else:
                        ptrs[b.name] = int(a.gpudata)
                elif b.role == "output":
                    mem = drv.mem_alloc(max(b.nbytes, 1))
                    temps.append(mem)
                    outs[b.tensor] = (mem, b.nbytes)
                    ptrs[b.name] = int(mem)
            for ln in self.plan.launches:
                args = [np.uintp(ptrs[a]) for a in ln.args]
                self.funcs[ln.kernel](*args, grid=ln.grid, block=ln.block, shared=ln.smem_bytes)
            drv.Context.synchronize()
            result = {}
            for o in graph.outputs:
                mem, nbytes = outs[o]
                host = np.empty(nbytes, dtype=np.uint8)
                if nbytes:
                    drv.memcpy_dtoh(host, int(mem))
                spec = graph.spec(o)
                result[o] = host.view(numpy_dtype(spec.dtype)).reshape(spec.shape)
            return result
        except drv.Error as exc:
            raise StitchtuneError(f"CUDA error while running {graph.name}: {exc}") from None
        finally:
            for mem in temps:
                mem.free()
            drv.Context.pop()


# ---------------------------------------------------------------------------- compile
def _build(source: str, arch: str) -> tuple[Any, bytes]:
    """nvcc (cached) -> (BuildResult, cubin bytes); ToolchainError when it fails."""
    from stitchtune.gpu.build import NvccBuilder

    [res] = NvccBuilder().build([source], arch)
    if res.status != "ok" or not res.cubin_path:
        raise ToolchainError(f"nvcc failed ({res.status}): {res.error[:2000]}")
    return res, Path(res.cubin_path).read_bytes()


def _nvcc_found() -> bool:
    from stitchtune.gpu.build import find_nvcc

    try:
        find_nvcc()
    except ToolchainError:
        return False
    return True


def compile(graph_or_path: Any, db: str | os.PathLike[str] | None = "results", device: Any = None, *,
            schedule: Any = None, build: bool | None = None) -> CompiledGraph:
    """Compile a graph (a :class:`~stitchtune.graph.parse.Graph`, a path to graph.json, or its dict) for
    ``device`` (a Device, a preset name, or None: the local GPU, else the H200 preset) with the schedule
    the tuning database ``db`` selects (see :mod:`stitchtune.deploy.selection`), or ``schedule`` (a Schedule or
    its dict) when given. ``build``: True builds the cubin (ToolchainError without nvcc), False does
    not, None builds when nvcc is found."""
    from stitchtune.hardware.device import get_device
    from stitchtune.graph.parse import Graph, load_graph, parse_graph
    from stitchtune.lower.entry import CODEGEN_VERSION, lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.gpu.render import render
    from stitchtune.space import Schedule, SearchSpace
    from stitchtune.deploy.selection import Choice, choose_schedule

    if isinstance(graph_or_path, Graph):
        graph = graph_or_path
    elif isinstance(graph_or_path, Mapping):
        graph = parse_graph(dict(graph_or_path))
    else:
        graph = load_graph(os.fspath(graph_or_path))
    dev = device if device is not None and not isinstance(device, str) else get_device(device)
    from stitchtune.hardware.device import check_fits

    check_fits(graph, dev)  # a graph that cannot fit the device is refused with the numbers
    plan = make_plan(graph)
    space = SearchSpace.for_plan(plan, dev)
    if schedule is not None:
        s = schedule if isinstance(schedule, Schedule) else Schedule.from_dict(dict(schedule))
        space.check(s)
        choice = Choice(s, "given", None, "schedule given by the caller")
        program = lower(graph, plan, s, dev, space)
    else:
        choice = choose_schedule(graph, db, dev, plan=plan, space=space)
        program = choice.program if choice.program is not None else lower(graph, plan, choice.schedule, dev, space)
    sources = render(program)
    result, cubin = None, None
    if build or (build is None and _nvcc_found()):
        result, cubin = _build(sources, dev.arch)
    bare = Choice(choice.schedule, choice.source, choice.record, choice.reason)
    manifest = build_manifest(graph, dev, bare, program, str(space.version), str(CODEGEN_VERSION), result)
    return CompiledGraph(graph, dev, bare, program, sources, manifest, cubin)
