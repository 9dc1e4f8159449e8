"""The IR walk's load groups (stitchtune.cost.ir_walk) around shared-memory stores: which global loads one
thread has in flight together. nvcc issues an iteration's global loads above its shared stores (they cannot
alias), not the next iteration's; a barrier, or a load that reads back a stored value, still ends a group."""

from __future__ import annotations

import pytest

from stitchtune.cost.features import KernelFeatures, kernel_features
from stitchtune.hardware.device import get_device
from stitchtune.ir import kir
from stitchtune.ir.kir import Assign, Barrier, Bin, Cast, Const, For, Kernel, Load, Param, SharedBuf, Special, StoreVec, Var

H200 = get_device("h200")
TID = Special("tid")
I32 = kir.I32


def at(i: kir.Expr, k: int) -> kir.Expr:
    """Element ``(i x 2 + k) x 32 + tid``: input ``k``'s word of iteration ``i``."""
    return Bin("+", Bin("*", Bin("+", Bin("*", i, Const(2, I32)), Const(k, I32)), Const(32, I32)), TID)


def feats(body: tuple[kir.Stmt, ...], n: int = 8 * 32) -> KernelFeatures:
    ps = (Param("in0", "float32", n, "input"), Param("out0", "float32", n, "output"))
    k = Kernel("k", ps, body, 32, shared=(SharedBuf("sm", n),))
    return kernel_features(k, 1, H200, registers=32)


def iteration(i: kir.Expr, sync: bool = False) -> tuple[kir.Stmt, ...]:
    """Two loads, each value stored to shared memory right after it is loaded (a row kernel's staging)."""
    a, b = Var("a"), Var("b")
    return ((Assign(a, Load("in0", at(i, 0))), StoreVec("sm", at(i, 0), (a,)))
            + ((Barrier(),) if sync else ())
            + (Assign(b, Load("in0", at(i, 1))), StoreVec("sm", at(i, 1), (b,))))


def test_a_shared_store_does_not_end_its_iterations_load_group() -> None:
    f = feats(iteration(Const(0, I32)))
    assert f.loads_in_flight == pytest.approx(2.0)      # the old walk: 1 (the store ended the group)
    assert f.bytes_in_flight_per_thread == pytest.approx(8.0)
    assert f.load_rounds == pytest.approx(1.0)


def test_a_barrier_between_still_ends_the_group() -> None:
    f = feats(iteration(Const(0, I32), sync=True))
    assert f.loads_in_flight == pytest.approx(1.0)
    assert f.load_rounds == pytest.approx(2.0)


def test_the_iterations_of_an_unrolled_staging_loop_stay_apart() -> None:
    """4 unrolled iterations: each its own group of 2 loads (sm_90 SASS of BERT training's row kernels keeps
    one iteration's loads in flight, not the loop's), where a loop without shared stores is one group."""
    i = Var("i", I32)
    staged = feats((For(i, Const(0, I32), Const(4, I32), 1, iteration(i), unroll=True),))
    assert staged.loads_in_flight == pytest.approx(2.0)
    assert staged.load_rounds == pytest.approx(4.0)
    a, b = Var("a"), Var("b")
    plain_body = (Assign(a, Load("in0", at(i, 0))), Assign(b, Load("in0", at(i, 1))),
                  StoreVec("out0", at(i, 0), (Bin("+", a, b),)))
    plain = feats((For(i, Const(0, I32), Const(4, I32), 1, plain_body, unroll=True),))
    assert plain.loads_in_flight == pytest.approx(8.0)


def test_a_load_whose_index_reads_a_stored_value_back_waits_for_the_group() -> None:
    """The stored value goes through shared memory into a later load's address: that load depends on the
    first one, so it starts a new group (a chained load)."""
    a, r, x = Var("a"), Var("r", I32), Var("x")
    body = (Assign(a, Load("in0", TID)), StoreVec("sm", TID, (a,)),
            Assign(r, Cast(Load("sm", TID), I32)),
            Assign(x, Load("in0", Bin("+", Bin("*", r, Const(0, I32)), Bin("+", TID, Const(32, I32))))),
            StoreVec("out0", TID, (x,)))
    f = feats(body)
    assert f.chained_loads == 1
    assert f.loads_in_flight == pytest.approx(1.0)
