"""Fitting :mod:`stitchtune.cost.fitted`'s coefficients to measured times, and judging them held out.

Contract
--------
* A *row* is one measured time and the launches it covers: ``{"group": str, "measured_us": float,
  "kernels": [KernelFeatures.to_dict() without per_access, ...], ...}`` (more keys are kept as they
  are). ``group`` names the model (or database graph) the row comes from: the unit left out.
* :func:`fit_coefficients(rows, device, base=None, names=FITTED) -> Coefficients`: least squares on
  ``log(predicted / measured)`` (``scipy.optimize.least_squares``, soft-L1 loss, scale 0.2), each group
  weighing the same in total, the coefficients fitted in log space within
  :data:`~stitchtune.cost.fitted.FIT_BOUNDS` (``OPTIONAL_BOUNDS`` for the names that ask for one) with a weak pull (:data:`PRIOR`) towards ``base``
  (default: the defaults; a term that is 0 (off) in ``base`` starts at, and is pulled towards,
  :data:`~stitchtune.cost.fitted.FIT_START`'s value, else its lower bound). Deterministic for given rows. Raises ``ValueError`` without rows.
* :func:`leave_one_group_out(rows, device, base=None, progress=None) -> dict[group, Coefficients]`: for each group,
  the fit on the other groups' rows (the held-out coefficients of that group's rows).
* :func:`predict_rows(rows, device, c) -> numpy array` (µs, predicted device time of each row);
  :func:`score(measured, predicted) -> dict`: ``n``, ``within25`` (share within ±25%), ``spearman``
  (:func:`stitchtune.cost.rank.spearman_rho`),
  ``median_ratio`` (predicted / measured).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from stitchtune.cost.features import KernelFeatures
from stitchtune.cost.fitted import FIT_BOUNDS, FIT_START, OPTIONAL_BOUNDS, Coefficients, columns, device_us_many, flush_us
from stitchtune.hardware.device import Device

__all__ = ["FITTED", "MAX_EVALUATIONS", "PRIOR", "TOLERANCE", "fit_coefficients", "leave_one_group_out", "predict_rows", "score"]

#: the coefficients a fit changes (all of :data:`~stitchtune.cost.fitted.FIT_BOUNDS`)
FITTED: tuple[str, ...] = tuple(FIT_BOUNDS)
#: the fit's budget of function evaluations (``least_squares``' ``max_nfev``)
MAX_EVALUATIONS = 2000
#: weight of the pull towards the base coefficients, per log-unit of each
PRIOR = 0.02
#: a prediction within this relative error of the measurement counts as right (``within25``)
TOLERANCE = 0.25


class _Stack:
    """Every launch of some rows as feature columns, and the row each belongs to."""

    def __init__(self, rows: Sequence[Mapping[str, Any]]) -> None:
        names = {f.name for f in dataclasses.fields(KernelFeatures)}
        feats = [KernelFeatures(**{k: v for k, v in kd.items() if k in names})
                 for r in rows for kd in r["kernels"]]
        self.cols = columns(feats)
        self.owner = np.repeat(np.arange(len(rows)), [len(r["kernels"]) for r in rows])
        self.n = len(rows)
        self.event_launches = np.array([len(r["kernels"]) if r.get("timing") == "events" else 0 for r in rows],
                                       dtype=float)
        self.event_bytes = np.array([sum(float(k["unique_bytes"]) for k in r["kernels"])
                                     if r.get("timing") == "events" else 0.0 for r in rows])

    def predict(self, device: Device, c: Coefficients) -> Any:
        return np.bincount(self.owner, weights=device_us_many(self.cols, device, c), minlength=self.n)

    def measured_as(self, device: Device, c: Coefficients) -> Any:
        """What each row's measurement should read: device time plus the event timing's launch term and the
        write-back of the L2 flush before it (:func:`~stitchtune.cost.fitted.flush_us`; 0 while off)."""
        extra = flush_us(self.event_bytes, device, c) if c.flush_writeback > 0 else 0.0
        return self.predict(device, c) + self.event_launches * c.event_us + extra


def predict_rows(rows: Sequence[Mapping[str, Any]], device: Device, c: Coefficients) -> Any:
    """Predicted time (µs) of each row as it was measured: the sum of its launches' device times, plus
    ``c.event_us`` per launch and :func:`~stitchtune.cost.fitted.flush_us` of its unique bytes for a row timed
    with CUDA events (``timing == "events"``: the worker flushes the L2 before each timed run)."""
    return _Stack(rows).measured_as(device, c)


def fit_coefficients(rows: Sequence[Mapping[str, Any]], device: Device, base: Coefficients | None = None,
                     names: Sequence[str] = FITTED, progress: Callable[[int], None] | None = None,
                     bounds: Mapping[str, tuple[float, float]] | None = None) -> Coefficients:
    """The coefficients ``names`` fitted to ``rows`` (module docstring). ``progress(n)`` is called after each
    of the model's evaluations over all rows (``n`` so far; at most :data:`MAX_EVALUATIONS` plus the
    finite-difference steps). ``bounds`` replaces the bounds of the names it gives (a study of a bound, e.g.
    ``{"dram_latency_ns": (10.0, 5000.0)}``); both ends must be positive."""
    from scipy.optimize import least_squares

    if not rows:
        raise ValueError("no rows to fit")
    b = base or Coefficients.defaults(device)
    bounds = {**FIT_BOUNDS, **OPTIONAL_BOUNDS, **dict(bounds or {})}
    lo = np.log([bounds[n][0] for n in names])
    hi = np.log([bounds[n][1] for n in names])
    # a term off in the base (0) starts at FIT_START's value where it has one, else at its lower bound
    start = np.maximum([float(getattr(b, n)) or FIT_START.get(n, 0.0) for n in names], [bounds[n][0] for n in names])
    x0 = np.clip(np.log(start), lo + 1e-9, hi - 1e-9)
    meas = np.log([float(r["measured_us"]) for r in rows])
    stack = _Stack(rows)
    groups = [str(r["group"]) for r in rows]
    counts = {g: groups.count(g) for g in set(groups)}
    w = np.sqrt(np.array([len(rows) / (len(counts) * counts[g]) for g in groups]))

    def coeffs(x: Any) -> Coefficients:
        values: dict[str, Any] = {n: float(math.exp(v)) for n, v in zip(names, x)}
        return dataclasses.replace(b, **values)

    calls = [0]

    def resid(x: Any) -> Any:
        calls[0] += 1
        if progress is not None:
            progress(calls[0])
        pred = np.log(np.maximum(stack.measured_as(device, coeffs(x)), 1e-6))
        return np.concatenate([w * (pred - meas), PRIOR * (x - x0)])

    res = least_squares(resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.2, max_nfev=MAX_EVALUATIONS)
    return coeffs(res.x)


def leave_one_group_out(rows: Sequence[Mapping[str, Any]], device: Device, base: Coefficients | None = None,
                        progress: Callable[[int], None] | None = None) -> dict[str, Coefficients]:
    """Per group: the coefficients fitted on the rows of every other group (``progress`` as
    :func:`fit_coefficients`', counting over all the fits)."""
    groups = sorted({str(r["group"]) for r in rows})
    done = [0]

    def step(_: int) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0])

    return {g: fit_coefficients([r for r in rows if r["group"] != g], device, base, progress=step) for g in groups}


def score(measured: Sequence[float], predicted: Sequence[float]) -> dict[str, float]:
    """``n``, ``within25`` (share of |predicted / measured - 1| <= :data:`TOLERANCE`), ``spearman``
    (:func:`stitchtune.cost.rank.spearman_rho`, the one definition: NaN under 3 points), ``median_ratio``."""
    import pandas as pd

    from stitchtune.cost.rank import spearman_rho

    m, p = np.asarray(measured, dtype=float), np.asarray(predicted, dtype=float)
    if not len(m):
        return {"n": 0, "within25": math.nan, "spearman": math.nan, "median_ratio": math.nan}
    rho = spearman_rho(pd.DataFrame({"predicted_us": p, "measured_us": m}))
    return {"n": len(m), "within25": float(np.mean(np.abs(p / m - 1.0) <= TOLERANCE)), "spearman": rho,
            "median_ratio": float(np.median(p / m))}
