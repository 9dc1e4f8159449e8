"""The scheme table (``stitchtune.space.schemes``): every scheme checked from its declaration, and a scheme
declared only in this test (``GLOBAL_ROWS``: global stitching of whole rows) seen flowing through the space
(suggest, sample, validation, the flat repair) without any other code knowing its name. That it lowers,
emulates, renders and compiles is checked by the contract suite, ``tests/lower/test_scheme_contract.py``,
which runs over the same test-local scheme."""

from __future__ import annotations

import dataclasses
import random

import optuna
import pytest

from helpers.lowering import DEV, GLOBAL_ROWS, local_scheme_space, setup
from stitchtune.errors import StitchtuneError
from stitchtune.space import SCHEMES, Scheme, SchemeName, SchemeTable, SearchSpace, load_space_file, names_used
from stitchtune.space.options import rereads

RULE_NAMES = {"family", "tpr", "block", "split", "max_cluster"}

LOCAL_TABLE = SCHEMES.extended(GLOBAL_ROWS)


def test_every_builtin_scheme_has_a_name_and_is_offered() -> None:
    assert set(SCHEMES.names) == {n.value for n in SchemeName}
    assert list(load_space_file()["params"]["scheme"]["choices"]) == list(SCHEMES.names)


@pytest.mark.parametrize("scheme", list(SCHEMES) + [GLOBAL_ROWS], ids=lambda s: s.name)
def test_scheme_declaration(scheme: Scheme) -> None:
    assert set(names_used(scheme.rule)) <= RULE_NAMES
    # what it needs decides the exchange: a kernel boundary or a grid barrier comes with partials
    assert scheme.partials == (scheme.grid_barrier or scheme.kernel_boundary)
    assert scheme.result_in_kernel == (not scheme.kernel_boundary)
    assert scheme.exchanges_in_block(64) == scheme.beyond_warp
    assert scheme.exchanges_in_block(32) == (scheme.beyond_warp and scheme.block_exchange)
    assert rereads((scheme.name,), (), LOCAL_TABLE) == scheme.kernel_boundary


def test_inconsistent_declarations_are_refused() -> None:
    with pytest.raises(ValueError, match="exclude each other"):
        Scheme("x", "True", partials=True, grid_barrier=True, kernel_boundary=True)
    with pytest.raises(ValueError, match="partials"):
        Scheme("x", "True", grid_barrier=True)
    with pytest.raises(ValueError, match="warp-only"):
        Scheme("x", "True", beyond_warp=False, block_exchange=True)
    with pytest.raises(ValueError, match="repeated"):
        SCHEMES.extended(Scheme("local", "True"))


def test_the_repair_prefers_by_rank() -> None:
    assert SCHEMES.repair("cluster", ["local", "regional", "independent"]) == "regional"
    assert SCHEMES.repair("global", ["independent", "local"]) == "independent"
    assert SCHEMES.repair("local", ["local", "regional"]) == "local"
    assert SCHEMES.decision_kind(["regional", "independent"], 1) == "block"
    assert SCHEMES.decision_kind(["local", "regional", "independent"], 1) == "warp"
    assert SCHEMES.decision_kind(["global", "independent"], 4) == "split"
    assert SCHEMES.decision_kind(["global", "independent", "cluster"], 4) == "cluster"


def test_a_space_file_offering_an_undeclared_scheme_is_refused() -> None:
    _, plan, _ = setup("softmax_small.json")
    data = load_space_file()
    data["params"]["scheme"]["choices"] = [*data["params"]["scheme"]["choices"], "global_rows"]
    with pytest.raises(StitchtuneError, match="undeclared scheme"):
        SearchSpace(plan, DEV, data)
    data = load_space_file()
    data["scheme_rules"] = {"local": "True"}
    with pytest.raises(StitchtuneError, match="scheme_rules"):
        SearchSpace(plan, DEV, data)


def test_a_test_local_scheme_is_sampled_validated_and_suggested() -> None:
    space = local_scheme_space("softmax_small.json")
    samples = [space.sample(random.Random(i)) for i in range(120)]
    with_it = [s for s in samples if GLOBAL_ROWS.name in s.schemes]
    assert with_it, "sampling draws the test-local scheme"
    for s in with_it:
        assert s.split == 1 and space.violations(s) == []
        assert space.derived(s)["rereads"] == rereads(s.schemes, s.reuse)  # no kernel boundary of its own
    bad = dataclasses.replace(with_it[0], split=2)
    assert any("scheme global_rows is not legal" in v for v in space.violations(bad))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = False
    for _ in range(60):
        t = study.ask()
        s = space.suggest(t)
        assert space.params_of(s) == t.params
        seen |= GLOBAL_ROWS.name in s.schemes
        study.tell(t, 1.0)
    assert seen, "define-by-run suggest offers the test-local scheme"
    flat = space.flat_mode()
    for i in range(30):
        s = flat.sample(random.Random(100 + i))
        assert flat.violations(s) == []


def test_the_builtin_space_is_unchanged_by_a_local_table() -> None:
    """A table with an extra scheme that the space file does not offer changes nothing."""
    _, plan, space = setup("layernorm_small.json")
    other = SearchSpace(plan, DEV, load_space_file(), schemes=LOCAL_TABLE)
    assert other.domains == space.domains
    assert [other.sample(random.Random(i)) for i in range(10)] == [space.sample(random.Random(i)) for i in range(10)]


def test_scheme_table_lookup() -> None:
    assert isinstance(SCHEMES, SchemeTable) and "global" in SCHEMES and "nope" not in SCHEMES
    assert SCHEMES["cluster"].cluster and SCHEMES.get("nope") is None
    assert SCHEMES.count(("global", "nope", "cluster"), lambda sc: sc.partials) == 1
