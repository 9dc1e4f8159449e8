"""Tuning database: append-only parquet part files, read back as one pandas DataFrame.

Contract
--------
* A database is a directory. Each flushed batch of rows becomes one file
  ``part-<UTC time>-<pid>-<uuid>.parquet`` written atomically: the rows go to a hidden temporary file in
  the same directory (``.tmp-*``), which is flushed and fsync'ed, then ``os.replace``'d to its final name,
  and the directory is fsync'ed. A crash (even ``kill -9``) therefore leaves either the whole part or
  no visible part; temporary files are never read.
* Parts are never modified or deleted by stitchtune. Several processes (and several hosts on a shared
  file system) may append to one directory at the same time: file names never collide.
* :meth:`TuningDB.read` concatenates all readable parts. A part that cannot be read (corrupt,
  truncated, foreign) is skipped with a logged warning naming it; the rest stays readable.
* Rows are de-duplicated on read by :data:`DEDUP_COLUMNS` (workload, device, versions, schedule,
  backend, study, trial number): a replayed or doubly-flushed trial shows once (the earliest row).
* A record never matches a different workload or device: every lookup (:meth:`TuningDB.best`,
  :meth:`TuningDB.measured`) filters on both, and on the versions and backend its caller passes
  (compile-time selection, :mod:`stitchtune.deploy.selection`, always passes the versions).

The row schema is documented in ``docs/INTERFACES.md`` ("Tuning database row"); :data:`COLUMNS` lists the
fixed columns, and ``p_<param>`` columns hold the flattened schedule.
"""

from __future__ import annotations

import datetime as _dt
import glob
import logging
import os
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from stitchtune.errors import DatabaseError
from stitchtune.tune.records import COLUMNS, TrialRecord, TrialStatus

log = logging.getLogger(__name__)

#: The stored status strings (:class:`~stitchtune.tune.records.TrialStatus` values), in declaration order.
STATUSES: tuple[str, ...] = tuple(s.value for s in TrialStatus)

#: Columns that identify one trial record; duplicates on read are dropped (first kept).
DEDUP_COLUMNS: tuple[str, ...] = (
    "workload_key", "device_key", "space_version", "codegen_version", "schedule_key",
    "backend", "study", "trial_number",
)

PART_GLOB = "part-*.parquet"


def utc_now() -> pd.Timestamp:
    """The current time as a timezone-aware UTC pandas Timestamp (the ``timestamp`` column)."""
    return pd.Timestamp(_dt.datetime.now(_dt.UTC))


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _sort_and_dedup(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty:
        return df
    if "timestamp" in df.columns:
        df = df.sort_values("timestamp", kind="stable")
    keys = [c for c in DEDUP_COLUMNS if c in df.columns]
    if keys:
        # NaN/None compare equal in duplicated(), which is what we want for rows without a trial number.
        df = df.drop_duplicates(subset=keys, keep="first")
    return df.reset_index(drop=True)


class TuningDB:
    """One tuning database directory (created on first append).

    Args:
        path: the directory. It is created by :meth:`append`; reading a missing directory gives an
            empty DataFrame.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise DatabaseError(f"database path {self.path!r} exists and is not a directory")

    # ------------------------------------------------------------------ writing
    def append(self, rows: Iterable[TrialRecord | Mapping[str, Any]]) -> str | None:
        """Write ``rows`` as one new part file, atomically; return its path (None when no rows).

        A :class:`~stitchtune.tune.records.TrialRecord` is written as :meth:`~TrialRecord.to_row` gives it; a
        mapping as it is. Values must be scalars (str, int, float, bool, None, Timestamp); lists/dicts should
        be JSON strings already. A missing ``timestamp`` is filled with the current UTC time.
        """
        records = [r.to_row() if isinstance(r, TrialRecord) else dict(r) for r in rows]
        for r in records:
            if r.get("timestamp") is None:
                r.pop("timestamp", None)
        if not records:
            return None
        now = utc_now()
        for r in records:
            r.setdefault("timestamp", now)
        df = pd.DataFrame(records)
        ordered = [c for c in COLUMNS if c in df.columns] + sorted(c for c in df.columns if c not in COLUMNS)
        df = df[ordered]
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as exc:
            raise DatabaseError(f"cannot create database directory {self.path!r}: {exc}") from exc
        stamp = now.strftime("%Y%m%dT%H%M%S%fZ")
        name = f"part-{stamp}-{os.getpid()}-{uuid.uuid4().hex}.parquet"
        final = os.path.join(self.path, name)
        tmp = os.path.join(self.path, f".tmp-{name}")
        try:
            with open(tmp, "wb") as fh:
                df.to_parquet(fh, engine="pyarrow", index=False)
                fh.flush()
                os.fsync(fh.fileno())
            self._commit(tmp, final)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise DatabaseError(f"cannot write to database {self.path!r}: {exc}") from exc
        log.debug("wrote %d rows to %s", len(df), final)
        return final

    def _commit(self, tmp: str, final: str) -> None:
        """Make a fully written temporary part visible (the only step that publishes a part)."""
        os.replace(tmp, final)
        _fsync_dir(self.path)

    # ------------------------------------------------------------------ reading
    def parts(self) -> list[str]:
        """Paths of the visible part files, in name (= time) order."""
        return sorted(glob.glob(os.path.join(glob.escape(self.path), PART_GLOB)))

    def rows_appended_since(self, before: Iterable[str]) -> int:
        """Rows in the parts this process appended that are not among ``before`` (an earlier
        :meth:`parts`): what a command interrupted now has kept. Parts of other processes (their pid in the
        part name differs) are not counted; an unreadable part counts 0."""
        import pyarrow.parquet as pq

        seen, mine = set(before), f"-{os.getpid()}-"
        rows = 0
        for part in self.parts():
            if part in seen or mine not in os.path.basename(part):
                continue
            try:
                rows += pq.ParquetFile(part).metadata.num_rows
            except Exception as exc:  # noqa: BLE001 - unreadable parts are skipped, by contract
                log.warning("skipping unreadable database part %s: %s", part, exc)
        return rows

    def read(self) -> pd.DataFrame:
        """All rows of all readable parts as one DataFrame, de-duplicated (see module docstring)."""
        frames = read_parts(self.parts())
        if not frames:
            return pd.DataFrame(columns=list(COLUMNS))
        df = pd.concat(frames, ignore_index=True, sort=False)
        return _sort_and_dedup(df)

    # ------------------------------------------------------------------ queries
    @staticmethod
    def _match(df: pd.DataFrame, **eq: Any) -> pd.DataFrame:
        if df.empty:
            return df
        mask = pd.Series(True, index=df.index)
        for col, val in eq.items():
            if val is None:
                continue
            if col not in df.columns:
                return df.iloc[0:0]
            mask &= df[col] == val
        return df[mask]

    def best(self, workload_key: str, device_key: str, space_version: str | None = None,
             codegen_version: str | None = None, backend: str | None = None,
             df: pd.DataFrame | None = None) -> TrialRecord | None:
        """The fastest ``ok`` row for this workload and device (and versions/backend when given).

        Time is ``measured_us`` (for the emulate backend that is the predicted time, marked
        ``estimated``). A cuda row is preferred to an estimated one when ``backend`` is None.
        Returns None when there is no such row.
        """
        df = self.read() if df is None else df
        m = self._match(df, workload_key=workload_key, device_key=device_key,
                        space_version=space_version, codegen_version=codegen_version, backend=backend)
        if m.empty:
            return None
        m = m[(m["status"] == TrialStatus.OK.value) & m["measured_us"].notna()]
        if m.empty:
            return None
        if backend is None and "estimated" in m.columns and (~m["estimated"].astype(bool)).any():
            m = m[~m["estimated"].astype(bool)]
        return TrialRecord.from_row(row_dict(m.loc[m["measured_us"].astype(float).idxmin()]))

    def measured(self, workload_key: str, device_key: str, space_version: str, codegen_version: str,
                 backend: str, df: pd.DataFrame | None = None) -> dict[str, TrialRecord]:
        """Schedule key -> the row that settles it, for resume and reuse.

        Only rows of exactly this workload, device, versions and backend count. Every status is
        final (a timeout or compile error is not retried). Per schedule the original measurement is
        preferred to a row that was itself reused, then an ``ok`` row, then the earliest.
        """
        df = self.read() if df is None else df
        m = self._match(df, workload_key=workload_key, device_key=device_key, space_version=space_version,
                        codegen_version=codegen_version, backend=backend)
        if m.empty:
            return {}
        m = m.assign(
            _reused=m["reused"].fillna(False).astype(bool) if "reused" in m.columns else False,
            _notok=m["status"] != TrialStatus.OK.value,
        )
        sort_cols = ["_reused", "_notok"] + (["timestamp"] if "timestamp" in m.columns else [])
        m = m.sort_values(sort_cols, kind="stable").drop_duplicates("schedule_key", keep="first")
        return {str(r["schedule_key"]): TrialRecord.from_row(row_dict(r.drop(labels=["_reused", "_notok"])))
                for _, r in m.iterrows()}

    def best_per_workload(self, df: pd.DataFrame | None = None) -> pd.DataFrame:
        """The best ``ok`` row per (workload, device, backend): one line per tuned workload.

        Rows of an older database may lack any column but ``status`` (:class:`TrialRecord`'s contract): a
        missing key column groups as one unknown value, a missing time leaves nothing to rank. Without
        ``status``, :class:`DatabaseError` (one line: the folder is not a tuning database this code reads)."""
        df = self.read() if df is None else df
        if df.empty:
            return df
        if "status" not in df.columns:
            raise DatabaseError(f"tuning database {ascii(self.path)}: its rows have no 'status' column "
                                "(not a stitchtune tuning database, or one this version cannot read)")
        if "measured_us" not in df.columns:
            return df.iloc[0:0]
        keys = ["workload_key", "device_key", "backend"]
        ok = df[(df["status"] == TrialStatus.OK.value) & df["measured_us"].notna()].copy()
        if ok.empty:
            return ok
        for col in (*keys, "graph_name"):
            if col not in ok.columns:
                ok[col] = None
        ok["measured_us"] = pd.to_numeric(ok["measured_us"], errors="coerce")
        ok = ok[ok["measured_us"].notna()]
        if ok.empty:
            return ok
        idx = ok.groupby(keys, dropna=False)["measured_us"].idxmin()
        return ok.loc[idx.values].sort_values(["graph_name", "device_key", "backend"]).reset_index(drop=True)


def read_parts(parts: Iterable[str]) -> list[pd.DataFrame]:
    """The rows of each part file in ``parts`` that has any, in order. An unreadable part (truncated,
    foreign) is skipped with a logged warning naming it, by the database's contract."""
    frames = []
    for part in parts:
        try:
            df = pd.read_parquet(part, engine="pyarrow")
        except Exception as exc:  # noqa: BLE001 - any unreadable part is skipped, by contract
            log.warning("skipping unreadable database part %s: %s", part, exc)
            continue
        if not df.empty:
            frames.append(df)
    return frames


def row_dict(row: pd.Series) -> dict[str, Any]:
    """A database row as plain Python values: missing values (NaN, NA, NaT) as None, numpy scalars
    unwrapped; lists, dicts, strings and timestamps as they are."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if not isinstance(v, (list, dict)) and v is not None:
            try:
                if pd.isna(v):
                    v = None
            except (TypeError, ValueError):
                pass
        if v is not None and not isinstance(v, (str, bytes, pd.Timestamp)) and hasattr(v, "item"):
            try:
                v = v.item()  # numpy scalar -> Python scalar
            except (TypeError, ValueError):
                pass
        out[str(k)] = v
    return out


def read_db(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a tuning database directory as one DataFrame (for notebooks)."""
    return TuningDB(path).read()
