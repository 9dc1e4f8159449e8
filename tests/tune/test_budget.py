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
