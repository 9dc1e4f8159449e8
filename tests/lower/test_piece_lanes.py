"""Piece-major lanes in element-wise kernels with a concat along the row (issue 39, ``lower/lane_order.py``).

Llama's rotary (``x * cos + cat(-x2, x1) * sin`` after the head split) had 78% of its lanes active per
warp request: each half of the 64-float row was loaded by 8 of a warp's 16 lanes of that row, the
other 8 masked. With the warps of a block holding one piece of 4 rows each, every request of a
piece's load has all 32 lanes; the values are unchanged (float64 reference) for every extent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from helpers.lowering import check_emulates, float_graph
from stitchtune.analysis.sectors import program_sectors
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.graph.reference import random_inputs
from stitchtune.hardware.device import get_device
from stitchtune.ir import kir
from stitchtune.lower.entry import lower
from stitchtune.lower.lane_order import column_period, piece_lanes, thread_coords
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

DEV = get_device("H200")


def rotary(batch: int = 2, seq: int = 32, heads: int = 4, dim: int = 64) -> Any:
    """rotate_half rotary of ``x [B*S, H*D]`` after the head split: ``[B, H, S, D]`` out."""
    h = dim // 2
    nodes: list[dict[str, Any]] = [
        {"id": "v", "op": "reshape", "args": ["x"], "shape": [batch, seq, heads, dim]},
        {"id": "t", "op": "transpose", "args": ["v"], "perm": [0, 2, 1, 3]},
        {"id": "c", "op": "mul", "args": ["t", "cos"]},
        {"id": "x1", "op": "slice", "args": ["t"], "axis": 3, "start": 0, "stop": h},
        {"id": "x2", "op": "slice", "args": ["t"], "axis": 3, "start": h, "stop": dim},
        {"id": "n", "op": "neg", "args": ["x2"]},
        {"id": "r", "op": "concat", "args": ["n", "x1"], "axis": 3},
        {"id": "s", "op": "mul", "args": ["r", "sin"]},
        {"id": "o", "op": "add", "args": ["c", "s"]}]
    return float_graph({"x": [batch * seq, heads * dim], "cos": [1, 1, seq, dim], "sin": [1, 1, seq, dim]},
                       nodes, ["o"])


def _lanes(g: Any) -> tuple[float, Any]:
    """Active lanes per warp request of the heuristic kernel (emulated slice of 4 blocks), and the schedule."""
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = heuristic_schedule(plan, DEV, space)
    prog = lower(g, plan, s, DEV, space)
    sl = program_sectors(prog, random_inputs(g, 0), 4)[0]
    assert not sl.error, sl.error
    reqs = sum(a.requests for a in sl.accesses)
    lanes = sum(a.lanes for a in sl.accesses)
    assert all(a.sectors <= a.ideal for a in sl.accesses), sl.accesses
    return lanes / (32 * reqs), s


def test_rotary_warps_hold_one_piece_every_lane_active() -> None:
    g = rotary(batch=2, seq=256, heads=8)  # enough rows for 256-thread blocks (the heuristic: two waves)
    plan = make_plan(g)
    assert column_period(g, plan) == 32
    lanes, s = _lanes(g)
    assert (s.tpr, s.vec) == (16, 4)
    assert piece_lanes(g, plan, s, 32) == 8
    assert lanes == 1.0  # row-major lanes: 78% (8 of 16 lanes of each row masked per piece load)


def _eval(e: Any, tid: Any) -> Any:
    """An index expression of ``thread_coords`` for every ``tid`` (numpy; non-negative operands)."""
    if isinstance(e, kir.Special):
        return tid
    if isinstance(e, kir.Const):
        return int(e.value)
    a, b = _eval(e.a, tid), _eval(e.b, tid)
    return {"%": lambda: a % b, "/": lambda: a // b, "+": lambda: a + b, "*": lambda: a * b}[e.op]()


def test_piece_major_coords_are_a_bijection_of_the_block() -> None:
    tpr, P, warp, block = 16, 8, 32, 256
    lane_e, rib_e = thread_coords(kir.Special("tid"), tpr, warp, P)
    tid = np.arange(block)
    lane, rib = _eval(lane_e, tid), _eval(rib_e, tid)
    assert len(set(zip(lane.tolist(), rib.tolist()))) == block
    assert lane.max() == tpr - 1 and rib.max() == block // tpr - 1
    for w in range(block // warp):  # each warp: one piece (8 lanes) of 4 rows
        ln, rw = lane[w * warp:(w + 1) * warp], rib[w * warp:(w + 1) * warp]
        assert len(set((ln // P).tolist())) == 1 and len(set(rw.tolist())) == warp // P


@pytest.mark.parametrize("batch,seq,heads,dim", [(2, 64, 4, 64), (1, 7, 3, 64), (1, 5, 3, 12), (3, 9, 1, 128)])
def test_rotary_emulates_like_the_reference_for_any_extent(batch: int, seq: int, heads: int, dim: int) -> None:
    """Odd row counts (rows past the view masked), a row whose halves are not whole vectors (12: the
    row-major order), and the sampled schedules."""
    check_emulates(rotary(batch, seq, heads, dim), n_samples=4)


def test_no_concat_keeps_row_major_lanes() -> None:
    g = float_graph({"x": [64, 64]}, [{"id": "y", "op": "mul", "args": ["x", 2.0]}], ["y"])
    plan = make_plan(g)
    assert column_period(g, plan) is None
    s = heuristic_schedule(plan, DEV, SearchSpace.for_plan(plan, DEV))
    assert piece_lanes(g, plan, s, 32) is None


@pytest.mark.parametrize("seq,heads", [(7, 3), (64, 4)])
def test_piece_major_kernel_emulates_like_the_reference(seq: int, heads: int) -> None:
    """256-thread blocks of 16-lane rows: piece-major; 21 rows leave the second block's rows 5..15 masked."""
    from helpers.lowering import emulated_errors
    from stitchtune.graph.reference import run_reference
    from stitchtune.space import Schedule

    g = rotary(1, seq, heads, 64)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = Schedule(tpr=16, block=256, split=1, vec=4, tasks_per_block=1, min_blocks=1, schemes=(), reuse=())
    space.check(s)
    assert piece_lanes(g, plan, s, 32) == 8
    inputs = random_inputs(g, 3)
    errs = emulated_errors(g, plan, space, s, inputs, run_reference(g, inputs))
    assert max(errs.values()) < 1e-6, errs
