"""The fitted model's memory-parallelism terms (stitchtune/cost/fitted.py, s14): bytes in flight bounded per busy
SM (``sm_inflight_kib``) and the DRAM latency rising with the bandwidth drawn (``loaded_latency``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from stitchtune.cost.features import KernelFeatures
from stitchtune.cost.fitted import Coefficients, kernel_terms_us
from stitchtune.hardware.device import get_device

H200 = get_device("h200")
FIXTURE = Path(__file__).parent / "data" / "fit_fixture.json"
NAMES = {f.name for f in dataclasses.fields(KernelFeatures)}


def _kernel(**over: float) -> KernelFeatures:
    row = json.loads(FIXTURE.read_text())["rows"][0]
    base = KernelFeatures(**{k: v for k, v in row["kernels"][0].items() if k in NAMES})
    # a plain streaming kernel: memory is its limit
    plain = dict(excess_sector_bytes=0.0, sector_bytes=float(base.unique_bytes), active_lanes=1.0, registers=255,
                 float_ops=0.0, divisions=0.0, transcendentals=0.0, smem_wavefronts=0.0, serial_rounds=0.0,
                 load_rounds=1.0, scratch_loads=0.0, l2_requests=0.0, grid_barriers=0.0, atomics=0.0)
    return dataclasses.replace(base, **{**plain, **over})


def _memory(f: KernelFeatures, **c: float) -> float:
    return float(kernel_terms_us(f, H200, dataclasses.replace(Coefficients.defaults(H200), **c))["memory"])


def test_a_grid_that_does_not_fill_the_machine_streams_at_its_busy_sms_in_flight_limit() -> None:
    # 3 blocks of 256 threads, 1 KiB per thread in flight: 256 KiB per SM, far above a 16 KiB limit
    f = _kernel(grid=3, block=256, blocks_per_sm=8, bytes_in_flight_per_thread=1024.0)
    capped = _memory(f, sm_inflight_kib=16.0)
    assert capped > 10 * _memory(f)
    # the limit is per busy SM: the same as 64 bytes per thread (16 KiB / 256 threads), and twice the SMs
    # (6 blocks, twice the bytes) take the same time
    assert capped == pytest.approx(_memory(dataclasses.replace(f, bytes_in_flight_per_thread=64.0)))
    six = dataclasses.replace(f, grid=6, unique_bytes=2 * f.unique_bytes, sector_bytes=2 * f.sector_bytes)
    assert _memory(six, sm_inflight_kib=16.0) == pytest.approx(capped)


def test_the_per_sm_limit_leaves_a_kernel_under_it_alone() -> None:
    f = _kernel(grid=264, block=256, blocks_per_sm=2, bytes_in_flight_per_thread=16.0)   # 8 KiB per SM
    assert _memory(f, sm_inflight_kib=16.0) == pytest.approx(_memory(f))


def test_loaded_latency_slows_a_kernel_by_the_bandwidth_it_draws() -> None:
    light = _kernel(grid=2, block=64, blocks_per_sm=1, bytes_in_flight_per_thread=16.0)     # 2 KiB in flight
    heavy = _kernel(grid=1056, block=256, blocks_per_sm=8, bytes_in_flight_per_thread=16.0)  # 4 MiB in flight
    for f, lo, hi in ((light, 1.0, 1.01), (heavy, 1.3, 3.0)):
        ratio = _memory(f, loaded_latency=2.0, bw_efficiency=1.0) / _memory(f, bw_efficiency=1.0)
        assert lo <= ratio <= hi, ratio
    # 0 is the old Little's law exactly
    assert _memory(heavy, loaded_latency=0.0) == _memory(heavy)
