"""GPU tests: real kernels through the launch path over cuda-python (skipped unless ``cuda_available()``).

* a kernel that writes to an illegal address becomes ``launch_error`` with the CUDA error text, and
  the next item runs in a fresh worker;
* a kernel that never returns becomes ``timeout`` (watchdog kill), and the next item runs;
* dynamic shared memory above 48 KiB works (MAX_DYNAMIC_SHARED_SIZE_BYTES);
* sampled schedules of every full-size example, built with nvcc and run through cuda-python, match the
  numpy reference. ``STITCHTUNE_GPU_SAMPLES`` (default 2) schedules per example besides the
  heuristic one; ``STITCHTUNE_GPU_EXAMPLES`` (comma-separated names, default all) limits the
  examples (a `search --backend cuda` checks every candidate of an example the same way);
  ``STITCHTUNE_GPU_REPORT`` (a path) receives one JSON line per run program.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import numpy as np
import pytest

from stitchtune.gpu.runner import CudaRunner, cuda_available

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU through cuda-python")]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FULL_EXAMPLES = sorted(p for p in EXAMPLES.glob("*.json") if not p.stem.endswith("_small"))
N = 1 << 20
BLOCK = 256

KERNELS = r"""
extern "C" __global__ void scale2(const float* __restrict__ x, float* __restrict__ y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  y[i] = 2.0f * x[i];
}
extern "C" __global__ void bad_address(const float* __restrict__ x, float* __restrict__ y) {
  volatile float* p = (volatile float*)(0xdead0000000ULL + 4ULL * threadIdx.x);
  *p = x[threadIdx.x];
  y[blockIdx.x * blockDim.x + threadIdx.x] = 0.0f;
}
extern "C" __global__ void spin(const float* __restrict__ x, float* __restrict__ y) {
  volatile const float* vx = x;
  while (vx[0] != 12345.0f) { }   // inputs are random normal: never true
  y[blockIdx.x * blockDim.x + threadIdx.x] = 2.0f * x[blockIdx.x * blockDim.x + threadIdx.x];
}
extern "C" __global__ void smem_big(const float* __restrict__ x, float* __restrict__ y) {
  extern __shared__ float s[];          // 64 KiB: 16384 floats per block
  int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  for (int k = t; k < 16384; k += blockDim.x) s[k] = 0.0f;
  __syncthreads();
  s[16383 - t] = 2.0f * x[i];
  __syncthreads();
  y[i] = s[16383 - t];
}
"""


def _prog(kernel: str, smem: int = 0) -> Any:
    return NS(buffers=(NS(name="x", dtype="float32", size=N, role="input", tensor="x", zero_init=False),
                       NS(name="y", dtype="float32", size=N, role="output", tensor="y", zero_init=False)),
              launches=(NS(kernel=kernel, grid=N // BLOCK, block=BLOCK, smem_bytes=smem, args=("x", "y")),))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from stitchtune.gpu.build import NvccBuilder

    (b,) = NvccBuilder(cache_dir=tmp_path_factory.mktemp("cubin")).build([KERNELS], "sm_90")
    assert b.status == "ok", b.error
    return b


@pytest.fixture
def runner() -> Any:
    x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    r = CudaRunner.for_arrays({"x": x}, {"x": "float32"}, {"y": 2.0 * x.astype(np.float64)}, {"y": "float32"},
                              repeats=10, warmup=2, timeout_s=5.0)
    yield r
    r.close()


def test_real_kernel_is_checked_and_timed(runner: CudaRunner, built: Any) -> None:
    (m,) = runner.run([(_prog("scale2"), built)])
    assert m.status == "ok", m.error
    assert not m.estimated and len(m.samples_us) == 10 and m.max_rel_error == 0.0
    assert 0 < m.median_us < 10_000
    assert runner.device_info is not None and runner.device_info["backend"] == "cuda"


def test_illegal_address_is_a_launch_error_and_the_next_item_runs(runner: CudaRunner, built: Any) -> None:
    ms = runner.run([(_prog("bad_address"), built), (_prog("scale2"), built)])
    assert ms[0].status == "launch_error", ms[0]
    assert "illegal" in ms[0].error.lower() or "address" in ms[0].error.lower(), ms[0].error
    assert ms[1].status == "ok", ms[1].error
    assert runner.restarts == 1


def test_kernel_that_never_returns_is_a_timeout_and_the_next_item_runs(runner: CudaRunner, built: Any) -> None:
    t0 = time.monotonic()
    ms = runner.run([(_prog("spin"), built), (_prog("scale2"), built)])
    assert ms[0].status == "timeout", ms[0]
    assert ms[1].status == "ok", ms[1].error
    assert time.monotonic() - t0 < 120


def test_dynamic_shared_memory_above_48k(runner: CudaRunner, built: Any) -> None:
    (m,) = runner.run([(_prog("smem_big", smem=64 * 1024), built)])
    assert m.status == "ok", m.error


def test_sampled_schedules_of_full_examples_match_the_reference(tmp_path: Path) -> None:
    from stitchtune.gpu.build import NvccBuilder
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.cost.model import predict
    from stitchtune.gpu.device_query import query_device
    from stitchtune.errors import ScheduleError
    from stitchtune.graph.parse import load_graph
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.gpu.render import render
    from stitchtune.space import SearchSpace

    n_samples = int(os.environ.get("STITCHTUNE_GPU_SAMPLES", "2"))
    report = os.environ.get("STITCHTUNE_GPU_REPORT")
    only = {n.strip() for n in os.environ.get("STITCHTUNE_GPU_EXAMPLES", "").split(",") if n.strip()}
    examples = [p for p in FULL_EXAMPLES if not only or p.stem in only]
    assert examples, f"STITCHTUNE_GPU_EXAMPLES names no full-size example: {sorted(only)}"
    dev = query_device()  # the GPU itself (a failing query fails the test instead of using a preset)
    builder = NvccBuilder(cache_dir=tmp_path / "cubin")
    failures: list[str] = []
    ran = 0
    for path in examples:
        g = load_graph(path)
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, dev)
        first: list[Any] = [heuristic_schedule(plan, dev, space)]  # a failing heuristic fails the test
        want = n_samples + len(first)
        rng = random.Random(1234)
        programs: list[tuple[Any, Any]] = []
        for _ in range(50 * want):
            if len(programs) >= want:
                break
            s = first.pop(0) if first else space.sample(rng)
            try:
                programs.append((s, lower(g, plan, s, dev)))
            except ScheduleError:
                continue
        builds = builder.build([render(p) for _, p in programs], dev.arch)
        items = []
        for (s, p), b in zip(programs, builds, strict=True):
            if b.status != "ok":
                failures.append(f"{path.stem} {s.to_json()}: {b.status}: {b.error[:300]}")
                continue
            if predict(p.profile, dev, registers=b.registers).prune_reason:
                continue  # the search would never run it (e.g. grid barrier cannot be co-resident)
            items.append((s, p, b))
        with CudaRunner(g, dev, repeats=5, warmup=1, timeout_s=10.0) as r:
            ms = r.run([(p, b) for _, p, b in items])
        for (s, _, _), m in zip(items, ms, strict=True):
            ran += 1
            if report:
                with open(report, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"example": path.stem, "schedule": s.to_dict(), "status": m.status,
                                        "median_us": m.median_us, "max_rel_error": m.max_rel_error,
                                        "error": m.error[:300], "gpu": (r.device_info or {}).get("name")}) + "\n")
            if m.status != "ok":
                failures.append(f"{path.stem} {s.to_json()}: {m.status}: {m.error[:300]}")
    print(f"ran {ran} schedules of {len(examples)} full-size examples on the GPU")
    assert ran > 0
    assert not failures, "\n".join(failures)


def test_launcher_on_a_torch_stream_and_in_a_cuda_graph(built: Any) -> None:
    """The one launch path on torch's own streams (raw handles), and captured in a CUDA graph: the
    launch call allocates, synchronises and copies nothing."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    from stitchtune.gpu.driver import open_driver
    from stitchtune.gpu.launch import Launcher, launch_plan

    x = torch.randn(N, device="cuda")
    y = torch.empty_like(x)
    lau = Launcher(open_driver(torch.cuda.current_device()), launch_plan(_prog("scale2")),
                   Path(built.cubin_path).read_bytes())
    bound = lau.bind({"x": x.data_ptr(), "y": y.data_ptr()})
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        lau.launch(bound, side.cuda_stream)
    side.synchronize()
    assert torch.equal(y, 2 * x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lau.launch(bound, torch.cuda.current_stream().cuda_stream)
    y.zero_()
    x.copy_(torch.randn(N, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, 2 * x)
    lau.close()
