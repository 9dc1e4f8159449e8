"""GPT-2's q/k/v gradient concat (issue 39): each piece a head merge of one input, read as a vector.

The backward of a fused q/k/v projection concatenates ``[B, H, S, D]`` gradients merged to
``[B, S, H * D]`` (k's from ``[B, H, D, S]``) along the columns. A chain head narrower than the
domain (a concat piece, reached under its piece's uniform conditions) whose innermost dim stays the
input's innermost is loaded with one 128-bit load per lane (was: four predicated 32-bit loads, 4x
the ideal sectors). k's gradient is read along the view's rows (``plan.adjacent_rows``): its warps
span 8 rows of 4 lanes each, so each of its 32-bit loads moves whole sectors (was 8x the ideal). The
values equal the float64 reference for any extent.
"""

from __future__ import annotations

from typing import Any

import pytest

from helpers.lowering import check_emulates, float_graph
from stitchtune.analysis.sectors import program_sectors
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.graph.reference import random_inputs
from stitchtune.hardware.device import get_device
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

DEV = get_device("H200")


def qkv_grad_concat(batch: int = 2, heads: int = 3, seq: int = 16, dim: int = 8) -> Any:
    """``cat([merge(dq), merge(dk^T), merge(dv)], -1)`` as GPT-2's training step captures it."""
    B, H, S, D = batch, heads, seq, dim

    def merge(src: str, out: str, perm: list[int]) -> list[dict[str, Any]]:
        return [{"id": f"{out}_v", "op": "reshape", "args": [src], "shape": [B, H, D, S] if perm == [0, 3, 1, 2]
                 else [B, H, S, D]},
                {"id": f"{out}_p", "op": "transpose", "args": [f"{out}_v"], "perm": perm},
                {"id": out, "op": "reshape", "args": [f"{out}_p"], "shape": [B, S, H * D]}]

    nodes = (merge("dv", "mv", [0, 2, 1, 3]) + merge("dk", "mk", [0, 3, 1, 2]) + merge("dq", "mq", [0, 2, 1, 3])
             + [{"id": "cat", "op": "concat", "args": ["mv", "mk", "mq"], "axis": 2}])
    return float_graph({"dq": [B * H, S, D], "dk": [B * H, D, S], "dv": [B * H, S, D]}, nodes, ["cat"])


def test_merged_pieces_load_128_bit_at_the_ideal_sectors() -> None:
    g = qkv_grad_concat(2, 12, 64, 64)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = heuristic_schedule(plan, DEV, space)
    assert s.vec == 4
    prog = lower(g, plan, s, DEV, space)
    names = {b.name: b.tensor for b in prog.buffers}
    sl = program_sectors(prog, random_inputs(g, 0), 4)[0]
    assert not sl.error, sl.error
    got = {names[a.buf]: a for a in sl.accesses if names.get(a.buf) in ("dq", "dv")}
    assert set(got) == {"dq", "dv"}
    for t in ("dq", "dv"):  # before: four 32-bit loads per lane, 4.00x the ideal sectors
        acc = [a for a in sl.accesses if names.get(a.buf) == t]
        assert all(a.width == 4 and a.sectors == a.ideal for a in acc), acc
    # k's gradient along the rows: 8 rows a warp (before: tpr 256, one row a block, 8.00x); with row vectors
    # (the heuristic's choice here, lower/row_vectors.py) a thread's 4 rows count
    rows = plan.vector_rows if dict(s.options).get("row_vectors") else 1
    assert plan.adjacent_rows == 8 and s.block // s.tpr * rows >= 8
    assert all(a.sectors == a.ideal for a in sl.accesses), [a for a in sl.accesses if a.sectors > a.ideal]
    assert sum(a.lanes for a in sl.accesses) == 32 * sum(a.requests for a in sl.accesses)


@pytest.mark.parametrize("batch,heads,seq,dim", [(2, 3, 16, 8), (1, 3, 7, 4), (1, 2, 5, 12), (1, 3, 24, 8)])
def test_qkv_concat_emulates_like_the_reference(batch: int, heads: int, seq: int, dim: int) -> None:
    check_emulates(qkv_grad_concat(batch, heads, seq, dim), n_samples=4)


@pytest.mark.parametrize("seq,block,tpr", [(24, 256, 16), (16, 64, 8)])
def test_row_spanning_warps_emulate_like_the_reference(seq: int, block: int, tpr: int) -> None:
    """Warps of 8 rows x 4 lanes (24 rows: the second 16-row block half masked)."""
    from helpers.lowering import emulated_errors
    from stitchtune.graph.reference import run_reference
    from stitchtune.lower.lane_order import piece_lanes
    from stitchtune.space import Schedule

    g = qkv_grad_concat(1, 3, seq, 8)
    plan = make_plan(g)
    assert plan.adjacent_rows == 8
    space = SearchSpace.for_plan(plan, DEV)
    s = Schedule(tpr=tpr, block=block, split=1, vec=4, tasks_per_block=1, min_blocks=1, schemes=(), reuse=())
    space.check(s)
    assert piece_lanes(g, plan, s, 32) == 4
    inputs = random_inputs(g, 5)
    errs = emulated_errors(g, plan, space, s, inputs, run_reference(g, inputs))
    assert max(errs.values()) < 1e-6, errs
