"""The static compiled graph: :class:`CompiledGraph` (kernels for one graph on one device, its manifest,
its persistence and its runs), :func:`build_manifest` and :func:`compile_graph`, the compilation of a
static :class:`~stitchtune.graph.parse.Graph`. The contract of all three is the one
:mod:`stitchtune.deploy.compiled` states (``stitchtune.compile`` dispatches here for a static graph and to
:mod:`stitchtune.deploy.compiled_dynamic` for a graph with dynamic dims, whose refused buckets compile
their static graphs here).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stitchtune._version import __version__
from stitchtune.deploy.device_run import DeviceRun, build_cubin
from stitchtune.deploy.manifest_io import check_codegen_version, read_manifest, write_compiled, write_kernels
from stitchtune.deploy.run_checks import check_emulated_gathers
from stitchtune.errors import ScheduleError, StitchtuneError
from stitchtune.graph.parse import Graph
from stitchtune.tune.dbpath import DEFAULT_DB, DefaultDB, resolve_db

if TYPE_CHECKING:
    from collections.abc import Mapping

    from stitchtune.deploy.selection import Choice
    from stitchtune.gpu.build import BuildResult
    from stitchtune.gpu.driver import Driver
    from stitchtune.hardware.device import Device
    from stitchtune.ir.kir import Program
    from stitchtune.space import Schedule


MANIFEST_FORMAT = 1


# ---------------------------------------------------------------------------- the manifest
def _choice_dict(choice: Choice) -> dict[str, Any]:
    rec = None
    if choice.record is not None:
        rec = {k: (v if isinstance(v, (str, int, float, bool)) or v is None else str(v))
               for k, v in choice.record.items() if k != "schedule_json"}
    return {"source": choice.source, "reason": choice.reason, "record": rec}


def build_manifest(graph: Graph, device: Device, choice: Choice, program: Program, space_version: str,
                   codegen_version: str, build: BuildResult | None = None) -> dict[str, Any]:
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

    graph: Graph
    device: Device
    choice: Choice  # (its program not kept there)
    program: Program
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
    def schedule(self) -> Schedule:
        return self.choice.schedule

    @property
    def source(self) -> str:
        """Where the schedule came from: tuned | nearest-shape | heuristic | given."""
        return str(self.manifest["choice"]["source"])

    # -- persistence ------------------------------------------------------------------------------
    def write(self, out_dir: str | os.PathLike[str]) -> list[Path]:
        """Write ``kernels.cu``, ``kernels.cubin`` (when built) and ``manifest.json``; return the paths."""
        return write_compiled(out_dir, self.manifest, lambda out: write_kernels(out, self.sources, self.cubin))

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
            check_codegen_version(m, where)   # first: another version's schedule may hold keys ours does not know
            graph = Graph.from_dict(m["graph"])
            device = Device.from_dict(m["device"])
            try:
                schedule = Schedule.from_dict(m["schedule"])
            except ScheduleError as exc:
                raise StitchtuneError(f"{where}: not a stitchtune manifest ({exc})") from None
            ch = m["choice"]
            choice = Choice(schedule, str(ch["source"]), ch.get("record"), str(ch["reason"]))
        except StitchtuneError:
            raise
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise StitchtuneError(f"{where}: not a stitchtune manifest ({exc})") from None
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

    def device_runner(self, driver: Driver | None = None) -> DeviceRun:
        """The :class:`DeviceRun` that ``cg(**arrays)`` uses: made at the first call over ``driver`` (a
        :class:`~stitchtune.gpu.driver.Driver`; default :func:`~stitchtune.gpu.driver.open_driver`, the
        primary context of ``$STITCHTUNE_CUDA_DEVICE`` or GPU 0), or anew when ``driver`` is given.
        Builds the cubin (nvcc, cached) when the graph was compiled without one."""
        run = self._state.get("run")
        if run is None or driver is not None:
            from stitchtune.gpu.driver import open_driver

            cubin = self.cubin if self.cubin is not None else build_cubin(self.sources, self.device.arch)[1]
            new = DeviceRun(self.program, cubin, driver if driver is not None else open_driver())
            if run is not None:
                run.close()  # the old module and buffers would leak otherwise
            run = self._state["run"] = new
        return run



def compile_graph(graph: Graph, db: str | os.PathLike[str] | None | DefaultDB = DEFAULT_DB, device: str | Device | None = None,
                  *, schedule: Schedule | Mapping[str, Any] | None = None, build: bool | None = None,
                  deterministic: bool = False) -> CompiledGraph:
    """Compile the static ``graph`` (arguments and result as :func:`stitchtune.deploy.compiled.compile`'s)."""
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
        result, cubin = build_cubin(sources, dev.arch)
    bare = Choice(choice.schedule, choice.source, choice.record, choice.reason)
    manifest = build_manifest(graph, dev, bare, program, str(space.version), str(CODEGEN_VERSION), result)
    return CompiledGraph(graph, dev, bare, program, sources, manifest, cubin)
