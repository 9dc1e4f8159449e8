"""32-byte sectors per warp request, counted from the emulator's address trace.

:func:`~stitchtune.emulate.emulator.emulate_program` with ``trace=[]`` records every global access
statement a launch executes (:class:`~stitchtune.emulate.trace.GlobalAccess`: the active lanes, each
lane's first element and the access width). :func:`count_sectors` splits each access into the
requests of its warps (32 consecutive threads of a block) and counts the distinct 32-byte sectors
each request touches, against the ideal: the distinct bytes it moves over 32, rounded up. A
coalesced access is 1.0x of the ideal; a float32 store whose lanes are 64 elements apart (a
transposed output stored element by element) touches one sector per lane: 8.0x.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from stitchtune.emulate.trace import GlobalAccess

__all__ = ["SECTOR_BYTES", "SectorCount", "count_sectors"]

SECTOR_BYTES = 32


@dataclass(frozen=True)
class SectorCount:
    """Warp requests, the sectors they touched and the ideal sectors for their bytes."""

    requests: int
    sectors: int
    ideal: int

    @property
    def ratio(self) -> float:
        """Sectors over the ideal (1.0 for a coalesced access; 1.0 when nothing was accessed)."""
        return self.sectors / self.ideal if self.ideal else 1.0


def _one(a: GlobalAccess) -> SectorCount:
    """The requests of one access statement, one per warp with an active lane."""
    if a.threads.size == 0:
        return SectorCount(0, 0, 0)
    elems = (a.first[:, None] + np.arange(a.width, dtype=np.int64)[None, :]).ravel()
    warp = np.repeat(a.threads // 32, a.width)
    span = int(elems.max()) + 1
    sectors = np.unique(warp * (span * a.elem_bytes // SECTOR_BYTES + 1) + elems * a.elem_bytes // SECTOR_BYTES)
    per_warp_elems = np.unique(warp * span + elems) // span
    _, counts = np.unique(per_warp_elems, return_counts=True)
    ideal = int(np.sum(-(-counts * a.elem_bytes // SECTOR_BYTES)))
    return SectorCount(int(counts.size), int(sectors.size), ideal)


def count_sectors(trace: Iterable[GlobalAccess], buf: str | None = None, op: str | None = None,
                  kernel: str | None = None) -> SectorCount:
    """The requests, sectors and ideal sectors of the accesses of ``trace`` (those of buffer ``buf``,
    operation ``op`` and kernel ``kernel`` where given)."""
    req = sec = ideal = 0
    for a in trace:
        if (buf is not None and a.buf != buf) or (op is not None and a.op != op) or (kernel is not None
                                                                                      and a.kernel != kernel):
            continue
        c = _one(a)
        req, sec, ideal = req + c.requests, sec + c.sectors, ideal + c.ideal
    return SectorCount(req, sec, ideal)
