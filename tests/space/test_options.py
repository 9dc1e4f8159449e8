"""The option table (``stitchtune.space.options``): every option checked from its declaration, and an
extra option declared only in a test-local table and space file, seen flowing through suggest, flat
mode, sample, validation, derived budgets, variants, grid and JSON without any other code knowing it."""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import pickle
import random
from typing import Any

import optuna
import pytest

from helpers.graphs import head_merge_colsum
from helpers.lowering import DEV, setup
from stitchtune.plan.planner import make_plan
from stitchtune.errors import StitchtuneError
from stitchtune.space import OPTIONS, RESERVED, Option, OptionTable, Schedule, SearchSpace, load_space_file
from stitchtune.space.options import ORDER, flag
from stitchtune.space.schedule import ScheduleError

HEAD_MERGE = "head_merge_colsum (tests/helpers/graphs.py)"
SPACES = ["layernorm_small.json", "layernorm_wide_small.json", "softmax_small.json",
          "colsum_sigmoid_scale_small.json", "bias_gelu_small.json", "softmax_colsum_small.json",
          "k_transpose_small.json", HEAD_MERGE]
N = 60


def _space_of(name: str) -> SearchSpace:
    """The H200 space of example ``name``, or of :data:`HEAD_MERGE` (a column sum of an input read along its
    rows, built here: no example has row vectors)."""
    if name == HEAD_MERGE:
        plan = make_plan(head_merge_colsum(B=2, H=2, D=8, S=128, second=True))
        return SearchSpace.for_plan(plan, DEV)
    return setup(name)[2]


class FakeTrial:
    """Answers ``suggest_categorical`` from fixed parameters, checking each value is in its domain and
    recording the names in the order they are asked."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params
        self.asked: list[str] = []

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        assert name in self.params, f"asked {name!r}, which was not recorded"
        assert self.params[name] in choices, (name, self.params[name], choices)
        self.asked.append(name)
        return self.params[name]


_SAMPLES: dict[str, tuple[SearchSpace, list[Schedule]]] = {}


def _samples(name: str) -> tuple[SearchSpace, list[Schedule]]:
    if name not in _SAMPLES:
        space = _space_of(name)
        _SAMPLES[name] = (space, [space.sample(random.Random(i)) for i in range(N)])
    return _SAMPLES[name]


def _with(s: Schedule, **changes: Any) -> Schedule:
    return dataclasses.replace(s, **changes)


def _points(name: str, opt: Option) -> tuple[SearchSpace, list[Schedule]]:
    """The seeded samples of ``name``; for an option that sampling never draws (``drawn=False``) also
    each sample with the option switched to its other values where that is legal."""
    space, samples = _samples(name)
    if opt.drawn:
        return space, samples
    switched = [_with(s, **{opt.name: v}) for s in samples for v in space.domains[opt.name] if v != opt.default]
    return space, samples + [x for x in switched if not space.violations(x)]


@pytest.mark.parametrize("opt", list(OPTIONS), ids=OPTIONS.names)
def test_option_is_left_out_of_the_json_at_its_default(opt: Option) -> None:
    seen_other = False
    for name in SPACES:
        space, samples = _points(name, opt)
        for s in samples:
            value = s.option(opt)
            assert (opt.name in s.to_dict()) == (value != opt.default)
            seen_other |= value != opt.default
            spelt = {**s.to_dict(), opt.name: opt.default}
            assert Schedule.from_dict(spelt) == _with(s, **{opt.name: opt.default})
            assert json.loads(_with(s, **{opt.name: opt.default}).to_json()).get(opt.name) is None
    assert seen_other, f"no sample has {opt.name} at another value than {opt.default!r}"


@pytest.mark.parametrize("opt", list(OPTIONS), ids=OPTIONS.names)
def test_option_applies_only_where_its_rule_holds(opt: Option) -> None:
    applied = 0
    for name in SPACES:
        space, samples = _samples(name)
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
        for _ in range(N):
            t = study.ask()
            s = space.suggest(t)
            point = space._point(s)
            forced = opt.fixed(point) if opt.applies(point) else None
            assert (opt.name in t.params) == (opt.applies(point) and opt.drawn and forced is None), (name, s)
            if forced is not None:  # a forced value is no parameter (cluster: the split)
                assert s.option(opt) == forced
            applied += opt.name in t.params or forced is not None
            study.tell(t, 1.0)
            if not opt.drawn and opt.applies(point):  # asked by a trial that fixes it (an enqueued point)
                other = _with(s, **{opt.name: next(v for v in space.domains[opt.name] if v != opt.default)})
                study.enqueue_trial(space.params_of(other))
                t = study.ask()
                assert space.suggest(t) == other and opt.name in t.params
                applied += 1
                study.tell(t, 1.0)
        for s in samples:
            point = space._point(s)
            if not opt.applies(point):
                assert s.option(opt) == opt.default
                for other in space.domains[opt.name]:
                    if other != opt.default:  # a value where the option does not apply is illegal
                        assert space.violations(_with(s, **{opt.name: other}))
    assert applied, f"{opt.name} was never a parameter"


@pytest.mark.parametrize("opt", list(OPTIONS), ids=OPTIONS.names)
def test_flat_repair_keeps_a_legal_point(opt: Option) -> None:
    kept = 0
    for name in SPACES:
        space, samples = _points(name, opt)
        flat = space.flat_mode()
        for s in samples:
            params = flat.params_of(s)
            assert (opt.name in params) == (opt.flat_asks(space._core_point(
                s.tpr, s.block, s.split, s.vec, s.tasks_per_block, s.min_blocks, s.schemes, s.reuse))
                and (opt.drawn or s.option(opt) != opt.default))
            if opt.drawn or s.option(opt) == opt.default:
                assert flat.suggest(FakeTrial(params)) == s
            else:  # asked only by a trial that fixes it: an enqueued optuna trial
                study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
                study.enqueue_trial(params)
                assert flat.suggest(study.ask()) == s
            kept += s.option(opt) != opt.default
    assert kept, f"no legal sample with {opt.name} off its default went through the repair"


@pytest.mark.parametrize("opt", list(OPTIONS), ids=OPTIONS.names)
def test_variants_flip_the_option(opt: Option) -> None:
    flipped = 0
    for name in SPACES:
        space, samples = _points(name, opt)
        for s in samples:
            vs = space.variants(s)
            for v in vs:  # each variant changes one option (and the options it resets) only
                changed = {o.name for o in OPTIONS if v.option(o) != s.option(o)}
                assert len(changed) >= 1 and (v.to_dict() | {n: 0 for n in changed}) == (
                    s.to_dict() | {n: 0 for n in changed}) and not space.violations(v)
            if not opt.vary:  # never varied (cluster: its value is tied to the split)
                assert all(v.option(opt) == s.option(opt) for v in vs)
                flipped += 1
                continue
            for other in space.domains[opt.name]:
                if other == s.option(opt):
                    continue
                cand = _with(s, **{r: OPTIONS[r].default for r in opt.vary_resets}, **{opt.name: other})
                if cand != s and not space.violations(cand):
                    assert cand in vs, (name, s, opt.name, other)
                    flipped += 1
    assert flipped, f"no variant flipped {opt.name}"


# ---------------------------------------------------------------------------------------------------
# an option declared only here
# ---------------------------------------------------------------------------------------------------

def _unroll_applies(p: Any) -> bool:
    return p["family"] == "row" and p["split"] == 1


UNROLL: Option[int] = Option(
    "unroll", 1, int, _unroll_applies, "family == 'row' and split == 1", lambda p: p["family"] == "row",
    derive=lambda p: {"unrolled": p["unroll"] > 1},
    registers=lambda n: (n["unroll"] - 1) * n["vec"] if n["family"] == "row" else 0)
TABLE = OPTIONS.extended(UNROLL)


def _extra_space(name: str) -> SearchSpace:
    data = copy.deepcopy(load_space_file())
    data["params"]["unroll"] = {"choices": [1, 2, 4]}
    data["constraints"].append({"expr": "not unrolled or unroll * vec <= 8", "reason": "unrolled accesses too wide"})
    _, plan, _ = setup(name)
    return SearchSpace(plan, DEV, data, TABLE)


def test_an_extra_option_flows_through_suggest_and_params_of() -> None:
    space = _extra_space("layernorm_small.json")
    base = setup("layernorm_small.json")[2]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    values = set()
    for _ in range(80):
        t = study.ask()
        s = space.suggest(t)
        names = list(t.params)
        assert ("unroll" in names) == (s.split == 1)  # a parameter exactly where it applies ...
        if "unroll" in names:
            assert names[-1] == "unroll" and t.distributions["unroll"].choices == (1, 2, 4)  # ... asked last
        assert space.params_of(s) == t.params
        d = s.to_dict()
        if "unroll" in d:   # the default table does not know the key: an error, never read as something else
            with pytest.raises(ScheduleError, match="unknown key 'unroll'"):
                Schedule.from_dict(d)
        without = Schedule.from_dict({k: v for k, v in d.items() if k != "unroll"})
        assert [n for n in names if n != "unroll"] == list(base.params_of(without))  # the others as before
        values.add(s.option(UNROLL))
        study.tell(t, 1.0)
    assert values == {1, 2, 4}
    flat = space.flat_mode()
    t = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=6)).ask()
    s = flat.suggest(t)
    assert "unroll" in t.params and flat.suggest(FakeTrial(flat.params_of(s))) == s
    assert s.option(UNROLL) == (t.params["unroll"] if s.split == 1 else 1)  # kept only where it applies


def test_an_extra_option_flows_through_sample_validation_and_variants() -> None:
    space = _extra_space("layernorm_small.json")
    samples = [space.sample(random.Random(i)) for i in range(60)]
    assert {s.option(UNROLL) for s in samples} == {1, 2, 4}
    assert all(s.option(UNROLL) == 1 for s in samples if s.split > 1)
    s = next(s for s in samples if s.split == 1 and s.option(UNROLL) == 1 and s.vec == 4
             and not space.violations(_with(s, unroll=2)))
    assert any("unroll=3 not in [1, 2, 4]" in v for v in space.violations(_with(s, unroll=3)))
    assert any("unrolled accesses too wide" in v for v in space.violations(_with(s, unroll=4)))
    assert space.derived(_with(s, unroll=2))["reg_cache_elems"] == space.derived(s)["reg_cache_elems"] + 4
    assert space.derived(_with(s, unroll=2))["unrolled"] and not space.derived(s)["unrolled"]
    assert _with(s, unroll=2) in space.variants(s)
    split = next(x for x in samples if x.split > 1)
    assert any("option unroll=2 where it does not apply (only where family == 'row' and split == 1)" in v
               for v in space.violations(_with(split, unroll=2)))
    assert _with(split, unroll=2) not in space.variants(split)
    # a schedule of a space that does not declare the option is refused, not silently read
    base = setup("layernorm_small.json")[2]
    assert any("option unroll=2 is not declared" in v for v in base.violations(_with(s, unroll=2)))


def test_an_extra_option_flows_through_json_and_the_grid() -> None:
    s = Schedule(64, 128, 1, 2, 0, 0, ("regional", "regional"), ("global", "register"), table=TABLE, unroll=2)
    assert s.option(UNROLL) == 2 and s.option(UNROLL) == 2 and s.option(ORDER) == "forward"
    assert json.loads(s.to_json())["unroll"] == 2 and s.flat()["unroll"] == 2
    assert Schedule.from_json(s.to_json(), TABLE) == s
    at_default = _with(s, unroll=1)
    plain = Schedule(64, 128, 1, 2, 0, 0, ("regional", "regional"), ("global", "register"))
    assert "unroll" not in at_default.to_dict() and at_default == plain and at_default.key() == plain.key()
    with pytest.raises(KeyError):
        plain.option(UNROLL)  # the default table does not declare it
    with pytest.raises(TypeError, match="unknown schedule option 'unroll'"):
        Schedule(64, 128, 1, 2, 0, 0, ("regional",), ("global",), unroll=2)
    space = _extra_space("layernorm_small.json")
    for k, v in {"tpr": [64], "block": [128], "split": [1, 2], "vec": [2], "tasks_per_block": [0],
                 "min_blocks": [0], "single_pass": [0]}.items():  # (single_pass pinned: half the grid)
        space.domains[k] = v
    grid = space.grid()
    assert {g.option(UNROLL) for g in grid if g.split == 1} == {1, 2, 4}
    assert {g.option(UNROLL) for g in grid if g.split > 1} <= {1}
    assert all(not space.violations(g) for g in grid) and len(set(grid)) == len(grid)


# ---------------------------------------------------------------------------------------------------
# the table's own rules
# ---------------------------------------------------------------------------------------------------

def test_reserved_names_cover_the_schedule_attributes() -> None:
    public = {n for n in dir(Schedule) if not n.startswith("_")} | {f.name for f in dataclasses.fields(Schedule)}
    assert public <= RESERVED


@pytest.mark.parametrize("name", ["tpr", "key", "options", "table", "scheme_0", "reuse_x", "_hidden", "not-ident",
                                  "order"])
def test_a_bad_or_repeated_option_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="reserved, repeated or not an identifier"):
        OPTIONS.extended(dataclasses.replace(UNROLL, name=name))


def test_a_reset_of_an_undeclared_option_is_refused() -> None:
    with pytest.raises(ValueError, match="undeclared option 'nothing'"):
        OPTIONS.extended(dataclasses.replace(UNROLL, vary_resets=("nothing",)))


def test_an_option_needs_a_domain_holding_its_default() -> None:
    _, plan, _ = setup("layernorm_small.json")
    with pytest.raises(StitchtuneError, match="params.unroll.choices"):
        SearchSpace(plan, DEV, load_space_file(), TABLE)
    data = copy.deepcopy(load_space_file())
    data["params"]["unroll"] = {"choices": [2, 4]}
    with pytest.raises(StitchtuneError, match="holds its default 1"):
        SearchSpace(plan, DEV, data, TABLE)


def test_every_option_reads_as_its_declared_type() -> None:
    """``s.option(OPT)`` gives a value of the declaration's type (``Option[int]``: an int, never a bool or
    a string; ``Option[bool]``, a 0/1 flag: a bool, 0 / 1 in JSON; ``Option[Order]``: the enum member), at
    the default, given as its JSON form, and decoded from JSON."""
    core = (64, 128, 2, 2, 0, 0, ("regional", "regional"), ("global", "register"))
    flags = set()
    for opt in OPTIONS:
        kind = type(opt.default)
        assert kind in (int, bool) or issubclass(kind, enum.StrEnum), opt.name
        assert opt.decode is {int: int, bool: flag}.get(kind, kind), opt.name
        assert type(Schedule(*core).option(opt)) is kind
        other = next(v for v in ([1, 2] if kind is int else [False, True] if kind is bool else list(kind)) if v != opt.default)
        given = Schedule(*core, **{opt.name: int(other) if kind is bool else other})   # a flag given as 1
        s = Schedule.from_json(given.to_json())
        assert type(given.option(opt)) is kind and type(s.option(opt)) is kind and s.option(opt) == other, opt.name
        if kind is bool:
            flags.add(opt.name)
            assert json.loads(s.to_json())[opt.name] == 1 and s.flat()[opt.name] == 1, opt.name
            assert s == Schedule(*core, **{opt.name: True}) and s.key() == given.key()
    assert flags == {"prefetch", "single_pass", "exact_math", "row_vectors"}


@pytest.mark.parametrize("bad", [2, -1, "yes", None])
def test_a_flag_option_takes_only_0_or_1(bad: Any) -> None:
    core = (64, 128, 2, 2, 0, 0, ("regional", "regional"), ("global", "register"))
    text = Schedule(*core).to_json()[:-1] + f',"prefetch":{json.dumps(bad)}}}'
    with pytest.raises(ScheduleError, match="malformed schedule"):
        Schedule.from_json(text)


def test_options_table_is_in_decision_order() -> None:
    assert OPTIONS.names == ("order", "prefetch", "combine", "cross_combine", "single_pass", "cluster", "transpose",
                             "exact_math", "row_vectors")
    assert isinstance(OPTIONS, OptionTable) and len(OPTIONS) == 9 and "order" in OPTIONS and "tpr" not in OPTIONS


def test_schedule_value_semantics_with_options() -> None:
    core = (64, 128, 1, 2, 0, 0, ("regional", "regional"), ("global", "register"))
    s = Schedule(*core, order="alternate")
    assert s == Schedule(*core, {"order": "alternate"}) == Schedule(*core, [("order", "alternate")])
    assert s == Schedule(*core, {"order": "forward"}, order="alternate")  # named options win
    assert s.options == (("order", "alternate"),) and Schedule(*core, order="forward").options == ()
    assert pickle.loads(pickle.dumps(s)) == s and copy.copy(s) == s
    assert pickle.loads(pickle.dumps(s)).option(ORDER) == "alternate"
    assert dataclasses.replace(s, tpr=32).option(ORDER) == "alternate" and dataclasses.replace(s, order="forward") == \
        Schedule(*core)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.tpr = 1  # type: ignore[misc]
    with pytest.raises(TypeError, match="pass an option by name"):
        Schedule(*core, "alternate")  # type: ignore[arg-type]
    with pytest.raises(AttributeError, match="no attribute 'ordr'$"):
        _ = s.ordr
    with pytest.raises(TypeError, match=r"read with their declaration, not 'order': s\.option\(ORDER\)"):
        s.option("order")  # type: ignore[call-overload, arg-type]
    with pytest.raises(KeyError):
        s.option(dataclasses.replace(UNROLL, name="ordr"))
    # options are read with option() only (typed by the declaration): an attribute read names it
    with pytest.raises(AttributeError, match=r"no attribute 'order': options are read with s\.option.*ORDER"):
        _ = s.order
