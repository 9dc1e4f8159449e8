"""The emulator's access trace: one frozen :class:`MemoryAccess` per global or shared memory
statement a launch executes, handed to the ``trace=`` sink of
:func:`~stitchtune.emulate.emulator.emulate_kernel` / ``emulate_program`` (off by default; no cost
when off). A plain ``list`` is a sink; so is any object with an ``append(MemoryAccess)`` method (the
audit's collector in :mod:`stitchtune.analysis.sectors` counts as it goes instead of keeping the
records). :mod:`stitchtune.emulate.sectors` counts 32-byte sectors per warp request in it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["AccessSink", "MemoryAccess"]


@dataclass(frozen=True)
class MemoryAccess:
    """One executed memory statement (after its bounds and alignment checks pass).

    ``kernel``: the kernel's name; ``where``: the statement's path in the kernel (stable across
    runs); ``buf``: the parameter or shared buffer; ``op``: load | store | atomic; ``elem_bytes``:
    the element size; ``block``: the kernel's block size; ``threads``: the launch-wide index
    (``bid * block + tid``) of each active lane, sorted; ``first``: each lane's first element (a
    shared buffer's: an offset in the block's own copy); ``width``: elements per lane; ``shared``:
    a shared-memory buffer. Remote (cluster) accesses are not traced. The arrays are the record's
    own (copies)."""

    kernel: str
    where: str
    buf: str
    op: str
    elem_bytes: int
    block: int
    threads: np.ndarray
    first: np.ndarray
    width: int
    shared: bool = False

    @property
    def elements(self) -> np.ndarray:
        """The elements the lanes touch, ``[n * width]`` lane-major (int64)."""
        if self.width == 1:
            return self.first
        return (self.first[:, None] + np.arange(self.width, dtype=np.int64)[None, :]).ravel()

    @property
    def warps(self) -> np.ndarray:
        """The launch-wide warp of each lane (``[n]``: a warp is 32 consecutive threads of one block)."""
        per_block = -(-self.block // 32)
        return (self.threads // self.block) * per_block + (self.threads % self.block) // 32


class AccessSink(Protocol):
    """Where ``emulate_kernel(trace=...)`` puts its records: a ``list[MemoryAccess]`` or a collector."""

    def append(self, access: MemoryAccess, /) -> None: ...
