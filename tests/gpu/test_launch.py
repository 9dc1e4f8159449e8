"""The one launch path (stitchtune.gpu.launch.Launcher) against the in-package fake driver, and the
real cuda-python driver's error path on a machine without a GPU."""

from __future__ import annotations

from types import SimpleNamespace as NS
from typing import Any

import numpy as np
import pytest

from stitchtune.errors import ToolchainError
from stitchtune.gpu.driver import DEFAULT_SMEM_LIMIT, CudaDriver, DriverError
from stitchtune.gpu.fake_driver import FakeDriver
from stitchtune.gpu.launch import Launcher, LaunchPlan, PlanBuffer, PlanLaunch, device_pointer, launch_plan
from stitchtune.gpu.runner import cuda_available

CUBIN = b"FAKE cubin"


def _plan(*launches: PlanLaunch) -> LaunchPlan:
    return LaunchPlan(
        (PlanBuffer("bx", "float32", 64, "input", False, "x"),
         PlanBuffer("by", "float32", 64, "output", False, "y"),
         PlanBuffer("zero", "float32", 32, "scratch", True, ""),
         PlanBuffer("junk", "float32", 48, "scratch", False, ""),
         PlanBuffer("bar", "float32", 8, "barrier", True, "")),
        launches or (PlanLaunch("k1", (4, 1, 1), (128, 1, 1), 0, ("bx", "junk", "bar")),
                     PlanLaunch("k2", (2, 1, 1), (64, 1, 1), 0, ("junk", "zero", "bx", "by"))))


def _io(drv: FakeDriver) -> dict[str, int]:
    return {"x": drv.mem_alloc(64), "y": drv.mem_alloc(64)}


def test_smem_opt_in_only_above_the_48_kib_default() -> None:
    drv = FakeDriver()
    plan = _plan(PlanLaunch("at_default", (1, 1, 1), (32, 1, 1), DEFAULT_SMEM_LIMIT, ("bx", "by")),
                 PlanLaunch("big", (1, 1, 1), (32, 1, 1), 60 * 1024, ("bx", "by")),
                 PlanLaunch("big", (1, 1, 1), (32, 1, 1), 100 * 1024, ("by", "bx")),
                 PlanLaunch("none", (1, 1, 1), (32, 1, 1), 0, ("bx",)))
    lau = Launcher(drv, plan, CUBIN)
    assert [c for c in drv.calls if c[0] == "set_max_dynamic_smem"] == [("set_max_dynamic_smem", "big", 100 * 1024)]
    assert [c[1] for c in drv.calls if c[0] == "get_function"] == ["at_default", "big", "none"]  # once each
    lau.launch(lau.bind(_io(drv)), 7)
    assert [ln.smem for ln in drv.launches] == [DEFAULT_SMEM_LIMIT, 60 * 1024, 100 * 1024, 0]
    # the fake refuses what the GPU refuses: more than 48 KiB without the opt-in
    f = drv.get_function(lau.module, "other")
    with pytest.raises(DriverError, match="CUDA_ERROR_INVALID_VALUE"):
        drv.launch(f, (1, 1, 1), (32, 1, 1), DEFAULT_SMEM_LIMIT + 1, 0, 0, 0)


def test_scratch_zeroed_or_poisoned_and_barriers_zeroed_on_the_given_stream() -> None:
    drv = FakeDriver()
    lau = Launcher(drv, _plan(), CUBIN, stream=0x5EED)
    mem = {n: drv.buffer(p)[: b.nbytes] for b in lau.plan.buffers for n, p in lau.scratch.items() if n == b.name}
    assert set(mem) == {"zero", "junk", "bar"}
    assert (mem["zero"] == 0).all() and (mem["bar"] == 0).all()
    assert (mem["junk"] == 0xFF).all()  # not the allocation's garbage (0xCD), not zero
    sets = [c for c in drv.calls if c[0] == "memset_d8"]
    assert len(sets) == 3 and all(c[4] == 0x5EED for c in sets)
    for m in mem.values():
        m[:] = 7  # a program scribbles on its scratch
    lau.init_scratch(3)
    assert (mem["zero"] == 0).all() and (mem["bar"] == 0).all() and (mem["junk"] == 0xFF).all()
    assert all(c[4] == 3 for c in drv.calls[-3:])


def test_argument_order_per_launch_and_the_stream_of_every_launch() -> None:
    drv = FakeDriver()
    lau = Launcher(drv, _plan(), CUBIN)
    io = _io(drv)
    bound = lau.bind({**io, "unused": 12345})
    s = lau.scratch
    lau.launch(bound, 0xABCDEF)
    lau.launch(bound, 0)
    want = [("k1", (io["x"], s["junk"], s["bar"])), ("k2", (s["junk"], s["zero"], io["x"], io["y"]))]
    assert [(ln.kernel, ln.args) for ln in drv.launches] == want * 2
    assert [ln.stream for ln in drv.launches] == [0xABCDEF, 0xABCDEF, 0, 0]
    assert [(ln.grid, ln.block) for ln in drv.launches[:2]] == [((4, 1, 1), (128, 1, 1)), ((2, 1, 1), (64, 1, 1))]
    with pytest.raises(KeyError, match="'y'"):
        lau.bind({"x": io["x"]})


def test_bind_once_launch_many_costs_only_the_launches() -> None:
    drv = FakeDriver()
    lau = Launcher(drv, _plan(), CUBIN)
    bound = lau.bind(_io(drv))
    n_calls, n_mem = len(drv.calls), len(drv.memory)
    for _ in range(100):
        lau.launch(bound, 5)
    new = drv.calls[n_calls:]
    assert len(new) == 200 and {c[0] for c in new} == {"launch"}  # no alloc, memset, copy or sync
    assert len(drv.memory) == n_mem
    assert len({ln.args for ln in drv.launches[::2]}) == 1


def test_close_frees_scratch_and_unloads() -> None:
    drv = FakeDriver()
    before = len(drv.memory)
    with Launcher(drv, _plan(), CUBIN):
        assert len(drv.memory) == before + 3
    assert len(drv.memory) == before and drv.calls[-1][0] == "unload_module"


def test_mapped_scratch_is_host_memory_initialised_on_the_host_and_freed() -> None:
    """Launcher(mapped=...): those scratch buffers come from host_alloc_mapped, are initialised by host
    writes (no memset), the kernels get their device pointers, and close frees them."""
    drv = FakeDriver()
    before = len(drv.memory)
    lau = Launcher(drv, _plan(), CUBIN, stream=5, mapped=("zero", "junk"))
    assert [c for c in drv.calls if c[0] == "host_alloc_mapped"] == [("host_alloc_mapped", 32), ("host_alloc_mapped", 48)]
    assert set(lau.host) == {"zero", "junk"} and (lau.host["zero"] == 0).all() and (lau.host["junk"] == 0xFF).all()
    assert [c for c in drv.calls if c[0] == "memset_d8"] == [("memset_d8", lau.scratch["bar"], 0, 8, 5)]
    lau.launch(lau.bind(_io(drv)), 5)
    assert lau.scratch["junk"] in drv.launches[0].args and lau.scratch["zero"] in drv.launches[1].args
    drv.buffer(lau.scratch["zero"])[:4] = 1               # "the kernel" writes through the device pointer
    assert lau.host["zero"][:4].tolist() == [1, 1, 1, 1]  # the host sees it without a copy
    lau.close()
    assert len(drv.memory) == before + 2 and [c[0] for c in drv.calls].count("host_free") == 2   # x, y remain


def test_driver_errors_are_clear_and_leave_nothing_allocated() -> None:
    drv = FakeDriver(kernels={"k1": lambda d, a, ln: None})
    with pytest.raises(DriverError, match="cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE") as e:
        Launcher(drv, _plan(), b"\x7fELF not ours")
    assert isinstance(e.value, ToolchainError) and e.value.name == "CUDA_ERROR_INVALID_IMAGE"
    with pytest.raises(DriverError, match="CUDA_ERROR_NOT_FOUND"):
        Launcher(drv, _plan(), CUBIN)  # k2 is not in the module
    assert drv.memory == {} and drv.calls[-1][0] == "unload_module"
    drv = FakeDriver()
    lau = Launcher(drv, _plan(), CUBIN)
    bound = lau.bind(_io(drv))
    drv.fail["launch"] = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
    with pytest.raises(DriverError) as e:
        lau.launch(bound, 0)
    assert e.value.call == "launch" and e.value.name == "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
    drv.fail["mem_alloc"] = "CUDA_ERROR_OUT_OF_MEMORY"
    n = len(drv.memory)
    with pytest.raises(DriverError, match="OUT_OF_MEMORY"):
        Launcher(drv, _plan(), CUBIN)
    assert len(drv.memory) == n


def test_launch_plan_of_a_duck_typed_program() -> None:
    prog = NS(buffers=(NS(name="a", dtype="float16", size=10, role="input", tensor="x", zero_init=False),
                       NS(name="s", dtype="float32", size=3, role="barrier", tensor="", zero_init=False)),
              launches=(NS(kernel="k", grid=5, block=(32, 2), smem_bytes=None, args=("a", "s")),))
    plan = launch_plan(prog)
    assert plan.buffers == (PlanBuffer("a", "float16", 20, "input", False, "x"),
                            PlanBuffer("s", "float32", 12, "barrier", True, ""))
    assert plan.launches == (PlanLaunch("k", (5, 1, 1), (32, 2, 1), 0, ("a", "s"), cooperative=True),)
    with pytest.raises(ValueError, match="unknown buffers"):
        launch_plan(NS(buffers=prog.buffers, launches=(NS(kernel="k", grid=1, block=1, args=("zz",)),)))


def test_device_pointer_from_cuda_array_interface() -> None:
    def arr(shape: tuple[int, ...], strides: Any) -> Any:
        return NS(__cuda_array_interface__={"shape": shape, "typestr": "<f4", "data": (0x7000, False),
                                            "strides": strides, "version": 3})

    assert device_pointer(arr((4, 8), None)) == 0x7000
    assert device_pointer(arr((4, 8), (32, 4))) == 0x7000
    assert device_pointer(arr((4, 1), (4, 999))) == 0x7000  # a stride of a size-1 dim does not matter
    with pytest.raises(ValueError, match="C-contiguous"):
        device_pointer(arr((4, 8), (4, 16)))
    with pytest.raises(TypeError):
        device_pointer(np.zeros(3))


def test_cuda_driver_without_a_gpu_is_a_toolchain_error() -> None:
    if cuda_available():
        pytest.skip("a GPU is here")
    with pytest.raises(ToolchainError, match="cuda-python"):
        CudaDriver(0)


def test_cuda_driver_passes_argument_types_the_bindings_accept() -> None:
    """Each call converts its arguments before the driver library is loaded, so on a machine without
    libcuda a wrong argument type is a TypeError and a right one reaches the loader (or the driver)."""
    from stitchtune.gpu import driver as gd

    try:
        cu = gd._binding()
    except ToolchainError:
        pytest.skip("cuda-python not installed")
    if cuda_available():
        pytest.skip("a GPU is here: the GPU tests cover the real calls")
    drv = CudaDriver.__new__(CudaDriver)
    drv._cu, drv._ok, drv._launch, drv._pinned = cu, cu.CUresult.CUDA_SUCCESS, cu.cuLaunchKernel, []
    drv.device, drv.context = cu.CUdevice(0), cu.CUcontext()
    host = np.zeros(16, np.uint8)
    slots = np.zeros(2, np.uint64)
    calls = [lambda: drv.mem_alloc(16), lambda: drv.mem_free(1 << 20), lambda: drv.memset_d8(1 << 20, 255, 16, 77),
             lambda: drv.memcpy_htod(1 << 20, host), lambda: drv.memcpy_dtoh(host, 1 << 20),
             lambda: drv.load_module(CUBIN), lambda: drv.get_function(cu.CUmodule(), "k"),
             lambda: drv.set_max_dynamic_smem(cu.CUfunction(), 100 * 1024),
             lambda: drv.launch(cu.CUfunction(), (1, 2, 3), (32, 1, 1), 0, 0x1234, int(slots.ctypes.data), 2),
             lambda: drv.event_create(), lambda: drv.event_record(cu.CUevent(), 0x1234),
             lambda: drv.synchronize(), lambda: drv.make_current(), lambda: drv.attribute("L2_CACHE_SIZE")]
    for call in calls:
        with pytest.raises(Exception) as e:  # noqa: PT011 - any failure but a TypeError
            call()
        assert not isinstance(e.value, TypeError), e.value
    with pytest.raises(TypeError):  # the check above can fail: a wrong type is refused
        drv.memset_d8(1 << 20, 0, 16, "not a stream")


def test_bind_refuses_pointers_the_vector_loads_would_fault_on() -> None:
    from stitchtune.gpu.launch import ALIGN, MisalignedPointer

    drv = FakeDriver()
    lau = Launcher(drv, _plan(), CUBIN)
    io = _io(drv)
    with pytest.raises(MisalignedPointer, match=r"'x' at 0x[0-9a-f]+") as err:
        lau.bind({"x": io["x"] + 4, "y": io["y"]})
    assert err.value.tensors == {"x": io["x"] + 4} and isinstance(err.value, ValueError)
    lau.bind({"x": io["x"] + ALIGN, "y": io["y"]})   # any multiple of 16 is fine
    arr = NS(__cuda_array_interface__={"shape": (4,), "typestr": "<f4", "data": (io["x"] + 4, False), "version": 3})
    assert device_pointer(arr) == io["x"] + 4
    with pytest.raises(ValueError, match="16-byte aligned"):
        device_pointer(arr, aligned=True)


def test_no_launcher_is_made_while_its_stream_captures() -> None:
    from stitchtune.gpu.launch import CaptureError

    drv = FakeDriver()
    drv.capturing.add(0x99)
    with pytest.raises(CaptureError, match="once before capturing"):
        Launcher(drv, _plan(), CUBIN, stream=0x99)
    assert not drv.calls                  # nothing loaded or allocated: the capture stays valid
    drv.capturing.clear()
    Launcher(drv, _plan(), CUBIN, stream=0x99)   # after the capture: made as usual


def test_every_launcher_call_runs_in_an_activated_context_and_barrier_kernels_are_cooperative() -> None:
    drv = FakeDriver()
    lau = Launcher(drv, _plan(), CUBIN)
    lau.launch(lau.bind(_io(drv)), 5)
    lau.close()
    # made (init_scratch nested inside), launched, closed: every push popped
    assert drv.active == 0 and drv.context_calls.count("push") == drv.context_calls.count("pop") == 4
    assert [(ln.kernel, ln.cooperative) for ln in drv.launches] == [("k1", True), ("k2", False)]


def test_the_worker_driver_is_chosen_by_name_or_by_what_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import stitchtune.gpu.driver as gd
    import stitchtune.gpu.worker_driver as wd

    with pytest.raises(ToolchainError, match=r"unknown CUDA driver binding 'cupy' \(\$STITCHTUNE_CUDA_DRIVER"):
        wd.worker_driver(0, "cupy")
    seen: list[str] = []
    monkeypatch.setattr(wd, "CudaDriver", lambda o: seen.append(f"cuda-python {o}") or "cp")
    import stitchtune.gpu.pycuda_driver as pd

    monkeypatch.setattr(pd, "PycudaDriver", lambda o: seen.append(f"pycuda {o}") or "pc")
    monkeypatch.setenv(gd.DRIVER_ENV, "pycuda")
    assert wd.worker_driver(1) == "pc"
    monkeypatch.delenv(gd.DRIVER_ENV)
    assert wd.worker_driver(2) == "cp"           # cuda-python imports here

    def no_binding() -> None:
        raise ToolchainError("no cuda-python")

    monkeypatch.setattr(wd, "_binding", no_binding)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object() if name == "pycuda" else None)
    assert wd.worker_driver(3) == "pc"
    assert seen == ["pycuda 1", "cuda-python 2", "pycuda 3"]
