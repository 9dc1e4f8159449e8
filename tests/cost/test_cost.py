"""Cost model: legality pruning, monotonic behaviour, cost-based pruning, parameters, calibration,
model-check and the two CLI commands. All times here are predictions of the model."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stitchtune.cost.calibrate import (CalibrationError, fit, format_model_check, measured_rows,
                                  model_check)
from stitchtune.cli import main
from stitchtune.cost.model import (CostParams, CostParamsError, Prediction, default_params, explain, load_params,
                             params_path, predict, profile_from_dict, profile_to_dict, save_params,
                             should_prune, use_params)
from stitchtune.tune.database import TuningDB
from stitchtune.hardware.device import get_device
from stitchtune.ir.kir import KernelProfile, ProgramProfile

H200 = get_device("h200")
M, N = 16384, 1024
ROW_BYTES = M * N * 4


def kp(name: str = "k", grid: int = 2048, block: int = 256, smem: int = 0, regs: int = 32,
       read: int = ROW_BYTES, write: int = ROW_BYTES, reread: int = 0, ws: int = 0, flops: int = M * N * 8,
       sfu: int = M, bb: int = 0, gb: int = 0, atomics: int = 0, bif: int = 16) -> KernelProfile:
    return KernelProfile(name, grid, block, smem, regs, read, write, reread, ws, flops, sfu, bb, gb,
                         atomics, bif)


def prog(*kernels: KernelProfile) -> ProgramProfile:
    return ProgramProfile(tuple(kernels), 2 * ROW_BYTES)


@pytest.fixture(autouse=True)
def _fresh_params() -> None:
    use_params(default_params(H200))


# ---------------------------------------------------------------------------- legality
def test_legal_prediction_shape() -> None:
    p = predict(prog(kp("a"), kp("b")), H200)
    assert p.prune_reason is None
    assert math.isfinite(p.time_us) and len(p.per_kernel_us) == 2
    assert p.time_us == pytest.approx(sum(p.per_kernel_us))
    assert 0 < p.occupancy <= 1 and p.limiter in ("warps", "blocks", "registers", "shared_memory")


@pytest.mark.parametrize("kernel,needle", [
    (kp(block=2048), "block of 2048 threads"),
    (kp(smem=232449), "opt-in limit"),
    (kp(block=1024, regs=122), "zero occupancy (registers"),
    (kp(grid=265, block=1024, gb=1), "co-resident"),
])
def test_illegal_points_get_reasons(kernel: KernelProfile, needle: str) -> None:
    p = predict(prog(kp("first"), kernel), H200)
    assert p.prune_reason is not None and needle in p.prune_reason
    assert "kernel k" in p.prune_reason
    assert p.time_us == math.inf
    assert should_prune(p, None) == p.prune_reason


def test_grid_barrier_co_resident_limit_is_exact() -> None:
    # 1024 threads, 32 registers: 2 blocks per SM x 132 SMs = 264 co-resident blocks
    assert predict(prog(kp(grid=264, block=1024, gb=2)), H200).prune_reason is None
    assert predict(prog(kp(grid=265, block=1024, gb=2)), H200).prune_reason is not None


def test_ptxas_registers_replace_the_estimate() -> None:
    pr = prog(kp(block=1024, regs=32))
    assert predict(pr, H200).occupancy == 1.0
    assert predict(pr, H200, registers={"k": 64}).occupancy == 0.5
    over = predict(pr, H200, registers={"k": 128})
    assert over.prune_reason and "registers" in over.prune_reason
    assert predict(pr, H200, registers={"other": 128}).prune_reason is None


# ---------------------------------------------------------------------------- model behaviour
def test_launches_cost_time() -> None:
    one = predict(prog(kp(read=ROW_BYTES, write=ROW_BYTES)), H200).time_us
    two = predict(prog(kp("a", read=ROW_BYTES, write=0), kp("b", read=0, write=ROW_BYTES)), H200).time_us
    assert two > one


def test_l2_capacity_decides_reread_cost() -> None:
    fits = predict(prog(kp(reread=ROW_BYTES, ws=8 << 20)), H200).time_us
    misses = predict(prog(kp(reread=ROW_BYTES, ws=1 << 30)), H200).time_us
    none = predict(prog(kp()), H200).time_us
    assert none < fits < misses


def test_bytes_in_flight_and_occupancy_raise_bandwidth() -> None:
    few = predict(prog(kp(bif=4)), H200).time_us
    many = predict(prog(kp(bif=64)), H200).time_us
    assert many < few
    low_occ = predict(prog(kp(bif=4, regs=128)), H200).time_us   # 25% occupancy
    assert low_occ > few


def test_barriers_and_atomics_cost_time() -> None:
    base = predict(prog(kp(grid=264, block=1024)), H200).time_us
    assert predict(prog(kp(grid=264, block=1024, bb=8)), H200).time_us > base
    gb1 = predict(prog(kp(grid=264, block=1024, gb=1)), H200).time_us
    assert gb1 - base == pytest.approx(H200.grid_barrier_us(264), rel=1e-6)
    assert predict(prog(kp(grid=264, block=1024, atomics=10**6)), H200).time_us > base


def test_tail_wave_and_small_grid() -> None:
    # same total bytes: a grid of one full wave beats one with a 1-block tail wave
    wave = 8 * 132                                   # 256 threads, 32 regs: 8 blocks/SM
    full = predict(prog(kp(grid=wave)), H200).time_us
    tail = predict(prog(kp(grid=wave + 1)), H200).time_us
    assert tail > full
    # a grid that leaves most SMs idle is slower than one that fills the device
    assert predict(prog(kp(grid=16)), H200).time_us > 2 * full


def test_compute_bound_kernel() -> None:
    mem = predict(prog(kp(flops=0, sfu=0)), H200).time_us
    heavy = predict(prog(kp(flops=10**12)), H200).time_us
    assert heavy > 10 * mem


def test_ranking_agrees_with_h200_calibration_points() -> None:
    """/work/shared/baselines/README.md (measured on an H200, layernorm 16384x1024 fp32): warp per
    row with the row in registers (122 regs) 41.3-43.5 us < one block per row at 128 threads 44.7 us
    < one block per row at 1024 threads 127 us. Only the order is asserted (defaults are not fitted)."""
    warp_row = predict(prog(kp(grid=2048, block=256, regs=122, bif=128)), H200).time_us
    blk128 = predict(prog(kp(grid=M, block=128, regs=32, bif=32, bb=4, reread=ROW_BYTES,
                             ws=264 * 16 * 4096)), H200).time_us
    blk1024 = predict(prog(kp(grid=M, block=1024, regs=20, bif=4, bb=4, reread=ROW_BYTES,
                              ws=264 * 2 * 4096)), H200).time_us
    assert warp_row < blk128 < blk1024


@settings(max_examples=60, deadline=None)
@given(grid=st.integers(1, 100_000), block=st.sampled_from([32, 64, 128, 256, 512, 1024]),
       regs=st.integers(8, 64), smem=st.integers(0, 48 * 1024), read=st.integers(0, 1 << 30),
       write=st.integers(0, 1 << 30), bif=st.integers(1, 256), dev=st.sampled_from(["h200", "a100", "t4"]))
def test_never_beats_the_copy_floor(grid: int, block: int, regs: int, smem: int, read: int, write: int,
                                    bif: int, dev: str) -> None:
    d = get_device(dev)
    p = predict(prog(kp(grid=grid, block=block, regs=regs, smem=smem, read=read, write=write, bif=bif)), d)
    assert p.prune_reason is None
    floor_us = (read + write) / d.effective_copy_bandwidth_gbs() / 1000.0
    assert math.isfinite(p.time_us) and p.time_us >= floor_us + d.launch_overhead_us * 0.999


def test_explain_terms_add_up() -> None:
    pr = prog(kp("a", grid=264, block=1024, gb=1, bb=2, atomics=1000), kp("b", block=4096))
    rows = explain(pr, H200)
    assert rows[1]["prune_reason"] and "body" not in rows[1]
    a = rows[0]
    assert a["prune_reason"] is None and a["waves"] == pytest.approx(1.0)
    terms = sum(a[t] for t in ("launch", "body", "block_barriers", "grid_barriers", "atomics",
                               "scratch_chain"))
    assert terms == pytest.approx(predict(prog(kp("a", grid=264, block=1024, gb=1, bb=2, atomics=1000)),
                                          H200).time_us)


def test_scratch_chain_per_wave() -> None:
    """Each scratch load a thread waits for costs ``scratch_load_ns``, once per wave of blocks."""
    p = default_params(H200)
    one_wave = dataclasses.replace(kp(grid=264, block=1024), scratch_loads=64)
    base = predict(prog(kp(grid=264, block=1024)), H200).time_us
    assert predict(prog(one_wave), H200).time_us - base == pytest.approx(64 * p.scratch_load_ns / 1000)
    four_waves = dataclasses.replace(kp(grid=4 * 264, block=1024), scratch_loads=64)
    base4 = predict(prog(kp(grid=4 * 264, block=1024)), H200).time_us
    assert predict(prog(four_waves), H200).time_us - base4 == pytest.approx(4 * 64 * p.scratch_load_ns / 1000)


def test_old_profiles_without_scratch_loads_still_load() -> None:
    d = profile_to_dict(prog(kp("a")))
    del d["kernels"][0]["scratch_loads"]          # profile_json written before the field existed
    assert profile_from_dict(d)[0].kernels[0].scratch_loads == 0


def test_lowering_counts_scratch_loads_of_split_partials() -> None:
    """A split row reduction combines its S partials per round: S scratch loads per thread and round
    in the kernel that reads them, none in the one that only writes them."""
    from stitchtune.graph.parse import load_graph
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import Schedule

    g = load_graph(Path(__file__).resolve().parents[2] / "examples" / "layernorm_wide_small.json")
    plan = make_plan(g)
    base = {"block": 256, "min_blocks": 0, "reuse": ["global", "recompute"], "tasks_per_block": 1,
            "schemes": ["independent", "independent"], "tpr": 256, "vec": 1}
    for split in (2, 8):
        prof = lower(g, plan, Schedule.from_dict({**base, "split": split}), H200).profile
        k0, k1, k2 = prof.kernels
        assert k0.scratch_loads == 0
        assert k1.scratch_loads == split                 # mean of stage 1 (one round per block)
        assert k2.scratch_loads == 2 * split             # both reductions' partials


# ---------------------------------------------------------------------------- should_prune
def test_should_prune_rule() -> None:
    p = Prediction(100.0, (100.0,), 1.0, "warps", None)
    assert should_prune(p, None) is None
    assert should_prune(p, 40.0) is None                 # 100 <= 3 x 40
    reason = should_prune(p, 30.0)                       # 100 > 3 x 30
    assert reason and "3 x best measured 30.0" in reason
    assert should_prune(p, 30.0, factor=4.0) is None
    assert should_prune(p, 30.0, factor=math.inf) is None
    assert should_prune(p, float("nan")) is None


# ---------------------------------------------------------------------------- params and profiles
def test_params_files(tmp_path) -> None:
    d = str(tmp_path)
    assert load_params(d, H200) == default_params(H200)
    fitted = dataclasses.replace(default_params(H200), time_scale=2.0, fitted_rows=5, source="calibrated")
    path = save_params(d, H200, fitted)
    assert path == params_path(d, H200) and "NVIDIA_H200_sm_90" in path
    base = predict(prog(kp()), H200, params=default_params(H200)).time_us
    assert load_params(d, H200) == fitted                # and activated:
    assert predict(prog(kp()), H200).time_us == pytest.approx(2 * base)
    # a file whose device key does not match the device it is loaded for is refused
    a100 = get_device("a100")
    with open(params_path(d, a100), "w") as f:
        json.dump(fitted.to_dict(), f)
    with pytest.raises(CostParamsError):
        load_params(d, a100)


def test_profile_round_trip() -> None:
    pr = prog(kp("a"), kp("b", gb=1, grid=132))
    back, regs = profile_from_dict(json.loads(json.dumps(profile_to_dict(pr, {"a": 40}))))
    assert back == pr and regs == {"a": 40}
    assert profile_from_dict(profile_to_dict(pr))[1] is None


# ---------------------------------------------------------------------------- calibration
def _candidates(n: int, seed: int = 0) -> list[ProgramProfile]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        block = int(rng.choice([64, 128, 256, 512, 1024]))
        grid = int(rng.choice([132, 264, 1024, 4096, 16384]))
        nk = int(rng.integers(1, 3))
        ks = [kp(f"k{j}", grid=grid, block=block, regs=int(rng.choice([24, 32, 48, 64])),
                 bif=int(rng.choice([4, 8, 16, 32, 64])), bb=int(rng.integers(0, 6)),
                 reread=int(rng.choice([0, ROW_BYTES])), ws=int(rng.choice([1 << 20, 1 << 30])),
                 read=ROW_BYTES // nk, write=ROW_BYTES // nk)
              for j in range(nk)]
        out.append(prog(*ks))
    return out


def _rows(profiles: list[ProgramProfile], truth: CostParams, with_profiles: bool,
          estimated: bool = False, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for i, pr in enumerate(profiles):
        meas = predict(pr, H200, params=truth).time_us * float(np.exp(rng.normal(0, 0.02)))
        row = dict(workload_key="w1", graph_name="ln", device_key=H200.key, device_name=H200.name,
                   status="ok", estimated=estimated, trial_number=i, measured_us=meas,
                   predicted_us=predict(pr, H200, params=default_params(H200)).time_us)
        if with_profiles:
            row["profile_json"] = json.dumps(profile_to_dict(pr))
        rows.append(row)
    rows.append(dict(rows[0], status="pruned", measured_us=None, trial_number=len(rows)))
    return pd.DataFrame(rows)


TRUTH = dataclasses.replace(default_params(H200), dram_latency_ns=1100.0, bw_efficiency=0.8,
                            launch_scale=0.5, block_barrier_us=0.8)


def _log_err(df: pd.DataFrame, params: CostParams) -> float:
    ok = df[df.status == "ok"]
    pred = [predict(profile_from_dict(json.loads(s))[0], H200, params=params).time_us for s in ok.profile_json]
    return float(np.median(np.abs(np.log(np.array(pred) / ok.measured_us.to_numpy()))))


def test_fit_recovers_synthetic_constants() -> None:
    df = _rows(_candidates(30), TRUTH, with_profiles=True)
    before = _log_err(df, default_params(H200))
    fitted = fit(df, H200)
    after = _log_err(df, fitted)
    assert fitted.source == "calibrated" and fitted.fitted_rows == 30
    assert after < 0.05 < before
    assert abs(math.log(fitted.launch_scale / TRUTH.launch_scale)) < math.log(1.5)


def test_fit_time_scale_only_without_profiles() -> None:
    df = _rows(_candidates(12), default_params(H200), with_profiles=False)
    df["measured_us"] = df["predicted_us"] * 2.0
    fitted = fit(df, H200)
    assert fitted.time_scale == pytest.approx(2.0, rel=1e-3)
    again = fit(df, H200, base=fitted)         # rows were predicted with the old params: compounding
    assert again.time_scale == pytest.approx(4.0, rel=1e-3)


def test_fit_uses_rows_with_profiles_when_some_lack_one() -> None:
    """One row without profile_json (e.g. reused from another study) must not reduce the fit to the
    time scale (the bug behind the H200 calibration that only moved time_scale)."""
    df = _rows(_candidates(30), TRUTH, with_profiles=True)
    df.loc[0, "profile_json"] = None
    fitted = fit(df, H200)
    assert fitted.fitted_rows == 29
    assert fitted.launch_scale != default_params(H200).launch_scale
    assert _log_err(df.iloc[1:], fitted) < 0.05


def test_fit_only_named_constants() -> None:
    df = _rows(_candidates(20), TRUTH, with_profiles=True)
    fitted = fit(df, H200, names=("launch_scale",))
    d = default_params(H200)
    assert fitted.launch_scale != d.launch_scale and fitted.time_scale != d.time_scale
    assert (fitted.dram_latency_ns, fitted.bw_efficiency, fitted.block_barrier_us) == (
        d.dram_latency_ns, d.bw_efficiency, d.block_barrier_us)
    with pytest.raises(CalibrationError):
        fit(df, H200, names=("nonesuch",))


def test_fit_refuses_emulated_rows() -> None:
    df = _rows(_candidates(5), TRUTH, with_profiles=True, estimated=True)
    assert measured_rows(df).empty
    with pytest.raises(CalibrationError):
        fit(df, H200)


# ---------------------------------------------------------------------------- model-check
def _mc_frame(pred: list[float], meas: list[float], estimated: bool = False, wk: str = "w1") -> pd.DataFrame:
    return pd.DataFrame(dict(workload_key=wk, graph_name="g", device_key=H200.key, status="ok",
                             estimated=estimated, trial_number=range(len(pred)),
                             predicted_us=pred, measured_us=meas))


def test_model_check_perfect_ranking() -> None:
    t = model_check(_mc_frame([10, 20, 30, 40], [11, 19, 33, 41]))
    assert len(t) == 1
    r = t.iloc[0]
    assert r.spearman == pytest.approx(1.0) and r.n_ok == 4
    assert not r.winner_pruned_replay and not r.winner_pruned_any_order
    assert r.winner_measured_us == 11 and r.best_predicted_us == 10


def test_model_check_pruned_winner_definitions() -> None:
    # trial order: 0 measured 50, 1 measured 12, 2 = winner measured 10 but predicted 100
    t = model_check(_mc_frame([20, 15, 100], [50, 12, 10])).iloc[0]
    assert t.winner_pruned_replay            # 100 > 3 x min(50, 12) = 36
    assert t.winner_pruned_any_order
    # winner first in trial order: nothing measured before it -> the replay keeps it
    t2 = model_check(_mc_frame([100, 20, 15], [10, 50, 12])).iloc[0]
    assert not t2.winner_pruned_replay and t2.winner_pruned_any_order
    assert t2.winner_pruned_vs_predicted                  # 100 > 3 x 15
    assert not model_check(_mc_frame([10, 20, 30], [11, 19, 33])).iloc[0].winner_pruned_vs_predicted
    # factor large enough keeps it in every order
    assert not model_check(_mc_frame([20, 15, 100], [50, 12, 10]), factor=10).iloc[0].winner_pruned_any_order


def test_model_check_groups_and_estimated_note() -> None:
    df = pd.concat([_mc_frame([1, 2, 3], [3, 2, 1], estimated=True, wk="a"),
                    _mc_frame([1, 2], [1, 2], estimated=True, wk="b")])
    df.loc[len(df)] = dict(workload_key="a", graph_name="g", device_key=H200.key, status="timeout",
                           estimated=True, trial_number=9, predicted_us=1.0, measured_us=None)
    t = model_check(df)
    assert list(t.workload_key) == ["a", "b"]
    assert t.iloc[0].spearman == pytest.approx(-1.0) and t.iloc[0].n_ok == 3
    assert math.isnan(t.iloc[1].spearman)
    assert t.estimated.all() and "not meaningful" in t.iloc[0].note
    text = format_model_check(t)
    assert "IS the cost model's prediction" in text and "Spearman >= 0.7 in 0/2" in text


# ---------------------------------------------------------------------------- CLI
def test_cli_model_check_and_calibrate(tmp_path, capsys) -> None:
    db = str(tmp_path / "db")
    df = _rows(_candidates(6), default_params(H200), with_profiles=False)
    df["measured_us"] = df["predicted_us"] * 1.5
    TuningDB(db).append(df.to_dict("records"))
    assert main(["model-check", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "ln-w1" in out and "Spearman >= 0.7 in 1/1" in out
    assert main(["calibrate", "--db", db, "--profile-model"]) == 0
    out = capsys.readouterr().out
    assert "fitted on 6 measured rows" in out
    assert load_params(db, H200).time_scale == pytest.approx(1.5, rel=1e-3)


def test_cli_calibrate_without_measured_rows(tmp_path, capsys) -> None:
    db = str(tmp_path / "db")
    TuningDB(db).append(_rows(_candidates(3), TRUTH, with_profiles=False, estimated=True).to_dict("records"))
    assert main(["calibrate", "--db", db]) == 2
    assert "no measured ok rows" in capsys.readouterr().err
    assert main(["calibrate", "--db", db, "--device", "nonesuch"]) == 2


def test_resolve_devices_asks_the_local_gpu_once_and_only_for_non_presets() -> None:
    from stitchtune.cost.calibrate import resolve_devices
    from stitchtune.errors import ToolchainError

    local = dataclasses.replace(H200, name="NVIDIA GeForce RTX 3090", cc_minor=6, cc_major=8, source="cuda")
    asked: list[int] = []

    def query() -> object:
        asked.append(1)
        return local

    rtx, other = ("NVIDIA GeForce RTX 3090/sm_86", "NVIDIA GeForce RTX 3090"), ("Other GPU/sm_80", "Other GPU")
    assert resolve_devices([(H200.key, H200.name)], local=query) == ([H200], [])
    assert asked == []                                   # a preset never queries the GPU
    assert resolve_devices([rtx, other, (H200.key, H200.name)], local=query) == ([local, H200], [other[0]])
    assert asked == [1]                                  # once, however many keys miss
    assert resolve_devices([rtx], local=None) == ([], [rtx[0]])

    def no_gpu() -> object:
        raise ToolchainError("no GPU")

    assert resolve_devices([rtx], local=no_gpu) == ([], [rtx[0]])


def test_cli_calibrate_skips_unknown_devices(tmp_path, monkeypatch, capsys) -> None:
    from stitchtune.errors import ToolchainError
    from stitchtune.gpu import device_query

    def no_gpu(ordinal=None):
        raise ToolchainError("no GPU in this test")

    monkeypatch.setattr(device_query, "open_device", no_gpu)  # no local GPU to match against
    db = str(tmp_path / "db")
    df = _rows(_candidates(4), default_params(H200), with_profiles=False)
    other = df.assign(device_key="NVIDIA GeForce RTX 3090/sm_86", device_name="NVIDIA GeForce RTX 3090")
    TuningDB(db).append(pd.concat([df, other]).to_dict("records"))
    assert main(["calibrate", "--db", db, "--profile-model"]) == 0
    out = capsys.readouterr().out
    assert "skipping NVIDIA GeForce RTX 3090/sm_86" in out and "NVIDIA H200/sm_90: fitted on 4" in out
    TuningDB(str(tmp_path / "db2")).append(other.to_dict("records"))
    assert main(["calibrate", "--db", str(tmp_path / "db2")]) == 2


def test_repredict_uses_the_current_model_on_stored_rows() -> None:
    """`model-check --repredict`: ok rows of a known workload are lowered again and predicted by the
    current model with their stored ptxas registers; other rows keep a stored prediction or profile."""
    import json
    from pathlib import Path

    from stitchtune.cost.calibrate import repredict
    from stitchtune.tune.database import read_db
    from stitchtune.graph.parse import load_graph
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import Schedule

    root = Path(__file__).resolve().parents[2]
    df = read_db(root / "results" / "h200-2026-11-29")
    g = load_graph(root / "examples" / "layernorm.json")
    ok = df[(df["graph_name"] == "layernorm") & (df["status"] == "ok")].head(3)
    out = repredict(ok, [g])
    assert list(out["prediction_source"]) == ["relowered"] * len(ok)
    dev = get_device("NVIDIA H200")
    for (_, row), want in zip(ok.iterrows(), out["predicted_us"]):
        prof = lower(g, make_plan(g), Schedule.from_json(row["schedule_json"]), dev).profile
        regs = json.loads(row["profile_json"]).get("registers")
        assert want == pytest.approx(predict(prof, dev, regs).time_us)
    others = repredict(df[df["graph_name"] == "layernorm_wide"].head(2), [])
    assert set(others["prediction_source"]) <= {"profile", "stored"}


def test_heuristic_of_a_32000_wide_row_has_an_sm_to_run_on() -> None:
    """logsoftmax 8192x32000: a 1024-thread row would cache two tensors of 32 floats per thread in
    registers (120 estimated, zero occupancy); the heuristic keeps it on chip in shared memory instead.
    With single_pass on, the predicted time drops (one sweep fewer; predicted, not measured)."""
    from helpers.lowering import DEV, setup
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.lower.entry import lower
    from stitchtune.cost.model import predict

    g, plan, space = setup("logsoftmax.json")
    h = heuristic_schedule(plan, DEV, space)
    p = predict(lower(g, plan, h, DEV, space).profile, DEV)
    assert p.prune_reason is None and math.isfinite(p.time_us)
    p1 = predict(lower(g, plan, dataclasses.replace(h, single_pass=1), DEV, space).profile, DEV)
    assert p1.prune_reason is None and p1.time_us < p.time_us
