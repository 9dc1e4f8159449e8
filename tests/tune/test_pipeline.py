"""evaluate(): one row per schedule, every status through fakes, pruning, bugs propagate; one real-stage run."""

from __future__ import annotations

import json
import random

import pytest
from helpers.search_fakes import (BLOCKS, fake_stages, fake_time, FakeBuilder, FakeDevice, FakeGraph, FakeRunner,
                                  FakeSchedule, FATES, VECS)

from stitchtune.tune.pipeline import Stages, context_row, evaluate


def _all_points():
    return [FakeSchedule(b, v) for b in BLOCKS for v in VECS]


def test_one_row_per_schedule_in_order_with_every_status():
    pts = _all_points()
    runner, builder = FakeRunner(), FakeBuilder()
    rows = evaluate(FakeGraph(), "plan", FakeDevice(), pts, builder, runner, None, stages=fake_stages())
    assert [r["schedule_key"] for r in rows] == [p.key() for p in pts]
    want = {"illegal": "pruned", "prune_reason": "pruned", "compile_error": "compile_error",
            "build_timeout": "timeout", "launch_error": "launch_error", "timeout": "timeout",
            "wrong_result": "wrong_result"}
    for p, r in zip(pts, rows):
        fate = FATES.get((p.block, p.vec))
        assert r["status"] == want.get(fate, "ok"), (p, r)
        if r["status"] == "ok":
            assert r["measured_us"] == pytest.approx(fake_time(p))
            assert json.loads(r["samples_us"]) == [fake_time(p)] * 3
            assert r["error"] == "" and r["registers"] == 40
        elif r["status"] == "pruned":
            assert r["prune_reason"] and r["measured_us"] is None
        else:
            assert r["error"], r
            assert r["measured_us"] is None
        assert r["workload_key"] == FakeGraph().workload_key() and r["device_cc"] == "9.0"
        assert r["codegen_version"] == "fake-cg-1" and r["p_block"] == p.block
    # one build call for the whole batch; only built-ok survivors reached the runner, one at a time
    assert len(builder.calls) == 1
    never_run = {k for k, f in FATES.items() if f in ("illegal", "prune_reason", "compile_error", "build_timeout")}
    assert not {f"b{b}-v{v}" for b, v in never_run} & set(runner.measured)
    assert len(runner.measured) == len(pts) - len(never_run)


def test_pruned_against_best_so_far_is_never_built():
    pts = [FakeSchedule(256, 2), FakeSchedule(32, 1)]  # 10 us vs 30 us
    builder = FakeBuilder()
    rows = evaluate(FakeGraph(), "plan", FakeDevice(), pts, builder, FakeRunner(), 10.0, prune_factor=2.0,
                    stages=fake_stages())
    assert rows[0]["status"] == "ok"
    assert rows[1]["status"] == "pruned" and "best" in rows[1]["prune_reason"]
    assert rows[1]["predicted_us"] == pytest.approx(fake_time(pts[1]))
    assert all("block=32" not in s for s in builder.calls[0])


def test_identical_sources_built_once():
    st = fake_stages()
    same = Stages(lower=st.lower, render=lambda prog: "// same\n", predict=st.predict,
                  should_prune=st.should_prune, codegen_version="x")
    builder = FakeBuilder()
    rows = evaluate(FakeGraph(), "plan", FakeDevice(), [FakeSchedule(128, 2), FakeSchedule(256, 2)], builder,
                    FakeRunner(), None, stages=same)
    assert builder.calls == [["// same\n"]]
    assert [r["status"] for r in rows] == ["ok", "ok"]


def test_bugs_propagate():
    st = fake_stages()

    def broken_lower(*a):
        raise ZeroDivisionError("bug in lowering")

    bad = Stages(lower=broken_lower, render=st.render, predict=st.predict, should_prune=st.should_prune)
    with pytest.raises(ZeroDivisionError):
        evaluate(FakeGraph(), "plan", FakeDevice(), [FakeSchedule(128, 2)], FakeBuilder(), FakeRunner(), None,
                 stages=bad)

    class ShortBuilder(FakeBuilder):
        def build(self, sources, arch):
            return []

    with pytest.raises(RuntimeError, match="builder returned"):
        evaluate(FakeGraph(), "plan", FakeDevice(), [FakeSchedule(128, 2)], ShortBuilder(), FakeRunner(), None,
                 stages=st)


def test_long_error_text_is_clipped():
    class Loud(FakeRunner):
        def run(self, items):
            (m,) = super().run(items)
            return [type(m)("launch_error", None, (), None, True, "x" * 100_000)]

    (row,) = evaluate(FakeGraph(), "plan", FakeDevice(), [FakeSchedule(128, 2)], FakeBuilder(), Loud(), None,
                      stages=fake_stages())
    assert row["status"] == "launch_error" and len(row["error"]) < 5000


def test_context_row_json_columns():
    ctx = context_row(FakeGraph(rows=8), FakeDevice())
    assert json.loads(ctx["shapes"]) == {"x": [8, 1024], "y": [8, 1024]}
    assert json.loads(ctx["dtypes"]) == {"x": "float32", "y": "float32"}


def test_real_stages_on_small_layernorm():
    """The real lower/render/cost stages + EmulateRunner (no nvcc: SkipBuilder) on a small example."""
    from stitchtune.gpu.device_query import default_device
    from stitchtune.graph.parse import load_graph
    from stitchtune.plan.planner import make_plan
    from stitchtune.gpu.runners import EmulateRunner
    from stitchtune.space import SearchSpace
    from stitchtune.gpu.runners import FakeRunner as TimesRunner
    from stitchtune.tune.search import SkipBuilder

    graph = load_graph("examples/layernorm_small.json")
    plan = make_plan(graph)
    device = default_device()
    space = SearchSpace.for_plan(plan, device)
    rng = random.Random(0)
    scheds = [space.sample(rng) for _ in range(4)]
    rows = evaluate(graph, plan, device, scheds, SkipBuilder("test"), EmulateRunner(graph, device), None)
    assert len(rows) == 4
    for r in rows:
        assert r["status"] in ("ok", "pruned", "launch_error", "wrong_result"), r
        if r["status"] == "ok":
            assert r["estimated"] is True and r["measured_us"] == pytest.approx(r["predicted_us"])
    assert any(r["status"] == "ok" for r in rows)


def test_a_built_candidate_row_carries_its_features_and_fingerprint():
    """Every built candidate's row has ``features_json``: the fitted model's IR features of the program it
    measured (ptxas registers) keyed by the program's fingerprint, what ``stitchtune calibrate`` fits."""
    from stitchtune.cost.features import program_features
    from stitchtune.graph.parse import load_graph
    from stitchtune.gpu.render import program_fingerprint
    from stitchtune.gpu.runners import FakeRunner as TimesRunner
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace
    from stitchtune.tune.pipeline import default_stages
    from stitchtune.tune.search import SkipBuilder

    graph = load_graph("examples/layernorm_small.json")
    plan = make_plan(graph)
    device = get_device("h200")
    space = SearchSpace.for_plan(plan, device)
    scheds = [space.sample(random.Random(s)) for s in range(2)]
    rows = evaluate(graph, plan, device, scheds, SkipBuilder("test"), TimesRunner(), None, stages=default_stages())
    for sched, row in zip(scheds, rows):
        assert row["status"] == "ok"
        fj = json.loads(row["features_json"])
        prog = lower(graph, plan, sched, device, space)
        assert fj["program_sha256"] == program_fingerprint(prog) and fj["timing"] == "events"
        want = [{k: v for k, v in f.to_dict().items() if k != "per_access"} for f in program_features(prog, device)]
        assert fj["kernels"] == json.loads(json.dumps(want))
    assert rows[0]["features_json"] != rows[1]["features_json"]
    fake = evaluate(FakeGraph(), "plan", FakeDevice(), [FakeSchedule(128, 2)], FakeBuilder(), FakeRunner(), None,
                    stages=fake_stages())
    assert fake[0].get("features_json") is None       # not a kernel-IR program: no features


def test_the_search_prunes_by_the_fitted_model(monkeypatch):
    """The real stages' prediction (and so the pruning before compiling) is the fitted IR-feature model's:
    coefficients that make every kernel far slower prune a point the old profile model keeps, and the
    row's predicted_us is cost.fitted.predict_program's time, not cost.model.predict's."""
    import dataclasses

    from stitchtune.cost import fitted
    from stitchtune.cost.model import predict as old_predict
    from stitchtune.graph.parse import load_graph
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace
    from stitchtune.tune.pipeline import default_stages
    from stitchtune.gpu.runners import FakeRunner as TimesRunner
    from stitchtune.tune.search import SkipBuilder

    graph = load_graph("examples/layernorm_small.json")
    plan = make_plan(graph)
    device = get_device("h200")
    space = SearchSpace.for_plan(plan, device)
    sched = space.sample(random.Random(0))
    prog = lower(graph, plan, sched, device, space)
    old_us = old_predict(prog.profile, device).time_us
    fit_us = fitted.predict_program(prog, device).time_us
    assert fit_us != pytest.approx(old_us)
    best = 2.0 * max(old_us, fit_us)      # factor 3: neither model prunes at these coefficients
    shipped = fitted.coefficients_for(device)

    def run(coeffs):
        monkeypatch.setattr(fitted, "coefficients_for", lambda dev: coeffs)
        return evaluate(graph, plan, device, [sched], SkipBuilder("test"), TimesRunner(), best,
                        stages=default_stages())[0]

    kept = run(shipped)
    assert kept["status"] == "ok" and kept["predicted_us"] == pytest.approx(
        fitted.predict_program(prog, device, coefficients=shipped).time_us)
    slow = dataclasses.replace(shipped, cta_ns=1e6, flop_cycles=1e5)
    assert fitted.predict_program(prog, device, coefficients=slow).time_us > 3 * best > 3 * old_us
    pruned = run(slow)
    assert pruned["status"] == "pruned" and "best" in pruned["prune_reason"]


def _layernorm_candidate():
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.graph.parse import load_graph
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    graph = load_graph("examples/layernorm_small.json")
    plan = make_plan(graph)
    device = get_device("h200")
    space = SearchSpace.for_plan(plan, device)
    sched = heuristic_schedule(plan, device, space)
    return graph, plan, device, sched, lower(graph, plan, sched, device, space)


class _CubinBuilder:
    """gpu.build.FakeBuilder's results (registers 32 per kernel), each with a cubin file of fixed bytes."""

    def __init__(self, cubin) -> None:
        from stitchtune.gpu.build import FakeBuilder as Real

        self.real, self.cubin = Real(), str(cubin)

    def build(self, sources, arch):
        import dataclasses

        return [dataclasses.replace(r, cubin_path=self.cubin) for r in self.real.build(sources, arch)]


def test_the_after_build_prediction_reads_the_compiled_facts_and_says_so(tmp_path):
    """After a build, predicted_us is the fitted model's prediction with the cubin's compiled facts
    (predicted_from=compiled), which differs from the IR features' (one 4-byte load in flight, spills);
    a build without facts keeps the IR prediction with ptxas' registers (predicted_from=ir)."""
    import dataclasses

    from stitchtune.cost import fitted
    from stitchtune.cost.compiled import CompiledFacts
    from stitchtune.gpu.runners import FakeRunner as TimesRunner
    from stitchtune.tune.pipeline import default_stages

    graph, plan, device, sched, prog = _layernorm_candidate()
    facts = {k.name: CompiledFacts(registers=40, bytes_in_flight=4.0, loads_in_flight=1.0, spill_instructions=50)
             for k in prog.kernels}
    seen = []

    def read(build):
        seen.append(build.cubin_path)
        return facts

    builder = _CubinBuilder(tmp_path / "k.cubin")
    real = default_stages()
    with_facts = evaluate(graph, plan, device, [sched], builder, TimesRunner(), None,
                          stages=dataclasses.replace(real, compiled_facts=read))[0]
    without = evaluate(graph, plan, device, [sched], builder, TimesRunner(), None,
                       stages=dataclasses.replace(real, compiled_facts=lambda build: None))[0]
    regs = {k.name: 32 for k in prog.kernels}
    ir_us = fitted.predict_program(prog, device, registers=regs).time_us
    compiled_us = fitted.predict_program(prog, device, registers=regs, compiled=facts).time_us
    assert seen == [str(tmp_path / "k.cubin")]
    assert with_facts["status"] == "ok" and with_facts["predicted_from"] == "compiled"
    assert with_facts["predicted_us"] == pytest.approx(compiled_us)
    assert without["predicted_from"] == "ir" and without["predicted_us"] == pytest.approx(ir_us)
    assert compiled_us > 1.05 * ir_us      # the facts changed the prediction (serialized loads, spills)


def test_without_cuobjdump_the_after_build_prediction_falls_back_to_the_ir_with_one_note(tmp_path, monkeypatch,
                                                                                         caplog):
    """The real stage's reader, with no cuobjdump installed: every row predicts from the IR features
    (predicted_from=ir, the same time as a build without facts) and the run logs one note, not one per build."""
    import dataclasses
    import logging

    from stitchtune.cost import fitted
    from stitchtune.gpu import build_facts
    from stitchtune.gpu.runners import FakeRunner as TimesRunner
    from stitchtune.tune.pipeline import default_stages

    monkeypatch.setattr(build_facts, "find_cuobjdump", lambda: None)
    monkeypatch.setattr(build_facts, "_noted_missing", False)
    graph, plan, device, sched, prog = _layernorm_candidate()
    (tmp_path / "k.cubin").write_bytes(b"not read")
    stages = dataclasses.replace(default_stages(), compiled_facts=build_facts.SassFactsReader(cache_dir=tmp_path))
    with caplog.at_level(logging.INFO, logger="stitchtune.gpu.build_facts"):
        rows = [evaluate(graph, plan, device, [sched], _CubinBuilder(tmp_path / "k.cubin"), TimesRunner(), None,
                         stages=stages)[0] for _ in range(2)]
    notes = [r for r in caplog.records if "cuobjdump not found" in r.getMessage()]
    assert len(notes) == 1
    ir_us = fitted.predict_program(prog, device, registers={k.name: 32 for k in prog.kernels}).time_us
    for row in rows:
        assert row["status"] == "ok" and row["predicted_from"] == "ir"
        assert row["predicted_us"] == pytest.approx(ir_us)


def test_a_batchs_facts_are_asked_once_per_distinct_build_and_matched_to_their_candidates():
    """Every successful build of a batch is asked for its facts once (concurrently), none of a failed one, and
    each candidate's after-build prediction reads its own build's facts."""
    import threading

    from helpers.search_fakes import FakePrediction

    asked: list[str] = []
    lock = threading.Lock()

    def facts(build):
        with lock:
            asked.append(build.source_hash)
        return {"k": build.source_hash}

    def predict(program, device, registers=None, compiled=None):
        us = 5.0 + (int(compiled["k"]) % 1000 if compiled else 0.0)
        return FakePrediction(us, 0.5, None)

    st = fake_stages()
    stages = Stages(lower=st.lower, render=st.render, predict=predict, should_prune=st.should_prune,
                    compiled_facts=facts)
    pts = [FakeSchedule(256, 2), FakeSchedule(128, 2), FakeSchedule(256, 2), FakeSchedule(64, 4)]  # 64x4 fails
    rows = evaluate(FakeGraph(), "plan", FakeDevice(), pts, FakeBuilder(), FakeRunner(), None, stages=stages)
    hashes = [str(hash(st.render(st.lower(None, None, p, None)))) for p in pts]
    assert sorted(asked) == sorted(set(hashes[:3])) and len(asked) == 2
    for r, h in zip(rows[:3], hashes):
        assert r["predicted_from"] == "compiled" and r["predicted_us"] == pytest.approx(5.0 + int(h) % 1000)
    assert rows[3]["status"] == "compile_error" and rows[3]["predicted_from"] == "ir"


def test_a_built_candidate_row_records_its_cubins_compiled_facts(tmp_path):
    """features_json (version 2) holds the compiled facts the after-build prediction read, per kernel, so that
    ``stitchtune calibrate`` can fit on them; a build without facts records ``compiled: null``."""
    import dataclasses

    from stitchtune.cost.compiled import CompiledFacts
    from stitchtune.gpu.runners import FakeRunner as TimesRunner
    from stitchtune.tune.pipeline import default_stages

    graph, plan, device, sched, prog = _layernorm_candidate()
    facts = {k.name: CompiledFacts(registers=40, bytes_in_flight=48.0, loads_in_flight=3.0, spill_instructions=2)
             for k in prog.kernels}
    real = default_stages()
    builder = _CubinBuilder(tmp_path / "k.cubin")
    row = evaluate(graph, plan, device, [sched], builder, TimesRunner(), None,
                   stages=dataclasses.replace(real, compiled_facts=lambda build: facts))[0]
    fj = json.loads(row["features_json"])
    assert fj["version"] == 2 and fj["compiled"] == {n: f.to_dict() for n, f in facts.items()}
    assert all(k["compiled_bytes_in_flight"] == 0.0 for k in fj["kernels"])    # the IR features stay the IR's
    none = evaluate(graph, plan, device, [sched], builder, TimesRunner(), None,
                    stages=dataclasses.replace(real, compiled_facts=lambda build: None))[0]
    assert json.loads(none["features_json"])["compiled"] is None


def test_nvcc_build_and_emulate_runner_record_the_real_cubins_facts(tmp_path):
    """The CPU pipeline end to end (nvcc for sm_90, cuobjdump, the emulate runner): the row's features_json holds
    the facts the shared reader reads from the very cubin built, and calibrate_fitted reads them back."""
    import pandas as pd

    from stitchtune.cost import calibrate_fitted
    from stitchtune.gpu.build import NvccBuilder, nvcc_found
    from stitchtune.gpu.build_facts import SassFactsReader
    from stitchtune.gpu.runners import EmulateRunner
    from stitchtune.gpu.sass import find_cuobjdump
    from stitchtune.tune.pipeline import default_stages

    if not nvcc_found() or find_cuobjdump() is None:
        pytest.skip("needs nvcc and cuobjdump")
    import dataclasses

    graph, plan, device, sched, prog = _layernorm_candidate()
    reader = SassFactsReader(cache_dir=tmp_path / "facts")
    builder = NvccBuilder(cache_dir=tmp_path / "cubin")
    stages = dataclasses.replace(default_stages(), compiled_facts=reader)
    row = evaluate(graph, plan, device, [sched], builder, EmulateRunner(graph, device, compiled_facts=reader), None,
                   stages=stages)[0]
    assert row["status"] == "ok" and row["predicted_from"] == "compiled", row.get("error")
    (build,) = builder.build([default_stages().render(prog)], device.arch)
    want = reader(build)
    assert want and json.loads(row["features_json"])["compiled"] == {n: f.to_dict() for n, f in want.items()}
    measured = {**row, "estimated": False, "measured_us": 10.0}    # as if a GPU had measured it
    rows, notes = calibrate_fitted.fit_rows(pd.DataFrame([measured]), device.key, "auto")
    assert notes == [] and rows[0]["fit_on"] == "compiled"
    assert [k["compiled_bytes_in_flight"] for k in rows[0]["kernels"]] == [want[k.name].bytes_in_flight
                                                                          for k in prog.kernels]
