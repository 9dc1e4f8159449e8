"""The emulator's block order (``block_order_seed``): float atomic adds applied in a seeded order of
the blocks, so that order-dependent results differ across seeds; and a same-statement write of one
global element by two threads flagged as a race."""

from __future__ import annotations

import numpy as np
import pytest

from stitchtune.emulate.emulator import EmulatorFault, emulate_kernel
from stitchtune.ir.kir import I32, AtomicAdd, Bin, Const, Kernel, Load, Param, Special, StoreVec

TID, BID = Special("tid"), Special("bid")
GID = Bin("+", Bin("*", BID, Const(32, I32)), TID)


def _sum_kernel(n: int) -> Kernel:
    """Every thread adds its element to acc[0] atomically (one block = 32 threads)."""
    return Kernel("asum", (Param("x", "float32", n, "input"), Param("acc", "float32", 1, "output")),
                  (AtomicAdd("acc", Const(0, I32), Load("x", GID)),), block=32)


def _run(n: int, seed: int | None) -> np.float32:
    x = (np.random.default_rng(0).standard_normal(n) * np.logspace(-4, 4, n)).astype(np.float32)
    acc = np.zeros(1, np.float32)
    emulate_kernel(_sum_kernel(n), n // 32, {"x": x, "acc": acc}, block_order_seed=seed)
    return acc[0]


def test_atomic_sums_depend_on_the_seeded_block_order() -> None:
    n = 32 * 64
    exact = float(np.sum((np.random.default_rng(0).standard_normal(n) * np.logspace(-4, 4, n)).astype(np.float64)))
    sums = {_run(n, seed).tobytes() for seed in range(6)}
    assert len(sums) > 1  # float addition in another order gives other bits
    for seed in range(6):
        assert abs(float(_run(n, seed)) - exact) <= 1e-5 * np.sum(np.abs(np.logspace(-4, 4, n))) * 10
    assert _run(n, 3).tobytes() == _run(n, 3).tobytes()  # one seed is one order


def test_two_threads_storing_one_global_element_race() -> None:
    k = Kernel("lost", (Param("y", "float32", 4, "output"),), (StoreVec("y", Const(1, I32), (TID,)),), block=32)
    with pytest.raises(EmulatorFault) as ei:
        emulate_kernel(k, 1, {"y": np.zeros(4, np.float32)})
    assert ei.value.kind == "global_race" and "two threads" in str(ei.value)


def test_distinct_elements_in_one_store_do_not_race() -> None:
    y = np.zeros(64, np.float32)
    k = Kernel("ok", (Param("y", "float32", 64, "output"),), (StoreVec("y", GID, (Const(1.0),)),), block=32)
    emulate_kernel(k, 2, {"y": y})
    assert (y == 1).all()
