"""The schedule space's rules (moved here from the lowering and search tests, where they were written
with each option): the value's JSON round trip, suggest and params_of agreeing (define-by-run and
flat), where each option is a parameter, the option rules' violation messages, and the variants."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from helpers.common import EXAMPLES
from helpers.lowering import DEV, setup, suggested
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.errors import ScheduleError, StitchtuneError
from stitchtune.graph.parse import load_graph, parse_graph
from stitchtune.plan.planner import make_plan
from stitchtune.space import PERSISTENT, Schedule, SearchSpace, names_used, prefetchable, rereads, safe_eval
from stitchtune.space.options import COMBINE, ORDER, PREFETCH, SINGLE_PASS

# a persistent row schedule with prefetch on (from tests/lower/test_prefetch.py)
LAYERNORM = {"block": 512, "min_blocks": 0, "reuse": ["register", "recompute"], "schemes": ["regional", "regional"],
             "split": 1, "tasks_per_block": 4, "tpr": 256, "vec": 2}
# split rows over a grid barrier and a kernel boundary (from tests/lower/test_combine.py)
WIDE = {"block": 256, "min_blocks": 0, "reuse": ["global", "recompute"], "schemes": ["global", "independent"],
        "split": 8, "tasks_per_block": 0, "tpr": 256, "vec": 4}


def _space(name: str) -> SearchSpace:
    return SearchSpace.for_plan(make_plan(load_graph(EXAMPLES / name)), DEV)


def test_schedule_value_round_trips_and_hashes() -> None:
    s = Schedule(32, 256, 1, 4, 1, 0, ("local", "regional"), ("register", "shared"))
    assert Schedule.from_json(s.to_json()) == s
    assert hash(s) == hash(Schedule.from_dict(json.loads(s.to_json())))
    assert s.key() == Schedule.from_json(s.to_json()).key()
    with pytest.raises(ScheduleError):
        Schedule.from_json("[1, 2]")
    with pytest.raises(ScheduleError):
        Schedule.from_dict({"tpr": "x"})
    assert not s.persistent
    p = Schedule(32, 256, 1, 4, PERSISTENT, 0, ("local", "regional"), ("register", "shared"))
    assert p.persistent and json.loads(p.to_json())["tasks_per_block"] == 0  # the JSON keeps the number


@pytest.mark.parametrize("key,message", [
    ("tpr_", "unknown key 'tpr_' (did you mean 'tpr'?)"),
    ("vec4", "unknown key 'vec4' (did you mean 'vec'?)"),
    ("prefech", "unknown key 'prefech' (did you mean 'prefetch'?)"),
    ("zzz", "unknown key 'zzz' (known keys: tpr, block, split, vec, tasks_per_block, min_blocks, schemes, reuse, order"),
])
def test_an_unknown_key_is_an_error_naming_it(key: str, message: str) -> None:
    """A typo in a schedule's JSON is never read as the default of the field or option meant."""
    d = Schedule(32, 256, 1, 4, 1, 0, ("local", "regional"), ("register", "shared")).to_dict()
    with pytest.raises(ScheduleError) as exc:
        Schedule.from_dict({**d, key: 2})
    assert str(exc.value).startswith("malformed schedule: " + message), exc.value
    with pytest.raises(ScheduleError, match="unknown key 'a' .* and 1 more"):
        Schedule.from_dict({**d, "b": 1, "a": 1})
    for not_a_dict in (5, [1], "tpr"):
        with pytest.raises(ScheduleError, match="a JSON object is needed"):
            Schedule.from_dict(not_a_dict)  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="unknown key 'tpr_'"):   # also where it stands for a missing core key
        Schedule.from_dict({**{k: v for k, v in d.items() if k != "tpr"}, "tpr_": 32})


def test_suggest_and_params_of_agree() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name in ("layernorm.json", "colsum_sigmoid_scale.json", "bias_gelu.json", "layernorm_wide.json"):
        g = load_graph(EXAMPLES / name)
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, DEV)
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        h = heuristic_schedule(plan, DEV, space)
        study.enqueue_trial(space.params_of(h))
        t = study.ask()
        assert space.suggest(t) == h
        legal = 0
        for _ in range(100):
            t = study.ask()
            s = space.suggest(t)
            legal += not space.violations(s)
            assert space.params_of(s) == t.params
            study.tell(t, 1.0)
        assert legal >= 25, (name, legal)  # register/shared budgets still prune some points


def test_flat_mode_names_every_parameter_and_keeps_legal_points() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name in ("layernorm.json", "colsum_sigmoid_scale.json", "bias_gelu.json"):
        g = load_graph(EXAMPLES / name)
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, DEV).flat_mode()
        h = heuristic_schedule(plan, DEV, space)
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
        study.enqueue_trial(space.params_of(h))
        t = study.ask()
        assert space.suggest(t) == h  # a legal point maps to itself
        names = None
        legal = 0
        for _ in range(60):
            t = study.ask()
            s = space.suggest(t)
            names = names or set(t.params)
            assert set(t.params) == names  # the same parameters in every trial
            legal += not space.violations(s)
            study.tell(t, 1.0)
        assert legal >= 15, (name, legal)


def test_order_is_a_parameter_only_where_something_is_reread() -> None:
    g, plan, space = setup("layernorm_small.json")
    cached = Schedule(64, 128, 1, 2, 0, 0, ("regional", "regional"), ("register", "register"),
                      order="alternate")
    assert not rereads(cached.schemes, cached.reuse)
    assert any("alternate sweep order without re-reads" in v for v in space.violations(cached))
    assert not space.violations(Schedule.from_dict({**cached.to_dict(), "order": "forward"}))
    # a value that is no Order is refused where the schedule is read, before any rule sees it
    with pytest.raises(ScheduleError, match="'sideways' is not a valid Order"):
        Schedule.from_dict({**cached.to_dict(), "reuse": ["global", "register"], "order": "sideways"})
    # define-by-run: 'order' is asked only for points that re-read
    seen = set()
    for params, s in suggested(space, 60, seed=3):
        assert ("order" in params) == rereads(s.schemes, s.reuse)
        seen.add(s.option(ORDER))
    assert seen == {"forward", "alternate"}
    # uniform sampling and the exhaustive grid reach both orders
    assert {space.sample(random.Random(i)).option(ORDER) for i in range(40)} == {"forward", "alternate"}


def test_prefetch_rules_of_the_space() -> None:
    g, plan, space = setup("layernorm.json")
    base = Schedule.from_dict({**LAYERNORM, "prefetch": 1})
    assert not space.violations(base)
    one_task = Schedule.from_dict({**base.to_dict(), "tasks_per_block": 1})
    assert any("prefetch needs whole rows per block" in v for v in space.violations(one_task))
    alt = Schedule.from_dict({**base.to_dict(), "reuse": ["global", "recompute"], "order": "alternate"})
    assert any("not combined with the alternate sweep order" in v for v in space.violations(alt))
    # the prefetch registers count against the register budget
    big = Schedule.from_dict({**base.to_dict(), "tpr": 8, "block": 256, "vec": 4, "reuse": ["register", "recompute"],
                              "schemes": ["local", "local"]})
    assert not space.violations(Schedule.from_dict({**big.to_dict(), "prefetch": 0}))
    assert any("register cache over 128" in v for v in space.violations(big))
    assert prefetchable("row", 1, 0) and prefetchable("row", 1, 2)
    assert not prefetchable("col", 1, 0) and not prefetchable("row", 2, 0) and not prefetchable("elementwise", 1, 0)
    assert not prefetchable("row", 1, 1)
    # define-by-run: asked only where it can matter
    seen = set()
    for params, s in suggested(space, 80, seed=4):
        assert ("prefetch" in params) == (prefetchable(plan.family, s.split, s.tasks_per_block)
                                          and s.option(ORDER) == "forward")
        seen.add(s.option(PREFETCH))
    assert seen == {0, 1}
    _, col_plan, col_space = setup("colsum_sigmoid_scale.json")
    assert {col_space.sample(random.Random(i)).option(PREFETCH) for i in range(30)} == {0}


def test_combine_rules_of_the_space() -> None:
    g, plan, space = setup("layernorm_wide.json")
    s = Schedule.from_dict({**WIDE, "combine": "warp"})
    assert not space.violations(s)
    whole = Schedule.from_dict({**WIDE, "split": 1, "schemes": ["regional", "regional"], "combine": "warp"})
    assert any("combine warp needs a row split" in v for v in space.violations(whole))
    assert "combine" not in Schedule.from_dict(WIDE).to_dict()
    assert Schedule.from_json(s.to_json()) == s
    assert ("warp" in {v.option(COMBINE) for v in space.variants(Schedule.from_dict(WIDE))})
    _, _, col = setup("colsum_sigmoid_scale.json")
    assert {col.sample(random.Random(i)).option(COMBINE) for i in range(30)} == {"thread"}


def test_variants_switch_one_option_and_stay_legal() -> None:
    space = _space("layernorm.json")
    s = Schedule.from_dict({"block": 512, "min_blocks": 0, "reuse": ["global", "recompute"],
                            "schemes": ["regional", "regional"], "split": 1, "tasks_per_block": 4, "tpr": 256,
                            "vec": 2})
    vs = space.variants(s)
    assert {(v.option(ORDER), v.option(PREFETCH), v.option(SINGLE_PASS)) for v in vs} == {
        ("alternate", 0, 0), ("forward", 1, 0), ("forward", 0, 1)}
    for v in vs:
        assert not space.violations(v)
        assert {**v.to_dict(), "order": "forward", "prefetch": 0, "single_pass": 0} == {
            **s.to_dict(), "order": "forward", "prefetch": 0, "single_pass": 0}
    # from the prefetching point: prefetch off, or alternate order (which needs prefetch off), or single pass
    on = Schedule.from_dict({**s.to_dict(), "prefetch": 1})
    assert {(v.option(ORDER), v.option(PREFETCH), v.option(SINGLE_PASS)) for v in space.variants(on)} == {
        ("forward", 0, 0), ("alternate", 0, 0), ("forward", 1, 1)}
    # nothing re-read, one task per block: single pass only (layernorm has a mean then a variance)
    cached = Schedule.from_dict({**s.to_dict(), "reuse": ["register", "register"], "tasks_per_block": 1})
    assert space.variants(cached) == [Schedule.from_dict({**cached.to_dict(), "single_pass": 1})]
    # column family: the order only
    col = _space("colsum_sigmoid_scale.json")
    c = Schedule.from_dict({"block": 256, "min_blocks": 0, "reuse": ["global"], "schemes": ["independent"],
                            "split": 16, "tasks_per_block": 0, "tpr": 32, "vec": 4})
    assert [(v.option(ORDER), v.option(PREFETCH)) for v in col.variants(c)] == [("alternate", 0)]


def test_constraint_evaluator_refuses_anything_but_arithmetic_and_logic() -> None:
    assert safe_eval("a * 2 <= b and c in ('x', 'y')", {"a": 3, "b": 6, "c": "y"}) is True
    assert names_used("tpr <= block or family == 'col'") == ("tpr", "block", "family")
    for expr in ("__import__('os')", "a.b", "a[0]", "[x for x in a]", "lambda: 1"):
        with pytest.raises(StitchtuneError, match="uses"):
            safe_eval(expr, {"a": (1,)})
    with pytest.raises(StitchtuneError, match="unknown name 'b'"):
        safe_eval("a < b", {"a": 1})


def test_constraints_evaluated_together_give_what_each_gives_alone() -> None:
    """``safe_eval_all`` (the space's rules in one evaluation) returns each expression's own value and
    raises what ``safe_eval`` raises for the first expression at fault, in order."""
    from stitchtune.space.constraints import safe_eval_all

    exprs = ("a * 2 <= b", "c in ('x', 'y')", "not a or b // a == 2", "a - b")
    names = {"a": 3, "b": 6, "c": "z"}
    assert safe_eval_all(exprs, names) == tuple(safe_eval(e, names) for e in exprs) == (True, False, True, -3)
    assert safe_eval_all((), names) == ()
    with pytest.raises(StitchtuneError, match="'a < d' uses unknown name 'd'"):
        safe_eval_all(("a < b", "a < d", "e"), names)
    with pytest.raises(StitchtuneError, match="uses Call"):
        safe_eval_all(("a < b", "f(a)"), names)


def test_single_pass_is_legal_only_with_a_candidate() -> None:
    """``single_pass`` applies where the plan has a mean-then-variance or max-then-sum-of-exp pair: sampling
    draws both values there (never elsewhere), the space built with the recorded table never draws it,
    and it may be set on any legal point."""
    from stitchtune.space.options import RECORDED_OPTIONS

    ln = _space("layernorm_small.json")
    samples = [ln.sample(random.Random(i)) for i in range(40)]
    assert {s.option(SINGLE_PASS) for s in samples} == {0, 1}
    assert all(not ln.violations(dataclasses.replace(s, single_pass=1)) for s in samples)
    recorded = SearchSpace.for_plan(ln.plan, ln.device, table=RECORDED_OPTIONS)
    assert all(recorded.sample(random.Random(i)).option(SINGLE_PASS) == 0 for i in range(40))
    rms = _space("rmsnorm_small.json")
    s = rms.sample(random.Random(0))
    bad = rms.violations(dataclasses.replace(s, single_pass=1))
    assert any("single-pass statistics need" in v for v in bad), bad


class _CountingRandom(random.Random):
    """A seeded ``random.Random`` that counts its ``choice`` draws."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.draws = 0

    def choice(self, seq):  # type: ignore[no-untyped-def]
        self.draws += 1
        return super().choice(seq)


def test_a_space_no_thread_mapping_fits_is_refused_without_drawing() -> None:
    """A column reduction over a tensor 5 columns wide: every column tile needs at least 8 threads across
    and at most 5 columns (two space-file rules on the mapping alone), so the space is empty. ``sample``
    says so at once, naming the rules, without a draw (it used to reject 20,000 draws, ~3 CPU-s)."""
    g = parse_graph({"name": "narrow", "inputs": {"x": {"shape": [32, 5], "dtype": "float32"}},
                         "nodes": [{"id": "n1", "op": "reduce_min", "args": ["x"], "axes": [-2], "keepdims": False}],
                         "outputs": ["n1"]})
    space = SearchSpace.for_plan(make_plan(g), DEV)
    rng = _CountingRandom(0)
    with pytest.raises(ScheduleError, match="space is empty") as err:
        space.sample(rng)
    assert rng.draws == 0
    assert "column tile narrower than 8 threads" in str(err.value)
    assert "column tile wider than the tensor" in str(err.value)
    # the same mapping rules, checked one mapping at a time: none passes them
    for tpr in space.domains["tpr"]:
        for block in space.domains["block"]:
            for vec in space.domains["vec"]:
                assert not (block // tpr >= 8 and block // tpr * vec <= 5), (tpr, block, vec)


@pytest.mark.parametrize("name", ["layernorm.json", "colsum_sigmoid_scale.json", "bias_gelu.json",
                                  "layernorm_wide.json", "middle_center.json", "cross_entropy.json"])
def test_the_mapping_check_agrees_with_the_full_rules(name: str) -> None:
    """What ``sample`` skips early is what the full rules refuse: a point whose thread mapping breaks a
    mapping rule has violations (naming that rule), and ``derived`` gives every point the names the
    mapping check reads. A space with legal points is not called empty, and its seeded sample is legal
    (the seeded draws themselves are recorded in tests/space/test_compat.py)."""
    g = load_graph(EXAMPLES / name)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    h = heuristic_schedule(plan, DEV, space)
    assert not space.violations(h)
    assert space._mapping_is_impossible is None
    assert not space.violations(space.sample(random.Random(3)))
    rng = random.Random(5)
    broken = 0
    for _ in range(300):
        s = dataclasses.replace(h, **{n: rng.choice(space.domains[n]) for n in
                                      ("tpr", "block", "split", "vec", "tasks_per_block", "min_blocks")})
        mapping = (s.tpr, s.block, s.split, s.vec, s.tasks_per_block, s.min_blocks)
        names = space.derived(s)
        assert {k: names[k] for k in space._mappings.names(*mapping)} == space._mappings.names(*mapping)
        bad = space._mappings.breaks(*mapping)
        if bad is not None:
            broken += 1
            assert any(bad["expr"] in v for v in space.violations(s)), (s, bad)
    assert broken  # the draws met mappings the check refuses
