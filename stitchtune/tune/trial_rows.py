"""Trial <-> row: the result columns of a finished optuna trial (its user attributes), as JSON-safe values.

:data:`RESULT_FIELDS` are the result columns a trial carries; :func:`_row_from_trial` reads them from a
finished trial (None when it has none: stale or interrupted); :func:`_plain` makes a value JSON-safe.
"""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.trial import TrialState

RESULT_FIELDS = ("status", "prune_reason", "predicted_us", "measured_us", "samples_us", "max_rel_error",
                 "registers", "smem_bytes", "spill_bytes", "occupancy", "compile_s", "error", "estimated",
                 "predicted_from")


def _plain(v: Any) -> Any:
    """A JSON-safe Python scalar (numpy scalars unwrapped, NaN/inf -> None)."""
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        try:
            v = v.item()
        except (TypeError, ValueError):
            return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _row_from_trial(t: optuna.trial.FrozenTrial) -> dict[str, Any] | None:
    """The outcome of a finished trial as result columns, or None when it has none (stale/interrupted)."""
    status = t.user_attrs.get("status")
    if status is None:
        return None
    out: dict[str, Any] = {k: t.user_attrs.get(k) for k in RESULT_FIELDS}
    out["status"] = status
    if t.state == TrialState.COMPLETE and t.value is not None:
        out["measured_us"] = float(t.value)
    return out
