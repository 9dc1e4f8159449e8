"""Concurrency (issue 9, part 3) with the real stages: four unpatched ``stitchtune search`` processes
on one study in the default journal-file storage.

tests/test_postgres.py already runs four workers on a journal-file study (and three on PostgreSQL)
with the *fake* stages of tests/test_search.py and a log of every fake measurement. This file adds
what it does not cover:

* the real pipeline (plan, space, lowering, emulator, cost model) behind the real CLI, no
  monkeypatching, all four workers with the *same* sampler seed, so that they propose the same
  schedules at the same time and the "lowest trial number measures, the others wait and copy" rule
  is exercised under contention;
* one of four workers SIGKILLed in the middle: the three others finish, and a later run marks the
  dead worker's trials ``stale``.

The workers are processes of their own forked from a server that imported the CLI once
(``helpers.cli.forked_cli``), each running the CLI's ``main``: they start within milliseconds of each
other (more contention than subprocesses that each import for seconds), without paying the
interpreter's start-up and imports four times.

Checks: every finished trial is recorded exactly once (raw parts, before the de-duplication of
``read()``), every row belongs to a finished trial, no trial is left RUNNING, no schedule was
measured (a non-reused row) twice, the best time in the database == the study's best value, and
trial states agree with row statuses.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from helpers.cli import forked_cli, run_forked_cli, start_fork_server, stop_fork_server

REPO = Path(__file__).resolve().parents[2]
GRAPH = REPO / "examples" / "layernorm_small.json"
WORKERS = 4
TRIALS = 10
KILL_TRIALS = 16  # per worker in the kill test (8 batches of 2): the kill comes once the victim signed a trial, and
#   the victim must still be running when it lands (with 8, one CI run saw it finish all of them in the window)
STUDY = "concurrency"

pytestmark = [pytest.mark.slow, pytest.mark.waits]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # a worker killed while it appends to the journal leaves the journal's lock behind: the others break
    # it after 5 s instead of optuna's 30 (an append holds it for milliseconds)
    env["STITCHTUNE_JOURNAL_LOCK_GRACE_S"] = "5"
    return env


def _cmd(db: Path, trials: int, seed: int = 5) -> list[str]:
    return [sys.executable, "-m", "stitchtune", "search", str(GRAPH), "--backend", "emulate", "--device", "h200",
            "--db", str(db), "--study", STUDY, "--trials", str(trials), "--jobs", "2", "--sampler", "random",
            "--seed", str(seed), "--no-progress", "--no-build", "--prune-factor", "1000"]


@pytest.fixture(scope="module", autouse=True)
def _fork_server() -> Any:
    yield
    stop_fork_server()


def _start(db: Path, n: int, trials: int = TRIALS) -> list[tuple[Any, Path]]:
    """``n`` workers started together: (process, its output file: stdout and stderr)."""
    start_fork_server()
    logs = db.parent / "logs"
    logs.mkdir(exist_ok=True)
    started = []
    for i in range(n):
        out = logs / f"worker-{i}.txt"
        started.append((forked_cli(_cmd(db, trials)[3:], out, out, env=_env()), out))   # argv after "-m stitchtune"
    return started


def _finish(proc: Any, out: Path, timeout: float = 600) -> str:
    """Wait for a worker; its output."""
    proc.join(timeout)
    return out.read_text() if out.exists() else ""


def _study(db: Path):
    import optuna

    from stitchtune.tune.search import make_storage

    return optuna.load_study(study_name=STUDY, storage=make_storage(None, str(db)))


def _check(db: Path, expect_trials: int | None, strict_once: bool) -> tuple[int, int]:
    """The invariants; returns (finished trials, rows)."""
    from optuna.trial import TrialState

    from stitchtune.tune.database import TuningDB

    study = _study(db)
    trials = study.get_trials(deepcopy=False)
    assert not [t.number for t in trials if t.state == TrialState.RUNNING], "trials left RUNNING"
    recorded = [t for t in trials if t.state.is_finished() and not t.user_attrs.get("stale")
                and not t.user_attrs.get("interrupted")]
    if expect_trials is not None:
        assert len(recorded) == expect_trials
    raw = pd.concat([pd.read_parquet(p) for p in TuningDB(db).parts()], ignore_index=True)
    raw = raw[raw["study"] == STUDY]
    assert raw["trial_number"].is_unique, "a trial was recorded twice"
    numbers = set(raw["trial_number"].astype(int))
    assert {t.number for t in recorded} <= numbers, "a finished trial has no row"
    stale = {t.number for t in trials if t.user_attrs.get("stale")}
    assert numbers <= {t.number for t in recorded} | stale, "a row of an unknown trial"
    measured = raw[~raw["reused"].fillna(False).astype(bool) & raw["schedule_key"].notna()]
    if strict_once:
        dup = measured[measured["schedule_key"].duplicated(keep=False)]
        assert dup.empty, f"measured more than once: {dup[['schedule_key', 'trial_number', 'worker']]}"
    ok = raw[raw["status"] == "ok"]
    assert not ok.empty
    assert float(ok["measured_us"].astype(float).min()) == pytest.approx(study.best_value)
    best_key = ok.loc[ok["measured_us"].astype(float).idxmin(), "schedule_key"]
    best_keys = set(ok.loc[ok["measured_us"].astype(float) == float(study.best_value), "schedule_key"])
    assert best_key in best_keys
    by_num = dict(zip(raw["trial_number"].astype(int), raw["status"]))
    for t in recorded:
        want = {"ok": TrialState.COMPLETE, "pruned": TrialState.PRUNED}.get(by_num[t.number], TrialState.FAIL)
        assert t.state == want, (t.number, t.state, by_num[t.number])
    return len(recorded), len(raw)


def test_four_real_workers_on_one_journal_study(tmp_path: Path) -> None:
    db = tmp_path / "db"
    started = _start(db, WORKERS)
    outs = [_finish(p, out) for p, out in started]
    for (p, _), out in zip(started, outs, strict=True):
        assert p.exitcode == 0, out[-3000:]
        assert f"{TRIALS} trial(s) this run" in out
    n, rows = _check(db, WORKERS * TRIALS, strict_once=True)
    assert rows == n == WORKERS * TRIALS
    reused = pd.concat([pd.read_parquet(p) for p in db.glob("part-*.parquet")])["reused"].astype(bool).sum()
    assert reused > 0, "same seed everywhere, yet no worker reused another's result: contention not exercised"


def test_one_of_four_workers_killed_the_others_finish(tmp_path: Path) -> None:
    db = tmp_path / "db"
    trials = KILL_TRIALS
    started = _start(db, WORKERS, trials)
    victim = started[1][0]
    tag = f"{socket.gethostname()}:{victim.pid}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and victim.is_alive():   # until the victim has signed a trial
        try:
            if any(t.user_attrs.get("worker") == tag for t in _study(db).get_trials(deepcopy=False)):
                break
        except KeyError:   # no study in the journal yet
            pass
        time.sleep(0.2)
    assert victim.is_alive(), "the victim finished before the kill: it did not land mid-run"
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(60)
    assert victim.exitcode == -signal.SIGKILL
    for p, log in started:
        if p is victim:
            continue
        out = _finish(p, log)
        assert p.exitcode == 0, out[-3000:]
        assert f"{trials} trial(s) this run" in out
    # a later run marks the dead worker's unfinished trials stale, then runs its own
    rc, out, err = run_forked_cli(_cmd(db, 2)[3:], db.parent / "logs", env=_env())
    assert rc == 0, out[-2000:] + err[-2000:]
    n, _ = _check(db, None, strict_once=False)
    assert n >= (WORKERS - 1) * trials + 2
    # the kill landed mid-run: the victim had signed trials and had not finished all of its own
    victims = [t for t in _study(db).get_trials(deepcopy=False)
               if t.user_attrs.get("worker") == tag]
    assert victims, "the victim was killed before it started a trial"
    assert sum(t.state.is_finished() and not t.user_attrs.get("stale") for t in victims) < trials
