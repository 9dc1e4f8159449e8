"""32-byte sectors per warp request: the one piece of sector arithmetic of the project.

A *request* is one warp executing one global memory statement (its active lanes); its sectors are
the distinct 32-byte sectors its lanes touch, its ideal the fewest sectors its distinct bytes could
fill (``ceil(distinct bytes / 32)``; lanes that touch the same element count once). A coalesced
access is 1.0x of the ideal; a float32 store whose lanes are 64 elements apart (a transposed output
stored element by element) touches one sector per lane: 8.0x.

Users: the emulator's trace counter (:mod:`stitchtune.emulate.sectors`), the audit's collector
(:mod:`stitchtune.analysis.sectors`), the cost model's static walk (:mod:`stitchtune.cost.ir_walk`)
and lowering's per-tensor sector factors (:mod:`stitchtune.lower.sectors`). It lives in ``ir`` because
both ``lower`` and ``emulate`` may import ``ir`` and neither may import the other.

Contract: :func:`warp_sectors(warps, elements, elem_bytes) -> SectorCount` for any int arrays of equal
length (elements may repeat or be negative); :func:`sector_factor_of(offsets, elem_bytes) -> float` is
one warp's ``max(1.0, ratio)`` (1.0 for no offsets).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

__all__ = ["SECTOR_BYTES", "SectorCount", "sector_factor_of", "warp_sectors"]

#: the unit of a global memory transaction between the SMs and L2 / DRAM
SECTOR_BYTES = 32
_SHIFT = 34   # (warp << _SHIFT) | element: elements below 2**34, warps below 2**28


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

    def __add__(self, other: SectorCount) -> SectorCount:
        return SectorCount(self.requests + other.requests, self.sectors + other.sectors, self.ideal + other.ideal)


def warp_sectors(warps: np.ndarray, elements: np.ndarray, elem_bytes: int) -> SectorCount:
    """The requests, sectors and ideal sectors of one memory statement: ``elements[i]`` (any int
    array, may repeat) is touched by warp ``warps[i]`` (same length; one request per distinct warp)."""
    if np.size(elements) == 0:
        return SectorCount(0, 0, 0)
    e = np.asarray(elements, np.int64)
    w = np.asarray(warps, np.int64)
    e = e - (int(e.min()) // 32) * 32   # non-negative; a shift by whole 32-element runs keeps the sectors
    if int(e.max()) < 1 << _SHIFT and int(w.max()) < 1 << (62 - _SHIFT):
        pairs = np.unique((w << _SHIFT) | e)   # a broadcast lane counts once
        pw, pe = pairs >> _SHIFT, pairs & ((1 << _SHIFT) - 1)
        sectors = np.unique((pw << _SHIFT) | ((pe * elem_bytes) // SECTOR_BYTES)).size
    else:   # addresses too far apart to pack: the same counts, by rows
        pw, pe = np.unique(np.stack([w, e], 1), axis=0).T
        sectors = np.unique(np.stack([pw, (pe * elem_bytes) // SECTOR_BYTES], 1), axis=0).shape[0]
    per_warp = np.unique(pw, return_counts=True)[1]
    ideal = int((-(-(per_warp * elem_bytes) // SECTOR_BYTES)).sum())
    return SectorCount(int(per_warp.size), int(sectors), ideal)


def sector_factor_of(offsets: Iterable[int], elem_bytes: int) -> float:
    """Sectors one warp access touches over the ideal (its distinct elements' bytes / 32, rounded
    up), for the element ``offsets`` of the access (any order, repeats allowed); at least 1.0."""
    e = np.fromiter(offsets, dtype=np.int64)
    return max(1.0, warp_sectors(np.zeros(e.size, np.int64), e, elem_bytes).ratio)
