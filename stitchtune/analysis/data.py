"""Data preparation for the tuning report: derived columns, run labels, statistics and floors.

Contract
--------
* :func:`prepare` takes the tuning DataFrame (as returned by :func:`stitchtune.tune.database.read_db`, one row per
  trial, columns in ``docs/INTERFACES.md``) and returns a *copy* with the derived columns every figure
  and table uses (``time_us``, ``is_estimated``, ``is_reused``, ``is_heuristic``, ``run``, ``order``);
  the input is never mutated. Functions taking ``df`` (:func:`summary_table`, :func:`floors`) prepare it
  when needed; those taking ``rows`` or ``d`` expect prepared rows.
* Times: ``measured_us`` of ``ok`` rows is the trial's time (for the emulate backend ``tune/database.py`` stores the
  predicted time there and sets ``estimated``). :func:`spearman` correlates whatever rows it is given
  (reused rows left out); :func:`summary_table` reports it as NaN for runs with estimated rows.
* One "run" is a (workload_key, device_name, backend) triple; workloads are labelled by graph name and
  the largest input shape.
* Nothing here draws: figures are in :mod:`stitchtune.analysis.figures`, files and Markdown in
  :mod:`stitchtune.analysis.report` (which re-exports every public name of this module).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from stitchtune.errors import DatabaseError, StitchtuneError
from stitchtune.graph.values import ITEMSIZE

log = logging.getLogger(__name__)

ESTIMATED_NOTE = "estimated (emulated, cost-model times)"
RUN_KEYS = ("workload_key", "device_name", "backend")
MIN_IMPORTANCE_TRIALS = 8
#: Schedule dimensions shown by :func:`figure_schedule_dimensions`: label -> parameter names (a column
#: ``p_<name>`` or ``p_<name>_<i>``; ``rows_per_block`` is derived as block // tpr when not a parameter).
DIMENSIONS: dict[str, tuple[str, ...]] = {
    "scheme": ("scheme", "schemes"),
    "threads per row": ("tpr", "threads_per_row"),
    "rows per block": ("rows_per_block",),
    "vector width": ("vec", "vector_width"),
    "reuse level": ("reuse",),
    "task splitting": ("split",),
    "block size": ("block", "block_size"),
    "tasks per block": ("tasks_per_block",),
}
BENCH_COLUMNS = ("workload", "system", "median_us")


# --------------------------------------------------------------------------------------- data helpers
def _shape_text(shapes: object) -> str:
    """'16384x1024' for the largest shape in a ``shapes`` JSON cell, '' when unreadable."""
    try:
        obj: Any = json.loads(shapes) if isinstance(shapes, str) else shapes
        items = obj.values() if isinstance(obj, dict) else obj
        dims = [tuple(int(d) for d in s) for s in items]
        best = max(dims, key=lambda s: (math.prod(s), len(s)))
        return "x".join(str(d) for d in best)
    except (TypeError, ValueError, json.JSONDecodeError):
        return ""


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` with the derived columns the figures use.

    Adds ``time_us`` (``measured_us`` of ok rows, else NaN), ``is_estimated`` (bool), ``is_reused``
    (the row copies another row's result: left out of scatter plots and correlations), ``is_heuristic``
    (the ``heuristic``/``is_heuristic`` column, else trial 0 of each study), ``run`` (a short label per
    (workload, device, backend)) and ``order`` (trial order within a study).
    """
    if df is None or df.empty:
        raise DatabaseError("the tuning database has no trials")
    d = df.copy()
    for col in ("status", "graph_name", "study", "sampler", "shapes", "device_name", "backend",
                "workload_key"):
        if col not in d.columns:
            d[col] = "" if col != "status" else "ok"
    d["device_name"] = d["device_name"].fillna("?").astype(str)
    d["backend"] = d["backend"].fillna("?").astype(str)
    d["workload_key"] = d["workload_key"].fillna("").astype(str)
    ok = d["status"] == "ok"
    meas = pd.to_numeric(d.get("measured_us"), errors="coerce") if "measured_us" in d else np.nan
    d["time_us"] = pd.Series(meas, index=d.index).where(ok)
    d["predicted_us"] = pd.to_numeric(d["predicted_us"], errors="coerce") if "predicted_us" in d else np.nan
    d["occupancy"] = pd.to_numeric(d["occupancy"], errors="coerce") if "occupancy" in d else np.nan
    est = d["estimated"] if "estimated" in d else d["backend"].eq("emulate")
    d["is_estimated"] = est.fillna(d["backend"].eq("emulate")).astype(bool)
    if "trial_number" in d:
        d["order"] = pd.to_numeric(d["trial_number"], errors="coerce")
    else:
        d["order"] = d.groupby("study").cumcount()
    d["is_reused"] = d["reused"].fillna(False).astype(bool) if "reused" in d else False
    flag = next((c for c in ("is_heuristic", "heuristic") if c in d.columns), None)
    if flag is not None and d[flag].notna().any():
        d["is_heuristic"] = d[flag].fillna(False).astype(bool)
    else:
        d["is_heuristic"] = d["order"].eq(0)
    # run labels: graph name + largest shape (+ device/backend when several), unique per run
    runs = d.groupby(list(RUN_KEYS), sort=False, dropna=False).size().index
    several_dev = d[["device_name", "backend"]].drop_duplicates().shape[0] > 1
    labels: dict[tuple, str] = {}
    for key in runs:
        first = d[(d["workload_key"] == key[0]) & (d["device_name"] == key[1]) & (d["backend"] == key[2])].iloc[0]
        lab = f"{first['graph_name']} {_shape_text(first['shapes'])}".strip()
        if several_dev:
            lab += f" @ {key[1]}/{key[2]}"
        if lab in labels.values():
            lab += f" #{str(key[0])[:6]}"
        labels[key] = lab
    d["run"] = [labels[k] for k in zip(*(d[c] for c in RUN_KEYS))]
    if "p_rows_per_block" not in d and "p_block" in d and "p_tpr" in d:
        blk, tpr = pd.to_numeric(d["p_block"], errors="coerce"), pd.to_numeric(d["p_tpr"], errors="coerce")
        d["rows_per_block"] = (blk // tpr).clip(lower=1)
    return d


def _prepared(df: pd.DataFrame) -> pd.DataFrame:
    return df if "run" in df.columns and "time_us" in df.columns else prepare(df)


def _param_columns(d: pd.DataFrame) -> list[str]:
    return [c for c in d.columns if c.startswith("p_")]


def _runs_by_size(d: pd.DataFrame) -> list[str]:
    """Run labels, most ok trials first (stable by name)."""
    counts = d[d["time_us"].notna()].groupby("run").size()
    names = sorted(d["run"].unique(), key=lambda r: (-int(counts.get(r, 0)), r))
    return names


# --------------------------------------------------------------------------------------- statistics
def spearman(rows: pd.DataFrame) -> float:
    """Spearman rank correlation of ``predicted_us`` and ``time_us`` (NaN for non-ok rows): the one
    definition :func:`stitchtune.cost.rank.spearman_rho` (reused rows left out, average ranks for
    ties, NaN with < 3 points or no spread), shared with ``model-check``."""
    from stitchtune.cost.rank import spearman_rho

    return spearman_rho(rows, "time_us")


def param_importances(rows: pd.DataFrame) -> dict[str, float] | str:
    """optuna parameter importances of one run's ok trials (one per distinct schedule, reused rows left
    out), or a reason string when there are too few.

    The study is rebuilt in memory from the rows: each ``p_`` column with at least two values becomes
    a parameter (integers -> IntDistribution, other numbers -> FloatDistribution, the rest ->
    CategoricalDistribution); a missing value means the (conditional) parameter was absent.
    Evaluated with optuna's PED-ANOVA evaluator (optuna >= 3.6; no scikit-learn needed).
    """
    import optuna
    from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

    ok = rows[rows["time_us"].notna() & ~rows["is_reused"]]
    if "schedule_key" in ok.columns:
        ok = ok[ok["schedule_key"].isna() | ~ok["schedule_key"].duplicated()]   # one point per schedule
    if len(ok) < MIN_IMPORTANCE_TRIALS:
        return f"not enough trials: {len(ok)} ok, need {MIN_IMPORTANCE_TRIALS}"
    dists: dict[str, BaseDistribution] = {}
    for col in _param_columns(ok):
        vals = ok[col].dropna()
        if vals.astype(str).nunique() < 2:
            continue
        name = col[2:]
        if pd.api.types.is_bool_dtype(vals) or not pd.api.types.is_numeric_dtype(vals):
            dists[name] = CategoricalDistribution(sorted({_py(v) for v in vals}, key=str))
        elif np.all(np.mod(vals.astype(float), 1) == 0):
            dists[name] = IntDistribution(int(vals.min()), int(vals.max()))
        else:
            dists[name] = FloatDistribution(float(vals.min()), float(vals.max()))
    if not dists:
        return "not enough trials: no parameter takes two values"
    prev = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(direction="minimize")
        for _, r in ok.iterrows():
            params: dict[str, Any] = {}
            used: dict[str, BaseDistribution] = {}
            for name, dist in dists.items():
                v = r[f"p_{name}"]
                if v is None or (isinstance(v, float) and math.isnan(v)):
                    continue
                v = _py(v)
                params[name] = int(v) if isinstance(dist, IntDistribution) else v
                used[name] = dist
            study.add_trial(optuna.trial.create_trial(params=params, distributions=used,
                                                      value=float(r["time_us"])))
        evaluator = optuna.importance.PedAnovaImportanceEvaluator()  # needs no scikit-learn
        return dict(optuna.importance.get_param_importances(study, evaluator=evaluator))
    except (ValueError, RuntimeError, ZeroDivisionError) as exc:
        log.warning("parameter importances failed: %s", exc)
        return f"importances unavailable: {exc}"
    finally:
        optuna.logging.set_verbosity(prev)


def _py(v: Any) -> Any:
    """A pandas cell as a plain Python value (numpy scalars unwrapped)."""
    return v.item() if isinstance(v, np.generic) else v


class HeuristicRank(NamedTuple):
    """Where the heuristic schedule of one run landed among its ok schedules (rank 1 = fastest)."""

    rank: int
    of: int               # distinct ok schedules
    heuristic_us: float
    best_us: float


def heuristic_rank(rows: pd.DataFrame) -> HeuristicRank | None:
    """The heuristic's rank in one run; None without a heuristic.

    Schedules are de-duplicated by ``schedule_key`` (their fastest row); rank 1 = fastest.
    """
    ok = rows[rows["time_us"].notna()]
    h = ok[ok["is_heuristic"]]
    if ok.empty or h.empty:
        return None
    key = "schedule_key" if "schedule_key" in ok.columns and ok["schedule_key"].notna().all() else None
    times = ok.groupby(key)["time_us"].min() if key else ok["time_us"]
    ht = float(h["time_us"].min())
    return HeuristicRank(int((times < ht).sum()) + 1, int(len(times)), ht, float(times.min()))


def summary_table(df: pd.DataFrame, floor_us: pd.Series | None = None) -> pd.DataFrame:
    """One row per run: trials, ok, best/heuristic time, speedup over the heuristic, heuristic rank,
    fraction of the floor, Spearman(predicted, measured) (NaN for estimated runs)."""
    d = _prepared(df)
    floor_us = floors(d) if floor_us is None else floor_us
    rows = []
    for run in sorted(d["run"].unique()):
        g = d[d["run"] == run]
        best = g["time_us"].min()
        hr = heuristic_rank(g)
        est = bool(g["is_estimated"].any())
        fl = floor_us.get(run, float("nan"))
        rows.append({
            "workload": run, "device": g["device_name"].iloc[0], "backend": g["backend"].iloc[0],
            "estimated": est, "trials": len(g), "ok": int(g["time_us"].notna().sum()),
            "best_us": best, "heuristic_us": hr.heuristic_us if hr else float("nan"),
            "speedup_vs_heuristic": hr.heuristic_us / best if hr and best > 0 else float("nan"),
            "heuristic_rank": f"{hr.rank}/{hr.of}" if hr else "n/a",
            "fraction_of_floor": fl / best if best and best > 0 else float("nan"),
            "spearman": float("nan") if est else spearman(g),
        })
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------- floors
def floors(df: pd.DataFrame, bench: pd.DataFrame | None = None, bandwidth_gbs: float | None = None,
           min_bytes: dict[str, int] | None = None) -> pd.Series:
    """Memory-bandwidth floor (µs) per run label; NaN where unknown.

    First choice: a benchmark CSV's ``floor_us`` for the workload (bench names workloads by graph name)
    on the same device: it uses the copy bandwidth measured in that run and counts forced re-reads.
    Otherwise floor = min bytes / copy bandwidth, with min bytes from a ``min_bytes`` DB column, else
    ``min_bytes`` (workload key -> bytes, see :func:`min_bytes_from_graphs`), else the ``shapes`` and
    ``dtypes`` columns (:func:`min_bytes_from_shapes`), and the bandwidth (GB/s)
    from ``bandwidth_gbs``, else a ``copy_bandwidth_gbs`` DB column, else the device preset
    (:func:`stitchtune.hardware.device.get_device`).
    """
    d = _prepared(df)
    out = {}
    for run, g in d.groupby("run", sort=True):
        first = g.iloc[0]
        floor = _bench_floor(bench, str(first["graph_name"]), str(first["device_name"]))
        if math.isnan(floor):
            nbytes = _first_number(g, "min_bytes")
            if nbytes is None and min_bytes:
                nbytes = min_bytes.get(str(first["workload_key"]))
            if nbytes is None:
                nbytes = min_bytes_from_shapes(first.get("shapes"), first.get("dtypes"))
            bw = (bandwidth_gbs or _first_number(g, "copy_bandwidth_gbs")
                  or _device_bandwidth_gbs(first["device_name"]))
            floor = nbytes / (bw * 1e3) if nbytes and bw else float("nan")
        out[run] = floor
    return pd.Series(out, dtype=float)


def _bench_floor(bench: pd.DataFrame | None, graph_name: str, device_name: str) -> float:
    if bench is None or "floor_us" not in bench.columns:
        return float("nan")
    hit = bench[(bench["workload"].astype(str) == graph_name) & pd.to_numeric(bench["floor_us"], errors="coerce").gt(0)]
    if "device" in hit.columns and hit["device"].nunique() > 1:
        want = re.sub(r"[^a-z0-9]", "", device_name.lower())
        hit = hit[hit["device"].map(lambda x: (s := re.sub(r"[^a-z0-9]", "", str(x).lower())) != ""
                                    and (s in want or want in s))]
    return float(hit["floor_us"].iloc[0]) if len(hit) else float("nan")


def _first_number(g: pd.DataFrame, col: str) -> float | None:
    if col not in g.columns:
        return None
    v = pd.to_numeric(g[col], errors="coerce").dropna()
    return float(v.iloc[0]) if len(v) and v.iloc[0] > 0 else None


def _device_bandwidth_gbs(device_name: str) -> float | None:
    """Copy bandwidth (GB/s) of a device preset: measured when the preset has it, else the
    datasheet figure times the preset module's copy efficiency; None for an unknown device."""
    from stitchtune.hardware.device import get_device

    try:
        return float(get_device(str(device_name)).effective_copy_bandwidth_gbs())
    except StitchtuneError:
        return None


def min_bytes_from_shapes(shapes: object, dtypes: object) -> int | None:
    """Sum of the tensors in a row's ``shapes``/``dtypes`` JSON (inputs and outputs by name, as
    ``pipeline.context_row`` writes them): ``Graph.io_bytes()`` except when an output is also an
    input (then counted once), so ``Graph.min_bytes()`` or more (a gathered table counts whole: the
    cells do not say which inputs are gathered). None when the cells cannot be read."""
    try:
        sh, dt = json.loads(str(shapes)), json.loads(str(dtypes))
        total = sum(math.prod(int(x) for x in sh[name]) * ITEMSIZE[dt[name]] for name in sh)
    except (TypeError, ValueError, KeyError, AttributeError, json.JSONDecodeError):
        return None
    return int(total) if total > 0 else None


def min_bytes_from_graphs(paths: Iterable[str | os.PathLike[str]]) -> dict[str, int]:
    """workload key -> ``Graph.min_bytes()`` for every graph.json that loads (others are skipped)."""
    from stitchtune.graph.parse import load_graph

    out: dict[str, int] = {}
    for p in paths:
        try:
            g = load_graph(p)
        except StitchtuneError as exc:
            log.info("skipping graph %s for floors: %s", p, exc)
            continue
        out[g.workload_key()] = int(g.min_bytes())
    return out


# --------------------------------------------------------------------------------------- benchmarks, runs, dimensions
def _bench_devices(stems: list[str]) -> dict[str, str]:
    """The device of each ``bench_*`` file stem (without ``bench_``): a stem that extends another one by
    ``_<label>`` (``h200_inductor_max`` next to ``h200``) is a second run on that device."""
    out = {}
    for s in stems:
        bases = [o for o in stems if o != s and s.startswith(o + "_")]
        out[s] = max(bases, key=len) if bases else s
    return out


def read_bench(paths: Iterable[str | os.PathLike[str]]) -> pd.DataFrame | None:
    """Concatenate ``bench_<device>.csv`` files; None if none. Adds ``run`` (the file name without
    ``bench_`` and ``.csv``: rows of one run share a stitchtune measurement) and ``device`` (the run, or
    the device of which the run's name is an extension, see :func:`_bench_devices`)."""
    frames = []
    files = sorted(Path(x) for x in paths)
    runs = [p.stem[len("bench_"):] if p.stem.startswith("bench_") else p.stem for p in files]
    devices = _bench_devices(runs)
    for p, run in zip(files, runs):
        try:
            b = pd.read_csv(p)
        except (OSError, ValueError) as exc:
            raise DatabaseError(f"cannot read benchmark CSV {p}: {exc}") from exc
        missing = [c for c in BENCH_COLUMNS if c not in b.columns]
        if missing:
            raise DatabaseError(f"benchmark CSV {p} lacks columns: {', '.join(missing)}")
        b["run"] = run
        b["device"] = devices[run]
        frames.append(b)
    return pd.concat(frames, ignore_index=True) if frames else None


def peer_speedups(bench: pd.DataFrame) -> pd.DataFrame:
    """Speedup of stitchtune over each peer (peer median / stitchtune median of the same run and
    workload), rows that failed the reference check left out: index ``workload`` (``workload @ device``
    when there are several devices), one column per peer; NaN where a peer was not run."""
    bench = checked_rows(bench)
    if "run" not in bench.columns:
        bench = bench.assign(run=bench["device"])
    key = bench["workload"].astype(str)
    if bench["device"].nunique() > 1:
        key = key + " @ " + bench["device"].astype(str)
    b = bench.assign(key=key)
    base = b[b["system"] == "stitchtune"].groupby(["key", "run"])["median_us"].min()
    peers = b[b["system"] != "stitchtune"]
    ratio = peers["median_us"].to_numpy(dtype=float) / base.reindex(
        pd.MultiIndex.from_arrays([peers["key"], peers["run"]])).to_numpy(dtype=float)
    sp = peers.assign(speedup=ratio).dropna(subset=["speedup"])
    if sp.empty:
        return pd.DataFrame()
    return sp.pivot_table(index="key", columns="system", values="speedup", aggfunc="median")


def checked_rows(bench: pd.DataFrame) -> pd.DataFrame:
    """Rows whose output passed the reference check (a missing ``checked`` counts as passed)."""
    if "checked" not in bench.columns:
        return bench
    return bench[bench["checked"].map(lambda v: str(v).strip().lower() not in ("false", "0"))]


def pick_run(d: pd.DataFrame, workload: str | None) -> str:
    """The run label for ``workload`` (a run label, graph name or workload-key prefix; None = the run
    with the most ok trials). Raises :class:`DatabaseError` naming the runs when nothing matches."""
    runs = _runs_by_size(d)
    if workload is None:
        return runs[0]
    for r in runs:  # exact label, then graph name / workload key prefix
        if r == workload:
            return r
    for r in runs:
        g = d[d["run"] == r].iloc[0]
        if workload in (str(g["graph_name"]),) or str(g["workload_key"]).startswith(workload):
            return r
    raise DatabaseError(f"no workload {workload!r} in the database (have: {', '.join(runs)})")


def dimension_columns(d: pd.DataFrame) -> list[tuple[str, str]]:
    """(label, column) of the schedule dimensions present with two or more values in ``d`` (at most 9)."""
    cols = [c for c in _param_columns(d) + ["rows_per_block"]
            if c in d.columns and d[c].dropna().astype(str).nunique() >= 2]
    out = []
    for label, keys in DIMENSIONS.items():
        for c in cols:
            name = c[2:] if c.startswith("p_") else c
            if any(name == k or re.fullmatch(rf"{k}_\d+", name) for k in keys):
                out.append((label, c))
    return out[:9]
