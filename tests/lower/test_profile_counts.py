"""Kernel profiles derived from the program (:func:`stitchtune.lower.counts.sweep_counts`): a sweep's
reads, float and special-function operations counted in the IR, on hand-built kernels (each rule) and
on lowered programs (the profile's reads follow the reuse levels the schedule chose)."""

from __future__ import annotations

import dataclasses

from stitchtune.ir import kir
from stitchtune.ir.kir import F32, I32, Assign, Bin, Const, Load, LocalRef, MathOp, Var
from stitchtune.lower.counts import loads_from, sweep_counts, sweep_reads
from stitchtune.lower.entry import lower
from stitchtune.space import Schedule
from helpers.lowering import DEV, setup


def _i(v: int) -> Const:
    return Const(v, I32)


def _loop(name: str, *body: kir.Stmt) -> kir.For:
    return kir.For(Var(name, I32), _i(0), _i(4), 1, tuple(body))


def _kernel(*round_body: kir.Stmt, before: tuple[kir.Stmt, ...] = ()) -> kir.Kernel:
    params = (kir.Param("in0", F32, 64, "input"), kir.Param("in1", F32, 64, "input"),
              kir.Param("out0", F32, 64, "output"))
    return kir.Kernel("k", params, before + (_loop("rd", *round_body),), 32)


X, Y, R = Var("x"), Var("y"), Var("rcp")
LOAD0 = Assign(X, Load("in0", _i(0)))


def test_reads_count_sweeps_not_loads() -> None:
    # two sweeps load in0 (one of them twice), one loads in1, which is not a swept input
    k = _kernel(_loop("i", LOAD0, LOAD0), _loop("j", kir.LoadVec((X, Y), "in0", _i(0))),
                _loop("l", Assign(Y, Load("in1", _i(0)))), Assign(X, Load("in0", _i(1))))
    assert dict(sweep_counts(k, {"in0"}).reads) == {"in0": 2}
    assert sweep_reads(k.body[0].body, {"in0", "in1"}) == {"in0": 2, "in1": 1}  # type: ignore[attr-defined]
    assert loads_from([LOAD0], {"in0"}) and not loads_from([LOAD0], {"in1"})


def test_prefetch_loop_counts_for_the_sweep_it_feeds() -> None:
    # the first task's prefetch before the round loop is not a sweep; the next task's, inside it, is;
    # the sweep reading the local array loads nothing itself
    fill = kir.SetLocal("pf0", _i(0), Load("in0", _i(0)))
    k = _kernel(_loop("i", Assign(X, LocalRef("pf0", _i(0)))), _loop("ip", fill), before=(_loop("ip0", fill),))
    assert dict(sweep_counts(k, {"in0"}).reads) == {"in0": 1}


def test_operations_of_the_sweeps_only() -> None:
    # exp: the op table's 2 float ops and 1 special-function op; a product with a per-row reciprocal
    # (fast_rcp) 1 float op; a float division the table's div (2, 1); index arithmetic nothing; the
    # per-row values outside the sweeps are not counted
    k = _kernel(Assign(R, MathOp("fast_rcp", (X,))), Assign(Y, MathOp("exp", (X,))),
                _loop("i", Assign(Y, MathOp("exp", (X,))), Assign(Y, Bin("*", X, R)),
                      Assign(Y, Bin("/", Const(2.0, F32), X)), Assign(Var("n", I32), Bin("/", Var("m", I32), _i(3)))))
    c = sweep_counts(k, set())
    assert (c.flops, c.sfu) == (2 + 1 + 2, 1 + 1)


def _lowered(example: str, **changes: object) -> kir.Program:
    g, plan, space = setup(example)
    s = Schedule.from_dict({"block": 128, "min_blocks": 0, "reuse": ["register", "register"],
                            "schemes": ["regional", "regional"], "split": 1, "tasks_per_block": 1,
                            "tpr": 32, "vec": 4})
    return lower(g, plan, dataclasses.replace(s, **changes), DEV, space)


def test_lowered_reads_follow_the_reuse_levels() -> None:
    # layernorm: x cached in registers is read by one sweep; recomputed, by every sweep that needs it
    cached = _lowered("layernorm_small.json")
    again = _lowered("layernorm_small.json", reuse=("global", "recompute"))
    (kc,), (ka,) = cached.kernels, again.kernels
    full = {"in0"}
    assert dict(sweep_counts(kc, full).reads) == {"in0": 1}
    assert dict(sweep_counts(ka, full).reads) == {"in0": 3}
    pc, pa = cached.profile.kernels[0], again.profile.kernels[0]
    assert pc.reread_bytes == 0 and pa.reread_bytes == 2 * pa.dram_read_bytes - 2 * _small_inputs(again)


def _small_inputs(prog: kir.Program) -> int:
    """Bytes of the program's inputs other than ``in0`` (gamma and beta: read once)."""
    return sum(b.nbytes for b in prog.buffers if b.role == "input" and b.name != "in0")
