"""Criteria 6 and 7 of the kernel audit (docs/audit.md, issue 39): waves and bytes in flight.

* a grid of one wave or less has no tail: every block is resident at once, so it needs bytes in flight
  over every SM, not two waves (BERT's training bias gradient: 384 blocks of a 660-block wave, 2-3 per
  SM, 70 KiB in flight per SM, was "0.58 waves");
* a *latency-bound* launch (its bytes at most bandwidth x DRAM latency, 3.4 MB on the H200: the floor
  is under one latency) is judged by whether all its loads are in flight at once (BERT's 8 x 768 tanh:
  8 blocks, "0.01 waves, 4.0 KiB in flight per SM" before);
* a kernel that only stores (a zero fill) waits for nothing: no in-flight criterion.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from helpers.lowering import DEV, float_graph
from stitchtune.analysis.audit import Criteria, KernelAudit, _problems, audit_graph
from stitchtune.analysis.sectors import AccessSectors

C = Criteria()
NEEDED = C.in_flight_needed(DEV)


def _kernel(grid: int, waves: float, per_sm: float, io: int, read: int, in_grid: int, loads: bool = True) -> KernelAudit:
    acc = (AccessSectors("k", "1", "x", "load", 4, 4, 8, 32, 32, 256),) if loads else ()
    acc += (AccessSectors("k", "2", "y", "store", 4, 4, 8, 32, 32, 256),)
    k = KernelAudit(name="k", grid=grid, block=256, smem_bytes=0, registers=32, registers_from="estimate",
                    unique_bytes=io, scratch_bytes=0, floor_us=0.0, predicted_us=None, blocks_per_sm=4,
                    occupancy=0.5, limiter="registers", waves=waves, in_flight_per_sm=int(per_sm),
                    in_flight_needed=NEEDED, active_lanes=1.0, accesses=acc, slice_blocks=4, slice_error="",
                    dead_shared=(), sass=None, sm_count=DEV.sm_count, read_bytes=read, in_flight_grid=in_grid,
                    latency_bound=C.latency_bound(DEV, io))
    return replace(k, problems=_problems(k, C))


BIG = 25 << 20   # 25 MiB: far from latency-bound


def test_the_latency_bound_threshold_is_bandwidth_times_latency() -> None:
    limit = DEV.dram_bandwidth_gbs * C.dram_latency_ns   # bytes
    assert C.latency_bound(DEV, int(limit) - 1) and not C.latency_bound(DEV, int(limit) + 1)
    assert 3.0e6 < limit < 3.5e6   # the H200: 4.8 TB/s x 700 ns


def test_one_wave_over_every_sm_needs_no_second_wave() -> None:
    assert _kernel(384, 0.58, 70 << 10, BIG, BIG // 2, 0).problems == ()
    assert _kernel(1056, 1.0, 70 << 10, BIG, BIG // 2, 0).problems == ()


def test_a_grid_short_of_the_sms_or_between_one_and_two_waves_misses() -> None:
    (p,) = _kernel(64, 0.06, 70 << 10, BIG, BIG // 2, 0).problems
    assert "0.06 waves on 64 of" in p
    (p,) = _kernel(1500, 1.42, 70 << 10, BIG, BIG // 2, 0).problems
    assert p == "1.42 waves"


def test_bytes_in_flight_are_asked_of_a_kernel_that_loads() -> None:
    (p,) = _kernel(384, 0.58, 8 << 10, BIG, BIG // 2, 0).problems
    assert "KiB in flight per SM" in p
    assert _kernel(384, 0.58, 0, BIG, 0, 0, loads=False).problems == ()   # a zero fill


def test_a_latency_bound_launch_needs_all_its_loads_in_flight_at_once() -> None:
    small = 48 << 10
    assert _kernel(8, 0.01, 256, small, small // 2, small // 2).problems == ()
    (p,) = _kernel(8, 0.01, 256, small, small // 2, small // 8).problems
    assert p.startswith("latency-bound") and "6.0 of its 24.0 KiB" in p


def test_the_bert_tanh_region_is_latency_bound_and_floor_ready() -> None:
    g = float_graph({"x": [8, 768]}, [{"id": "y", "op": "tanh", "args": ["x"]}], ["y"])
    a = audit_graph(g, DEV, sass=False)
    (k,) = a.kernels
    assert k.latency_bound and k.read_bytes == 8 * 768 * 4
    assert k.in_flight_grid >= k.read_bytes and k.floor_ready, k.problems


@pytest.mark.parametrize("field", ["sm_count", "read_bytes", "in_flight_grid", "latency_bound"])
def test_new_fields_survive_the_json(field: str) -> None:
    k = _kernel(8, 0.01, 256, 4096, 2048, 2048)
    assert getattr(KernelAudit.from_dict(k.to_dict()), field) == getattr(k, field)
