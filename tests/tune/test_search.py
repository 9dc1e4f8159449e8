"""Search loop with fake stages: statuses, pruning, resume/reuse, early stop, samplers, CLI wiring.

The fakes below are also used by tests/test_pipeline.py and tests/test_postgres.py (worker processes).
Fake space: block in BLOCKS x vec in VECS (15 points). Outcomes by point (see FATES):
(32,4) illegal -> pruned; (512,4) cost-model prune_reason -> pruned; (64,4) compile_error;
(64,2) build timeout -> timeout; (512,1) launch_error; (512,2) run timeout; (128,1) wrong_result;
all others ok with time = predicted time (fake, not a measurement).
"""

from __future__ import annotations

import json
import os

import optuna
import pytest

from stitchtune.tune.database import TuningDB
from stitchtune.errors import StitchtuneError
from helpers.search_fakes import fake_components, fake_time, FakeRunner, FakeSchedule, FakeSpace
from stitchtune.tune.search import Components, SearchConfig, format_summary, run_search

def _cfg(tmp_path, **kw) -> SearchConfig:
    base = {"graph_path": "fake.json", "trials": 15, "backend": "emulate", "db": str(tmp_path / "db"),
            "sampler": "random", "seed": 1, "jobs": 4, "progress": False, "prune_factor": 100.0}
    base.update(kw)
    return SearchConfig(**base)


# ------------------------------------------------------------------------------------------ tests
def test_every_status_and_heuristic_first(tmp_path):
    runner = FakeRunner()
    cfg = _cfg(tmp_path, sampler="grid", trials=40)
    res = run_search(cfg, fake_components(runner))
    assert res.stopped == "grid_exhausted"
    df = TuningDB(cfg.db).read()
    assert len(df) == 15 and df["trial_number"].is_unique
    by_key = dict(zip(df["schedule_key"], df["status"]))
    assert by_key["b32-v4"] == "pruned" and by_key["b512-v4"] == "pruned"
    assert by_key["b64-v4"] == "compile_error" and by_key["b64-v2"] == "timeout"
    assert by_key["b512-v1"] == "launch_error" and by_key["b512-v2"] == "timeout"
    assert by_key["b128-v1"] == "wrong_result"
    assert set(df["status"]) == {"ok", "pruned", "compile_error", "launch_error", "timeout", "wrong_result"}
    errs = dict(zip(df["schedule_key"], df["error"]))
    assert "identifier undefined" in errs["b64-v4"] and "ILLEGAL_ADDRESS" in errs["b512-v1"]
    reasons = dict(zip(df["schedule_key"], df["prune_reason"]))
    assert reasons["b32-v4"].startswith("illegal:") and "occupancy 0" in reasons["b512-v4"]
    # trial 0 is the heuristic
    t0 = df[df["trial_number"] == 0].iloc[0]
    assert t0["schedule_key"] == "b128-v4" and bool(t0["heuristic"])
    assert df["estimated"].all() and set(df["backend"]) == {"emulate"}
    # optuna states
    study = optuna.load_study(study_name=res.study_name,
                              storage=optuna.storages.JournalStorage(
                                  optuna.storages.journal.JournalFileBackend(os.path.join(cfg.db, "optuna.journal"))))
    states = {t.user_attrs["schedule_key"]: t.state for t in study.trials}
    assert states["b32-v4"] == optuna.trial.TrialState.PRUNED
    assert study.trials[0].user_attrs.get("prune_reason") is None
    assert states["b64-v4"] == optuna.trial.TrialState.FAIL
    assert states["b256-v2"] == optuna.trial.TrialState.COMPLETE
    assert next(t for t in study.trials if t.user_attrs["schedule_key"] == "b32-v4").user_attrs["prune_reason"]
    # the best is the global optimum of the fake objective; speedup vs heuristic
    assert res.best.schedule_key == "b256-v2"
    assert res.speedup == pytest.approx(fake_time(FakeSchedule(128, 4)) / fake_time(FakeSchedule(256, 2)))
    assert res.floor_fraction == pytest.approx(res.floor_us / res.best.measured_us)
    assert sorted(runner.measured) == sorted(set(runner.measured))  # nothing measured twice
    text = format_summary(res)
    assert "(estimated)" in text and "b256-v2" in text and "trials by status" in text
    assert runner.closed


def test_prune_by_prediction_against_best(tmp_path):
    runner = FakeRunner()
    cfg = _cfg(tmp_path, sampler="grid", trials=15, prune_factor=1.5, jobs=1)
    run_search(cfg, fake_components(runner))
    df = TuningDB(cfg.db).read()
    slow = df[df["prune_reason"].fillna("").str.contains("x best")]
    assert len(slow) > 0
    assert not set(slow["schedule_key"]) & set(runner.measured)  # pruned points were never measured


def test_resume_reuses_db_rows_without_remeasuring(tmp_path):
    r1 = FakeRunner()
    cfg = _cfg(tmp_path, trials=8, sampler="random", seed=3)
    res1 = run_search(cfg, fake_components(r1))
    assert res1.trials_run == 8
    r2 = FakeRunner()
    cfg2 = _cfg(tmp_path, trials=30, sampler="grid")  # same study (default name), same db
    run_search(cfg2, fake_components(r2))
    assert not set(r1.measured) & set(r2.measured), "a schedule measured in run 1 was measured again"
    df = TuningDB(cfg.db).read()
    assert df["trial_number"].is_unique
    reused = df[df["reused"].astype(bool)]
    assert len(reused) >= 1 and reused["reused_from"].str.startswith(res1.study_name).all()
    # every grid point measured at most once over both runs
    measured = r1.measured + r2.measured
    assert len(measured) == len(set(measured))
    # a second study on the same DB reuses too
    r3 = FakeRunner()
    run_search(_cfg(tmp_path, trials=5, study="other-study"), fake_components(r3))
    assert r3.measured == []


def test_early_stop(tmp_path):
    cfg = _cfg(tmp_path, trials=15, early_stop=2, jobs=1, sampler="grid", seed=0)
    res = run_search(cfg, fake_components())
    assert res.stopped == "early_stop"
    assert res.trials_run < 15


def test_timeout_stops(tmp_path):
    cfg = _cfg(tmp_path, trials=15, timeout_s=1e-9, jobs=1)
    res = run_search(cfg, fake_components())
    assert res.stopped == "timeout" and res.trials_run == 0


def test_in_batch_duplicates_measured_once(tmp_path):
    runner = FakeRunner()
    # 15 points, 60 random trials in batches of 8: many repeats, each point measured at most once
    run_search(_cfg(tmp_path, trials=60, jobs=8, sampler="random", seed=5), fake_components(runner))
    assert len(runner.measured) == len(set(runner.measured))
    df = TuningDB(tmp_path / "db").read()
    assert len(df) == 60 and df["trial_number"].is_unique


def test_interrupt_stops_cleanly_after_flushing(tmp_path):
    class Interrupting(FakeRunner):
        def run(self, items):
            if len(self.measured) >= 3:
                raise KeyboardInterrupt
            return super().run(items)

    cfg = _cfg(tmp_path, trials=15, jobs=1, sampler="grid")
    res = run_search(cfg, fake_components(Interrupting()))
    assert res.stopped == "interrupted"
    df = TuningDB(cfg.db).read()
    assert len(df) == res.trials_run >= 3
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(os.path.join(cfg.db, "optuna.journal")))
    trials = optuna.load_study(study_name=res.study_name, storage=storage).trials
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    assert any(t.user_attrs.get("interrupted") for t in trials)


def _interrupted_inside_a_clean_up() -> OSError:
    """What optuna's journal lock raises when Ctrl-C lands inside its release(): the KeyboardInterrupt,
    handled, becomes a FileNotFoundError for the lock's .rename file."""
    try:
        try:
            raise KeyboardInterrupt
        except BaseException:
            os.unlink("/nonexistent/optuna.journal.lock-x.rename")
    except OSError as exc:
        return exc
    raise AssertionError("unreachable")


def test_an_error_raised_while_ctrl_c_is_handled_is_the_interruption(tmp_path):
    """Was: the FileNotFoundError left the loop (the CLI printed it as an error about the database, exit 2,
    seen once in a SIGINT test); now the search stops as interrupted, its rows flushed and counted. An
    OSError of its own still propagates."""
    class Interrupting(FakeRunner):
        def run(self, items):
            if len(self.measured) >= 3:
                raise _interrupted_inside_a_clean_up()
            return super().run(items)

    cfg = _cfg(tmp_path, trials=15, jobs=1, sampler="grid")
    res = run_search(cfg, fake_components(Interrupting()))
    assert res.stopped == "interrupted" and res.rows_written == len(TuningDB(cfg.db).read()) >= 3

    class Failing(FakeRunner):
        def run(self, items):
            raise FileNotFoundError(2, "No such file or directory", "/nonexistent")

    with pytest.raises(FileNotFoundError):
        run_search(_cfg(tmp_path / "b", trials=3, jobs=1, sampler="grid"), fake_components(Failing()))


def test_tpe_sampler_and_sqlite_storage(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    res = run_search(_cfg(tmp_path, trials=12, sampler="tpe", storage=url), fake_components())
    assert res.trials_run == 12 and res.storage.startswith("sqlite")


def test_config_and_sampler_errors(tmp_path):
    with pytest.raises(StitchtuneError) as ei:
        SearchConfig(graph_path="g", trials=0, jobs=0, backend="gpu")
    assert len(ei.value.problems) == 3

    class NoGrid(FakeSpace):
        grid = None

    comp = fake_components()
    comp = Components(**{**comp.__dict__, "space_for_plan": lambda p, d: NoGrid()})
    with pytest.raises(StitchtuneError, match="no finite grid"):
        run_search(_cfg(tmp_path, sampler="grid"), comp)
    with pytest.raises(StitchtuneError, match="storage"):
        run_search(_cfg(tmp_path, storage="not a url"), fake_components())


def test_backend_auto_resolution():
    from stitchtune.tune.search import resolve_backend

    assert resolve_backend("auto", lambda: False)[0] == "emulate"
    assert "estimated" in resolve_backend("auto", lambda: False)[1]
    assert resolve_backend("auto", lambda: True)[0] == "cuda"
    with pytest.raises(StitchtuneError):
        resolve_backend("cuda", lambda: False)


def test_stale_trial_of_dead_worker_is_failed(tmp_path):
    import subprocess
    import sys

    cfg = _cfg(tmp_path, trials=3)
    res = run_search(cfg, fake_components())
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(os.path.join(cfg.db, "optuna.journal")))
    study = optuna.load_study(study_name=res.study_name, storage=storage)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    t = study.ask()
    import socket

    t.set_user_attr("worker", f"{socket.gethostname()}:{int(dead.stdout)}")
    t.set_user_attr("schedule_key", "b256-v2")
    run_search(cfg, fake_components())
    again = optuna.load_study(study_name=res.study_name, storage=storage).trials[t.number]
    assert again.state == optuna.trial.TrialState.FAIL and again.user_attrs.get("stale")


def test_json_rows_roundtrip(tmp_path):
    run_search(_cfg(tmp_path, trials=4), fake_components())
    df = TuningDB(tmp_path / "db").read()
    for s in df["schedule_json"].dropna():
        assert FakeSchedule.from_dict(json.loads(s)).key() in set(df["schedule_key"])
    assert {"p_block", "p_vec"} <= set(df.columns)


# ------------------------------------------------------------------------------------------ CLI
def _use_fakes(monkeypatch, cwd, runner=None):
    """Fake stages for the CLI's search, run in ``cwd`` where a ``fake.json`` exists (the CLI reads its GRAPH
    before the search, to tell a static graph from one with dynamic dims: a valid small graph; the fakes
    never read it)."""
    import shutil

    import stitchtune.tune.search as search_mod
    from helpers.common import EXAMPLES_DIR

    monkeypatch.chdir(cwd)
    shutil.copy(EXAMPLES_DIR / "layernorm_small.json", cwd / "fake.json")
    comp = fake_components(runner)
    monkeypatch.setattr(search_mod, "default_components", lambda: comp)
    return comp


def test_cli_search_show_export(tmp_path, monkeypatch, capsys):
    import pandas as pd

    from stitchtune.cli import main

    runner = FakeRunner()
    _use_fakes(monkeypatch, tmp_path, runner)
    db = str(tmp_path / "db")
    argv = ["search", "fake.json", "--db", db, "--trials", "6", "--backend", "auto", "--sampler", "random",
            "--seed", "2", "--jobs", "3", "--no-progress"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "backend auto -> emulate" in err
    assert "trials by status" in out and "(estimated)" in out and "speedup over heuristic" in out
    assert main(argv) == 0  # resumes: same study, six more trials
    out, _ = capsys.readouterr()
    assert "12 trial rows" not in out
    assert main(["show", "--db", db]) == 0
    out, _ = capsys.readouterr()
    assert "12 trial rows" in out and "fake_ln" in out and "estimated" in out
    csv = tmp_path / "all.csv"
    assert main(["export", "--db", db, "--csv", str(csv)]) == 0
    df = pd.read_csv(csv)
    assert len(df) == 12 and "schedule_json" in df.columns
    assert len(runner.measured) == len(set(runner.measured))


def test_cli_user_errors_exit_2(tmp_path, monkeypatch, capsys):
    from stitchtune.cli import main

    _use_fakes(monkeypatch, tmp_path)
    assert main(["search", "fake.json", "--db", str(tmp_path), "--trials", "0", "--jobs", "0",
                 "--backend", "emulate"]) == 2
    err = capsys.readouterr().err   # argparse refuses the first bad number, before anything runs
    assert err.count("error:") == 1 and "argument --trials: from 1 to" in err and "Traceback" not in err
    assert err.startswith("usage: stitchtune search")  # nothing printed before the refusal
    assert main(["search", "fake.json", "--db", str(tmp_path), "--storage", "nonsense", "--backend",
                 "emulate", "--no-progress"]) == 2
    assert "--storage" in capsys.readouterr().err
    assert main(["search", "fake.json", "--db", str(tmp_path), "--storage",
                 "postgresql://u:secret@127.0.0.1:1/none", "--backend", "emulate", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "secret" not in err and "stitchtune: error:" in err


def test_unsigned_running_trial_is_failed_after_the_key_wait(tmp_path):
    from stitchtune.tune.search import _fail_stale

    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "j.journal")))
    study = optuna.create_study(study_name="s", storage=storage)
    t = study.ask()  # as if its worker died inside ask(), before signing the trial
    signed = study.ask()
    signed.set_user_attr("worker", f"{__import__('socket').gethostname()}:{os.getpid()}")  # alive: us
    assert _fail_stale(study, key_wait_s=0.2) == 1
    trials = study.get_trials()
    assert trials[t.number].state == optuna.trial.TrialState.FAIL and trials[t.number].user_attrs["stale"]
    assert trials[signed.number].state == optuna.trial.TrialState.RUNNING


@pytest.mark.parametrize("age_s, waits", [(0.0, True), (3600.0, False)])
def test_a_keyless_running_trial_is_waited_for_only_while_young(monkeypatch, age_s, waits):
    """``owner_of``: a lower-numbered RUNNING trial without a schedule key (its worker died inside
    ``ask()``) is waited for while it is young, never once it is older than the key wait: a dead worker
    costs the others one wait in all, not one per schedule."""
    import types

    import stitchtune.tune.search as search

    study = optuna.create_study(study_name="s", storage=optuna.storages.InMemoryStorage())
    study.ask()  # unsigned, never keyed
    mine = study.ask()
    sleeps: list[float] = []
    monkeypatch.setattr(search, "_KEY_WAIT_S", 0.05)
    monkeypatch.setattr(search, "_age_s", lambda t: age_s)
    monkeypatch.setattr(search.time, "sleep", sleeps.append)
    loop = types.SimpleNamespace(study=study)
    assert search._Loop.owner_of(loop, mine, "k") is None  # type: ignore[arg-type]
    assert bool(sleeps) == waits
