"""Several `stitchtune search` worker processes on one study: PostgreSQL (3 and 4 workers), journal file (4).

Each worker is this file run as a script (``python tests/test_postgres.py worker ARGS...``): it
swaps the search stages for the fakes of tests/test_search.py (15-point space, instant "measurements")
and calls ``stitchtune.cli.main(ARGS)``, the `stitchtune search` command. Every fake measurement is
appended to a shared log, so the test can prove no schedule was measured twice across processes.
Checks: every finished trial recorded exactly once in the database, no trial left running, nothing
measured twice, best in the database == best in the study.

The PostgreSQL test needs STITCHTUNE_TEST_PG_URL (``.ci/run`` starts a throwaway server and sets it).
All of them are ``slow`` (CI's second half): each starts 3 or 4 worker processes that import the package,
about 5 CPU-s and, on a loaded 2-core machine, half a minute of waiting (the journal-file test alone: 6.2
CPU-s, 34 s wall beside other work), for a contract only tune/search's storage changes touch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PG_URL = os.environ.get("STITCHTUNE_TEST_PG_URL")
LOG_ENV = "STITCHTUNE_TEST_MEASURE_LOG"


def _worker(argv: list[str]) -> int:
    from helpers.search_fakes import fake_components, FakeRunner

    import stitchtune.tune.search as search_mod
    from stitchtune.cli import main

    comp = fake_components(FakeRunner(os.environ.get(LOG_ENV)))
    search_mod.default_components = lambda: comp
    return main(argv)


def _run_workers(tmp_path: Path, n: int, trials: int, storage: str | None, study: str) -> Path:
    db = tmp_path / "db"
    log = tmp_path / "measured.log"
    env = dict(os.environ)
    env[LOG_ENV] = str(log)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    procs = []
    # the CLI reads its GRAPH first (a static graph or one with dynamic dims?): a valid one; the fakes never read it
    shutil.copy(REPO / "examples" / "layernorm_small.json", tmp_path / "fake.json")
    for i in range(n):
        argv = ["search", "fake.json", "--db", str(db), "--study", study, "--trials", str(trials), "--jobs", "2",
                "--sampler", "random", "--seed", str(i), "--backend", "emulate", "--no-progress"]
        if storage:
            argv += ["--storage", storage]
        procs.append(subprocess.Popen([sys.executable, __file__, "worker", *argv], env=env, cwd=str(tmp_path),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
    return db


def _check(db: Path, storage, study_name: str, n_workers: int, trials: int, log: Path) -> None:
    import optuna
    from optuna.trial import TrialState

    from stitchtune.tune.database import TuningDB

    study = optuna.load_study(study_name=study_name, storage=storage)
    finished = [t for t in study.get_trials(deepcopy=False)
                if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)]
    assert not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    assert len(finished) == n_workers * trials
    df = TuningDB(db).read()
    rows = df[df["study"] == study_name]
    # every trial recorded exactly once (raw parts too, not only after de-duplication on read)
    import pandas as pd

    raw = pd.concat([pd.read_parquet(p) for p in TuningDB(db).parts()], ignore_index=True)
    assert raw["trial_number"].is_unique
    assert sorted(rows["trial_number"]) == sorted(t.number for t in finished)
    # no schedule measured twice, by any worker
    measured = log.read_text().split("\n") if log.exists() else []
    keys = [line.split()[1] for line in measured if line.strip()]
    assert keys and len(keys) == len(set(keys)), keys
    # best in the database == best in the study
    ok = rows[rows["status"] == "ok"]
    assert float(ok["measured_us"].min()) == pytest.approx(study.best_value)
    best_key = ok.loc[ok["measured_us"].astype(float).idxmin(), "schedule_key"]
    assert study.best_trial.user_attrs["schedule_key"] == best_key
    # states agree with statuses
    by_num = dict(zip(rows["trial_number"], rows["status"]))
    for t in finished:
        want = {"ok": TrialState.COMPLETE, "pruned": TrialState.PRUNED}.get(by_num[t.number], TrialState.FAIL)
        assert t.state == want


@pytest.mark.postgres
@pytest.mark.waits
@pytest.mark.skipif(not PG_URL, reason="STITCHTUNE_TEST_PG_URL is not set (.ci/run starts PostgreSQL and sets it)")
@pytest.mark.parametrize("workers", [3, 4])
def test_workers_share_a_postgres_study(tmp_path, workers):
    from stitchtune.tune.search import make_storage

    study = f"pg-{workers}-{uuid.uuid4().hex[:8]}"
    db = _run_workers(tmp_path, workers, 10, PG_URL, study)
    _check(db, make_storage(PG_URL, str(db)), study, workers, 10, tmp_path / "measured.log")


@pytest.mark.waits
def test_four_workers_share_a_journal_file_study(tmp_path):
    import optuna
    from optuna.storages.journal import JournalFileBackend

    study = "journal-4"
    db = _run_workers(tmp_path, 4, 8, None, study)
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(db / "optuna.journal")))
    _check(db, storage, study, 4, 8, tmp_path / "measured.log")


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "worker":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: helpers
    sys.exit(_worker(sys.argv[2:]))
