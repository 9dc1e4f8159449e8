"""IR-derived cost features (stitchtune.cost.features) of hand-built tiny kernels, and the fitted
device-time model (stitchtune.cost.fitted). Every time here is a prediction of the model."""

from __future__ import annotations

import dataclasses
import math

import pytest

from stitchtune.cost.features import KernelFeatures, kernel_features, program_features
from stitchtune.cost.fitted import (Coefficients, coefficients_for, device_time_us, kernel_device_us, kernel_terms_us,
                                    launch_us, predict_program)
from stitchtune.hardware.device import get_device
from stitchtune.ir import kir
from stitchtune.ir.kir import (Assign, Barrier, Bin, Const, For, If, IndexLoad, Kernel, Load, LoadVec, MathOp, Param,
                               SharedBuf, Special, StoreVec, Var)

H200 = get_device("h200")
TID, BID = Special("tid"), Special("bid")
I32 = kir.I32


def gid(block: int) -> Bin:
    return Bin("+", Bin("*", BID, Const(block, I32)), TID)


def params(n: int, out_n: int | None = None) -> tuple[Param, ...]:
    return (Param("in0", "float32", n, "input"), Param("out0", "float32", out_n or n, "output"))


def feats(body: tuple[kir.Stmt, ...], n: int = 1024, block: int = 32, grid: int = 1,
          shared: tuple[SharedBuf, ...] = (), out_n: int | None = None, extra: tuple[Param, ...] = ()) -> KernelFeatures:
    k = Kernel("k", params(n, out_n) + extra, body, block, shared=shared)
    return kernel_features(k, grid, H200, registers=32)


def copy_body(store_index: kir.Expr) -> tuple[kir.Stmt, ...]:
    v = Var("v")
    return (Assign(v, Load("in0", TID)), StoreVec("out0", store_index, (v,)))


def test_contiguous_store_has_sector_factor_one() -> None:
    f = feats(copy_body(TID))
    assert f.sector_factor == pytest.approx(1.0)
    assert f.requested_bytes == 2 * 32 * 4
    assert f.active_lanes == 1.0


def test_strided_store_has_sector_factor_eight() -> None:
    # each lane stores 4 bytes into its own 32-byte sector: 8 sectors' bytes per useful sector
    f = feats(copy_body(Bin("*", TID, Const(8, I32))), out_n=8 * 32)
    per = {(b, k): sf for b, k, _, sf in f.per_access}
    assert per[("out0", "store")] == pytest.approx(8.0)
    assert per[("in0", "load")] == pytest.approx(1.0)
    assert f.sector_factor == pytest.approx((1 + 8) / 2)
    assert f.excess_sector_bytes == (32 - 4) * 32     # only the strided store's sectors beyond its ideal


def test_an_error_flag_is_not_an_atomic_but_a_scatter_add_is() -> None:
    from stitchtune.ir.kir import AtomicAdd

    r = Var("r", I32)
    flag = (Param("gerr0", "float32", 1, "scratch"),)
    body = (Assign(r, IndexLoad("ids", TID, 8)),
            AtomicAdd("gerr0", Const(0, I32), Const(1.0), Bin("<", r, Const(0, I32))),      # error flag
            AtomicAdd("out0", r, Load("in0", TID), Bin(">=", r, Const(0, I32))))             # scatter add
    f = feats(body, n=32, out_n=8, extra=flag + (Param("ids", "int32", 32, "input"),))
    assert f.atomics == 1.0


def test_vector_loads_in_an_unrolled_loop_are_in_flight_together() -> None:
    i = Var("i", I32)
    dst = tuple(Var(f"x{j}") for j in range(4))
    body = (For(i, Const(0, I32), Const(4, I32), 1, (
        LoadVec(dst, "in0", Bin("*", Bin("+", Bin("*", i, Const(32, I32)), TID), Const(4, I32))),
        StoreVec("out0", Bin("*", Bin("+", Bin("*", i, Const(32, I32)), TID), Const(4, I32)), dst)), unroll=True),)
    f = feats(body, n=4 * 32 * 4)
    assert f.loads_in_flight == pytest.approx(4.0)
    assert f.bytes_in_flight_per_thread == pytest.approx(64.0)
    assert f.chained_loads == 0


def test_a_shared_store_between_loads_serialises_them() -> None:
    """The iterations of an unrolled loop that stores each load to shared memory are groups of their own
    (tests/cost/test_load_groups.py: within one iteration a shared store does not end the group)."""
    i = Var("i", I32)
    x = Var("x")
    body = (For(i, Const(0, I32), Const(4, I32), 1, (
        Assign(x, Load("in0", Bin("+", Bin("*", i, Const(32, I32)), TID))),
        StoreVec("sm", Bin("+", Bin("*", i, Const(32, I32)), TID), (x,))), unroll=True),)
    f = feats(body, n=128, shared=(SharedBuf("sm", 128),))
    assert f.loads_in_flight == pytest.approx(1.0)
    assert f.smem_dead_bytes == 128 * 4     # stored, never loaded


def test_a_serialised_load_chain_counts_one_load_in_flight() -> None:
    # a gather: the second load's index is the first load's value
    r, x = Var("r", I32), Var("x")
    body = (Assign(r, IndexLoad("ids", TID, 1024)),
            Assign(x, Load("in0", Bin("+", Bin("*", r, Const(32, I32)), TID))),
            StoreVec("out0", TID, (x,)))
    f = feats(body, n=1024 * 32, out_n=32, extra=(Param("ids", "int32", 32, "input"),))
    assert f.chained_loads == 1
    assert f.loads_in_flight == pytest.approx(1.0)
    assert f.unknown_indexes == 1     # the gathered load's addresses are data
    # the gathered table counts at the bytes read, not its size
    assert f.unique_bytes == 32 * 4 + 32 * 4 + 32 * 4


def test_a_rolled_loop_keeps_one_iteration_in_flight() -> None:
    i, acc = Var("i", I32), Var("acc")
    body = (Assign(acc, Const(0.0)),
            For(i, Const(0, I32), Const(16, I32), 1, (
                Assign(acc, Bin("+", acc, Load("in0", Bin("+", Bin("*", i, Const(32, I32)), TID)))),)),
            StoreVec("out0", TID, (acc,)))
    f = feats(body, n=16 * 32, out_n=32)
    assert f.loads_in_flight == pytest.approx(1.0)
    assert f.requested_bytes == (16 + 1) * 32 * 4


def test_serial_rounds_leave_out_a_rolled_loop_free_of_barriers_and_shuffles() -> None:
    """A rolled loop of plain loads (nvcc unrolls it, its loads overlap) has 16 load rounds and no serial one;
    with a warp shuffle in its body (a row loop's reduction) every round is on the block's serial chain."""
    from stitchtune.ir.kir import Shfl

    i, acc = Var("i", I32), Var("acc")

    def body(reduce: bool) -> tuple[kir.Stmt, ...]:
        x = Load("in0", Bin("+", Bin("*", i, Const(32, I32)), TID))
        step = Assign(acc, Bin("+", acc, Shfl(x, 1) if reduce else x))
        return (Assign(acc, Const(0.0)), For(i, Const(0, I32), Const(16, I32), 1, (step,)), StoreVec("out0", TID, (acc,)))

    plain, chained = feats(body(False), n=16 * 32, out_n=32), feats(body(True), n=16 * 32, out_n=32)
    assert plain.load_rounds == chained.load_rounds == 16.0
    assert plain.serial_rounds == 0.0 and plain.shuffles == 0.0
    assert chained.serial_rounds == 16.0 and chained.shuffles == 16.0
    c = coefficients_for(H200)
    terms = [kernel_terms_us(f, H200, c)["chain"] for f in (plain, chained)]
    assert terms[0] < terms[1] and terms[1] >= 16 * c.round_ns / 1000.0


def test_scratch_chain_counts_shared_partials_not_a_coalesced_read() -> None:
    i, acc = Var("i", I32), Var("acc")
    part = (Param("part0", "float32", 64, "scratch"),)

    def combine(index: kir.Expr) -> KernelFeatures:
        body = (Assign(acc, Const(0.0)),
                For(i, Const(0, I32), Const(2, I32), 1, (Assign(acc, Bin("+", acc, Load("part0", index))),)),
                StoreVec("out0", TID, (acc,)))
        return feats(body, n=32, extra=part)

    assert combine(i).scratch_loads == 2                                         # every lane: the same partial
    assert combine(Bin("+", Bin("*", i, Const(32, I32)), TID)).scratch_loads == 0  # one partial per lane


def test_divisions_and_transcendentals_are_counted_per_element() -> None:
    i, x, y = Var("i", I32), Var("x"), Var("y")
    body = (For(i, Const(0, I32), Const(8, I32), 1, (
        Assign(x, Load("in0", Bin("+", Bin("*", i, Const(32, I32)), TID))),
        Assign(y, MathOp("div", (MathOp("exp", (x,)), Const(3.0)))),
        StoreVec("out0", Bin("+", Bin("*", i, Const(32, I32)), TID), (y,))), unroll=True),)
    f = feats(body, n=8 * 32)
    assert f.divisions == pytest.approx(8.0)
    assert f.transcendentals == pytest.approx(8.0)


def test_idle_lanes() -> None:
    x = Var("x")
    body = (If(Bin("<", TID, Const(16, I32)), (Assign(x, Load("in0", TID)), StoreVec("out0", TID, (x,)))),)
    f = feats(body, n=32)
    assert f.active_lanes == pytest.approx(0.5)
    assert f.requested_bytes == 2 * 16 * 4


def test_bank_conflicts_and_barriers() -> None:
    x = Var("x")
    body = (Assign(x, Load("in0", TID)),
            StoreVec("sm", Bin("*", TID, Const(2, I32)), (x,)),    # words 0, 2, ..., 62: two per even bank
            Barrier(),
            StoreVec("out0", TID, (Load("sm", TID),)))            # words 0..31: conflict-free
    f = feats(body, n=32, shared=(SharedBuf("sm", 64),))
    assert f.smem_requests == 2
    assert f.smem_wavefronts == 3
    assert f.bank_conflict == pytest.approx(1.5)
    assert f.barriers == 1 and f.smem_dead_bytes == 0


def test_occupancy_and_waves_come_from_the_device() -> None:
    f = feats(copy_body(gid(256)), n=256 * 4096, block=256, grid=4096)
    assert f.blocks_per_sm == 8
    assert f.waves == pytest.approx(4096 / (8 * H200.sm_count))


# --------------------------------------------------------------------------- the fitted model
def stream(n_blocks: int) -> KernelFeatures:
    n = 256 * n_blocks
    x = Var("x")
    return feats((Assign(x, Load("in0", gid(256))), StoreVec("out0", gid(256), (x,))), n=n, block=256, grid=n_blocks)


@pytest.mark.parametrize("c", [Coefficients.defaults(H200), coefficients_for(H200)])
def test_predictions_are_positive_and_monotone_in_bytes(c: Coefficients) -> None:
    times = [kernel_device_us(stream(b), H200, c) for b in (64, 512, 4096, 32768, 262144)]
    assert all(t > 0 and math.isfinite(t) for t in times)
    assert times == sorted(times) and times[-1] > times[0]
    # never below the DRAM floor of the bytes
    f = stream(262144)
    assert times[-1] >= f.unique_bytes / H200.effective_copy_bandwidth_gbs() / 1000.0


def test_a_fitted_full_occupancy_copy_runs_near_the_floor() -> None:
    f = stream(262144)
    floor = f.unique_bytes / H200.effective_copy_bandwidth_gbs() / 1000.0
    assert floor <= kernel_device_us(f, H200, coefficients_for(H200)) <= 2 * floor


def test_strided_sectors_and_divisions_cost_time() -> None:
    c = coefficients_for(H200)
    base = stream(65536)
    assert kernel_device_us(dataclasses.replace(base, sector_bytes=8 * base.sector_bytes), H200, c) > \
        kernel_device_us(base, H200, c)
    assert kernel_device_us(dataclasses.replace(base, divisions=5000.0), H200, c) > kernel_device_us(base, H200, c)


def test_device_time_has_no_launch_term() -> None:
    tiny = stream(1)
    assert device_time_us([tiny], H200) < H200.launch_overhead_us
    assert launch_us([tiny, tiny], H200) == 2 * H200.launch_overhead_us


def test_predict_program_on_a_lowered_example(example_program: kir.Program) -> None:
    pred = predict_program(example_program, H200)
    assert pred.prune_reason is None and 0 < pred.time_us < math.inf
    assert len(pred.per_kernel_us) == len(example_program.launches)
    fs = program_features(example_program, H200)
    assert pred.time_us == pytest.approx(device_time_us(fs, H200))


def test_shipped_coefficients_name_their_provenance() -> None:
    c = coefficients_for(H200)
    assert c.source == "fitted" and c.device_key == H200.key
    assert {"commit", "date", "data", "rows"} <= set(c.provenance)
    assert Coefficients.from_dict(c.to_dict()) == c


@pytest.fixture(scope="module")
def example_program() -> kir.Program:
    from pathlib import Path

    from stitchtune.deploy.selection import heuristic_schedule
    from stitchtune.graph.parse import load_graph
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan

    g = load_graph(Path(__file__).resolve().parents[2] / "examples" / "masked_softmax_small.json")
    plan = make_plan(g)
    space = legal_space(g, plan, H200)
    return lower(g, plan, heuristic_schedule(plan, H200, space), H200, space)


@pytest.mark.parametrize("name", ["layernorm_backward_small", "cross_entropy_small", "embed_gather_layernorm_small",
                                  "colsum_sigmoid_scale_small", "llama_rotary_small"])
def test_features_of_lowered_examples_are_sane(name: str) -> None:
    from pathlib import Path

    from stitchtune.deploy.selection import heuristic_schedule
    from stitchtune.graph.parse import load_graph
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan

    g = load_graph(Path(__file__).resolve().parents[2] / "examples" / f"{name}.json")
    plan = make_plan(g)
    space = legal_space(g, plan, H200)
    prog = lower(g, plan, heuristic_schedule(plan, H200, space), H200, space)
    fs = program_features(prog, H200)
    total = sum(b.nbytes for b in prog.buffers)
    for f in fs:
        assert 0 < f.unique_bytes <= total
        assert f.requested_bytes > 0 and f.sector_bytes > 0 and f.unknown_trips == 0
        assert 0 < f.active_lanes <= 1 and f.bytes_in_flight_per_thread >= 1
        assert f.bank_conflict >= 1 and f.blocks_per_sm >= 1
    assert predict_program(prog, H200).time_us > 0


def test_a_program_is_walked_once_whatever_its_registers(example_program: kir.Program,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The search predicts a candidate before its build, after it (ptxas registers) and in the emulate
    runner: the IR walk runs once, and the memoised features equal a fresh walk's."""
    import stitchtune.cost.features as features

    fresh = [kernel_features(example_program.kernel(l.kernel), l.grid, H200, 96) for l in example_program.launches]
    walks = []
    real = features.kernel_walk
    monkeypatch.setattr(features, "kernel_walk", lambda *a, **k: walks.append(a) or real(*a, **k))
    monkeypatch.setattr(features, "_WALKS", features.OrderedDict())
    regs = {k.name: 96 for k in example_program.kernels}
    first = predict_program(example_program, H200)
    after = predict_program(example_program, H200, registers=regs)
    runner = predict_program(example_program, H200, registers=dict(regs))
    assert len(walks) == len(example_program.launches)
    assert program_features(example_program, H200, regs) == tuple(fresh)
    assert after == runner and after.occupancy != first.occupancy   # 96 registers change the occupancy
    copy = dataclasses.replace(example_program)   # an equal program, another object: walked again
    program_features(copy, H200)
    assert len(walks) == 2 * len(example_program.launches)


def test_the_walk_memo_is_bounded(example_program: kir.Program, monkeypatch: pytest.MonkeyPatch) -> None:
    import stitchtune.cost.features as features

    monkeypatch.setattr(features, "_WALKS", features.OrderedDict())
    monkeypatch.setattr(features, "WALK_MEMO_SIZE", 3)
    progs = [dataclasses.replace(example_program) for _ in range(5)]
    for p in progs:
        features.program_walk(p)
    assert len(features._WALKS) == 3 and all(features._WALKS[id(p)][0] is p for p in progs[2:])
