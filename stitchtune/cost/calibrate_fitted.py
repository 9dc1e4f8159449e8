"""``stitchtune calibrate``: the fitted cost model (:mod:`stitchtune.cost.fitted`) refitted to a user's
own tuning database.

Contract
--------
* The search writes, for every candidate it builds, a ``features_json`` column (:func:`features_json`),
  version :data:`FEATURES_VERSION` (2): ``{"version": 2, "program_sha256": <program fingerprint>, "timing":
  "events", "kernels": [<KernelFeatures dict without per_access>, ...], "compiled": {<kernel name>:
  <CompiledFacts dict>, ...} | null}``: the IR features of the very program it measured, with ptxas'
  registers (their compiled fields 0), and the compiled facts of its cubin
  (:class:`~stitchtune.cost.compiled.CompiledFacts`, read by :mod:`stitchtune.gpu.build_facts`; null when the
  cubin could not be read: no cuobjdump, a fake or skipped build; facts that miss one of the kernels count as
  none). Version 1 (written before s13) has no
  ``version`` and no ``compiled``: read as IR features without compiled facts. A version newer than
  :data:`FEATURES_VERSION`, or a kernel or fact that does not parse, makes the row unreadable (left out).
* :class:`FitOn` says what a calibration fits: ``ir`` (the default: the IR features, compiled fields 0: what
  the shipped fit sees and what the search's pre-build ranking predicts from; on the committed H200 data it
  scores better held out than a fit on compiled facts, results/ordering-budget-2026-12-07-s13), ``auto``
  (``compiled`` when every usable row has compiled facts, else ``ir`` with one INFO log line and a note saying
  how many rows lack them) or ``compiled`` (the IR features with each kernel's compiled bytes in flight and spills,
  :func:`~stitchtune.cost.compiled.with_compiled`: what the search's after-build prediction reads; a
  :class:`~stitchtune.cost.calibrate.CalibrationError` when a usable row has none).
* :func:`fit_rows(df, device_key, fit_on="ir") -> (rows, notes)`: the database's rows usable for a fit
  (:func:`stitchtune.cost.calibrate.measured_rows`: ``ok``, measured, not emulated, of the device) that
  carry ``features_json``, as fit rows (:mod:`stitchtune.cost.fitting`): ``group`` = the workload (graph
  name and workload key), ``label`` = the schedule key, ``source_sha256`` = the fingerprint, the row's
  measured time, ``kernels`` as ``fit_on`` resolves, ``fit_on`` = ``"ir"`` or ``"compiled"`` (the same for
  every row). ``notes`` count the rows left out (no or unreadable ``features_json``) and say when ``auto``
  fell back to the IR features.
* :func:`calibrate(df, device, base=None, progress=None, db="", fit_on="ir") -> Calibration`: the
  coefficients of :data:`stitchtune.cost.fitting.FITTED` fitted to :func:`fit_rows` starting from (and
  weakly pulled towards) ``base`` (default: the package's coefficients of the device),
  ``source="calibrated"`` with the provenance (rows, workloads, date, the base's source, ``fitted_on``,
  in-sample scores before and after). Raises :class:`~stitchtune.cost.calibrate.CalibrationError` with
  fewer than :data:`MIN_ROWS` usable rows (the message says how many and why rows were left out).
* :func:`held_out(rows, device, base=None) -> dict`: the calibration judged on workloads it did not see:
  ``{"workloads": n, "base": score, "held_out": score}`` (:func:`stitchtune.cost.fitting.score` of every row's
  prediction by ``base``, and by the coefficients fitted without the row's workload); needs two workloads or
  more (else :class:`~stitchtune.cost.calibrate.CalibrationError`). One fit per workload: slower.
* :func:`save(calibration, path=None) -> Path`: the coefficients written to ``path`` (default: the
  user's file of the device, :func:`stitchtune.cost.fitted_store.user_path`) through a temporary file
  and a rename: a crash leaves the previous file intact.

The scores in the provenance are in-sample (the fit saw those rows): a sanity check, not a quality
figure; ``scripts/fit_cost_model.py`` measures the model held out.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from stitchtune.cost.calibrate import CalibrationError, measured_rows
from stitchtune.cost.compiled import CompiledFacts, PredictedFrom, with_compiled
from stitchtune.cost.features import KernelFeatures
from stitchtune.cost.fitted import Coefficients, package_coefficients
from stitchtune.cost.fitted_store import user_path, write_json_atomic
from stitchtune.cost.fitting import fit_coefficients, predict_rows, score
from stitchtune.hardware.device import Device

__all__ = ["FEATURES_VERSION", "MIN_ROWS", "Calibration", "FitOn", "calibrate", "check_rows", "features_json",
           "fit_rows", "held_out", "save"]

log = logging.getLogger(__name__)

#: fewest measured rows with features a calibration fits (13 coefficients, each pulled towards the base)
MIN_ROWS = 20
#: version of the ``features_json`` column this module writes (1: no ``version`` key, no compiled facts)
FEATURES_VERSION = 2


class FitOn(enum.StrEnum):
    """What a calibration fits (module docstring); a member equals its option string."""

    AUTO = "auto"
    IR = "ir"
    COMPILED = "compiled"


def features_json(fingerprint: str, features: Sequence[KernelFeatures], timing: str = "events",
                  compiled: Mapping[str, CompiledFacts] | None = None) -> str:
    """The ``features_json`` column of one measured program (module docstring): ``features`` are its IR
    features (with ptxas' registers), ``compiled`` its cubin's facts per kernel name (None or empty: none read)."""
    kernels = []
    for f in features:
        d = f.to_dict()
        d.pop("per_access", None)
        kernels.append(d)
    facts = {str(k): v.to_dict() for k, v in compiled.items()} if compiled else None
    return json.dumps({"version": FEATURES_VERSION, "program_sha256": fingerprint, "timing": timing,
                       "kernels": kernels, "compiled": facts}, sort_keys=True)


def _parse(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, str):
        return None
    try:
        d = json.loads(text)
    except ValueError:
        return None
    if not isinstance(d, dict) or not d.get("program_sha256") or not isinstance(d.get("kernels"), list) \
            or not d["kernels"]:
        return None
    version = d.get("version", 1)
    if not isinstance(version, int) or not 1 <= version <= FEATURES_VERSION:
        return None
    names = {f.name for f in dataclasses.fields(KernelFeatures)}
    try:   # every kernel must make a KernelFeatures, every fact a CompiledFacts (another version's may not)
        for k in d["kernels"]:
            KernelFeatures(**{n: v for n, v in k.items() if n in names})
        compiled = d.get("compiled")
        facts = ({str(n): CompiledFacts.from_dict(v) for n, v in compiled.items()}
                 if isinstance(compiled, dict) and compiled else None)
        # facts count only when they cover every kernel measured (a partial read predicts some kernels from the IR)
        d["compiled"] = facts if facts and all(str(k.get("name")) in facts for k in d["kernels"]) else None
    except (TypeError, ValueError, KeyError, AttributeError):
        return None
    return d


def _ir_kernels(kernels: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Kernel dicts with the compiled fields 0 (what a prediction before a build sees)."""
    return [{**k, "compiled_bytes_in_flight": 0.0, "spill_instructions": 0.0} for k in kernels]


def _compiled_kernels(kernels: Sequence[Mapping[str, Any]], facts: Mapping[str, CompiledFacts]) -> list[dict[str, Any]]:
    """Kernel dicts with each kernel's compiled bytes in flight and spills (:func:`with_compiled`)."""
    names = {f.name for f in dataclasses.fields(KernelFeatures)}
    feats = [KernelFeatures(**{n: v for n, v in k.items() if n in names}) for k in _ir_kernels(kernels)]
    out = []
    for f in with_compiled(feats, facts):
        d = f.to_dict()
        d.pop("per_access", None)
        out.append(d)
    return out


def _resolve(out: list[dict[str, Any]], fit_on: FitOn, device_key: str) -> tuple[PredictedFrom, str | None]:
    """What ``out`` (parsed rows, each with ``compiled``) is fitted on, and the note when ``auto`` falls back."""
    lacking = sum(1 for r in out if not r["compiled"])
    if fit_on is FitOn.IR or not out:
        return PredictedFrom.IR, None
    if not lacking:
        return PredictedFrom.COMPILED, None
    if fit_on is FitOn.COMPILED:
        raise CalibrationError(f"{lacking} of {len(out)} measured rows of {device_key} have no compiled facts "
                               "(a cubin not read: no cuobjdump where it was built, or written by an older "
                               "stitchtune): fit on the IR features instead (--fit-on ir or auto)")
    note = (f"{lacking} of {len(out)} rows have no compiled facts (no cuobjdump where they were built, or "
            "written before this version): fitting on the IR features")
    log.info("calibrate %s: %s", device_key, note)
    return PredictedFrom.IR, note


def fit_rows(df: pd.DataFrame, device_key: str,
             fit_on: FitOn | str = FitOn.IR) -> tuple[list[dict[str, Any]], list[str]]:
    """The fit rows of ``device_key`` in a tuning database's DataFrame (module docstring)."""
    how = FitOn(fit_on)
    rows_df = measured_rows(df, device_key)
    out: list[dict[str, Any]] = []
    missing = unreadable = 0
    for r in rows_df.to_dict("records"):
        raw = r.get("features_json")
        d = _parse(raw)
        if d is None:
            if isinstance(raw, str):
                unreadable += 1
            else:
                missing += 1
            continue
        out.append({"group": f"{r.get('graph_name') or ''}-{str(r.get('workload_key') or '')[:12]}",
                    "label": str(r.get("schedule_key") or ""), "measured_us": float(r["measured_us"]),
                    "source_sha256": str(d["program_sha256"]), "timing": str(d.get("timing", "events")),
                    "kernels": d["kernels"], "compiled": d["compiled"]})
    basis, fallback = _resolve(out, how, device_key)
    for r in out:
        facts = r.pop("compiled")
        r["kernels"] = (_compiled_kernels(r["kernels"], facts) if basis is PredictedFrom.COMPILED
                        else _ir_kernels(r["kernels"]))
        r["fit_on"] = str(basis)
    notes = []
    if missing:
        notes.append(f"{missing} measured rows have no features_json (written before this version, or by an "
                     "older stitchtune): left out")
    if unreadable:
        notes.append(f"{unreadable} measured rows have an unreadable features_json (or one of a newer "
                     "stitchtune): left out")
    if fallback:
        notes.append(fallback)
    return out, notes


@dataclass(frozen=True)
class Calibration:
    """A finished calibration: the coefficients, the rows' count, the notes on rows left out and what
    was fitted (``fitted_on``: ``ir`` or ``compiled``)."""

    device: Device
    coefficients: Coefficients
    rows: int
    workloads: int
    notes: tuple[str, ...] = ()
    fitted_on: PredictedFrom = PredictedFrom.IR


def check_rows(rows: Sequence[Mapping[str, Any]], notes: Sequence[str], device: Device) -> None:
    """Raise :class:`CalibrationError` when ``rows`` (:func:`fit_rows`) are too few to calibrate."""
    if len(rows) < MIN_ROWS:
        why = f" ({'; '.join(notes)})" if notes else ""
        raise CalibrationError(f"{len(rows)} measured rows with IR features for {device.key}, a calibration "
                               f"needs at least {MIN_ROWS} (emulated rows do not count){why}")


def calibrate(df: pd.DataFrame, device: Device, base: Coefficients | None = None,
              progress: Callable[[int], None] | None = None, db: str = "",
              fit_on: FitOn | str = FitOn.IR) -> Calibration:
    """The fitted model's coefficients refitted to the measured rows of ``device`` (module docstring)."""
    rows, notes = fit_rows(df, device.key, fit_on)
    check_rows(rows, notes, device)
    start = base or package_coefficients(device)
    c = fit_coefficients(rows, device, start, progress=progress)
    meas = [r["measured_us"] for r in rows]
    before, after = score(meas, predict_rows(rows, device, start)), score(meas, predict_rows(rows, device, c))
    groups = sorted({r["group"] for r in rows})
    basis = PredictedFrom(rows[0]["fit_on"])

    def fig(x: float) -> float | None:
        return None if math.isnan(x) else round(float(x), 4)

    prov: Mapping[str, Any] = {
        "command": "stitchtune calibrate", "db": db, "date": datetime.date.today().isoformat(),
        "rows": len(rows), "workloads": len(groups), "base": start.source, "fitted_on": str(basis),
        "insample_within25_before": fig(before["within25"]), "insample_within25_after": fig(after["within25"]),
        "insample_spearman_before": fig(before["spearman"]), "insample_spearman_after": fig(after["spearman"]),
        "notes": list(notes)}
    out = dataclasses.replace(c, device_key=device.key, source="calibrated", provenance=prov)
    log.info("calibrate %s: %d rows of %d workloads on %s features, in-sample within 25%% %.0f%% -> %.0f%%",
             device.key, len(rows), len(groups), basis, 100 * before["within25"], 100 * after["within25"])
    return Calibration(device, out, len(rows), len(groups), tuple(notes), basis)


def held_out(rows: Sequence[Mapping[str, Any]], device: Device, base: Coefficients | None = None,
             progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Leave-one-workload-out scores of a calibration on ``rows`` against ``base`` (module docstring)."""
    from stitchtune.cost.fitting import leave_one_group_out

    groups = sorted({str(r["group"]) for r in rows})
    if len(groups) < 2:
        raise CalibrationError(f"a held-out check needs measured rows of two workloads or more, not {len(groups)}")
    start = base or package_coefficients(device)
    folds = leave_one_group_out(rows, device, start, progress=progress)
    meas, base_p, held_p = [], [], []
    for g, c in folds.items():
        mine = [r for r in rows if r["group"] == g]
        meas += [r["measured_us"] for r in mine]
        base_p += list(predict_rows(mine, device, start))
        held_p += list(predict_rows(mine, device, c))
    return {"workloads": len(groups), "base": score(meas, base_p), "held_out": score(meas, held_p)}


def save(calibration: Calibration, path: str | Path | None = None) -> Path:
    """Write the calibration's coefficients (module docstring); returns the path written."""
    return write_json_atomic(path if path is not None else user_path(calibration.device),
                             calibration.coefficients.to_dict())
