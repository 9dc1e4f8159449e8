"""The one sector arithmetic (stitchtune/ir/sectors.py): lowering's per-tensor factors and the emulator's
trace counter use it, and give what the former copies gave."""

from __future__ import annotations

import math
import random

import numpy as np

from stitchtune.emulate import sectors as emulate_sectors
from stitchtune.ir import sectors
from stitchtune.lower import sectors as lower_sectors


def _old_sector_factor_of(offsets, elem_bytes: int) -> float:
    """lower/sectors.py's own arithmetic before it used ir/sectors.py (kept here as the reference)."""
    elems = set(offsets)
    if not elems:
        return 1.0
    n = len({(o * elem_bytes) // 32 for o in elems})
    return max(1.0, n / math.ceil(len(elems) * elem_bytes / 32))


def test_lower_and_emulate_use_the_ir_arithmetic() -> None:
    assert lower_sectors.sector_factor_of is sectors.sector_factor_of
    assert emulate_sectors.warp_sectors is sectors.warp_sectors
    assert emulate_sectors.SectorCount is sectors.SectorCount
    assert lower_sectors.SECTOR_BYTES == emulate_sectors.SECTOR_BYTES == 32


def test_sector_factor_equals_the_former_copy_and_one_warp_of_warp_sectors() -> None:
    rng = random.Random(0)
    cases = [[], [5] * 32, list(range(32)), [64 * i for i in range(32)], [i * 3 - 40 for i in range(32)]]
    for _ in range(300):
        stride, n = rng.choice([1, 2, 3, 8, 17, 64, 1000]), rng.randint(1, 128)
        start = rng.randint(-5000, 5000)
        cases.append([start + stride * i + rng.choice([0, 0, 1]) for i in range(n)])
    for offs in cases:
        for eb in (1, 2, 4, 8):
            got = sectors.sector_factor_of(offs, eb)
            assert got == _old_sector_factor_of(offs, eb), (offs[:4], eb)
            if offs:
                one = sectors.warp_sectors(np.zeros(len(offs), np.int64), np.array(offs), eb)
                assert got == max(1.0, one.ratio)


def test_strided_float_store_is_eight_times_its_ideal() -> None:
    assert sectors.sector_factor_of([64 * i for i in range(32)], 4) == 8.0
    assert sectors.sector_factor_of(range(32), 4) == 1.0
