"""Rule 5e (``stitchtune.cost.waves.tail_free``): a row grid between one and two waves takes two tasks per
block and the cap that holds the halved grid in one wave (issue 39).

The region is GPT-2's training embedding backward (``region_view_82`` of ``scripts/audit_models.py`` at batch
8 x 512, hidden 768): the layer-norm backward of the embeddings' sum, plus the residual gradient, added into the
word table by ``scatter_add``. 32 threads per row, 8 rows a block: 512 blocks; estimated 104 registers (ptxas
114 uncapped), 2 blocks per SM: 1.94 waves before the rule.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from helpers.lowering import DEV, emulated_errors
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.cost.waves import DRAM_LATENCY_NS, first_sweep_bytes, tail_free
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.hardware.occupancy import occupancy
from stitchtune.lower.entry import estimate_registers, lower
from stitchtune.lower.resources import legal_space
from stitchtune.plan.planner import make_plan


def _embedding_backward(rows: int, n: int = 768, vocab: int = 32000) -> object:
    """GPT-2's ``region_view_82``: ``dx`` of a layer norm (``g`` the incoming gradient, ``x`` its input with
    per-row mean ``mu`` and rstd ``rs``, gamma ``w``) plus the residual gradient ``r``; outputs ``g * xhat``
    (dgamma's rows), ``dx`` and ``dx`` added into a ``vocab`` x ``n`` table at the ids in range."""
    f32 = {"dtype": "float32"}
    inputs = {"g": {"shape": [rows, n], **f32}, "x": {"shape": [rows, n], **f32},
              "mu": {"shape": [rows, 1], **f32}, "rs": {"shape": [rows, 1], **f32}, "w": {"shape": [n], **f32},
              "r": {"shape": [rows, n], **f32}, "ids": {"shape": [rows], "dtype": "int64"}}
    nodes = [{"id": "xc", "op": "sub", "args": ["x", "mu"]},
             {"id": "xh", "op": "mul", "args": ["xc", "rs"]},
             {"id": "gw", "op": "mul", "args": ["g", "w"]},
             {"id": "gwn", "op": "mul", "args": ["gw", float(n)]},
             {"id": "s1", "op": "reduce_sum", "args": ["gw"], "axes": [1], "keepdims": True},
             {"id": "gx", "op": "mul", "args": ["gw", "xh"]},
             {"id": "s2", "op": "reduce_sum", "args": ["gx"], "axes": [1], "keepdims": True},
             {"id": "xs", "op": "mul", "args": ["xh", "s2"]},
             {"id": "a", "op": "sub", "args": ["gwn", "s1"]},
             {"id": "b", "op": "sub", "args": ["a", "xs"]},
             {"id": "k", "op": "div", "args": ["rs", float(n)]},
             {"id": "dxn", "op": "mul", "args": ["k", "b"]},
             {"id": "dg", "op": "mul", "args": ["g", "xh"]},
             {"id": "dx", "op": "add", "args": ["r", "dxn"]},
             {"id": "ge", "op": "ge", "args": ["ids", 0.0]},
             {"id": "lt", "op": "lt", "args": ["ids", float(vocab)]},
             {"id": "ok", "op": "logical_and", "args": ["ge", "lt"]},
             {"id": "ok2", "op": "reshape", "args": ["ok"], "shape": [rows, 1]},
             {"id": "v", "op": "where", "args": ["ok2", "dx", 0.0]},
             {"id": "dw", "op": "scatter_add", "args": ["v", "ids"], "shape": [vocab, n]}]
    return parse_graph({"name": "embedding_backward", "inputs": inputs, "nodes": nodes, "outputs": ["dg", "dx", "dw"]})


def _schedule(g: object):  # type: ignore[no-untyped-def]
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    return plan, space, heuristic_schedule(plan, DEV, space)


def test_a_grid_between_one_and_two_waves_takes_two_tasks_per_block_in_one_wave() -> None:
    plan, space, s = _schedule(_embedding_backward(4096))
    assert (s.tpr, s.block, s.tasks_per_block, s.min_blocks) == (32, 256, 2, 2), s.to_json()
    one_task = math.ceil(plan.M / (s.block // s.tpr))
    estimate = estimate_registers(int(space.derived(s)["reg_cache_elems"]), s.vec, 4)
    per_sm = occupancy(DEV, s.block, estimate, 0).blocks_per_sm
    assert per_sm * DEV.sm_count < one_task < 2 * per_sm * DEV.sm_count   # the case: 1 < waves < 2
    grid = math.ceil(one_task / 2)
    assert DEV.sm_count <= grid <= s.min_blocks * DEV.sm_count       # one wave over every SM, held by the cap
    assert DEV.regs_per_sm // (s.block * s.min_blocks) >= estimate    # the cap covers the estimate
    # the lowered launch is that grid
    (main,) = [la for la in lower(_embedding_backward(4096), plan, s, DEV, space).launches if la.kernel == "st_k0"]
    assert main.grid == grid
    # Little's law: the first sweep's loads of the grid's threads cover the device's bytes in flight per SM
    assert first_sweep_bytes(plan, s) * s.block * grid / DEV.sm_count >= DEV.dram_bandwidth_gbs * DRAM_LATENCY_NS / DEV.sm_count


@pytest.mark.parametrize("rows", [2048, 8192])
def test_a_grid_of_one_wave_or_at_least_two_keeps_one_task_per_block(rows: int) -> None:
    """2048 rows: 256 blocks, within one wave of 2 per SM; 8192: 1024 blocks, 3.9 waves."""
    _, _, s = _schedule(_embedding_backward(rows))
    assert s.tasks_per_block == 1, s.to_json()


def test_the_rule_leaves_several_tasks_per_block_and_grid_barriers_alone() -> None:
    plan, space, s = _schedule(_embedding_backward(4096))
    one = s.__class__(**{**s.to_dict(), "schemes": s.schemes, "reuse": s.reuse, "tasks_per_block": 1, "min_blocks": 0})
    assert tail_free(space, plan, one, grid_barrier=False) == s
    assert tail_free(space, plan, one, grid_barrier=True) == one
    assert tail_free(space, plan, s, grid_barrier=False) == s


def test_the_two_task_schedule_emulates_equal_to_the_reference() -> None:
    """The heuristic's point at the full shape, run on 40 rows and a 50-row table (the emulator is slow):
    each block's second task and the row beyond the last task (40 rows: 5 tasks, 3 blocks) included."""
    _, _, s = _schedule(_embedding_backward(4096))
    g = _embedding_backward(40, vocab=50)
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    assert not space.violations(s)
    inputs = random_inputs(g, 3)
    inputs["ids"] = (inputs["ids"] % 60).astype(inputs["ids"].dtype)   # some ids out of range: masked
    errs = emulated_errors(g, plan, space, s, inputs, run_reference(g, inputs))
    assert max(errs.values()) < 1e-5, errs


@pytest.mark.slow
def test_ptxas_keeps_the_halved_grid_in_one_wave_without_spills(tmp_path: Path) -> None:
    from helpers.nvcc import ptxas_report
    from stitchtune.gpu.build import parse_ptxas
    from stitchtune.gpu.render import render

    g = _embedding_backward(4096)
    plan, space, s = _schedule(g)
    prog = lower(g, plan, s, DEV, space)
    res = parse_ptxas(ptxas_report(render(prog), tmp_path, timeout=600))
    r = res["st_k0"]
    assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0, r
    grid = next(la.grid for la in prog.launches if la.kernel == "st_k0")
    assert grid <= occupancy(DEV, s.block, r.registers, 0).blocks_per_sm * DEV.sm_count, r


def test_examples_embed_add_layernorm_two_task_schedule_emulates_equal_to_the_reference() -> None:
    """examples/embed_add_layernorm (4096 x 1024: estimated 88 registers, 2 blocks per SM, 1.94 waves) takes
    the rule too; its point, run on the small example's rows, equals the float64 reference."""
    from helpers.lowering import setup

    g, plan, space = setup("embed_add_layernorm.json")
    s = heuristic_schedule(plan, DEV, space)
    assert (s.tasks_per_block, s.min_blocks) == (2, 2), s.to_json()
    small, small_plan, small_space = setup("embed_add_layernorm_small.json")
    assert not small_space.violations(s)
    inputs = random_inputs(small, 4)
    errs = emulated_errors(small, small_plan, small_space, s, inputs, run_reference(small, inputs))
    assert max(errs.values()) < 1e-5, errs


def _layernorm(rows: int, n: int, dtype: str) -> object:
    """examples/layernorm_bf16's layer norm at ``rows`` x ``n`` with every tensor in ``dtype``."""
    import json

    from helpers.common import REPO

    d = json.loads((REPO / "examples" / "layernorm_bf16.json").read_text())
    d["inputs"] = {"x": {"shape": [rows, n], "dtype": dtype}, "gamma": {"shape": [n], "dtype": dtype},
                   "beta": {"shape": [n], "dtype": dtype}}
    return parse_graph(d)


def test_little_s_law_counts_a_bfloat16_row_piece_at_two_bytes_an_element() -> None:
    """24576 x 128: 384 blocks of 64 rows (4 threads per row), 1.45 waves, so the rule is asked. Its halved grid's
    first sweep holds 47.7 KB per SM in float32, over the 25.5 KB Little's law asks on the H200: two tasks per
    block; in bfloat16 the same elements are half the bytes, 23.8 KB, under it: one task per block. (The bytes
    were counted at 4 per element whatever the dtype, and the bfloat16 grid took two tasks per block too.)"""
    needed = DEV.dram_bandwidth_gbs * DRAM_LATENCY_NS / DEV.sm_count
    f32_plan, _, f32 = _schedule(_layernorm(24576, 128, "float32"))
    assert (f32.tasks_per_block, f32.min_blocks) == (2, 2), f32.to_json()
    grid = math.ceil(f32_plan.M / (f32.block // f32.tpr) / 2)   # two tasks per block
    assert first_sweep_bytes(f32_plan, f32) * f32.block * grid / DEV.sm_count >= needed
    bf16_plan, space, bf16 = _schedule(_layernorm(24576, 128, "bfloat16"))
    assert bf16.tasks_per_block == 1, bf16.to_json()
    assert tail_free(space, bf16_plan, bf16, grid_barrier=False) == bf16
    piece = math.ceil(128 / (bf16.tpr * bf16.vec)) * bf16.vec
    assert first_sweep_bytes(bf16_plan, bf16) == 2 * piece   # one full-size input, 2 bytes an element
    halved = math.ceil(math.ceil(bf16_plan.M / (bf16.block // bf16.tpr)) / 2)
    assert first_sweep_bytes(bf16_plan, bf16) * bf16.block * halved / DEV.sm_count < needed
