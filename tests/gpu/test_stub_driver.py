"""The launch path through the *real* driver bindings (cuda-python, and pycuda where installed) over a
stub ``libcuda.so.1`` (tests/gpu/stub_libcuda.c, compiled here with cc): what the FakeDriver cannot
check -- that our calls are valid for the binding users run, with the arguments we mean (kernel,
grid, block, dynamic shared memory, stream, argument pointers, memsets and their streams, context
push/pop). Every script runs in a subprocess whose loader finds the stub; the stub logs each call.
"""

from __future__ import annotations

import importlib.util
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from stubcuda import StubCuda, build, pycuda_symbols

pytest.importorskip("cuda.bindings.driver")

HAS_PYCUDA = importlib.util.find_spec("pycuda") is not None
DRIVERS = ["cuda-python", pytest.param("pycuda", marks=pytest.mark.skipif(
    not HAS_PYCUDA, reason="pycuda is not installed (it builds from source against the CUDA headers)"))]


@pytest.fixture(scope="session")
def stub(request: pytest.FixtureRequest) -> StubCuda:
    """The stub driver library, compiled once per source (cached under pytest's cache directory, or the
    temporary directory when pytest runs without its cache)."""
    cache = getattr(request.config, "cache", None)
    where = Path(cache.mkdir("stub-libcuda")) if cache is not None else Path(tempfile.gettempdir()) / "stub-libcuda"
    return StubCuda(build(where, pycuda_symbols()))


def _run(stub: StubCuda, tmp: Path, body: str, **env: str) -> Any:
    res = stub.run(textwrap.dedent(body), tmp, **env)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


# ---------------------------------------------------------------------------------------- drivers
@pytest.mark.parametrize("binding", DRIVERS)
def test_driver_calls_reach_the_driver_with_our_arguments(stub: StubCuda, tmp_path: Path, binding: str) -> None:
    """The Driver contract over each binding: memory, memsets and copies, module, opt-in, launches
    with the packed arguments, events, errors by name, and the primary context released at close."""
    res = _run(stub, tmp_path, f"""
        import json
        import numpy as np
        from stitchtune.gpu.driver import DriverError
        from stitchtune.gpu.worker_driver import worker_driver
        from stubcuda import stub_image

        drv = worker_driver(0, {binding!r})
        info = drv.info()
        p, q = drv.mem_alloc(256), drv.mem_alloc(256)
        drv.memset_d8(p, 7, 256, 0)
        h = np.arange(64, dtype=np.float32)
        drv.memcpy_htod(p, h)
        m = drv.load_module(stub_image({{"copy_k": 2, "big": 1}}))
        f, g = drv.get_function(m, "copy_k"), drv.get_function(m, "big")
        drv.set_max_dynamic_smem(g, 100 * 1024)
        vals = np.array([p, q], np.uint64)
        slots = np.array([vals.ctypes.data, vals.ctypes.data + 8], np.uint64)
        e0, e1 = drv.event_create(), drv.event_create()
        drv.event_record(e0, 0)
        drv.launch(f, (3, 1, 1), (128, 1, 1), 0, 0, int(slots.ctypes.data), 2)
        drv.launch(g, (1, 2, 1), (64, 1, 1), 100 * 1024, 0, int(slots.ctypes.data), 1)
        drv.event_record(e1, 0)
        drv.event_synchronize(e1)
        ms = drv.event_elapsed_ms(e0, e1)
        out = np.zeros(64, np.float32)
        drv.memcpy_dtoh(out, q)
        drv.synchronize()
        pinned = drv.host_empty(16)
        try:
            drv.get_function(m, "nope")
            err = None
        except DriverError as exc:
            err = exc.name
        drv.mem_free(p)
        drv.unload_module(m)
        drv.close()
        print(json.dumps({{"info": info, "p": p, "q": q, "copied": bool((out == h).all()), "ms": ms,
                          "err": err, "pinned": len(pinned)}}))
    """)
    v = res.value
    assert v["info"]["name"] == "Stub H200 0" and v["info"]["cc"] == "9.0" and v["info"]["sm_count"] == 132
    p, q = v["p"], v["q"]
    [ms] = res.named("cuMemsetD8Async")
    assert (ms["ptr"], ms["value"], ms["bytes"], ms["stream"]) == (p, 7, 256, 0)
    assert [(c["attr"], c["value"]) for c in res.named("cuFuncSetAttribute")] == [(8, 100 * 1024)]
    launches = [(c["kernel"], c["grid"], c["block"], c["smem"], c["stream"], c["args"], c["rc"])
                for c in res.named("cuLaunchKernel")]
    assert launches == [("copy_k", [3, 1, 1], [128, 1, 1], 0, 0, [p, q], 0),
                        ("big", [1, 2, 1], [64, 1, 1], 100 * 1024, 0, [p], 0)]
    assert v["copied"]                       # the stub's copy kernel ran on the pointers we packed
    assert v["ms"] == pytest.approx(0.002)    # the stub's clock: 1 us per launch between the events
    assert v["err"] == "CUDA_ERROR_NOT_FOUND" and v["pinned"] == 16
    assert [c["bytes"] for c in res.named("cuMemcpyHtoD", "cuMemcpyDtoH")] == [256, 256]
    assert res.named("cuDevicePrimaryCtxRelease")[-1]["refs"] == 0   # nothing left retained
    assert all(c["rc"] == 0 for c in res.calls if c["call"] != "cuModuleGetFunction"), \
        [c for c in res.calls if c["rc"]]


# ---------------------------------------------------------------------------------------- Launcher
LAUNCHER = """
import json
import numpy as np
from stitchtune.gpu.driver import CudaDriver, DriverError
from stitchtune.gpu.launch import Launcher, LaunchPlan, PlanBuffer, PlanLaunch, MisalignedPointer
from stubcuda import stub_image

plan = LaunchPlan(
    (PlanBuffer("bx", "float32", 64, "input", False, "x"), PlanBuffer("by", "float32", 64, "output", False, "y"),
     PlanBuffer("junk", "float32", 48, "scratch", False, ""), PlanBuffer("bar", "uint32", 8, "barrier", True, "")),
    (PlanLaunch("k1", (4, 1, 1), (128, 1, 1), 0, ("bx", "junk", "bar"), True),
     PlanLaunch("k2", (2, 1, 1), (64, 1, 1), 64 * 1024, ("junk", "bx", "by"))))
drv = CudaDriver(0, current=False)
"""


def test_launcher_launches_cooperatively_pushes_its_context_and_refuses_misaligned(stub: StubCuda,
                                                                                   tmp_path: Path) -> None:
    res = _run(stub, tmp_path, LAUNCHER + """
lau = Launcher(drv, plan, stub_image({"k1": 3, "k2": 3}), stream=0x5EED)
with drv.activate():
    x, y = drv.mem_alloc(64), drv.mem_alloc(64)
lau.launch(lau.bind({"x": x, "y": y}), 0x77)
try:
    lau.bind({"x": x + 4, "y": y})
    refused = None
except MisalignedPointer as exc:
    refused = str(exc)
with drv.activate():
    drv.synchronize()
big = LaunchPlan(plan.buffers, (PlanLaunch("k1", (132 * 2 + 1, 1, 1), (128, 1, 1), 0, ("bx", "junk", "bar"), True),))
lau2 = Launcher(drv, big, stub_image({"k1": 3}))
try:
    lau2.launch(lau2.bind({"x": x, "y": y}), 0)
    too_large = None
except DriverError as exc:
    too_large = exc.name
lau.close()
print(json.dumps({"x": x, "y": y, "scratch": lau2.scratch, "refused": refused, "too_large": too_large}))
""")
    v = res.value
    allocs = [c for c in res.named("cuMemAlloc")]
    junk, bar = allocs[0]["ptr"], allocs[1]["ptr"]                       # scratch, in plan order
    sets = {c["ptr"]: (c["value"], c["bytes"], c["stream"]) for c in res.named("cuMemsetD8Async")[:2]}
    assert sets == {junk: (0xFF, 48, 0x5EED), bar: (0, 8, 0x5EED)}      # poison / zero, on the given stream
    [coop, tl] = res.named("cuLaunchCooperativeKernel")
    [plain] = res.named("cuLaunchKernel")
    assert (coop["kernel"], coop["grid"], coop["block"], coop["stream"], coop["args"]) == \
        ("k1", [4, 1, 1], [128, 1, 1], 0x77, [v["x"], junk, bar])
    assert (plain["kernel"], plain["smem"], plain["stream"], plain["args"]) == ("k2", 64 * 1024, 0x77, [junk, v["x"], v["y"]])
    assert [c["value"] for c in res.named("cuFuncSetAttribute")] == [64 * 1024]
    assert coop["ctx"] == plain["ctx"] == 0                               # launched in GPU 0's context...
    assert res.calls[-1]["call"] in ("cuCtxPopCurrent", "cuModuleUnload") and \
        len(res.named("cuCtxPushCurrent")) == len(res.named("cuCtxPopCurrent")) > 0   # ...pushed and popped
    assert not res.named("cuCtxSetCurrent")
    assert "'x' at" in v["refused"] and "16-byte aligned" in v["refused"]
    assert v["too_large"] == "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE" and tl["rc"] == 720  # an error, not a hang


def test_a_misaligned_launch_poisons_the_context_as_on_a_gpu(stub: StubCuda, tmp_path: Path) -> None:
    """Why the launch path checks alignment: the stub models the GPU's sticky misaligned-address fault."""
    res = _run(stub, tmp_path, LAUNCHER + """
from stitchtune.gpu.launch import Bound
drv.make_current()
lau = Launcher(drv, plan, stub_image({"k1": 3, "k2": 3}))
x, y = drv.mem_alloc(64), drv.mem_alloc(64)
b = lau.bind({"x": x, "y": y})
vals = b._keep[0]
vals[0] = x + 4                      # what binding x[1:] without the check would launch
lau.launch(b, 0)
errs = []
for call in (drv.synchronize, lambda: drv.mem_alloc(16)):
    try:
        call()
        errs.append(None)
    except DriverError as exc:
        errs.append(exc.name)
print(json.dumps(errs))
""")
    assert res.value == ["CUDA_ERROR_MISALIGNED_ADDRESS"] * 2


def test_the_first_launch_inside_a_capture_is_refused_and_a_warm_one_is_captured(stub: StubCuda,
                                                                                 tmp_path: Path) -> None:
    res = _run(stub, tmp_path, LAUNCHER + """
from cuda.bindings import driver as cu
from stitchtune.gpu.launch import CaptureError
drv.make_current()
x, y = drv.mem_alloc(64), drv.mem_alloc(64)
mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
cu.cuStreamBeginCapture(cu.CUstream(0x99), mode)
try:
    Launcher(drv, plan, stub_image({"k1": 3, "k2": 3}), stream=0x99)
    cold = None
except CaptureError as exc:
    cold = str(exc)
cold_end = int(cu.cuStreamEndCapture(cu.CUstream(0x99))[0])
lau = Launcher(drv, plan, stub_image({"k1": 3, "k2": 3}), stream=0x99)   # warm-up, outside the capture
b = lau.bind({"x": x, "y": y})
lau.launch(b, 0x99)
cu.cuStreamBeginCapture(cu.CUstream(0x99), mode)
lau.launch(b, 0x99)
warm_end = int(cu.cuStreamEndCapture(cu.CUstream(0x99))[0])
print(json.dumps({"cold": cold, "cold_end": cold_end, "warm_end": warm_end}))
""")
    v = res.value
    assert "run the function once before capturing" in v["cold"]
    assert v["cold_end"] == 0 and v["warm_end"] == 0          # neither capture was invalidated
    captured = [c for c in res.named("cuLaunchKernel", "cuLaunchCooperativeKernel") if c["capturing"]]
    assert [c["kernel"] for c in captured] == ["k1", "k2"]


# ---------------------------------------------------------------------------------------- the worker
WORKER = """
import json
from pathlib import Path
from types import SimpleNamespace as NS
import numpy as np
from stitchtune.gpu.runner import CudaRunner
from stubcuda import stub_image

x = np.arange(64, dtype=np.float32)
Path("k.cubin").write_bytes(stub_image({"copy_x": 2}))
prog = NS(buffers=(NS(name="bx", dtype="float32", size=64, role="input", tensor="x"),
                   NS(name="by", dtype="float32", size=64, role="output", tensor="y")),
          launches=(NS(kernel="copy_x", grid=1, block=64, smem_bytes=0, args=("bx", "by")),))
build = NS(status="ok", cubin_path="k.cubin")
with CudaRunner.for_arrays({"x": x}, {"x": "float32"}, {"y": x.astype(np.float64)}, {"y": "float32"},
                           repeats=3, warmup=1, timeout_s=60, driver=DRIVER) as r:
    ms = r.run([(prog, build)] * 3)
    print(json.dumps({"status": [m.status for m in ms], "median": [m.median_us for m in ms],
                      "errors": [m.error for m in ms], "restarts": r.restarts, "info": r.device_info}))
"""


@pytest.mark.parametrize("binding", DRIVERS)
def test_worker_round_trip_and_restart_after_an_injected_fault(stub: StubCuda, tmp_path: Path, binding: str) -> None:
    """The tuning worker over the binding: the second program's first launch faults (sticky, as a real
    fault), it is a launch_error, the worker restarts and the third program measures again."""
    res = _run(stub, tmp_path, WORKER.replace("DRIVER", repr(binding)), STUB_CUDA_FAULT="719@1",
               STUB_CUDA_FAULT_MARK=str(tmp_path / "faulted"), STUB_CUDA_FAIL="")
    v = res.value
    # the fault is injected at the first launch of the first worker (the mark file keeps the restarted
    # worker clean): program 1 fails, programs 2 and 3 run in the new worker
    assert v["status"] == ["launch_error", "ok", "ok"], v["errors"]
    assert "LAUNCH_FAILED" in v["errors"][0].upper().replace(" ", "_") or "launch failed" in v["errors"][0]
    assert v["restarts"] == 1
    # the stub's clock: one launch between the events, 1 us
    assert v["median"][1:] == [pytest.approx(1.0), pytest.approx(1.0)]
    inits = res.named("cuInit")
    assert len(inits) == 2                                          # two worker processes
    launches = res.named("cuLaunchKernel")
    assert {(c["kernel"], tuple(c["grid"]), tuple(c["block"]), c["smem"], c["stream"]) for c in launches} == \
        {("copy_x", (1, 1, 1), (64, 1, 1), 0, 0)}
    # outputs poisoned (0xFF) before the checked launch and every timed one, on the worker's stream
    poison = [c for c in res.named("cuMemsetD8Async") if c["value"] == 0xFF and c["bytes"] == 256]
    assert poison and {c["stream"] for c in poison} == {0}


# ---------------------------------------------------------------------------------------- deploy paths
COMPILED = """
import dataclasses, json
import numpy as np
from cuda.bindings import driver as cu
from stitchtune.deploy.compiled import compile as compile_graph
from stitchtune.errors import StitchtuneError
from stitchtune.gpu.driver import CudaDriver
from stubcuda import stub_image
from helpers.lowering import float_graph

g = float_graph({"x": [8, 64]}, [{"id": "y", "op": "exp", "args": ["x"]}], ["y"])
cg = compile_graph(g, db=None, device="h200", build=False)
img = stub_image({k.name: len(k.params) for k in cg.program.kernels})
cg = dataclasses.replace(cg, cubin=img)
# "torch" holds GPU 0's primary context current on this thread
cu.cuInit(0)
err, ctx0 = cu.cuDevicePrimaryCtxRetain(cu.CUdevice(0))
cu.cuCtxSetCurrent(ctx0)
x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
out = cg(x=x)                         # $STITCHTUNE_CUDA_DEVICE=1: GPU 1
first = cg.device_runner()
cg.device_runner(driver=CudaDriver(1, current=False))   # a new runner: the old one is closed

class Dev:
    def __init__(self, ptr):
        self.__cuda_array_interface__ = {"shape": (8, 64), "typestr": "<f4", "data": (ptr, False), "version": 3}

run = cg.device_runner()
with run.driver.activate():
    ptr = run.driver.mem_alloc(8 * 64 * 4)
try:
    cg(x=Dev(ptr + 4))
    refused = None
except StitchtuneError as exc:
    refused = str(exc)
err, cur = cu.cuCtxGetCurrent()
print(json.dumps({"launches": [[ln.kernel, ln.grid, ln.block, ln.smem_bytes] for ln in cg.program.launches],
                  "same_ctx": int(cur) == int(ctx0), "refused": refused}))
"""


def test_compiled_graph_runs_on_its_gpu_without_changing_the_threads_context(stub: StubCuda, tmp_path: Path) -> None:
    res = _run(stub, tmp_path, COMPILED, STUB_CUDA_DEVICES="2", STITCHTUNE_CUDA_DEVICE="1")
    v = res.value
    assert v["same_ctx"]                      # GPU 0's context (torch's device) is current again
    launches = res.named("cuLaunchKernel", "cuLaunchCooperativeKernel")
    assert {c["ctx"] for c in launches} == {1}    # ...but the kernels ran in GPU 1's
    assert [[c["kernel"], c["grid"][0], c["block"][0], c["smem"]] for c in launches] == v["launches"]
    assert all(a % 16 == 0 for c in launches for a in c["args"])
    assert {c["stream"] for c in launches} == {0}
    assert not [c for c in res.calls if c["call"] == "cuCtxSetCurrent" and c["to"] == 1]
    assert len(res.named("cuCtxPushCurrent")) == len(res.named("cuCtxPopCurrent"))
    # the first runner was closed when a driver was given: its module unloaded, its buffers freed
    assert len(res.named("cuModuleUnload")) == 1 and res.named("cuMemFree")
    assert "input 'x'" in v["refused"] and "16-byte aligned" in v["refused"]


TORCH_OP = """
import ctypes, dataclasses, json
import torch
from cuda.bindings import driver as cu
from torch.fx.experimental.proxy_tensor import make_fx
from stitchtune.deploy.compiled import compile as compile_graph
from stitchtune.deploy.torch_ops import RegionError, RegionKernel
from stitchtune.gpu.driver import CudaDriver
from stitchtune.gpu.launch import CaptureError
from stitchtune.importers.torch_regions import find_regions
from stitchtune.lower.gather import gather_flag_buffers
from stubcuda import stub_image

ROWS, V, H = 6, 10, 16

def f(ids, table, pos):
    return torch.nn.functional.layer_norm(torch.nn.functional.embedding(ids, table) + pos, (H,))

gm = make_fx(f, tracing_mode="fake")(torch.zeros(ROWS, dtype=torch.long), torch.randn(V, H), torch.randn(ROWS, H))
[r] = find_regions(gm).regions
order = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
cg = compile_graph(r.graph, db=None, device="h200", build=False)
cg = dataclasses.replace(cg, cubin=stub_image({k.name: len(k.params) for k in cg.program.kernels}))
drv = CudaDriver(0, current=False)
k = RegionKernel(r.name, r.ops, cg, driver=drv)
args = [torch.randint(0, V, (ROWS,)), torch.randn(V, H), torch.randn(ROWS * H + 1)[1:].view(ROWS, H)]  # offset view
ins = [args[order.index(n.name)] for n in r.inputs]
misaligned = [t.data_ptr() % 16 != 0 for t in ins]
k.run_launch(ins, stream=0x77)
k.run_launch(ins, stream=0x77)
# the gathers' flag (mapped host memory), set "by the kernel": the next call raises before its launch
launcher = k._launchers[(-1, 0x77)][0]
[flag] = gather_flag_buffers(cg.program)
ctypes.c_float.from_address(launcher.scratch[flag]).value = 1.0
try:
    k.run_launch(ins, stream=0x77)
    gather = None
except Exception as exc:
    gather = str(exc)
zeroed = float(launcher.host[flag].view("float32")[0]) == 0.0
# a first call on a stream while it captures: refused; after a warm-up call: captured
cu.cuStreamBeginCapture(cu.CUstream(0x99), cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
try:
    k.run_launch(ins, stream=0x99)
    cold = None
except CaptureError as exc:
    cold = str(exc)
cold_end = int(cu.cuStreamEndCapture(cu.CUstream(0x99))[0])
k.run_launch(ins, stream=0x99)
print("MARK capture", flush=True)
cu.cuStreamBeginCapture(cu.CUstream(0x99), cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
kept = [k.run_launch(ins, stream=0x99)[0] for _ in range(2)]
outs = [t.data_ptr() for t in kept]
err, graph = cu.cuStreamEndCapture(cu.CUstream(0x99))
warm_end = int(err)
err, exe = cu.cuGraphInstantiate(graph, 0)
replays = [int(cu.cuGraphLaunch(exe, cu.CUstream(0x99))[0]) for _ in range(2)]
# a replay's kernel sets the flag: no region call runs, the graph-level check reports it
from stitchtune.deploy import torch_flags
ctypes.c_float.from_address(k._launchers[(-1, 0x99)][0].scratch[flag]).value = 1.0
try:
    torch_flags.check_all()
    replayed = None
except Exception as exc:
    replayed = str(exc)
print(json.dumps({"misaligned": misaligned, "flag": launcher.scratch[flag], "gather": gather, "cold": cold,
                  "zeroed": zeroed, "instantiate": int(err), "replays": replays, "replayed": replayed,
                  "outs": outs, "flag99": k._launchers[(-1, 0x99)][0].scratch[flag],
                  "cold_end": cold_end, "warm_end": warm_end, "nlaunch": len(cg.program.launches),
                  "launches": [[ln.kernel, ln.grid, ln.block, ln.smem_bytes] for ln in cg.program.launches]}))
"""


@pytest.mark.slow
def test_the_torch_region_op_over_the_real_binding(stub: StubCuda, tmp_path: Path) -> None:
    """torch.ops.stitchtune.region's launch path (CPU torch, fake stream handles): per-stream scratch,
    offset views copied, the gather flag reset on the launch stream, capture after a warm-up only."""
    pytest.importorskip("torch")
    res = _run(stub, tmp_path, TORCH_OP)
    v = res.value
    assert any(v["misaligned"])                                   # the test does pass an offset view...
    launches = res.named("cuLaunchKernel", "cuLaunchCooperativeKernel")
    assert all(a % 16 == 0 for c in launches for a in c["args"])  # ...and no launch got it
    n = v["nlaunch"]
    on77 = [c for c in launches if c["stream"] == 0x77]
    assert len(on77) == 2 * n                                     # the third call raised before launching
    assert [[c["kernel"], c["grid"][0], c["block"][0], c["smem"]] for c in on77[:n]] == v["launches"]
    # one module per stream (scratch is never shared between streams), none loaded during the capture
    loads = res.named("cuModuleLoadData")
    assert [c["rc"] for c in loads] == [0, 0] and not [c for c in res.calls if c["rc"] == 900]
    # the flag is mapped host memory: no memset, no copy, no synchronisation ever
    assert not [c for c in res.named("cuMemsetD8Async", "cuMemsetD8") if c["ptr"] == v["flag"]]
    assert not res.named("cuMemcpyDtoH", "cuMemcpyDtoHAsync", "cuCtxSynchronize", "cuStreamSynchronize",
                         "cuEventSynchronize")
    assert [c["flags"] for c in res.named("cuMemHostAlloc")] == [3, 3]   # PORTABLE | DEVICEMAP, per stream
    assert "index out of range" in v["gather"] and "at its next call" in v["gather"] and v["zeroed"]
    assert "run the function once before capturing" in v["cold"] and v["cold_end"] == 0 and v["warm_end"] == 0
    # capture and replay: between begin and end only launches on the capturing stream (and the
    # context's push/pop); the replays run those launches again, in order, on that stream
    i = max(j for j, c in enumerate(res.calls) if c["call"] == "cuStreamBeginCapture")   # the warm capture
    end = next(j for j, c in enumerate(res.calls) if j > i and c["call"] == "cuStreamEndCapture")
    inside = res.calls[i + 1:end]
    assert {c["call"] for c in inside} <= {"cuLaunchKernel", "cuLaunchCooperativeKernel", "cuCtxGetCurrent",
                                           "cuCtxPushCurrent", "cuCtxPopCurrent"}
    captured = [c for c in inside if c["call"].startswith("cuLaunch")]
    assert len(captured) == 2 * n and all(c["stream"] == 0x99 and c["capturing"] for c in captured)
    assert all(out in c["args"] for out, c in zip(v["outs"], captured[n - 1::n]))   # each call's own output
    assert v["flag99"] in captured[0]["args"]                                # the 0x99 launcher's flag
    assert v["instantiate"] == 0 and v["replays"] == [0, 0]
    nodes = res.named("graph_node")
    assert len(nodes) == 2 * 2 * n and {c["stream"] for c in nodes} == {0x99}
    assert [(c["kernel"], c["args"]) for c in nodes] == [(c["kernel"], c["args"]) for c in captured] * 2
    assert "index out of range" in v["replayed"] and "check_errors" in v["replayed"]
    assert len(res.named("cuCtxPushCurrent")) == len(res.named("cuCtxPopCurrent")) > 0


def test_the_stub_implements_every_driver_entry_point_the_package_names() -> None:
    """Every cu* function the package's driver code names is one the stub implements: through the
    bindings' symbol lookup (cuGetProcAddress) for the cuda-python driver, as an exported C function
    for the occupancy check's direct ctypes calls. A call the stub lacked would fail here, not first
    on a GPU."""
    import re

    pkg = Path(__file__).resolve().parents[2] / "stitchtune"
    drv = (pkg / "gpu" / "driver.py").read_text()
    via_binding = set(re.findall(r'_call\("(cu\w+)"', drv)) | set(re.findall(r'self\._cu\.(cu\w+)', drv)) | \
        set(re.findall(r'getattr\(self\._cu, "(cu\w+)"', drv))
    via_ctypes = set(re.findall(r"\bcuda\.(cu\w+)\(", (pkg / "hardware" / "occupancy.py").read_text()))
    source = Path(__file__).with_name("stub_libcuda.c").read_text()
    looked_up = set(re.findall(r'S\("(cu\w+)"', source))
    exported = set(re.findall(r"^CUresult (cu\w+)\(", source, re.M))
    assert {"cuLaunchKernel", "cuLaunchCooperativeKernel", "cuStreamIsCapturing", "cuCtxPushCurrent"} <= via_binding
    assert via_binding <= looked_up, sorted(via_binding - looked_up)
    assert via_ctypes and via_ctypes <= exported, sorted(via_ctypes - exported)


# ---------------------------------------------------------------------------------------- probes
def test_cuda_available_probes_the_configured_gpu_and_releases_it(stub: StubCuda, tmp_path: Path) -> None:
    script = "import json\nfrom stitchtune.gpu.runner import cuda_available\nprint(json.dumps(cuda_available()))\n"
    one = _run(stub, tmp_path, script, STITCHTUNE_CUDA_DEVICE="1", STUB_CUDA_DEVICES="1")
    two = _run(stub, tmp_path, script, STITCHTUNE_CUDA_DEVICE="1", STUB_CUDA_DEVICES="2")
    assert one.value is False and two.value is True
    assert [c["device"] for c in two.named("cuDevicePrimaryCtxRetain")] == [1]
    assert two.named("cuDevicePrimaryCtxRelease")[-1]["refs"] == 0


@pytest.mark.slow
def test_driver_check_leaves_the_threads_context_and_the_reference_count_as_they_were(stub: StubCuda,
                                                                                     tmp_path: Path) -> None:
    """The occupancy check fails here at the module load: the stub takes no real cubin, and a stand-in
    nvcc writes an image that it rejects the same way (no compiler needed). The check still pops its
    context and releases the primary context."""
    nvcc = tmp_path / "nvcc"
    nvcc.write_text('#!/bin/sh\nwhile [ "$#" -gt 1 ]; do [ "$1" = -o ] && printf "not a cubin" > "$2"; shift; done\n')
    nvcc.chmod(0o755)
    res = _run(stub, tmp_path, f"""
import json
from stitchtune.errors import ToolchainError
from stitchtune.hardware.device import get_device
from stitchtune.hardware.occupancy import driver_check
try:
    driver_check(get_device("h200"), 0, {str(nvcc)!r})
    err = None
except ToolchainError as exc:
    err = str(exc)
print(json.dumps(err))
""")
    assert "cuModuleLoad" in res.value
    assert [c["call"] for c in res.calls if c["call"].startswith("cuCtx")] == ["cuCtxPushCurrent", "cuCtxPopCurrent"]
    assert res.named("cuDevicePrimaryCtxRelease")[-1]["refs"] == 0
