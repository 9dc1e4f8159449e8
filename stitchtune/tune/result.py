"""What one search did: :class:`SearchResult`, made by :mod:`stitchtune.tune.search` and turned into text by
:mod:`stitchtune.tune.summary` (both import it from here, so neither imports the other)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from stitchtune.tune.records import TrialRecord

__all__ = ["SearchResult"]


@dataclass(frozen=True)
class SearchResult:
    """What a search did. ``best``/``heuristic`` are database rows (:class:`TrialRecord`) or None; ``rows_written`` is the
    number of rows this run appended to the database (also when ``stopped == "interrupted"``)."""

    study_name: str
    storage: str
    db_path: str
    backend: str
    backend_reason: str
    estimated: bool
    graph_name: str
    workload_key: str
    device_key: str
    trials_run: int
    status_counts: Mapping[str, int]
    reused: int
    best: TrialRecord | None
    heuristic: TrialRecord | None
    speedup: float | None
    floor_us: float | None
    floor_fraction: float | None
    stopped: str
    elapsed_s: float
    rows_written: int = 0
