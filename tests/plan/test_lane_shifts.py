"""Column shifts by lane exchange (stitchtune/plan/lane_shifts.py): which shifted reads a butterfly shuffle serves,
and the row-vector loads an element then makes."""

from __future__ import annotations

import pytest

from stitchtune.plan.lane_shifts import exchanges, loads_with, xor_mask
from stitchtune.plan.shift import Shift

DOMAIN = (8, 4, 512, 64)   # Llama's rotary gradient: the columns are the innermost axis, 64 of them


def _sh(d: int, lo: int, hi: int, axis: int = 3) -> Shift:
    return Shift(delta=((axis, d),), conds=((axis, lo, hi),))


@pytest.mark.parametrize("tpr,vec,d,lo,hi,mask", [
    (16, 4, 32, 0, 32, 8),      # rotate_half's x2 read at c + 32 where c < 32: lanes 0-7 take lanes 8-15
    (16, 4, -32, 32, 64, 8),    # and -x1 at c - 32 where c >= 32: lanes 8-15 take lanes 0-7
    (32, 2, 32, 0, 32, 16),
    (8, 8, 32, 0, 32, 4),
    (16, 4, 16, 0, 16, 4),      # a piece of 16 columns: lanes 0-3 take lanes 4-7 (= lane ^ 4)
    (16, 4, 16, 0, 32, None),   # lanes 4-7 would need lanes 8-11 = lane + 4, not lane ^ 4
    (16, 4, 32, 0, 64, None),   # no condition: lanes 8-15 would need lanes 16-23 (outside the row)
    (16, 4, 12, 0, 52, None),   # 3 lanes: not a butterfly
    (8, 4, 32, 0, 32, None),    # tpr x vec = 32 != 64: the row is two sweep iterations
    (16, 4, 2, 0, 62, None),    # not a multiple of vec
    (64, 1, 32, 0, 32, None),   # 32 lanes apart: the next warp
])
def test_xor_mask_serves_exactly_the_butterflies(tpr: int, vec: int, d: int, lo: int, hi: int,
                                                 mask: int | None) -> None:
    sh = _sh(d, lo, hi)
    got = xor_mask(sh, DOMAIN, 64, tpr, vec, 32)
    assert got == mask
    if got is not None:   # the contract, lane by lane: every selected lane's partner holds column c + d
        for lane in range(tpr):
            if lo <= lane * vec < hi:
                assert (lane ^ got) * vec == lane * vec + d


def test_shifts_along_other_axes_or_rows_are_never_exchanged() -> None:
    assert xor_mask(Shift(delta=((2, 1),)), DOMAIN, 64, 16, 4, 32) is None                    # a row shift
    assert xor_mask(Shift(delta=((3, 32),), conds=((2, 0, 8), (3, 0, 32))), DOMAIN, 64, 16, 4, 32) is None
    assert xor_mask(Shift(), DOMAIN, 64, 16, 4, 32) is None                                   # nothing to move
    assert xor_mask(_sh(32, 0, 32), DOMAIN, 128, 32, 4, 32) is None   # the view's columns are not the axis alone
    # 12 lanes a row (not a value of the space): lanes 0-3 -> 4-7 is lane ^ 4 in the row, not in the warp
    assert xor_mask(_sh(16, 0, 16), (8, 4, 512, 48), 48, 12, 4, 32) is None


def test_loads_with_counts_the_reads_left() -> None:
    visits = [(f"h{i}", d, lo, hi) for i in range(4) for d, lo, hi in ((0, 0, 64), (32, 0, 32), (-32, 32, 64))]
    assert loads_with(12, visits, 16, 4, 32) == 4          # view_68: 4 chains x 3 shifts -> 4 chains
    assert loads_with(12, visits, 8, 4, 32) == 12          # a mapping that cannot exchange loads every shift
    assert exchanges(visits, 16, 4, 32) and not exchanges(visits, 8, 4, 32)
    only = [("h", 32, 0, 32), ("h", -32, 32, 64)]     # shifted reads only: one unshifted load serves both
    assert loads_with(2, only, 16, 4, 32) == 1
