"""Figures and a Markdown summary of a tuning database (``stitchtune report``, the notebooks).

Contract
--------
* Every ``figure_*`` function is pure: it takes the tuning DataFrame (as returned by
  :func:`stitchtune.db.read_db`, one row per trial, columns in ``docs/INTERFACES.md``) and returns a new
  :class:`matplotlib.figure.Figure`. No pyplot state is touched (figures are built with ``Figure()``,
  rendered by Agg when saved), nothing is shown, the input is never mutated.
* Every figure has a title and axis labels with units. When any plotted row is ``estimated`` (emulate
  backend: the objective is the cost model's prediction), the title says
  :data:`ESTIMATED_NOTE` on the figure. A figure without data says why in its panel instead of failing.
* Times: ``measured_us`` of ``ok`` rows is the trial's time (for the emulate backend ``db.py`` stores the
  predicted time there and sets ``estimated``). Predicted-vs-measured only uses rows that are *not*
  estimated.
* One "run" is a (workload_key, device_name, backend) triple; workloads are labelled by graph name and
  the largest input shape, never by pasting unchecked strings into anything but figure text and
  escaped Markdown.
* :func:`write_report` writes PNG files and ``report.md`` and returns their paths.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from stitchtune.errors import DatabaseError, StitchtuneError

log = logging.getLogger(__name__)

ESTIMATED_NOTE = "estimated (emulated, cost-model times)"
RUN_KEYS = ("workload_key", "device_name", "backend")
MIN_IMPORTANCE_TRIALS = 8
MAX_PANELS = 12
STATUS_COLORS = {
    "ok": "#2ca02c", "pruned": "#bbbbbb", "compile_error": "#d62728", "launch_error": "#9467bd",
    "timeout": "#ff7f0e", "wrong_result": "#8c564b",
}
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
PEER_SYSTEMS = ("torch_eager", "torch_compile_default", "torch_compile_max_autotune",
                "torch_compile_max_autotune_no_cudagraphs", "jax_jit")
BENCH_COLUMNS = ("workload", "system", "median_us")


# --------------------------------------------------------------------------------------- data helpers
def _text(value: object, limit: int = 48) -> str:
    """A DB string made safe for matplotlib text (no mathtext, no hidden legend label)."""
    s = re.sub(r"[\x00-\x1f\x7f]", "?", str(value))[:limit].replace("$", r"\$")
    return "\u2009" + s if s.startswith("_") else s


def _md(value: object, limit: int = 64) -> str:
    """A DB string made safe for one Markdown table cell."""
    s = re.sub(r"[\x00-\x1f\x7f]", "?", str(value))[:limit]
    return re.sub(r"([\\`*_\[\]<>|#])", r"\\\1", s)


def _file_part(value: object) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(value))[:64].lstrip(".") or "x"


def _shape_text(shapes: object) -> str:
    """'16384x1024' for the largest shape in a ``shapes`` JSON cell, '' when unreadable."""
    try:
        obj = json.loads(shapes) if isinstance(shapes, str) else shapes
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


# --------------------------------------------------------------------------------------- figure helpers
def _figure(title: str, rows: pd.DataFrame | None, n_panels: int = 1, panel_size=(5.0, 3.6)):
    """A Figure with a grid of ``n_panels`` axes, the title (plus the estimated note when due)."""
    n = max(1, n_panels)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(panel_size[0] * ncols, panel_size[1] * nrows + 0.6), layout="constrained")
    axes = list(np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel())
    for ax in axes[n:]:
        ax.set_visible(False)
    if rows is not None and len(rows) and rows["is_estimated"].any():
        note = ESTIMATED_NOTE if rows["is_estimated"].all() else f"partly {ESTIMATED_NOTE}"
        fig.suptitle(f"{title}\n{note}", fontsize=12)
    else:
        fig.suptitle(title, fontsize=12)
    return fig, axes[:n]


def _shown(runs: list[str], d: pd.DataFrame) -> str:
    n = d["run"].nunique()
    return f" ({len(runs)} of {n} workloads, most trials first)" if len(runs) < n else ""


def _log_y(ax, values, x_too: bool = False) -> None:
    """Log scale, with plain-number tick labels, when ``values`` (all > 0) span more than a factor of
    10; otherwise the linear scale stays (its ticks read better over a short range)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v) or v.min() <= 0 or v.max() / v.min() <= 10:
        return
    ax.set_yscale("log")
    if x_too:
        ax.set_xscale("log")
    for axis in [ax.yaxis] + ([ax.xaxis] if x_too else []):
        axis.set_major_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def _empty(ax, message: str, xlabel: str = "", ylabel: str = "") -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, wrap=True,
            fontsize=10, color="dimgray")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def _panel_title(run: str, rows: pd.DataFrame) -> str:
    """A run's panel title; says 'estimated' when the run's rows are (the figure may be mixed)."""
    return _text(run, 60) + (" (estimated)" if len(rows) and rows["is_estimated"].any() else "")


def _time_label(rows: pd.DataFrame) -> str:
    return "predicted time (µs)" if len(rows) and rows["is_estimated"].all() else "time (µs)"


# --------------------------------------------------------------------------------------- figures
def figure_best_so_far(df: pd.DataFrame) -> Figure:
    """Best-so-far time against trial number; one panel per workload, one line per study/sampler."""
    d = _prepared(df)
    runs = _runs_by_size(d)[:MAX_PANELS]
    fig, axes = _figure("Best time so far vs trial number" + _shown(runs, d), d[d["run"].isin(runs)], len(runs))
    for ax, run in zip(axes, runs):
        r = d[d["run"] == run]
        ax.set_title(_panel_title(run, r), fontsize=10)
        plotted = False
        groups = list(r.groupby(["study", "sampler"], dropna=False, sort=True))
        by_sampler = len({s for (_, s), _ in groups}) == len(groups)
        for i, ((study, sampler), g) in enumerate(groups):
            g = g.sort_values("order")
            best = g["time_us"].cummin().ffill()
            if best.notna().any():
                lab = str(sampler) if by_sampler else f"{sampler} ({study})"
                ax.step(g["order"], best, where="post", label=_text(lab, 40), lw=1.6,
                        ls=("-", "--", ":", "-.")[i % 4])   # styles keep identical curves visible
                plotted = True
        if not plotted:
            _empty(ax, "no ok trials", "trial number", _time_label(r))
            continue
        ax.set_xlabel("trial number")
        ax.set_ylabel("best " + _time_label(r))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, title="sampler" if by_sampler else "sampler (study)", title_fontsize=7)
    return fig


def figure_predicted_vs_measured(df: pd.DataFrame) -> Figure:
    """Cost-model prediction against measured time (non-estimated ok rows), Spearman per workload."""
    d = _prepared(df)
    m = d[d["time_us"].notna() & d["predicted_us"].notna() & ~d["is_estimated"] & ~d["is_reused"]]
    fig, (ax,) = _figure("Cost model: predicted vs measured time", m if len(m) else d, 1, (7.5, 5.5))
    ax.set_xlabel("predicted time (µs)")
    ax.set_ylabel("measured time (µs)")
    if m.empty:
        why = ("no measured rows: every ok row is estimated (emulate backend),\n"
               "so predicted = objective; this needs a GPU database") if d["is_estimated"].any() else \
            "no ok rows with both a prediction and a measurement"
        _empty(ax, why, "predicted time (µs)", "measured time (µs)")
        return fig
    rhos = []
    for run, g in m.groupby("run", sort=True):
        rho = spearman(g)
        rhos.append(rho)
        lab = f"{_text(run, 60)}  ρ={rho:.2f}" if not math.isnan(rho) else f"{_text(run, 60)}  ρ=n/a"
        ax.scatter(g["predicted_us"], g["time_us"], s=12, alpha=0.7, label=lab)
    lo = float(min(m["predicted_us"].min(), m["time_us"].min()))
    hi = float(max(m["predicted_us"].max(), m["time_us"].max()))
    ax.plot([lo, hi], [lo, hi], color="gray", lw=0.8, ls="--", label="y = x")
    _log_y(ax, np.r_[m["predicted_us"], m["time_us"]], x_too=True)
    ax.grid(alpha=0.3, which="both")
    finite = [r for r in rhos if not math.isnan(r)]
    med = f"median Spearman ρ over workloads = {np.median(finite):.2f}" if finite else "Spearman ρ: n/a"
    ax.set_title(med, fontsize=10)
    ax.legend(fontsize=7)
    return fig


def spearman(rows: pd.DataFrame) -> float:
    """Spearman rank correlation of ``predicted_us`` and ``time_us`` (NaN with < 3 points or no spread)."""
    from scipy.stats import spearmanr

    g = rows[rows["time_us"].notna() & rows["predicted_us"].notna() & ~rows["is_reused"]]
    if len(g) < 3 or g["time_us"].nunique() < 2 or g["predicted_us"].nunique() < 2:
        return float("nan")
    return float(spearmanr(g["predicted_us"], g["time_us"]).statistic)


def param_importances(rows: pd.DataFrame) -> dict[str, float] | str:
    """optuna parameter importances of one run's ok trials (one per distinct schedule, reused rows left
    out), or a reason string when there are too few.

    The study is rebuilt in memory from the rows: each ``p_`` column with at least two values becomes
    a parameter (integers -> IntDistribution, other numbers -> FloatDistribution, the rest ->
    CategoricalDistribution); a missing value means the (conditional) parameter was absent.
    Evaluated with optuna's PED-ANOVA evaluator (optuna >= 3.6; no scikit-learn needed).
    """
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    ok = rows[rows["time_us"].notna() & ~rows["is_reused"]]
    if "schedule_key" in ok.columns:
        ok = ok[ok["schedule_key"].isna() | ~ok["schedule_key"].duplicated()]   # one point per schedule
    if len(ok) < MIN_IMPORTANCE_TRIALS:
        return f"not enough trials: {len(ok)} ok, need {MIN_IMPORTANCE_TRIALS}"
    dists = {}
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
            params, used = {}, {}
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


def _py(v: object) -> object:
    return v.item() if isinstance(v, np.generic) else v


def figure_param_importances(df: pd.DataFrame, max_runs: int = 6) -> Figure:
    """optuna parameter importances per workload (the runs with most ok trials first)."""
    d = _prepared(df)
    runs = _runs_by_size(d)[:max_runs]
    fig, axes = _figure("Schedule parameter importances (optuna, PED-ANOVA)" + _shown(runs, d), d[d["run"].isin(runs)],
                        len(runs), (5.8, 3.6))
    for ax, run in zip(axes, runs):
        ax.set_title(_panel_title(run, d[d["run"] == run]), fontsize=9)
        imp = param_importances(d[d["run"] == run])
        if isinstance(imp, str):
            _empty(ax, imp, "importance (fraction, sums to 1)", "parameter")
            continue
        items = sorted(imp.items(), key=lambda kv: kv[1])[-10:]
        ax.barh([_text(k, 28) for k, _ in items], [v for _, v in items], color="#1f77b4")
        ax.set_xlabel("importance (fraction, sums to 1)")
        ax.set_ylabel("parameter")
        ax.set_xlim(0, 1)
        ax.grid(alpha=0.3, axis="x")
    return fig


def figure_time_vs_occupancy(df: pd.DataFrame) -> Figure:
    """Time relative to each workload's best against theoretical occupancy (ok rows)."""
    d = _prepared(df)
    m = d[d["time_us"].notna() & d["occupancy"].notna() & ~d["is_reused"]].copy()
    fig, (ax,) = _figure("Time vs theoretical occupancy", m, 1, (7.0, 4.2))
    if m.empty:
        _empty(ax, "no ok rows with an occupancy", "theoretical occupancy (%)", "time / workload best (×)")
        return fig
    m["rel"] = m["time_us"] / m.groupby("run")["time_us"].transform("min")
    occ = m["occupancy"] * (100.0 if m["occupancy"].max() <= 1.0 else 1.0)
    for run in sorted(m["run"].unique()):
        sel = m["run"] == run
        est = " (est.)" if m.loc[sel, "is_estimated"].any() else ""
        ax.scatter(occ[sel], m.loc[sel, "rel"], s=12, alpha=0.7, label=_text(run, 60) + est)
    _log_y(ax, m["rel"])
    ax.set_xlabel("theoretical occupancy (%)")
    ax.set_ylabel("time / workload best (×)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return fig


def figure_status(df: pd.DataFrame) -> Figure:
    """Trials by status per workload (stacked horizontal bars)."""
    d = _prepared(df)
    counts = d.groupby(["run", "status"]).size().unstack(fill_value=0)
    order = [s for s in STATUS_COLORS if s in counts.columns] + sorted(
        c for c in counts.columns if c not in STATUS_COLORS)
    counts = counts[order].sort_index(ascending=False)
    fig, (ax,) = _figure("Trials by status", None, 1, (9.0, 0.45 * len(counts) + 2.0))
    left = np.zeros(len(counts))
    y = np.arange(len(counts))
    for status in order:
        vals = counts[status].to_numpy()
        ax.barh(y, vals, left=left, color=STATUS_COLORS.get(status, "#17becf"), label=_text(status))
        left += vals
    ax.set_yticks(y, [_text(r, 60) for r in counts.index], fontsize=8)
    ax.set_xlabel("trials (count)")
    ax.set_ylabel("workload")
    ax.legend(fontsize=8, ncols=min(len(order), 6), loc="lower center", bbox_to_anchor=(0.5, 1.0),
              frameon=False)
    ax.grid(alpha=0.3, axis="x")
    return fig


def floors(df: pd.DataFrame, bench: pd.DataFrame | None = None, bandwidth_gbs: float | None = None,
           min_bytes: dict[str, int] | None = None) -> pd.Series:
    """Memory-bandwidth floor (µs) per run label; NaN where unknown.

    First choice: a benchmark CSV's ``floor_us`` for the workload (bench names workloads by graph name)
    on the same device: it uses the copy bandwidth measured in that run and counts forced re-reads.
    Otherwise floor = min bytes / copy bandwidth, with min bytes from a ``min_bytes`` DB column, else
    ``min_bytes`` (workload key -> bytes, see :func:`min_bytes_from_graphs`), else the ``shapes`` and
    ``dtypes`` columns (:func:`min_bytes_from_shapes`), and the bandwidth (GB/s)
    from ``bandwidth_gbs``, else a ``copy_bandwidth_gbs`` DB column, else the device preset
    (:func:`stitchtune.device.get_device`).
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
    from stitchtune.device import get_device

    try:
        return float(get_device(str(device_name)).effective_copy_bandwidth_gbs())
    except StitchtuneError:
        return None


_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def min_bytes_from_shapes(shapes: object, dtypes: object) -> int | None:
    """Sum of the tensors in a row's ``shapes``/``dtypes`` JSON (inputs and outputs by name, as
    ``pipeline.context_row`` writes them): ``Graph.min_bytes()`` except when an output is also an
    input (then counted once). None when the cells cannot be read."""
    try:
        sh, dt = json.loads(str(shapes)), json.loads(str(dtypes))
        total = sum(math.prod(int(x) for x in sh[name]) * _ITEMSIZE[dt[name]] for name in sh)
    except (TypeError, ValueError, KeyError, AttributeError, json.JSONDecodeError):
        return None
    return int(total) if total > 0 else None


def min_bytes_from_graphs(paths: Iterable[str | os.PathLike[str]]) -> dict[str, int]:
    """workload key -> ``Graph.min_bytes()`` for every graph.json that loads (others are skipped)."""
    from stitchtune.graph import load_graph

    out: dict[str, int] = {}
    for p in paths:
        try:
            g = load_graph(p)
        except StitchtuneError as exc:
            log.info("skipping graph %s for floors: %s", p, exc)
            continue
        out[g.workload_key()] = int(g.min_bytes())
    return out


def figure_floor_fraction(df: pd.DataFrame, floor_us: pd.Series | None = None) -> Figure:
    """Per workload, the floor divided by the best time (1.0 = at the memory-bandwidth floor)."""
    d = _prepared(df)
    floor_us = floors(d) if floor_us is None else floor_us
    best = d.groupby("run")["time_us"].min()
    frac = (floor_us.reindex(best.index) / best).dropna().sort_index(ascending=False)
    fig, (ax,) = _figure("Best time as a fraction of the memory-bandwidth floor", d, 1,
                         (9.0, 0.45 * max(len(frac), 3) + 1.8))
    if frac.empty:
        _empty(ax, "floor unknown: no min_bytes (DB column or graph files)\nand no bandwidth "
                   "(device preset, --bandwidth-gbs or bench CSV)", "floor / best time", "workload")
        return fig
    ax.barh(np.arange(len(frac)), frac.to_numpy(), color="#1f77b4")
    est = d.groupby("run")["is_estimated"].any()
    ax.set_yticks(np.arange(len(frac)), [_text(r, 60) + (" (est.)" if est.get(r) else "") for r in frac.index],
                  fontsize=8)
    for y, v in enumerate(frac.to_numpy()):
        ax.text(v, y, f" {v:.2f}", va="center", fontsize=8)
    ax.axvline(1.0, color="gray", ls="--", lw=0.8)
    ax.axvline(0.9, color="green", ls=":", lw=0.8, label="0.90 target")
    ax.set_xlim(0, max(1.1, float(frac.max()) * 1.15))
    ax.set_xlabel("floor time / best time (fraction, 1 = at floor; floor = min DRAM bytes / copy bandwidth)")
    ax.set_ylabel("workload")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def read_bench(paths: Iterable[str | os.PathLike[str]]) -> pd.DataFrame | None:
    """Concatenate ``bench_<device>.csv`` files (adds ``device`` from the file name); None if none."""
    frames = []
    for p in sorted(Path(x) for x in paths):
        try:
            b = pd.read_csv(p)
        except (OSError, ValueError) as exc:
            raise DatabaseError(f"cannot read benchmark CSV {p}: {exc}") from exc
        missing = [c for c in BENCH_COLUMNS if c not in b.columns]
        if missing:
            raise DatabaseError(f"benchmark CSV {p} lacks columns: {', '.join(missing)}")
        b["device"] = p.stem[len("bench_"):] if p.stem.startswith("bench_") else p.stem
        frames.append(b)
    return pd.concat(frames, ignore_index=True) if frames else None


def checked_rows(bench: pd.DataFrame) -> pd.DataFrame:
    """Rows whose output passed the reference check (a missing ``checked`` counts as passed)."""
    if "checked" not in bench.columns:
        return bench
    return bench[bench["checked"].map(lambda v: str(v).strip().lower() not in ("false", "0"))]


def figure_speedup_over_peers(bench: pd.DataFrame | None) -> Figure:
    """Speedup of stitchtune over each peer per workload (peer median / stitchtune median); rows that
    failed the reference check are left out."""
    fig = Figure(figsize=(9.0, 4.6), layout="constrained")
    ax = fig.subplots()
    devices = "" if bench is None else ", ".join(_text(x, 20) for x in sorted(bench["device"].unique()))
    fig.suptitle("Speedup of tuned kernels over peers (measured" + (f" on {devices})" if devices else ")"))
    if bench is None or bench.empty or not (bench["system"] == "stitchtune").any():
        _empty(ax, "no benchmark results (results/bench_<device>.csv) with a stitchtune row",
               "workload", "speedup (×)")
        return fig
    bench = checked_rows(bench)
    b = bench.assign(key=bench["workload"].astype(str) + np.where(
        bench["device"].nunique() > 1, " @ " + bench["device"].astype(str), ""))
    piv = b.pivot_table(index="key", columns="system", values="median_us", aggfunc="min")
    peers = [c for c in piv.columns if c != "stitchtune"]
    peers = [p for p in PEER_SYSTEMS if p in peers] + sorted(p for p in peers if p not in PEER_SYSTEMS)
    sp = piv[peers].div(piv["stitchtune"], axis=0).dropna(how="all")
    if sp.empty or not peers:
        _empty(ax, "no workload has both stitchtune and a peer", "workload", "speedup (×)")
        return fig
    x = np.arange(len(sp))
    w = 0.8 / len(peers)
    for i, peer in enumerate(peers):
        vals = sp[peer].to_numpy(dtype=float)
        gm = np.exp(np.nanmean(np.log(vals))) if np.isfinite(vals).any() else float("nan")
        ax.bar(x + (i - (len(peers) - 1) / 2) * w, vals, w, label=f"vs {_text(peer, 30)} (geomean {gm:.2f}×)")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xticks(x, [_text(k, 30) for k in sp.index], rotation=30, ha="right", fontsize=8)
    ax.set_xlabel("workload")
    ax.set_ylabel("speedup (×, peer time / stitchtune time)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(alpha=0.3, axis="y")
    return fig


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


def figure_schedule_dimensions(df: pd.DataFrame, workload: str | None = None) -> Figure:
    """For one workload: time against each schedule dimension (scheme, threads per row, rows per
    block, vector width, reuse level), each trial a dot, the heuristic a star, medians as bars."""
    d = _prepared(df)
    run = pick_run(d, workload)
    r = d[(d["run"] == run) & d["time_us"].notna()]
    dims = dimension_columns(r)
    fig, axes = _figure(f"Schedule dimensions vs time: {_text(run, 64)}", r, max(1, len(dims)), (4.2, 3.4))
    if not dims:
        _empty(axes[0], "no schedule dimension takes two values among ok trials", "parameter value",
               _time_label(r))
        return fig
    rng = np.random.default_rng(0)
    for ax, (label, col) in zip(axes, dims):
        vals = r[col].map(lambda v: "(absent)" if v is None or (isinstance(v, float) and math.isnan(v))
                          else str(_py(v)))
        cats = sorted(vals.unique(), key=_natural)
        pos = vals.map({c: i for i, c in enumerate(cats)}).to_numpy(dtype=float)
        ax.scatter(pos + rng.uniform(-0.15, 0.15, len(pos)), r["time_us"], s=10, alpha=0.6, color="#1f77b4")
        med = r.groupby(vals)["time_us"].median()
        ax.hlines([med[c] for c in cats], np.arange(len(cats)) - 0.3, np.arange(len(cats)) + 0.3,
                  color="black", lw=1.5, label="median")
        h = r[r["is_heuristic"]]
        if len(h):
            hp = vals[h.index].map({c: i for i, c in enumerate(cats)})
            ax.scatter(hp, h["time_us"], marker="*", s=140, color="orange", edgecolor="black",
                       zorder=5, label="heuristic")
        ax.set_xticks(range(len(cats)), [_text(c, 14) for c in cats], rotation=30, fontsize=8)
        ax.set_title(_text(f"{label} ({col.removeprefix('p_')})", 40), fontsize=9)
        ax.set_xlabel(f"{label} (value)")
        ax.set_ylabel(_time_label(r))
        _log_y(ax, r["time_us"])
        ax.grid(alpha=0.3, axis="y", which="both")
    axes[0].legend(fontsize=7)
    return fig


def _natural(s: str):
    try:
        return (0, float(s), "")
    except ValueError:
        return (1, 0.0, s)


def heuristic_rank(rows: pd.DataFrame) -> tuple[int, int, float, float] | None:
    """(rank, n distinct ok schedules, heuristic time, best time) for one run; None without a heuristic.

    Schedules are de-duplicated by ``schedule_key`` (their fastest row); rank 1 = fastest.
    """
    ok = rows[rows["time_us"].notna()]
    h = ok[ok["is_heuristic"]]
    if ok.empty or h.empty:
        return None
    key = "schedule_key" if "schedule_key" in ok.columns and ok["schedule_key"].notna().all() else None
    times = ok.groupby(key)["time_us"].min() if key else ok["time_us"]
    ht = float(h["time_us"].min())
    return int((times < ht).sum()) + 1, int(len(times)), ht, float(times.min())


def figure_heuristic_rank(df: pd.DataFrame, workload: str | None = None) -> Figure:
    """For one workload: all measured schedules sorted by time, the heuristic's place marked."""
    d = _prepared(df)
    run = pick_run(d, workload)
    r = d[(d["run"] == run) & d["time_us"].notna()]
    fig, (ax,) = _figure(f"Heuristic among all schedules: {_text(run, 64)}", r, 1, (7.0, 4.0))
    res = heuristic_rank(r)
    if r.empty:
        _empty(ax, "no ok trials", "rank (1 = fastest)", _time_label(r))
        return fig
    t = np.sort(r["time_us"].to_numpy(dtype=float))
    ax.plot(np.arange(1, len(t) + 1), t, marker=".", lw=1, label="ok trials, sorted")
    if res is not None:
        rank_rows = int((t < res[2]).sum()) + 1
        ax.scatter([rank_rows], [res[2]], marker="*", s=200, color="orange", edgecolor="black", zorder=5,
                   label=f"heuristic: rank {res[0]} of {res[1]} schedules, {res[2] / res[3]:.2f}× best")
    else:
        ax.text(0.02, 0.95, "no heuristic trial found", transform=ax.transAxes, va="top")
    ax.set_xlabel("rank among ok trials (1 = fastest)")
    ax.set_ylabel(_time_label(r))
    _log_y(ax, t)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return fig


# --------------------------------------------------------------------------------------- report
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
            "best_us": best, "heuristic_us": hr[2] if hr else float("nan"),
            "speedup_vs_heuristic": hr[2] / best if hr and best > 0 else float("nan"),
            "heuristic_rank": f"{hr[0]}/{hr[1]}" if hr else "n/a",
            "fraction_of_floor": fl / best if best and best > 0 else float("nan"),
            "spearman": float("nan") if est else spearman(g),
        })
    return pd.DataFrame(rows)


def _fmt(v: object, spec: str) -> str:
    if isinstance(v, (float, np.floating)) and math.isnan(v):
        return "n/a"
    return format(v, spec)


def write_report(db_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                 bench_paths: Sequence[str | os.PathLike[str]] | None = None,
                 graph_paths: Sequence[str | os.PathLike[str]] | None = None,
                 bandwidth_gbs: float | None = None, max_workloads: int = 12) -> list[Path]:
    """Write the figures as PNG files and ``report.md`` into ``out_dir``; return the written paths.

    ``bench_paths`` default to ``bench_*.csv`` in ``db_dir``. ``graph_paths`` (graph.json files) give
    min bytes for the floor when the DB has no ``min_bytes`` column. Raises :class:`DatabaseError`
    when the database is missing or holds no trials.
    """
    from stitchtune.db import read_db

    db_dir, out = Path(db_dir), Path(out_dir)
    if not db_dir.is_dir():
        raise DatabaseError(f"database directory {db_dir} does not exist")
    d = prepare(read_db(db_dir))
    bench = read_bench(bench_paths if bench_paths is not None else db_dir.glob("bench_*.csv"))
    mb = min_bytes_from_graphs(graph_paths or [])
    fl = floors(d, bench, bandwidth_gbs, mb)
    out.mkdir(parents=True, exist_ok=True)
    figures: list[tuple[str, str, Figure]] = [
        ("best_so_far.png", "Best time so far vs trial number", figure_best_so_far(d)),
        ("predicted_vs_measured.png", "Cost model: predicted vs measured", figure_predicted_vs_measured(d)),
        ("param_importances.png", "Parameter importances", figure_param_importances(d)),
        ("time_vs_occupancy.png", "Time vs occupancy", figure_time_vs_occupancy(d)),
        ("status.png", "Trials by status", figure_status(d)),
        ("floor_fraction.png", "Fraction of the bandwidth floor", figure_floor_fraction(d, fl)),
    ]
    if bench is not None:
        figures.append(("speedup_over_peers.png", "Speedup over peers", figure_speedup_over_peers(bench)))
    for i, run in enumerate(_runs_by_size(d)[:max_workloads]):
        if not d.loc[d["run"] == run, "time_us"].notna().any():
            continue
        stem = f"{i:02d}_{_file_part(run)}"
        figures.append((f"schedule_dims_{stem}.png", f"Schedule dimensions: {run}",
                        figure_schedule_dimensions(d, run)))
        figures.append((f"heuristic_rank_{stem}.png", f"Heuristic rank: {run}", figure_heuristic_rank(d, run)))
    written: list[Path] = []
    for name, _, fig in figures:
        path = out / name
        fig.savefig(path, dpi=100)
        written.append(path)
    md = out / "report.md"
    md.write_text(_markdown(d, fl, bench, figures), encoding="utf-8")
    written.append(md)
    log.info("wrote %d report files to %s", len(written), out)
    return written


def _markdown(d: pd.DataFrame, fl: pd.Series, bench: pd.DataFrame | None,
              figures: list[tuple[str, str, Figure]]) -> str:
    t = summary_table(d, fl)
    lines = ["# stitchtune tuning report", ""]
    if d["is_estimated"].any():
        lines += [f"Rows marked *est.* are {ESTIMATED_NOTE}: emulate backend, the time is the cost "
                  "model's prediction, not a measurement.", ""]
    lines += ["| workload | device | backend | trials | ok | best (µs) | heuristic (µs) | speedup vs heuristic "
              "| heuristic rank | fraction of floor | Spearman ρ |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for _, r in t.iterrows():
        est = " est." if r["estimated"] else ""
        t_best = _fmt(r["best_us"], ".2f") + (est if pd.notna(r["best_us"]) else "")
        t_heur = _fmt(r["heuristic_us"], ".2f") + (est if pd.notna(r["heuristic_us"]) else "")
        lines.append(
            f"| {_md(r['workload'])} | {_md(r['device'])} | {_md(r['backend'])} | {r['trials']} | {r['ok']} "
            f"| {t_best} | {t_heur} "
            f"| {_fmt(r['speedup_vs_heuristic'], '.2f')} | {r['heuristic_rank']} "
            f"| {_fmt(r['fraction_of_floor'], '.2f')} | {_fmt(r['spearman'], '.2f')} |")
    counts = d.groupby("status").size()
    lines += ["", "Trials by status: " + ", ".join(f"{_md(s)} {n}" for s, n in counts.items()), ""]
    if bench is not None and (bench["system"] == "stitchtune").any():
        bench = checked_rows(bench)
        lines += ["## Benchmark (measured; rows that failed the reference check left out)", "", "| workload | device | system | median (µs) | speedup of stitchtune |",
                  "|---|---|---|---:|---:|"]
        st = bench[bench["system"] == "stitchtune"].set_index(["workload", "device"])["median_us"]
        for _, r in bench.iterrows():
            base = st.get((r["workload"], r["device"]), float("nan"))
            sp = r["median_us"] / base if r["system"] != "stitchtune" else float("nan")
            lines.append(f"| {_md(r['workload'])} | {_md(r['device'])} | {_md(r['system'])} "
                         f"| {_fmt(float(r['median_us']), '.2f')} | {_fmt(float(sp), '.2f')} |")
        lines.append("")
    lines += ["## Figures", ""]
    lines += [f"- [{_md(title, 80)}]({name})" for name, title, _ in figures]
    return "\n".join(lines) + "\n"
