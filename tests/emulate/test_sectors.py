"""32-byte sectors per warp request from the emulator's address trace (emulate/sectors.py): a
coalesced store is 1.0x of the ideal, lanes 8 floats apart 8.0x, 16-byte vector stores 1.0x, a
2-byte element 16 lanes per sector; loads and stores counted apart."""

from __future__ import annotations

import numpy as np
import pytest

from stitchtune.emulate.emulator import emulate_kernel
from stitchtune.emulate.sectors import SectorCount, count_sectors, warp_sectors
from stitchtune.ir import kir
from stitchtune.ir.kir import I32, Bin, Const, Special


def _store_kernel(stride: int, width: int, dtype: str = "float32", block: int = 64) -> tuple[kir.Kernel, int]:
    size = 2 * block * stride * width   # (a grid of 2 blocks)
    out = kir.Param("out0", dtype, size, "output")
    inp = kir.Param("in0", "float32", block, "input")
    v = kir.Var("v")
    gid = Bin("+", Bin("*", Special("bid"), Const(block, I32)), Special("tid"))
    idx = Bin("*", gid, Const(stride * width, I32))
    body = (kir.Assign(v, kir.Load("in0", Special("tid"))),
            kir.StoreVec("out0", idx, tuple([v] * width)))
    return kir.Kernel("k", (inp, out), body, block), size


@pytest.mark.parametrize("stride,width,dtype,ratio", [(1, 1, "float32", 1.0), (8, 1, "float32", 8.0),
                                                     (2, 1, "float32", 2.0), (1, 4, "float32", 1.0),
                                                     (64, 1, "float32", 8.0), (1, 1, "float16", 1.0),
                                                     (16, 1, "float16", 16.0)])
def test_sectors_per_request(stride: int, width: int, dtype: str, ratio: float) -> None:
    k, size = _store_kernel(stride, width, dtype)
    from stitchtune.emulate.emulator import elem_dtype
    bufs = {"in0": np.ones(64, np.float32), "out0": np.zeros(size, elem_dtype(dtype))}
    trace: list = []
    emulate_kernel(k, 2, bufs, trace=trace)
    st = count_sectors(trace, op="store")
    assert st.requests == 4 and st.ratio == pytest.approx(ratio)   # 2 blocks x 2 warps
    assert count_sectors(trace, op="load").ratio == 1.0 and count_sectors(trace, buf="nothing").ratio == 1.0


def test_warp_sectors_counts_a_broadcast_once_and_far_addresses_alike() -> None:
    """One warp of 32 lanes reading one float: 1 sector, ideal 1; the same pattern 2**40 elements
    away (past the packed path) and at negative offsets counts the same."""
    w = np.zeros(32, np.int64)
    assert warp_sectors(w, np.full(32, 5), 4) == warp_sectors(w, np.full(32, 5 - 2**40 * 8), 4) == SectorCount(1, 1, 1)
    strided = np.arange(32, dtype=np.int64) * 8
    far = np.r_[strided[:16], strided[16:] + 2**40 * 8]
    assert warp_sectors(w, strided, 4).ratio == 8.0 and warp_sectors(w, far, 4).ratio == 8.0
    assert warp_sectors(w, strided - 1000, 4).ratio == 8.0


def test_the_trace_carries_shared_accesses_which_count_sectors_leaves_out() -> None:
    """A shared buffer's records (shared=True, with the statement's path, as the audit reads them)
    are not global requests."""
    inp = kir.Param("in0", "float32", 128, "input")
    out = kir.Param("out0", "float32", 128, "output")
    gid = Bin("+", Bin("*", Special("bid"), Const(64, I32)), Special("tid"))
    v = kir.Var("v")
    body = (kir.StoreVec("s", Special("tid"), (kir.Load("in0", gid),)), kir.Barrier(),
            kir.Assign(v, kir.Load("s", Special("tid"))), kir.StoreVec("out0", gid, (v,)))
    k = kir.Kernel("k64", (inp, out), body, 64, shared=(kir.SharedBuf("s", 64),))
    trace: list = []
    emulate_kernel(k, 2, {"in0": np.ones(128, np.float32), "out0": np.zeros(128, np.float32)}, trace=trace)
    assert {(a.buf, a.shared) for a in trace} == {("in0", False), ("s", True), ("out0", False)}
    assert all(a.where for a in trace)
    st = count_sectors(trace, op="store")
    assert st.requests == 4 and st.sectors == 16 and st.ratio == 1.0   # 2 blocks x 2 warps x 4 sectors
