"""An undrawn value (``min_blocks`` 3 in space version 5, and in studies created before 6, which resume with 5's
draws: ``SearchSpace.as_of``) is never the result of a fresh trial, flat mode included.

Flat mode repairs ``min_blocks x block`` above the SM's threads by stepping ``min_blocks`` down. On an SM of
1536 threads (the L4 preset, cc 8.9) a fresh flat trial of ``block`` 512 and ``min_blocks`` 4 stepped down the
legal values, undrawn 3 included, to 3: a value the space says is never drawn, and not the point version 4 gave
the same parameters (2). Only a trial that asks ``min_blocks_all`` (the undrawn value fixed) steps through them.

Flat mode is for samplers that model a fixed parameter set (GP, CMA-ES: the intersection of the parameters of
the study's trials). A heuristic trial of ``min_blocks`` 3 (trial 0, enqueued) that asked ``min_blocks_all``
*instead of* ``min_blocks`` dropped ``min_blocks`` from that set for the whole study: every later trial drew it
at random. It now asks both (``min_blocks`` at the nearest drawn value, 4).
"""

from __future__ import annotations

import optuna
from optuna.search_space import IntersectionSearchSpace

from helpers.common import EXAMPLES
from stitchtune.graph.parse import load_graph
from stitchtune.hardware.device import get_device
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

L4 = get_device("L4")


def _flat_space() -> SearchSpace:
    """Flat mode as a study created before space version 6 draws (3 undrawn; since 6 it is drawn)."""
    plan = make_plan(load_graph(EXAMPLES / "layernorm_small.json"))
    return SearchSpace.for_plan(plan, L4).as_of("5").flat_mode()


def _suggest(space: SearchSpace, params: dict) -> int:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial(params)
    return space.suggest(study.ask()).min_blocks


def test_a_fresh_flat_trial_never_repairs_to_an_undrawn_value() -> None:
    space = _flat_space()
    assert L4.max_threads_per_sm == 1536 and 3 in space.legal_values("min_blocks")
    params = {"tpr": 512, "block": 512, "split": 1, "min_blocks": 4}
    got = _suggest(space, params)
    assert got in space.domains["min_blocks"] and got * 512 <= 1536, got   # 2, as in space version 4


def test_a_trial_asking_the_undrawn_name_keeps_it() -> None:
    space = _flat_space()
    assert _suggest(space, {"tpr": 512, "block": 512, "split": 1, "min_blocks_all": 3}) == 3


def test_a_heuristic_trial_with_an_undrawn_value_keeps_min_blocks_in_the_flat_parameter_set() -> None:
    space = _flat_space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial({"tpr": 512, "block": 512, "split": 1, "min_blocks_all": 3})
    s = space.suggest(study.ask())
    assert s.min_blocks == 3
    heuristic = space.params_of(s)   # how a search enqueues its heuristic (trial 0)
    assert heuristic["min_blocks_all"] == 3 and heuristic["min_blocks"] == 4, heuristic
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial(heuristic)
    for _ in range(4):
        t = study.ask()
        space.suggest(t)
        study.tell(t, 1.0)
    assert study.trials[0].params["min_blocks_all"] == 3
    assert "min_blocks" in IntersectionSearchSpace().calculate(study), study.trials[0].params
