"""split_by_share: a trial budget split over searches adds up exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stitchtune.tune.budget import split_by_share


def test_the_dynamic_example_adds_up_to_the_budget() -> None:
    shares = [1, 1, 2, 4, 8, 16, 32, 64]  # doubling buckets of a dynamic dim (1..128 and similar)
    got = split_by_share(shares, 64)
    assert sum(got) == 64 and min(got) == 1 and got[-1] == max(got)


def test_fewer_trials_than_shares_leave_the_smallest_at_zero() -> None:
    assert split_by_share([0.1, 0.2, 0.3, 0.4], 2) == [0, 0, 1, 1]


def test_ties_and_zero_weights() -> None:
    assert split_by_share([1, 1, 1], 4) == [2, 1, 1]     # the leftover to the earlier of equal remainders
    assert split_by_share([0, 0], 3) == [2, 1]            # all zero: equal weights
    assert split_by_share([], 5) == [] and split_by_share([1, 2], 0) == [0, 0]


def test_bad_shares_are_refused() -> None:
    with pytest.raises(ValueError):
        split_by_share([1.0, float("nan")], 4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=30), st.integers(0, 500))
def test_always_exactly_the_total(shares: list[float], total: int) -> None:
    got = split_by_share(shares, total)
    assert sum(got) == total and min(got) >= 0
    if total >= len(shares):
        assert min(got) >= 1


# ------------------------------------------------------------------ what the regions of `tune` are weighed by
def test_predicted_gain_is_the_heuristic_against_the_best_point_tried() -> None:
    """logsoftmax_small's heuristic (chosen for long rows) is predicted well above the best point tried; bias_gelu_small's
    is the best tried (its floor, as the model sees it). Seeded: the same call gives the same figures. The points
    predicted under half the heuristic's time are rare (4 of 300 seeded samples of space version 6): ``SAMPLES``
    (24) finds them for some seeds only (seed 0 did under version 5's draws, not under 6's), so the test asks for
    300 samples: what it checks is the arithmetic of the gain, not the luck of 24 draws."""
    from stitchtune.cost.fitted import predict_program
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.graph.parse import load_graph
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan
    from stitchtune.tune.budget import predicted_gain

    dev = get_device("h200")
    g = load_graph("examples/logsoftmax_small.json")
    gain = predicted_gain(g, dev, samples=300)
    plan = make_plan(g)
    space = legal_space(g, plan, dev)
    heur = predict_program(lower(g, plan, heuristic_schedule(plan, dev, space), dev, space), dev).time_us
    assert gain.heuristic_us == pytest.approx(heur) and gain.points > 10
    assert gain.best_us < 0.8 * gain.heuristic_us and gain.gain_us == pytest.approx(gain.heuristic_us - gain.best_us)
    assert predicted_gain(g, dev, samples=300) == gain
    flat = predicted_gain(load_graph("examples/bias_gelu_small.json"), dev)
    assert flat.gain_us == 0.0 and flat.best_us == flat.heuristic_us


def test_a_region_at_its_floor_weighs_a_tenth_of_its_time() -> None:
    from stitchtune.tune.budget import UNCERTAINTY, PredictedGain, gain_weight

    at_floor = PredictedGain(heuristic_us=100.0, best_us=100.0, points=30)
    half = PredictedGain(heuristic_us=50.0, best_us=25.0, points=30)
    assert UNCERTAINTY == 0.1
    assert gain_weight(at_floor, 1) == pytest.approx(10.0)            # twice the time, a third of the weight
    assert gain_weight(half, 1) == pytest.approx(25.0 + 5.0) and gain_weight(half, 4) == pytest.approx(120.0)
    assert split_by_share([gain_weight(at_floor, 1), gain_weight(half, 1)], 40) == [10, 30]
    assert gain_weight(PredictedGain(float("inf"), float("inf"), 0), 1) == 0.0
