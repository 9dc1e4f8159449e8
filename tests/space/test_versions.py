"""What an earlier space version drew (``params.<name>.before``, ``SearchSpace.as_of``): the entry of the smallest
version above the one asked; only what is drawn changes, never what is legal."""

from __future__ import annotations

import copy

import pytest

from helpers.lowering import DEV, setup
from stitchtune.errors import StitchtuneError
from stitchtune.lower.resources import legal_space
from stitchtune.space import SearchSpace, load_space_file
from stitchtune.space.space_file import params_as_of


def _data(before: dict) -> dict:
    data = copy.deepcopy(load_space_file())
    data["params"]["min_blocks"] = {"choices": [0, 1, 2, 3, 4], "before": before}
    return data


def test_the_entry_of_the_smallest_later_version_applies() -> None:
    data = _data({"6": {"choices": [0, 1, 2, 4], "undrawn": [3]}, "3": {"choices": [0, 1, 2, 3, 4]}})
    assert params_as_of(data, "2")["min_blocks"]["choices"] == [0, 1, 2, 3, 4]     # the entry of 3
    assert params_as_of(data, "3")["min_blocks"] == {"choices": [0, 1, 2, 4], "undrawn": [3]}
    assert params_as_of(data, "5")["min_blocks"]["undrawn"] == [3]
    assert params_as_of(data, "6") is data["params"] and params_as_of(data, "9") is data["params"]


@pytest.mark.parametrize("entry", [[0, 1], {"undrawn": [3]}, {"choices": 3}])
def test_a_malformed_entry_is_refused(entry: object) -> None:
    with pytest.raises(StitchtuneError, match="params.min_blocks.before"):
        params_as_of(_data({"6": entry}), "5")


def test_an_entry_is_kept_to_today_s_legal_values() -> None:
    """A file (or a test) that narrows a domain narrows what every earlier version drew."""
    data = _data({"6": {"choices": [0, 1, 2, 4], "undrawn": [3]}})
    data["params"]["min_blocks"]["choices"] = [0, 2, 3]
    assert params_as_of(data, "5")["min_blocks"] == {"choices": [0, 2], "undrawn": [3]}


def test_a_version_that_is_no_number_is_refused() -> None:
    with pytest.raises(StitchtuneError, match="not a whole number"):
        params_as_of(_data({"six": {"choices": [0, 1, 2, 3, 4]}}), "5")


def test_as_of_keeps_the_space_s_rules_and_modes() -> None:
    g, plan, bare = setup("layernorm_small.json")
    space = legal_space(g, plan, DEV).deterministic_only().flat_mode()
    old = space.as_of("5")
    assert old.resources is space.resources and old.flat and old.deterministic
    assert old.domains["min_blocks"] == [0, 1, 2, 4] and old.undrawn == {"min_blocks": [3]}
    assert {k: v for k, v in old.domains.items() if k != "min_blocks"} == \
        {k: v for k, v in space.domains.items() if k != "min_blocks"}
    assert old.version == space.version == "6" and old.drawn_as == "5" and space.drawn_as == "6"
    assert old.as_of("6").domains["min_blocks"] == [0, 1, 2, 3, 4]   # from the file's data, not the copy's
    assert isinstance(bare, SearchSpace) and bare.as_of("6") is bare
