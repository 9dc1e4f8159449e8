"""Evaluation pipeline: a batch of schedules -> one database row per schedule.

    lower -> predict -> prune (illegal, or predicted far slower than the best measured)
    (the prediction: the fitted IR-feature model, :func:`stitchtune.cost.fitted.predict_program`)
          -> render -> build all survivors in one batch (the builder parallelises)
          -> predict again with what the build says (ptxas' registers; the compiled facts of the cubin,
             read once per cubin by :class:`stitchtune.gpu.build_facts.SassFactsReader`, where cuobjdump is
             installed) -> run survivors one at a time in the runner -> rows

The row's ``predicted_us`` is the last prediction made and ``predicted_from`` what it read (``ir`` or
``compiled``, :class:`~stitchtune.cost.compiled.PredictedFrom`): ``ir`` before a build, and after a build
whose cubin has no compiled facts (no cuobjdump, a fake or skipped build, an unreadable cubin).

Contract: :func:`evaluate` returns exactly one row (a plain dict, see ``docs/INTERFACES.md``) per input
schedule, in input order, whatever happens to the candidate: its ``status`` is a
:class:`~stitchtune.tune.records.TrialStatus` (ok, pruned, compile_error, launch_error, timeout,
wrong_result; the search turns each row into a :class:`~stitchtune.tune.records.TrialRecord`) and ``error`` /
``prune_reason`` say why. A failed candidate is data; a bug (any exception that is not a
:class:`~stitchtune.errors.ScheduleError` from lowering) propagates. The rows carry the workload and
device context columns and the candidate's results; the caller (search) adds study, trial,
backend and version columns.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from stitchtune.cost.compiled import PredictedFrom
from stitchtune.errors import ScheduleError
from stitchtune.tune.protocols import DeviceLike
from stitchtune.tune.records import TrialStatus

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 4000


@dataclass(frozen=True)
class Stages:
    """The stage functions :func:`evaluate` calls (injectable so tests can use fakes).

    ``lower(graph, plan, schedule, device) -> Program`` (raises ScheduleError for an illegal point);
    ``render(program) -> str``; ``predict(program, device, registers=None) -> Prediction`` (the real
    stage: :func:`stitchtune.cost.fitted.predict_program`, the fitted model's device time and the
    legality rules of :func:`stitchtune.cost.model.predict`);
    ``should_prune(prediction, best_measured_us, factor) -> str | None``;
    ``compiled_facts(build_result) -> {kernel: CompiledFacts} | None`` (the real stage: the process's
    :func:`stitchtune.gpu.build_facts.shared_reader`; None: predict after the build from the IR features
    and ptxas' registers; the default reads nothing). ``predict`` is called with ``compiled=`` after a build.
    """

    lower: Callable[..., Any]
    render: Callable[[Any], str]
    predict: Callable[..., Any]
    should_prune: Callable[[Any, float | None, float], str | None]
    codegen_version: str = "unknown"
    compiled_facts: Callable[[Any], Mapping[str, Any] | None] = field(default=lambda build: None)


def default_stages() -> Stages:
    """The real stages (imported lazily: they sit to the left of this module)."""
    from stitchtune.cost import fitted
    from stitchtune.cost import model as cost
    from stitchtune.lower import entry as lower
    from stitchtune.gpu import render as render_cuda
    from stitchtune.gpu.build_facts import shared_reader

    return Stages(lower=lower.lower, render=render_cuda.render, predict=fitted.predict_program,
                  should_prune=cost.should_prune, codegen_version=str(lower.CODEGEN_VERSION),
                  compiled_facts=shared_reader())


def device_key(device: DeviceLike) -> str:
    """The device key used in the database (``Device.key``)."""
    return device.key


def device_cc(device: DeviceLike) -> str:
    """Compute capability as ``"major.minor"``."""
    major, minor = device.compute_capability
    return f"{major}.{minor}"


def context_row(graph: Any, device: DeviceLike) -> dict[str, Any]:
    """Workload and device columns shared by every row of one search."""
    shapes = {name: list(spec.shape) for name, spec in graph.inputs}
    dtypes = {name: spec.dtype for name, spec in graph.inputs}
    for out in graph.outputs:
        spec = graph.spec(out)
        shapes[out] = list(spec.shape)
        dtypes[out] = spec.dtype
    return {
        "workload_key": graph.workload_key(),
        "structure_key": graph.structure_key(),
        "graph_name": graph.name,
        "shapes": json.dumps(shapes, sort_keys=True),
        "dtypes": json.dumps(dtypes, sort_keys=True),
        "device_key": device_key(device),
        "device_name": device.name,
        "device_cc": device_cc(device),
    }


def schedule_columns(schedule: Any) -> dict[str, Any]:
    """``schedule_json``, ``schedule_key`` and the flattened ``p_<param>`` columns of a schedule."""
    cols: dict[str, Any] = {
        "schedule_json": json.dumps(schedule.to_dict(), sort_keys=True),
        "schedule_key": schedule.key(),
        "deterministic": bool(schedule.deterministic),
    }
    for k, v in schedule.flat().items():
        cols[f"p_{k}"] = v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v)
    return cols


def _clip(text: str) -> str:
    text = str(text)
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + " ...[truncated]"


def _empty_result() -> dict[str, Any]:
    return {
        "status": None, "prune_reason": None, "predicted_us": None, "predicted_from": None, "measured_us": None,
        "samples_us": None, "max_rel_error": None, "registers": None, "smem_bytes": None,
        "spill_bytes": None, "occupancy": None, "compile_s": None, "error": "", "estimated": None,
    }


def _profile_json(profile: Any, registers: dict[str, int] | None = None) -> str | None:
    """The kernel profile (+ ptxas registers) as JSON, so that ``stitchtune calibrate`` can re-predict rows."""
    from stitchtune.cost.model import profile_to_dict

    try:
        return json.dumps(profile_to_dict(profile, registers))
    except (AttributeError, TypeError):  # not a kir.ProgramProfile (test fakes)
        return None


def _features_json(program: Any, source: str | None, device: Any, registers: dict[str, int],
                   facts: Mapping[str, Any] | None = None) -> str | None:
    """The IR features of the built program with ptxas' registers, the compiled facts of its cubin (``facts``,
    kernel name -> :class:`~stitchtune.cost.compiled.CompiledFacts`; None: not read) and its fingerprint, so
    that ``stitchtune calibrate`` can refit the fitted cost model on the rows measured, on the IR features or
    on the compiled facts (:mod:`stitchtune.cost.calibrate_fitted`); None for what is not a kernel-IR program
    (test fakes)."""
    from stitchtune.ir import kir

    if not isinstance(program, kir.Program) or source is None:
        return None
    from stitchtune.cost.calibrate_fitted import features_json
    from stitchtune.cost.compiled import CompiledFacts
    from stitchtune.cost.features import program_features
    from stitchtune.gpu.render import program_fingerprint

    compiled = {str(k): v for k, v in (facts or {}).items() if isinstance(v, CompiledFacts)}
    return features_json(program_fingerprint(program, source), program_features(program, device, registers or None),
                         compiled=compiled or None)


def _finite(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


@dataclass
class _Cand:
    index: int
    schedule: Any
    row: dict[str, Any]
    program: Any = None
    prediction: Any = None
    source: str | None = None
    build: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


def _new_candidates(graph: Any, device: Any, schedules: Sequence[Any], st: Stages) -> list[_Cand]:
    """One :class:`_Cand` per schedule, its row pre-filled with context, schedule and empty result columns."""
    ctx = context_row(graph, device)
    ctx["codegen_version"] = st.codegen_version
    cands = []
    for i, sched in enumerate(schedules):
        row = {**ctx, **schedule_columns(sched), **_empty_result()}
        cands.append(_Cand(i, sched, row))
    return cands


def _lower_and_predict(c: _Cand, graph: Any, plan: Any, device: Any, st: Stages,
                       best_so_far: float | None, prune_factor: float) -> bool:
    """Phase 1 for one candidate: lower, predict, maybe prune. True when it survives (status still None)."""
    try:
        c.program = st.lower(graph, plan, c.schedule, device)
    except ScheduleError as exc:
        c.row.update(status=TrialStatus.PRUNED, prune_reason=_clip(f"illegal: {exc}"))
        return False
    c.prediction = st.predict(c.program, device)
    c.row["predicted_us"] = _finite(c.prediction.time_us)
    c.row["predicted_from"] = PredictedFrom.IR
    c.row["occupancy"] = _finite(c.prediction.occupancy)
    c.row["profile_json"] = _profile_json(c.program.profile)
    if c.prediction.prune_reason:
        c.row.update(status=TrialStatus.PRUNED, prune_reason=_clip(c.prediction.prune_reason))
        return False
    reason = st.should_prune(c.prediction, best_so_far, prune_factor)
    if reason:
        c.row.update(status=TrialStatus.PRUNED, prune_reason=_clip(reason))
        return False
    return True


def _build_batch(live: list[_Cand], device: Any, builder: Any, st: Stages) -> None:
    """Phase 2: render every survivor, build the distinct sources in one call, record each build."""
    rendered = [st.render(c.program) for c in live]
    unique: dict[str, int] = {}
    for c, src in zip(live, rendered):
        c.source = src
        unique.setdefault(src, len(unique))
    sources = list(unique)
    results = builder.build(sources, device.arch)
    if len(results) != len(sources):
        raise RuntimeError(f"builder returned {len(results)} results for {len(sources)} sources")
    facts = _facts_of(results, st)
    for c, src in zip(live, rendered):
        c.build = results[unique[src]]
        _record_build(c, device, st, facts[unique[src]])


def _facts_of(results: Sequence[Any], st: Stages) -> list[Mapping[str, Any] | None]:
    """``st.compiled_facts`` of every successful build (None for the others), asked concurrently: each
    real read is a cuobjdump process (~0.4 s of CPU), so a batch's reads overlap like its builds."""
    from stitchtune.gpu.build import BuildStatus

    ok = [i for i, b in enumerate(results) if b.status == BuildStatus.OK]
    out: list[Mapping[str, Any] | None] = [None] * len(results)
    if len(ok) <= 1:
        for i in ok:
            out[i] = st.compiled_facts(results[i]) or None
        return out
    with ThreadPoolExecutor(max_workers=min(len(ok), os.cpu_count() or 1)) as pool:
        for i, f in zip(ok, pool.map(lambda j: st.compiled_facts(results[j]), ok)):
            out[i] = f or None
    return out


def _record_build(c: _Cand, device: Any, st: Stages, facts: Mapping[str, Any] | None) -> None:
    """Build columns of one candidate; a failed build, or a re-prediction with the real registers (and the
    cubin's compiled facts where they can be read) that prunes, sets its status."""
    from stitchtune.gpu.build import BuildStatus

    b = c.build
    c.row["compile_s"] = _finite(b.compile_s)
    regs, smem, spill = dict(b.registers), dict(b.smem_bytes), dict(b.spill_bytes)
    c.row["registers"] = max(regs.values()) if regs else None
    c.row["smem_bytes"] = max(smem.values()) if smem else None
    c.row["spill_bytes"] = sum(spill.values()) if spill else None
    if b.status != BuildStatus.OK:
        status = TrialStatus.TIMEOUT if b.status == BuildStatus.TIMEOUT else TrialStatus.COMPILE_ERROR
        c.row.update(status=status, error=_clip(b.error or b.status))
        return
    if regs or facts:
        pred = st.predict(c.program, device, registers=regs, compiled=facts)
        c.row["predicted_us"] = _finite(pred.time_us)
        c.row["predicted_from"] = PredictedFrom.COMPILED if facts else PredictedFrom.IR
        c.row["occupancy"] = _finite(pred.occupancy)
        c.row["profile_json"] = _profile_json(c.program.profile, regs)
        if pred.prune_reason:
            c.row.update(status=TrialStatus.PRUNED, prune_reason=_clip(f"after build: {pred.prune_reason}"))
            return
    c.row["features_json"] = _features_json(c.program, c.source, device, regs, facts)


def _run_one(c: _Cand, runner: Any) -> None:
    """Phase 3 for one built candidate: run it alone and record the measurement columns."""
    from stitchtune.gpu.runners import MeasureStatus

    (m,) = runner.run([(c.program, c.build)])
    samples = [float(s) for s in (m.samples_us or ())]
    c.row.update(
        status=TrialStatus(m.status),
        measured_us=_finite(m.median_us) if m.status == MeasureStatus.OK else None,
        samples_us=json.dumps(samples),
        max_rel_error=_finite(m.max_rel_error),
        estimated=bool(m.estimated),
        error=_clip(m.error or ""),
    )
    if m.status == MeasureStatus.OK and c.row["measured_us"] is None:
        c.row.update(status=TrialStatus.LAUNCH_ERROR, error="runner reported ok without a finite time")


def evaluate(graph: Any, plan: Any, device: Any, schedules: Sequence[Any], builder: Any, runner: Any,
             best_so_far: float | None, *, prune_factor: float = 3.0,
             stages: Stages | None = None) -> list[dict[str, Any]]:
    """Evaluate a batch of schedules; one row per schedule, in order (see module docstring).

    Args:
        best_so_far: best measured time (µs) of this search so far, or None; candidates predicted
            more than ``prune_factor`` times slower are pruned before compiling.
        builder: ``build(sources, arch) -> list[BuildResult]`` (one call for the whole batch).
        runner: ``run([(program, build_result)]) -> [Measurement]``, called once per survivor.
    """
    st = stages or default_stages()
    cands = _new_candidates(graph, device, schedules, st)
    # 1. lower + predict + prune
    live = [c for c in cands
            if _lower_and_predict(c, graph, plan, device, st, best_so_far, prune_factor)]
    # 2. render + build (one batch; identical sources built once)
    if live:
        _build_batch(live, device, builder, st)
    # 3. run survivors one at a time
    for c in live:
        if c.row["status"] is None:
            _run_one(c, runner)
    for c in cands:
        assert c.row["status"] is not None, "every candidate ends with a status"
    return [c.row for c in cands]
