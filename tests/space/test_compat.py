"""Compatibility contracts of the schedule space, pinned against files recorded before the option table:

* seeded samples: ``sample(random.Random(seed))`` draws the schedules recorded in
  ``tests/lower/golden/kernel_hashes.json`` (24 seeds per example, plus the heuristic schedule);
* optuna parameters: a seeded study asks the names, domains and values recorded in
  ``golden/suggest_params.json`` (``scripts/suggest_params.py``), define-by-run and flat, so studies resume;
  examples added later are recorded in files of their own (``SUGGEST_ADDED``, ``--only NAME ...``; and
  ``tests/lower/golden/kernel_hashes_*.json``), so that an existing entry is never rewritten;
* schedule JSON and ``key()``: tuning databases on disk are keyed by them; the space ``version``.

The goldens are recorded with the space as ``SearchSpace.for_plan`` builds it, without the resource
check of ``stitchtune.lower.resources.legal_space`` (what searches use since space version 2).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
from pathlib import Path

import pytest

from helpers.common import REPO
from helpers.lowering import DEV, setup
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.space import Schedule, SearchSpace, load_space_file
from stitchtune.space.options import RECORDED_OPTIONS

KERNEL_HASHES = REPO / "tests" / "lower" / "golden" / "kernel_hashes.json"
SUGGEST_GOLDEN = Path(__file__).resolve().parent / "golden" / "suggest_params.json"
SUGGEST_ADDED = (Path(__file__).resolve().parent / "golden" / "suggest_params_index_maps.json",
                 Path(__file__).resolve().parent / "golden" / "suggest_params_masks.json",
                 Path(__file__).resolve().parent / "golden" / "suggest_params_single_pass.json",
                 Path(__file__).resolve().parent / "golden" / "suggest_params_cross.json")
KERNEL_HASHES_ADDED = (REPO / "tests" / "lower" / "golden" / "kernel_hashes_index_maps.json",
                       REPO / "tests" / "lower" / "golden" / "kernel_hashes_masks.json",
                       REPO / "tests" / "lower" / "golden" / "kernel_hashes_single_pass.json",
                       REPO / "tests" / "lower" / "golden" / "kernel_hashes_cross.json")
# recorded with today's option table (the files above: with RECORDED_OPTIONS, the table they were
# recorded with, before the cluster scheme; see tests/lower/test_kernel_hashes.py)
KERNEL_HASHES_FULL = (REPO / "tests" / "lower" / "golden" / "kernel_hashes_cluster.json",
                      REPO / "tests" / "lower" / "golden" / "kernel_hashes_index_ops.json",
                      REPO / "tests" / "lower" / "golden" / "kernel_hashes_maps.json",
                      REPO / "tests" / "lower" / "golden" / "kernel_hashes_expand.json",
                      REPO / "tests" / "lower" / "golden" / "kernel_hashes_transpose.json")
SUGGEST_FULL = (Path(__file__).resolve().parent / "golden" / "suggest_params_cluster.json",
                Path(__file__).resolve().parent / "golden" / "suggest_params_index_ops.json",
                Path(__file__).resolve().parent / "golden" / "suggest_params_maps.json",
                Path(__file__).resolve().parent / "golden" / "suggest_params_rotary.json",
                Path(__file__).resolve().parent / "golden" / "suggest_params_expand.json",
                Path(__file__).resolve().parent / "golden" / "suggest_params_transpose.json")


def _recorded(paths) -> dict:
    """The examples recorded in ``paths`` (each recorded once)."""
    out: dict = {}
    for path in paths:
        rows = json.loads(path.read_text())
        assert not set(rows) & set(out), f"{path.name} records examples another golden file has"
        out.update(rows)
    return out


RECORDED = _recorded((KERNEL_HASHES, *KERNEL_HASHES_ADDED))
GOLDEN_DRAWN_AS = "5"   # scripts/kernel_hashes.py's and suggest_params.py's default
RECORDED_FULL = _recorded(KERNEL_HASHES_FULL)


def _space(name: str, full: bool):
    """(plan, space) of example ``name`` on the H200 with today's table or the recorded one, drawing as the space
    version the golden files were recorded with (``GOLDEN_DRAWN_AS``: 5; ``SearchSpace.as_of``)."""
    _, plan, space = setup(name)
    return plan, (space if full else SearchSpace.for_plan(plan, DEV, table=RECORDED_OPTIONS)).as_of(GOLDEN_DRAWN_AS)


@pytest.mark.parametrize("name", sorted(RECORDED) + sorted(RECORDED_FULL))
def test_seeded_samples_are_the_recorded_schedules(name: str) -> None:
    full = name in RECORDED_FULL
    plan, space = _space(name, full)
    for row in (RECORDED_FULL if full else RECORDED)[name]:
        s = heuristic_schedule(plan, DEV, space) if row["seed"] < 0 else space.sample(random.Random(row["seed"]))
        assert s.to_json() == row["schedule"], (name, row["seed"])


def _suggest_script():
    spec = importlib.util.spec_from_file_location("suggest_params", REPO / "scripts" / "suggest_params.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_suggest_asks_the_recorded_parameters() -> None:
    want = _recorded((SUGGEST_GOLDEN, *SUGGEST_ADDED, *SUGGEST_FULL))
    trials = len(next(iter(want.values()))["define"]["trials"])
    full = set(_recorded(SUGGEST_FULL))
    got = _suggest_script().fingerprints(trials, table="recorded", only=set(want) - full)
    got.update(_suggest_script().fingerprints(trials, table="full", only=full))
    assert {p.name for p in (REPO / "examples").glob("*.json")} == set(want), "record new examples"
    assert sorted(got) == sorted(want), "the set of examples changed: record the new ones in a golden file"
    diffs = []
    for name, modes in want.items():
        for mode, rec in modes.items():
            if got[name][mode]["domains"] != rec["domains"]:
                diffs.append(f"{name} {mode}: parameter domains differ")
            for i, (w, g) in enumerate(zip(rec["trials"], got[name][mode]["trials"], strict=True)):
                if w != g:
                    diffs.append(f"{name} {mode} trial {i}: {w} != {g}")
    assert not diffs, f"{len(diffs)} differences, e.g. {diffs[:3]}"


def test_recorded_schedules_keep_their_json_and_key() -> None:
    texts = {row["schedule"] for rows in RECORDED.values() for row in rows}
    assert any('"order"' in t for t in texts) and any('"prefetch"' in t for t in texts) \
        and any('"combine"' in t for t in texts)  # the options' non-default values are among them
    for text in texts:
        s = Schedule.from_json(text)
        assert s.to_json() == text
        assert s.key() == hashlib.sha256(text.encode()).hexdigest()[:16]


def test_every_committed_database_record_still_loads_with_its_key() -> None:
    """``Schedule.from_dict`` refuses keys it does not know; no key has ever left the space, so every schedule
    the committed H200 database (space version 1) recorded still loads, as the same point (its JSON and key)."""
    from helpers.common import COMMITTED_DB
    from stitchtune.tune.database import read_db

    df = read_db(COMMITTED_DB)
    assert len(df) > 100
    for text, key in zip(df["schedule_json"], df["schedule_key"], strict=True):
        s = Schedule.from_json(text)
        assert json.loads(s.to_json()) == json.loads(text) and s.key() == key


# keys computed by the code before the option table (schedule.py at 1cb8513)
KEYS = [
    ({"block": 512, "min_blocks": 0, "reuse": ["register", "recompute"], "schemes": ["regional", "regional"],
      "split": 1, "tasks_per_block": 4, "tpr": 256, "vec": 2}, "7b361a804b605aa1"),
    ({"block": 512, "min_blocks": 0, "reuse": ["register", "recompute"], "schemes": ["regional", "regional"],
      "split": 1, "tasks_per_block": 4, "tpr": 256, "vec": 2, "prefetch": 1}, "5e3056b0668be2c7"),
    ({"block": 256, "min_blocks": 0, "reuse": ["global", "recompute"], "schemes": ["global", "independent"],
      "split": 8, "tasks_per_block": 0, "tpr": 256, "vec": 4, "order": "alternate", "combine": "warp"},
     "21bef0a177f16511"),
]


@pytest.mark.parametrize("d,key", KEYS)
def test_keys_are_those_of_the_old_code(d: dict, key: str) -> None:
    s = Schedule.from_dict(d)
    assert s.key() == key
    # the same point with every option spelt out at its default has the same key
    assert Schedule.from_dict({"order": "forward", "prefetch": 0, "combine": "thread", **d}).key() == key


def test_flat_columns_are_the_database_columns() -> None:
    s = Schedule.from_dict({**KEYS[2][0]})
    assert list(s.flat()) == ["tpr", "block", "split", "vec", "tasks_per_block", "min_blocks", "order", "prefetch",
                              "combine", "cross_combine", "single_pass", "cluster", "transpose", "exact_math",
                              "row_vectors", "scheme_0", "scheme_1",
                              "reuse_0", "reuse_1"]
    assert s.flat()["prefetch"] == 0 and s.flat()["combine"] == "warp"


def test_space_version_is_unchanged() -> None:
    """Version 6: ``min_blocks`` 3 is drawn; studies created before 6 resume with 5's draws (``before``), as the
    golden files above were recorded. Version 5: ``min_blocks`` 3, legal and never drawn (``undrawn``: seeded
    samples and fresh trials as in 4).
    Version 4: the ``row_vectors`` option (column plans with an input read along its rows), whose default is
    what every point of version 3 did, so 3's records are still read; version 3: element-wise regions pack rows
    (``tpr < block``) and the ``exact_math`` option, a superset
    of version 2 (searches offer only schedules whose kernels fit the device: the resource check), whose
    rules are those of version 1; selection still reads the records of all three (re-validated). The golden
    files above were recorded with the space without the resource check (``SearchSpace.for_plan``): the
    check changes a seeded sample only where it was illegal."""
    assert load_space_file()["version"] == "6"
    _, _, space = setup("layernorm_small.json")
    assert space.version == "6" and space.compatible_versions == ("1", "2", "3", "4", "5")
    assert space.domains["min_blocks"] == [0, 1, 2, 3, 4] == space.legal_values("min_blocks")
    old = space.as_of("5")
    assert old.domains["min_blocks"] == [0, 1, 2, 4] and old.legal_values("min_blocks") == [0, 1, 2, 3, 4]
    assert old.version == "6" and old.drawn_as == "5" and space.as_of("6") is space
    assert space.resources is None
