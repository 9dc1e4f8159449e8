"""The IR walk counts a loop bounded by the block index over every block (``stitchtune.cost.walk_blocks``),
not as block 0's trips times the grid (issue 39: BERT's embedding-gradient zero fill, one grid of 1056 x 256
threads for three tables, was counted as 1056 x 1024 elements of its 2 x 768 token-type table)."""

from __future__ import annotations

import pytest

from stitchtune.cost.features import kernel_features
from stitchtune.hardware.device import get_device
from stitchtune.ir import kir
from stitchtune.ir.kir import Assign, Bin, Const, For, If, Kernel, Load, Param, Special, StoreVec, Var
from stitchtune.lower.scatter import ZERO_FILL_BLOCK

H200 = get_device("h200")
I32 = kir.I32
TID, BID, BDIM = Special("tid"), Special("bid"), Special("bdim")


def _fill(size: int, grid: int, block: int = ZERO_FILL_BLOCK) -> Kernel:
    """The zero fill's grid-stride loop (lower/scatter.py ``_fill_loop``): 4 floats a store."""
    i = Var("zi", I32)
    start = Bin("*", Bin("+", Bin("*", BID, BDIM), TID), Const(4, I32))
    body = (For(i, start, Const(size, I32), grid * block * 4, (StoreVec("t", i, (Const(0.0),) * 4),)),)
    return Kernel("zfill", (Param("t", "float32", size, "output"),), body, block)


@pytest.mark.parametrize("size", [2 * 768, 512 * 768, 32000 * 768])
def test_a_grid_stride_fill_counts_each_element_once(size: int) -> None:
    grid = 1056
    f = kernel_features(_fill(size, grid), grid, H200, registers=16)
    assert f.requested_bytes == pytest.approx(4 * size)
    assert f.sector_bytes == pytest.approx(4 * size)


def test_a_blocks_task_range_is_counted_per_block() -> None:
    """Two tasks a block over 5 tasks of 32 rows (3 blocks, the last with one): 5 rows of loads, not 6."""
    t, v = Var("t", I32), Var("v")
    first = Var("t0", I32)
    row = Bin("+", Bin("*", t, Const(32, I32)), TID)
    body = (Assign(first, Bin("*", BID, Const(2, I32))),
            For(t, first, Bin("min", Bin("+", first, Const(2, I32)), Const(5, I32)), 1,
                (Assign(v, Load("in0", row)), StoreVec("out0", row, (v,)))))
    k = Kernel("k", (Param("in0", "float32", 160, "input"), Param("out0", "float32", 160, "output")), body, 32)
    f = kernel_features(k, 3, H200, registers=32)
    assert f.requested_bytes == pytest.approx(2 * 160 * 4)


def test_a_bound_defined_apart_in_two_branches_falls_back_to_block_zero() -> None:
    """A variable the two branches of an ``If`` define differently has no one definition: block 0's trips."""
    n, v, i = Var("n", I32), Var("v"), Var("i", I32)
    cond = Bin("<", TID, Const(16, I32))
    body = (If(cond, (Assign(n, Bin("+", BID, Const(2, I32))),), (Assign(n, Bin("+", BID, Const(1, I32))),)),
            For(i, Const(0, I32), n, 1, (Assign(v, Load("in0", TID)),)))
    k = Kernel("k", (Param("in0", "float32", 32, "input"),), body, 32)
    f = kernel_features(k, 4, H200, registers=32)
    # block 0: 2 trips for 16 threads, 1 for the others (the merged value), times 4 blocks
    assert f.requested_bytes == pytest.approx(4 * 4 * (16 * 2 + 16 * 1))
