"""Records a selection cannot use because another space or code generator version wrote them.

:func:`stale_note` is asked only on the heuristic fallback (rule 3 of
:mod:`stitchtune.deploy.selection`): when the database holds ``ok`` records of the workload on the
device, but every one of another search-space or code-generator version than today's (and its
compatible ones), the heuristic's reason says so, with the versions and what to do (re-tune), instead
of "no ok record". The read filters on workload and device and reads the two version columns only.
:func:`database_note` says the same of a whole database for ``stitchtune show`` (one warning line).
"""

from __future__ import annotations

import logging
import os

import pandas as pd

log = logging.getLogger(__name__)


def stale_note(db_path: str | os.PathLike[str], workload_key: str, device_key: str,
               space_versions: tuple[str, ...], codegen_versions: tuple[str, ...]) -> str:
    """One sentence naming the versions of this workload's ``ok`` records on ``device_key`` in
    ``db_path`` that are not among ``space_versions`` x ``codegen_versions`` (today's first), and to
    re-tune; '' when there are none, or the database cannot be read here (never raises)."""
    try:
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        from stitchtune.tune.database import TuningDB

        parts = TuningDB(db_path).parts()
        if not parts:
            return ""
        flt = ((pc.field("status") == "ok") & (pc.field("workload_key") == workload_key)
               & (pc.field("device_key") == device_key))
        table = ds.dataset(parts, format="parquet").to_table(
            columns=["space_version", "codegen_version"], filter=flt)
        pairs = {(str(s), str(c)) for s, c in zip(table.column("space_version").to_pylist(),
                                                  table.column("codegen_version").to_pylist())}
    except Exception as exc:  # noqa: BLE001 - a note only: an unreadable part leaves it out
        log.debug("stale record check of %s failed: %s", os.fspath(db_path), exc)
        return ""
    stale = sorted(p for p in pairs if p[0] not in space_versions or p[1] not in codegen_versions)
    if not stale:
        return ""
    had = ", ".join(f"space version {s} / codegen version {c}" for s, c in stale)
    return (f"the database is out of date for this workload: its records were tuned with {had}, "
            f"today's is space version {space_versions[0]} / codegen version {codegen_versions[0]}; "
            f"re-tune it (stitchtune search / stitchtune tune) to use tuned schedules again")


def today_versions() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Today's (space versions, codegen versions) a selection reads: the space file's ``version`` and
    its ``compatible_versions``, ``CODEGEN_VERSION`` and ``COMPATIBLE_CODEGEN_VERSIONS`` (today's first)."""
    from stitchtune.lower.entry import CODEGEN_VERSION, COMPATIBLE_CODEGEN_VERSIONS
    from stitchtune.space.space_file import load_space_file

    data = load_space_file()
    svs = (str(data["version"]), *(str(v) for v in data.get("compatible_versions", ())))
    return svs, (str(CODEGEN_VERSION), *(str(v) for v in COMPATIBLE_CODEGEN_VERSIONS))


def database_note(df: pd.DataFrame) -> str:
    """For ``stitchtune show``: one sentence when ``ok`` rows of ``df`` (a database's trial rows) were
    written by a space or codegen version that compile/run no longer read (see :func:`today_versions`),
    with those versions, today's, and to re-tune; '' when every ok row is of a version read today."""
    if df.empty or "status" not in df.columns:
        return ""
    svs, cvs = today_versions()
    ok = df[df["status"] == "ok"]
    sv = ok.get("space_version", pd.Series([None] * len(ok), index=ok.index)).astype("string").fillna("?")
    cv = ok.get("codegen_version", pd.Series([None] * len(ok), index=ok.index)).astype("string").fillna("?")
    bad = ~sv.isin(list(svs)) | ~cv.isin(list(cvs))
    if not bad.any():
        return ""
    had = ", ".join(f"space version {s} / codegen version {c}"
                    for s, c in sorted(set(zip(sv[bad].tolist(), cv[bad].tolist()))))
    return (f"{int(bad.sum())} of {len(ok)} ok rows are out of date (tuned with {had}; today's is space "
            f"version {svs[0]} / codegen version {cvs[0]}): compile and run ignore them and use the heuristic "
            f"for their workloads; re-tune (stitchtune search / stitchtune tune) to use tuned schedules again")
