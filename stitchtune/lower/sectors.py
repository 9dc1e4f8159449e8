"""32-byte sectors per warp access, from an operand's index map (what the profile's byte counts scale by).

A global access of a warp is served in 32-byte sectors; the ideal is the useful bytes over 32. The
kernels of the row family give the lanes of a warp ``vec`` adjacent view columns each (``lanes_per_row``
lanes on one row, the next ones on the next rows), so the sectors of a tensor's access follow from
its index map alone: :func:`row_sector_factor` enumerates one such warp access at view row 0 and
counts the distinct sectors its addresses touch. A transposed tensor (its innermost column factor
strided) touches one sector per element: up to 8x the ideal for float32. The tiled transpose
(:mod:`stitchtune.lower.transpose`) accesses both sides along a stride-1 run: :func:`sector_factor_of`
of its own offsets. The arithmetic (:func:`sector_factor_of`) is :mod:`stitchtune.ir.sectors`', the one
the emulator and the cost model count with; re-exported here.

Contract: the factor is ``>= 1.0``; 1.0 for a broadcast or coalesced access. Unlike the L2-based rule
of before (factor 1 for any tensor under half the L2), the factor applies at every size: a strided
access moves (and, for stores, partially writes) one sector per element between the SMs and L2, and
on the H200 BERT's K-transposed copy (12.6 MB each way, well inside the L2) took 43.2 us against
8.2 us for Inductor's tiled kernel (issue 39).
"""

from __future__ import annotations

from stitchtune.ir.sectors import SECTOR_BYTES, sector_factor_of
from stitchtune.plan.index_map import IndexMap

__all__ = ["SECTOR_BYTES", "sector_factor_of", "row_sector_factor"]


def row_sector_factor(imap: IndexMap, elem_bytes: int, vec: int, lanes_per_row: int = 32, rows: int = 1,
                      row_step: int | None = None) -> float:
    """The sector factor of one warp access of a row-family kernel to the tensor of map ``imap``:
    lane ``l`` takes the ``vec`` columns from ``(l % lanes_per_row) * vec`` of view row
    ``l // lanes_per_row`` (columns past the row's end idle, rows past the view's end ignored); with
    ``rows > 1`` (a column kernel's row vectors, :mod:`stitchtune.lower.row_vectors`) the ``rows``
    view rows from ``(l // lanes_per_row) * row_step``, all of them in the one access. ``row_step``
    (default ``rows``): the view rows between two lanes' first rows; a column kernel with row vectors reads
    its other tensors one row per access at ``rows=1, row_step=R`` (its lanes' rows ``tk * R + q``)."""
    if imap.cols.broadcast and imap.rows.broadcast:
        return 1.0
    lanes_per_row = max(1, min(32, lanes_per_row))
    step = rows if row_step is None else max(1, row_step)
    offs = []
    for lane in range(32):
        r0, c0 = (lane // lanes_per_row) * step, (lane % lanes_per_row) * vec
        if r0 >= imap.rows.extent:
            break
        offs += [imap.offset(r, c) for r in range(r0, min(r0 + rows, imap.rows.extent))
                 for c in range(c0, min(c0 + vec, imap.cols.extent))]
    return sector_factor_of(offs, elem_bytes)
