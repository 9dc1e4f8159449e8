"""The s15 study terms of the fitted model (stitchtune/cost/fitted.py; all off as shipped): the issue work few resident
warps leave exposed beside memory (``overlap_warps``, ``overlap_tasks``, ``EXPOSED_OF``), the L2 hits' latency
(``l2_latency_ns``), the phase term over a block's tasks (``phase_tasks``); and ``fit_coefficients(bounds=...)``.
Every time here is a prediction."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from stitchtune.cost import fitted
from stitchtune.cost.features import KernelFeatures
from stitchtune.cost.fitted import Coefficients, kernel_terms_us
from stitchtune.cost.fitting import FITTED, fit_coefficients
from stitchtune.hardware.device import get_device

H200 = get_device("h200")
FIXTURE = Path(__file__).parent / "data" / "fit_fixture.json"
NAMES = {f.name for f in dataclasses.fields(KernelFeatures)}


def _kernel(**over: Any) -> KernelFeatures:
    row = json.loads(FIXTURE.read_text())["rows"][0]
    base = KernelFeatures(**{k: v for k, v in row["kernels"][0].items() if k in NAMES})
    # a streaming kernel with some issue work: memory is its limit
    plain = dict(excess_sector_bytes=0.0, sector_bytes=float(base.unique_bytes), active_lanes=1.0, registers=64,
                 float_ops=300.0, divisions=0.0, transcendentals=0.0, smem_wavefronts=0.0, serial_rounds=4.0,
                 load_rounds=4.0, load_phases=1.0, scratch_loads=0.0, l2_requests=0.0, grid_barriers=0.0,
                 atomics=0.0, bytes_in_flight_per_thread=64.0, task_trips=1.0)
    return dataclasses.replace(base, **{**plain, **over})


def _terms(f: KernelFeatures, **c: float) -> dict[str, Any]:
    return {k: float(v) for k, v in kernel_terms_us(f, H200, dataclasses.replace(Coefficients.defaults(H200), **c)).items()}


def test_exposed_issue_work_grows_as_resident_warps_fall_and_is_off_at_zero() -> None:
    few = _kernel(grid=1056, block=256, blocks_per_sm=2)     # 16 warps per SM
    many = _kernel(grid=1056, block=256, blocks_per_sm=8)    # 64 warps per SM
    off = _terms(few)
    assert off["exposed"] == 0.0 and off["body"] == max(off[k] for k in ("memory", "issue", "blocks", "chain",
                                                                       "l2_requests"))
    t_few, t_many = _terms(few, overlap_warps=32.0), _terms(many, overlap_warps=32.0)
    assert t_few["memory"] > t_few["issue"] > 0            # memory-bound: the issue work is what is exposed
    assert t_few["exposed"] == pytest.approx(t_few["issue"] * 2.718281828 ** -0.5, rel=1e-6)
    assert t_many["exposed"] < t_few["exposed"] / 3
    assert t_few["body"] == pytest.approx(off["body"] + t_few["exposed"])


def test_a_threads_later_tasks_hide_the_exposed_work_unless_overlap_tasks_is_0() -> None:
    one = _kernel(grid=1056, block=256, blocks_per_sm=2, task_trips=1.0)
    four = _kernel(grid=1056, block=256, blocks_per_sm=2, task_trips=4.0)
    e1 = _terms(one, overlap_warps=32.0)["exposed"]
    assert _terms(four, overlap_warps=32.0)["exposed"] == pytest.approx(e1 / 4)
    assert _terms(four, overlap_warps=32.0, overlap_tasks=0.0)["exposed"] == pytest.approx(e1)


def test_exposed_forms_lay_the_chain_or_both_beside_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    f = _kernel(grid=1056, block=256, blocks_per_sm=2)
    t = _terms(f, overlap_warps=32.0)
    share = t["exposed"] / t["issue"]
    monkeypatch.setattr(fitted, "EXPOSED_OF", "chain")
    assert _terms(f, overlap_warps=32.0)["exposed"] == pytest.approx(min(t["memory"], t["chain"]) * share)
    monkeypatch.setattr(fitted, "EXPOSED_OF", "issue+chain")
    assert _terms(f, overlap_warps=32.0)["exposed"] == pytest.approx(min(t["memory"], t["chain"] + t["issue"]) * share)


def test_l2_latency_slows_a_small_grid_whose_sectors_hit_and_leaves_a_full_one() -> None:
    # 8 MiB read three times (re-reads, all L2 hits): the L2's rate alone is fast, its latency is not
    small = _kernel(grid=16, block=256, blocks_per_sm=1, bytes_in_flight_per_thread=16.0, unique_bytes=8 << 20,
                    sector_bytes=3.0 * (8 << 20))
    full = dataclasses.replace(small, grid=4096, blocks_per_sm=8, bytes_in_flight_per_thread=64.0)
    lat = dict(dram_latency_ns=300.0)
    assert _terms(small, l2_latency_ns=400.0, **lat)["memory"] > 1.5 * _terms(small, **lat)["memory"]
    assert _terms(full, l2_latency_ns=400.0, **lat)["memory"] == pytest.approx(_terms(full, **lat)["memory"], rel=0.01)


def test_phase_tasks_divides_the_phase_term_by_the_tasks() -> None:
    f = _kernel(grid=1056, block=256, blocks_per_sm=2, load_phases=5.0, task_trips=4.0)
    assert _terms(f)["phases"] > 0
    assert _terms(f, phase_tasks=1.0)["phases"] == pytest.approx(_terms(f)["phases"] / 4)


def test_fit_bounds_replace_a_names_bounds() -> None:
    rows = json.loads(FIXTURE.read_text())["rows"]
    c = fit_coefficients(rows, H200, names=list(FITTED), bounds={"dram_latency_ns": (900.0, 901.0)})
    assert 900.0 <= c.dram_latency_ns <= 901.0
