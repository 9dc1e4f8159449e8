"""The kernel audit without a GPU (``stitchtune audit``): how far each kernel of a region is from the
memory floor, argued from the emulator, the SASS and the occupancy rules (docs/audit.md).

Contract
--------
:func:`audit_graph(graph, device, ...)` lowers ``graph`` with its heuristic schedule (or the one
given), then for every launch builds a :class:`KernelAudit`:

* unique bytes (the launch's input and output buffers, each once, a gathered table at most its
  gathered rows: ``graph.input_read_bytes()``) and their floor at the device's datasheet bandwidth;
  the region's floor is ``graph.min_bytes()`` at that bandwidth;
* the cost model's prediction and the fitted IR-feature model's device time (:mod:`stitchtune.cost.fitted`,
  no launch term; when the cubin was read, predicted with its compiled facts: the SASS's bytes in flight,
  :mod:`stitchtune.cost.compiled`), both labelled predicted: never a measurement; the region's
  ``fitted_ideal_us``, the fitted model's time of the same launches made ideal
  (:mod:`stitchtune.analysis.fitted_ideal`); where a launch adds atomically into global memory, a note gives
  its atomics term, labelled a prior, not fitted (:func:`atomics_note`);
* occupancy (:func:`stitchtune.hardware.occupancy.occupancy`, with the SASS registers when the
  cubin was read, else the lowering's estimate), waves, bytes in flight per SM against Little's law;
* from an emulated slice (:mod:`stitchtune.analysis.sectors`): sectors per request of every global
  access, the active lanes per request, and the bank wavefronts of every shared access (reported,
  not a floor-ready criterion);
* shared buffers the kernel stores and never loads (from the IR: every path, not just the slice);
* from the sm_90 cubin (:mod:`stitchtune.gpu.sass`, optional: absent tools give a note, not an error).

``problems`` lists the floor-ready criteria (:class:`Criteria`) a kernel misses; a kernel with none is
*floor-ready*. With ``peer=True`` a Triton kernel of the same region kind (:mod:`.triton_peer`,
optional) is compiled for the same arch and its SASS set beside ours. Failures of optional parts are
notes (data); a graph that cannot be planned or lowered raises as the pipeline does.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any, Collection, Mapping

from stitchtune.cost.waves import MIN_WAVES, waves_ready
from stitchtune.gpu.sass import SassMetrics, compiled_facts, find_cuobjdump, read_cubin
from stitchtune.analysis.sectors import (
    DEFAULT_SLICE_BLOCKS,
    AccessSectors,
    SharedAccess,
    SliceResult,
    program_sectors,
)
from stitchtune.hardware.device import Device
from stitchtune.hardware.occupancy import occupancy
from stitchtune.ir import kir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Criteria:
    """What *floor-ready* means (docs/audit.md): every global access within ``max_sector_ratio`` of its
    ideal sectors and 128-bit wherever a warp request spans more than one sector; no dead shared
    memory; no division slow path (``FCHK``) and no spills; at least ``min_active_lanes`` of the lanes
    active per request; at least ``min_waves`` waves, or one wave (every block resident at once: no
    tail) over every SM; bytes in flight per SM at least the device bandwidth x ``dram_latency_ns`` /
    SMs (Little's law), for a kernel that loads. A *latency-bound* launch (its input and output bytes at
    most what the whole device keeps in flight, bandwidth x ``dram_latency_ns``: its floor is under one
    DRAM latency) is judged instead by whether all its loads are in flight at once."""

    max_sector_ratio: float = 1.1
    min_active_lanes: float = 0.9
    min_waves: float = MIN_WAVES
    dram_latency_ns: float = 700.0

    def in_flight_needed(self, device: Device) -> float:
        """Bytes one SM must have in flight to stream at the datasheet bandwidth."""
        return device.dram_bandwidth_gbs * self.dram_latency_ns / device.sm_count

    def latency_bound(self, device: Device, io_bytes: int) -> bool:
        """Whether a launch of ``io_bytes`` input and output bytes is latency-bound: no more bytes than the
        device keeps in flight at its bandwidth (H200: 4.8 TB/s x 700 ns = 3.4 MB)."""
        return io_bytes <= self.in_flight_needed(device) * device.sm_count


@dataclass(frozen=True)
class KernelAudit:
    """One launch of the region's program (see module docstring). Times in microseconds; ``predicted_us``
    is the cost model's, ``floor_us`` the unique bytes at the datasheet bandwidth."""

    name: str
    grid: int
    block: int
    smem_bytes: int
    registers: int
    registers_from: str            # "sass" | "estimate"
    unique_bytes: int
    scratch_bytes: int
    floor_us: float
    predicted_us: float | None
    blocks_per_sm: int
    occupancy: float
    limiter: str
    waves: float
    in_flight_per_sm: int
    in_flight_needed: float
    active_lanes: float | None
    accesses: tuple[AccessSectors, ...]
    slice_blocks: int
    slice_error: str
    dead_shared: tuple[str, ...]
    sass: SassMetrics | None
    problems: tuple[str, ...] = ()
    fitted_us: float | None = None   # the IR-feature model fitted to GPU data (cost/fitted.py): predicted
    shared_accesses: tuple[SharedAccess, ...] = ()   # bank wavefronts per shared statement (the slice)
    sm_count: int = 0                # the device's SMs (0: an audit written before this field)
    read_bytes: int = 0              # the launch's input buffers, each once
    in_flight_grid: int = 0          # bytes in flight over the resident grid (per thread x threads)
    latency_bound: bool = False      # Criteria.latency_bound of the launch's input and output bytes

    @property
    def floor_ready(self) -> bool:
        return not self.problems

    @property
    def worst_sector_ratio(self) -> float | None:
        return max((a.ratio for a in self.accesses), default=None)

    @property
    def worst_bank_ratio(self) -> float | None:
        """The most bank wavefronts per request over the kernel's shared statements (None: no shared access)."""
        return max((a.ratio for a in self.shared_accesses), default=None)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("accesses", "sass", "shared_accesses")}
        d["dead_shared"] = list(self.dead_shared)
        d["problems"] = list(self.problems)
        d["floor_ready"] = self.floor_ready
        d["accesses"] = [a.to_dict() for a in self.accesses]
        d["shared_accesses"] = [a.to_dict() for a in self.shared_accesses]
        d["sass"] = self.sass.to_dict() if self.sass else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelAudit:
        kw = {k: v for k, v in d.items() if k != "floor_ready"}
        kw.update(accesses=tuple(AccessSectors.from_dict(a) for a in d["accesses"]),
                  sass=SassMetrics.from_dict(d["sass"]) if d["sass"] else None,
                  dead_shared=tuple(d["dead_shared"]), problems=tuple(d["problems"]),
                  shared_accesses=tuple(SharedAccess.from_dict(a) for a in d.get("shared_accesses", ())))
        return cls(**kw)


@dataclass(frozen=True)
class RegionAudit:
    """The audit of one region (a graph): its schedule, floor, prediction and kernels, the Triton peer
    (``peer``: a dict of :func:`stitchtune.analysis.triton_peer.peer_audit`, or None) and notes."""

    graph: str
    workload_key: str
    device: str
    family: str
    rows: int
    cols: int
    schedule: str
    unique_bytes: int
    floor_us: float
    predicted_us: float | None
    kernels: tuple[KernelAudit, ...]
    peer: dict[str, Any] | None = None
    notes: tuple[str, ...] = field(default=())
    uses: str = ""    # where a model's region occurs ("inference x2, train x2"; "" for a graph file)
    fitted_us: float | None = None   # the fitted IR-feature model's device time (predicted, no launch term)
    schedule_from: str = "given"     # "heuristic" (audit_graph without a schedule) | "given"
    ops: str = ""     # the graph's ops, each once, in graph order (what the region computes)
    #: the fitted model's time of the same launches made ideal (:mod:`stitchtune.analysis.fitted_ideal`): the
    #: least a change of the kernels that keeps their bytes and grids can be predicted at (a prediction)
    fitted_ideal_us: float | None = None
    #: per call pattern, each occurrence's DRAM bytes read from the L2 instead (its input bytes still in the L2 when
    #: it starts: :func:`stitchtune.analysis.l2_credit.simulate_l2` with the fitted
    #: :func:`stitchtune.analysis.l2_credit.l2_params`, saved bytes under their accounting; an estimate)
    l2_resident: dict[str, list[float]] = field(default_factory=dict)

    @property
    def floor_ready(self) -> bool:
        return all(k.floor_ready for k in self.kernels)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "kernels"}
        d["notes"] = list(self.notes)
        d["floor_ready"] = self.floor_ready
        d["kernels"] = [k.to_dict() for k in self.kernels]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RegionAudit:
        kw = {k: v for k, v in d.items() if k != "floor_ready"}
        kw.update(kernels=tuple(KernelAudit.from_dict(k) for k in d["kernels"]), notes=tuple(d["notes"]))
        return cls(**kw)


def dead_shared(kernel: kir.Kernel) -> tuple[str, ...]:
    """Shared buffers of ``kernel`` that some statement stores to and no load reads (on any path)."""
    names = {s.name for s in kernel.shared}
    stored: set[str] = set()
    loaded: set[str] = set()
    for st in kir.walk(kernel.body):
        if isinstance(st, (kir.StoreVec, kir.RemoteStore)) and st.buf in names:
            stored.add(st.buf)
        if isinstance(st, kir.LoadVec) and st.buf in names:
            loaded.add(st.buf)
        for x in kir.exprs(st):
            if isinstance(x, (kir.Load, kir.RemoteLoad)) and x.buf in names:
                loaded.add(x.buf)
    return tuple(sorted(stored - loaded))


def _unique_bytes(program: kir.Program, launch: kir.Launch, reads: Mapping[str, int]) -> tuple[int, int]:
    """(input + output bytes, scratch bytes) of the buffers a launch names, each buffer once; an input
    at most ``reads[its graph tensor]`` (the graph's :meth:`input_read_bytes`: a gathered table, its gathered rows)."""
    io = scratch = 0
    for name in dict.fromkeys(launch.args):
        b = program.buffer(name)
        if b.role in ("input", "output"):
            io += min(b.nbytes, reads.get(b.tensor, b.nbytes)) if b.role == "input" else b.nbytes
        elif b.role == "scratch":
            scratch += b.nbytes
    return io, scratch


def _problems(k: KernelAudit, c: Criteria) -> tuple[str, ...]:
    out = []
    strided = [a for a in k.accesses if a.ratio > c.max_sector_ratio]
    if strided:
        w = max(strided, key=lambda a: a.ratio)
        out.append(f"{len(strided)} global access(es) over {c.max_sector_ratio}x their ideal sectors "
                   f"(worst: {w.op} {w.buf} at {w.where}, {w.ratio:.2f}x)")
    narrow = [a for a in k.accesses if a.wide and a.access_bits < 128]
    if narrow:
        kinds = sorted({f"{a.op} {a.buf} {a.access_bits}-bit" for a in narrow})
        out.append(f"{len(narrow)} access(es) narrower than 128 bits ({', '.join(kinds)})")
    if k.slice_error:
        out.append("the emulated slice faulted")
    if k.dead_shared:
        out.append(f"shared memory stored and never loaded: {', '.join(k.dead_shared)}")
    if k.sass is not None:
        if k.sass.division_slow_path:
            out.append(f"division slow path ({k.sass.fchk} FCHK, {k.sass.calls} CALL)")
        if k.sass.spills:
            out.append(f"{k.sass.spills} spill instructions")
    if k.active_lanes is not None and k.active_lanes < c.min_active_lanes:
        out.append(f"{k.active_lanes:.0%} of lanes active")
    out += _grid_problems(k, c)
    return tuple(out)


def _grid_problems(k: KernelAudit, c: Criteria) -> list[str]:
    """Criteria 6 and 7 (docs/audit.md): waves and bytes in flight, or for a latency-bound launch all of
    its loads in flight at once."""
    loads = any(a.op == "load" for a in k.accesses) or k.read_bytes > 0
    if k.latency_bound:
        if loads and k.in_flight_grid < k.read_bytes:
            return [f"latency-bound, {k.in_flight_grid / 1024:.1f} of its {k.read_bytes / 1024:.1f} KiB of loads "
                    "in flight at once"]
        return []
    out = []
    if not waves_ready(k.waves, k.grid, k.sm_count, c.min_waves):
        out.append(f"{k.waves:.2f} waves" + (f" on {k.grid} of {k.sm_count} SMs" if k.grid < k.sm_count else ""))
    if loads and k.in_flight_per_sm < k.in_flight_needed:   # a kernel that only stores waits for nothing
        out.append(f"{k.in_flight_per_sm / 1024:.1f} KiB in flight per SM, {k.in_flight_needed / 1024:.1f} needed")
    return out


def _sass_of(program: kir.Program, arch: str, notes: list[str]) -> dict[str, SassMetrics]:
    """Our kernels' SASS metrics (empty with a note when nvcc or cuobjdump is missing or fails)."""
    from stitchtune.errors import ToolchainError
    from stitchtune.gpu.build import BuildStatus, NvccBuilder, nvcc_found
    from stitchtune.gpu.render import render

    if not nvcc_found():
        notes.append("SASS metrics skipped: nvcc not found")
        return {}
    if find_cuobjdump() is None:
        notes.append("SASS metrics skipped: cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
        return {}
    try:
        res = NvccBuilder(jobs=1).build([render(program)], arch)[0]
        if res.status != BuildStatus.OK or res.cubin_path is None:
            notes.append(f"SASS metrics skipped: the build failed ({res.status}: {res.error[:200]})")
            return {}
        return read_cubin(res.cubin_path)
    except ToolchainError as exc:
        notes.append(f"SASS metrics skipped: {exc}")
        return {}


def atomics_note(program: kir.Program, device: Device, registers: Mapping[str, int] | None = None) -> str | None:
    """The fitted time's atomics term per launch with atomics, labelled a prior (its coefficient is not fitted:
    :mod:`stitchtune.cost.fitted`, **atomics**); None for a program without atomic adds into global memory."""
    from stitchtune.cost.features import program_features
    from stitchtune.cost.fitted import coefficients_for, kernel_terms_us

    c = coefficients_for(device)
    parts = [f"`{f.name}` {float(kernel_terms_us(f, device, c)['atomics']):.1f} us "
             f"({f.atomics * f.grid * f.block:,.0f} atomic instructions)"
             for f in program_features(program, device, registers) if f.atomics > 0]
    if not parts:
        return None
    return (f"fitted time includes an atomics term whose coefficient is a prior, not fitted ({c.atomic_ns:g} ns per "
            "atomic instruction, derived from one measured Inductor kernel: results/atomics-2026-12-07-s15/): "
            + ", ".join(parts))


def _kernel_audit(program: kir.Program, i: int, device: Device, sl: SliceResult, sass: SassMetrics | None,
                  predicted: float | None, fitted: float | None, criteria: Criteria,
                  reads: Mapping[str, int]) -> KernelAudit:
    launch = program.launches[i]
    kernel = program.kernel(launch.kernel)
    prof = program.profile.kernels[i] if i < len(program.profile.kernels) else None
    regs = sass.registers if sass is not None and sass.registers else (prof.est_registers if prof else 32)
    smem = max(launch.smem_bytes, kernel.smem_bytes)
    occ = occupancy(device, launch.block, regs, smem)
    capacity = occ.blocks_per_sm * device.sm_count
    waves = launch.grid / capacity if capacity else math.inf
    per_thread = sass.max_bytes_in_flight if sass is not None else (prof.bytes_in_flight_per_thread if prof else 0)
    # blocks per SM at once: the resident blocks of a grid of more than one wave, else the grid's average
    resident = min(float(occ.blocks_per_sm), launch.grid / device.sm_count)
    io, scratch = _unique_bytes(program, launch, reads)
    ins = [program.buffer(n) for n in dict.fromkeys(launch.args) if program.buffer(n).role == "input"]
    read = sum(min(b.nbytes, reads.get(b.tensor, b.nbytes)) for b in ins)
    lanes = sum(a.lanes for a in sl.accesses)
    reqs = sum(a.requests for a in sl.accesses)
    k = KernelAudit(
        name=kernel.name, grid=launch.grid, block=launch.block, smem_bytes=smem, registers=regs,
        registers_from="sass" if sass is not None and sass.registers else "estimate", unique_bytes=io,
        scratch_bytes=scratch, floor_us=io / (device.dram_bandwidth_gbs * 1e3), predicted_us=predicted,
        blocks_per_sm=occ.blocks_per_sm, occupancy=occ.occupancy, limiter=occ.limiter, waves=waves,
        in_flight_per_sm=int(per_thread * launch.block * resident), in_flight_needed=criteria.in_flight_needed(device),
        active_lanes=lanes / (32 * reqs) if reqs else None, accesses=sl.accesses, slice_blocks=sl.blocks,
        slice_error=sl.error, dead_shared=dead_shared(kernel), sass=sass, fitted_us=fitted,
        shared_accesses=sl.shared, sm_count=device.sm_count, read_bytes=read,
        in_flight_grid=per_thread * launch.block * min(launch.grid, capacity) if capacity else 0,
        latency_bound=criteria.latency_bound(device, io))
    return KernelAudit(**{**k.__dict__, "problems": _problems(k, criteria)})


def audit_program(graph: Any, program: kir.Program, device: Device, *, schedule: str = "",
                  inputs: dict[str, Any] | None = None, slice_blocks: int = DEFAULT_SLICE_BLOCKS,
                  sass: bool = True, arch: str | None = None, criteria: Criteria | None = None,
                  peer: bool = False, plan: Any = None) -> RegionAudit:
    """Audit an already lowered static ``program`` of ``graph`` (see module docstring)."""
    from stitchtune.analysis.fitted_ideal import ideal_us
    from stitchtune.cost.fitted import predict_program
    from stitchtune.cost.model import predict
    from stitchtune.graph.reference import random_inputs

    c = criteria or Criteria()
    notes: list[str] = [f"sectors from an emulated slice: the first {slice_blocks} block(s) of each launch"]
    arch = arch or f"sm_{device.cc_major}{device.cc_minor}"
    metrics = _sass_of(program, arch, notes) if sass else {}
    if not sass:
        notes.append("SASS metrics not asked for")
    slices = program_sectors(program, inputs if inputs is not None else random_inputs(graph, 0), slice_blocks)
    regs = {n: m.registers for n, m in metrics.items() if m.registers}
    pred = predict(program.profile, device, regs)
    fit = predict_program(program, device, regs, compiled={n: compiled_facts(m) for n, m in metrics.items()})
    if metrics:
        notes.append("fitted time: predicted with the compiled code's bytes in flight (SASS), a post-build prediction")
    if not fit.prune_reason and (note := atomics_note(program, device, regs)) is not None:
        notes.append(note)
    ideal = None if fit.prune_reason else ideal_us(program, device, regs)
    n = len(program.launches)
    per = list(pred.per_kernel_us) if len(pred.per_kernel_us) == n and not pred.prune_reason else [None] * n
    fper = list(fit.per_kernel_us) if len(fit.per_kernel_us) == n and not fit.prune_reason else [None] * n
    reads = graph.input_read_bytes()
    kernels = tuple(_kernel_audit(program, i, device, slices[i], metrics.get(program.launches[i].kernel),
                                  per[i], fper[i], c, reads) for i in range(n))
    peer_d = None
    if peer:
        from stitchtune.analysis.triton_peer import peer_audit

        peer_d = peer_audit(graph, plan, device, notes)
    unique = int(graph.min_bytes())
    return RegionAudit(
        graph=graph.name, workload_key=graph.workload_key(), device=device.name,
        family=str(getattr(plan, "family", "")) if plan is not None else "",
        rows=int(getattr(plan, "M", 0)), cols=int(getattr(plan, "N", 0)), schedule=schedule,
        unique_bytes=unique, floor_us=unique / (device.dram_bandwidth_gbs * 1e3),
        predicted_us=None if pred.prune_reason else float(pred.time_us), kernels=kernels, peer=peer_d,
        fitted_us=None if fit.prune_reason else float(fit.time_us), fitted_ideal_us=ideal,
        notes=tuple(notes), ops=" ".join(dict.fromkeys(n.op for n in graph.nodes)))


def audit_graph(graph: Any, device: Device, schedule: Any = None, **options: Any) -> RegionAudit:
    """Plan and lower ``graph`` with ``schedule`` (a :class:`~stitchtune.space.Schedule`, checked against the
    region's legal space: :class:`~stitchtune.errors.ScheduleError` when refused; None: the heuristic's) on
    ``device``, then :func:`audit_program` (``options`` are its keywords)."""
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan

    plan = make_plan(graph)
    space = legal_space(graph, plan, device)
    if schedule is not None:
        space.check(schedule)   # a schedule the space (or the device) refuses: ScheduleError, with the reason
    s = schedule if schedule is not None else heuristic_schedule(plan, device, space)
    program = lower(graph, plan, s, device, space)
    a = audit_program(graph, program, device, schedule=s.to_json(), plan=plan, **options)
    return replace(a, schedule_from="given" if schedule is not None else "heuristic")


def audit_model(model: Any, example_inputs: Any, device: Device, calls: tuple[str, ...] = ("inference",),
                regions: Collection[str] | None = None, **options: Any) -> tuple[list[RegionAudit], list[str]]:
    """Audit every region the torch.compile backend would stitch in ``model`` called as each of ``calls``
    (:data:`stitchtune.deploy.model_tuning.CALL_PATTERNS` names), one audit per workload (regions with the
    same workload key counted in ``uses``), in first-seen order; with ``regions``, only the workloads whose
    first region's graph name is in it (the others are neither audited nor listed as skipped). Returns
    (audits, skipped): a region whose planning, lowering or slice fails is one ``skipped`` line (name:
    error), not an exception. Each audit's ``l2_resident`` holds its occurrences' resident input bytes per call."""
    from stitchtune.analysis.l2_credit import l2_params, simulate_l2
    from stitchtune.deploy.model_tuning import capture_regions

    params = l2_params(device)
    found: dict[str, tuple[Any, dict[str, int], dict[str, list[float]]]] = {}
    for call in calls:
        captured = capture_regions(model, example_inputs, call)
        # one simulation per FX graph: region names are unique within a graph, not across a call's graphs (two
        # graphs of a graph break can both hold a region_view_3)
        by_graph: dict[int, list[Any]] = {}
        for r in captured:
            by_graph.setdefault(id(r.nodes[0].graph) if r.nodes else 0, []).append(r)
        l2: dict[int, Any] = {}
        for mine in by_graph.values():
            sims = simulate_l2(mine, device, params)
            l2.update({id(r): sims.get(r.name) for r in mine})
        for r in captured:
            key = r.graph.workload_key()
            g, uses, resident = found.setdefault(key, (r.graph, {}, {}))
            uses[call] = uses.get(call, 0) + 1
            o = l2.get(id(r))
            resident.setdefault(call, []).append(o.saved(params.accounting) if o is not None else 0.0)
    audits: list[RegionAudit] = []
    skipped: list[str] = []
    for g, uses, resident in found.values():
        if regions is not None and g.name not in regions:
            continue
        try:
            a = audit_graph(g, device, **options)
        except Exception as exc:  # noqa: BLE001 - one region the audit cannot lower is a line of the report
            log.warning("region %s not audited: %s", g.name, exc)
            skipped.append(f"{g.name}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        audits.append(replace(a, uses=", ".join(f"{c} x{n}" for c, n in uses.items()), l2_resident=resident))
    return audits, skipped
