"""search --dynamic: one search per bucket of a dynamic graph, rows with their bucket, selection per bucket."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers.common import EXAMPLES_DIR
from helpers.lowering import DEV
from stitchtune import cli
from stitchtune.deploy.dynamic import CompiledBucket, compile_dynamic
from stitchtune.deploy.selection import clear_cache
from stitchtune.errors import GraphError
from stitchtune.graph.dynamic import load_dynamic, parse_dynamic_arg
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.tune.config import SearchConfig
from stitchtune.tune.database import read_db
from stitchtune.tune.dynamic_search import run_dynamic_search, split_trials, with_dims


@pytest.fixture
def small_graph(tmp_path: Path) -> Path:
    obj = json.loads((EXAMPLES_DIR / "dynamic" / "embed_add_layernorm_seq.json").read_text())
    obj["dynamic"]["seq"] = {"min": 1, "max": 48}
    p = tmp_path / "g.json"
    p.write_text(json.dumps(obj))
    return p


def test_trials_split_by_expected_share() -> None:
    dg = with_dims(load_dynamic(EXAMPLES_DIR / "dynamic" / "layernorm_seq.json"), [parse_dynamic_arg("seq=1..2048")])
    split = split_trials(dg, 64)
    assert [k.label() for k, _ in split][-1] == "seq=1025..2048"
    # 16/2048 of 64 rounds to 0: at least 1, taken from the largest; exactly 64 in all (was 65 with max(1, round))
    assert [n for _, n in split] == [1, 1, 1, 2, 4, 8, 16, 31]
    assert sum(n for _, n in split_trials(dg, 4)) == 4   # fewer trials than buckets: the small ones get none


def test_buckets_without_a_trial_are_skipped_outcomes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--trials below the number of buckets: the buckets left with none are outcomes saying so, and the trials
    run add up to --trials."""
    import stitchtune.tune.search as search
    from stitchtune.tune.result import SearchResult
    from stitchtune.tune.search import SearchConfig

    def fake(cfg: SearchConfig, comp: object = None) -> SearchResult:
        return SearchResult("s", "j", cfg.db, "emulate", "", True, "g", "w", "d", cfg.trials, {}, 0, None, None,
                            None, None, None, "trials", 0.0)

    monkeypatch.setattr(search, "run_search", fake)
    cfg = SearchConfig(graph_path=str(EXAMPLES_DIR / "dynamic" / "layernorm_seq.json"), trials=3,
                       backend="emulate", device="h200", db=str(tmp_path / "db"), progress=False)
    outcomes = run_dynamic_search(cfg, [parse_dynamic_arg("seq=1..64")])
    assert len(outcomes) > 3 and sum(o.trials for o in outcomes) == 3
    assert all((o.result is not None) == (o.trials > 0) for o in outcomes)
    skipped = [o for o in outcomes if o.result is None]
    assert all(o.skipped and o.skipped.startswith("no trial left") for o in skipped)


def test_with_dims_refuses_an_unknown_name() -> None:
    dg = load_dynamic(EXAMPLES_DIR / "dynamic" / "layernorm_seq.json")
    with pytest.raises(GraphError, match="no dynamic dim 'hid'"):
        with_dims(dg, [parse_dynamic_arg("hid=1..8")])


def test_with_dims_takes_a_narrower_range_and_refuses_a_wider_one() -> None:
    dg = load_dynamic(EXAMPLES_DIR / "dynamic" / "layernorm_seq.json")   # seq declared 1..2048
    assert with_dims(dg, [parse_dynamic_arg("seq=8..64")]).dims[0].buckets.lo == 8
    for arg in ("seq=1..99999", "seq=1..2049"):
        with pytest.raises(GraphError, match=r"outside the bounds the graph declares for seq, 1\.\.2048"):
            with_dims(dg, [parse_dynamic_arg(arg)])


def test_a_given_schedule_the_generic_kernel_refuses_is_an_error() -> None:
    from stitchtune.errors import ScheduleError

    dg = load_dynamic(EXAMPLES_DIR / "dynamic" / "attention_softmax_seq.json")   # the row length is seq
    key = dg.key_of({"seq": 3})
    cb = compile_dynamic(dg, key, db=None, device=DEV, build=False)
    assert isinstance(cb, CompiledBucket)
    bad = {**cb.schedule.to_dict(), "vec": 4}
    with pytest.raises(ScheduleError, match="refuses it"):
        compile_dynamic(dg, key, db=None, device=DEV, build=False, schedule=bad)


def test_dynamic_search_tunes_every_bucket_and_selection_uses_it(small_graph: Path, tmp_path: Path) -> None:
    db = tmp_path / "db"
    cfg = SearchConfig(graph_path=str(small_graph), trials=4, backend="emulate", device="H200", db=str(db),
                       jobs=2, seed=3, build=False, progress=False)
    lines: list[str] = []
    out = run_dynamic_search(cfg, [parse_dynamic_arg("seq=1..48:16,48")], progress=lines.append)
    assert [o.key.label() for o in out] == ["seq=1..16", "seq=17..48"]
    assert [o.trials for o in out] == [1, 3] and all(o.result is not None for o in out)
    assert lines[0].startswith("2 bucket(s)") and "seq=17..48: 3 trial(s) at {'seq': 48}" in lines[2]
    df = read_db(db)
    assert set(df["bucket"]) == {"seq=1..16", "seq=17..48"} and (df["status"] == "ok").any()
    assert df["estimated"].all()
    # the bucket's best comes back at compile time and runs at any extent of the bucket
    clear_cache()
    dg = with_dims(load_dynamic(small_graph), [parse_dynamic_arg("seq=1..48:16,48")])
    cb = compile_dynamic(dg, dg.key_of({"seq": 30}), db=db, device=DEV, build=False)
    assert isinstance(cb, CompiledBucket) and cb.source == "tuned"
    for e in (17, 29, 48):
        g = dg.at({"seq": e})
        ins = random_inputs(g, e)
        got = cb.emulate({"seq": e}, **ins)["y"]
        assert np.allclose(got, run_reference(g, ins)["y"], atol=1e-4)
    with pytest.raises(GraphError, match="not in bucket"):
        cb.emulate({"seq": 5}, **random_inputs(dg.at({"seq": 5}), 0))


def test_compile_dynamic_refusal_is_data() -> None:
    obj: dict[str, Any] = {"name": "cs", "dynamic": {"seq": {"min": 1, "max": 64}},
                           "inputs": {"x": {"shape": ["seq", 64], "dtype": "float32"}},
                           "nodes": [{"id": "c", "op": "reduce_sum", "args": ["x"], "axes": [0], "keepdims": True}],
                           "outputs": ["c"]}
    from stitchtune.graph.dynamic import DynamicRefusal, parse_dynamic

    dg = parse_dynamic(obj)
    r = compile_dynamic(dg, dg.key_of({"seq": 3}), db=None, device=DEV, build=False)
    assert isinstance(r, DynamicRefusal) and r.part == "family col"


@pytest.mark.parametrize("arg", ["seq=1..x", "seq=0..4", "seq=8..64:4,64"])
def test_bad_dynamic_text_is_one_error_line_and_exit_2(arg: str, small_graph: Path, tmp_path: Path) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli.main(["search", str(small_graph), "--dynamic", arg, "--db", str(tmp_path / "db"),
                       "--backend", "emulate"])
    lines = [ln for ln in err.getvalue().splitlines() if ln]
    assert rc == 2 and len(lines) == 1 and "--dynamic" in lines[0], err.getvalue()
