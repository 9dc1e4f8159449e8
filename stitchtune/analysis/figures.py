"""Figures of a tuning database (``stitchtune report``, the notebooks).

Contract
--------
* Every ``figure_*`` function is pure: it takes the tuning DataFrame (raw from
  :func:`stitchtune.tune.database.read_db` or already :func:`stitchtune.analysis.data.prepare`-d) and returns a new
  :class:`matplotlib.figure.Figure`. No pyplot state is touched (figures are built with ``Figure()``,
  rendered by Agg when saved), nothing is shown, the input is never mutated.
* Every figure has a title and axis labels with units. When any plotted row is ``estimated`` (emulate
  backend: the objective is the cost model's prediction), the title says
  :data:`~stitchtune.analysis.data.ESTIMATED_NOTE` on the figure. A figure without data says why in its
  panel instead of failing.
* Predicted-vs-measured only uses rows that are *not* estimated.
* Strings from the database reach figures only as text made safe by :func:`_text` (no mathtext).
* The data preparation these figures draw is in :mod:`stitchtune.analysis.data`; :mod:`stitchtune.analysis.report`
  re-exports every public name of this module.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from stitchtune.analysis.data import (
    ESTIMATED_NOTE,
    _prepared,
    _py,
    _runs_by_size,
    dimension_columns,
    floors,
    heuristic_rank,
    param_importances,
    peer_speedups,
    pick_run,
    spearman,
)

MAX_PANELS = 12
STATUS_COLORS = {
    "ok": "#2ca02c", "pruned": "#bbbbbb", "compile_error": "#d62728", "launch_error": "#9467bd",
    "timeout": "#ff7f0e", "wrong_result": "#8c564b",
}
PEER_SYSTEMS = ("torch_eager", "torch_compile_default", "torch_compile_max_autotune",
                "torch_compile_max_autotune_no_cudagraphs", "jax_jit")


# --------------------------------------------------------------------------------------- figure helpers
def _text(value: object, limit: int = 48) -> str:
    """A DB string made safe for matplotlib text (no mathtext, no hidden legend label)."""
    s = re.sub(r"[\x00-\x1f\x7f]", "?", str(value))[:limit].replace("$", r"\$")
    return "\u2009" + s if s.startswith("_") else s


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
    """Best-so-far time against trial number; one panel per workload with at least two trials (a
    single trial has no "so far" to draw: those workloads are counted in the title, not given an
    empty panel), one line per study/sampler."""
    d = _prepared(df)
    sizes = d.groupby("run").size()
    single = int((sizes < 2).sum())
    runs = [r for r in _runs_by_size(d) if sizes[r] >= 2][:MAX_PANELS]
    left_out = f" ({single} single-trial workload(s) not shown)" if single else ""
    title = "Best time so far vs trial number" + (_shown(runs, d[d["run"].isin(sizes[sizes >= 2].index)])
                                                  if runs else "") + left_out
    fig, axes = _figure(title, d[d["run"].isin(runs)] if runs else d, len(runs))
    if not runs:
        _empty(axes[0], "every workload has a single trial: no best-so-far curve to draw",
               "trial number", _time_label(d))
        return fig
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


#: how the figures name the peers of ``stitchtune bench``
PEER_LABELS = {"torch_eager": "PyTorch eager", "torch_compile_default": "torch.compile",
               "torch_compile_max_autotune": "torch.compile max-autotune",
               "torch_compile_max_autotune_no_cudagraphs": "torch.compile max-autotune (no CUDA graphs)",
               "jax_jit": "JAX jit"}


def figure_speedup_over_peers(bench: pd.DataFrame | None) -> Figure:
    """Speedup of stitchtune over each peer per workload (peer median / stitchtune median of the same
    benchmark run; rows that failed the reference check left out), on a log axis so that ~1x
    differences stay readable next to 10x ones; the closest peer (lowest geometric-mean speedup) first."""
    fig = Figure(figsize=(9.0, 5.6), layout="constrained")
    ax = fig.subplots()
    devices = "" if bench is None else ", ".join(_text(x, 20) for x in sorted(bench["device"].unique()))
    fig.suptitle("Speedup of tuned kernels over peers (measured" + (f" on {devices})" if devices else ")"))
    if bench is None or bench.empty or not (bench["system"] == "stitchtune").any():
        _empty(ax, "no benchmark results (<db>/bench_<device>.csv) with a stitchtune row",
               "workload", "speedup (×)")
        return fig
    sp = peer_speedups(bench)
    if sp.empty:
        _empty(ax, "no workload has both stitchtune and a peer", "workload", "speedup (×)")
        return fig
    geo = {p: float(np.exp(np.log(sp[p].dropna()).mean())) for p in sp.columns}
    peers = sorted(sp.columns, key=lambda p: geo[p])
    x = np.arange(len(sp))
    w = 0.8 / len(peers)
    for i, peer in enumerate(peers):
        vals = sp[peer].to_numpy(dtype=float)
        n = int(np.isfinite(vals).sum())
        count = "" if n == len(sp) else f", {n} of {len(sp)} workloads"
        label = f"vs {_text(PEER_LABELS.get(peer, peer), 60)} (geomean {geo[peer]:.2f}×{count})"
        ax.bar(x + (i - (len(peers) - 1) / 2) * w, vals, w, label=label)
    ax.axhline(1.0, color="black", lw=0.9, ls="--")
    ax.set_yscale("log")
    lo, hi = float(np.nanmin(sp.to_numpy())), float(np.nanmax(sp.to_numpy()))
    ticks = [t for t in (0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 50, 100) if lo / 1.3 <= t <= hi * 1.3]
    ax.set_ylim(min(lo, 1.0) / 1.15, max(hi, 1.0) * 1.15)
    ax.set_yticks(ticks, [f"{t:g}×" for t in ticks])
    ax.minorticks_off()
    ax.set_xticks(x, [_text(k, 30) for k in sp.index], rotation=30, ha="right", fontsize=8)
    ax.set_xlabel("workload")
    ax.set_ylabel("speedup, log scale\n(peer time / stitchtune time; > 1: stitchtune faster)")
    fig.legend(fontsize=8, loc="outside lower center", ncol=2)
    ax.grid(alpha=0.3, axis="y")
    return fig


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
        rank_rows = int((t < res.heuristic_us).sum()) + 1
        ax.scatter([rank_rows], [res.heuristic_us], marker="*", s=200, color="orange", edgecolor="black", zorder=5,
                   label=f"heuristic: rank {res.rank} of {res.of} schedules, "
                         f"{res.heuristic_us / res.best_us:.2f}× best")
    else:
        ax.text(0.02, 0.95, "no heuristic trial found", transform=ax.transAxes, va="top")
    ax.set_xlabel("rank among ok trials (1 = fastest)")
    ax.set_ylabel(_time_label(r))
    _log_y(ax, t)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return fig
