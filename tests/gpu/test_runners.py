"""Tests of the runners: the reference check, EmulateRunner, FakeRunner, and the CudaRunner worker
protocol (watchdog, restart, statuses) with the fake GPU backend inside the worker."""

from __future__ import annotations

import dataclasses
import os
import pickle
import random
import time
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from stitchtune.gpu.build import BuildResult, FakeBuilder
from stitchtune.gpu.launch import launch_plan
from stitchtune.gpu.runner import CudaRunner, cuda_available
from stitchtune.errors import ScheduleError, ToolchainError
from stitchtune.gpu.runners import (
    EmulateRunner,
    FakeRunner,
    Measurement,
    check_outputs,
    relative_error,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


# ---- the reference check -------------------------------------------------------------------


def test_relative_error_tolerances_by_dtype() -> None:
    ref = np.linspace(-3, 3, 1000)
    dt = {"y": "float32"}
    assert check_outputs({"y": ref.astype(np.float32)}, {"y": ref}, dt).ok
    off = ref * (1 + 3e-5)
    res = check_outputs({"y": off}, {"y": ref}, dt)
    assert not res.ok and 2e-5 < res.max_rel_error < 4e-5 and "tolerance 1e-05" in res.error
    # the same error is fine for 16-bit outputs
    assert check_outputs({"y": off.astype(np.float16)}, {"y": ref}, {"y": "float16"}).ok
    assert not check_outputs({"y": ref * 1.02}, {"y": ref}, {"y": "float16"}).ok


def test_bfloat16_as_ml_dtypes_or_uint16_bits() -> None:
    ref = np.random.default_rng(1).standard_normal(257)
    bf = ref.astype(ml_dtypes.bfloat16)
    for arr in (bf, bf.view(np.uint16)):
        res = check_outputs({"y": arr}, {"y": ref}, {"y": "bfloat16"})
        assert res.ok and 0 < res.max_rel_error < 1e-2


def test_nan_and_inf_fail_even_when_few() -> None:
    ref = np.ones(10_000)
    out = ref.copy()
    out[17] = np.nan
    res = check_outputs({"y": out}, {"y": ref}, {"y": "float16"})
    assert not res.ok and res.max_rel_error == float("inf") and "1 non-finite" in res.error
    out[17] = np.inf
    assert not check_outputs({"y": out}, {"y": ref}, {"y": "float32"}).ok
    # a reference that is itself inf must be matched exactly
    ref2 = np.array([1.0, np.inf, -np.inf])
    assert relative_error(ref2.copy(), ref2) == 0.0
    assert relative_error(np.array([1.0, np.inf, np.inf]), ref2) == float("inf")


def test_missing_output_wrong_size_and_zero_reference() -> None:
    ref = {"a": np.zeros(4), "b": np.ones(4)}
    dt = {"a": "float32", "b": "float32"}
    res = check_outputs({"a": np.zeros(4)}, ref, dt)
    assert not res.ok and "'b' missing" in res.error
    res = check_outputs({"a": np.zeros(4), "b": np.ones(5)}, ref, dt)
    assert not res.ok and "5 elements" in res.error
    # all-zero reference: absolute error
    assert check_outputs({"a": np.full(4, 1e-7), "b": np.ones(4)}, ref, dt).ok
    assert not check_outputs({"a": np.full(4, 1e-3), "b": np.ones(4)}, ref, dt).ok


def test_measurement_round_trip_and_status_check() -> None:
    m = Measurement("ok", 12.5, (12.0, 12.5, 13.0), 1e-7, False, "")
    assert Measurement.from_dict(m.to_dict()) == m
    with pytest.raises(ValueError):
        Measurement("compile_error")


# ---- FakeRunner ----------------------------------------------------------------------------


def test_fake_runner_programmable() -> None:
    r = FakeRunner(statuses=["ok", "timeout", "wrong_result"], times_us=[5.0, 7.0])
    ms = r.run([("p1", None), ("p2", None), ("p3", None), ("p4", None)])
    assert [m.status for m in ms] == ["ok", "timeout", "wrong_result", "ok"]
    assert ms[0].median_us == 5.0 and ms[3].median_us == 7.0 and ms[0].estimated
    assert ms[1].median_us is None and ms[1].error == "fake timeout"
    r2 = FakeRunner(time_fn=lambda p: float(len(p)), estimated=False)
    (m,) = r2.run([("abc", None)])
    assert m.median_us == 3.0 and not m.estimated and r2.calls == [("abc", None)]
    with pytest.raises(ValueError):
        FakeRunner(statuses=["pruned"])


# ---- EmulateRunner on real lowered programs ---------------------------------------------------


def _programs(example: str, n: int, seed: int = 0, want: Any = None, device: Any = None) -> tuple[Any, list[Any]]:
    from stitchtune.hardware.device import get_device
    from stitchtune.graph.parse import load_graph
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    dev = device or get_device("h200")
    g = load_graph(EXAMPLES / f"{example}.json")
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, dev)
    rng = random.Random(seed)
    progs: list[Any] = []
    for _ in range(2000):
        if len(progs) >= n:
            break
        try:
            p = lower(g, plan, space.sample(rng), dev)
        except ScheduleError:
            continue
        if want is None or want(p):
            progs.append(p)
    assert len(progs) == n
    return g, progs


def _fake_builds(programs: list[Any]) -> list[BuildResult]:
    from stitchtune.gpu.render import render

    return FakeBuilder().build([render(p) for p in programs])


@pytest.mark.parametrize("example", ["layernorm_small", "layernorm_bf16_small"])
def test_emulate_runner_ok_on_sampled_schedules(example: str) -> None:
    from stitchtune.hardware.device import get_device

    g, progs = _programs(example, 2)
    runner = EmulateRunner(g, get_device("h200"), seed=3)
    ms = runner.run(list(zip(progs, _fake_builds(progs), strict=True)))
    for m in ms:
        assert m.status == "ok", m.error
        assert m.estimated and m.samples_us == ()
        assert m.median_us is not None and m.median_us > 0
        assert m.max_rel_error is not None and m.max_rel_error < 1e-2


def test_emulate_runner_wrong_result_and_injected_fault() -> None:
    from stitchtune.hardware.device import get_device
    from stitchtune.emulate.emulator import EmulatorFault, emulate_program

    g, progs = _programs("softmax_small", 1)

    def perturbed(program: Any, inputs: Any, **kw: Any) -> Any:
        out = emulate_program(program, inputs, **kw)
        return {k: v * 1.001 for k, v in out.items()}

    def faulty(program: Any, inputs: Any, **kw: Any) -> Any:
        raise EmulatorFault("out_of_bounds", "load of p0[99999] out of bounds")

    dev = get_device("h200")
    item = list(zip(progs, _fake_builds(progs), strict=True))
    (m,) = EmulateRunner(g, dev, emulate=perturbed).run(item)
    assert m.status == "wrong_result" and m.median_us is None and 5e-4 < m.max_rel_error < 2e-3
    assert "relative error" in m.error
    (m,) = EmulateRunner(g, dev, emulate=faulty, fault_types=(EmulatorFault,)).run(item)
    assert m.status == "launch_error" and "out of bounds" in m.error and m.estimated


def test_emulate_runner_grid_barrier_that_cannot_be_coresident_is_a_launch_error() -> None:
    from stitchtune.hardware.device import get_device

    h200 = get_device("h200")
    g, progs = _programs("layernorm_small", 1,
                         want=lambda p: any(k.uses_grid_sync for k in p.kernels))
    builds = _fake_builds(progs)
    (ok,) = EmulateRunner(g, h200).run(list(zip(progs, builds, strict=True)))
    assert ok.status == "ok", ok.error
    tiny = dataclasses.replace(h200, sm_count=1)  # the same grid cannot be co-resident on 1 SM
    (m,) = EmulateRunner(g, tiny).run(list(zip(progs, builds, strict=True)))
    assert m.status == "launch_error" and "coresident" in m.error.replace("-", "").replace(" ", "")


# ---- CudaRunner: the worker protocol with the fake GPU backend ---------------------------------


X = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
PROG = NS(
    buffers=(NS(name="b0", dtype="float32", size=32, role="input", tensor="x", zero_init=False),
             NS(name="b1", dtype="float32", size=32, role="output", tensor="y", zero_init=False),
             NS(name="b2", dtype="float32", size=4, role="barrier", tensor="", zero_init=True)),
    launches=(NS(kernel="k", grid=2, block=64, smem_bytes=64 * 1024, args=("b0", "b1", "b2")),),
)


def _fake_build(tmp_path: Path, mode: str) -> BuildResult:
    p = tmp_path / f"{mode.replace(':', '_')}.cubin"
    p.write_bytes(f"FAKE:{mode}".encode())
    return BuildResult("ok", "h", str(p), "sm_90")


@pytest.fixture
def fake_runner() -> Any:
    r = CudaRunner.for_arrays({"x": X}, {"x": "float32"}, {"y": X.astype(np.float64) * 2}, {"y": "float32"},
                              repeats=4, warmup=1, timeout_s=1.5, backend="fake")
    yield r
    r.close()


def test_cuda_runner_statuses_and_recovery(fake_runner: CudaRunner, tmp_path: Path) -> None:
    modes = ["ok:3.5", "wrong", "nan", "hang", "ok", "fault", "ok", "crash", "once", "ok:2"]
    t0 = time.monotonic()
    ms = fake_runner.run([(PROG, _fake_build(tmp_path, m)) for m in modes])
    assert time.monotonic() - t0 < 30
    assert [m.status for m in ms] == ["ok", "wrong_result", "wrong_result", "timeout", "ok", "launch_error",
                                      "ok", "launch_error", "wrong_result", "ok"]
    assert ms[0].median_us == 3.5 and ms[0].samples_us == (3.5,) * 4 and not ms[0].estimated
    assert ms[0].max_rel_error == 0.0
    assert "relative error" in ms[1].error
    assert "non-finite" in ms[2].error  # outputs were poisoned: a kernel that writes nothing fails
    assert "worker killed and restarted" in ms[3].error and ms[3].median_us is None
    assert "illegal memory access" in ms[5].error
    assert "exit code 17" in ms[7].error
    assert "scratch not reusable" in ms[8].error
    assert ms[9].median_us == 2.0
    assert fake_runner.restarts == 3  # after the hang, the fault and the crash
    assert fake_runner.device_info is not None and fake_runner.device_info["backend"] == "fake"


def test_cuda_runner_bfloat16_outputs_travel_as_bits(tmp_path: Path) -> None:
    xb = X.astype(ml_dtypes.bfloat16)
    exp = xb.astype(np.float64) + 1
    with CudaRunner.for_arrays({"x": xb}, {"x": "bfloat16"}, {"y": exp}, {"y": "bfloat16"}, repeats=2,
                               warmup=0, backend="fake") as r:
        prog = NS(buffers=(NS(name="i", dtype="bfloat16", size=32, role="input", tensor="x", zero_init=False),
                           NS(name="o", dtype="bfloat16", size=32, role="output", tensor="y", zero_init=False)),
                  launches=(NS(kernel="k", grid=1, block=32, smem_bytes=0, args=("i", "o")),))
        (m,) = r.run([(prog, _fake_build(tmp_path, "ok"))])
        assert m.status == "ok" and m.max_rel_error < 1e-2


def test_cuda_runner_rejects_inconsistent_programs(fake_runner: CudaRunner, tmp_path: Path) -> None:
    b = _fake_build(tmp_path, "ok")
    bad_size = NS(buffers=(PROG.buffers[0], dataclasses.replace(_ns_buf(PROG.buffers[1]), size=31)),
                  launches=(NS(kernel="k", grid=1, block=32, smem_bytes=0, args=("b0", "b1")),))
    with pytest.raises(ValueError, match="does not match"):
        fake_runner.run([(bad_size, b)])
    unknown_arg = NS(buffers=PROG.buffers, launches=(NS(kernel="k", grid=1, block=32, smem_bytes=0,
                                                         args=("b0", "nope")),))
    with pytest.raises(ValueError, match="unknown buffers"):
        fake_runner.run([(unknown_arg, b)])
    no_output = NS(buffers=PROG.buffers[:1], launches=(NS(kernel="k", grid=1, block=32, smem_bytes=0,
                                                            args=("b0",)),))
    with pytest.raises(ValueError, match="no buffer for graph outputs"):
        fake_runner.run([(no_output, b)])
    with pytest.raises(ValueError, match="successful builds"):
        fake_runner.run([(PROG, BuildResult("compile_error", "h", None, "sm_90"))])


@dataclasses.dataclass(frozen=True)
class _Buf:
    name: str
    dtype: str
    size: int
    role: str
    tensor: str
    zero_init: bool


def _ns_buf(b: Any) -> _Buf:
    return _Buf(b.name, b.dtype, b.size, b.role, b.tensor, b.zero_init)


def _held_under(path: Path, pid: str = "self") -> tuple[list[str], list[str]]:
    """(open descriptors, memory maps) of process ``pid`` that refer to the problem files of the runner
    whose directory is ``path``: files under it, or memory files named after it."""
    def ours(target: str) -> bool:
        return target.startswith(f"{path}/") or f"/memfd:{path.name}:" in target

    fds = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if ours(target):
            fds.append(target)
    maps = [ln for ln in Path(f"/proc/{pid}/maps").read_text().splitlines() if ours(ln.split(maxsplit=5)[-1])]
    return fds, maps


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
@pytest.mark.parametrize("memfd", [True, False], ids=["memfd", "unlinked-files"])
def test_cuda_runner_problem_is_in_unlinked_files_freed_on_close(tmp_path: Path, memfd: bool,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    if not memfd:
        monkeypatch.delattr(os, "memfd_create", raising=False)
    elif not hasattr(os, "memfd_create"):
        pytest.skip("no memfd_create here")
    x = np.random.default_rng(5).standard_normal(1 << 16).astype(np.float32)
    r = CudaRunner.for_arrays({"x": x}, {"x": "float32"}, {"y": 2 * x.astype(np.float64)}, {"y": "float32"},
                              repeats=2, warmup=0, backend="fake")
    problem_dir = Path(r._tmpdir)
    assert problem_dir.is_dir() and not list(problem_dir.iterdir())  # unlinked as soon as written
    fds, maps = _held_under(problem_dir)
    assert len(set(fds)) == 2 and all(f.endswith("(deleted)") for f in fds)  # the input and the reference
    assert all(("/memfd:" in f) == memfd for f in fds)
    assert len(maps) == 2  # the parent's read-only view of both
    assert len(pickle.dumps(r._files)) < 2000  # what the worker's setup message carries: no arrays
    np.testing.assert_array_equal(r.problem.inputs["x"], x)
    np.testing.assert_array_equal(r.problem.expected["y"], 2 * x.astype(np.float64))
    assert not r.problem.inputs["x"].flags.writeable
    prog = NS(buffers=(NS(name="i", dtype="float32", size=x.size, role="input", tensor="x", zero_init=False),
                       NS(name="o", dtype="float32", size=x.size, role="output", tensor="y", zero_init=False)),
              launches=(NS(kernel="k", grid=1, block=32, smem_bytes=0, args=("i", "o")),))
    (m,) = r.run([(prog, _fake_build(tmp_path, "ok"))])
    assert m.status == "ok" and m.max_rel_error == 0.0
    worker = str(r._proc.pid)
    assert len(_held_under(problem_dir, worker)[1]) == 2  # the worker maps the same files
    r.close()
    assert not problem_dir.exists()
    assert _held_under(problem_dir) == ([], [])
    with pytest.raises(RuntimeError, match="closed"):
        r.run([(prog, _fake_build(tmp_path, "ok"))])


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_restarted_worker_maps_the_problem_again_and_still_checks(tmp_path: Path) -> None:
    """After a hang (watchdog kill) and a fault (worker exit) each new worker maps the runner's files
    again: right outputs are ok with no error, wrong and unwritten ones are still caught."""
    with CudaRunner.for_arrays({"x": X}, {"x": "float32"}, {"y": X.astype(np.float64) * 2}, {"y": "float32"},
                               repeats=3, warmup=1, timeout_s=1.5, backend="fake") as r:
        problem_dir = Path(r._tmpdir)
        modes = ["ok", "hang", "wrong", "ok:4", "fault", "nan", "once", "ok:2"]
        ms = r.run([(PROG, _fake_build(tmp_path, m)) for m in modes])
        assert [m.status for m in ms] == ["ok", "timeout", "wrong_result", "ok", "launch_error", "wrong_result",
                                          "wrong_result", "ok"]
        assert r.restarts == 2
        assert ms[3].median_us == 4.0 and ms[3].max_rel_error == 0.0 and ms[7].median_us == 2.0
        assert "relative error" in ms[2].error and "non-finite" in ms[5].error
        assert "scratch not reusable" in ms[6].error
        assert len(_held_under(problem_dir, str(r._proc.pid))[1]) == 2
    assert not problem_dir.exists()


def test_relative_error_fast_path_falls_back_where_sums_are_not_finite() -> None:
    from stitchtune.gpu import runners

    rng = np.random.default_rng(4)
    n = 2 * runners._CHUNK + 99
    small = rng.standard_normal(n)
    ref = small.copy()
    ref[[3, runners._CHUNK + 1]] = [np.inf, -np.inf]  # reproduced exactly: the exact path decides
    out = (ref * (1 + 1e-7)).astype(np.float32)
    fin = np.isfinite(ref)
    want = np.linalg.norm(out[fin].astype(np.float64) - ref[fin]) / np.linalg.norm(ref[fin])
    assert runners.relative_error(out, ref) == pytest.approx(want, rel=1e-9)
    for bad in (np.nan, np.inf, -np.inf):
        o = small.astype(np.float32)
        o[runners._CHUNK + 5] = bad
        assert runners.relative_error(o, small) == float("inf")
        assert not check_outputs({"y": o}, {"y": small}, {"y": "float32"}).ok
    half = small.astype(np.float16)
    assert check_outputs({"y": half}, {"y": small}, {"y": "float16"}).ok


def test_launch_plan_of_a_real_program() -> None:
    g, (prog,) = _programs("layernorm_small", 1)
    plan = launch_plan(prog)
    roles = {b.role for b in plan.buffers}
    assert {"input", "output"} <= roles
    assert {b.tensor for b in plan.buffers if b.role == "input"} == {n for n, _ in g.inputs}
    for b in plan.buffers:
        assert b.nbytes == prog.buffer(b.name).nbytes
    for ln, pl in zip(prog.launches, plan.launches, strict=True):
        assert pl.grid == (ln.grid, 1, 1) and pl.block == (ln.block, 1, 1) and pl.smem_bytes == ln.smem_bytes


def test_cuda_runner_from_graph_with_fake_backend(tmp_path: Path) -> None:
    from stitchtune.hardware.device import get_device

    g, progs = _programs("layernorm_small", 2)
    with CudaRunner(g, get_device("h200"), repeats=3, warmup=1, timeout_s=5, backend="fake") as r:
        # the inputs are random normal (never zeros) and the expected values come from the reference
        x = r.problem.inputs["x"]
        assert x.std() > 0.5 and np.count_nonzero(x == 0) == 0
        ms = r.run([(progs[0], _fake_build(tmp_path, "ok")), (progs[1], _fake_build(tmp_path, "nan"))])
        assert [m.status for m in ms] == ["ok", "wrong_result"]


def test_cuda_backend_without_a_gpu_is_a_toolchain_error() -> None:
    if cuda_available():
        pytest.skip("a GPU is present")
    r = CudaRunner.for_arrays({"x": X}, {"x": "float32"}, {"y": X.astype(np.float64)}, {"y": "float32"},
                              backend="cuda", start_timeout_s=60)
    with pytest.raises(ToolchainError, match="cannot use the GPU through cuda-python"):
        r.run([(PROG, BuildResult("ok", "h", __file__, "sm_90"))])
    r.close()


def test_cuda_available_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import stitchtune.gpu.runner as cr

    cr.cuda_available.cache_clear()
    monkeypatch.setattr(cr.importlib.util, "find_spec", lambda name: (_ for _ in ()).throw(RuntimeError("x")))
    assert cr.cuda_available() is False
    cr.cuda_available.cache_clear()


# ---- the worker's GPU backend over the fake driver (the same Driver the real one implements) ------


def _scale(factor: float) -> Any:
    def run(drv: Any, args: tuple[int, ...], ln: Any) -> None:
        x = drv.buffer(args[0]).view(np.float32)
        y = drv.buffer(args[1]).view(np.float32)
        y[:] = factor * x

    return run


def _fault(drv: Any, args: tuple[int, ...], ln: Any) -> None:
    drv.pending = "CUDA_ERROR_ILLEGAL_ADDRESS"  # surfaces at the next synchronising call


def _scratch_reader(drv: Any, args: tuple[int, ...], ln: Any) -> None:
    """Right only while its zero_init scratch really starts at zero (and it leaves it dirty)."""
    s = drv.buffer(args[2])[:32]
    _scale(2.0 if not s.any() else 3.0)(drv, args, ln)
    s[:] = 1


def _driver_backend(kernels: dict[str, Any]) -> tuple[Any, Any, Any]:
    from stitchtune.gpu.fake_driver import FakeDriver
    from stitchtune.gpu.problem import Problem
    from stitchtune.gpu.worker import _DriverBackend

    x = np.random.default_rng(0).standard_normal(256).astype(np.float32)
    problem = Problem({"x": x}, {"x": "float32"}, {"y": 2 * x.astype(np.float64)}, {"y": "float32"})
    drv = FakeDriver(kernels, l2_bytes=1 << 21)
    return drv, _DriverBackend(problem, drv), problem


def _plan_for(kernel: str, smem: int = 0) -> Any:
    return launch_plan(NS(buffers=(NS(name="x", dtype="float32", size=256, role="input", tensor="x", zero_init=False),
                                   NS(name="y", dtype="float32", size=256, role="output", tensor="y", zero_init=False),
                                   NS(name="s", dtype="float32", size=8, role="scratch", tensor="", zero_init=True)),
                          launches=(NS(kernel=kernel, grid=4, block=64, smem_bytes=smem, args=("x", "y", "s")),)))


def test_driver_backend_measures_through_the_launch_path() -> None:
    from stitchtune.gpu.worker import _measure

    drv, be, problem = _driver_backend({"scale2": _scale(2.0), "scale3": _scale(3.0), "reader": _scratch_reader})
    assert be.flush_nbytes == 4 << 20  # twice the L2
    base = len(drv.memory)
    beats: list[int] = []
    res = _measure(be, b"FAKE", _plan_for("scale2", 100 * 1024), problem, 3, 1, lambda: beats.append(1))
    assert res["status"] == "ok" and len(res["samples_us"]) == 3 and res["max_rel_error"] == 0.0
    assert len(beats) == 1 + 1 + 3
    assert ("set_max_dynamic_smem", "scale2", 100 * 1024) in drv.calls
    assert len(drv.launches) == 1 + 1 + 3 and {ln.stream for ln in drv.launches} == {0}
    out = be.outputs["y"]
    poisons = [c for c in drv.calls if c[0] == "memset_d8" and c[1] == out]
    assert len(poisons) == 1 + 3 and all(c[2] == 0xFF for c in poisons)  # before the check and each timed run
    flushes = [c[2] for c in drv.calls if c[0] == "memset_d8" and c[1] == be.flush_buf]
    assert len(flushes) == 3 and flushes[0] != flushes[1]
    assert [c[1] for c in drv.calls if c[0] == "event_record"] == [0, 0] * 3
    assert sum(c[0] == "host_empty" for c in drv.calls) == 2  # download buffers: two sets, made once
    assert len(drv.memory) == base  # the program's scratch is freed again
    wrong = _measure(be, b"FAKE", _plan_for("scale3"), problem, 3, 1, lambda: None)
    assert wrong["status"] == "wrong_result" and "relative error" in wrong["error"]
    # the scratch is re-initialised for each program, and reused across its launches: caught
    reader = _measure(be, b"FAKE", _plan_for("reader"), problem, 2, 0, lambda: None)
    assert reader["status"] == "wrong_result" and "scratch not reusable" in reader["error"]


def test_driver_backend_errors_are_launch_errors() -> None:
    from stitchtune.gpu.worker import _measure

    drv, be, problem = _driver_backend({"scale2": _scale(2.0), "fault": _fault})
    for cubin, kernel, name in ((b"\x7fELF", "scale2", "CUDA_ERROR_INVALID_IMAGE"),
                                (b"FAKE", "nope", "CUDA_ERROR_NOT_FOUND"),
                                (b"FAKE", "fault", "CUDA_ERROR_ILLEGAL_ADDRESS")):
        with pytest.raises(Exception) as e:
            _measure(be, cubin, _plan_for(kernel), problem, 2, 0, lambda: None)
        assert be.is_launch_error(e.value) and e.value.name == name, e.value
    assert not be.is_launch_error(RuntimeError("a bug"))
    assert be.info()["backend"] == "fake-driver"


def test_worker_dies_with_its_parent(tmp_path: Path) -> None:
    """A parent killed with SIGKILL while its worker is stuck in a hung kernel leaves no orphan, and no
    file of its problem (they were unlinked when written; the kernel frees them with the last holder)."""
    import os
    import signal
    import subprocess
    import sys

    cubin = tmp_path / "hang.cubin"
    cubin.write_bytes(b"FAKE:hang")
    pidfile = tmp_path / "worker.pid"
    dirfile = tmp_path / "problem.dir"
    code = f"""
import numpy as np, threading, time
from types import SimpleNamespace as NS
from stitchtune.gpu.build import BuildResult
from stitchtune.gpu.runner import CudaRunner
x = np.ones(8, np.float32)
r = CudaRunner.for_arrays({{"x": x}}, {{"x": "float32"}}, {{"y": x.astype(float)}}, {{"y": "float32"}},
                          timeout_s=600, backend="fake")
open({str(dirfile)!r}, "w").write(r._tmpdir)
prog = NS(buffers=(NS(name="a", dtype="float32", size=8, role="input", tensor="x", zero_init=False),
                   NS(name="b", dtype="float32", size=8, role="output", tensor="y", zero_init=False)),
          launches=(NS(kernel="k", grid=1, block=32, smem_bytes=0, args=("a", "b")),))
def note():
    while r._proc is None:
        time.sleep(0.05)
    open({str(pidfile)!r}, "w").write(str(r._proc.pid))
threading.Thread(target=note, daemon=True).start()
r.run([(prog, BuildResult("ok", "h", {str(cubin)!r}, "sm_90"))])
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
    parent = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pidfile.exists(), "worker never started"
        time.sleep(1.0)  # the worker is now inside the hung fake kernel
        worker = int(pidfile.read_text())
        os.kill(worker, 0)  # alive
        problem_dir = Path(dirfile.read_text())
        assert problem_dir.is_dir() and not list(problem_dir.iterdir())  # files unlinked when written
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            try:
                os.kill(worker, 0)
            except ProcessLookupError:
                return
            try:
                if Path(f"/proc/{worker}/stat").read_text().split(") ")[1].startswith("Z"):
                    return
            except (OSError, IndexError):
                return
            time.sleep(0.2)
        os.kill(worker, signal.SIGKILL)
        raise AssertionError("the worker outlived its parent")
    finally:
        assert not list(problem_dir.iterdir())  # an empty directory is all a SIGKILL leaves
        problem_dir.rmdir()


def test_relative_error_in_pieces_matches_the_direct_formula() -> None:
    from stitchtune.gpu import runners

    rng = np.random.default_rng(3)
    n = 3 * runners._CHUNK + 12345  # several pieces and a ragged tail
    ref = rng.standard_normal(n)
    out = (ref + 1e-6 * rng.standard_normal(n)).astype(np.float32)
    want = np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref)
    assert runners.relative_error(out, ref) == pytest.approx(want, rel=1e-9)
    bad = out.copy()
    bad[n - 5] = np.nan  # in the last piece
    assert runners.relative_error(bad, ref) == float("inf")
    ref_inf = ref.copy()
    ref_inf[2 * runners._CHUNK + 7] = np.inf
    out_inf = out.copy()
    out_inf[2 * runners._CHUNK + 7] = np.inf
    finite = np.isfinite(ref_inf)
    want2 = np.linalg.norm(out_inf[finite].astype(np.float64) - ref_inf[finite]) / np.linalg.norm(ref_inf[finite])
    assert runners.relative_error(out_inf, ref_inf) == pytest.approx(want2, rel=1e-9)
    out_inf[2 * runners._CHUNK + 7] = 1.0
    assert runners.relative_error(out_inf, ref_inf) == float("inf")


def test_a_reference_without_finite_values_fails_the_check() -> None:
    from stitchtune.gpu.runners import check_outputs

    ref = np.full(16, np.nan)
    res = check_outputs({"y": np.full(16, np.nan, dtype=np.float32)}, {"y": ref}, {"y": "float32"})
    assert not res.ok and "no finite value" in res.error


def test_emulate_runner_checks_that_clusters_are_resident() -> None:
    """A cluster kernel runs in the emulator with the device's cluster residency: ok on the H200 preset,
    ``cluster_not_resident`` (a launch error, as on a GPU) on a device whose GPCs hold no whole cluster."""
    from stitchtune.hardware.device import get_device

    dev = get_device("h200")
    g, progs = _programs("softmax_wide_small", 1, want=lambda p: any(k.cluster > 1 for k in p.kernels))
    item = list(zip(progs, _fake_builds(progs), strict=True))
    (m,) = EmulateRunner(g, dev, seed=1).run(item)
    assert m.status == "ok", m.error
    one_sm_gpcs = dataclasses.replace(dev, gpc_sms=(1,) * dev.sm_count, max_blocks_per_sm=1)
    (m,) = EmulateRunner(g, one_sm_gpcs, seed=1).run(item)
    assert m.status == "launch_error" and "cluster" in m.error, m.error


def test_int_and_bool_outputs_are_checked_exactly() -> None:
    """An int64 value one off at 1e9 is within any relative tolerance, and still wrong."""
    import numpy as np

    from stitchtune.gpu.runners import check_outputs

    ref = {"i": np.array([10**9, 3], dtype=np.int64), "b": np.array([True, False])}
    ok = check_outputs({"i": ref["i"].copy(), "b": ref["b"].copy()}, ref, {"i": "int64", "b": "bool"})
    assert ok.ok, ok
    bad = check_outputs({"i": np.array([10**9 + 1, 3]), "b": np.array([True, True])}, ref, {"i": "int64", "b": "bool"})
    assert not bad.ok and "'i' (int64): 1 value(s) differ" in bad.error and "'b' (bool)" in bad.error
