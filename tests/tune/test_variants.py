"""Variants of the best point: every search measures its best schedule with the sweep order and the
prefetch switched, side by side (``SearchSpace.variants`` + the search loop's ``enqueue_variants``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import optuna

from stitchtune.tune.database import TuningDB
from stitchtune.hardware.device import get_device
from stitchtune.graph.parse import load_graph
from stitchtune.plan.planner import make_plan
from stitchtune.space import Schedule, SearchSpace
from stitchtune.gpu.runners import FakeRunner
from stitchtune.tune.search import SearchConfig, default_components, run_search
from stitchtune.tune.study import make_storage
from stitchtune.space.options import ORDER, SINGLE_PASS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEV = get_device("H200")


def _space(name: str) -> SearchSpace:
    return SearchSpace.for_plan(make_plan(load_graph(EXAMPLES / name)), DEV)


def _time(program) -> float:
    """Fake times (not measurements): programs that re-read something are fastest, the alternate order
    faster still, so the best point has variants and one of them wins."""
    ks = program.profile.kernels
    rereads = len(ks) > 1 or any(k.reread_bytes for k in ks)
    return (1.0 if rereads else 10.0) - 0.5 * any(k.reversed_rereads for k in ks)


def test_search_measures_the_variants_of_its_best_point(tmp_path: Path) -> None:
    db = tmp_path / "db"
    cfg = SearchConfig(graph_path=str(EXAMPLES / "layernorm_small.json"), trials=24, backend="emulate",
                       device="h200", db=str(db), study="variants", sampler="random", seed=1, jobs=4,
                       progress=False, build=False, prune_factor=1e9)
    comp = dataclasses.replace(default_components(),
                               make_runner=lambda backend, graph, dev: FakeRunner(time_fn=_time))
    res = run_search(cfg, comp)
    assert res.trials_run == 24
    study = optuna.load_study(study_name="variants", storage=make_storage(None, str(db)))
    marked = [t for t in study.trials if "variant_of" in t.user_attrs]
    assert marked, "no variant was enqueued"
    rows = TuningDB(db).read()
    by_key = {r.schedule_key: r for r in rows.itertuples()}
    space = _space("layernorm_small.json")
    for t in marked:
        src = by_key[t.user_attrs["variant_of"]]
        mine = by_key[t.user_attrs["schedule_key"]]
        a, b = Schedule.from_json(src.schedule_json), Schedule.from_json(mine.schedule_json)
        assert b in space.variants(a)
        assert mine.status == "ok"
    best = Schedule.from_json(res.best.schedule_json)
    assert best.option(ORDER) == "alternate"  # found through a variant or by the sampler; measured either way


def _script(name: str):
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_variant_scripts(tmp_path: Path, capsys) -> None:
    """scripts/predict_variants.py prints a prediction per variant, labelled; scripts/variant_pairs.py
    finds the pairs a search measured (here with fake times, labelled estimated)."""
    assert _script("predict_variants").main(["--examples"]) == 0
    out = capsys.readouterr().out
    assert out.count("(predicted)") >= 10 and "combine=warp" in out and "prefetch=1" in out
    db = tmp_path / "db"
    cfg = SearchConfig(graph_path=str(EXAMPLES / "layernorm_small.json"), trials=16, backend="emulate",
                       device="h200", db=str(db), study="pairs", sampler="random", seed=1, jobs=4,
                       progress=False, build=False, prune_factor=1e9)
    run_search(cfg, dataclasses.replace(default_components(),
                                        make_runner=lambda backend, graph, dev: FakeRunner(time_fn=_time)))
    assert _script("variant_pairs").main(["--db", str(db)]) == 0
    out = capsys.readouterr().out
    pairs_line = next(line for line in out.splitlines() if line.startswith("order:"))
    assert "(0 pairs)" not in pairs_line and "(estimated)" in out


def _bytes_time(program) -> float:
    """Fake times (not measurements): the bytes the profile reads, so one sweep fewer is faster."""
    return 1e-6 * sum(k.dram_read_bytes + k.reread_bytes for k in program.profile.kernels)


def test_search_asks_single_pass_and_tries_it_next_to_its_best_point(tmp_path: Path) -> None:
    """``single_pass`` is a parameter of fresh trials where the plan has a candidate, and the search also
    measures the best point with it switched (an enqueued variant fixes it)."""
    db = tmp_path / "db"
    cfg = SearchConfig(graph_path=str(EXAMPLES / "softmax_small.json"), trials=16, backend="emulate",
                       device="h200", db=str(db), study="sp", sampler="random", seed=3, jobs=4,
                       progress=False, build=False, prune_factor=1e9)
    comp = dataclasses.replace(default_components(),
                               make_runner=lambda backend, graph, dev: FakeRunner(time_fn=_bytes_time))
    run_search(cfg, comp)
    study = optuna.load_study(study_name="sp", storage=make_storage(None, str(db)))
    fresh = [t for t in study.trials if "variant_of" not in t.user_attrs and t.user_attrs.get("heuristic") is None]
    assert fresh and all("single_pass" in t.params for t in fresh)
    assert {t.params["single_pass"] for t in fresh} == {0, 1}
    variants = [t for t in study.trials if "variant_of" in t.user_attrs and "single_pass" in t.params]
    assert variants, "a variant of the best point switches single_pass"
    rows = TuningDB(db).read()
    assert any(Schedule.from_json(j).option(SINGLE_PASS) == 1
               for j, st in zip(rows.schedule_json, rows.status) if st == "ok")
