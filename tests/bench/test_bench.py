"""bench: floor reasoning, the results table, CSV and chart writers (CPU); one GPU smoke test."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from stitchtune.bench import measure as bench
from stitchtune.bench.measure import BENCH_COLUMNS, STITCHTUNE, Floor, SystemTiming
from stitchtune.hardware.device import get_device
from stitchtune.graph.parse import load_graph, parse_graph

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MiB = 1 << 20


@pytest.fixture(scope="module")
def h200():
    return get_device("h200")


def test_on_chip_bytes_h200(h200) -> None:
    # 132 SMs x (64K registers x 4 B + 228 KiB shared memory) + 60 MiB L2 (as the driver reports it)
    assert bench.on_chip_bytes(h200) == 132 * (256 * 1024 + 228 * 1024) + 60 * MiB


@pytest.mark.parametrize("stem", ["layernorm", "rmsnorm", "softmax", "softmax_tiny_rows", "bias_gelu",
                                  "layernorm_wide", "layernorm_bf16"])
def test_row_and_elementwise_workloads_have_no_forced_reread(stem: str, h200) -> None:
    g = load_graph(EXAMPLES / f"{stem}.json")
    fl = bench.floor_reason(g, h200)
    assert fl.reread_bytes == 0
    assert fl.floor_bytes == fl.min_bytes == g.min_bytes()
    assert "no forced re-read" in fl.reason or "no reduction" in fl.reason


def test_floor_min_bytes_match_baselines(h200) -> None:
    """The byte counts of /work/shared/baselines/h200_peers.csv (each input once, each output once)."""
    want = {"layernorm": 134225920, "layernorm_wide": 136314880, "rmsnorm": 536887296,
            "softmax": 402653184, "softmax_tiny_rows": 268435456, "bias_gelu": 536887296,
            "colsum_sigmoid_scale": 536870912, "layernorm_bf16": 67112960}
    got = {s: bench.floor_reason(load_graph(EXAMPLES / f"{s}.json"), h200).min_bytes for s in want}
    assert got == want


def test_column_reduction_forces_a_reread(h200) -> None:
    g = load_graph(EXAMPLES / "colsum_sigmoid_scale.json")
    fl = bench.floor_reason(g, h200)
    x_bytes = 65536 * 1024 * 4  # 256 MiB must all be read before sum(x, axis 0) exists
    assert fl.reread_bytes == x_bytes - bench.on_chip_bytes(h200)
    assert fl.floor_bytes == 2 * x_bytes + fl.reread_bytes
    assert "read twice" in fl.reason and "256.0 MiB" in fl.reason


def test_column_reduction_small_variant_fits_on_chip(h200) -> None:
    g = load_graph(EXAMPLES / "colsum_sigmoid_scale_small.json")
    assert bench.floor_reason(g, h200).reread_bytes == 0


def test_reduction_without_broadcast_back_forces_nothing(h200) -> None:
    g = parse_graph({"name": "colsum", "inputs": {"x": {"shape": [65536, 1024], "dtype": "float32"}},
                     "nodes": [{"id": "s", "op": "reduce_sum", "args": ["x"], "axes": [0]}], "outputs": ["s"]})
    fl = bench.floor_reason(g, h200)
    assert fl.reread_bytes == 0
    assert "not needed after it" in fl.reason


def test_smaller_chip_forces_reread_of_wide_rows(h200) -> None:
    """1 MiB rows fit on an H200 but not on a device with 512 KiB on chip in all."""
    import dataclasses

    tiny = dataclasses.replace(h200, sm_count=1, regs_per_sm=32 * 1024, smem_per_sm=128 * 1024, l2_bytes=256 * 1024)
    assert bench.on_chip_bytes(tiny) == 512 * 1024
    g = load_graph(EXAMPLES / "layernorm_wide.json")  # 64 rows x 262144 fp32
    fl = bench.floor_reason(g, tiny)
    # two reductions (mean, var) each need a whole row again: (1 MiB - 512 KiB) x 64 rows each
    assert fl.reread_bytes == 2 * 64 * (MiB - 512 * 1024)


def _synthetic() -> tuple[list[SystemTiming], dict[str, Floor]]:
    floors = {"a": Floor(min_bytes=4_000_000, reread_bytes=0, on_chip_bytes=1, reason="r"),
              "b": Floor(min_bytes=2_000_000, reread_bytes=1_000_000, on_chip_bytes=1, reason="r")}
    t = [SystemTiming("a", STITCHTUNE, 1.25, True, "ok"),
         SystemTiming("a", "torch_eager", 5.0, True),
         SystemTiming("a", "jax_jit", 2.5, True),
         SystemTiming("b", STITCHTUNE, 1.0, True),
         SystemTiming("b", "torch_eager", 4.0, True),
         SystemTiming("b", "jax_jit", 1.5, False, "WRONG RESULT"),
         SystemTiming("b", "torch_compile_default", None, False, "skipped")]
    return t, floors


def test_results_table_values() -> None:
    timings, floors = _synthetic()
    df = bench.results_table(timings, floors, copy_bw=4e12)
    assert tuple(df.columns) == BENCH_COLUMNS
    a = df[df.workload == "a"].set_index("system")
    assert a.loc[STITCHTUNE, "floor_us"] == pytest.approx(1.0)  # 4 MB / 4 TB/s
    assert a.loc[STITCHTUNE, "fraction_of_floor"] == pytest.approx(0.8)
    assert a.loc[STITCHTUNE, "speedup_vs_this"] == pytest.approx(1.0)
    assert a.loc["torch_eager", "speedup_vs_this"] == pytest.approx(4.0)  # eager time / stitchtune time
    b = df[df.workload == "b"].set_index("system")
    assert b.loc[STITCHTUNE, "floor_bytes"] == 3_000_000
    assert b.loc[STITCHTUNE, "min_bytes"] == 2_000_000
    assert b.loc[STITCHTUNE, "floor_us"] == pytest.approx(0.75)
    assert math.isnan(b.loc["torch_compile_default", "median_us"])
    assert math.isnan(b.loc["torch_compile_default", "speedup_vs_this"])
    s = bench.summarize(df)
    # best checked peer: a -> jax 2.5/1.25 = 2; b -> eager 4.0 (jax is unchecked) -> geomean sqrt(8)
    assert s["geomean_speedup_vs_best_peer"] == pytest.approx(math.sqrt(8))
    assert s["geomean_speedup_vs"]["torch_eager"] == pytest.approx(4.0)
    assert s["geomean_speedup_vs"]["jax_jit"] == pytest.approx(2.0)
    assert s["at_0.9_floor"] == []
    text = bench.format_table(df)
    assert "geomean speedup of stitchtune over the best peer: 2.83x" in text
    assert "NO" in text


def test_results_table_rejects_bad_bandwidth() -> None:
    timings, floors = _synthetic()
    with pytest.raises(ValueError):
        bench.results_table(timings, floors, copy_bw=0.0)


def test_write_results_csv_and_chart(tmp_path: Path) -> None:
    timings, floors = _synthetic()
    df = bench.results_table(timings, floors, copy_bw=4e12)
    csv_path, png_path = bench.write_results(df, tmp_path / "res", "NVIDIA H200", "synthetic")
    assert csv_path.name == "bench_h200.csv" and png_path.name == "bench_h200.png"
    back = pd.read_csv(csv_path)
    assert tuple(back.columns) == BENCH_COLUMNS
    assert len(back) == len(df)
    assert back["median_us"].tolist()[:3] == [1.25, 5.0, 2.5]
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png_path.stat().st_size > 10_000


def test_device_slug_and_rotations() -> None:
    assert bench.device_slug("NVIDIA H200") == "h200"
    assert bench.device_slug("NVIDIA A100-SXM4-80GB") == "a100_sxm4_80gb"
    assert bench.device_slug("../../etc") == "etc"
    assert bench.rotations_needed(32 * MiB, 50 * MiB) == 4  # 4 x 32 MiB > 100 MiB
    assert bench.rotations_needed(256 * MiB, 50 * MiB) == 2
    assert bench.rotations_needed(10 * MiB, 50 * MiB) * 10 * MiB > 100 * MiB


def _has_gpu() -> bool:
    import importlib.util

    from stitchtune.gpu.runner import cuda_available

    if importlib.util.find_spec("torch") is None or not cuda_available():
        return False
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs torch + cuda-python + a CUDA GPU")
def test_bench_small_example_on_gpu(tmp_path: Path) -> None:
    df = bench.run_bench([EXAMPLES / "layernorm_small.json"], db=str(tmp_path / "db"), trials=2,
                         peers=("eager",), out_dir=tmp_path, iters=20, warmup=3)
    st = df[df.system == STITCHTUNE].iloc[0]
    assert st["checked"], st["note"]
    assert st["median_us"] > 0
    assert df[df.system == "torch_eager"].iloc[0]["checked"]
    assert list(tmp_path.glob("bench_*.csv")) and list(tmp_path.glob("bench_*.png"))


def test_bench_graph_on_cpu_peers_checked_and_timed(monkeypatch: pytest.MonkeyPatch, h200) -> None:
    """The whole per-graph flow on CPU (torch eager + JAX; wall clock): every peer is checked against the
    reference and timed; a stitchtune that cannot run is a row with the reason, not an exception."""
    pytest.importorskip("torch")
    from stitchtune.errors import ToolchainError

    def no_gpu(*a, **k):
        raise ToolchainError("no GPU here")

    monkeypatch.setattr(bench, "stitchtune_program", no_gpu)
    g = load_graph(EXAMPLES / "layernorm_bf16_small.json")
    rows = bench.bench_graph(str(EXAMPLES / "layernorm_bf16_small.json"), g, db="unused", trials=0,
                             peer_names=("eager", "xla"), device=h200, iters=5, warmup=1, torch_device="cpu")
    by = {r.system: r for r in rows}
    assert by[STITCHTUNE].median_us is None and not by[STITCHTUNE].checked
    assert "no GPU here" in by[STITCHTUNE].note
    assert by["torch_eager"].checked and by["torch_eager"].median_us > 0, by["torch_eager"].note
    assert len(by["torch_eager"].samples_us) == 5
    import importlib.util

    if importlib.util.find_spec("jax") is None:
        assert "not installed" in by["jax_jit"].note
    else:
        assert by["jax_jit"].checked and by["jax_jit"].median_us > 0, by["jax_jit"].note
        assert "wall clock" in by["jax_jit"].note
    df = bench.results_table(rows, {g.name: bench.floor_reason(g, h200)}, copy_bw=4e12)
    assert math.isnan(df.set_index("system").loc["torch_eager", "speedup_vs_this"])  # no stitchtune time


def test_cli_bench_user_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from stitchtune.cli import main

    assert main(["bench", str(EXAMPLES / "layernorm_small.json"), "--peers", "eager,tvm"]) == 2
    err = capsys.readouterr().err
    assert "unknown peer 'tvm'" in err and "Traceback" not in err
    assert main(["bench", str(EXAMPLES / "layernorm_small.json"), "--iters", "1"]) == 2
    assert "--iters must be >= 5" in capsys.readouterr().err


def test_run_bench_phases_order_and_files_on_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, h200) -> None:
    """run_bench's orchestration with the GPU parts stubbed: every (graph, system) row once, in graph then
    system order, the CSV/PNG rewritten as it goes."""
    import sys
    import types

    torch = pytest.importorskip("torch")
    from stitchtune.errors import ToolchainError

    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda *a, **k: 4e12)

    def no_gpu(*a, **k):
        raise ToolchainError("no GPU here")

    monkeypatch.setattr(bench, "stitchtune_program", no_gpu)
    real = bench.bench_graph
    monkeypatch.setattr(bench, "bench_graph", lambda *a, **k: real(*a, **{**k, "torch_device": "cpu"}))
    paths = [EXAMPLES / "softmax_small.json", EXAMPLES / "rmsnorm_small.json"]
    said: list[str] = []
    df = bench.run_bench(paths, db=str(tmp_path / "db"), trials=0, peers=("xla", "eager"), device=h200,
                         out_dir=tmp_path, iters=5, warmup=1, progress=said.append)
    assert list(zip(df.workload, df.system)) == [
        ("softmax_small", STITCHTUNE), ("softmax_small", "jax_jit"), ("softmax_small", "torch_eager"),
        ("rmsnorm_small", STITCHTUNE), ("rmsnorm_small", "jax_jit"), ("rmsnorm_small", "torch_eager")]
    assert df[df.system == "torch_eager"]["checked"].all()
    assert (tmp_path / "bench_h200.csv").exists() and (tmp_path / "bench_h200.png").exists()
    assert any(s.startswith("floor softmax_small:") for s in said)


def test_stitchtune_row_launches_through_the_launch_path(monkeypatch: pytest.MonkeyPatch, h200) -> None:
    """bench's stitchtune row: the one launch path on the current torch stream, arguments packed once per
    input rotation (every rotation's tensors reach the kernels, in the program's argument order), no
    allocation while timing; the note says which selection rule chose the schedule."""
    import dataclasses
    from types import SimpleNamespace as NS

    torch = pytest.importorskip("torch")
    import stitchtune
    from stitchtune.gpu import driver as gd
    from stitchtune.gpu.fake_driver import FakeDriver
    from stitchtune.gpu.launch import launch_plan

    g = load_graph(EXAMPLES / "colsum_sigmoid_scale_small.json")
    cg = dataclasses.replace(stitchtune.compile(g, db=None, device=h200, build=False), cubin=b"FAKE")
    drv = FakeDriver()
    monkeypatch.setattr(bench, "stitchtune_program", lambda *a, **k: cg)
    monkeypatch.setattr(gd, "open_driver", lambda ordinal=None: drv)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: NS(cuda_stream=0xBEEF))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    rows = bench.bench_graph(str(EXAMPLES / "colsum_sigmoid_scale_small.json"), g, db="unused", trials=0, peer_names=(),
                             device=h200, iters=5, warmup=2, torch_device="cpu")
    (st,) = rows
    assert st.system == STITCHTUNE and len(st.samples_us) == 5 and st.note.startswith("heuristic: ")
    assert not st.checked  # the fake driver's kernels write nothing: the check must catch it
    plan = launch_plan(cg.program)
    n = len(plan.launches)
    assert len(drv.launches) == (3 + 2 + 5) * n and {ln.stream for ln in drv.launches} == {0xBEEF}
    assert [ln.kernel for ln in drv.launches[:n]] == [ln.kernel for ln in plan.launches]
    from stitchtune.gpu.launch import ELEM_BYTES

    k = bench.rotations_needed(sum(math.prod(s.shape) * ELEM_BYTES[s.dtype] for _, s in g.inputs), h200.l2_bytes)
    per_call = [tuple(ln.args for ln in drv.launches[i:i + n]) for i in range(0, len(drv.launches), n)]
    # calls use rotation i % k: 3 checked (0..2), 2 warm-up (0, 1), 5 timed (2..6): 7 rotations, each with
    # its own output tensors (on CPU the input copies share memory: torch's .to("cpu") is a no-op)
    assert k > 7 and len(set(per_call)) == 7 and per_call[0] == per_call[3] and per_call[2] == per_call[5]
    ops = [c[0] for c in drv.calls]
    n_scratch = sum(b.role in ("scratch", "barrier") for b in plan.buffers)
    assert n_scratch and ops.count("mem_alloc") == n_scratch  # the launcher's scratch, nothing per call
    assert max(i for i, op in enumerate(ops) if op in ("mem_alloc", "memset_d8")) < ops.index("launch")
    assert drv.memory == {} and ops[-1] == "unload_module"  # freed when the row is done


def _illegal_today(legal_json: str) -> str:
    """A schedule of the stored format that today's space refuses (threads per row above the block)."""
    import json

    return json.dumps(dict(json.loads(legal_json), tpr=1024, block=256), sort_keys=True)


def _nvcc_or_skip() -> None:
    from stitchtune.gpu.build import nvcc_found

    if not nvcc_found():
        pytest.skip("nvcc not found")


@pytest.mark.slow
def test_stitchtune_program_uses_selection_and_skips_an_illegal_stored_schedule(tmp_path: Path, h200) -> None:
    """bench's program comes from choose_schedule: the fastest stored record is illegal today, so the
    legal one is used (tuned); with only the illegal one, the heuristic; estimated records lose to measured."""
    import random

    from stitchtune.lower.entry import CODEGEN_VERSION
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace
    from stitchtune.tune.database import TuningDB

    _nvcc_or_skip()
    path = EXAMPLES / "layernorm_small.json"
    g = load_graph(path)
    space = SearchSpace.for_plan(make_plan(g), h200)
    rng = random.Random(0)
    good, est = space.sample(rng), space.sample(rng)
    bad = _illegal_today(good.to_json())
    assert space.violations(type(good).from_json(bad))
    base = {"workload_key": g.workload_key(), "structure_key": g.structure_key(), "device_key": h200.key,
            "space_version": str(space.version), "codegen_version": str(CODEGEN_VERSION), "backend": "cuda",
            "status": "ok", "estimated": False}
    TuningDB(tmp_path / "only_bad").append([{**base, "schedule_json": bad, "schedule_key": "bad", "measured_us": 1.0}])
    cg = bench.stitchtune_program(str(path), g, str(tmp_path / "only_bad"), trials=0, device=h200)
    assert cg.source == "heuristic" and "no longer legal" in cg.choice.reason and cg.cubin
    TuningDB(tmp_path / "db").append([
        {**base, "schedule_json": bad, "schedule_key": "bad", "measured_us": 1.0},
        {**base, "schedule_json": good.to_json(), "schedule_key": good.key(), "measured_us": 3.0},
        {**base, "backend": "emulate", "estimated": True, "schedule_json": est.to_json(),
         "schedule_key": est.key(), "measured_us": 0.5}])
    cg = bench.stitchtune_program(str(path), g, str(tmp_path / "db"), trials=0, device=h200)
    assert cg.source == "tuned" and cg.schedule == good and cg.choice.measured
    assert cg.cubin and {b.tensor for b in cg.program.buffers if b.role == "input"} == {n for n, _ in g.inputs}


@pytest.mark.slow
def test_stitchtune_program_searches_first_without_a_measured_record(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path, h200) -> None:
    import random

    import stitchtune.tune.search as search
    from stitchtune.lower.entry import CODEGEN_VERSION
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace
    from stitchtune.tune.database import TuningDB

    _nvcc_or_skip()
    path = EXAMPLES / "softmax_small.json"
    g = load_graph(path)
    space = SearchSpace.for_plan(make_plan(g), h200)
    found = space.sample(random.Random(3))
    asked: list[Any] = []

    def fake_search(cfg: Any) -> Any:
        asked.append(cfg)
        TuningDB(cfg.db).append([{"workload_key": g.workload_key(), "structure_key": g.structure_key(),
                                  "device_key": h200.key, "space_version": str(space.version),
                                  "codegen_version": str(CODEGEN_VERSION), "backend": "cuda", "status": "ok",
                                  "estimated": False, "schedule_json": found.to_json(),
                                  "schedule_key": found.key(), "measured_us": 2.0}])
        return type("R", (), {"stopped": "trials", "trials_run": 1})()

    monkeypatch.setattr(search, "run_search", fake_search)
    assert bench.stitchtune_program(str(path), g, str(tmp_path / "db"), trials=0, device=h200).source == "heuristic"
    assert not asked  # trials=0: never searches
    cg = bench.stitchtune_program(str(path), g, str(tmp_path / "db"), trials=4, device=h200)
    assert len(asked) == 1 and asked[0].trials == 4 and asked[0].backend == "cuda"
    assert cg.source == "tuned" and cg.schedule == found
    bench.stitchtune_program(str(path), g, str(tmp_path / "db"), trials=4, device=h200)
    assert len(asked) == 1  # a measured tuned record now: no second search
