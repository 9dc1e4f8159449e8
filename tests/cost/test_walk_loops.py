"""The IR walk's loop rules (stitchtune.cost.walk_loops). (1) What nvcc unrolls of a rolled loop: a rolled
accumulation loop whose loads do not wait on an earlier iteration's keeps several iterations' loads in flight
(sm_90 SASS: 16 x 4 B, 4 x 16 B), where the shipped walk counts one (the rule is off as shipped: UNROLL_ROLLED;
these tests turn it on). (2) A block's task loop (task_trips) and the fitted model's reuse window in waves of tasks
(Coefficients.reuse_tasks, 0 as shipped). Expected figures are the rules', checked against SASS in
results/cost-fit-2026-12-07-s14-unroll/README.md."""

from __future__ import annotations

import pytest

from stitchtune.cost.features import KernelFeatures, kernel_features
import dataclasses

from stitchtune.cost import walk_loops
from stitchtune.cost.fitted import Coefficients, kernel_terms_us
from stitchtune.cost.walk_loops import UNROLL_BYTES, rolled_unroll, static_expr, task_trips
from stitchtune.hardware.device import get_device
from stitchtune.ir import kir
from stitchtune.ir.kir import Assign, Barrier, Bin, Cast, Const, Extent, For, Kernel, Load, LoadVec, Param, Special, StoreVec, Var

H200 = get_device("h200")
TID = Special("tid")
I32 = kir.I32
N = 256


@pytest.fixture
def unrolling(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk with nvcc's unrolling of rolled loops (off as shipped)."""
    monkeypatch.setattr(walk_loops, "UNROLL_ROLLED", True)


def feats(body: tuple[kir.Stmt, ...], parts: int = 96) -> KernelFeatures:
    ps = (Param("in0", "float32", parts * N * 4, "input"), Param("out0", "float32", N * 4, "output"))
    k = Kernel("k", ps, body, 32, ())
    return kernel_features(k, 1, H200, registers=32, extents={"P": parts})


def column_sum(stop: kir.Expr, unroll_by: int = 0, body_extra: tuple[kir.Stmt, ...] = ()) -> tuple[kir.Stmt, ...]:
    """``acc += in0[p x N + tid]`` for ``p < stop`` (st_xsum's rolled partial-sum loop)."""
    p, acc = Var("p", I32), Var("acc")
    body = (Assign(acc, Bin("+", acc, Load("in0", Bin("+", Bin("*", p, Const(N, I32)), TID)))),) + body_extra
    return (Assign(acc, Const(0.0, kir.F32)), For(p, Const(0, I32), stop, 1, body, unroll_by=unroll_by),
            StoreVec("out0", TID, (acc,)))


def test_as_shipped_a_rolled_loop_keeps_one_iteration_in_flight() -> None:
    assert not walk_loops.UNROLL_ROLLED
    f = feats(column_sum(Const(96, I32)))
    assert f.loads_in_flight == pytest.approx(1.0)
    assert f.load_rounds == pytest.approx(96.0)


def test_a_rolled_sum_of_independent_loads_keeps_16_in_flight(unrolling: None) -> None:
    f = feats(column_sum(Const(96, I32)))
    assert f.loads_in_flight == pytest.approx(16.0)            # the old walk: 1 (SASS of a 96-trip loop: 22-23)
    assert f.bytes_in_flight_per_thread == pytest.approx(64.0)
    assert f.load_rounds == pytest.approx(96 / 16)


def test_a_runtime_trip_count_unrolls_the_same_and_short_runtime_loops_do_not(unrolling: None) -> None:
    assert feats(column_sum(Extent("P"))).loads_in_flight == pytest.approx(16.0)
    assert feats(column_sum(Extent("P")), parts=3).loads_in_flight == pytest.approx(1.0)   # nvcc's remainder loop
    assert feats(column_sum(Const(3, I32)), parts=3).loads_in_flight == pytest.approx(3.0)  # unrolled whole


def test_pragma_unroll_by_bounds_the_iterations(unrolling: None) -> None:
    f = feats(column_sum(Const(96, I32), unroll_by=4))
    assert f.loads_in_flight == pytest.approx(4.0)              # SASS of `#pragma unroll 4`: 4 loads
    assert f.load_rounds == pytest.approx(24.0)


def test_vector_loads_unroll_to_the_same_bytes(unrolling: None) -> None:
    p, v = Var("p", I32), tuple(Var(f"v{j}") for j in range(4))
    body = (LoadVec(v, "in0", Bin("*", Bin("+", Bin("*", p, Const(N, I32)), TID), Const(4, I32))),
            StoreVec("out0", Bin("*", TID, Const(4, I32)), v))
    f = feats((For(p, Const(0, I32), Const(96, I32), 1, body),))
    assert f.loads_in_flight == pytest.approx(4.0)              # SASS: 4 x LDG.128
    assert f.bytes_in_flight_per_thread == pytest.approx(UNROLL_BYTES)


def test_a_load_whose_address_reads_the_previous_iterations_load_is_not_unrolled(unrolling: None) -> None:
    p, c = Var("p", I32), Var("c", I32)
    body = (Assign(c, Cast(Load("in0", Bin("+", Bin("*", p, Const(0, I32)), c)), I32)),)
    f = feats((Assign(c, TID), For(p, Const(0, I32), Const(96, I32), 1, body), StoreVec("out0", TID, (Cast(c, kir.F32),))))
    assert f.loads_in_flight == pytest.approx(1.0)              # a pointer chase: SASS 1
    assert f.load_rounds == pytest.approx(96.0)


def test_a_barrier_in_the_body_keeps_one_iteration_per_group(unrolling: None) -> None:
    f = feats(column_sum(Const(96, I32), body_extra=(Barrier(),)))
    assert f.loads_in_flight == pytest.approx(1.0)
    assert f.load_rounds == pytest.approx(96.0)


def test_the_rule_and_what_counts_as_a_compile_time_bound() -> None:
    loop = For(Var("p", I32), Const(0, I32), Const(96, I32), 1, ())
    assert rolled_unroll(loop, 96, 4.0, True) == 16
    assert rolled_unroll(loop, 96, 8.0, True) == 8
    assert rolled_unroll(loop, 96, 128.0, True) == 1
    assert rolled_unroll(loop, 2, 4.0, False) == 1
    x = Var("x", I32)
    assert static_expr(Bin("*", x, Const(2, I32)), {"x": Const(3, I32)})
    assert not static_expr(Bin("*", x, Const(2, I32)), {"x": TID})
    assert not static_expr(Extent("P"), {})


def _guarded_sums() -> tuple[KernelFeatures, KernelFeatures]:
    """``if (guard) { t = in0[...] }; acc += t`` and ``acc += guard ? in0[...] : 0`` over 96 rows."""
    p, acc, t = Var("p", I32), Var("acc"), Var("t")
    r = Bin("+", Bin("*", p, Const(N, I32)), TID)
    guard = Bin("<", TID, Const(16, I32))
    body = (LoadVec((t,), "in0", r, guard), Assign(acc, Bin("+", acc, t)))
    vec = feats((Assign(acc, Const(0.0, kir.F32)), For(p, Const(0, I32), Const(96, I32), 1, body),
                 StoreVec("out0", TID, (acc,))))
    scalar = (Assign(acc, Bin("+", acc, Load("in0", r, guard))),)
    sel = feats((Assign(acc, Const(0.0, kir.F32)), For(p, Const(0, I32), Const(96, I32), 1, scalar),
                 StoreVec("out0", TID, (acc,))))
    return vec, sel


@pytest.mark.parametrize("wait", [False, True])
def test_as_shipped_the_guard_rule_moves_nothing(wait: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """GUARDED_LOADS_WAIT is read only while UNROLL_ROLLED (off as shipped): the features the fitted model was
    fitted on and predicts with are the same either way (the fit's scores do not move)."""
    monkeypatch.setattr(walk_loops, "GUARDED_LOADS_WAIT", wait)
    vec, sel = _guarded_sums()
    assert vec.loads_in_flight == pytest.approx(1.0) == sel.loads_in_flight
    assert vec.load_rounds == pytest.approx(96.0)


def test_a_guarded_vector_load_unrolls_as_todays_renderer_emits_it(unrolling: None) -> None:
    """Since CODEGEN_VERSION 5 a guarded vector load in a loop renders into fresh zeroed registers
    (gpu/render_guarded.py): nothing carries over, nvcc overlaps the iterations as for a guarded scalar load
    (results/walk-guarded-2026-12-07-s15: SASS of today's kernels)."""
    assert not walk_loops.GUARDED_LOADS_WAIT
    vec, sel = _guarded_sums()
    assert vec.loads_in_flight == pytest.approx(16.0) == sel.loads_in_flight
    assert vec.load_rounds == pytest.approx(96 / 16)


def test_a_guarded_vector_load_waited_as_code_generator_4_rendered_it(unrolling: None,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``if (guard) { t = in0[...] }`` as versions <= 4 rendered it: where the guard is false t kept the previous
    iteration's value, so nvcc copied that loaded value into the next load's destination first (sm_90 SASS of BERT
    training's region_view_56 combine loop as measured: ``MOV R20, R12`` before each ``@P0 LDG.E.128``): one load in
    flight. The cost fit's measured kernels were rendered so (a dataset rebuilt from them sets the flag). A guarded
    scalar load (``guard ? in0[...] : 0``) had no such wait."""
    monkeypatch.setattr(walk_loops, "GUARDED_LOADS_WAIT", True)
    vec, sel = _guarded_sums()
    assert vec.loads_in_flight == pytest.approx(1.0)
    assert vec.load_rounds == pytest.approx(96.0)
    assert sel.loads_in_flight == pytest.approx(16.0)


def tasks_kernel(tasks: int, split: bool = False) -> KernelFeatures:
    """A block's ``tasks`` tasks, each reading its 32 x 4 floats twice (two sweeps): the re-read lies within the
    task. ``split``: the two sweeps as two top-level loops (no one task loop)."""
    t, j, a, b = Var("t", I32), Var("j", I32), Var("a"), Var("b")

    def at(k: kir.Expr) -> kir.Expr:
        return Bin("+", Bin("*", Bin("+", Bin("*", t, Const(4, I32)), k), Const(32, I32)), TID)

    sweep1 = For(j, Const(0, I32), Const(4, I32), 1, (Assign(a, Bin("+", a, Load("in0", at(j)))),))
    sweep2 = For(j, Const(0, I32), Const(4, I32), 1, (Assign(b, Load("in0", at(j))),
                                                      StoreVec("out0", at(j), (Bin("*", a, b),))))
    ps = (Param("in0", "float32", tasks * 4 * 32, "input"), Param("out0", "float32", tasks * 4 * 32, "output"))
    if split:
        body: tuple[kir.Stmt, ...] = (For(t, Const(0, I32), Const(tasks, I32), 1, (sweep1,)),
                                      For(t, Const(0, I32), Const(tasks, I32), 1, (sweep2,)))
    else:
        body = (For(t, Const(0, I32), Const(tasks, I32), 1, (Assign(a, Const(0.0, kir.F32)), sweep1, sweep2)),)
    return kernel_features(Kernel("k", ps, body, 32, ()), 1, H200, registers=32)


def test_task_trips_is_the_trip_count_of_the_loop_that_holds_every_access() -> None:
    assert tasks_kernel(8).task_trips == pytest.approx(8.0)
    assert tasks_kernel(8, split=True).task_trips == pytest.approx(1.0)     # two top-level loops: no task loop
    assert task_trips([(8.0, 3), (2.0, 1)], 4) == 1.0
    assert task_trips([(8.0, 4)], 4) == 8.0


def test_the_reuse_window_in_waves_of_tasks_hits_the_l2_more() -> None:
    """A persistent grid (one wave, 64 tasks a block) re-reading 2 GB within each task: in waves of blocks its
    window is the whole tensor (the re-read misses the L2), in waves of tasks one task's share (it hits)."""
    f = dataclasses.replace(tasks_kernel(8), grid=132, blocks_per_sm=1, waves=1.0, task_trips=64.0,
                            unique_bytes=2 << 30, sector_bytes=2 * (2 << 30), requested_bytes=2 * (2 << 30))
    c = Coefficients.defaults(H200)
    blocks = kernel_terms_us(f, H200, c)["memory"]
    tasks = kernel_terms_us(f, H200, dataclasses.replace(c, reuse_tasks=1.0))["memory"]
    assert c.reuse_tasks == 0.0
    assert tasks < 0.8 * blocks
