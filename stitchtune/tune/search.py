"""The search loop: optuna ask/tell over stitch schedules, results in the tuning database.

Contract of :func:`run_search`
------------------------------
* The study lives in optuna storage: by default a journal file ``<db>/optuna.journal``
  (``JournalFileBackend``); ``storage`` may be any SQLAlchemy URL (``sqlite:///...``,
  ``postgresql://...``) so several processes on several hosts share one study. The default study name
  is ``<graph name>-<workload key[:12]>-<device key>``.
* Today's heuristic schedule is enqueued unless tried or queued (trial 0 of a new study; a resumed one's next).
* A study draws as the space version it was created in (``SearchSpace.as_of``, :func:`study_space_version`).
* Trials are asked in batches of ``jobs``; the batch is evaluated by :func:`stitchtune.tune.pipeline.evaluate`
  (builds in parallel, runs one at a time) and its rows are appended to the database as one part
  *before* the trials are told, so a kill loses at most the batch in flight.
* Objective: the measured median in µs (with the emulate backend: the cost model's prediction,
  flagged ``estimated``). ``pruned`` trials are told ``TrialState.PRUNED`` with user attr
  ``prune_reason``; every other failure (compile_error, launch_error, timeout, wrong_result) is told
  ``TrialState.FAIL`` with user attrs ``status`` and ``error``. (FAIL rather than a penalty value:
  samplers then ignore the point instead of being skewed by an arbitrary number; the database keeps
  the failure.)
* Reuse, never re-measure: a schedule that already has a row in the database for the same workload,
  device, space version, codegen version and backend is told from that row (``reused=True``). Within
  a shared study, a trial whose schedule is also held by a lower-numbered trial (of any worker) waits
  for that trial and copies its outcome: only the lowest-numbered trial of a schedule measures it.
  Each trial's schedule key is written to its user attrs right after it is asked, which makes this
  rule safe without locks. A trial of a dead local worker is marked FAIL (``stale``) and no longer
  waited for; a RUNNING trial still without a key after ``_KEY_WAIT_S`` (its worker died inside
  ``ask()``) is not waited for either.
* Stops after ``trials`` trials of this run, ``timeout_s`` seconds, ``early_stop`` trials in a row
  without improvement, an exhausted grid, or Ctrl-C (the trials in flight are told FAIL with user
  attr ``interrupted``; everything finished before is already in the database: ``rows_written`` of the
  result counts the rows this run appended, the line the CLI prints).

:class:`SearchConfig`, :class:`Components` (:func:`default_components`, :class:`SkipBuilder`) and
:func:`resolve_backend` live in :mod:`stitchtune.tune.config`; optuna storage, study, sampler, grid and
worker-liveness helpers in :mod:`stitchtune.tune.study`, the summary text in :mod:`stitchtune.tune.summary`,
:class:`SearchResult` in :mod:`stitchtune.tune.result`; the names the CLI and tests use are importable from
here too (``__all__`` lists the loop's own API).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from stitchtune.tune.config import (
    BACKENDS,  # noqa: F401 - re-exported
    SAMPLERS,  # noqa: F401 - re-exported
    Components,
    SearchConfig,
    SkipBuilder,  # noqa: F401 - re-exported
    default_components,
    resolve_backend,
)
from stitchtune.tune.database import TuningDB, read_parts
from stitchtune.errors import ScheduleError, UnsupportedGraphError, from_ctrl_c
from stitchtune.plan.scatter import nondeterministic
from stitchtune.tune.pipeline import context_row, evaluate, schedule_columns
from stitchtune.tune.result import SearchResult
from stitchtune.tune.records import TrialRecord, TrialStatus
from stitchtune.tune.trial_rows import RESULT_FIELDS, _plain, _row_from_trial
from stitchtune.tune.summary import format_best_table, format_summary, json_safe  # noqa: F401 - re-exported
from stitchtune.tune.study import (
    _KEY_WAIT_S,
    MAX_GRID,  # noqa: F401 - re-exported
    _age_s,
    _fail_stale,
    _local_dead,
    _open_study,
    _worker_id,
    default_study_name,
    describe_storage,
    enqueue_grid,
    grid_points,
    make_sampler,
    make_storage,
    repair_journal_tail,  # noqa: F401 - re-exported
    study_space_version,
)

log = logging.getLogger(__name__)

_POLL_S = 0.2


# ---------------------------------------------------------------------------------------- the loop
class _Loop:
    def __init__(self, config: SearchConfig, comp: Components) -> None:
        self.config = config
        self.comp = comp
        self.t0 = time.monotonic()
        self.worker = _worker_id()
        self.graph = comp.load_graph(config.graph_path)
        self.device = comp.get_device(config.device)
        from stitchtune.hardware.device import check_fits

        check_fits(self.graph, self.device)  # before anything is allocated for the graph
        from stitchtune.graph.parse import Graph
        from stitchtune.graph.reference import check_host_memory

        if isinstance(self.graph, Graph):  # the emulator and the reference run here: before any storage
            check_host_memory(self.graph)
        if config.backend == "auto":
            self.backend, self.backend_reason = resolve_backend("auto", comp.cuda_available)
            log.info("%s", self.backend_reason)
        else:
            self.backend, self.backend_reason = resolve_backend(config.backend, comp.cuda_available)
        self.estimated = self.backend != "cuda"
        self.plan = comp.make_plan(self.graph)
        self.space = comp.space_for_plan(self.plan, self.device)
        if comp.legal_space is not None:  # only schedules whose kernels fit the device
            self.space = comp.legal_space(self.graph, self.plan, self.device, self.space)
        if config.deterministic:
            why = nondeterministic(getattr(self.plan, "scatters", ()))
            if why is not None:   # every schedule adds with float atomics
                raise UnsupportedGraphError(why)
            self.space = self.space.deterministic_only()  # no float atomics (--deterministic)
        if config.sampler in ("gp", "cmaes"):
            # these samplers model a fixed parameter set: plain names, repaired points (space/search_space.py)
            self.space = self.space.flat_mode()
        self.stages = comp.stages()
        self.db = TuningDB(config.db)
        self.storage_desc = describe_storage(config.storage, config.db)
        sampler = make_sampler(config.sampler, config.seed, self.space)
        self.grid = grid_points(self.space, config.seed) if config.sampler == "grid" else None  # errors before storage
        self.study_name = config.study or default_study_name(self.graph, self.device)
        if config.bucket and not config.study:  # a bucket's generic kernels: their own study
            self.study_name += "-" + re.sub(r"[^A-Za-z0-9_.-]", "_", config.bucket)
        if not config.study and self.space.deterministic and self.plan.cross:
            self.study_name += "-deterministic"  # another cross_combine domain: its own optuna study
        self.study = _open_study(self.study_name, make_storage(config.storage, config.db), sampler)
        drawn = self.space.as_of(study_space_version(self.study, self.space.version))  # optuna refuses changed choices
        if drawn is not self.space:   # a study of an earlier space version: its draws, its grid (a subset of today's)
            self.space, self.grid = drawn, (grid_points(drawn, config.seed) if self.grid is not None else None)
        self.ctx = context_row(self.graph, self.device)
        if config.bucket:
            self.ctx["bucket"] = config.bucket
        self.versions = {"space_version": str(self.space.version),
                         "codegen_version": str(self.stages.codegen_version)}
        self.heuristic = comp.heuristic_schedule(self.plan, self.device)
        self.heuristic_key = self.heuristic.key()
        self.known: dict[str, TrialRecord] = {}
        self._seen_parts: set[str] = set()
        self.counts: Counter[str] = Counter()
        self.rows_written = 0
        self.reused = 0
        self.trials_run = 0
        self.best_row: TrialRecord | None = None
        self._varied: set[str | None] = set()  # best points whose variants were enqueued
        self.heur_row: TrialRecord | None = None
        self.since_improvement = 0

    # ------------------------------------------------------------------ database view
    def refresh_known(self) -> None:
        """Fold rows of parts not read yet into ``known`` (schedule key -> settling row)."""
        new = [p for p in self.db.parts() if p not in self._seen_parts]
        if not new:
            return
        self._seen_parts.update(new)
        import pandas as pd

        frames = read_parts(new)
        if not frames:
            return
        df = pd.concat(frames, ignore_index=True, sort=False)
        # a bucket's rows measure generic kernels: reused only within the bucket, never by a static search
        bucket = df["bucket"].fillna("") if "bucket" in df.columns else pd.Series("", index=df.index)
        df = df[bucket == self.config.bucket]
        found = self.db.measured(self.ctx["workload_key"], self.ctx["device_key"], self.versions["space_version"],
                                 self.versions["codegen_version"], self.backend, df=df)
        for key, row in found.items():
            old = self.known.get(key)
            if old is None or (old.reused and not row.reused):
                self.known[key] = row
            self._consider(row)

    def _consider(self, row: TrialRecord) -> bool:
        """Update best/heuristic from a row; True when it improved the best."""
        improved = False
        if row.measured_us is not None and row.status is TrialStatus.OK:
            best = self.best_us()
            if best is None or row.measured_us < best:
                improved = True
                self.best_row = row
        if row.schedule_key == self.heuristic_key and self.heur_row is None:
            self.heur_row = row
        return improved

    def best_us(self) -> float | None:
        return self.best_row.measured_us if self.best_row is not None else None

    # ------------------------------------------------------------------ one batch
    def base_row(self, trial: optuna.Trial, schedule: Any) -> dict[str, Any]:
        return {**self.ctx, **self.versions, **schedule_columns(schedule), "backend": self.backend,
                "heuristic": schedule.key() == self.heuristic_key, "reused": False, "reused_from": None,
                "study": self.study_name, "trial_number": trial.number, "sampler": self.config.sampler,
                "worker": self.worker}

    def copy_result(self, row: dict[str, Any], src: TrialRecord | Mapping[str, Any], source: str) -> dict[str, Any]:
        if isinstance(src, TrialRecord):
            src = src.to_row()
        for k in RESULT_FIELDS:
            if k in src:
                row[k] = src[k]
        row["reused"] = True
        row["reused_from"] = source
        return row

    def owner_of(self, trial: optuna.Trial, key: str) -> optuna.trial.FrozenTrial | None:
        """The lowest-numbered other trial of this study with the same schedule key (None: we own it).

        A lower-numbered RUNNING trial without a key yet may be about to claim ``key``: it is waited for
        while it is younger than ``_KEY_WAIT_S`` (a live worker signs and keys its trial within
        milliseconds of asking for it). An older one was abandoned (its worker died inside ``ask()`` or
        before keying it) and is not waited for, so one dead worker costs every other worker one wait
        of at most ``_KEY_WAIT_S`` in all, not one per schedule.
        """
        deadline = time.monotonic() + _KEY_WAIT_S
        while True:
            pending = False
            owner = None
            for t in self.study.get_trials(deepcopy=False):
                if t.number >= trial.number:
                    continue
                k = t.user_attrs.get("schedule_key")
                if k is None:
                    if (t.state == TrialState.RUNNING and not _local_dead(t.user_attrs.get("worker"))
                            and not t.user_attrs.get("stale") and _age_s(t) < _KEY_WAIT_S):
                        pending = True
                    continue
                settled_or_running = t.state != TrialState.FAIL or t.user_attrs.get("status")
                if k == key and settled_or_running and (owner is None or t.number < owner.number):
                    owner = t
            if owner is not None or not pending or time.monotonic() > deadline:
                return owner
            time.sleep(_POLL_S)

    def wait_for(self, number: int) -> optuna.trial.FrozenTrial | None:
        """Wait until trial ``number`` finishes; None when it dies, is stale, or takes too long."""
        deadline = time.monotonic() + self.config.dup_wait_s
        while time.monotonic() < deadline:
            t = self.study.get_trials(deepcopy=False)[number]
            if t.state.is_finished():
                return t
            if _local_dead(t.user_attrs.get("worker")):
                return None
            time.sleep(_POLL_S)
        log.warning("gave up waiting for trial %d of another worker; measuring its schedule here", number)
        return None

    def run_batch(self, n: int) -> list[tuple[optuna.Trial, TrialRecord]]:
        trials = [self.study.ask() for _ in range(n)]
        self._in_flight = list(trials)
        done: dict[int, dict[str, Any]] = {}   # index -> row (being filled in)
        records: dict[int, TrialRecord] = {}   # index -> the row as written (settled)
        scheds: dict[int, Any] = {}
        for i, tr in enumerate(trials):
            tr.set_user_attr("worker", self.worker)
            try:
                s = self.space.suggest(tr)
            except ScheduleError as exc:
                done[i] = {**self.ctx, **self.versions, "schedule_json": None, "schedule_key": None,
                           "backend": self.backend, "heuristic": False, "reused": False, "reused_from": None,
                           "study": self.study_name, "trial_number": tr.number, "sampler": self.config.sampler,
                           "worker": self.worker, "status": TrialStatus.PRUNED, "prune_reason": f"illegal: {exc}",
                           "error": ""}
                continue
            scheds[i] = s
            tr.set_user_attr("schedule_key", s.key())
        self.refresh_known()
        to_eval: list[int] = []
        first_in_batch: dict[str, int] = {}
        in_batch_dups: dict[int, int] = {}
        waits: dict[int, int] = {}
        for i, s in scheds.items():
            key = s.key()
            if key in self.known:
                src = self.known[key]
                done[i] = self.copy_result(self.base_row(trials[i], s), src, f"{src.study}:{src.trial_number}")
            elif key in first_in_batch:
                in_batch_dups[i] = first_in_batch[key]
            else:
                owner = self.owner_of(trials[i], key)
                if owner is not None:
                    waits[i] = owner.number
                else:
                    first_in_batch[key] = i
                    to_eval.append(i)
        if to_eval:
            rows = evaluate(self.graph, self.plan, self.device, [scheds[i] for i in to_eval], self.builder,
                            self.runner, self.best_us(), prune_factor=self.config.prune_factor,
                            stages=self.stages)
            for i, r in zip(to_eval, rows):
                done[i] = {**self.base_row(trials[i], scheds[i]), **r}
        for i, j in in_batch_dups.items():
            done[i] = self.copy_result(self.base_row(trials[i], scheds[i]), done[j],
                                       f"{self.study_name}:{trials[j].number}")
        if waits:  # settle our own trials first: another worker may be waiting for one of them
            self._settle(trials, done, sorted(done), records)
        for i, num in waits.items():
            t = self.wait_for(num)
            waited = _row_from_trial(t) if t is not None else None
            if waited is None:
                self.refresh_known()
                key = scheds[i].key()
                if key in self.known:
                    src_row = self.known[key]
                    done[i] = self.copy_result(self.base_row(trials[i], scheds[i]), src_row,
                                               f"{src_row.study}:{src_row.trial_number}")
                    continue
                r = evaluate(self.graph, self.plan, self.device, [scheds[i]], self.builder, self.runner,
                             self.best_us(), prune_factor=self.config.prune_factor, stages=self.stages)[0]
                done[i] = {**self.base_row(trials[i], scheds[i]), **r}
            else:
                done[i] = self.copy_result(self.base_row(trials[i], scheds[i]), waited, f"{self.study_name}:{num}")
        self._settle(trials, done, sorted(waits) if waits else list(range(n)), records)
        return [(trials[i], records[i]) for i in range(n)]

    def _settle(self, trials: list[optuna.Trial], done: dict[int, dict[str, Any]], idx: list[int],
                settled: dict[int, TrialRecord]) -> dict[int, TrialRecord]:
        """Write the rows ``done[i]`` for ``i`` in ``idx`` to the database as records, then tell their trials
        (a kill loses at most the rows not yet flushed). Returns ``settled`` (index -> record) with them added."""
        for i in idx:
            if done[i].get("estimated") is None:
                done[i]["estimated"] = self.estimated
            settled[i] = TrialRecord.from_row(done[i])
        if idx:
            self.db.append(settled[i] for i in idx)
            self.rows_written += len(idx)
        for i in idx:
            self.tell(trials[i], settled[i])
        told = {trials[i].number for i in idx}
        self._in_flight = [t for t in self._in_flight if t.number not in told]
        return settled

    def tell(self, trial: optuna.Trial, row: TrialRecord) -> None:
        status = row.status
        for k in ("prune_reason", "predicted_us", "predicted_from", "occupancy", "registers", "estimated"):
            v = _plain(getattr(row, k))
            if v is not None:
                trial.set_user_attr(k, v)
        trial.set_user_attr("status", status.value)
        if row.error:
            trial.set_user_attr("error", row.error[:1000])
        if row.reused:
            trial.set_user_attr("reused_from", row.reused_from)
        if status is TrialStatus.OK and row.measured_us is not None:
            self.study.tell(trial, row.measured_us)
        elif status is TrialStatus.OK:  # the pipeline turns such a row into a launch_error; never told ok
            self.study.tell(trial, state=TrialState.FAIL)
        elif status is TrialStatus.PRUNED:
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    def abandon_in_flight(self) -> None:
        for tr in getattr(self, "_in_flight", []):
            try:
                tr.set_user_attr("interrupted", True)
                self.study.tell(tr, state=TrialState.FAIL)
            except Exception as exc:  # noqa: BLE001 - best effort while stopping
                log.debug("could not close trial %d: %s", tr.number, exc)
        self._in_flight = []

    # ------------------------------------------------------------------ driver
    def run(self) -> SearchResult:
        from tqdm import tqdm

        cfg = self.config
        _fail_stale(self.study)
        enqueue_grid(self.study, self.space, [self.heuristic], {"heuristic": True})
        if self.grid is not None:
            self.enqueue_grid()
        self.refresh_known()
        self.builder = self.comp.make_builder(cfg, self.device, self.backend)
        self.runner = self.comp.make_runner(self.backend, self.graph, self.device)
        est = " (estimated)" if self.estimated else ""
        bar = tqdm(total=cfg.trials, file=sys.stderr, disable=not cfg.progress, unit="trial",
                   desc=f"search {self.study_name[:40]}", dynamic_ncols=True)
        stopped = "trials"
        try:
            while self.trials_run < cfg.trials:
                if cfg.timeout_s is not None and time.monotonic() - self.t0 >= cfg.timeout_s:
                    stopped = "timeout"
                    break
                if cfg.early_stop is not None and self.since_improvement >= cfg.early_stop:
                    stopped = "early_stop"
                    break
                n = min(cfg.jobs, cfg.trials - self.trials_run)
                if self.grid is not None:
                    left = len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
                    if left <= 0:
                        stopped = "grid_exhausted"
                        break
                    n = min(n, left)
                for _tr, row in self.run_batch(n):
                    self.trials_run += 1
                    self.counts[row.status.value] += 1
                    self.reused += bool(row.reused)
                    if row.schedule_key:
                        self.known.setdefault(row.schedule_key, row)
                    if self._consider(row):
                        self.since_improvement = 0
                    else:
                        self.since_improvement += 1
                self.enqueue_variants()
                best = self.best_us()
                post = {"best": f"{best:.2f}us{est}" if best is not None else "-"}
                sp = self.speedup()
                if sp is not None:
                    post["vs trial 0"] = f"{sp:.2f}x"
                bar.set_postfix(post, refresh=False)
                bar.update(n)
        except (KeyboardInterrupt, OSError) as exc:
            if not from_ctrl_c(exc):  # an OSError of its own is not an interruption
                raise
            stopped = "interrupted"
            self.abandon_in_flight()
            log.info("interrupted: %d rows written to %s", self.rows_written, self.db.path)
        finally:
            bar.close()
            self.runner.close()
        return self.result(stopped)

    def enqueue_variants(self) -> None:
        """Enqueue the space's ``variants`` of the best point (once per best point, only those not
        measured yet): the options the cost model ranks least reliably are measured side by side with
        the best schedule in every search. No-op for the grid sampler."""
        row = self.best_row
        if self.grid is not None or row is None or not row.schedule_json:
            return
        key = row.schedule_key
        if key in self._varied:
            return
        self._varied.add(key)
        best = type(self.heuristic).from_dict(json.loads(row.schedule_json))
        for v in self.space.variants(best):
            if v.key() not in self.known:
                self.study.enqueue_trial(self.space.params_of(v), user_attrs={"variant_of": key},
                                         skip_if_exists=True)

    def enqueue_grid(self) -> None:
        """Enqueue every grid point the study has not tried or queued yet (:func:`enqueue_grid`)."""
        enqueue_grid(self.study, self.space, self.grid or ())

    def speedup(self) -> float | None:
        if self.best_row is None or self.heur_row is None or not self.heur_row.ok or not self.best_row.ok:
            return None
        b, h = self.best_row.measured_us, self.heur_row.measured_us
        return h / b if b is not None and h is not None and b > 0 else None

    def floor_us(self) -> float | None:
        bw = self.device.effective_copy_bandwidth_gbs()
        if not bw:
            return None
        return float(self.graph.min_bytes()) / (float(bw) * 1e9) * 1e6

    def result(self, stopped: str) -> SearchResult:
        floor = self.floor_us()
        best = self.best_us()
        return SearchResult(
            study_name=self.study_name, storage=self.storage_desc, db_path=self.db.path, backend=self.backend,
            backend_reason=self.backend_reason, estimated=self.estimated, graph_name=str(self.graph.name),
            workload_key=self.ctx["workload_key"], device_key=self.ctx["device_key"], trials_run=self.trials_run,
            status_counts=dict(self.counts), reused=self.reused, best=self.best_row, heuristic=self.heur_row,
            speedup=self.speedup(), floor_us=floor,
            floor_fraction=(floor / best) if floor is not None and best else None,
            stopped=stopped, elapsed_s=time.monotonic() - self.t0, rows_written=self.rows_written)


def run_search(config: SearchConfig, components: Components | None = None) -> SearchResult:
    """Run (or resume) one search; see the module docstring for the contract."""
    comp = components or default_components()
    if not log.isEnabledFor(logging.DEBUG):
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own progress bar and summary say enough
    return _Loop(config, comp).run()


__all__ = [
    "Components",
    "SearchConfig",
    "SearchResult",
    "SkipBuilder",
    "default_components",
    "default_study_name",
    "format_best_table",
    "format_summary",
    "make_sampler",
    "make_storage",
    "resolve_backend",
    "run_search",
]
