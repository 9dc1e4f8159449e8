"""A study resumes with the draws of the space version it was created in, and always queues today's heuristic.

Space version 6 draws ``min_blocks`` 3 (0/1/2/3/4); a study created before it asked ``min_blocks_b<block>`` over
0/1/2/4, and optuna refuses a categorical parameter whose choices changed, so such a study resumes drawing as
version 5 did (``SearchSpace.as_of``; the study's user attr ``space_version``, ``"5"`` where a study with trials
has none). The heuristic is enqueued whenever the study has not tried or queued it: trial 0 of a new study, and
the next trial of a resumed one whose heuristic was another (a study created before space version 5 never queued
the ``min_blocks`` 3 pin of the grid-barrier rule).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import optuna
import pytest

from helpers.lowering import DEV, float_graph
from helpers.search_fakes import FakeRunner, FakeSchedule, FakeSpace, fake_components
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.lower.resources import legal_space
from stitchtune.plan.planner import make_plan
from stitchtune.tune.search import SearchConfig, run_search
from stitchtune.tune.study import UNRECORDED_STUDY_VERSION, study_space_version


def _space() -> Any:
    """The legal space of a column sum whose heuristic pins ``min_blocks`` 3 (384 blocks of 256 threads)."""
    g = float_graph({"x": [4096, 3072]}, [{"id": "s", "op": "reduce_sum", "args": ["x"], "axes": [0],
                                            "keepdims": True}], ["s"])
    plan = make_plan(g)
    return legal_space(g, plan, DEV), plan


def _study() -> optuna.Study:
    return optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))


def _run(study: optuna.Study, space: Any, n: int) -> list[Any]:
    out = []
    for _ in range(n):
        t = study.ask()
        out.append(space.suggest(t))
        study.tell(t, 1.0)
    return out


def test_a_study_created_before_version_6_resumes_with_the_draws_of_5() -> None:
    today, _ = _space()
    old = today.as_of("5")
    study = _study()
    _run(study, old, 6)                      # what a version-5 search left behind: no space_version attr
    assert "space_version" not in study.user_attrs
    version = study_space_version(study, today.version)
    assert version == UNRECORDED_STUDY_VERSION == "5" and study.user_attrs["space_version"] == "5"
    resumed = today.as_of(version)
    assert resumed.domains["min_blocks"] == [0, 1, 2, 4]
    assert all(s.min_blocks != 3 for s in _run(study, resumed, 30))   # resumes; 3 stays undrawn there
    with pytest.raises(ValueError, match="dynamic value space"):    # today's choices: optuna refuses them
        _run(study, today, 20)


def test_a_new_study_records_version_6_and_draws_3() -> None:
    today, _ = _space()
    study = _study()
    assert study_space_version(study, today.version) == "6" == study.user_attrs["space_version"]
    space = today.as_of(study_space_version(study, today.version))
    assert space is today
    assert 3 in {s.min_blocks for s in _run(study, space, 60)}


def test_records_of_version_5_are_legal_in_6() -> None:
    """Every point of 5 is a point of 6 (selection re-validates records of ``compatible_versions``)."""
    today, _ = _space()
    old = today.as_of("5")
    rng = random.Random(4)
    points = [old.sample(rng) for _ in range(20)]
    assert "5" in today.compatible_versions and not any(today.violations(s) for s in points)
    assert old.legal_values("min_blocks") == today.legal_values("min_blocks")


def test_the_pinned_heuristic_is_queued_in_a_resumed_study_of_either_version() -> None:
    today, plan = _space()
    h = heuristic_schedule(plan, DEV, today)
    assert h.min_blocks == 3
    for space in (today.as_of("5"), today):
        study = _study()
        _run(study, space, 3)
        study.enqueue_trial(space.params_of(h))
        assert _run(study, space, 1) == [h]


# ------------------------------------------------------------------------------ the loop (fake stages)
def _cfg(tmp_path: Any, **kw: Any) -> SearchConfig:
    base = {"graph_path": "fake.json", "trials": 4, "backend": "emulate", "db": str(tmp_path / "db"),
            "sampler": "random", "seed": 1, "jobs": 1, "progress": False, "prune_factor": 100.0}
    return SearchConfig(**{**base, **kw})


def _heuristic_trials(tmp_path: Any, name: str) -> list[str]:
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "db" / "optuna.journal")))
    study = optuna.load_study(study_name=name, storage=storage)
    return [t.user_attrs["schedule_key"] for t in study.trials if t.user_attrs.get("heuristic")]


def test_a_resumed_search_queues_todays_heuristic_once(tmp_path: Any) -> None:
    then = dataclasses.replace(fake_components(FakeRunner()), heuristic_schedule=lambda p, d: FakeSchedule(256, 2))
    res = run_search(_cfg(tmp_path), then)
    assert _heuristic_trials(tmp_path, res.study_name) == ["b256-v2"]
    run_search(_cfg(tmp_path), fake_components(FakeRunner()))          # today's heuristic: b128-v4
    assert _heuristic_trials(tmp_path, res.study_name) == ["b256-v2", "b128-v4"]
    run_search(_cfg(tmp_path), fake_components(FakeRunner()))          # tried already: not queued again
    assert _heuristic_trials(tmp_path, res.study_name) == ["b256-v2", "b128-v4"]


def test_the_loop_draws_as_the_study_s_version(tmp_path: Any) -> None:
    seen: list[str] = []

    class Versioned(FakeSpace):
        def as_of(self, version: str) -> FakeSpace:
            seen.append(version)
            return self

    comp = dataclasses.replace(fake_components(FakeRunner()), space_for_plan=lambda p, d: Versioned())
    res = run_search(_cfg(tmp_path), comp)
    assert seen == [FakeSpace.version]                   # a new study: today's version, recorded
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "db" / "optuna.journal")))
    study = optuna.load_study(study_name=res.study_name, storage=storage)
    assert study.user_attrs["space_version"] == FakeSpace.version
    run_search(_cfg(tmp_path), comp)
    assert seen == [FakeSpace.version] * 2


# ------------------------------------------------------------------------------ two workers, one new study
def test_a_second_worker_that_missed_the_first_ones_attr_draws_as_it_does() -> None:
    """Two workers open one new study: the first records ``space_version`` 6 and queues the heuristic (and may have
    drawn it); the second read the study's attrs before that and lists the trials after. Such trials were made
    today, not by a version-5 search: calling the study version 5 would draw ``min_blocks`` over 0/1/2/4 beside the
    first worker's 0/1/2/3/4 and optuna refuses the second ("dynamic value space")."""
    today, plan = _space()
    h = heuristic_schedule(plan, DEV, today)
    queued = _study()
    queued.enqueue_trial(today.params_of(h), user_attrs={"heuristic": True})   # worker 1: queued, not asked yet
    assert study_space_version(queued, today.version) == "6"
    drawn = _study()
    _run(drawn, today, 3)                                                      # worker 1: already drew as 6
    version = study_space_version(drawn, today.version)
    assert version == "6"
    _run(drawn, today.as_of(version), 10)                                      # worker 2 draws beside it


def test_a_study_whose_trials_drew_nothing_yet_draws_as_today() -> None:
    """Trials that hold no parameter (failed before their first draw) pin no domain: today's draws are safe."""
    today, _ = _space()
    study = _study()
    for _ in range(2):
        t = study.ask()
        study.tell(t, state=optuna.trial.TrialState.FAIL)
    assert study_space_version(study, today.version) == "6"
    assert 3 in {s.min_blocks for s in _run(study, today, 60)}


def test_a_version_5_study_that_measured_the_pinned_heuristic_still_resumes_as_5() -> None:
    """A version-5 study asked the heuristic's undrawn 3 under ``min_blocks_all_b<block>`` (today's legal values,
    3 among them): that parameter decides nothing; its other trials' 0/1/2/4 make it a version-5 study. A study
    whose only draw is that pin draws as today (no parameter of today's draws was drawn otherwise)."""
    today, plan = _space()
    old = today.as_of("5")
    h = heuristic_schedule(plan, DEV, today)
    pinned_only = _study()
    pinned_only.enqueue_trial(old.params_of(h), user_attrs={"heuristic": True})
    assert _run(pinned_only, old, 1) == [h]
    assert study_space_version(pinned_only, today.version) == "6"
    _run(pinned_only, today, 20)
    study = _study()
    study.enqueue_trial(old.params_of(h), user_attrs={"heuristic": True})
    _run(study, old, 8)
    assert study_space_version(study, today.version) == "5"
    _run(study, today.as_of("5"), 20)


@pytest.mark.parametrize("recorded", ["7", "12", "six", ""])
def test_a_study_of_a_newer_or_unreadable_space_version_is_a_clear_error(recorded: str) -> None:
    """A worker of an older stitchtune joining a study another release created (a shared PostgreSQL storage) would
    draw its own choices beside the newer ones, and optuna refuses that mid-search with a traceback; a bad attr
    would fail inside the space file's reader. Both are refused up front, naming the study's version."""
    from stitchtune.errors import DatabaseError

    today, _ = _space()
    study = _study()
    study.set_user_attr("space_version", recorded)
    with pytest.raises(DatabaseError, match="space version"):
        study_space_version(study, today.version)
