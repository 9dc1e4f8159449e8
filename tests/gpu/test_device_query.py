"""The GPU query through the driver interface: FakeDriver stands in for cuda-python (no GPU needed)."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from stitchtune.errors import ToolchainError
from stitchtune.gpu import device_query
from stitchtune.gpu.device_query import default_device, query_device, read_device
from stitchtune.gpu.driver import DriverError
from stitchtune.gpu.fake_driver import FakeDriver
from stitchtune.hardware.device import PRESETS, Device
from tests.hardware.test_device import H200_ATTRS, H200_MEMORY


def _fake_h200(*, drop: tuple[str, ...] = ()) -> FakeDriver:
    """A FakeDriver reporting an H200's attributes, less those in ``drop`` (as a driver that lacks them)."""
    drv = FakeDriver(name="NVIDIA H200", attrs=H200_ATTRS, memory_bytes=H200_MEMORY)
    for label in drop:
        del drv.attrs[label]
    return drv


class _Opened(FakeDriver):
    """What open_device returns in these tests: a FakeDriver with the ordinal it was opened for."""

    def __init__(self, ordinal: int) -> None:
        super().__init__(name="NVIDIA H200", attrs=H200_ATTRS, memory_bytes=H200_MEMORY)
        self.ordinal = ordinal


@pytest.fixture()
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """open_device fails as it does without cuda-python / driver / GPU; records the ordinals asked."""
    asked: list[int | None] = []

    def fail(ordinal: int | None = None) -> FakeDriver:
        asked.append(ordinal)
        raise ToolchainError("cuda-python finds no CUDA driver: test")

    monkeypatch.setattr(device_query, "open_device", fail)
    monkeypatch.setattr(device_query, "_said", set())
    return asked


def test_fake_h200_reads_as_the_preset_but_for_the_drivers_figures() -> None:
    d = read_device(_fake_h200())
    p = PRESETS["h200"]
    dram = round(2 * 3201e6 * 6144 / 8 / 1e9, 1)
    assert d == dataclasses.replace(p, dram_bandwidth_gbs=dram, memory_bytes=H200_MEMORY, source="cuda")
    assert Device.from_dict(json.loads(json.dumps(d.to_dict()))) == d


def test_unsupported_attributes_take_the_architectures_values() -> None:
    drv = _fake_h200(drop=("MAX_BLOCKS_PER_MULTIPROCESSOR", "RESERVED_SHARED_MEMORY_PER_BLOCK"))
    with pytest.raises(DriverError):
        drv.attribute("MAX_BLOCKS_PER_MULTIPROCESSOR")  # the fake refuses it, as an older driver would
    d = read_device(drv)
    assert d.max_blocks_per_sm == 32 and d.smem_reserved_per_block == 1024  # cuda_occupancy.h / [CC] for 9.0


def test_total_memory_failure_leaves_memory_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    drv = _fake_h200()

    def refuse() -> int:
        raise DriverError("cuDeviceTotalMem", "CUDA_ERROR_INVALID_DEVICE")

    monkeypatch.setattr(drv, "total_memory", refuse)
    assert read_device(drv).memory_bytes is None


def test_missing_compute_capability_is_a_toolchain_error() -> None:
    drv = _fake_h200(drop=("COMPUTE_CAPABILITY_MAJOR",))
    with pytest.raises(ToolchainError, match="COMPUTE_CAPABILITY_MAJOR"):
        read_device(drv)


def test_query_device_opens_the_ordinal_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int | None] = []

    def opened(ordinal: int | None = None) -> FakeDriver:
        asked.append(ordinal)
        return _Opened(0 if ordinal is None else ordinal)

    monkeypatch.setattr(device_query, "open_device", opened)
    assert query_device(3).key == "NVIDIA H200/sm_90"
    assert query_device().source == "cuda"
    assert default_device().memory_bytes == H200_MEMORY
    assert asked == [3, None, None]


def test_default_device_falls_back_to_the_preset_with_a_logged_reason(
        no_gpu: list[int | None], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="stitchtune.gpu.device_query")
    with pytest.raises(ToolchainError):
        query_device()
    assert default_device() is PRESETS["h200"]
    assert default_device() is PRESETS["h200"]
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "H200 preset" in r.getMessage()]
    assert said == [(logging.INFO, "no GPU through cuda-python (cuda-python finds no CUDA driver: test); "
                                   "using the H200 preset")] + [(logging.DEBUG, said[0][1])]
    assert no_gpu == [None, None, None]


def test_open_device_without_a_driver_is_a_toolchain_error() -> None:
    """The real path on this machine: cuda-python without libcuda (or without cuda-python at all)."""
    from stitchtune.gpu.driver import open_device

    try:
        open_device(0)
    except ToolchainError as exc:
        assert "cuda-python" in str(exc)
    else:
        pytest.skip("a GPU is here: tests/gpu/test_gpu.py covers the real query")


def test_cli_devices_without_a_gpu(no_gpu: list[int | None], capsys: pytest.CaptureFixture[str]) -> None:
    from stitchtune.cli import main

    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "no GPU found through cuda-python" in out
    assert "NVIDIA H200/sm_90" in out and "Tesla T4/sm_75" in out
    assert main(["devices", "--device", "a100"]) == 0
    assert Device.from_dict(json.loads(capsys.readouterr().out)) == PRESETS["a100"]
    assert main(["devices", "--check"]) == 2
    assert main(["devices", "--device", "nope"]) == 2
    assert "presets: h200" in capsys.readouterr().err


def test_cli_devices_lists_the_queried_gpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from stitchtune.cli import main

    monkeypatch.setattr(device_query, "open_device", lambda ordinal=None: _Opened(0))
    assert main(["devices"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("gpu") and "NVIDIA H200/sm_90" in first and "SMs  132" in first


# ---------------------------------------------------------------------------- GPU
def _cuda_available() -> bool:
    from stitchtune.gpu.runner import cuda_available

    return bool(cuda_available())


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="no CUDA GPU through cuda-python")
def test_query_of_the_real_gpu_agrees_with_the_cuda_runtime() -> None:
    """cuda-python's driver attributes against cupy's cudaGetDeviceProperties (an independent path)."""
    cupy = pytest.importorskip("cupy")
    d = query_device(0)
    assert d.source == "cuda" and default_device() == query_device()
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    assert d.name == name.strip() and (d.cc_major, d.cc_minor) == (props["major"], props["minor"])
    assert d.memory_bytes == props["totalGlobalMem"]
    pairs = {"sm_count": "multiProcessorCount", "l2_bytes": "l2CacheSize", "smem_per_sm": "sharedMemPerMultiprocessor",
             "smem_per_block_optin": "sharedMemPerBlockOptin", "smem_per_block_default": "sharedMemPerBlock",
             "regs_per_sm": "regsPerMultiprocessor", "max_regs_per_block": "regsPerBlock",
             "max_threads_per_sm": "maxThreadsPerMultiProcessor", "max_threads_per_block": "maxThreadsPerBlock",
             "warp_size": "warpSize", "max_blocks_per_sm": "maxBlocksPerMultiProcessor",
             "smem_reserved_per_block": "reservedSharedMemPerBlock"}
    compared = [f for f, k in pairs.items() if k in props]
    assert len(compared) >= 8, sorted(props)
    assert {f: getattr(d, f) for f in compared} == {f: props[pairs[f]] for f in compared}
    if d.name == "NVIDIA H200":  # the preset's limits are what this GPU reports
        p = PRESETS["h200"]
        limits = [f for f in pairs if f != "smem_per_block_default"] + ["smem_alloc_unit", "copy_bandwidth_gbs"]
        assert {f: getattr(d, f) for f in limits} == {f: getattr(p, f) for f in limits}
