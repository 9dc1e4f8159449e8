"""A fitted kernel time in a model: the fitted model's time with the L2's share of the traffic taken off (PREDICTED).

Contract
--------
* :class:`L2Params`: the L2 estimate's fitted parameters: the replacement ``policy`` of the simulation
  (:data:`stitchtune.analysis.l2_residency.POLICIES`), ``keep`` (the share of the device's L2, ``Device.l2_bytes``,
  that holds a model's tensors between kernels), ``stream_factor`` (the rate a kernel streams its bytes at
  when they come from the L2, as a multiple of the device's copy bandwidth), the ``accounting`` of saved bytes and
  the GEMM traffic model (``gemm_tile``, ``gemm_evict_first``: :func:`simulate_l2`).
* :func:`l2_params(device) -> L2Params`: the fitted parameters for ``device`` (:data:`FITTED`, by device key), else
  :data:`DEFAULT` (the H200's, an assumption for any other device: no other device has in-model kernel times).
* :func:`capacity(device, params) -> float`: ``params.keep`` x the device's L2 bytes.
* :func:`simulate_l2(regions, device, params) -> dict[str, L2Occurrence]`:
  :func:`~stitchtune.analysis.l2_residency.simulate` at :func:`capacity` with ``params``' policy and GEMM model
  (``gemm_tile``: 0 runs a GEMM as one op, reads then writes; else wave by wave of ``gemm_tile`` x ``gemm_tile``
  output tiles on the device's SMs, :mod:`stitchtune.analysis.gemm_traffic`; ``gemm_evict_first``: GEMM operand
  reads neither enter the L2 nor evict, as a streaming read).
* :func:`credited_us(time_us, total_bytes, saved, device, coefficients, params) -> float`: the sum over a region's
  occurrences (``saved``: each one's :attr:`~stitchtune.analysis.l2_residency.L2Occurrence.saved_bytes`) of the
  fitted time ``time_us`` (device time of one occurrence, every unique byte a DRAM byte) less the saved bytes at the
  fitted ceiling (``bw_efficiency`` x copy bandwidth). An occurrence that saves bytes is never below
  ``total_bytes`` (the launch's unique bytes) at the L2 streaming rate (``stream_factor`` x copy bandwidth) nor
  below ``min(time_us, ramp_us)``, and never above ``time_us``; one whose write-backs exceed what it leaves in the
  L2 (``saved < 0``) is slower by them at the ceiling. PREDICTED, never a measurement.

Why and how it was checked: results/l2-2026-12-07-s14/ (``python scripts/check_l2_residency.py``): the fitted cost
model's rows were timed after an L2 flush, a kernel inside a model step often reads the GEMM's output from the L2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from stitchtune.analysis.gemm_traffic import GemmTiling
from stitchtune.analysis.l2_residency import ACCOUNTINGS, GEMM_OPS, POLICIES, L2Occurrence, simulate
from stitchtune.cost.fitted import Coefficients
from stitchtune.hardware.device import Device

__all__ = ["DEFAULT", "FITTED", "L2Params", "capacity", "credited_us", "l2_params", "simulate_l2"]


@dataclass(frozen=True)
class L2Params:
    """The L2 estimate's fitted parameters (module docstring) and where they were fitted."""

    policy: str
    keep: float
    stream_factor: float
    accounting: str = "reads"
    source: str = ""
    gemm_tile: int = 0               # 0: a GEMM is one op (reads, then writes); > 0: tile x tile CTAs, wave by wave
    gemm_evict_first: bool = False   # GEMM operand reads hit what is resident but neither enter the L2 nor evict

    def __post_init__(self) -> None:
        if (self.policy not in POLICIES or self.accounting not in ACCOUNTINGS or not 0.0 < self.keep <= 1.0
                or self.stream_factor <= 0.0 or self.gemm_tile < 0):
            raise ValueError(f"L2Params: policy in {POLICIES}, accounting in {ACCOUNTINGS}, 0 < keep <= 1, "
                             f"stream_factor > 0, gemm_tile >= 0 (got {self})")

    @property
    def gemm(self) -> str:
        """The GEMM traffic model in words: ``whole`` / ``tiles 128`` (+ ``, operands evict-first``)."""
        return ("whole" if not self.gemm_tile else f"tiles {self.gemm_tile}") + (
            ", operands evict-first" if self.gemm_evict_first else "")


#: chosen on the H200's in-model kernel times (results/l2-2026-12-07-s14/check.md: BERT inference's 18 kernels
#: timed standalone and in the model, BERT training's 37 against the fitted model held out; "chosen on A+B"; each
#: group's own choice scored on the other is in the same table)
FITTED: dict[str, L2Params] = {
    "NVIDIA H200/sm_90": L2Params("random", 0.4, 1.1, "reads", "results/l2-2026-12-07-s15 (scripts/check_l2_residency.py)",
                                  gemm_tile=128, gemm_evict_first=True),
}
#: any other device: the H200's parameters (an assumption: no in-model kernel times of another device)
DEFAULT = FITTED["NVIDIA H200/sm_90"]


def l2_params(device: Device) -> L2Params:
    """See the module docstring."""
    return FITTED.get(device.key, DEFAULT)


def capacity(device: Device, params: L2Params) -> float:
    """See the module docstring."""
    return params.keep * float(device.l2_bytes)


def simulate_l2(regions: Sequence[Any], device: Device, params: L2Params) -> dict[str, L2Occurrence]:
    """See the module docstring."""
    tiling = GemmTiling.for_device(device, params.gemm_tile, params.gemm_tile) if params.gemm_tile else None
    streaming = frozenset(GEMM_OPS) if params.gemm_evict_first else frozenset()
    return simulate(regions, capacity(device, params), params.policy, streaming, tiling)


def credited_us(time_us: float, total_bytes: float, saved: Sequence[float], device: Device,
                coefficients: Coefficients, params: L2Params) -> float:
    """See the module docstring."""
    copy_per_us = device.effective_copy_bandwidth_gbs() * 1000.0          # bytes per microsecond
    ceiling = coefficients.bw_efficiency * copy_per_us
    least = max(total_bytes / (params.stream_factor * copy_per_us), min(time_us, coefficients.ramp_us))
    total = 0.0
    for s in saved:
        t = time_us - s / ceiling
        total += t if s < 0 else min(time_us, max(t, least))
    return float(total)
