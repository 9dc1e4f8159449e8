"""Device presets, name lookup, persistence, and a Device from driver attributes (pure; the query
through the driver is tests/gpu/test_device_query.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from stitchtune.hardware.device import (
    DEVICE_ATTRIBUTES,
    PRESETS,
    QUERIED_SOURCE,
    Device,
    DeviceError,
    device_from_attributes,
    get_device,
)
from stitchtune.errors import StitchtuneError


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


# what the driver reports on an H200 (CU_DEVICE_ATTRIBUTE_* names); MEMORY_CLOCK_RATE is in kHz
H200_ATTRS = dict(
    COMPUTE_CAPABILITY_MAJOR=9, COMPUTE_CAPABILITY_MINOR=0, MULTIPROCESSOR_COUNT=132,
    MAX_THREADS_PER_BLOCK=1024, MAX_THREADS_PER_MULTIPROCESSOR=2048, MAX_BLOCKS_PER_MULTIPROCESSOR=32,
    WARP_SIZE=32, MAX_REGISTERS_PER_MULTIPROCESSOR=65536, MAX_REGISTERS_PER_BLOCK=65536,
    MAX_SHARED_MEMORY_PER_MULTIPROCESSOR=233472, MAX_SHARED_MEMORY_PER_BLOCK_OPTIN=232448,
    MAX_SHARED_MEMORY_PER_BLOCK=49152, RESERVED_SHARED_MEMORY_PER_BLOCK=1024,
    L2_CACHE_SIZE=62914560, CLOCK_RATE=1980000, MEMORY_CLOCK_RATE=3201000, GLOBAL_MEMORY_BUS_WIDTH=6144,
)
H200_MEMORY = 150109880320  # cuDeviceTotalMem on an H200 (results/gpu_smoke_2026-11-29)


def test_device_attributes_cover_what_is_read() -> None:
    assert set(H200_ATTRS) == set(DEVICE_ATTRIBUTES)


def test_device_from_h200_attributes_is_the_preset_but_for_what_the_driver_measures() -> None:
    d = device_from_attributes("NVIDIA H200", H200_ATTRS, memory_bytes=H200_MEMORY)
    p = PRESETS["h200"]
    assert d.source == QUERIED_SOURCE == "cuda"
    # every field equals the preset's except the driver's own figures: DRAM bandwidth from the memory
    # clock and bus width (double data rate), the memory size, and the source
    dram = round(2 * 3201e6 * 6144 / 8 / 1e9, 1)
    assert d == dataclasses.replace(p, dram_bandwidth_gbs=dram, memory_bytes=H200_MEMORY, source="cuda")
    assert d.key == p.key and d.copy_bandwidth_gbs == 4120.0 and d.clock_mhz == 1980.0


def test_unknown_gpu_falls_back_on_arch_tables() -> None:
    attrs = dict(H200_ATTRS, COMPUTE_CAPABILITY_MAJOR=8, COMPUTE_CAPABILITY_MINOR=6,
                 MULTIPROCESSOR_COUNT=84, MAX_THREADS_PER_MULTIPROCESSOR=1536)
    del attrs["MAX_BLOCKS_PER_MULTIPROCESSOR"], attrs["CLOCK_RATE"], attrs["MEMORY_CLOCK_RATE"]
    d = device_from_attributes("NVIDIA GeForce RTX 3090", attrs)
    assert d.arch == "sm_86" and d.sm_count == 84 and d.max_threads_per_sm == 1536
    assert d.max_blocks_per_sm == 16          # cuda_occupancy.h table for 8.6
    assert d.smem_alloc_unit == 128 and d.fp32_lanes_per_sm == 128
    assert d.copy_bandwidth_gbs is None       # no preset of that name: nothing measured
    h200 = PRESETS["h200"]
    assert d.clock_mhz == h200.clock_mhz and d.dram_bandwidth_gbs == h200.dram_bandwidth_gbs
    assert d.memory_bytes is None


def test_device_from_attributes_needs_the_compute_capability() -> None:
    attrs = dict(H200_ATTRS)
    del attrs["COMPUTE_CAPABILITY_MINOR"]
    with pytest.raises(DeviceError, match="compute capability"):
        device_from_attributes("NVIDIA H200", attrs)


def test_get_device_needs_a_name() -> None:
    with pytest.raises(DeviceError, match="default_device"):
        get_device(None)  # type: ignore[arg-type]
