"""Typed tuning-database rows: :class:`TrialStatus` and the frozen :class:`TrialRecord`.

Contract
--------
* :class:`TrialStatus` is a ``StrEnum``: each member *is* its stored string (``TrialStatus.OK == "ok"``), so
  the parquet parts keep the same strings and databases written before the enum read unchanged.
* :class:`TrialRecord` is one finished trial, as :meth:`stitchtune.tune.database.TuningDB.best` /
  :meth:`~stitchtune.tune.database.TuningDB.measured` return it and :mod:`stitchtune.tune.search` writes it.
  The fixed columns (:data:`stitchtune.tune.database.COLUMNS`, plus the optional ``profile_json``,
  ``features_json``, ``bucket`` and ``predicted_from``)
  are typed fields; the flattened schedule (``p_<param>`` columns) is ``params`` and any other column a
  newer or foreign writer added is ``extra``, so nothing read is lost.
* :meth:`TrialRecord.from_row` takes a row as a mapping (a ``row_dict`` of a DataFrame row, or a row being
  written): missing values (None, NaN, NA, NaT) become None, numpy scalars plain Python values; a status
  that is not a :class:`TrialStatus` raises :class:`~stitchtune.errors.DatabaseError` naming it.
* :meth:`TrialRecord.to_row` gives the on-disk row: every fixed column of ``COLUMNS`` (None where unset),
  ``profile_json``/``features_json``/``bucket``/``predicted_from`` when set, then ``params`` and ``extra``; ``status`` as its plain string.
  ``from_row(r.to_row()) == r``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stitchtune.errors import DatabaseError

__all__ = ["COLUMNS", "TrialRecord", "TrialStatus"]


class TrialStatus(enum.StrEnum):
    """How a trial ended (the ``status`` column). Members compare equal to their stored strings."""

    OK = "ok"
    PRUNED = "pruned"
    COMPILE_ERROR = "compile_error"
    LAUNCH_ERROR = "launch_error"
    TIMEOUT = "timeout"
    WRONG_RESULT = "wrong_result"


#: Fixed columns of a row, in display order (``p_<param>`` columns follow them); every one is a field of
#: :class:`TrialRecord` (:mod:`stitchtune.tune.database` re-exports this).
COLUMNS: tuple[str, ...] = (
    "workload_key", "structure_key", "graph_name", "shapes", "dtypes",
    "device_key", "device_name", "device_cc",
    "backend", "estimated", "space_version", "codegen_version",
    "schedule_json", "schedule_key", "heuristic", "deterministic",
    "status", "prune_reason", "predicted_us", "measured_us", "samples_us", "max_rel_error",
    "registers", "smem_bytes", "spill_bytes", "occupancy", "compile_s", "error",
    "reused", "reused_from",
    "study", "trial_number", "sampler", "worker", "timestamp",
)

#: Optional columns that are fields of :class:`TrialRecord` too (written only when set).
_OPTIONAL_COLUMNS = ("profile_json", "features_json", "bucket", "predicted_from")


def _plain(v: Any) -> Any:
    """A stored value as a plain Python value: missing (None, NaN, NA, NaT) -> None, numpy scalars unwrapped."""
    if v is None or isinstance(v, (list, dict, tuple)):
        return v
    if isinstance(v, float) and math.isnan(v):
        return None
    if not isinstance(v, (str, bytes, _dt.datetime)) and hasattr(v, "item"):
        try:
            v = v.item()  # numpy scalar -> Python scalar
        except (TypeError, ValueError):
            return v
    try:
        import pandas as pd

        if pd.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    return v


def _opt_str(v: Any) -> str | None:
    return None if v is None else str(v)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _opt_bool(v: Any) -> bool | None:
    return None if v is None else bool(v)


@dataclass(frozen=True)
class TrialRecord:
    """One tuning-database row (one trial), typed. Column meanings: ``docs/INTERFACES.md`` ("Tuning database
    row"). Only ``status`` is required; a row may lack any other column (older databases, pruned rows of a
    schedule that could not even be suggested)."""

    status: TrialStatus
    workload_key: str | None = None
    structure_key: str | None = None
    graph_name: str | None = None
    shapes: str | None = None
    dtypes: str | None = None
    device_key: str | None = None
    device_name: str | None = None
    device_cc: str | None = None
    backend: str | None = None
    estimated: bool | None = None
    space_version: str | None = None
    codegen_version: str | None = None
    schedule_json: str | None = None
    schedule_key: str | None = None
    heuristic: bool | None = None
    deterministic: bool | None = None
    prune_reason: str | None = None
    predicted_us: float | None = None
    measured_us: float | None = None
    samples_us: str | None = None
    max_rel_error: float | None = None
    registers: int | None = None
    smem_bytes: int | None = None
    spill_bytes: int | None = None
    occupancy: float | None = None
    compile_s: float | None = None
    error: str | None = None
    reused: bool | None = None
    reused_from: str | None = None
    study: str | None = None
    trial_number: int | None = None
    sampler: str | None = None
    worker: str | None = None
    timestamp: _dt.datetime | None = None
    profile_json: str | None = None
    features_json: str | None = None
    bucket: str | None = None
    predicted_from: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True for an ``ok`` row with a time (the rows best/selection consider)."""
        return self.status is TrialStatus.OK and self.measured_us is not None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TrialRecord:
        """The record of a stored or to-be-stored row (see module docstring)."""
        plain = {str(k): _plain(v) for k, v in row.items()}
        raw_status = plain.get("status")
        try:
            status = TrialStatus(str(raw_status))
        except ValueError:
            raise DatabaseError(f"row has status {raw_status!r}, not one of "
                                f"{', '.join(s.value for s in TrialStatus)}") from None
        kw: dict[str, Any] = {}
        params: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for k, v in plain.items():
            if k == "status":
                continue
            if k in _CONVERT:
                kw[k] = _CONVERT[k](v)
            elif k.startswith("p_"):
                params[k] = v
            else:
                extra[k] = v
        return cls(status=status, params=params, extra=extra, **kw)

    def to_row(self) -> dict[str, Any]:
        """The row as stored: fixed columns (None where unset), set optional columns, ``params``, ``extra``."""
        out: dict[str, Any] = {c: getattr(self, c) for c in COLUMNS}
        out["status"] = self.status.value
        for c in _OPTIONAL_COLUMNS:
            v = getattr(self, c)
            if v is not None:
                out[c] = v
        out.update(self.params)
        out.update(self.extra)
        return out

    def replace(self, **changes: Any) -> TrialRecord:
        """A copy with ``changes`` (field names) applied."""
        return dataclasses.replace(self, **changes)


def _converters() -> dict[str, Any]:
    conv: dict[str, Any] = {}
    for f in dataclasses.fields(TrialRecord):
        if f.name in ("status", "params", "extra"):
            continue
        t = str(f.type)
        conv[f.name] = (_opt_bool if t.startswith("bool") else _opt_int if t.startswith("int")
                        else _opt_float if t.startswith("float") else _opt_str if t.startswith("str")
                        else (lambda v: v))
    return conv


#: Field name -> the function that types a stored value for it.
_CONVERT: dict[str, Any] = _converters()
