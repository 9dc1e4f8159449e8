"""Search results as text for the CLI: the end-of-search summary and the ``stitchtune show`` table.

Contract
--------
* :func:`format_summary(result)` turns a :class:`~stitchtune.tune.result.SearchResult` into the end-of-search
  table; every time is labelled ``(estimated)`` when the result is (emulate backend).
* :func:`format_best_table(df)`: best row per workload, device and backend; the time is in a column
  ``measured_us`` or ``estimated_us`` (emulate backend: the cost model's prediction), whichever applies.
* :func:`json_safe(row)`: a row with only JSON-serialisable values.
* Pure functions of their arguments; :mod:`stitchtune.tune.search` re-exports them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from stitchtune.tune.records import TrialRecord
from stitchtune.tune.result import SearchResult

__all__ = ["format_best_table", "format_summary", "json_safe"]


def _fmt_us(x: float | None, est: str) -> str:
    return "-" if x is None else f"{float(x):.3f} us{est}"


def format_summary(res: SearchResult) -> str:
    """The end-of-search table, as text (the CLI prints it)."""
    est = " (estimated)" if res.estimated else ""
    lines = [f"study {res.study_name} on {res.device_key}, backend {res.backend}{est}, storage {res.storage}",
             (f"database {res.db_path}; {res.trials_run} trial(s) this run ({res.reused} reused: schedules "
              f"already tried, told from their earlier result), stopped: {res.stopped}, {res.elapsed_s:.1f} s")]
    rows: list[tuple[str, str]] = []
    best, heur = res.best, res.heuristic
    if best is not None:
        sched = best.schedule_json or ""
        rows.append(("best schedule", f"{best.schedule_key} (trial {best.trial_number} of {best.study})"))
        rows.append(("best time", _fmt_us(best.measured_us, est)))
        rows.append(("heuristic (trial 0)", _fmt_us(heur.measured_us, est) if heur is not None and heur.ok
                     else (f"not ok: {heur.status.value}" if heur is not None else "-")))
        rows.append(("speedup over heuristic", f"{res.speedup:.2f}x{est}" if res.speedup is not None else "-"))
        if res.floor_fraction is not None:
            rows.append(("bandwidth floor", (f"{res.floor_us:.3f} us (min bytes / copy bandwidth); floor/best = "
                                             f"{100 * res.floor_fraction:.1f}%{est}")))
        else:
            rows.append(("bandwidth floor", "- (device has no copy bandwidth)"))
        rows.append(("best schedule json", sched if len(sched) <= 200 else sched[:200] + "..."))
    else:
        rows.append(("best", "no successful trial"))
    counts = ", ".join(f"{k} {v}" for k, v in sorted(res.status_counts.items())) or "-"
    rows.append(("trials by status", counts))
    w = max(len(k) for k, _ in rows)
    lines += [f"  {k.ljust(w)}  {v}" for k, v in rows]
    return "\n".join(lines)


def format_best_table(df: Any) -> str:
    """``stitchtune show``: best row per workload, device and backend, as a text table."""
    if df is None or len(df) == 0:
        return "no successful trials in this database"
    cols = [c for c in ("graph_name", "workload_key", "device_key", "backend", "measured_us",
                        "schedule_key", "study", "trial_number") if c in df.columns]
    view = df[cols].copy()
    if "workload_key" in view.columns:
        view["workload_key"] = view["workload_key"].astype(str).str[:12]
    if "measured_us" in view.columns:  # one column per kind of time, named for it ("-": the other kind)
        est = (df["estimated"].fillna(False).astype(bool) if "estimated" in df.columns
               else view["measured_us"].map(lambda _: False))
        times = view.pop("measured_us").map(lambda t: f"{float(t):.3f}")
        at = cols.index("measured_us")
        for name, mask in (("estimated_us", est), ("measured_us", ~est)):
            if mask.any():
                view.insert(at, name, times.where(mask, "-"))
    return str(view.to_string(index=False))


def json_safe(row: TrialRecord | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A row with only JSON-serialisable values (timestamps as ISO strings)."""
    if row is None:
        return None
    plain = row.to_row() if isinstance(row, TrialRecord) else dict(row)
    out: dict[str, Any] = json.loads(json.dumps(plain, default=str))
    return out
