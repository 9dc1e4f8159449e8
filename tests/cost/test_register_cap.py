"""Rule 5 of the heuristic (``stitchtune.cost.heuristic._relax_registers``): no ``min_blocks`` whose register
budget is the device's per-thread maximum anyway (issue 39).

``__launch_bounds__(256, 1)`` allows 255 registers, as ``__launch_bounds__(256)`` does, but ptxas then fills
them with hoisted loads: GPT-2's masked softmax (batch 8 x 12 heads x 512 x 512, causal mask, sm_90) took 176
registers and one 256-thread block per SM with the cap, 58 and four blocks without (the slow test reads ptxas).
"""

from __future__ import annotations

import pytest

from helpers.common import EXAMPLES
from helpers.lowering import DEV, emulated_errors, setup
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.graph.parse import load_graph, parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.hardware.occupancy import occupancy
from stitchtune.lower.entry import lower
from stitchtune.lower.resources import legal_space
from stitchtune.plan.planner import make_plan


def _causal_softmax(batch: int) -> object:
    """GPT-2's ``region_view_8`` (scripts/audit_models.py): the causal and padding masks from position ids, added
    to the scaled scores of 12 heads x 512 x 512, softmax over the keys."""
    i64 = "int64"
    inputs = {"kpos": {"shape": [batch, 1, 1, 512], "dtype": i64}, "qpos": {"shape": [batch, 1, 512, 1], "dtype": i64},
              "qseg": {"shape": [batch, 1, 512, 1], "dtype": i64}, "kseg": {"shape": [batch, 1, 1, 512], "dtype": i64},
              "x": {"shape": [batch * 12, 512, 512], "dtype": "float32"}}
    nodes = [{"id": "le", "op": "le", "args": ["kpos", "qpos"]},
             {"id": "eq", "op": "eq", "args": ["qseg", "kseg"]},
             {"id": "keep", "op": "logical_and", "args": ["le", "eq"]},
             {"id": "bias", "op": "where", "args": ["keep", 0.0, -3.4028234663852886e38]},
             {"id": "v", "op": "reshape", "args": ["x"], "shape": [batch, 12, 512, 512]},
             {"id": "sc", "op": "mul", "args": ["v", 0.125]},
             {"id": "z", "op": "add", "args": ["sc", "bias"]},
             {"id": "mx", "op": "reduce_max", "args": ["z"], "axes": [3], "keepdims": True},
             {"id": "d", "op": "sub", "args": ["z", "mx"]},
             {"id": "e", "op": "exp", "args": ["d"]},
             {"id": "sm", "op": "reduce_sum", "args": ["e"], "axes": [3], "keepdims": True},
             {"id": "y", "op": "div", "args": ["e", "sm"]}]
    return parse_graph({"name": "causal_softmax", "inputs": inputs, "nodes": nodes, "outputs": ["y"]})


def _schedule(g: object):  # type: ignore[no-untyped-def]
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    return plan, space, heuristic_schedule(plan, DEV, space)


def test_gpt2s_causal_softmax_gets_no_cap() -> None:
    _, _, s = _schedule(_causal_softmax(8))
    assert s.min_blocks == 0, s.to_json()


@pytest.mark.parametrize("name", ["softmax.json", "layernorm.json", "rmsnorm.json", "masked_softmax.json"])
def test_no_cap_at_the_per_thread_maximum(name: str) -> None:
    g, plan, space = setup(name)
    s = heuristic_schedule(plan, DEV, space)
    assert s.min_blocks == 0 or DEV.regs_per_sm // (s.block * s.min_blocks) < DEV.max_regs_per_thread, s.to_json()


def test_a_cap_below_the_maximum_stays() -> None:
    """examples/layernorm at hidden 1024 with GPT-2's two outputs keeps rule 5b's cap of 2 blocks (128)."""
    g = load_graph(EXAMPLES / "embed_gather_layernorm.json")
    plan = make_plan(g)
    s = heuristic_schedule(plan, DEV, legal_space(g, plan, DEV))
    assert s.min_blocks == 2, s.to_json()


def test_the_uncapped_softmax_emulates_equal_to_the_reference() -> None:
    """The heuristic's point at the full shape, run on one sequence of the same region."""
    _, _, s = _schedule(_causal_softmax(8))
    g = _causal_softmax(1)
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    assert not space.violations(s)
    inputs = random_inputs(g, 3)
    errs = emulated_errors(g, plan, space, s, inputs, run_reference(g, inputs))
    assert max(errs.values()) < 1e-5, errs


@pytest.mark.slow
def test_ptxas_gives_the_uncapped_softmax_several_blocks_per_sm(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from helpers.nvcc import ptxas_report
    from stitchtune.gpu.build import parse_ptxas
    from stitchtune.gpu.render import render

    g = _causal_softmax(8)
    plan, space, s = _schedule(g)
    (r,) = parse_ptxas(ptxas_report(render(lower(g, plan, s, DEV, space)), tmp_path, timeout=600)).values()
    assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0, r
    assert occupancy(DEV, s.block, r.registers, 0).blocks_per_sm >= 4, r   # capped: 176 registers, 1 block
