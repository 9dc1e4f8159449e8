"""bench: floor reasoning, the results table, CSV and chart writers (CPU); one GPU smoke test."""

from __future__ import annotations

import math
from pathlib import Path

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

    if importlib.util.find_spec("cupy") is None or importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs torch + cupy + a CUDA GPU")
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

    monkeypatch.setattr(bench, "tuned_program", no_gpu)
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

    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda *a, **k: 4e12)

    def no_gpu(*a, **k):
        raise ToolchainError("no GPU here")

    monkeypatch.setattr(bench, "tuned_program", no_gpu)
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


def test_cupy_launcher_plumbing_with_a_fake_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pointers, launch order, grid/block, dynamic shared memory opt-in and scratch zeroing reach cupy."""
    import sys
    import types

    import numpy as np

    torch = pytest.importorskip("torch")
    from stitchtune.ir import kir

    launched: list[tuple] = []

    class FakeFunction:
        def __init__(self, name: str) -> None:
            self.name = name
            self.max_dynamic_shared_size_bytes = 0

        def __call__(self, grid, block, args, shared_mem=0, stream=None):
            launched.append((self.name, grid, block, args, shared_mem, self.max_dynamic_shared_size_bytes))

    class FakeModule:
        def __init__(self, path: str) -> None:
            assert path == "/x/k.cubin"

        def get_function(self, name: str) -> FakeFunction:
            return FakeFunction(name)

    fake = types.ModuleType("cupy")
    fake.RawModule = FakeModule  # type: ignore[attr-defined]
    fake.cuda = types.SimpleNamespace(Stream=types.SimpleNamespace(null="NULL"), ExternalStream=None)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", fake)
    bufs = (kir.BufferSpec("x", "float32", 64, "input", tensor="x"),
            kir.BufferSpec("y", "float32", 64, "output", tensor="y"),
            kir.BufferSpec("part", "float32", 8, "scratch", zero_init=True),
            kir.BufferSpec("bar", "float32", 2, "barrier"))
    launches = (kir.Launch("k1", 4, 128, 0, ("x", "part", "bar")),
                kir.Launch("k2", 2, 64, 100 * 1024, ("part", "x", "y")))
    program = types.SimpleNamespace(buffers=bufs, launches=launches)
    lau = bench.CupyLauncher(program, "/x/k.cubin", torch_device="cpu")
    assert int(lau.scratch["part"].sum()) == 0 and lau.scratch["bar"].numel() == 8
    x, y = torch.zeros(64), torch.zeros(64)
    bound = lau.bind({"x": x.data_ptr(), "y": y.data_ptr()})
    lau.run(bound)
    part = lau.scratch["part"].data_ptr()
    assert [(n, g, b, s) for n, g, b, _, s, _ in launched] == [("k1", (4, 1, 1), (128, 1, 1), 0),
                                                               ("k2", (2, 1, 1), (64, 1, 1), 100 * 1024)]
    assert launched[0][3] == (np.uint64(x.data_ptr()), np.uint64(part), np.uint64(lau.scratch["bar"].data_ptr()))
    assert launched[1][3] == (np.uint64(part), np.uint64(x.data_ptr()), np.uint64(y.data_ptr()))
    assert all(isinstance(a, np.uint64) for a in launched[1][3])
    assert launched[1][5] == 100 * 1024  # opted in above the 48 KiB default


@pytest.mark.slow
def test_tuned_program_takes_the_fastest_record_and_builds_it(tmp_path: Path, h200) -> None:
    """The database's fastest ok cuda row for this workload/device/versions is lowered and built by nvcc."""
    import random

    from stitchtune.gpu.build import find_nvcc
    from stitchtune.tune.database import TuningDB
    from stitchtune.errors import ToolchainError
    from stitchtune.lower.entry import CODEGEN_VERSION
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    try:
        find_nvcc()
    except ToolchainError:
        pytest.skip("nvcc not found")
    path = EXAMPLES / "layernorm_small.json"
    g = load_graph(path)
    space = SearchSpace.for_plan(make_plan(g), h200)
    rng = random.Random(0)
    fast, slow = space.sample(rng), space.sample(rng)
    base = {"workload_key": g.workload_key(), "device_key": h200.key, "space_version": str(space.version),
            "codegen_version": str(CODEGEN_VERSION), "backend": "cuda", "status": "ok", "estimated": False}
    TuningDB(tmp_path / "db").append([
        {**base, "schedule_json": slow.to_json(), "schedule_key": slow.key(), "measured_us": 9.0},
        {**base, "schedule_json": fast.to_json(), "schedule_key": fast.key(), "measured_us": 3.0},
        {**base, "backend": "emulate", "estimated": True, "schedule_json": slow.to_json(),
         "schedule_key": slow.key(), "measured_us": 1.0}])
    tp = bench.tuned_program(str(path), g, str(tmp_path / "db"), trials=0, device=h200)
    assert fast.key() in tp.origin and "3.0 us" in tp.origin
    assert Path(tp.cubin_path).stat().st_size > 0
    assert {b.tensor for b in tp.program.buffers if b.role == "input"} == {n for n, _ in g.inputs}
