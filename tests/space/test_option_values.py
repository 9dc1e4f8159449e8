"""The options that are names (``order``, ``combine``, ``cross_combine``) as enums
(:mod:`stitchtune.space.option_values`): a schedule stores members, its typed read is the enum, and
everything on disk (JSON, key, database columns) is the plain string it was before."""

from __future__ import annotations

import copy
import json
from enum import StrEnum

import pytest

from helpers.lowering import DEV, setup
from stitchtune.errors import ScheduleError, StitchtuneError
from stitchtune.space import (COMBINE, CROSS_COMBINE, OPTIONS, ORDER, Combine, CrossCombine, Order, Schedule,
                              SearchSpace, load_space_file)
from stitchtune.tune.pipeline import schedule_columns

CORE = (64, 128, 2, 2, 0, 0, ("regional", "regional"), ("global", "register"))
ENUM_OPTIONS = [(ORDER, Order), (COMBINE, Combine), (CROSS_COMBINE, CrossCombine)]


@pytest.mark.parametrize(("opt", "enum"), ENUM_OPTIONS, ids=[o.name for o, _ in ENUM_OPTIONS])
def test_an_option_that_is_a_name_is_stored_and_read_as_its_enum(opt, enum) -> None:  # type: ignore[no-untyped-def]
    assert type(opt.default) is enum and opt.decode is enum
    for member in enum:
        from_str, from_member = Schedule(*CORE, **{opt.name: str(member)}), Schedule(*CORE, **{opt.name: member})
        assert from_str == from_member and hash(from_str) == hash(from_member)
        assert type(from_str.option(opt)) is enum and from_str.option(opt) is member


@pytest.mark.parametrize(("opt", "enum"), ENUM_OPTIONS, ids=[o.name for o, _ in ENUM_OPTIONS])
def test_the_json_key_and_columns_hold_the_plain_strings(opt, enum) -> None:  # type: ignore[no-untyped-def]
    for member in enum:
        s = Schedule(*CORE, **{opt.name: member})
        d = s.to_dict()
        if member != opt.default:
            assert type(d[opt.name]) is str and d[opt.name] == member.value
            assert f'"{opt.name}":"{member.value}"' in s.to_json()
        assert type(s.flat()[opt.name]) is str
        assert type(schedule_columns(s)[f"p_{opt.name}"]) is str
        assert Schedule.from_json(s.to_json()) == s


def test_schedule_keys_are_those_of_the_plain_strings() -> None:
    # the key hashes the canonical JSON: these are the keys of before the enums (recorded with str options)
    assert Schedule(*CORE, order="alternate", combine="warp").to_json() == (
        '{"block":128,"combine":"warp","min_blocks":0,"order":"alternate","reuse":["global","register"],'
        '"schemes":["regional","regional"],"split":2,"tasks_per_block":0,"tpr":64,"vec":2}')
    assert Schedule(*CORE, order=Order.ALTERNATE, combine=Combine.WARP).key() == "ca7647dc7015223b"


def test_a_value_that_is_no_member_is_refused() -> None:
    with pytest.raises(ValueError, match="'sideways' is not a valid Order"):
        Schedule(*CORE, order="sideways")
    with pytest.raises(ScheduleError, match="'shared' is not a valid CrossCombine"):
        Schedule.from_dict({**Schedule(*CORE).to_dict(), "cross_combine": "shared"})


def test_a_space_file_offering_an_unknown_value_is_refused() -> None:
    _, plan, _ = setup("layernorm_small.json")
    data = copy.deepcopy(load_space_file())
    data["params"]["combine"]["choices"] = ["thread", "warp", "lane"]
    with pytest.raises(StitchtuneError, match=r"'combine' offers unknown value\(s\) \['lane'\]"):
        SearchSpace(plan, DEV, data, OPTIONS)
    assert json.dumps(load_space_file()["params"]["order"]["choices"]) == '["forward", "alternate"]'


def test_every_enum_option_of_the_table_is_a_str_enum() -> None:
    named = {o.name for o in OPTIONS if isinstance(o.default, str)}
    assert named == {o.name for o, _ in ENUM_OPTIONS}
    assert all(isinstance(o.default, StrEnum) for o in OPTIONS if o.name in named)
