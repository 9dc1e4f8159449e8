"""Optuna plumbing for the search loop: storage, study, sampler, grid, and the liveness of workers.

Contract
--------
* :func:`make_storage(url, db_path)`: ``None`` -> a journal file ``<db>/optuna.journal``
  (``JournalFileBackend`` with the lock of :func:`journal_lock`; a torn last record is cut first by
  :func:`repair_journal_tail`, under that lock; a record damaged inside the file ->
  :class:`~stitchtune.errors.DatabaseError` saying what to do), else any SQLAlchemy URL
  (``sqlite:///...``, ``postgresql://...``), retried while workers starting together race on creating
  the schema. Every failure is a ``DatabaseError``;
  :func:`describe_storage` names the storage without its password.
* :func:`journal_lock(path)`: optuna's ``JournalFileSymlinkLock`` (Ctrl-C held while it is taken or held:
  :mod:`stitchtune.tune.journal_lock`) with a grace period of
  :func:`journal_lock_grace_s` seconds (``$STITCHTUNE_JOURNAL_LOCK_GRACE_S``, a whole number >= 3; default
  30, optuna's): a lock left by a process killed while it held it is broken after that long without a
  change of the journal (an append holds the lock for milliseconds). A bad value -> ``DatabaseError``.
* :func:`study_space_version(study, today)`: the space version the study was created in (user attr
  ``space_version``; none, and a trial drew ``min_blocks`` over version 5's choices: ``"5"``, studies recorded
  none before space version 6; none otherwise: ``today``), recorded where missing; one newer than ``today`` (a
  newer release's study in a shared storage) or not a whole number: ``DatabaseError``.
* :func:`default_study_name`: ``<graph name>-<workload key[:12]>-<device key>``, unsafe characters -> ``_``.
* :func:`make_sampler(name, seed, space)`: tpe, gp, cmaes, random, grid (a random sampler; the loop
  enqueues :func:`grid_points`, at most :data:`MAX_GRID`, shuffled by ``seed``). A missing optional
  package is a :class:`~stitchtune.errors.ToolchainError`; a space without a usable grid a
  :class:`~stitchtune.errors.ScheduleError`.
* Workers are ``"host:pid"`` strings (user attr ``worker``). :func:`_fail_stale` marks RUNNING trials of
  dead local workers (and trials never signed within ``_KEY_WAIT_S``) FAIL with user attr ``stale``.
* :mod:`stitchtune.tune.search` re-exports the public names; this module knows nothing of the loop.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import re
import socket
import time
import warnings
from collections.abc import Iterable
from typing import Any

import optuna
from optuna.trial import TrialState

from stitchtune.errors import DatabaseError, ScheduleError, StitchtuneError, ToolchainError
from stitchtune.tune.pipeline import device_key

log = logging.getLogger(__name__)

_KEY_WAIT_S = 15.0
#: the space version of a study that records none (:func:`study_space_version`): studies record theirs since
#: space version 6, so one without it was created in 5 or before (all of which drew as 5 does: stitch.json)
UNRECORDED_STUDY_VERSION = "5"

JOURNAL_LOCK_GRACE_ENV = "STITCHTUNE_JOURNAL_LOCK_GRACE_S"
DEFAULT_JOURNAL_LOCK_GRACE_S = 30  # optuna's default
_MIN_JOURNAL_LOCK_GRACE_S = 3      # optuna warns below this

__all__ = [
    "MAX_GRID",
    "default_study_name",
    "describe_storage",
    "enqueue_grid",
    "grid_points",
    "journal_lock",
    "journal_lock_grace_s",
    "make_sampler",
    "make_storage",
    "repair_journal_tail",
    "study_space_version",
]


# ---------------------------------------------------------------------------------------- optuna setup
def default_study_name(graph: Any, device: Any) -> str:
    """``<graph name>-<workload key[:12]>-<device key>`` with unsafe characters replaced by ``_``."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", str(graph.name))[:64] or "graph"
    return f"{name}-{graph.workload_key()[:12]}-{re.sub(r'[^A-Za-z0-9_.-]', '_', device_key(device))}"


def describe_storage(url: str | None, db_path: str) -> str:
    """Storage for humans, without any password."""
    if not url:
        return f"journal file {os.path.join(db_path, 'optuna.journal')}"
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


def journal_lock_grace_s() -> int:
    """Seconds without a change of the journal after which a held journal lock is broken: the whole
    number in ``$STITCHTUNE_JOURNAL_LOCK_GRACE_S`` (>= 3), else 30. Anything else -> ``DatabaseError``."""
    raw = os.environ.get(JOURNAL_LOCK_GRACE_ENV, "").strip()
    if not raw:
        return DEFAULT_JOURNAL_LOCK_GRACE_S
    try:
        grace = int(raw)
    except ValueError:
        grace = -1
    if grace < _MIN_JOURNAL_LOCK_GRACE_S:
        raise DatabaseError(f"${JOURNAL_LOCK_GRACE_ENV} must be a whole number of seconds >= "
                            f"{_MIN_JOURNAL_LOCK_GRACE_S} (got {raw[:40]!a})")
    return grace


def journal_lock(path: str) -> Any:
    """The lock every append to the journal ``path`` takes (optuna's ``JournalFileSymlinkLock`` with Ctrl-C
    held while it is taken or held: :class:`~stitchtune.tune.journal_lock.HeldInterruptLock`), with the grace
    period of :func:`journal_lock_grace_s`."""
    from stitchtune.tune.journal_lock import HeldInterruptLock

    return HeldInterruptLock(path, grace_period=journal_lock_grace_s())


def repair_journal_tail(path: str) -> int:
    """Cut a torn last record (a writer killed in mid-append, a full disk) off an optuna journal file.

    Without this, the next append would glue a complete record to the torn one and every later read of
    the study would fail. The check runs under the journal's own lock, so a record that a live worker
    is appending right now is never mistaken for a torn one. Returns the number of bytes removed.
    """
    try:
        size = os.path.getsize(path)
    except OSError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return 0
    lock = journal_lock(path)  # the lock JournalFileBackend takes for every append
    lock.acquire()
    try:
        with open(path, "r+b") as fh:
            data_end = fh.seek(0, os.SEEK_END)
            if data_end == 0:
                return 0
            fh.seek(data_end - 1)
            if fh.read(1) == b"\n":
                return 0
            keep = 0
            pos = data_end
            while pos > 0:  # find the last newline, reading backwards in blocks
                start = max(0, pos - 65536)
                fh.seek(start)
                block = fh.read(pos - start)
                nl = block.rfind(b"\n")
                if nl >= 0:
                    keep = start + nl + 1
                    break
                pos = start
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        lock.release()
    log.warning("optuna journal %s ended in a torn record (%d bytes, from a writer killed in mid-append); "
                "removed it", path, data_end - keep)
    return data_end - keep


def make_storage(url: str | None, db_path: str) -> Any:
    """Optuna storage: journal file under the database directory by default, else an RDB URL."""
    if not url:
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        path = os.path.join(db_path, "optuna.journal")
        try:
            os.makedirs(db_path, exist_ok=True)
            repair_journal_tail(path)
            return JournalStorage(JournalFileBackend(path, lock_obj=journal_lock(path)))
        except OSError as exc:
            raise DatabaseError(f"cannot use journal storage in {db_path!r}: {exc}") from exc
        except ValueError as exc:  # json.JSONDecodeError: a damaged record inside the journal
            raise DatabaseError(f"optuna journal {path!r} is damaged ({str(exc).splitlines()[0]}); the tuning "
                                f"database in {db_path!r} is intact: move the journal away and search again "
                                "(schedules measured before are reused from the database)") from exc
    if not re.match(r"^[a-z0-9+]+://", url):
        raise DatabaseError(f"--storage must be a database URL such as postgresql://... or sqlite:///... "
                            f"(got {describe_storage(url, db_path)!r})")
    if url.startswith(("postgresql://", "postgres://")) and importlib.util.find_spec("psycopg") is None \
            and importlib.util.find_spec("psycopg2") is not None:
        # SQLAlchemy >= 2.1 defaults postgresql:// to psycopg 3; use psycopg2 when only it is installed
        url = "postgresql+psycopg2://" + url.split("://", 1)[1]
    last: Exception | None = None
    for attempt in range(6):  # workers starting together race on creating the schema: retry
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
        except ImportError as exc:
            raise DatabaseError(f"--storage {describe_storage(url, db_path)}: missing driver ({exc}); for "
                                "PostgreSQL: pip install psycopg2-binary") from exc
        except Exception as exc:  # noqa: BLE001 - sqlalchemy/driver errors are the user's setup
            last = exc
            if "duplicate key" not in str(exc) and "already exists" not in str(exc):
                break
            time.sleep(0.1 + 0.2 * attempt)
    first = str(last).strip().splitlines()[0] if str(last).strip() else "the driver gave no reason"
    first = re.sub(r"^\([\w.]+\)\s*", "", first)  # sqlalchemy's "(sqlite3.OperationalError) " prefix
    raise DatabaseError(f"cannot open optuna storage {describe_storage(url, db_path)}: {first}") from last


MAX_GRID = 50_000


def grid_points(space: Any, seed: int | None) -> list[Any]:
    """Every legal point of ``space`` (``space.grid()``), shuffled by ``seed``, for ``--sampler grid``.

    Raises ScheduleError when the space offers no grid or has more than :data:`MAX_GRID` points
    (counted from ``space.domains`` before enumerating, when the space exposes them).
    """
    import random

    if not callable(getattr(space, "grid", None)):
        raise ScheduleError("--sampler grid: this search space offers no finite grid; use tpe or random")
    domains = getattr(space, "domains", None)
    plan = getattr(space, "plan", None)
    if isinstance(domains, dict) and plan is not None:
        bound = math.prod(len(v) for k, v in domains.items() if k not in ("scheme", "reuse"))
        bound *= len(domains.get("scheme", [1])) ** int(getattr(plan, "nstages", 0))
        bound *= len(domains.get("reuse", [1])) ** len(getattr(plan, "reuse_candidates", ()))
        if bound > MAX_GRID:
            raise ScheduleError(f"--sampler grid: the search space of this graph has up to {bound} points "
                                f"(limit {MAX_GRID}); use tpe, gp, cmaes or random")
    points = list(space.grid())
    if not points:
        raise ScheduleError("--sampler grid: the search space of this graph has no legal point")
    if len(points) > MAX_GRID:
        raise ScheduleError(f"--sampler grid: {len(points)} points (limit {MAX_GRID}); use tpe or random")
    random.Random(seed).shuffle(points)
    return points


def _drew_as_version_5(study: optuna.Study) -> bool:
    """Whether a trial of ``study`` drew a ``min_blocks`` parameter over version 5's choices (4 but not 3: space
    version 6 added 3; a block whose domain holds neither, e.g. 1024 threads' 0/1/2, draws alike in both)."""
    for t in study.get_trials(deepcopy=False):
        for name, d in t.distributions.items():
            choices = getattr(d, "choices", None)
            if (name == "min_blocks" or name.startswith("min_blocks_")) and choices is not None \
                    and 4 in choices and 3 not in choices:
                return True
    return False


def study_space_version(study: optuna.Study, today: str) -> str:
    """The space version ``study`` was created in (its user attr ``space_version``, set here where missing).
    A study without it whose trials drew ``min_blocks`` as version 5 did was created before studies recorded
    theirs (:data:`UNRECORDED_STUDY_VERSION`); any other draws ``today``'s: a new study, one whose trials drew
    nothing that differs between the versions (failed before drawing, or only a 1024-thread block's
    ``min_blocks``), and a study another worker is creating right now (it recorded ``today`` after this read the
    attrs, and queued or drew the heuristic as ``today``: calling it 5 would draw 0/1/2/4 beside its 0/1/2/3/4,
    which optuna refuses). A search draws with ``space.as_of(...)`` of it, so a study resumes with the choices
    it was created with."""
    v = study.user_attrs.get("space_version")
    if v is None:
        v = UNRECORDED_STUDY_VERSION if _drew_as_version_5(study) else today
        study.set_user_attr("space_version", v)
    v = str(v)
    if v != today and (not v.isdigit() or (today.isdigit() and int(v) > int(today))):   # a newer release's study
        what = f"space version {v[:20]!a}, newer than this stitchtune's {today}" if v.isdigit() else \
            f"an unreadable space version {v[:20]!a}"
        raise DatabaseError(f"optuna study {study.study_name!a} was created with {what}: resume it with the "
                            f"stitchtune that created it, or start another study (--study NAME)")
    return v


def enqueue_grid(study: optuna.Study, space: Any, grid: Iterable[Any], user_attrs: dict[str, Any] | None = None) -> None:
    """Enqueue every point of ``grid`` that ``study`` has not tried or queued yet: a point is tried when a
    trial holds its schedule key (and did not fail without a status: a stale or interrupted trial), queued
    when a waiting trial holds its parameters. ``user_attrs`` go with each enqueued trial (the heuristic:
    ``{"heuristic": True}``, enqueued this way on every start, so a resumed study measures today's)."""
    seen: set[Any] = set()
    for t in study.get_trials(deepcopy=False):
        k = t.user_attrs.get("schedule_key")
        if k is not None and (t.state != TrialState.FAIL or t.user_attrs.get("status")):
            seen.add(k)
        elif t.state == TrialState.WAITING:  # enqueued, not asked yet: its params are "fixed_params"
            fixed = t.params or t.system_attrs.get("fixed_params") or {}
            seen.add(("params", tuple(sorted((str(a), str(b)) for a, b in fixed.items()))))
    for s in grid:
        params = space.params_of(s)
        if s.key() in seen or ("params", tuple(sorted((str(a), str(b)) for a, b in params.items()))) in seen:
            continue
        study.enqueue_trial(params, user_attrs=user_attrs, skip_if_exists=False)


def make_sampler(name: str, seed: int | None, space: Any) -> optuna.samplers.BaseSampler:
    """An optuna sampler by name (``grid``: random sampler; the loop enqueues every grid point)."""
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True, multivariate=True, group=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        if importlib.util.find_spec("torch") is None:
            raise ToolchainError("--sampler gp needs PyTorch (optuna's GPSampler): pip install torch")
        return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False)
    if name == "cmaes":
        if importlib.util.find_spec("cmaes") is None:
            raise ToolchainError("--sampler cmaes needs the cmaes package: pip install cmaes")
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if name == "grid":  # the points themselves are enqueued by the loop (see grid_points)
        return optuna.samplers.RandomSampler(seed=seed)
    raise StitchtuneError(f"unknown sampler {name!r}")


def _open_study(name: str, storage: Any, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    last: Exception | None = None
    for attempt in range(5):  # concurrent first use of an RDB may race on schema creation
        try:
            return optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                       direction="minimize", load_if_exists=True)
        except Exception as exc:  # noqa: BLE001
            last = exc
            time.sleep(0.2 * (attempt + 1))
    raise DatabaseError(f"cannot create or load study {name!r}: {last}")


# ---------------------------------------------------------------------------------------- workers
def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _local_dead(worker: Any) -> bool:
    """True when ``worker`` ("host:pid") is a process of this host that no longer exists."""
    if not isinstance(worker, str) or ":" not in worker:
        return False
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _age_s(t: optuna.trial.FrozenTrial) -> float:
    import datetime as dt

    start = t.datetime_start
    if start is None:
        return 0.0
    now = dt.datetime.now(start.tzinfo) if start.tzinfo else dt.datetime.now()
    return max(0.0, (now - start).total_seconds())


def _fail_stale(study: optuna.Study, key_wait_s: float | None = None) -> int:
    """Mark abandoned RUNNING trials FAIL (user attr ``stale``); return how many.

    Abandoned: the trial's ``worker`` is a dead process of this host, or the trial has no ``worker``
    attr at all although it started more than ``key_wait_s`` ago (its worker died inside ``ask()``,
    before it could sign the trial; a live worker signs within milliseconds). Younger unsigned trials
    are waited for (at most ``key_wait_s``, only after a crash).
    """
    key_wait_s = _KEY_WAIT_S if key_wait_s is None else key_wait_s
    storage = study._storage  # optuna has no public API to close other processes' trials
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    unsigned = [t for t in running if "worker" not in t.user_attrs]
    if unsigned:
        wait = key_wait_s - min(_age_s(t) for t in unsigned)
        if wait > 0:
            log.info("waiting %.0f s to tell whether %d unsigned running trial(s) are abandoned", wait, len(unsigned))
            time.sleep(wait)
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        unsigned_ids = {t._trial_id for t in unsigned}
    else:
        unsigned_ids = set()
    n = 0
    for t in running:
        worker = t.user_attrs.get("worker")
        if _local_dead(worker) or (worker is None and t._trial_id in unsigned_ids):
            try:
                storage.set_trial_user_attr(t._trial_id, "stale", True)
                storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
                n += 1
            except Exception as exc:  # noqa: BLE001 - another worker may have finished it meanwhile
                log.debug("could not fail stale trial %d: %s", t.number, exc)
    if n:
        log.warning("marked %d trial(s) of dead workers as failed (stale)", n)
    return n
