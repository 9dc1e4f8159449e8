"""How well the cost model ranks schedules: the one Spearman rank correlation every report uses.

Contract
--------
* :func:`spearman_rho(rows, time_col)` is the Spearman rank correlation of ``predicted_us`` with
  ``time_col`` (``measured_us``, or ``time_us`` in :mod:`stitchtune.analysis`) over ``rows`` (one
  workload on one device; the caller groups). Both ``stitchtune report`` and ``stitchtune model-check``
  call it, so they print the same rho for the same rows.
* The points: rows whose two times are finite, the time > 0, and that are not *reused* (a ``reused``
  or ``is_reused`` column true: a repeat of a schedule the study had already measured copies that
  row's result, and counting it again would weight that schedule twice). The caller keeps only ``ok``
  rows.
* Ties get the average of the ranks they span (``scipy.stats.spearmanr``'s rule, i.e. Pearson's r
  of the average ranks). NaN when fewer than :data:`MIN_POINTS` points remain or either time is
  constant over them (no ranking to compare).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["MIN_POINTS", "spearman_rho", "rho_points"]

#: fewest points with a rank correlation
MIN_POINTS = 3


def rho_points(rows: pd.DataFrame, time_col: str = "measured_us") -> pd.DataFrame:
    """The rows of ``rows`` that are points of :func:`spearman_rho` (see module docstring)."""
    pred = pd.to_numeric(rows["predicted_us"], errors="coerce")
    time = pd.to_numeric(rows[time_col], errors="coerce")
    keep = np.isfinite(pred) & np.isfinite(time) & (time > 0)
    for col in ("reused", "is_reused"):
        if col in rows.columns:
            keep &= ~rows[col].fillna(False).astype(bool)
    return pd.DataFrame({"predicted_us": pred[keep], time_col: time[keep]})


def spearman_rho(rows: pd.DataFrame, time_col: str = "measured_us") -> float:
    """Spearman's rho of ``predicted_us`` against ``time_col`` over the points of ``rows`` (average
    ranks for ties; NaN with fewer than 3 points or a constant time)."""
    from scipy.stats import spearmanr

    p = rho_points(rows, time_col)
    if len(p) < MIN_POINTS or p["predicted_us"].nunique() < 2 or p[time_col].nunique() < 2:
        return math.nan
    return float(spearmanr(p["predicted_us"], p[time_col]).statistic)
