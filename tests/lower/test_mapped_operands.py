"""Operands addressed through their index maps (broadcast along part of the row axes): the lowered
kernels match the float64 reference in the emulator (which faults on any out-of-bounds, unwritten or
racy access) for the patterns the examples do not cover, on the prefetch path too; their addresses
are computed from the map only where it is not plain; and the profile counts the bytes they read."""

from __future__ import annotations

import dataclasses
import random

import pytest

from helpers.lowering import DEV, float_graph as _graph, rel_err, setup
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.cost.model import predict
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.gpu.render import render
from stitchtune.hardware.device import get_device
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace
from stitchtune.space.options import PREFETCH


def _norm_of(a: str, b: str, op: str) -> list[dict]:
    """``z = a op b``, then ``y = (z - max z) * sum z`` over the last axis (two stages, z re-read)."""
    return [{"id": "z", "op": op, "args": [a, b]},
            {"id": "m", "op": "reduce_max", "args": ["z"], "axes": [-1], "keepdims": True},
            {"id": "d", "op": "sub", "args": ["z", "m"]},
            {"id": "s", "op": "reduce_sum", "args": ["d"], "axes": [-1], "keepdims": True},
            {"id": "y", "op": "mul", "args": ["d", "s"]}]


CASES = {
    "causal_mask": _graph({"scores": [2, 3, 12, 12], "mask": [2, 1, 12, 12]}, _norm_of("scores", "mask", "add"), ["y"]),
    "head_bias": _graph({"scores": [2, 3, 5, 24], "bias": [1, 3, 1, 24]}, _norm_of("scores", "bias", "add"), ["y"]),
    "channel_scale": _graph({"x": [3, 5, 36], "w": [1, 5, 1]}, _norm_of("x", "w", "mul"), ["y", "m"]),
    "pos_elementwise": _graph({"x": [3, 7, 40], "pos": [1, 7, 40]},
                              [{"id": "y", "op": "sub", "args": ["x", "pos"]}], ["y"]),
}


def _schedules(space: SearchSpace, plan, n: int) -> list:
    """The heuristic, ``n`` seeded samples, and prefetch / alternate-order variants where legal."""
    out = [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(100 + i)) for i in range(n)]
    extra = [dataclasses.replace(s, prefetch=1, order="alternate") for s in out]
    return out + [s for s in extra if not space.violations(s)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_mapped_operands_match_the_reference(case: str) -> None:
    g = CASES[case]
    plan = make_plan(g)
    assert any(plan.mapped(n) for n in plan.input_names)
    space = SearchSpace.for_plan(plan, DEV).as_of("5")   # seeds 100-111 exercise prefetch as space version 5 draws
    inputs = random_inputs(g, 3)
    ref = run_reference(g, inputs)
    scheds = _schedules(space, plan, 12)
    if plan.nstages:
        assert any(s.option(PREFETCH) for s in scheds), "no prefetch schedule exercised"
    for s in scheds:
        out = emulate_program(lower(g, plan, s, DEV, space), inputs, coresident_limit=lambda k: 1 << 30)
        for o in ref:
            assert rel_err(out[o], ref[o]) < 1e-5, (case, s.to_json(), o)


def test_addresses_come_from_the_map_only_where_it_is_not_plain() -> None:
    g, plan, space = setup("masked_softmax_small.json")  # scores [2,3,40,40], mask [2,1,1,40]
    src = render(lower(g, plan, heuristic_schedule(plan, DEV, space), DEV, space))
    assert "/ 120)" in src and "* 40)" in src  # the mask's row base: (row // (H*S)) * S
    g2, plan2, space2 = setup("softmax_small.json")
    assert not any(plan2.mapped(n) for n, _ in plan2.index_maps)


def _first_kernel_reads(g, device) -> int:
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, device)
    prog = lower(g, plan, heuristic_schedule(plan, device, space), device, space)
    assert predict(prog.profile, device).prune_reason is None
    return prog.profile.kernels[0].dram_read_bytes


def test_profile_counts_the_bytes_a_broadcast_operand_reads() -> None:
    B, S, H = 4, 256, 1024
    nodes = _norm_of("x", "pos", "add")
    x_bytes, pos_bytes = B * S * H * 4, S * H * 4  # pos: 1 MiB
    assert _first_kernel_reads(_graph({"x": [B, S, H], "pos": [1, S, H]}, nodes, ["y"]), DEV) == x_bytes + pos_bytes
    full = _graph({"x": [B, S, H], "pos": [B, S, H]}, nodes, ["y"])
    assert _first_kernel_reads(full, DEV) == 2 * x_bytes
    # a device whose L2 holds less than twice the operand: every broadcast repeat is a miss
    small_l2 = dataclasses.replace(get_device("H200"), l2_bytes=pos_bytes)
    assert _first_kernel_reads(_graph({"x": [B, S, H], "pos": [1, S, H]}, nodes, ["y"]), small_l2) == 2 * x_bytes
