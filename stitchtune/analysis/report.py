"""The tuning report: figures as PNG files plus a Markdown summary (``stitchtune report``, the notebooks).

Contract
--------
* :func:`write_report` reads a tuning database, writes PNG files and ``report.md`` and returns their
  paths. Table rows whose times are estimated (emulate backend) are marked *est.* and the report says
  :data:`ESTIMATED_NOTE`.
* Strings from the database reach ``report.md`` only through :func:`_md` (escaped, one table cell) and
  file names only through :func:`_file_part`.
* This module is the public face of the report: it re-exports the data preparation of
  :mod:`stitchtune.analysis.data` (``prepare``, ``summary_table``, ``floors``, ``spearman``, ...) and the
  figures of :mod:`stitchtune.analysis.figures` (``figure_*``), so ``from stitchtune import report`` is all
  a notebook needs. Imports go data <- figures <- report.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from stitchtune.errors import DatabaseError
from stitchtune.analysis.data import (
    BENCH_COLUMNS,
    DIMENSIONS,
    ESTIMATED_NOTE,
    MIN_IMPORTANCE_TRIALS,
    RUN_KEYS,
    _runs_by_size,
    checked_rows,
    dimension_columns,
    floors,
    heuristic_rank,
    min_bytes_from_graphs,
    min_bytes_from_shapes,
    param_importances,
    peer_speedups,
    pick_run,
    prepare,
    read_bench,
    spearman,
    summary_table,
)
from stitchtune.analysis.figures import (
    MAX_PANELS,
    PEER_SYSTEMS,
    STATUS_COLORS,
    figure_best_so_far,
    figure_floor_fraction,
    figure_heuristic_rank,
    figure_param_importances,
    figure_predicted_vs_measured,
    figure_schedule_dimensions,
    figure_speedup_over_peers,
    figure_status,
    figure_time_vs_occupancy,
)

log = logging.getLogger(__name__)

__all__ = [  # the public API of stitchtune.analysis.report, including the names of analysis.data / analysis.figures
    "BENCH_COLUMNS", "DIMENSIONS", "ESTIMATED_NOTE", "MAX_PANELS", "MIN_IMPORTANCE_TRIALS", "PEER_SYSTEMS",
    "RUN_KEYS", "STATUS_COLORS", "checked_rows", "dimension_columns", "figure_best_so_far",
    "figure_floor_fraction", "figure_heuristic_rank", "figure_param_importances",
    "figure_predicted_vs_measured", "figure_schedule_dimensions", "figure_speedup_over_peers",
    "figure_status", "figure_time_vs_occupancy", "floors", "heuristic_rank", "min_bytes_from_graphs",
    "min_bytes_from_shapes", "param_importances", "peer_speedups", "pick_run", "prepare", "read_bench", "spearman",
    "summary_table", "write_report",
]


def _md(value: object, limit: int = 64) -> str:
    """A DB string made safe for one Markdown table cell."""
    s = re.sub(r"[\x00-\x1f\x7f]", "?", str(value))[:limit]
    return re.sub(r"([\\`*_\[\]<>|#])", r"\\\1", s)


def _file_part(value: object) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(value))[:64].lstrip(".") or "x"


# --------------------------------------------------------------------------------------- report
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
    from stitchtune.tune.database import read_db

    db_dir, out = Path(db_dir), Path(out_dir)
    if not db_dir.is_dir():
        why = "is not a directory" if db_dir.exists() else "does not exist"
        raise DatabaseError(f"database directory {ascii(str(db_dir))} {why}")
    d = prepare(read_db(db_dir))
    bench = read_bench(bench_paths if bench_paths is not None else db_dir.glob("bench_*.csv"))
    mb = min_bytes_from_graphs(graph_paths or [])
    fl = floors(d, bench, bandwidth_gbs, mb)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatabaseError(f"cannot create the report directory {ascii(str(out))}: {e.strerror or e}") from None
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
    try:
        for name, _, fig in figures:
            path = out / name
            fig.savefig(path, dpi=100)
            written.append(path)
        md = out / "report.md"
        md.write_text(_markdown(d, fl, bench, figures), encoding="utf-8")
    except OSError as e:
        raise DatabaseError(f"cannot write the report into {ascii(str(out))}: {e.strerror or e}") from None
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
        if "run" not in bench.columns:
            bench = bench.assign(run=bench["device"])
        # the speedup is over the stitchtune row of the same run (file): runs on one device differ a little
        st = bench[bench["system"] == "stitchtune"].groupby(["workload", "run"])["median_us"].min()
        for _, r in bench.iterrows():
            base = st.get((r["workload"], r["run"]), float("nan"))
            sp = r["median_us"] / base if r["system"] != "stitchtune" else float("nan")
            where = r["device"] if r["run"] == r["device"] else f"{r['device']} (run {r['run']})"
            lines.append(f"| {_md(r['workload'])} | {_md(where)} | {_md(r['system'])} "
                         f"| {_fmt(float(r['median_us']), '.2f')} | {_fmt(float(sp), '.2f')} |")
        lines.append("")
    lines += ["## Figures", ""]
    lines += [f"- [{_md(title, 80)}]({name})" for name, title, _ in figures]
    return "\n".join(lines) + "\n"
