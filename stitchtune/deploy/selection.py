"""Compile-time schedule selection: which schedule to build for a graph on a device.

:func:`choose_schedule` is the only function of stitchtune that picks a schedule from a tuning
database: ``stitchtune.compile``, ``stitchtune run``, the PyTorch entry point and ``stitchtune bench``
all ask it. Every schedule it returns was re-validated against today's space, lowering and the cost
model's hard limits, and ``Choice.source`` / ``Choice.reason`` say which rule chose it.

Contract of :func:`choose_schedule(graph, db_path, device)` -> :class:`Choice`:

1. ``tuned``: the fastest ``ok`` record of the tuning database with the same workload key, device key
   (``Device.key``), search-space version (``search_spaces/stitch.json``'s ``version``, or one of its
   ``compatible_versions``: earlier versions whose schedules are re-validated in today's space) and code
   generator version (``lower.entry.CODEGEN_VERSION``, or one of ``COMPATIBLE_CODEGEN_VERSIONS``:
   earlier kernels for the same schedule, re-validated, ranked after every record of today's version,
   and the reason says that the record's time is the earlier kernel's). Measured GPU records
   (``estimated`` false) are preferred; estimated (emulated, cost-model time) records are used only
   when no measured one exists, and the reason says so.
2. ``nearest-shape``: otherwise a record of the same structure key (same ops and dtypes, other
   shapes) on the same device and versions. The shape distance between two workloads is
   ``sum over the tensors both name, over their dims, of |log2(a / b)|`` (0 = same shapes; doubling
   one dim costs 1; tensors of different rank make the record unusable). Candidates are tried in
   order of distance (then measured time); each is re-validated for the new shapes: the space's
   legality rules (``SearchSpace.violations``), lowering, and the cost model's hard limits
   (``cost.predict(...).prune_reason``). The first that passes is chosen.
3. ``heuristic``: otherwise the heuristic schedule (:func:`heuristic_schedule`).

``deterministic=True`` (``stitchtune compile --deterministic``): a record whose schedule is not bitwise
reproducible (``Schedule.deterministic`` false: float atomics) is passed over in rules 1 and 2, with
the reason; the heuristic schedule is always deterministic.

A record never matches another device or another version: rows are filtered on both before anything
else. A fallback (2 or 3) is logged as a warning once per (workload, device, source) in a process,
saying why; an exact hit is logged at info level. Inside :func:`collecting_fallbacks` (the torch
backend, per compiled graph) those first-time warnings are collected instead, for one summary line
(:func:`fallback_summary`).

Lookup cost: only the needed columns of the ``ok`` rows of this device and these versions are read
(pyarrow dataset with a filter), and the result is cached per database directory until a part file
is added or changed; 100,000 rows take well under a second (``scripts/bench_lookup.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import random
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from stitchtune.deploy.shape_distance import graph_shapes, parse_shapes, shape_distance
from stitchtune.deploy.stale_records import stale_note
from stitchtune.errors import ScheduleError

if TYPE_CHECKING:
    from stitchtune.graph.parse import Graph
    from stitchtune.hardware.device import Device
    from stitchtune.ir.kir import Program
    from stitchtune.plan.planner import StitchPlan
    from stitchtune.space import Schedule, SearchSpace

log = logging.getLogger(__name__)

#: Where a schedule comes from (``given``: passed by the caller of ``deploy.compiled.compile``, never chosen here).
SOURCES = ("tuned", "nearest-shape", "heuristic", "given")

#: Columns :func:`load_candidates` reads (a part without one of them reads it as null).
LOOKUP_COLUMNS: tuple[str, ...] = (
    "workload_key", "structure_key", "graph_name", "shapes", "device_key", "backend", "estimated",
    "space_version", "codegen_version", "schedule_json", "schedule_key", "status", "measured_us", "bucket",
)

#: At most this many schedules are lowered and re-validated per lookup (nearest-shape and tuned).
MAX_TRIES = 24

_cache_lock = threading.Lock()
_cache: dict[tuple[str, str, tuple[str, ...], tuple[str, ...]], tuple[tuple[Any, ...], pd.DataFrame]] = {}
_warned: set[tuple[str, str, str]] = set()
#: inside :func:`collecting_fallbacks`: where first-time fallback notes go instead of one warning each
_collector: contextvars.ContextVar[list[tuple[str, str, str]] | None] = contextvars.ContextVar(
    "stitchtune_fallback_collector", default=None)


@dataclass(frozen=True)
class Choice:
    """The schedule chosen for one graph on one device, and why.

    ``source``: ``tuned`` | ``nearest-shape`` | ``heuristic`` (``given`` in ``deploy.compiled.compile``). ``record``: the database row it came
    from (the :data:`LOOKUP_COLUMNS` of it, ``estimated`` resolved to a bool (a missing value means
    ``backend != "cuda"``), plus ``distance`` for nearest-shape), None for the heuristic. ``reason``: one human-readable sentence. ``program``: the lowered
    :class:`~stitchtune.ir.kir.Program` of ``schedule`` for this graph and device (lowering already
    happened during validation; callers may reuse it).
    """

    schedule: Schedule
    source: str
    record: dict[str, Any] | None
    reason: str
    program: Program | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"unknown choice source {self.source!r}")

    @property
    def measured(self) -> bool:
        """True when the schedule is a tuned record of this very workload whose time was measured on
        a GPU (not estimated by the emulator's cost model)."""
        return self.source == "tuned" and self.record is not None and self.record.get("estimated") is False


# ---------------------------------------------------------------------------- the heuristic
def heuristic_schedule(plan: StitchPlan, device: Device, space: SearchSpace) -> Schedule:
    """:func:`stitchtune.cost.heuristic.heuristic_schedule` (the AStitch default); should it ever be
    illegal for ``space``, the first legal point drawn with ``random.Random(0)`` (logged)."""
    from stitchtune.cost.heuristic import heuristic_schedule as astitch_default

    s = astitch_default(plan, device, space)
    bad = space.violations(s)
    if not bad:
        return s
    log.warning("the heuristic schedule is illegal for this graph (%s); using a sampled one", "; ".join(bad))
    return space.sample(random.Random(0))


# ---------------------------------------------------------------------------- reading the database
def _part_signature(parts: Iterable[str]) -> tuple[Any, ...]:
    sig = []
    for p in parts:
        try:
            st = os.stat(p)
        except OSError:
            continue
        sig.append((os.path.basename(p), st.st_size, st.st_mtime_ns))
    return tuple(sig)


def _arrow_schema() -> Any:
    import pyarrow as pa

    types = {"estimated": pa.bool_(), "measured_us": pa.float64()}
    return pa.schema([(c, types.get(c, pa.string())) for c in LOOKUP_COLUMNS])


def _read_filtered(parts: list[str], device_key: str, space_versions: tuple[str, ...],
                   codegen_versions: tuple[str, ...]) -> pd.DataFrame:
    """The ``ok`` rows with a time of this device, one of ``space_versions`` and one of
    ``codegen_versions``, :data:`LOOKUP_COLUMNS` only."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    flt = ((pc.field("status") == "ok") & (pc.field("device_key") == device_key)
           & pc.field("space_version").isin(list(space_versions)) & pc.field("codegen_version").isin(list(codegen_versions))
           & pc.field("measured_us").is_valid())
    try:
        table = ds.dataset(parts, schema=_arrow_schema(), format="parquet").to_table(filter=flt)
        return table.to_pandas()
    except Exception as exc:  # noqa: BLE001 - a part the fast path cannot read: fall back per part
        log.debug("fast database scan failed (%s); reading part by part", exc)
    from stitchtune.tune.database import read_parts

    frames = []
    for df in read_parts(parts):
        df = df.reindex(columns=list(LOOKUP_COLUMNS))
        m = ((df["status"] == "ok") & (df["device_key"] == device_key)
             & df["space_version"].astype("string").isin(list(space_versions))
             & df["codegen_version"].astype("string").isin(list(codegen_versions)) & df["measured_us"].notna())
        frames.append(df[m.fillna(False).astype(bool)])
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=list(LOOKUP_COLUMNS))
    return pd.concat(frames, ignore_index=True)


def load_candidates(db_path: str | os.PathLike[str], device_key: str, space_version: str | Sequence[str],
                    codegen_version: str | Sequence[str]) -> pd.DataFrame:
    """Usable rows of database ``db_path`` for one device and versions (cached until the parts change).
    ``space_version`` / ``codegen_version``: one version, or several (today's and the compatible earlier ones).

    A missing directory is an empty database. The returned frame must not be modified.
    """
    from stitchtune.tune.database import TuningDB

    path = os.path.abspath(os.fspath(db_path))
    if not os.path.isdir(path):
        return _empty()
    parts = TuningDB(path).parts()
    sig = _part_signature(parts)
    versions = (str(space_version),) if isinstance(space_version, str) else tuple(str(v) for v in space_version)
    cgs = (str(codegen_version),) if isinstance(codegen_version, str) else tuple(str(v) for v in codegen_version)
    key = (path, device_key, versions, cgs)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None and hit[0] == sig:
        return hit[1]
    if not parts:
        return _empty()
    df = _read_filtered(parts, device_key, versions, cgs)
    df = df.assign(measured_us=pd.to_numeric(df["measured_us"], errors="coerce"),
                   _est=_estimated(df)).reset_index(drop=True)
    with _cache_lock:
        _cache[key] = (sig, df)
    return df


def _empty() -> pd.DataFrame:
    return pd.DataFrame(columns=[*LOOKUP_COLUMNS, "_est"])


def clear_cache() -> None:
    """Forget cached database reads and which fallbacks were already reported (for tests)."""
    with _cache_lock:
        _cache.clear()
        _warned.clear()


def _estimated(df: pd.DataFrame) -> pd.Series:
    """Per row: is the time estimated? (``estimated`` column; missing -> backend != cuda)."""
    if df.empty:
        return pd.Series([], dtype=bool, index=df.index)
    est = df["estimated"].astype("object")
    by_backend = df["backend"].astype("object") != "cuda"
    return est.where(est.notna(), by_backend).astype(bool)


# ---------------------------------------------------------------------------- choosing
def _record(row: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    from stitchtune.tune.database import row_dict

    out = row_dict(pd.Series({k: row.get(k) for k in LOOKUP_COLUMNS}))
    out.update(extra)
    return out


def _validate(graph: Graph, plan: StitchPlan, device: Device, space: SearchSpace,
              schedule_json: str) -> tuple[Schedule | None, Program | None, str | None]:
    """(schedule, program, None) when the record's schedule is legal for ``graph`` on ``device``,
    else (schedule|None, None, why not)."""
    from stitchtune.cost.model import predict
    from stitchtune.lower.entry import lower
    from stitchtune.space import Schedule

    try:
        s = Schedule.from_json(schedule_json)
    except ScheduleError as exc:
        return None, None, str(exc)
    bad = space.violations(s)
    if bad:
        return s, None, "; ".join(bad)
    try:
        program = lower(graph, plan, s, device, space)
    except ScheduleError as exc:
        return s, None, str(exc)
    reason = predict(program.profile, device).prune_reason
    if reason:
        return s, None, f"cost model: {reason}"
    return s, program, None


def _warn_once(graph: Graph, device_key: str, source: str, msg: str, why: str = "") -> None:
    key = (graph.workload_key(), device_key, source)
    with _cache_lock:
        first = key not in _warned
        _warned.add(key)
    notes = _collector.get()
    if first and notes is not None:
        notes.append((graph.name, source, why))
        log.debug("%s", msg)
    elif first:
        log.warning("%s", msg)
    else:
        log.debug("%s", msg)


@contextlib.contextmanager
def collecting_fallbacks() -> Iterator[list[tuple[str, str, str]]]:
    """Within the block (this thread / context), a fallback that would be warned about for the first
    time is logged at debug level and appended to the yielded list as ``(graph name, source, why)``
    instead, so that the caller can say it once for many graphs (:func:`fallback_summary`)."""
    notes: list[tuple[str, str, str]] = []
    token = _collector.set(notes)
    try:
        yield notes
    finally:
        _collector.reset(token)


def fallback_summary(notes: Sequence[tuple[str, str, str]]) -> str:
    """One sentence for the notes of :func:`collecting_fallbacks`: per source, the graphs and the
    distinct reasons, e.g. ``2 region(s) without a tuned schedule: heuristic for region_add,
    region_gelu (no database at 'tuning-db')``."""
    parts = []
    for source in ("nearest-shape", "heuristic"):
        names = [n for n, s, _ in notes if s == source]
        if names:
            whys = list(dict.fromkeys(w for _, s, w in notes if s == source and w))
            parts.append(f"{source} for {', '.join(names)}" + (f" ({'; '.join(whys)})" if whys else ""))
    return f"{len(notes)} region(s) without a tuned schedule: {'; '.join(parts)}"


def _sorted_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Today's code generator before earlier ones (``_old``), measured before estimated, then fastest
    first; one row per schedule."""
    return df.sort_values(["_old", "_est", "measured_us"], kind="stable").drop_duplicates("schedule_key")


def _old_kernel(row: Mapping[str, Any]) -> str:
    """The reason's note for a record of an earlier code generator version ('' for today's)."""
    from stitchtune.lower.entry import CODEGEN_VERSION

    cv = str(row.get("codegen_version"))
    if cv == str(CODEGEN_VERSION):
        return ""
    return (f" (recorded with code generator version {cv}, today's is {CODEGEN_VERSION}: that time is the "
            "earlier kernel's, the schedule re-validated for today's)")


@dataclass
class _Lookup:
    """One :func:`choose_schedule` call: what it matches on, and the budget and rejections it shares
    between the rules."""

    graph: Graph
    plan: StitchPlan
    device: Device
    space: SearchSpace
    dkey: str
    where: str
    deterministic: bool = False
    tries: int = 0
    rejected: list[str] = field(default_factory=list)

    def validate(self, row: Mapping[str, Any]) -> tuple[Schedule | None, Program | None, str | None] | None:
        """:func:`_validate` of the row's schedule, or None once :data:`MAX_TRIES` were spent."""
        if self.tries >= MAX_TRIES:
            return None
        self.tries += 1
        s, program, why = _validate(self.graph, self.plan, self.device, self.space, str(row["schedule_json"]))
        if why is None and s is not None and self.deterministic and not s.deterministic:
            return s, None, "not bitwise reproducible (float atomics) and a deterministic schedule was asked for"
        return s, program, why


def _kind(est: bool) -> str:
    """How a record's time was obtained, as the reasons word it."""
    return "estimated (emulated, cost-model time)" if est else "measured"


def _choose_tuned(q: _Lookup, exact: pd.DataFrame) -> Choice | None:
    """Rule 1: the best re-validated record of this very workload (rejections go to ``q.rejected``, and are
    one warning however many records they are: an older database may hold dozens)."""
    illegal: list[str] = []
    try:
        for _, row in _sorted_rows(exact).iterrows():
            checked = q.validate(row)
            if checked is None:
                break
            s, program, why = checked
            if why is None and s is not None:   # (a schedule whenever there is no reason against it)
                est = bool(row["_est"])
                reason = (f"tuned record {row['schedule_key']} of this workload on {q.where}: "
                          f"{_kind(est)} {float(row['measured_us']):.2f} us{_old_kernel(row)}")
                log.info("%s: %s", q.graph.name, reason)
                return Choice(s, "tuned", _record(row, estimated=est), reason, program)
            illegal.append(f"{row['schedule_key']} no longer legal: {why}")
            log.debug("%s: tuned record %s", q.graph.name, illegal[-1])
        return None
    finally:
        if illegal:
            more = f" (and {len(illegal) - 1} more tuned record(s) no longer legal)" if len(illegal) > 1 else ""
            q.rejected.append(f"tuned record {illegal[0]}{more}")
            log.warning("%s: %s", q.graph.name, q.rejected[-1])


def _by_distance(graph: Graph, near: pd.DataFrame) -> pd.DataFrame:
    """``near`` with a ``_dist`` column, unusable shapes dropped, nearest (then measured, fastest) first,
    one row per schedule."""
    mine = graph_shapes(graph)
    dist: dict[str, float] = {}
    for w, text in near.drop_duplicates("workload_key")[["workload_key", "shapes"]].itertuples(index=False):
        theirs = parse_shapes(text)
        dist[str(w)] = shape_distance(mine, theirs) if theirs is not None else math.inf
    near = near.assign(_dist=near["workload_key"].map(dist).astype(float))
    near = near[near["_dist"] < math.inf]
    return near.sort_values(["_dist", "_old", "_est", "measured_us"], kind="stable").drop_duplicates("schedule_key")


def _choose_nearest(q: _Lookup, near: pd.DataFrame, wk: str) -> Choice | None:
    """Rule 2: the nearest-shape record of the same structure that re-validates for these shapes."""
    if near.empty:
        return None
    n_checked = 0
    for _, row in _by_distance(q.graph, near).iterrows():
        checked = q.validate(row)
        if checked is None:
            break
        n_checked += 1
        s, program, why = checked
        if why is not None or s is None:
            log.debug("%s: nearest-shape candidate %s rejected: %s", q.graph.name, row["schedule_key"], why)
            continue
        d = float(row["_dist"])
        reason = (f"no usable tuned record of workload {wk[:12]} on {q.where}; using {_kind(bool(row['_est']))} "
                  f"record {row['schedule_key']} of {row['graph_name']} at other shapes {row['shapes']} "
                  f"(shape distance {d:.2f}), re-validated for these shapes{_old_kernel(row)}")
        _warn_once(q.graph, q.dkey, "nearest-shape", f"{q.graph.name}: {reason}", "records at other shapes")
        return Choice(s, "nearest-shape", _record(row, distance=d, estimated=bool(row["_est"])), reason,
                      program)
    if n_checked:
        q.rejected.append(f"{n_checked} record(s) of the same structure at other shapes are illegal "
                          "for these shapes")
    return None


def _choose_heuristic(q: _Lookup, db_path: str | os.PathLike[str] | None, wk: str,
                      versions: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())) -> Choice:
    """Rule 3: the heuristic schedule, lowered; the reason says why no record was used (records of this
    workload of other ``versions`` (space, codegen: today's first) than these: that the database is out of date)."""
    from stitchtune.lower.entry import lower

    s = heuristic_schedule(q.plan, q.device, q.space)
    if q.deterministic and not s.deterministic:  # never expected: the heuristic combines in order
        raise ScheduleError("the heuristic schedule is not bitwise reproducible")
    program = lower(q.graph, q.plan, s, q.device, q.space)
    if q.rejected:
        why = "; ".join(q.rejected)
    elif db_path is None:
        why = "no database given"
    elif not os.path.isdir(db_path):
        why = f"no database at {os.fspath(db_path)!a}"
    else:
        why = ((stale_note(db_path, wk, q.dkey, *versions) if versions[0] else "")
               or f"no ok record of this workload or its structure in {os.fspath(db_path)!a}")
    reason = f"heuristic schedule for workload {wk[:12]} on {q.where} ({why})"
    _warn_once(q.graph, q.dkey, "heuristic", f"{q.graph.name}: {reason}", why)
    return Choice(s, "heuristic", None, reason, program)


def choose_schedule(graph: Graph, db_path: str | os.PathLike[str] | None, device: Device, *,
                    plan: StitchPlan | None = None, space: SearchSpace | None = None, deterministic: bool = False, bucket: str | None = None) -> Choice:
    """The schedule to build for ``graph`` on ``device`` from the database ``db_path`` (see module
    docstring). ``db_path=None`` or a missing directory: no records (heuristic). ``plan``/``space``:
    the graph's plan and search space when the caller has them already. ``deterministic``: only
    bitwise-reproducible schedules (see the module docstring). ``bucket`` (a dynamic graph's bucket label,
    ``graph`` its representative): the bucket's own records of this workload (generic kernels, the
    ``bucket`` column) come first, then the rules above."""
    from stitchtune.lower.entry import CODEGEN_VERSION, COMPATIBLE_CODEGEN_VERSIONS
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan

    plan = plan if plan is not None else make_plan(graph)
    space = space if space is not None else legal_space(graph, plan, device)
    dkey = str(device.key)
    sv, cv = str(space.version), str(CODEGEN_VERSION)
    # records of the compatible earlier space versions too: each is re-validated in today's space
    svs = (sv, *(str(v) for v in getattr(space, "compatible_versions", ())))
    wk, sk = graph.workload_key(), graph.structure_key()
    cvs = (cv, *(str(v) for v in COMPATIBLE_CODEGEN_VERSIONS))
    where = f"device {dkey}, space version {'/'.join(svs)}, codegen version {'/'.join(cvs)}"
    df = load_candidates(db_path, dkey, svs, cvs) if db_path is not None else _empty()
    df = df.assign(_old=df["codegen_version"].astype("object") != cv)  # earlier kernels rank after today's
    q = _Lookup(graph, plan, device, space, dkey, where, deterministic)

    # 0. a bucket's generic kernels
    choice = None
    if bucket:
        choice = _choose_tuned(q, df[(df["workload_key"] == wk) & (df["bucket"].fillna("") == bucket)])
    # 1. exact workload
    if choice is None:
        choice = _choose_tuned(q, df[df["workload_key"] == wk])
    # 2. same structure, other shapes
    if choice is None:
        choice = _choose_nearest(q, df[(df["structure_key"] == sk) & (df["workload_key"] != wk)], wk)
    # 3. heuristic
    return choice if choice is not None else _choose_heuristic(q, db_path, wk, (svs, cvs))
