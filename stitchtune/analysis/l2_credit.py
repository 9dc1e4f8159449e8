"""A fitted kernel time in a model: the fitted model's time with the L2's share of the traffic taken off (PREDICTED).

Contract
--------
* :class:`L2Params`: the L2 estimate's fitted parameters: the replacement ``policy`` of the simulation
  (:data:`stitchtune.analysis.l2_residency.POLICIES`), ``keep`` (the share of the device's L2, ``Device.l2_bytes``,
  that holds a model's tensors between kernels) and ``stream_factor`` (the rate a kernel streams its bytes at
  when they come from the L2, as a multiple of the device's copy bandwidth).
* :func:`l2_params(device) -> L2Params`: the fitted parameters for ``device`` (:data:`FITTED`, by device key), else
  :data:`DEFAULT` (the H200's, an assumption for any other device: no other device has in-model kernel times).
* :func:`capacity(device, params) -> float`: ``params.keep`` x the device's L2 bytes.
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
from typing import Sequence

from stitchtune.analysis.l2_residency import ACCOUNTINGS, POLICIES
from stitchtune.cost.fitted import Coefficients
from stitchtune.hardware.device import Device

__all__ = ["DEFAULT", "FITTED", "L2Params", "capacity", "credited_us", "l2_params"]


@dataclass(frozen=True)
class L2Params:
    """The L2 estimate's fitted parameters (module docstring) and where they were fitted."""

    policy: str
    keep: float
    stream_factor: float
    accounting: str = "reads"
    source: str = ""

    def __post_init__(self) -> None:
        if (self.policy not in POLICIES or self.accounting not in ACCOUNTINGS or not 0.0 < self.keep <= 1.0
                or self.stream_factor <= 0.0):
            raise ValueError(f"L2Params: policy in {POLICIES}, accounting in {ACCOUNTINGS}, 0 < keep <= 1, "
                             f"stream_factor > 0 (got {self})")


#: chosen on the H200's in-model kernel times (results/l2-2026-12-07-s14/check.md: BERT inference's 18 kernels
#: timed standalone and in the model, BERT training's 37 against the fitted model held out; "chosen on A+B"; each
#: group's own choice scored on the other is in the same table)
FITTED: dict[str, L2Params] = {
    "NVIDIA H200/sm_90": L2Params("random", 0.4, 1.1, "reads", "results/l2-2026-12-07-s14 (scripts/check_l2_residency.py)"),
}
#: any other device: the H200's parameters (an assumption: no in-model kernel times of another device)
DEFAULT = FITTED["NVIDIA H200/sm_90"]


def l2_params(device: Device) -> L2Params:
    """See the module docstring."""
    return FITTED.get(device.key, DEFAULT)


def capacity(device: Device, params: L2Params) -> float:
    """See the module docstring."""
    return params.keep * float(device.l2_bytes)


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
