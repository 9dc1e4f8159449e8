"""Properties of the space over drawn points: every sampled schedule survives its JSON round trip
(equal, same hash and key) and its ``params_of`` replays through a trial to the same schedule, with
every recorded parameter asked once, in order, from its domain (define-by-run and flat mode); any
point built from the domains, legal or not, round-trips through JSON."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.lowering import setup
from stitchtune.space import OPTIONS, Schedule, SearchSpace

NAMES = ["layernorm_small.json", "layernorm_wide_small.json", "softmax_tiny_rows_small.json",
         "colsum_sigmoid_scale_small.json", "bias_gelu_small.json", "rmsnorm_small.json"]
_SPACES: dict[str, SearchSpace] = {}
PROPERTY = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _space(name: str) -> SearchSpace:
    if name not in _SPACES:
        _SPACES[name] = setup(name)[2]
    return _SPACES[name]


class ReplayTrial:
    """A stand-in optuna trial that answers from recorded parameters and checks how it is asked."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params
        self.asked: list[str] = []

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        assert name not in self.asked, f"{name!r} asked twice"
        assert self.params[name] in choices, (name, self.params[name], choices)
        self.asked.append(name)
        return self.params[name]


@PROPERTY
@given(name=st.sampled_from(NAMES), seed=st.integers(0, 2**32 - 1))
def test_sampled_points_round_trip_through_json_and_replay_through_a_trial(name: str, seed: int) -> None:
    space = _space(name)
    s = space.sample(random.Random(seed))
    back = Schedule.from_json(s.to_json())
    assert back == s and hash(back) == hash(s) and back.key() == s.key() and back.to_json() == s.to_json()
    for sp in (space, space.flat_mode()):
        params = sp.params_of(s)
        trial = ReplayTrial(params)
        assert sp.suggest(trial) == s
        assert trial.asked == list(params)


def _values(space: SearchSpace, key: str) -> st.SearchStrategy[Any]:
    return st.sampled_from(space.domains[key])


@st.composite
def _any_point(draw: st.DrawFn) -> Schedule:
    space = _space(draw(st.sampled_from(NAMES)))
    plan = space.plan
    core = [draw(_values(space, k)) for k in ("tpr", "block", "split", "vec", "tasks_per_block", "min_blocks")]
    schemes = tuple(draw(_values(space, "scheme")) for _ in range(plan.nstages))
    reuse = tuple(draw(_values(space, "reuse")) for _ in plan.reuse_candidates)
    options = {opt.name: draw(_values(space, opt.name)) for opt in OPTIONS}
    return Schedule(*core, schemes, reuse, options)


@PROPERTY
@given(s=_any_point())
def test_any_point_round_trips_through_json(s: Schedule) -> None:
    back = Schedule.from_json(s.to_json())
    assert back == s and back.key() == s.key()
    assert Schedule.from_dict(s.to_dict()) == s
    assert all(s.option(opt) == back.option(opt) for opt in OPTIONS)
    assert {k for k in s.to_dict() if k in OPTIONS} == {opt.name for opt in OPTIONS if s.option(opt) != opt.default}
