"""The fitted model's time of an ideal kernel: the least any kernel moving a launch's bytes can be predicted.

Contract
--------
:func:`ideal_features(f)` is ``f`` (a launch's :class:`~stitchtune.cost.features.KernelFeatures`) with every
inefficiency the IR walk can see taken away and its bytes and grid kept: sectors equal to the unique bytes
(no re-read, no strided sector), every lane active, all of a thread's registers (255) free for loads in flight
and as many bytes in flight as they hold (walked and compiled), no arithmetic, shared memory, barrier, shuffle,
serial load round, scratch load or L2 request, spill, atomic or grid barrier, one load phase. :func:`ideal_us(program, device,
registers=None)` is the fitted model's device time (:func:`stitchtune.cost.fitted.kernel_device_us`, the
coefficients :func:`~stitchtune.cost.fitted.coefficients_for` gives) of those ideal launches, summed: a
region predicted at this time cannot be predicted faster by any change of its kernels that keeps their
bytes and grids, only by moving fewer bytes or by the model. It evaluates the model, so it follows the
model's form whatever its coefficients (today: the unique bytes at ``bw_efficiency`` x the copy bandwidth, a
kernel without loads, kept so, at ``store_bw_factor`` x it, plus ``ramp_us`` per launch). A prediction, never a measurement; pure, never raises for a program
:func:`~stitchtune.cost.fitted.predict_program` accepts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from stitchtune.cost.features import KernelFeatures, program_features
from stitchtune.cost.fitted import coefficients_for, kernel_device_us
from stitchtune.hardware.device import Device
from stitchtune.ir import kir

#: the registers an ideal thread has for loads in flight (the architectural most per thread)
IDEAL_REGISTERS = 255


def ideal_features(f: KernelFeatures) -> KernelFeatures:
    """``f`` with its bytes and grid and none of its inefficiencies (module docstring); a kernel without loads (a
    zero fill) stays without them (the model streams its stores at their own rate)."""
    if f.bytes_in_flight_per_thread <= 0 and f.compiled_bytes_in_flight <= 0 and f.load_rounds <= 0:
        return replace(f, sector_bytes=float(f.unique_bytes), requested_bytes=float(f.unique_bytes), sector_factor=1.0,
                       excess_sector_bytes=0.0, active_lanes=1.0, float_ops=0.0, barriers=0.0, atomics=0.0,
                       grid_barriers=0.0, serial_rounds=0.0, shuffles=0.0, spill_instructions=0.0)
    return replace(f, registers=max(f.registers, IDEAL_REGISTERS), sector_bytes=float(f.unique_bytes),
                   requested_bytes=float(f.unique_bytes), sector_factor=1.0, excess_sector_bytes=0.0,
                   active_lanes=1.0, bytes_in_flight_per_thread=4.0 * IDEAL_REGISTERS, chained_loads=0.0,
                   smem_requests=0.0, smem_wavefronts=0.0, bank_conflict=1.0, smem_dead_bytes=0, divisions=0.0,
                   transcendentals=0.0, float_ops=0.0, barriers=0.0, load_phases=1.0, atomics=0.0,
                   scratch_loads=0.0, grid_barriers=0.0, load_rounds=1.0, serial_rounds=0.0, shuffles=0.0,
                   l2_requests=0.0, compiled_bytes_in_flight=4.0 * IDEAL_REGISTERS, spill_instructions=0.0)


def ideal_us(program: kir.Program, device: Device, registers: Mapping[str, int] | None = None) -> float:
    """The fitted model's device time of ``program``'s launches made ideal (µs, predicted; module docstring)."""
    c = coefficients_for(device)
    return float(sum(kernel_device_us(ideal_features(f), device, c)
                     for f in program_features(program, device, registers)))
