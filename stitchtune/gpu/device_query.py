"""The local GPU as a :class:`~stitchtune.hardware.device.Device`, read through the one driver binding.

Contract
--------
* :func:`read_device` describes the GPU behind any :class:`~stitchtune.gpu.driver.DeviceFacts`
  (a :class:`~stitchtune.gpu.driver.CudaDevice`, a :class:`~stitchtune.gpu.driver.CudaDriver`, a
  :class:`~stitchtune.gpu.fake_driver.FakeDriver`): its name, the ``CU_DEVICE_ATTRIBUTE_*`` values of
  :data:`~stitchtune.hardware.device.DEVICE_ATTRIBUTES` and ``cuDeviceTotalMem``, turned into a Device
  by :func:`~stitchtune.hardware.device.device_from_attributes` (``source == "cuda"``). The compute
  capability is required (its :class:`~stitchtune.gpu.driver.DriverError` propagates); an attribute
  the driver does not support is left out (the architecture's value is used) and logged at DEBUG.
* :func:`query_device` is :func:`read_device` of GPU ``ordinal`` (default ``$STITCHTUNE_CUDA_DEVICE``,
  else 0) through cuda-python, without creating a context. Raises
  :class:`~stitchtune.errors.ToolchainError` when cuda-python, the driver or that GPU is missing.
* :func:`default_device` is :func:`query_device` when it succeeds, else the H200 preset; the reason
  for the preset is logged (INFO the first time per reason, DEBUG after). Never raises
  ToolchainError.
"""

from __future__ import annotations

import logging
import threading

from stitchtune.errors import ToolchainError
from stitchtune.gpu.driver import DeviceFacts, DriverError, open_device
from stitchtune.hardware.device import (
    DEVICE_ATTRIBUTES,
    PRESETS,
    QUERIED_SOURCE,
    Device,
    device_from_attributes,
)

__all__ = ["default_device", "query_device", "read_device"]

log = logging.getLogger(__name__)

_REQUIRED = ("COMPUTE_CAPABILITY_MAJOR", "COMPUTE_CAPABILITY_MINOR")
_said: set[str] = set()
_said_lock = threading.Lock()


def read_device(drv: DeviceFacts) -> Device:
    """The Device that ``drv`` reports (see the module docstring). Raises ToolchainError (a
    DriverError) when the name or compute capability cannot be read."""
    name = str(drv.info()["name"])
    attrs: dict[str, int] = {}
    for label in DEVICE_ATTRIBUTES:
        try:
            attrs[label] = int(drv.attribute(label))
        except DriverError as exc:
            if label in _REQUIRED:
                raise
            log.debug("%s: attribute %s not reported (%s); using the architecture's value", name, label, exc)
    try:
        memory: int | None = int(drv.total_memory())
    except DriverError as exc:
        log.debug("%s: total memory not reported (%s)", name, exc)
        memory = None
    return device_from_attributes(name, attrs, memory_bytes=memory, source=QUERIED_SOURCE)


def query_device(ordinal: int | None = None) -> Device:
    """Describe GPU ``ordinal`` (default ``$STITCHTUNE_CUDA_DEVICE``, else 0) through cuda-python.

    No context is created. Raises ToolchainError when cuda-python, the driver or the GPU is missing,
    or a required attribute cannot be read."""
    drv = open_device(ordinal)
    d = read_device(drv)
    log.info("queried GPU %d: %s (%s SMs)", drv.ordinal, d.key, d.sm_count)
    return d


def default_device() -> Device:
    """The local GPU (:func:`query_device`) when cuda-python finds one, else the H200 preset, with the
    reason logged. Never raises ToolchainError."""
    try:
        return query_device()
    except ToolchainError as exc:
        reason = f"no GPU through cuda-python ({exc}); using the H200 preset"
        with _said_lock:
            first = reason not in _said
            _said.add(reason)
        log.log(logging.INFO if first else logging.DEBUG, "%s", reason)
        return PRESETS["h200"]
