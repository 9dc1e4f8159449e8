"""Rule 5b (``stitchtune.cost.waves``): row grids of one full wave, without the spills of a tight cap (issue 39).

The regions are those of ``scripts/audit_models.py`` at the GPU script's shapes (batch 8 x 512): Llama's
residual add + RMS norm (hidden 1024, two outputs) and GPT-2's residual add + layer norm (hidden 768, two
outputs). With 32 threads per row they were estimated at 88 / 80 registers: Llama's got no cap (80-90
registers in ptxas, 2-3 blocks per SM, 1.29-1.94 waves), GPT-2's a cap of 64 under which ptxas spilled 2
instructions. 16 threads per row under the cap of 2 blocks (128 registers) hold the 256-block grid in one
wave (0.97) without a spill (sm_90 ptxas, the slow test).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from helpers.common import EXAMPLES
from stitchtune.graph.node_lists import layernorm_rows
from helpers.lowering import DEV, emulated_errors, float_graph
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.cost.waves import FULL_WAVE, embedding_tables, last_sweep_inputs, one_wave
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.hardware.occupancy import occupancy
from stitchtune.lower.entry import estimate_registers, lower
from stitchtune.lower.resources import legal_space
from stitchtune.plan.planner import make_plan
from stitchtune.space import uncached_level


def _rmsnorm(m: int, n: int) -> object:
    """Llama's ``view_20``: ``h = x + r``; ``y = w * h * rsqrt(mean(h^2) + eps)``; outputs h and y."""
    nodes = [{"id": "h", "op": "add", "args": ["r", "x"]},
             {"id": "sq", "op": "square", "args": ["h"]},
             {"id": "ms", "op": "reduce_mean", "args": ["sq"], "axes": [1], "keepdims": True},
             {"id": "e", "op": "add", "args": ["ms", 1e-6]},
             {"id": "rs", "op": "rsqrt", "args": ["e"]},
             {"id": "xn", "op": "mul", "args": ["h", "rs"]},
             {"id": "y", "op": "mul", "args": ["w", "xn"]}]
    return float_graph({"x": [m, n], "r": [m, n], "w": [n]}, nodes, ["h", "y"])


def _add_layernorm(m: int, n: int) -> object:
    """GPT-2's ``view_14``: ``h = x + r``; ``xb = layer_norm(h) * g + b``; outputs h and xb."""
    nodes = [{"id": "h", "op": "add", "args": ["x", "r"]}] + layernorm_rows("h")
    return float_graph({"x": [m, n], "r": [m, n], "g": [n], "b": [n]}, nodes, ["h", "xb"])


def _bias_add_layernorm(m: int, n: int) -> object:
    """GPT-2's ``view_14`` with its projection's bias added by the region (importers/torch_bias.py):
    ``h = (x + bias) + r``; ``xb = layer_norm(h) * g + b``; outputs h and xb."""
    nodes = [{"id": "xb0", "op": "add", "args": ["x", "bias"]},
             {"id": "h", "op": "add", "args": ["xb0", "r"]}] + layernorm_rows("h")
    return float_graph({"x": [m, n], "bias": [n], "r": [m, n], "g": [n], "b": [n]}, nodes, ["h", "xb"])


def _bert_embeddings(batch: int, train: bool = False) -> object:
    """BERT's ``region_expand_1`` (scripts/audit_models.py): word, token-type and position tables gathered,
    summed and layer-normed, ``batch`` x 512 tokens, hidden 768; ``train``: the training step's twin, which
    also outputs the sum, the mean and rstd."""
    tokens = [{"id": "we", "op": "gather", "args": ["word", "ids"], "axis": 0},
              {"id": "te", "op": "gather", "args": ["types", "tids"], "axis": 0},
              {"id": "a", "op": "add", "args": ["we", "te"]},
              {"id": "pe", "op": "gather", "args": ["pos", "pids"], "axis": 0},
              {"id": "h", "op": "add", "args": ["a", "pe"]}] + layernorm_rows("h", eps=1e-12)
    f32 = "float32"
    inputs = {"tids": {"shape": [1, 512], "dtype": "int64"}, "word": {"shape": [32000, 768], "dtype": f32},
              "ids": {"shape": [batch, 512], "dtype": "int64"}, "types": {"shape": [2, 768], "dtype": f32},
              "pos": {"shape": [1024, 768], "dtype": f32}, "pids": {"shape": [1, 512], "dtype": "int64"},
              "g": {"shape": [768], "dtype": f32}, "b": {"shape": [768], "dtype": f32}}
    outputs = ["h", "m", "rs", "xb"] if train else ["xb"]
    return parse_graph({"name": "bert_embeddings", "inputs": inputs, "nodes": tokens, "outputs": outputs})


def _schedule(g: object):  # type: ignore[no-untyped-def]
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    return plan, space, heuristic_schedule(plan, DEV, space)


def _one_full_wave(plan, space, s) -> None:  # type: ignore[no-untyped-def]
    """The cap's blocks per SM hold the grid in one full wave, and its budget covers the estimate."""
    grid = math.ceil(plan.M / (s.block // s.tpr))
    assert s.min_blocks and grid <= s.min_blocks * DEV.sm_count
    assert grid >= FULL_WAVE * s.min_blocks * DEV.sm_count, (grid, s.min_blocks)
    budget = DEV.regs_per_sm // (s.block * s.min_blocks)
    assert budget >= estimate_registers(int(space.derived(s)["reg_cache_elems"]), s.vec, 4)


@pytest.mark.parametrize("make,n", [(_rmsnorm, 1024), (_add_layernorm, 768), (_bias_add_layernorm, 768)])
def test_a_cached_row_takes_half_the_threads_and_one_full_wave(make, n) -> None:  # type: ignore[no-untyped-def]
    plan, space, s = _schedule(make(4096, n))
    assert s.tpr == 16 and s.min_blocks == 2, s.to_json()   # 32 threads per row: the cap of 64 < the estimate
    assert int(space.derived(s)["reg_cache_elems"]) <= 64
    _one_full_wave(plan, space, s)


def test_a_row_without_a_cache_keeps_a_warp_per_row_under_the_cap() -> None:
    """Nothing cached (every candidate re-read or recomputed): estimated 56 registers, which the cap of 4
    blocks (64 registers) covers, so the row keeps its 32 threads."""
    plan, space, s = _schedule(_rmsnorm(4096, 1024))
    uncached = dataclasses.replace(s, tpr=32, min_blocks=0, reuse=tuple(uncached_level(c in plan.input_names)
                                                                       for c in plan.reuse_candidates))
    t = one_wave(space, plan, uncached, grid_barrier=False)
    assert t.tpr == 32 and t.min_blocks == 4, t.to_json()
    _one_full_wave(plan, space, t)


def test_a_bias_added_before_the_cached_sum_is_no_last_sweep_parameter() -> None:
    """The bias feeds ``h``, which the last sweep reads from registers: only gamma and beta are read there
    (counted as both, the halved row's last sweep would hold 48 + 3 x 48 floats > 1.25 x 128 and keep 32
    threads under a 64-register cap: 2 spill instructions in GPT-2's audit)."""
    plan, _, s = _schedule(_bias_add_layernorm(4096, 768))
    assert last_sweep_inputs(plan, s) == {"g", "b"}, s.to_json()
    uncached = dataclasses.replace(s, reuse=tuple(uncached_level(c in plan.input_names) for c in plan.reuse_candidates))
    assert last_sweep_inputs(plan, uncached) == {"x", "bias", "r", "g", "b"}   # h recomputed: everything again


def test_a_halved_row_whose_last_sweep_holds_too_much_keeps_its_threads() -> None:
    """Hidden 1024 with gamma and beta: 16 threads per row would hold 64 cached floats and 2 x 64 of the
    parameters in the last sweep, 192 > 1.25 x 128 (examples/embed_add_layernorm spilled 4 bytes so)."""
    _, space, s = _schedule(_add_layernorm(4096, 1024))
    assert s.tpr == 32, s.to_json()


def test_embedding_tables_are_not_last_sweep_parameters() -> None:
    """examples/embed_gather_layernorm at BERT's 8 x 512 tokens: the word table is gathered in the first
    sweep (int32 ids are its index), gamma and beta are the last sweep's parameters: 48 + 2 x 48 floats
    <= 1.25 x 128, so the row is halved."""
    d = json.loads((EXAMPLES / "embed_gather_layernorm.json").read_text())
    d["inputs"]["ids"]["shape"] = [8, 512]
    plan, _, s = _schedule(parse_graph(d))
    assert embedding_tables(plan) == {"word"}
    assert s.tpr == 16 and s.min_blocks == 2, s.to_json()


def test_a_grid_that_halving_would_not_fill_keeps_its_threads() -> None:
    """1024 rows: 32 threads per row make 128 blocks (under one per SM), 16 would make 64: no full wave."""
    _, _, s = _schedule(_rmsnorm(1024, 1024))
    assert s.tpr == 32, s.to_json()


def _assert_emulates(s, g, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Schedule ``s`` (the heuristic's point at a full shape) is legal on ``g`` (fewer rows of the same
    region: the emulator is slow) and emulates equal to the float64 reference."""
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    assert not space.violations(s)
    inputs = random_inputs(g, seed)
    errs = emulated_errors(g, plan, space, s, inputs, run_reference(g, inputs))
    assert max(errs.values()) < 1e-5, errs


@pytest.mark.parametrize("make,n", [(_rmsnorm, 1024), (_add_layernorm, 768), (_bias_add_layernorm, 768)])
def test_the_schedule_emulates_equal_to_the_reference(make, n) -> None:  # type: ignore[no-untyped-def]
    """The heuristic's point at the full shape, run on 40 rows of the same region (the emulator is slow)."""
    _assert_emulates(_schedule(make(4096, n))[2], make(40, n), seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("make,n", [(_rmsnorm, 1024), (_add_layernorm, 768)])
def test_ptxas_keeps_the_wave_without_spills(make, n, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _assert_ptxas_one_full_wave(make(4096, n), tmp_path)


def _assert_ptxas_one_full_wave(g, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The heuristic's kernel of ``g``, compiled by ptxas for sm_90: no spill, and one full wave at ptxas's
    registers."""
    from helpers.nvcc import ptxas_report
    from stitchtune.gpu.build import parse_ptxas
    from stitchtune.gpu.render import render

    plan, space, s = _schedule(g)
    res = parse_ptxas(ptxas_report(render(lower(g, plan, s, DEV, space)), tmp_path, timeout=600))
    (r,) = res.values()
    assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0, r
    per_sm = occupancy(DEV, s.block, r.registers, 0).blocks_per_sm
    waves = math.ceil(plan.M / (s.block // s.tpr)) / (per_sm * DEV.sm_count)
    assert FULL_WAVE <= waves <= 1.0, (r, waves)   # ptxas's registers: one full wave


def test_embedding_tables_that_overflow_the_cap_leave_it_off() -> None:
    """BERT's region_expand_1: 16 threads per row hold 48 cached floats and, in the first sweep, 3 x 48 of the
    tables, 192 > 1.25 x 128: under the cap of 2 blocks ptxas spilled 4 instructions (128 registers); the
    estimate (104) alone gives 2 blocks per SM, so the halved row goes uncapped (ptxas: 103, one full wave)."""
    plan, space, s = _schedule(_bert_embeddings(8))
    assert embedding_tables(plan) == {"word", "types", "pos"}
    assert s.tpr == 16 and s.min_blocks == 0, s.to_json()
    grid = math.ceil(plan.M / (s.block // s.tpr))
    per_sm = occupancy(DEV, s.block, estimate_registers(int(space.derived(s)["reg_cache_elems"]), s.vec, 4), 0)
    assert FULL_WAVE * per_sm.blocks_per_sm * DEV.sm_count <= grid <= per_sm.blocks_per_sm * DEV.sm_count


def test_a_training_steps_embeddings_keep_the_cap() -> None:
    """The training step's twin (four outputs): the estimate under-counts it (ptxas: 149 registers uncapped,
    1.94 waves), and under the cap it compiled without a spill, so it keeps the cap."""
    _, _, s = _schedule(_bert_embeddings(8, train=True))
    assert s.tpr == 16 and s.min_blocks == 2, s.to_json()


@pytest.mark.parametrize("train", [False, True])
def test_the_embedding_schedules_emulate_equal_to_the_reference(train: bool) -> None:
    """The heuristic's point at the full shape, run on one sequence of the same region."""
    _assert_emulates(_schedule(_bert_embeddings(8, train))[2], _bert_embeddings(1, train), seed=2)


@pytest.mark.slow
def test_ptxas_builds_the_uncapped_embeddings_without_spills(tmp_path: Path) -> None:
    _assert_ptxas_one_full_wave(_bert_embeddings(8), tmp_path)
