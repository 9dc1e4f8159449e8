"""The tuning worker's driver: cuda-python's :class:`~stitchtune.gpu.driver.CudaDriver` or pycuda's
:class:`~stitchtune.gpu.pycuda_driver.PycudaDriver`, by name or by what is installed.

A module of its own so that :mod:`stitchtune.gpu.driver` never imports :mod:`stitchtune.gpu.pycuda_driver`
(which imports it): the two would be an import circle.
"""

from __future__ import annotations

import os

from stitchtune.errors import ToolchainError
from stitchtune.gpu.driver import DRIVER_ENV, DRIVERS, CudaDriver, Driver, _binding, default_ordinal

__all__ = ["worker_driver"]


def worker_driver(ordinal: int | None = None, name: str | None = None) -> Driver:
    """The driver of the tuning worker (a process of its own, the legacy default stream), current on
    the calling thread: ``name`` (default ``$STITCHTUNE_CUDA_DRIVER``) ``cuda-python`` or ``pycuda``;
    unset: cuda-python when it imports, else pycuda when that does. ToolchainError for an unknown
    name or when neither binding is installed."""
    import importlib.util

    o = default_ordinal() if ordinal is None else int(ordinal)
    want = name if name is not None else os.environ.get(DRIVER_ENV, "")
    if want and want not in DRIVERS:
        raise ToolchainError(f"unknown CUDA driver binding {want!r} (${DRIVER_ENV}: {' or '.join(DRIVERS)})")
    if not want:
        try:
            _binding()
            want = "cuda-python"
        except ToolchainError:  # no cuda-python: pycuda when it is there, else cuda-python's error
            want = "pycuda" if importlib.util.find_spec("pycuda") is not None else "cuda-python"
    if want == "pycuda":
        from stitchtune.gpu.pycuda_driver import PycudaDriver

        return PycudaDriver(o)
    return CudaDriver(o)
