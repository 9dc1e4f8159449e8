"""The launch path on a real GPU, before anything else runs there (needs a CUDA GPU, torch, cuda-python, nvcc).

    python scripts/gpu_launch_check.py

Each check prints one line ``check <name>: ok|FAIL|skipped (...)``; the last line is the verdict
``launch path: OK`` or ``launch path: FAILED (<checks>)`` and the exit code is 0 or 1.
``scripts/gpu_check.sh`` runs it first and stops there when it fails.

1. ``offset_view``: a torch_entry function called on a view with a storage offset (``base[1:]``, not
   16-byte aligned) gives the right result, and torch's CUDA context is still healthy after it (a
   misaligned vector load would have killed it); ``CompiledGraph`` refuses such a device array with
   a clear error, again with the context healthy after it.
2. ``second_device`` (with two GPUs or more): the function on ``cuda:1`` tensors while torch's current
   device is 0 gives the right result and leaves torch's current device at 0.
3. ``capture``: the first call inside a CUDA-graph capture is refused with the "run ... once before
   capturing" error (the capture is not invalidated, torch still works); after a warm-up call on
   the capture stream, a captured call replays with new input values correctly.
4. ``grid_barrier``: a kernel with a software grid barrier, launched cooperatively by the Launcher on
   one stream while a spinning load kernel occupies every SM from another stream, finishes with the
   right sum (a mispredicted co-residency would hang: the step's timeout then says so).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BARRIER_SRC = r"""
extern "C" __global__ void spin_load(const long long* cycles, float* out) {
  long long start = clock64();
  while (clock64() - start < cycles[0]) { }
  if (threadIdx.x == 0) out[blockIdx.x] = 1.0f;
}

extern "C" __global__ void barrier_sum(const float* x, float* y, unsigned* bar) {
  // one partial sum per block, a grid barrier, then block 0 adds the partials
  __shared__ float s[256];
  float acc = 0.f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (1 << 20); i += gridDim.x * blockDim.x) acc += x[i];
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    y[1 + blockIdx.x] = s[0];
    __threadfence();
    atomicAdd(bar, 1u);
    while (atomicAdd(bar, 0u) < gridDim.x) { }
  }
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    __threadfence();
    float t = 0.f;
    for (int b = 0; b < gridDim.x; ++b) t += ((volatile float*)y)[1 + b];
    y[0] = t;
  }
}
"""


def _f(x: Any) -> Any:
    import torch

    return torch.softmax(x * 2.0, -1)


def _compiled() -> Any:
    import torch

    from stitchtune.deploy.torch_entry import compile as torch_compile

    return torch_compile(_f, db=None, example_inputs=(torch.randn(64, 256, device="cuda"),))


def _close(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.allclose(a, b, atol=1e-5, rtol=1e-4))


def check_offset_view() -> str:
    import numpy as np
    import torch

    import stitchtune
    from stitchtune.errors import StitchtuneError

    sf = _compiled()
    base = torch.randn(64 * 256 + 1, device="cuda")
    x = base[1:].view(64, 256)
    assert x.data_ptr() % 16, "the test view is aligned after all"
    y = sf(x)
    torch.cuda.synchronize()
    if not _close(y, _f(x)):
        return "FAIL (wrong result on an offset view)"
    cg = stitchtune.compile(sf.graph, db=None, build=True)
    name = cg.graph.inputs[0][0]
    try:
        cg(**{name: x})
        return "FAIL (CompiledGraph took a misaligned device array)"
    except StitchtuneError as exc:
        refused = str(exc)
    torch.cuda.synchronize()
    out = cg(**{name: x.contiguous().clone()})
    ok = np.allclose(next(iter(out.values())).reshape(64, 256), _f(x).cpu().numpy(), atol=1e-5)
    return "ok" if ok and "aligned" in refused else f"FAIL (after the refusal: right={ok}, error={refused!r})"


def check_second_device() -> str:
    import torch

    if torch.cuda.device_count() < 2:
        return "skipped (one GPU)"
    torch.cuda.set_device(0)
    sf = _compiled()
    x1 = torch.randn(64, 256, device="cuda:1")
    y1 = sf(x1)
    torch.cuda.synchronize(1)
    if torch.cuda.current_device() != 0:
        return f"FAIL (torch's current device changed to {torch.cuda.current_device()})"
    return "ok" if y1.device == x1.device and _close(y1, _f(x1)) else "FAIL (wrong result on cuda:1)"


def check_capture() -> str:
    import torch

    from stitchtune.gpu.launch import CaptureError

    sf = _compiled()
    x = torch.randn(64, 256, device="cuda")
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    refused = ""
    try:
        with torch.cuda.graph(g, stream=s):
            sf(x)
    except CaptureError as exc:
        refused = str(exc)
    except Exception as exc:  # noqa: BLE001 - a capture ended by the error is reported as such
        refused = f"{type(exc).__name__}: {exc}"
    torch.cuda.synchronize()
    if "once before capturing" not in refused:
        return f"FAIL (a cold call inside a capture: {refused or 'not refused'})"
    with torch.cuda.stream(s):
        sf(x)                          # warm-up on the capture stream
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        y = sf(x)
    x.copy_(torch.randn(64, 256, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    return "ok" if _close(y, _f(x)) else "FAIL (the replayed graph computed a wrong result)"


def check_grid_barrier() -> str:
    import numpy as np
    import torch

    from stitchtune.gpu.build import NvccBuilder
    from stitchtune.gpu.driver import open_driver
    from stitchtune.gpu.launch import Launcher, LaunchPlan, PlanBuffer, PlanLaunch

    index = torch.cuda.current_device()
    drv = open_driver(index)
    major, minor = torch.cuda.get_device_capability(index)
    [b] = NvccBuilder().build([BARRIER_SRC], f"sm_{major}{minor}")
    if b.status != "ok":
        return f"FAIL (nvcc: {b.error[:200]})"
    cubin = Path(b.cubin_path).read_bytes()
    sms = drv.attribute("MULTIPROCESSOR_COUNT")
    n = 1 << 20
    x = torch.rand(n, device="cuda")
    y = torch.zeros(1 + sms, device="cuda")
    cycles = torch.tensor([int(0.3 * 1.5e9)], dtype=torch.int64, device="cuda")   # ~0.3 s at 1.5 GHz
    sink = torch.zeros(sms * 8, device="cuda")
    load_plan = LaunchPlan((PlanBuffer("c", "int64", 8, "input", False, "c"),
                            PlanBuffer("o", "float32", 4 * sms * 8, "output", False, "o")),
                           (PlanLaunch("spin_load", (sms * 8, 1, 1), (1024, 1, 1), 0, ("c", "o")),))
    bar_plan = LaunchPlan((PlanBuffer("x", "float32", 4 * n, "input", False, "x"),
                           PlanBuffer("y", "float32", 4 * (1 + sms), "output", False, "y"),
                           PlanBuffer("bar", "uint32", 4, "barrier", True, "")),
                          (PlanLaunch("barrier_sum", (sms, 1, 1), (256, 1, 1), 0, ("x", "y", "bar"), True),))
    s_load, s_bar = torch.cuda.Stream(), torch.cuda.Stream()
    load = Launcher(drv, load_plan, cubin, int(s_load.cuda_stream))
    bar = Launcher(drv, bar_plan, cubin, int(s_bar.cuda_stream))
    try:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        load.launch(load.bind({"c": cycles.data_ptr(), "o": sink.data_ptr()}), int(s_load.cuda_stream))
        bar.launch(bar.bind({"x": x.data_ptr(), "y": y.data_ptr()}), int(s_bar.cuda_stream))
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    finally:
        load.close()
        bar.close()
    want = float(x.double().sum())
    got = float(y[0])
    ok = abs(got - want) <= 1e-3 * abs(want)
    return (f"ok ({dt:.2f} s with the load)" if ok else f"FAIL (sum {got} != {want})")


CHECKS: list[tuple[str, Callable[[], str]]] = [
    ("offset_view", check_offset_view), ("second_device", check_second_device), ("capture", check_capture),
    ("grid_barrier", check_grid_barrier),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])   # no options: --help, and a stray one refused
    try:
        ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    sys.path.insert(0, str(REPO / "scripts"))
    import gpu_timing
    import torch

    if gpu_timing.options_only():
        print("gpu_launch_check: options ok")
        return 0
    if not torch.cuda.is_available():
        print("launch path: FAILED (torch sees no CUDA GPU)")
        return 1
    failed = []
    for name, fn in CHECKS:
        try:
            res = fn()
        except Exception as exc:  # noqa: BLE001 - every check reports, the verdict counts it
            traceback.print_exc()
            res = f"FAIL ({type(exc).__name__}: {str(exc)[:300]})"
        print(f"check {name}: {res}", flush=True)
        if res.startswith("FAIL"):
            failed.append(name)
    print("launch path: OK" if not failed else f"launch path: FAILED ({', '.join(failed)})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
