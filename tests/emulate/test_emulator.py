"""Tests of the numpy SIMT emulator on hand-built kernel IR."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stitchtune.ir import kir
from stitchtune.emulate.emulator import EmulatorFault, emulate_kernel, emulate_program
from stitchtune.ir.kir import (
    BOOL,
    I32,
    Assign,
    AtomicAdd,
    Barrier,
    Bin,
    BufferSpec,
    Cast,
    Const,
    For,
    GridSync,
    If,
    Kernel,
    Launch,
    Load,
    LoadVec,
    LocalArray,
    LocalRef,
    Param,
    Program,
    ProgramProfile,
    Select,
    SetLocal,
    SharedBuf,
    Shfl,
    Special,
    StoreVec,
    Var,
)

TID, BID, BDIM, GDIM = Special("tid"), Special("bid"), Special("bdim"), Special("gdim")


def i(v: int) -> Const:
    return Const(v, I32)


def f(v: float) -> Const:
    return Const(v)


def add(a: kir.Expr, b: kir.Expr) -> Bin:
    return Bin("+", a, b)


def mul(a: kir.Expr, b: kir.Expr) -> Bin:
    return Bin("*", a, b)


def lt(a: kir.Expr, b: kir.Expr) -> Bin:
    return Bin("<", a, b)


GID = add(mul(BID, BDIM), TID)


def single_program(kernel: Kernel, grid: int, buffers: tuple[BufferSpec, ...]) -> Program:
    launch = Launch(kernel.name, grid, kernel.block, kernel.smem_bytes, tuple(b.name for b in buffers))
    return Program((kernel,), buffers, (launch,), ProgramProfile((), 0))


# ----------------------------------------------------------------------------------------------
# vectorised copy with a masked tail
# ----------------------------------------------------------------------------------------------


def copy_kernel(n: int, dtype: str = "float32", width: int = 4, tail_mask: bool = True,
                scale: float | None = None) -> Kernel:
    """y[j] = x[j] (times ``scale``) with ``width``-wide accesses and a scalar masked tail."""
    base = Var("base", I32)
    xs = tuple(Var(f"x{k}") for k in range(width))
    vals = tuple(mul(x, f(scale)) if scale is not None else x for x in xs)
    j = Var("j", I32)
    tail_pred = lt(add(base, j), i(n)) if tail_mask else None
    tail_val = Load("x", add(base, j), tail_pred)
    body = (
        Assign(base, mul(GID, i(width))),
        If(Bin("<=", add(base, i(width)), i(n)),
           (LoadVec(xs, "x", base), StoreVec("y", base, vals)),
           (For(j, i(0), i(width), 1,
                (StoreVec("y", add(base, j), (mul(tail_val, f(scale)) if scale is not None else tail_val,),
                          tail_pred),), unroll=True),)),
    )
    return Kernel("copy", (Param("x", dtype, n, "input"), Param("y", dtype, n, "output")), body, block=128)


def copy_grid(n: int, width: int = 4, block: int = 128) -> int:
    """Blocks for one thread per ``width``-wide vector (the last one partial)."""
    vectors = math.ceil(n / width)
    return math.ceil(vectors / block)


@pytest.mark.parametrize("n", [1000, 1023, 4096])
def test_vector_copy_with_tail(n: int) -> None:
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    k = copy_kernel(n)
    prog = single_program(k, copy_grid(n), (BufferSpec("bx", "float32", n, "input", "x"),
                                             BufferSpec("by", "float32", n, "output", "y")))
    out = emulate_program(prog, {"x": x})
    assert out["y"].dtype == np.float32
    np.testing.assert_array_equal(out["y"], x)


def test_compiled_kernels_are_cached_per_kernel_and_released_with_it() -> None:
    """A kernel is translated once while it lives; its cache entry (closures and all) goes with it, so a
    long run that emulates many kernels (a tuning session, the test suite) does not keep them all."""
    import gc
    import weakref

    from stitchtune.emulate import translate

    n = 1000
    k = copy_kernel(n)
    x = np.ones(n, np.float32)
    emulate_kernel(k, copy_grid(n), {"x": x, "y": np.zeros(n, np.float32)})
    ck = translate._compiled(k)
    emulate_kernel(k, copy_grid(n), {"x": x, "y": np.zeros(n, np.float32)})
    assert translate._compiled(k) is ck
    ref = weakref.ref(ck)
    del k, ck
    gc.collect()
    assert ref() is None
    assert all(kref() is not None for kref, _ in translate._CACHE.values())  # no entry outlives its kernel


def test_vector_copy_without_tail_mask_is_out_of_bounds() -> None:
    n = 1023
    k = copy_kernel(n, tail_mask=False)
    x = np.zeros(n, np.float32)
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(k, copy_grid(n), {"x": x, "y": np.zeros(n, np.float32)})
    assert ei.value.kind == "out_of_bounds"
    assert "[1023]" in str(ei.value)


def test_misaligned_vector_load() -> None:
    n = 64
    xs = tuple(Var(f"x{k}") for k in range(4))
    k = Kernel("mis", (Param("x", "float32", n, "input"), Param("y", "float32", n, "output")),
               (If(lt(TID, i(8)), (LoadVec(xs, "x", add(mul(TID, i(4)), i(2))),
                                   StoreVec("y", mul(TID, i(4)), xs))),), block=32)
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(k, 1, {"x": np.zeros(n, np.float32), "y": np.zeros(n, np.float32)})
    assert ei.value.kind == "bad_alignment"


# ----------------------------------------------------------------------------------------------
# reductions
# ----------------------------------------------------------------------------------------------


def warp_rowsum_kernel(rows: int, cols: int, warps_per_block: int = 4, width: int = 1) -> Kernel:
    """One warp per row: strided partial sums (``width``-wide loads when cols % width == 0),
    xor-shuffle tree, lane 0 stores."""
    row, lane, acc, j = Var("row", I32), Var("lane", I32), Var("acc"), Var("j", I32)
    xs = tuple(Var(f"v{k}") for k in range(width))
    if width == 1:
        load = (Assign(acc, add(acc, Load("x", add(mul(row, i(cols)), j)))),)
    else:
        load = (LoadVec(xs, "x", add(mul(row, i(cols)), j)),
                *(Assign(acc, add(acc, x)) for x in xs))
    body = [
        Assign(row, add(mul(BID, i(warps_per_block)), Bin("/", TID, i(32)))),
        Assign(lane, Bin("%", TID, i(32))),
        Assign(acc, f(0.0)),
        If(lt(row, i(rows)), (For(j, mul(lane, i(width)), i(cols), 32 * width, load),)),
    ]
    for m in (16, 8, 4, 2, 1):
        body.append(Assign(acc, add(acc, Shfl(acc, m))))
    body.append(If(Bin("&&", Bin("==", lane, i(0)), lt(row, i(rows))), (StoreVec("y", row, (acc,)),)))
    return Kernel("warp_rowsum", (Param("x", "float32", rows * cols, "input"),
                                  Param("y", "float32", rows, "output")), tuple(body), block=32 * warps_per_block)


def test_warp_shuffle_row_sum_matches_numpy() -> None:
    rows, cols = 37, 100
    x = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32)
    y = np.full(rows, np.nan, np.float32)
    grid = -(-rows // 4)
    emulate_kernel(warp_rowsum_kernel(rows, cols), grid, {"x": x.ravel(), "y": y},
                   written={"y": np.zeros(rows, bool)})
    np.testing.assert_allclose(y, x.sum(axis=1, dtype=np.float64), rtol=1e-5, atol=1e-5)


def test_shuffle_with_inactive_lanes_faults() -> None:
    acc = Var("acc")
    k = Kernel("bad_shfl", (Param("y", "float32", 64, "output"),),
               (Assign(acc, Cast(TID, "f32")),
                If(lt(Bin("%", TID, i(32)), i(16)), (Assign(acc, Shfl(acc, 1)),)),
                StoreVec("y", TID, (acc,))), block=64)
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(k, 1, {"y": np.zeros(64, np.float32)})
    assert ei.value.kind == "inactive_shuffle"


def test_shuffle_width_segments() -> None:
    """__shfl_xor_sync with width 8: lanes exchange within groups of 8 only."""
    v = Var("v")
    k = Kernel("seg", (Param("y", "float32", 32, "output"),),
               (Assign(v, Cast(TID, "f32")), Assign(v, Shfl(v, 4, width=8)), StoreVec("y", TID, (v,))),
               block=32)
    y = np.zeros(32, np.float32)
    emulate_kernel(k, 1, {"y": y})
    np.testing.assert_array_equal(y, np.arange(32) ^ 4)


def block_reduce_kernel(rows: int, cols: int, block: int = 256, barriers: bool = True) -> Kernel:
    """One block per row: strided partial sums, shared-memory tree with __syncthreads."""
    acc, j = Var("acc"), Var("j", I32)
    body: list = [
        Assign(acc, f(0.0)),
        For(j, TID, i(cols), block, (Assign(acc, add(acc, Load("x", add(mul(BID, i(cols)), j)))),)),
        StoreVec("sm", TID, (acc,)),
    ]
    if barriers:
        body.append(Barrier())
    s = block // 2
    while s >= 1:
        body.append(If(lt(TID, i(s)), (StoreVec("sm", TID, (add(Load("sm", TID), Load("sm", add(TID, i(s)))),)),)))
        if barriers:
            body.append(Barrier())
        s //= 2
    body.append(If(Bin("==", TID, i(0)), (StoreVec("y", BID, (Load("sm", i(0)),)),)))
    return Kernel("block_reduce", (Param("x", "float32", rows * cols, "input"),
                                   Param("y", "float32", rows, "output")), tuple(body), block=block,
                  shared=(SharedBuf("sm", block),))


def test_shared_memory_block_reduction() -> None:
    rows, cols = 6, 1000
    x = np.random.default_rng(2).standard_normal((rows, cols)).astype(np.float32)
    y = np.zeros(rows, np.float32)
    emulate_kernel(block_reduce_kernel(rows, cols), rows, {"x": x.ravel(), "y": y},
                   written={"y": np.zeros(rows, bool)})
    np.testing.assert_allclose(y, x.sum(axis=1, dtype=np.float64), rtol=1e-5, atol=1e-4)


def test_block_reduction_without_barrier_is_a_shared_race() -> None:
    rows, cols = 2, 300
    x = np.ones(rows * cols, np.float32)
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(block_reduce_kernel(rows, cols, barriers=False), rows,
                       {"x": x, "y": np.zeros(rows, np.float32)})
    assert ei.value.kind == "shared_race"
    assert "sm" in str(ei.value)


def test_write_after_read_by_another_thread_is_a_shared_race() -> None:
    """Thread t reads sm[t+1], then thread t+1 overwrites it in the same interval."""
    v = Var("v")
    k = Kernel("war", (Param("y", "float32", 32, "output"),),
               (StoreVec("sm", TID, (f(1.0),)), Barrier(),
                Assign(v, Load("sm", Bin("%", add(TID, i(1)), i(32)))),
                StoreVec("sm", TID, (v,)), Barrier(), StoreVec("y", TID, (Load("sm", TID),))),
               block=32, shared=(SharedBuf("sm", 32),))
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(k, 1, {"y": np.zeros(32, np.float32)})
    assert ei.value.kind == "shared_race"


def broadcast_kernel(barrier: bool) -> Kernel:
    """Threads 0, 1 of each block write sm[0], sm[1]; then every thread reads sm[0] (a block-wide
    broadcast) and sm[tid % 2] (a period-2 pattern)."""
    body = (If(Bin("<", TID, i(2)), (StoreVec("sm", TID, (add(Cast(BID, "f32"), Cast(TID, "f32")),)),)),
            *((Barrier(),) if barrier else ()),
            StoreVec("y", GID, (Load("sm", i(0)),)),
            StoreVec("y", add(GID, i(128)), (Load("sm", Bin("%", TID, i(2))),)))
    return Kernel("bcast", (Param("y", "float32", 256, "output"),), body, block=64,
                  shared=(SharedBuf("sm", 2),))


def test_shared_broadcast_read() -> None:
    y = np.zeros(256, np.float32)
    emulate_kernel(broadcast_kernel(True), 2, {"y": y})
    np.testing.assert_array_equal(y[:128], np.repeat([0.0, 1.0], 64))
    np.testing.assert_array_equal(y[128:], np.tile([0.0, 1.0], 64) + np.repeat([0.0, 1.0], 64))
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(broadcast_kernel(False), 2, {"y": y})
    assert ei.value.kind == "shared_race"
    assert "thread 1 " in str(ei.value)


# ----------------------------------------------------------------------------------------------
# faults
# ----------------------------------------------------------------------------------------------


def test_out_of_bounds_load_names_the_thread() -> None:
    n = 100
    k = Kernel("oob", (Param("x", "float32", n, "input"), Param("y", "float32", 128, "output")),
               (StoreVec("y", GID, (Load("x", GID),)),), block=128)
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(k, 1, {"x": np.zeros(n, np.float32), "y": np.zeros(128, np.float32)})
    assert ei.value.kind == "out_of_bounds"
    assert "x[100]" in str(ei.value) and "thread 100" in str(ei.value)
    # the same load under a bounds predicate is fine and reads 0.0 where masked
    k2 = Kernel("oob2", k.params, (StoreVec("y", GID, (Load("x", GID, lt(GID, i(n))),)),), block=128)
    y = np.full(128, 7.0, np.float32)
    emulate_kernel(k2, 1, {"x": np.ones(n, np.float32), "y": y})
    np.testing.assert_array_equal(y, np.r_[np.ones(n), np.zeros(28)])


def test_uninitialised_global_read() -> None:
    n = 64
    k = Kernel("uninit", (Param("out", "float32", n, "output"),),
               (StoreVec("out", TID, (add(Load("out", TID), f(1.0)),)),), block=64)
    out = np.full(n, np.nan, np.float32)
    w = np.zeros(n, bool)
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(k, 1, {"out": out}, written={"out": w})
    assert ei.value.kind == "uninitialized_read"
    # once written, the same read is fine; `written` is updated in place
    k0 = Kernel("init", k.params, (StoreVec("out", TID, (f(2.0),)),), block=64)
    emulate_kernel(k0, 1, {"out": out}, written={"out": w})
    assert w.all()
    emulate_kernel(k, 1, {"out": out}, written={"out": w})
    np.testing.assert_array_equal(out, 3.0)


def test_unwritten_elements_fault_after_earlier_stores_in_the_same_launch() -> None:
    """Loads stop checking the written flags only once every element is written: after a store of half
    a buffer, a load of the other half still faults (global and shared), and a load after the rest is
    stored does not."""
    n = 64
    half = If(lt(TID, i(32)), (StoreVec("out", TID, (f(1.0),)),))
    k = Kernel("half", (Param("out", "float32", n, "output"), Param("y", "float32", n, "output")),
               (half, StoreVec("y", TID, (Load("out", TID),))), block=n)
    out, y = np.full(n, np.nan, np.float32), np.zeros(n, np.float32)
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(k, 1, {"out": out, "y": y}, written={"out": np.zeros(n, bool)})
    assert ei.value.kind == "uninitialized_read" and "out[32]" in str(ei.value) and "thread 32" in str(ei.value)
    rest = If(lt(TID, i(32)), (), (StoreVec("out", TID, (f(2.0),)),))
    k2 = Kernel("whole", k.params, (half, rest, StoreVec("y", TID, (Load("out", TID),))), block=n)
    emulate_kernel(k2, 1, {"out": out, "y": y}, written={"out": np.zeros(n, bool)})
    np.testing.assert_array_equal(y, np.r_[np.ones(32), np.full(32, 2.0)])
    ks = Kernel("half_sm", (Param("y", "float32", n, "output"),),
                (If(lt(TID, i(32)), (StoreVec("sm", TID, (f(1.0),)),)), Barrier(),
                 StoreVec("y", TID, (Load("sm", Bin("-", i(n - 1), TID)),))),
                block=n, shared=(SharedBuf("sm", n),))
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(ks, 2, {"y": np.zeros(n, np.float32)})
    assert ei.value.kind == "uninitialized_read" and "sm[63]" in str(ei.value) and "block 0 thread 0" in str(ei.value)


def test_uninitialised_shared_read() -> None:
    k = Kernel("uninit_sm", (Param("y", "float32", 32, "output"),),
               (If(lt(TID, i(16)), (StoreVec("sm", TID, (f(1.0),)),)), Barrier(),
                StoreVec("y", TID, (Load("sm", TID),))),
               block=32, shared=(SharedBuf("sm", 32),))
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(k, 1, {"y": np.zeros(32, np.float32)})
    assert ei.value.kind == "uninitialized_read"
    assert "thread 16" in str(ei.value)


def test_divergent_barrier() -> None:
    params = (Param("y", "float32", 64, "output"),)
    bad = Kernel("div", params, (If(lt(TID, i(16)), (Barrier(),)), StoreVec("y", GID, (f(0.0),))), block=32)
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(bad, 2, {"y": np.zeros(64, np.float32)})
    assert ei.value.kind == "divergent_barrier"
    # a block-uniform condition is fine: block 0 syncs, block 1 skips it
    ok = Kernel("uniform", params, (If(Bin("==", BID, i(0)), (Barrier(),)), StoreVec("y", GID, (f(1.0),))),
                block=32)
    y = np.zeros(64, np.float32)
    emulate_kernel(ok, 2, {"y": y})
    np.testing.assert_array_equal(y, 1.0)


def neighbour_kernel(grid_sync: bool) -> Kernel:
    """Block b writes s[b] then reads s[(b+1) % grid] (needs a grid barrier in between)."""
    body: list = [If(Bin("==", TID, i(0)), (StoreVec("s", BID, (Cast(BID, "f32"),)),))]
    if grid_sync:
        body.append(GridSync())
    body.append(If(Bin("==", TID, i(0)),
                   (StoreVec("y", BID, (Load("s", Bin("%", add(BID, i(1)), GDIM)),)),)))
    return Kernel("neighbour", (Param("s", "float32", 8, "scratch"), Param("y", "float32", 8, "output"),
                                Param("bar", "float32", 2, "barrier")), tuple(body), block=32,
                  barrier_param="bar")


def neighbour_buffers() -> dict[str, np.ndarray]:
    return {"s": np.zeros(8, np.float32), "y": np.zeros(8, np.float32), "bar": np.zeros(2, np.uint32)}


def test_cross_block_read_without_grid_sync_is_a_global_race() -> None:
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(neighbour_kernel(False), 8, neighbour_buffers())
    assert ei.value.kind == "global_race"


def test_cross_block_read_after_grid_sync() -> None:
    bufs = neighbour_buffers()
    emulate_kernel(neighbour_kernel(True), 8, bufs, coresident_limit=8)
    np.testing.assert_array_equal(bufs["y"], (np.arange(8) + 1) % 8)


def test_grid_sync_over_a_grid_that_cannot_be_coresident() -> None:
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(neighbour_kernel(True), 8, neighbour_buffers(), coresident_limit=4)
    assert ei.value.kind == "grid_not_coresident"


def test_grid_sync_under_a_partial_mask_is_divergent() -> None:
    k = Kernel("gs_div", (Param("bar", "float32", 2, "barrier"),),
               (If(lt(BID, i(2)), (GridSync(),)),), block=32, barrier_param="bar")
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(k, 4, {"bar": np.zeros(2, np.uint32)})
    assert ei.value.kind == "divergent_barrier"


# ----------------------------------------------------------------------------------------------
# 16-bit types, atomics, integer semantics, local arrays
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,np_dtype,width", [("float16", np.float16, 8), ("bfloat16", ml_dtypes.bfloat16, 8),
                                                  ("bfloat16", ml_dtypes.bfloat16, 2)])
def test_16bit_round_trip(dtype: str, np_dtype: object, width: int) -> None:
    n = 1003
    x32 = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    x = x32.astype(np_dtype)
    grid = copy_grid(n, width)
    y = np.zeros(n, np_dtype)
    emulate_kernel(copy_kernel(n, dtype, width), grid, {"x": x, "y": y})
    assert y.dtype == np.dtype(np_dtype)
    np.testing.assert_array_equal(y.view(np.uint16), x.view(np.uint16))  # bit-exact
    # float32 arithmetic, rounded to nearest even on store
    y3 = np.zeros(n, np_dtype)
    emulate_kernel(copy_kernel(n, dtype, width, scale=3.1), grid, {"x": x, "y": y3})
    expect = (x.astype(np.float32) * np.float32(3.1)).astype(np_dtype)
    np.testing.assert_array_equal(y3.view(np.uint16), expect.view(np.uint16))


def test_atomic_add_histogram() -> None:
    n, bins = 1000, 7
    x = np.random.default_rng(4).standard_normal(n).astype(np.float32)
    k = Kernel("hist", (Param("x", "float32", n, "input"), Param("acc", "float32", bins, "scratch")),
               (AtomicAdd("acc", Bin("%", GID, i(bins)), Load("x", GID, lt(GID, i(n))), lt(GID, i(n))),),
               block=128)
    buffers = (BufferSpec("bx", "float32", n, "input", "x"),
               BufferSpec("bacc", "float32", bins, "scratch", zero_init=True))
    prog = single_program(k, -(-n // 128), buffers)
    # expose the scratch as an output to read it back
    prog = Program(prog.kernels, (buffers[0], BufferSpec("bacc", "float32", bins, "scratch", "acc", True)),
                   prog.launches, prog.profile)
    acc = np.zeros(bins, np.float32)
    emulate_kernel(k, -(-n // 128), {"x": x, "acc": acc})
    expect = np.bincount(np.arange(n) % bins, weights=x.astype(np.float64), minlength=bins)
    np.testing.assert_allclose(acc, expect, rtol=1e-5, atol=1e-5)
    assert emulate_program(prog, {"x": x}) == {}  # no output-role buffer, nothing returned


def test_atomic_then_plain_read_by_another_block_races() -> None:
    k = Kernel("atomic_race", (Param("acc", "float32", 1, "scratch"), Param("y", "float32", 4, "output")),
               (If(Bin("==", TID, i(0)), (AtomicAdd("acc", i(0), f(1.0)), StoreVec("y", BID, (Load("acc", i(0)),)))),),
               block=32)
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(k, 4, {"acc": np.zeros(1, np.float32), "y": np.zeros(4, np.float32)})
    assert ei.value.kind == "global_race"


def _shared_histogram(barriers: bool) -> Kernel:
    """Each block zeroes a shared histogram, its threads add x into bin tid % 3 atomically, thread b < 3
    stores bin b (the block-private copy of :mod:`stitchtune.lower.scatter_private`, small)."""
    bar = (Barrier(),) if barriers else ()
    body = (If(lt(TID, i(3)), (StoreVec("h", TID, (f(0.0),)),)), *bar,
            AtomicAdd("h", Bin("%", TID, i(3)), Load("x", GID)), *bar,
            If(lt(TID, i(3)), (StoreVec("y", add(Bin("*", BID, i(3)), TID), (Load("h", TID),)),)))
    return Kernel("shist", (Param("x", "float32", 128, "input"), Param("y", "float32", 6, "output")), body,
                  block=64, shared=(SharedBuf("h", 3),))


def test_shared_atomic_adds_of_a_block_meet_and_races_around_them_are_faults() -> None:
    x = np.random.default_rng(5).standard_normal(128).astype(np.float32)
    y = np.zeros(6, np.float32)
    emulate_kernel(_shared_histogram(True), 2, {"x": x, "y": y})
    expect = [x[b * 64:(b + 1) * 64][np.arange(64) % 3 == j].sum(dtype=np.float64) for b in range(2) for j in range(3)]
    np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-5)
    with pytest.raises(EmulatorFault) as ei:   # the adds race with the zeroing (and the read with the adds)
        emulate_kernel(_shared_histogram(False), 2, {"x": x, "y": y})
    assert ei.value.kind == "shared_race"


def test_integer_semantics_are_c() -> None:
    """Truncating division / remainder, int->float promotion, short-circuit &&, Select."""
    a, b, c, d = Var("a", I32), Var("b", I32), Var("c"), Var("d", BOOL)
    k = Kernel("ints", (Param("y", "float32", 5 * 32, "output"), Param("x", "float32", 4, "input")),
               (Assign(a, Bin("-", TID, i(16))),
                Assign(b, Bin("/", a, i(5))),
                Assign(c, add(Bin("%", a, i(5)), f(0.5))),  # int % then promoted to float
                # && short-circuits: the load of x[tid] only happens where tid < 4
                Assign(d, Bin("&&", lt(TID, i(4)), Bin(">", Load("x", TID), f(0.0)))),
                StoreVec("y", TID, (Cast(b, "f32"),)),
                StoreVec("y", add(TID, i(32)), (c,)),
                StoreVec("y", add(TID, i(64)), (Select(d, f(1.0), f(-1.0)),)),
                StoreVec("y", add(TID, i(96)), (Cast(Cast(mul(c, f(-1.0)), "i32"), "f32"),)),
                StoreVec("y", add(TID, i(128)), (Cast(Bin(">>", Bin("<<", TID, i(3)), i(1)), "f32"),))),
               block=32)
    y = np.zeros(160, np.float32)
    emulate_kernel(k, 1, {"y": y, "x": np.array([1, -1, 2, -2], np.float32)})
    av = np.arange(32) - 16
    np.testing.assert_array_equal(y[:32], np.trunc(av / 5))
    np.testing.assert_array_equal(y[32:64], np.fmod(av, 5) + 0.5)
    np.testing.assert_array_equal(y[64:68], [1, -1, 1, -1])
    np.testing.assert_array_equal(y[68:96], -1)
    np.testing.assert_array_equal(y[96:128], np.trunc(-(np.fmod(av, 5) + 0.5)))
    np.testing.assert_array_equal(y[128:], (np.arange(32) << 3) >> 1)


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(-10**6, 10**6), st.integers(-1000, 1000).filter(bool)),
                min_size=1, max_size=32))
def test_integer_division_matches_c(pairs: list[tuple[int, int]]) -> None:
    """Per-thread operands loaded as floats, cast to i32: / and % truncate toward zero like C."""
    a, b = Var("a", I32), Var("b", I32)
    n = len(pairs)
    k = Kernel("cdiv", (Param("x", "float32", 2 * n, "input"), Param("y", "float32", 2 * n, "output")),
               (If(lt(TID, i(n)), (Assign(a, Cast(Load("x", TID), I32)),
                                   Assign(b, Cast(Load("x", add(TID, i(n))), I32)),
                                   StoreVec("y", TID, (Cast(Bin("/", a, b), "f32"),)),
                                   StoreVec("y", add(TID, i(n)), (Cast(Bin("%", a, b), "f32"),)))),),
               block=32)
    x = np.array([p[0] for p in pairs] + [p[1] for p in pairs], np.float32)
    y = np.zeros(2 * n, np.float32)
    emulate_kernel(k, 1, {"x": x, "y": y})
    q = [_c_div(p, d) for p, d in pairs]
    np.testing.assert_array_equal(y[:n], np.array(q, np.float32))
    np.testing.assert_array_equal(y[n:], np.array([p - d * qq for (p, d), qq in zip(pairs, q)], np.float32))


def test_select_only_loads_the_chosen_operand() -> None:
    """``c ? x[i] : 0`` must not touch x[i] where c is false (C evaluates one operand)."""
    n = 40
    k = Kernel("sel", (Param("x", "float32", n, "input"), Param("y", "float32", 64, "output")),
               (StoreVec("y", TID, (Select(lt(TID, i(n)), Load("x", TID), f(-1.0)),)),), block=64)
    y = np.zeros(64, np.float32)
    emulate_kernel(k, 1, {"x": np.arange(n, dtype=np.float32), "y": y})
    np.testing.assert_array_equal(y, np.r_[np.arange(n), -np.ones(64 - n)])


def test_two_blocks_writing_one_element_race() -> None:
    k = Kernel("ww", (Param("y", "float32", 4, "output"),),
               (StoreVec("y", Bin("/", BID, i(2)), (f(1.0),)),), block=32)
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(k, 4, {"y": np.zeros(4, np.float32)})
    assert ei.value.kind == "global_race"
    assert "y[0]" in str(ei.value)


@pytest.mark.parametrize("index,fault", [
    (Bin("-", i(63), GID), None),                      # distinct, descending: no fault
    (GID, None),                                       # distinct, increasing (the fast path): no fault
    (Bin("/", GID, i(2)), "global_race"),               # two threads of a block on each element
    (Select(Bin("==", TID, i(31)), Bin("-", GID, i(1)), GID), "global_race"),  # increasing but one repeat
])
def test_two_threads_of_a_block_storing_one_element_race(index: kir.Expr, fault: str | None) -> None:
    """One store statement in which two threads write one global element is a race (the lost update),
    whether or not the elements are in increasing order; distinct elements in any order are not."""
    k = Kernel("ws", (Param("y", "float32", 64, "output"),), (StoreVec("y", index, (Cast(GID, kir.F32),)),),
               block=32)
    y = np.zeros(64, np.float32)
    if fault is None:
        emulate_kernel(k, 2, {"y": y})
        assert sorted(y.tolist()) == list(range(64))
        return
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(k, 2, {"y": y})
    assert ei.value.kind == fault
    assert "by two threads in one store" in str(ei.value)


@pytest.mark.parametrize("pair", [False, True])
def test_two_threads_storing_one_shared_element_race(pair: bool) -> None:
    """Shared memory: distinct elements per thread are fine; two threads on one element race, also
    within one store statement."""
    idx = Bin("/", TID, i(2)) if pair else TID
    k = Kernel("ss", (Param("y", "float32", 32, "output"),),
               (StoreVec("s", idx, (f(1.0),)), Barrier(), StoreVec("y", TID, (Load("s", idx),))),
               block=32, shared=(SharedBuf("s", 32),))
    y = np.zeros(32, np.float32)
    if not pair:
        emulate_kernel(k, 1, {"y": y})
        assert (y == 1).all()
        return
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(k, 1, {"y": y})
    assert ei.value.kind == "shared_race"


def test_local_array_registers() -> None:
    """Vertical packing: each thread keeps 4 values in a local array and writes them reversed."""
    n = 512
    k_ = Var("k", I32)
    k = Kernel("local", (Param("x", "float32", n, "input"), Param("y", "float32", n, "output")),
               (For(k_, i(0), i(4), 1, (SetLocal("r", k_, Load("x", add(mul(GID, i(4)), k_))),), unroll=True),
                For(k_, i(0), i(4), 1, (StoreVec("y", add(mul(GID, i(4)), k_),
                                                 (LocalRef("r", Bin("-", i(3), k_)),)),), unroll=True),
                StoreVec("y", mul(GID, i(4)), (LocalRef("r", i(3)),))),
               block=128, locals=(LocalArray("r", 4),))
    x = np.arange(n, dtype=np.float32)
    y = np.zeros(n, np.float32)
    emulate_kernel(k, 1, {"x": x, "y": y})
    np.testing.assert_array_equal(y, x.reshape(-1, 4)[:, ::-1].ravel())
    bad = Kernel("local_oob", k.params, (SetLocal("r", add(TID, i(0)), f(1.0)),), block=128,
                 locals=(LocalArray("r", 4),))
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(bad, 1, {"x": x, "y": y})
    assert ei.value.kind == "out_of_bounds"


def test_local_array_reads_by_a_lane_index_are_checked_for_active_lanes_only() -> None:
    """A dynamic-index read of a local array: in range, each thread reads its own row; an index out of
    range in a lane the branch leaves inactive is no fault; in an active lane it names lane and element."""
    k_ = Var("k", I32)
    fill = For(k_, i(0), i(4), 1, (SetLocal("r", k_, Cast(add(mul(TID, i(4)), k_), kir.F32)),))
    idx = Select(lt(TID, i(16)), Bin("%", TID, i(4)), i(99))  # 99 (outside) for threads 16..31

    def kernel(cond: kir.Expr) -> Kernel:
        return Kernel("lref", (Param("y", "float32", 32, "output"),),
                      (fill, If(cond, (StoreVec("y", TID, (LocalRef("r", idx),)),))),
                      block=32, locals=(LocalArray("r", 4),))

    y = np.full(32, -1, np.float32)
    emulate_kernel(kernel(lt(TID, i(16))), 1, {"y": y}, written={"y": np.zeros(32, bool)})
    t = np.arange(16)
    np.testing.assert_array_equal(y[:16], t * 4 + t % 4)
    assert (y[16:] == -1).all()
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(kernel(lt(TID, i(32))), 1, {"y": y})
    assert ei.value.kind == "out_of_bounds"
    assert "read of local array r[99] (size 4)" in str(ei.value) and "thread 16 " in str(ei.value)


def test_mathop_uses_the_op_table() -> None:
    from stitchtune.graph import ops
    from stitchtune.ir.kir import MathOp

    name = "exp" if "exp" in ops.OPS else next(n for n, o in ops.OPS.items() if o.arity == 1 and o.kind == "unary")
    n = 64
    k = Kernel("mop", (Param("x", "float32", n, "input"), Param("y", "float32", n, "output")),
               (StoreVec("y", TID, (MathOp(name, (Load("x", TID),)),)),), block=64)
    x = np.linspace(-2, 2, n, dtype=np.float32)
    y = np.zeros(n, np.float32)
    emulate_kernel(k, 1, {"x": x, "y": y})
    np.testing.assert_allclose(y, ops.OPS[name].np_fn(x.astype(np.float64)), rtol=1e-6, atol=1e-7)


def test_program_checks_launch_arguments() -> None:
    k = copy_kernel(16)
    prog = Program((k,), (BufferSpec("bx", "float32", 16, "input", "x"),
                          BufferSpec("by", "float32", 16, "output", "y")),
                   (Launch("copy", 1, 128, 0, ("bx",)),), ProgramProfile((), 0))
    with pytest.raises(ValueError):
        emulate_program(prog, {"x": np.zeros(16, np.float32)})
    # too little dynamic shared memory for the kernel's shared buffers overflows on the GPU
    k = block_reduce_kernel(2, 300)
    bufs = (BufferSpec("bx", "float32", 600, "input", "x"), BufferSpec("by", "float32", 2, "output", "y"))
    prog = Program((k,), bufs, (Launch(k.name, 2, k.block, k.smem_bytes - 4, ("bx", "by")),), ProgramProfile((), 0))
    with pytest.raises(EmulatorFault) as ei:
        emulate_program(prog, {"x": np.zeros(600, np.float32)})
    assert ei.value.kind == "out_of_bounds"


# ----------------------------------------------------------------------------------------------
# a 256 x 1024 float32 row reduction, two ways (no time is asserted: unit tests are not timed; the
# emulator's speed shows in the suite's --durations)
# ----------------------------------------------------------------------------------------------


def test_a_256x1024_row_reduction_emulates_exactly() -> None:
    rows, cols = 256, 1024
    x = np.random.default_rng(5).standard_normal((rows, cols)).astype(np.float32)
    expect = x.sum(axis=1, dtype=np.float64)
    cases = {
        "256 blocks x 256 threads, shared tree": (block_reduce_kernel(rows, cols), rows),
        "8 rows/block, warp per row, float4": (warp_rowsum_kernel(rows, cols, 8, width=4), rows // 8),
    }
    for label, (k, grid) in cases.items():
        y = np.zeros(rows, np.float32)
        emulate_kernel(k, grid, {"x": x.ravel(), "y": y}, written={"y": np.zeros(rows, bool)})
        np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-4, err_msg=label)


# ----------------------------------------------------------------------------------------------
# the same hand-built kernels through render_cuda: nvcc (no GPU needed) and, on a GPU, the cuda-python worker
# ----------------------------------------------------------------------------------------------


def _io_program(kernels: tuple[Kernel, ...], launches: tuple[tuple[str, int], ...],
                inputs: dict[str, np.ndarray], outputs: dict[str, tuple[str, int]],
                extra: tuple[BufferSpec, ...] = ()) -> Program:
    """A program whose buffers are named like the kernel parameters (graph tensor = buffer name)."""
    dt = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16",
          np.dtype(ml_dtypes.bfloat16): "bfloat16"}
    bufs = [BufferSpec(n, dt[a.dtype], a.size, "input", n) for n, a in inputs.items()]
    bufs += [BufferSpec(n, d, size, "output", n) for n, (d, size) in outputs.items()]
    bufs += list(extra)
    by_name = {k.name: k for k in kernels}
    lts = tuple(Launch(k, g, by_name[k].block, by_name[k].smem_bytes, tuple(p.name for p in by_name[k].params))
                for k, g in launches)
    return Program(kernels, tuple(bufs), lts, ProgramProfile((), 0))


def device_cases() -> dict[str, tuple[Program, dict[str, np.ndarray]]]:
    """Correct hand-built programs and their inputs (each runs repeatedly with the same result)."""
    rng = np.random.default_rng(7)
    cases: dict[str, tuple[Program, dict[str, np.ndarray]]] = {}
    for n in (1000, 1023):
        x = {"x": rng.standard_normal(n).astype(np.float32)}
        cases[f"copy_f32_{n}"] = (_io_program((copy_kernel(n),), (("copy", copy_grid(n)),), x,
                                              {"y": ("float32", n)}), x)
    for dtype, npd, w, sc in (("float16", np.float16, 8, None), ("bfloat16", ml_dtypes.bfloat16, 8, None),
                              ("bfloat16", ml_dtypes.bfloat16, 2, 3.1)):
        n = 1003
        x = {"x": rng.standard_normal(n).astype(npd)}
        cases[f"copy_{dtype}_v{w}_{sc}"] = (_io_program((copy_kernel(n, dtype, w, scale=sc),),
                                                        (("copy", copy_grid(n, w)),), x, {"y": (dtype, n)}), x)
    x = {"x": rng.standard_normal(37 * 100).astype(np.float32)}
    cases["warp_rowsum"] = (_io_program((warp_rowsum_kernel(37, 100),), (("warp_rowsum", 10),), x,
                                        {"y": ("float32", 37)}), x)
    x = {"x": rng.standard_normal(256 * 1024).astype(np.float32)}
    cases["warp_rowsum_float4"] = (_io_program((warp_rowsum_kernel(256, 1024, 8, 4),), (("warp_rowsum", 32),),
                                               x, {"y": ("float32", 256)}), x)
    x = {"x": rng.standard_normal(6 * 1000).astype(np.float32)}
    cases["block_reduce"] = (_io_program((block_reduce_kernel(6, 1000),), (("block_reduce", 6),), x,
                                         {"y": ("float32", 6)}), x)
    cases["grid_sync"] = (_io_program((neighbour_kernel(True),), (("neighbour", 8),), {}, {"y": ("float32", 8)},
                                      (BufferSpec("s", "float32", 8, "scratch", zero_init=True),
                                       BufferSpec("bar", "float32", 2, "barrier", zero_init=True))), {})
    n, bins = 1000, 7
    zero = Kernel("zero", (Param("acc", "float32", bins, "output"),),
                  (StoreVec("acc", TID, (f(0.0),), lt(TID, i(bins))),), block=32)
    hist = Kernel("hist", (Param("x", "float32", n, "input"), Param("acc", "float32", bins, "output")),
                  (AtomicAdd("acc", Bin("%", GID, i(bins)), Load("x", GID, lt(GID, i(n))), lt(GID, i(n))),),
                  block=128)
    x = {"x": rng.standard_normal(n).astype(np.float32)}
    cases["atomic_hist"] = (_io_program((zero, hist), (("zero", 1), ("hist", 8)), x, {"acc": ("float32", bins)}), x)
    v = Var("v")
    seg = Kernel("seg", (Param("y", "float32", 32, "output"),),
                 (Assign(v, Cast(TID, "f32")), Assign(v, Shfl(v, 4, width=8)), StoreVec("y", TID, (v,))), block=32)
    cases["shfl_width"] = (_io_program((seg,), (("seg", 1),), {}, {"y": ("float32", 32)}), {})
    nx = 40
    sel = Kernel("sel", (Param("x", "float32", nx, "input"), Param("y", "float32", 64, "output")),
                 (StoreVec("y", TID, (Select(lt(TID, i(nx)), Load("x", TID), f(-1.0)),)),), block=64)
    x = {"x": rng.standard_normal(nx).astype(np.float32)}
    cases["select"] = (_io_program((sel,), (("sel", 1),), x, {"y": ("float32", 64)}), x)
    return cases


@pytest.mark.parametrize("name", sorted(device_cases()))
def test_device_cases_emulate_cleanly(name: str) -> None:
    program, inputs = device_cases()[name]
    out = emulate_program(program, inputs)
    for b in program.buffers:
        if b.role == "output":
            assert np.isfinite(out[b.tensor].astype(np.float32)).all(), f"{name}: {b.tensor} not fully written"


@pytest.mark.slow
def test_device_cases_compile_with_nvcc(tmp_path: Path) -> None:
    """Every hand-built program compiles for sm_90 (one nvcc call for all of them) with sane registers."""
    from helpers.nvcc import compile_programs_sm90

    cases = device_cases()
    registers = compile_programs_sm90([p for p, _ in cases.values()], tmp_path)
    for name, regs in zip(cases, registers):
        assert regs and all(v >= 1 for v in regs.values()), f"{name}: {regs}"


@pytest.mark.gpu
def test_gpu_agrees_with_emulator(tmp_path: Path) -> None:
    """Each hand-built program on the GPU (cuda-python) must reproduce the emulator's outputs."""
    from stitchtune.gpu.build import NvccBuilder
    from stitchtune.gpu.runner import CudaRunner, cuda_available
    from stitchtune.gpu.render import render

    if not cuda_available():
        pytest.skip("no CUDA GPU / cuda-python")
    cases = device_cases()
    builds = NvccBuilder(jobs=2, cache_dir=tmp_path).build([render(p) for p, _ in cases.values()], "sm_90")
    failures = []
    for (name, (program, inputs)), build in zip(cases.items(), builds):
        assert build.status == "ok", f"{name}: {build.error}"
        expected = {k: v.astype(np.float64) for k, v in emulate_program(program, inputs).items()}
        in_dt = {b.tensor: b.dtype for b in program.buffers if b.role == "input"}
        out_dt = {b.tensor: b.dtype for b in program.buffers if b.role == "output"}
        with CudaRunner.for_arrays(inputs, in_dt, expected, out_dt, repeats=2, warmup=1, timeout_s=30) as runner:
            m = runner.run([(program, build)])[0]
        print(f"{name}: {m.status} max_rel_error={m.max_rel_error} median_us={m.median_us} {m.error}")
        if m.status != "ok" or m.max_rel_error is None or m.max_rel_error > 1e-6:
            failures.append(f"{name}: {m.status} {m.max_rel_error} {m.error}")
    assert not failures, failures


# ----------------------------------------------------------------------------------------------
# mutation check on real lowered programs: a missing barrier must be caught
# ----------------------------------------------------------------------------------------------


def _strip(stmts: tuple, kind: type) -> tuple:
    out = []
    for s in stmts:
        if isinstance(s, kind):
            continue
        if isinstance(s, kir.For):
            s = dataclasses.replace(s, body=_strip(s.body, kind))
        elif isinstance(s, kir.If):
            s = dataclasses.replace(s, then=_strip(s.then, kind), orelse=_strip(s.orelse, kind))
        out.append(s)
    return tuple(out)


def test_removing_barriers_from_lowered_programs_is_caught(load_example: Callable[[str], Any]) -> None:
    """Sampled schedules that use __syncthreads / grid sync: without them the emulator must report a
    shared / global race (the lowered program is otherwise clean)."""
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.graph.reference import random_inputs
    from stitchtune.space import SearchSpace

    dev = get_device("H200")
    found = {kir.Barrier: 0, kir.GridSync: 0}
    for name in ("layernorm_small", "softmax_small", "colsum_sigmoid_scale_small"):
        g = load_example(name)
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, dev)
        inputs = random_inputs(g, 0)
        rng = random.Random(11)
        for _ in range(30):
            prog = lower(g, plan, space.sample(rng), dev, space)
            kinds = [kd for kd in found if found[kd] < 2 and
                     any(isinstance(st, kd) for k in prog.kernels for st in kir.walk(k.body))]
            if not kinds:
                continue
            emulate_program(prog, inputs)  # the program as lowered runs cleanly
            for kd in kinds:
                mutant = dataclasses.replace(prog, kernels=tuple(dataclasses.replace(k, body=_strip(k.body, kd))
                                                                 for k in prog.kernels))
                with pytest.raises(EmulatorFault) as ei:
                    emulate_program(mutant, inputs)
                assert ei.value.kind == ("shared_race" if kd is kir.Barrier else "global_race"), str(ei.value)
                found[kd] += 1
    print(f"mutants caught: {found[kir.Barrier]} without __syncthreads, {found[kir.GridSync]} without grid sync")
    assert found[kir.Barrier] >= 1 and found[kir.GridSync] >= 1, found
