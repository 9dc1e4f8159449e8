"""The fitted model's terms added for issue 39 (stitchtune/cost/fitted.py, stitchtune/cost/fitting.py):
bytes in flight bounded by registers, L2 re-reads within one wave's footprint, the per-launch ramp, and
the CUDA-event launch start that is fitted but never part of the predicted device time."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from stitchtune.cost.features import KernelFeatures
from stitchtune.cost.fitted import Coefficients, kernel_device_us, kernel_terms_us
from stitchtune.cost.fitting import predict_rows
from stitchtune.hardware.device import get_device

H200 = get_device("h200")
FIXTURE = Path(__file__).parent / "data" / "fit_fixture.json"
NAMES = {f.name for f in dataclasses.fields(KernelFeatures)}


def _kernel(**over: float) -> KernelFeatures:
    row = json.loads(FIXTURE.read_text())["rows"][0]
    return dataclasses.replace(KernelFeatures(**{k: v for k, v in row["kernels"][0].items() if k in NAMES}), **over)


def test_loads_in_flight_are_bounded_by_the_registers_that_receive_them() -> None:
    # 8 blocks of 256 threads: latency-bound, so the bytes in flight set the time
    f = _kernel(grid=8, block=256, blocks_per_sm=1, bytes_in_flight_per_thread=1024.0, active_lanes=1.0)
    c = dataclasses.replace(Coefficients.defaults(H200), inflight_reg_share=0.5)
    few, many = (kernel_terms_us(dataclasses.replace(f, registers=r), H200, c)["memory"] for r in (32, 255))
    assert few > 3 * many          # 64 vs 510 bytes in flight per thread
    unbounded = dataclasses.replace(c, inflight_reg_share=1.0)
    assert kernel_device_us(dataclasses.replace(f, registers=255), H200, unbounded) == pytest.approx(
        kernel_device_us(dataclasses.replace(f, registers=255, bytes_in_flight_per_thread=1020.0), H200, unbounded))


def test_re_reads_hit_the_l2_when_one_wave_of_data_fits() -> None:
    # 134 MB read twice (a two-pass row kernel): the re-read follows the first read within the block
    f = _kernel(grid=2048, block=256, blocks_per_sm=4, unique_bytes=134_217_728, sector_bytes=268_435_456.0,
                excess_sector_bytes=0.0, bytes_in_flight_per_thread=256.0, registers=128)
    c = Coefficients.defaults(H200)
    per_wave = kernel_terms_us(f, H200, c)["memory"]
    whole = kernel_terms_us(f, H200, dataclasses.replace(c, reuse_window=0.0))["memory"]
    assert per_wave < 0.75 * whole
    # one wave of data larger than the L2 misses as before
    one_wave = dataclasses.replace(f, grid=132 * 4)
    assert kernel_terms_us(one_wave, H200, c)["memory"] == pytest.approx(
        kernel_terms_us(one_wave, H200, dataclasses.replace(c, reuse_window=0.0))["memory"])


def test_the_ramp_is_device_time_and_event_timing_is_not() -> None:
    f = _kernel()
    c = Coefficients.defaults(H200)
    assert kernel_device_us(f, H200, dataclasses.replace(c, ramp_us=3.0)) == pytest.approx(
        kernel_device_us(f, H200, dataclasses.replace(c, ramp_us=1.0)) + 2.0)
    row = {"group": "g", "label": "x", "measured_us": 1.0, "kernels": [dataclasses.asdict(f)] * 2}
    row["kernels"] = [{k: v for k, v in d.items() if k != "per_access"} for d in row["kernels"]]
    events = {**row, "timing": "events"}
    cupti, ev = predict_rows([row, events], H200, dataclasses.replace(c, event_us=5.0))
    assert ev == pytest.approx(cupti + 2 * 5.0)          # two launches timed with events
    assert cupti == pytest.approx(2 * kernel_device_us(f, H200, c))


def test_the_flush_write_back_is_added_to_event_timed_rows_only_and_bounded_by_the_l2() -> None:
    # the worker's L2 flush (a memset) leaves dirty lines that an event-timed run writes back: at most the
    # row's own bytes (each line it brings in evicts one) and at most flush_writeback x L2; never device time
    f = _kernel()
    c = dataclasses.replace(Coefficients.defaults(H200), event_us=0.0)
    kd = {k: v for k, v in dataclasses.asdict(f).items() if k != "per_access"}
    small = {**kd, "unique_bytes": 1 << 20}
    rows = [{"group": "g", "label": "x", "measured_us": 1.0, "kernels": [kd], "timing": t} for t in ("cupti", "events")]
    rows.append({"group": "g", "label": "s", "measured_us": 1.0, "kernels": [small], "timing": "events"})
    off = predict_rows(rows, H200, c)                            # the default: the term is off
    on = predict_rows(rows, H200, dataclasses.replace(c, flush_writeback=0.5))
    cap_gbs = c.bw_efficiency * H200.effective_copy_bandwidth_gbs()
    assert on[0] == pytest.approx(off[0])                        # CUPTI: no flush before the run
    assert on[1] - off[1] == pytest.approx(min(f.unique_bytes, 0.5 * H200.l2_bytes) / cap_gbs / 1000.0)
    assert on[2] - off[2] == pytest.approx((1 << 20) / cap_gbs / 1000.0)   # fewer bytes than the dirty L2
    assert kernel_device_us(f, H200, dataclasses.replace(c, flush_writeback=0.5)) == pytest.approx(
        kernel_device_us(f, H200, c))


def test_a_kernel_without_loads_streams_its_stores_at_the_ceiling() -> None:
    # the zero fill of an embedding's gradient table (GPT-2 train region_view_82: 1056 x 256, stores only): no load
    # is in flight, so Little's law over the 4-byte floor of bytes in flight must not bound it (s13: 36.9 vs 30.8 us);
    # with store_bw_factor 0 at the ceiling (the measured store rate: tests/cost/test_atomics_prior.py)
    c = dataclasses.replace(Coefficients.defaults(H200), store_bw_factor=0.0)
    fill = _kernel(grid=1056, block=256, blocks_per_sm=8, registers=14, unique_bytes=98_304_000,
                   sector_bytes=98_304_000.0, requested_bytes=98_304_000.0, excess_sector_bytes=0.0,
                   bytes_in_flight_per_thread=0.0, loads_in_flight=0.0, load_rounds=0.0, serial_rounds=0.0,
                   compiled_bytes_in_flight=0.0, active_lanes=1.0)
    ceiling = 98_304_000 / (c.bw_efficiency * H200.effective_copy_bandwidth_gbs()) / 1000.0
    assert kernel_terms_us(fill, H200, c)["memory"] == pytest.approx(ceiling, rel=1e-6)
    # the same launch with one 4-byte load per thread is latency-bound as before (slower than the ceiling)
    loads = dataclasses.replace(fill, bytes_in_flight_per_thread=4.0, loads_in_flight=1.0, load_rounds=1.0)
    assert kernel_terms_us(loads, H200, c)["memory"] > 1.05 * ceiling


def test_the_chain_counts_the_rounds_of_the_compiled_codes_batches() -> None:
    # GPT-2 train region_view_44's st_k0 (s13): the IR walk ends a load group at each shared store (78 serial rounds
    # of 77 B); nvcc hoists the loads over those stores and keeps 296 B in flight, so the chain has ~20 rounds
    c = Coefficients.defaults(H200)
    f = _kernel(grid=132, block=256, blocks_per_sm=1, serial_rounds=78.0, load_rounds=78.0, barriers=0.0,
                shuffles=0.0, bytes_in_flight_per_thread=77.2)
    walk = kernel_terms_us(f, H200, c)["chain"]
    assert walk == pytest.approx(78 * c.round_ns / 1000.0)
    compiled = kernel_terms_us(dataclasses.replace(f, compiled_bytes_in_flight=296.0), H200, c)["chain"]
    assert compiled == pytest.approx(78 * 77.2 / 296.0 * c.round_ns / 1000.0)
    # compiled code that keeps fewer bytes in flight than the walk's groups does not add rounds
    fewer = kernel_terms_us(dataclasses.replace(f, compiled_bytes_in_flight=32.0), H200, c)["chain"]
    assert fewer == pytest.approx(walk)


def test_features_without_the_compiled_facts_are_predicted_as_the_walks() -> None:
    # the fit's columns and older rows may lack compiled_bytes_in_flight (and the other optional facts): the chain
    # and the bytes in flight are then the IR walk's, as with 0 (no build), never scaled by a missing value
    import types

    c = Coefficients.defaults(H200)
    f = _kernel(grid=132, block=256, blocks_per_sm=1, serial_rounds=78.0, load_rounds=78.0,
                bytes_in_flight_per_thread=77.2, compiled_bytes_in_flight=0.0)
    optional = {"compiled_bytes_in_flight", "l2_requests", "spill_instructions"}
    bare = types.SimpleNamespace(**{k: getattr(f, k) for k in NAMES - optional})
    got, want = kernel_terms_us(bare, H200, c), kernel_terms_us(f, H200, c)
    assert got["chain"] == pytest.approx(78 * c.round_ns / 1000.0) == want["chain"]
    assert got["memory"] == pytest.approx(want["memory"]) and got["body"] == pytest.approx(want["body"])
