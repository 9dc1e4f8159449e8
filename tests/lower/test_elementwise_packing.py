"""Element-wise regions pack several short rows per block (issue 39).

Before, the space required ``tpr == block`` for element-wise regions, so BERT's head split (a 64-float row
per head) got one row per 32-thread block: half the lanes idle and 49,152 CTAs. Now ``tpr < block`` is legal
there, and the heuristic packs short rows into 256-thread blocks, 128-bit accesses, at least two waves.
"""

from __future__ import annotations

import random

from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.graph.parse import load_graph, parse_graph
from stitchtune.hardware.device import get_device
from stitchtune.hardware.occupancy import max_resident_blocks
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import Schedule, SearchSpace

from helpers.common import REPO
from helpers.lowering import check_emulates

DEV = get_device("H200")


def head_split(batch: int = 8, seq: int = 512, heads: int = 12, dim: int = 64):
    """``[B, S, H * D] -> [B, H, S, D]``: the view + permute + clone of a head split."""
    return parse_graph({
        "name": "head_split", "inputs": {"x": {"shape": [batch, seq, heads * dim], "dtype": "float32"}},
        "nodes": [{"id": "v", "op": "reshape", "args": ["x"], "shape": [batch, seq, heads, dim]},
                  {"id": "t", "op": "transpose", "args": ["v"], "perm": [0, 2, 1, 3]},
                  {"id": "y", "op": "mul", "args": ["t", 1.0]}],
        "outputs": ["y"]})


def test_head_split_packs_rows_with_every_lane_busy_and_two_waves() -> None:
    g = head_split()
    plan = make_plan(g)
    assert (plan.family, plan.N) == ("elementwise", 64)
    space = SearchSpace.for_plan(plan, DEV)
    s = heuristic_schedule(plan, DEV, space)
    assert (s.tpr, s.block, s.vec) == (16, 256, 4)          # 16 threads x 4 floats = a row; 16 rows a block
    (launch,) = lower(g, plan, s, DEV, space).launches
    wave = max_resident_blocks(DEV, 256, 32, 0)
    assert launch.grid == plan.M // 16 == 3072 and launch.grid >= 2 * wave   # was 49,152 blocks of 32


def test_packed_schedules_are_legal_and_emulate() -> None:
    g = load_graph(REPO / "examples" / "bias_gelu_small.json")
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = Schedule(32, 256, 1, 4, 1, 0, (), ())
    assert not space.violations(s)
    assert any(x.tpr < x.block for x in (space.sample(random.Random(i)) for i in range(30)))  # the search draws them
    check_emulates(head_split(2, 8, 3, 16), n_samples=6)
    check_emulates(load_graph(REPO / "examples" / "rotary_mul_small.json"), n_samples=6)
