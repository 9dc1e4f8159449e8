"""Device presets, name lookup, persistence and the pycuda query (with a fake pycuda module)."""

from __future__ import annotations

import json
import sys
import types

import pytest

from stitchtune.hardware import device as device_mod
from stitchtune.hardware.device import PRESETS, Device, DeviceError, default_device, get_device, query_device
from stitchtune.errors import StitchtuneError, ToolchainError


def test_presets_cover_required_models() -> None:
    assert {"h200", "h100", "a100", "l4", "t4", "v100"} <= set(PRESETS)
    archs = {d.arch for d in PRESETS.values()}
    assert {"sm_70", "sm_75", "sm_80", "sm_89", "sm_90"} <= archs


@pytest.mark.parametrize("short", sorted(PRESETS))
def test_preset_consistency(short: str) -> None:
    d = PRESETS[short]
    assert d.max_threads_per_sm % d.warp_size == 0
    assert d.smem_per_block_default <= d.smem_per_block_optin <= d.smem_per_sm
    assert d.smem_per_block_optin + d.smem_reserved_per_block <= d.smem_per_sm
    assert d.reg_alloc_unit == 256 and d.reg_alloc_granularity == "warp"
    assert d.smem_alloc_unit == (256 if d.cc_major == 7 else 128)
    assert d.smem_reserved_per_block == (1024 if d.cc_major >= 8 else 0)
    assert d.dram_bandwidth_gbs > 0 and d.l2_bytes > 0 and d.clock_mhz > 0
    assert d.key == f"{d.name}/{d.arch}"


def test_h200_figures() -> None:
    d = get_device("H200")
    assert d.key == "NVIDIA H200/sm_90"
    assert (d.sm_count, d.smem_per_sm, d.regs_per_sm) == (132, 233472, 65536)
    assert d.copy_bandwidth_gbs == 4120.0
    # grid barrier model reproduces the measured points within 0.05 us
    for grid, us in [(132, 1.0), (264, 1.3), (528, 2.0), (1056, 3.5)]:
        assert abs(d.grid_barrier_us(grid) - us) < 0.05
    assert d.grid_barrier_us(1056) > d.grid_barrier_us(132)


def test_effective_copy_bandwidth() -> None:
    assert get_device("h200").effective_copy_bandwidth_gbs() == 4120.0
    a100 = get_device("a100")
    assert a100.copy_bandwidth_gbs is None
    assert a100.effective_copy_bandwidth_gbs() == pytest.approx(2039.0 * 4120.0 / 4800.0)


@pytest.mark.parametrize("name,short", [
    ("h100", "h100"), ("NVIDIA H100 80GB HBM3", "h100"), ("nvidia a100-sxm4-80gb", "a100"),
    ("NVIDIA H200/sm_90", "h200"), ("Tesla T4", "t4"), ("v100", "v100"), ("NVIDIA L4", "l4"),
    ("H100 SXM", "h100"),
])
def test_get_device_names(name: str, short: str) -> None:
    assert get_device(name) is PRESETS[short]


def test_unknown_device_lists_presets() -> None:
    with pytest.raises(DeviceError) as err:
        get_device("rtx 9999")
    assert isinstance(err.value, StitchtuneError)
    for short in PRESETS:
        assert short in str(err.value)


@pytest.mark.parametrize("short", sorted(PRESETS))
def test_dict_round_trip(short: str) -> None:
    d = PRESETS[short]
    blob = json.dumps(d.to_dict())
    assert Device.from_dict(json.loads(blob)) == d


def test_from_dict_rejects_bad_fields() -> None:
    d = PRESETS["h200"].to_dict()
    with pytest.raises(DeviceError):
        Device.from_dict({**d, "bogus": 1})
    del d["sm_count"]
    with pytest.raises(DeviceError):
        Device.from_dict(d)


def _fake_pycuda(monkeypatch: pytest.MonkeyPatch, name: str, attrs: dict[str, int],
                 count: int = 1) -> None:
    attr_enum = types.SimpleNamespace(**{k: k for k in attrs})

    class FakeError(Exception):
        pass

    class FakeDevice:
        def __init__(self, ordinal: int) -> None:
            self.ordinal = ordinal

        @staticmethod
        def count() -> int:
            return count

        def name(self) -> str:
            return name

        def get_attributes(self) -> dict[str, int]:
            return dict(attrs)

    drv = types.ModuleType("pycuda.driver")
    drv.init = lambda: None  # type: ignore[attr-defined]
    drv.Device = FakeDevice  # type: ignore[attr-defined]
    drv.Error = FakeError  # type: ignore[attr-defined]
    drv.device_attribute = attr_enum  # type: ignore[attr-defined]
    pkg = types.ModuleType("pycuda")
    pkg.driver = drv  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", drv)


H200_ATTRS = dict(  # what the driver reports on an H200 (cudaDeviceProp / cuDeviceGetAttribute names)
    COMPUTE_CAPABILITY_MAJOR=9, COMPUTE_CAPABILITY_MINOR=0, MULTIPROCESSOR_COUNT=132,
    MAX_THREADS_PER_BLOCK=1024, MAX_THREADS_PER_MULTIPROCESSOR=2048, MAX_BLOCKS_PER_MULTIPROCESSOR=32,
    WARP_SIZE=32, MAX_REGISTERS_PER_MULTIPROCESSOR=65536, MAX_REGISTERS_PER_BLOCK=65536,
    MAX_SHARED_MEMORY_PER_MULTIPROCESSOR=233472, MAX_SHARED_MEMORY_PER_BLOCK_OPTIN=232448,
    MAX_SHARED_MEMORY_PER_BLOCK=49152, RESERVED_SHARED_MEMORY_PER_BLOCK=1024,
    L2_CACHE_SIZE=62914560, CLOCK_RATE=1980000, MEMORY_CLOCK_RATE=3201000, GLOBAL_MEMORY_BUS_WIDTH=6144,
)


def test_query_device_with_fake_pycuda(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pycuda(monkeypatch, "NVIDIA H200", H200_ATTRS)
    d = query_device()
    p = PRESETS["h200"]
    assert d.source == "pycuda"
    assert d.key == p.key
    for f in ("sm_count", "max_threads_per_sm", "max_blocks_per_sm", "regs_per_sm", "smem_per_sm",
              "smem_per_block_optin", "smem_reserved_per_block", "l2_bytes", "smem_alloc_unit"):
        assert getattr(d, f) == getattr(p, f), f
    assert d.copy_bandwidth_gbs == 4120.0            # measured figure taken from the matching preset
    assert d.dram_bandwidth_gbs == pytest.approx(2 * 3201e6 * 768 / 1e9, rel=1e-3)
    assert d.clock_mhz == 1980.0
    assert default_device().key == p.key


def test_query_unknown_gpu_falls_back_on_arch_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    attrs = dict(H200_ATTRS, COMPUTE_CAPABILITY_MAJOR=8, COMPUTE_CAPABILITY_MINOR=6,
                 MULTIPROCESSOR_COUNT=84, MAX_THREADS_PER_MULTIPROCESSOR=1536)
    del attrs["MAX_BLOCKS_PER_MULTIPROCESSOR"], attrs["CLOCK_RATE"]
    _fake_pycuda(monkeypatch, "NVIDIA GeForce RTX 3090", attrs)
    d = query_device()
    assert d.arch == "sm_86" and d.sm_count == 84
    assert d.max_blocks_per_sm == 16          # cuda_occupancy.h table for 8.6
    assert d.copy_bandwidth_gbs is None
    assert d.clock_mhz == PRESETS["h200"].clock_mhz


def test_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pycuda(monkeypatch, "none", H200_ATTRS, count=0)
    with pytest.raises(ToolchainError):
        query_device()
    assert default_device() is PRESETS["h200"]


def test_no_pycuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    with pytest.raises(ToolchainError):
        query_device()
    assert get_device(None) is device_mod.PRESETS["h200"]


def test_cli_devices(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from stitchtune.cli import main

    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "no GPU" in out and "NVIDIA H200/sm_90" in out and "Tesla T4/sm_75" in out
    assert main(["devices", "--device", "a100"]) == 0
    assert Device.from_dict(json.loads(capsys.readouterr().out)) == PRESETS["a100"]
    assert main(["devices", "--check"]) == 2
    assert main(["devices", "--device", "nope"]) == 2
    assert "presets: h200" in capsys.readouterr().err
