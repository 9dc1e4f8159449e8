"""The emulator's address trace: one record per global access statement a launch executes
(``emulate_program(..., trace=[])``), read by :mod:`stitchtune.emulate.sectors`; and the observer
protocol of ``emulate_kernel(..., observe=...)`` (:class:`AccessTrace`: every global and shared access
with its statement's path, read by :mod:`stitchtune.analysis.sectors`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["AccessTrace", "GlobalAccess"]


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


class AccessTrace(Protocol):
    """An observer of memory accesses (``emulate_kernel(observe=...)``; off by default).

    Called once per executed load / store / atomic statement of a global or shared buffer with the
    statement's ``where`` (its path in the kernel, stable across runs), the buffer, the op (``load`` |
    ``store`` | ``atomic``), the launch-wide thread index of each active lane (``threads``, [n],
    sorted), the element indices those lanes touch (``elements``, [n * width], lane-major; a shared
    buffer's are offsets in the block's own copy), the vector ``width`` and ``shared`` (a shared
    buffer). Remote (cluster) accesses are not traced. The arrays belong to the emulator: copy what
    you keep.
    """

    def __call__(self, where: str, buf: str, op: str, threads: np.ndarray, elements: np.ndarray,
                 width: int, shared: bool) -> None: ...
