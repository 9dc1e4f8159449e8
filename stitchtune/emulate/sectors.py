"""32-byte sectors per warp request: the one counter of the emulator's trace, the audit and the cost model.

A *request* is one warp executing one global memory statement (its active lanes); its sectors are
the distinct 32-byte sectors its lanes touch, its ideal the fewest sectors its distinct bytes could
fill (``ceil(distinct bytes / 32)``; lanes that touch the same element count once). A coalesced
access is 1.0x of the ideal; a float32 store whose lanes are 64 elements apart (a transposed output
stored element by element) touches one sector per lane: 8.0x.

:func:`warp_sectors` is the arithmetic, kept in :mod:`stitchtune.ir.sectors` (lowering uses it too,
and may not import the emulator) and re-exported here; :func:`count_sectors` applies it to the
records of ``emulate_program(..., trace=[])``
(:class:`~stitchtune.emulate.trace.MemoryAccess`; shared-memory records are skipped).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from stitchtune.emulate.trace import MemoryAccess
from stitchtune.ir.sectors import SECTOR_BYTES, SectorCount, warp_sectors

__all__ = ["SECTOR_BYTES", "SectorCount", "count_sectors", "warp_sectors"]


def count_sectors(trace: Iterable[MemoryAccess], buf: str | None = None, op: str | None = None,
                  kernel: str | None = None) -> SectorCount:
    """The requests, sectors and ideal sectors of the global accesses of ``trace`` (those of buffer
    ``buf``, operation ``op`` and kernel ``kernel`` where given)."""
    total = SectorCount(0, 0, 0)
    for a in trace:
        if a.shared or (buf is not None and a.buf != buf) or (op is not None and a.op != op) or (
                kernel is not None and a.kernel != kernel):
            continue
        total += warp_sectors(np.repeat(a.warps, a.width), a.elements, a.elem_bytes)
    return total
