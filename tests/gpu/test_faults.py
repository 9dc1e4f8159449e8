"""Hangs and faults (issue 9, part 4): every failure is a status on its trial, and the search goes on.

* nvcc that hangs (a fake nvcc through ``STITCHTUNE_NVCC`` that sleeps, with a child process) ->
  ``timeout`` after ``timeout_s``, the whole process group killed;
* nvcc that fails -> ``compile_error`` carrying nvcc's text;
* a kernel that faults, hangs, or kills the worker (CudaRunner's fake GPU backend) ->
  ``launch_error`` / ``timeout`` / ``launch_error`` on the trial;
* a whole ``run_search`` over a real graph (real plan/space/lowering/rendering/cost model), whose
  candidates go through all of the above in turn, records every status with its error text and runs
  all its trials. On a GPU (``pytest -m gpu``) the same search injects a real illegal-address write
  and a real endless loop into the rendered CUDA source and runs them through the cuda-python worker.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stitchtune.gpu.build import NvccBuilder
from stitchtune.gpu.runner import CudaRunner, cuda_available

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MODE_RE = re.compile(r"// stitchtune-test-mode: (\w+)")

FAKE_NVCC = r'''#!{python}
"""Fake nvcc for tests: behaviour chosen by a "// stitchtune-test-mode: MODE" line in the source."""
import os, re, subprocess, sys, time
if "--version" in sys.argv:
    print("Cuda compilation tools, fake"); print("Build fake_nvcc_for_tests"); sys.exit(0)
record = {record!r}
src = open(sys.argv[-1]).read()
m = re.search(r"// stitchtune-test-mode: (\w+)", src)
mode = m.group(1) if m else {default!r}
if mode == "nvcc_hang":
    child = subprocess.Popen(["sleep", "600"])
    with open(os.path.join(record, "hang_pids"), "a") as f:
        f.write(f"{{os.getpid()}} {{child.pid}}\n")
    print("nvcc: thinking very hard", flush=True)
    time.sleep(600)
if mode == "nvcc_fail":
    print('kernel.cu(7): error: identifier "st_undefined_thing" is undefined')
    print("1 error detected in the compilation of \"kernel.cu\".")
    sys.exit(2)
out = sys.argv[sys.argv.index("-o") + 1]
with open(out, "wb") as f:
    f.write(("FAKE:" + mode.replace("run_", "") + ":5.0").encode())
for k in re.findall(r"__global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)", src):
    print(f"ptxas info    : Compiling entry function '{{k}}' for 'sm_90'")
    print("ptxas info    : Used 32 registers, used 1 barriers, 0 bytes smem")
'''


def make_fake_nvcc(tmp_path: Path, default: str = "ok") -> Path:
    record = tmp_path / "nvcc_record"
    record.mkdir(exist_ok=True)
    path = tmp_path / "fake_nvcc"
    path.write_text(FAKE_NVCC.format(python=sys.executable, record=str(record), default=default))
    path.chmod(0o755)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------------------------------------ nvcc
def test_nvcc_that_hangs_is_a_timeout_and_its_process_group_is_killed(tmp_path: Path) -> None:
    nvcc = make_fake_nvcc(tmp_path, default="nvcc_hang")
    b = NvccBuilder(jobs=2, timeout_s=1.5, cache_dir=tmp_path / "cache", nvcc=str(nvcc))
    t0 = time.monotonic()
    res = b.build(["// a\n", "// b\n"], "sm_90")
    took = time.monotonic() - t0
    assert [r.status for r in res] == ["timeout", "timeout"]
    assert all("timed out after 1.5 s" in r.error and "thinking very hard" in r.error for r in res)
    assert all(r.cubin_path is None for r in res)
    assert took < 30, took  # two parallel 1.5 s timeouts, not 600 s
    pids = [int(p) for line in (tmp_path / "nvcc_record" / "hang_pids").read_text().split("\n") if line
            for p in line.split()]
    assert len(pids) == 4
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids), "nvcc or its child survived the timeout"
    assert not list((tmp_path / "cache").rglob("*.cubin")), "a timeout must not be cached"


def test_nvcc_that_fails_is_a_compile_error_with_its_text(tmp_path: Path) -> None:
    nvcc = make_fake_nvcc(tmp_path, default="nvcc_fail")
    b = NvccBuilder(jobs=1, timeout_s=30, cache_dir=tmp_path / "cache", nvcc=str(nvcc))
    (r,) = b.build(["// c\n"], "sm_90")
    assert r.status == "compile_error" and r.cubin_path is None
    assert 'identifier "st_undefined_thing" is undefined' in r.error and "nvcc exit 2" in r.error


def test_nvcc_env_override_that_is_not_executable_is_a_toolchain_error(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from stitchtune.errors import ToolchainError

    p = tmp_path / "not_exec"
    p.write_text("#!/bin/sh\n")
    monkeypatch.setenv("STITCHTUNE_NVCC", str(p))
    with pytest.raises(ToolchainError, match="not an executable"):
        NvccBuilder(cache_dir=tmp_path).build(["// x\n"], "sm_90")


# ------------------------------------------------------------------------------------------ a search through faults
# Per built source, in build order (the heuristic trial 0 first, so there is a best to compare with).
FAKE_PLAN = ("run_ok", "nvcc_fail", "run_fault", "nvcc_hang", "run_hang", "run_ok", "run_crash", "run_ok")
GPU_PLAN = ("ok", "nvcc_fail", "fault", "hang", "ok", "ok")

FAULT_SNIPPET = ("  if (threadIdx.x == 0) { volatile float* st_bad = (volatile float*)(0xdead0000000ULL + 4ULL * "
                 "blockIdx.x); *st_bad = 1.0f; }\n")
HANG_SNIPPET = "  { volatile int st_spin = 1; while (st_spin) { } }\n"
KERNEL_OPEN_RE = re.compile(r'(extern "C" __global__ void[^{]*\{\n)')


class ScriptedBuilder:
    """Wraps a builder; the n-th source built gets PLAN[n % len(PLAN)]: a mode line for the fake nvcc,
    or (``real=True``) a real fault / endless loop / compile error injected into the CUDA source."""

    def __init__(self, inner: Any, plan: tuple[str, ...], real: bool = False) -> None:
        self.inner, self.plan, self.real = inner, plan, real
        self.modes: list[str] = []

    def _mark(self, src: str) -> str:
        mode = self.plan[len(self.modes) % len(self.plan)]
        self.modes.append(mode)
        if not self.real:
            return f"// stitchtune-test-mode: {mode}\n{src}"
        if mode == "nvcc_fail":
            return src + "\n#error stitchtune test: injected compile error\n"
        snippet = {"fault": FAULT_SNIPPET, "hang": HANG_SNIPPET}.get(mode)
        return KERNEL_OPEN_RE.sub(lambda m: m.group(1) + snippet, src, count=1) if snippet else src

    def build(self, sources: list[str], arch: str) -> list[Any]:
        return self.inner.build([self._mark(s) for s in sources], arch)


def _enqueue_legal(db: Path, n: int) -> None:
    """Most random points of the space are illegal (pruned before any build): queue the heuristic
    and n - 1 distinct legal schedules so that every trial reaches the builder."""
    import optuna

    from stitchtune.hardware.device import get_device
    from stitchtune.graph.parse import load_graph
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace
    from stitchtune.tune.search import make_storage

    dev = get_device("h200")
    plan = make_plan(load_graph(EXAMPLES / "layernorm_small.json"))
    space = SearchSpace.for_plan(plan, dev)
    scheds = [heuristic_schedule(plan, dev)]
    rng = random.Random(7)
    while len(scheds) < n:
        s = space.sample(rng)
        if all(s.key() != t.key() for t in scheds):
            scheds.append(s)
    study = optuna.create_study(study_name="faults", storage=make_storage(None, str(db)), direction="minimize",
                                load_if_exists=True)
    for s in scheds:
        study.enqueue_trial(space.params_of(s))


def _search(tmp_path: Path, builder: ScriptedBuilder, make_runner: Any, trials: int, backend: str) -> Any:
    from stitchtune.tune.search import SearchConfig, default_components, run_search

    _enqueue_legal(tmp_path / "db", trials)
    comp = dataclasses.replace(default_components(), make_builder=lambda cfg, dev, be: builder,
                               make_runner=make_runner, cuda_available=lambda: True)
    cfg = SearchConfig(graph_path=str(EXAMPLES / "layernorm_small.json"), trials=trials, backend=backend,
                       device="h200", db=str(tmp_path / "db"), study="faults", sampler="random", seed=3, jobs=1,
                       progress=False, prune_factor=1e9)
    return run_search(cfg, comp)


def _rows_by_mode(tmp_path: Path, builder: ScriptedBuilder) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    from stitchtune.tune.database import read_db

    df = read_db(tmp_path / "db").sort_values("trial_number")
    after_build = df["prune_reason"].fillna("").astype(str).str.startswith("after build")
    built = df[((df["status"] != "pruned") | after_build) & ~df["reused"].fillna(False).astype(bool)]
    assert len(built) == len(builder.modes), (built[["trial_number", "status"]], builder.modes)
    # a candidate the cost model prunes after seeing ptxas' registers was built but never run
    return df, [(m, r) for m, (_, r) in zip(builder.modes, built.iterrows(), strict=True)
                if not str(r["prune_reason"] or "").startswith("after build")]


@pytest.mark.slow
def test_search_goes_on_through_nvcc_and_kernel_failures(tmp_path: Path) -> None:
    nvcc = make_fake_nvcc(tmp_path)
    builder = ScriptedBuilder(NvccBuilder(jobs=1, timeout_s=1.5, cache_dir=tmp_path / "cache", nvcc=str(nvcc)),
                              FAKE_PLAN)
    runners: list[CudaRunner] = []

    def make_runner(backend: str, graph: Any, device: Any) -> CudaRunner:
        r = CudaRunner(graph, device, repeats=3, warmup=1, timeout_s=2.0, backend="fake")
        runners.append(r)
        return r

    trials = 10
    res = _search(tmp_path, builder, make_runner, trials, "cuda")
    assert res.trials_run == trials and res.stopped == "trials"
    df, by_mode = _rows_by_mode(tmp_path, builder)
    assert len(df) == trials and df["trial_number"].is_unique
    assert len(builder.modes) >= len(FAKE_PLAN), f"only {len(builder.modes)} candidates were built"
    expected = {"run_ok": "ok", "nvcc_fail": "compile_error", "run_fault": "launch_error",
                "nvcc_hang": "timeout", "run_hang": "timeout", "run_crash": "launch_error"}
    for mode, row in by_mode:
        assert row["status"] == expected[mode], (mode, row["status"], row["error"])
        if mode == "nvcc_fail":
            assert "st_undefined_thing" in row["error"]
        elif mode == "nvcc_hang":
            assert "nvcc timed out" in row["error"]
        elif mode == "run_fault":
            assert "illegal memory access" in row["error"]
        elif mode == "run_hang":
            assert "2" in row["error"] and row["measured_us"] is None
        elif mode == "run_crash":
            assert row["error"]
        else:
            assert row["measured_us"] == pytest.approx(5.0) and not row["error"]
    assert res.best is not None and res.best.status == "ok"
    assert runners and runners[0].restarts >= 3  # after the fault, the hang and the crash


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU through cuda-python")
def test_search_goes_on_through_real_kernel_faults_on_gpu(tmp_path: Path) -> None:
    """On a real GPU: an illegal-address write -> launch_error, an endless loop -> timeout (watchdog),
    an injected #error -> compile_error; the search runs all its trials and finds ok kernels."""
    builder = ScriptedBuilder(NvccBuilder(jobs=1, timeout_s=120, cache_dir=tmp_path / "cache"), GPU_PLAN,
                              real=True)

    def make_runner(backend: str, graph: Any, device: Any) -> CudaRunner:
        return CudaRunner(graph, device, repeats=5, warmup=1, timeout_s=5.0)

    trials = 8
    res = _search(tmp_path, builder, make_runner, trials, "cuda")
    assert res.trials_run == trials
    _, by_mode = _rows_by_mode(tmp_path, builder)
    expected = {"ok": "ok", "nvcc_fail": "compile_error", "fault": "launch_error", "hang": "timeout"}
    seen = set()
    for i, (mode, row) in enumerate(by_mode):
        if mode == "ok" and i > 0:  # an untouched sampled schedule: its own correctness is test_gpu.py's job
            assert row["status"] in ("ok", "wrong_result"), (mode, row["status"], row["error"])
            continue
        assert row["status"] == expected[mode], (mode, row["status"], row["error"])
        seen.add(mode)
        if mode == "fault":
            assert "illegal" in row["error"].lower() or "ILLEGAL" in row["error"], row["error"]
        if mode == "nvcc_fail":
            assert "injected compile error" in row["error"]
    assert {"fault", "hang", "nvcc_fail", "ok"} <= seen
    assert res.best is not None and res.best.status == "ok"
