"""The emulator's address trace: one record per global access statement a launch executes
(``emulate_program(..., trace=[])``), read by :mod:`stitchtune.emulate.sectors`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GlobalAccess"]


@dataclass(frozen=True)
class GlobalAccess:
    """One global access statement as executed by a launch (the emulator's address trace): kernel, buffer,
    ``op`` (load / store / atomic), element size in bytes, the global thread index of each active
    lane (``bid * block + tid``), its first element and the access's width in elements."""

    kernel: str
    buf: str
    op: str
    elem_bytes: int
    threads: np.ndarray
    first: np.ndarray
    width: int
