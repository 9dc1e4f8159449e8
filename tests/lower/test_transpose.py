"""The tiled shared-memory transpose (``plan.transpose``, ``schedule.transpose``; lower/transpose.py):
element-wise regions whose output's contiguous axis is a row axis of the view (permute copies, with
element-wise ops fused) equal the float64 reference in the emulator (which faults on out-of-bounds,
misaligned, unwritten or racy accesses) for ragged shapes, both tile edges, every vector width and
grid form; their stores touch the ideal number of 32-byte sectors (8x before, counted in the
emulator's address trace); the tile's padding leaves no bank conflict; the kernels compile for sm_90."""

from __future__ import annotations

import dataclasses
import random

import pytest

from helpers.lowering import DEV, float_graph, rel_err, setup
from helpers.nvcc import compile_programs_sm90
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.cost.model import predict
from stitchtune.emulate.emulator import emulate_program
from stitchtune.emulate.sectors import count_sectors
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.lower.entry import lower
from stitchtune.lower.resources import launch_shapes, legal_space
from stitchtune.lower.sectors import row_sector_factor
from stitchtune.lower.transpose import bank_conflicts
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace
from stitchtune.space.options import TRANSPOSE


def _heads(x: str, shape: list[int], perm: list[int], tail: list[dict] | None = None) -> list[dict]:
    return [{"id": "h", "op": "reshape", "args": [x], "shape": shape},
            {"id": "t", "op": "transpose", "args": ["h"], "perm": perm}] + (tail or [])


CASES = {
    # BERT's K^T at a small, ragged size: S = 37 (not a multiple of any tile or vector), D = 24
    "k_t_ragged": float_graph({"x": [3, 37, 48]}, _heads("x", [3, 37, 2, 24], [0, 2, 3, 1]), ["t"]),
    # element-wise ops fused before the transpose, a per-column bias, a second (untransposed) output
    "fused_two_outputs": float_graph(
        {"x": [2, 40, 3, 32], "b": [32]},
        [{"id": "a", "op": "add", "args": ["x", "b"]}, {"id": "g", "op": "gelu", "args": ["a"]},
         {"id": "t", "op": "transpose", "args": ["g"], "perm": [0, 3, 1, 2]}], ["t", "a"]),
    # a plain 2-D transpose whose sizes divide nothing: 70 x 33
    "matrix_odd": float_graph({"x": [70, 33]}, [{"id": "t", "op": "transpose", "args": ["x"], "perm": [1, 0]}], ["t"]),
    # an op after the transpose: the tile holds exp(x)^T * 2
    "after": float_graph({"x": [4, 64, 16]},
                         [{"id": "t0", "op": "transpose", "args": ["x"], "perm": [0, 2, 1]},
                          {"id": "e", "op": "exp", "args": ["t0"]}, {"id": "t", "op": "mul", "args": ["e", 2.0]}],
                         ["t"]),
}

def _qkv_split(B: int, S: int, nh: int, D: int) -> dict:
    """GPT-2's fused projection ``[B * S, 3 H]`` split into q, k, v columns (slices), each into heads; k
    transposed (``[B, nh, D, S]``, the output ``t``) for the scores."""
    H = nh * D
    nodes = [{"id": "v3", "op": "reshape", "args": ["qkv"], "shape": [B, S, 3 * H]}]
    for i, (out, perm) in enumerate((("q", [0, 2, 1, 3]), ("t", [0, 2, 3, 1]), ("v", [0, 2, 1, 3]))):
        nodes += [{"id": f"s{i}", "op": "slice", "args": ["v3"], "axis": 2, "start": i * H, "stop": (i + 1) * H},
                  {"id": f"h{i}", "op": "reshape", "args": [f"s{i}"], "shape": [B, S, nh, D]},
                  {"id": out, "op": "transpose", "args": [f"h{i}"], "perm": perm}]
    return float_graph({"qkv": [B * S, 3 * H]}, nodes, ["q", "t", "v"])


CASES["qkv_split"] = _qkv_split(2, 40, 2, 32)   # S = 40: ragged against both tile edges


def _qkv_bias(B: int, S: int, nh: int, D: int) -> dict:
    """:func:`_qkv_split` with the projection's bias added after each slice, itself sliced (the backend's
    ``add(slice(view(mm)), slice(b))``, importers/torch_bias.py): GPT-2's training q / k / v region."""
    H = nh * D
    nodes = [{"id": "v3", "op": "reshape", "args": ["qkv"], "shape": [B, S, 3 * H]}]
    for i, (out, perm) in enumerate((("q", [0, 2, 1, 3]), ("t", [0, 2, 3, 1]), ("v", [0, 2, 1, 3]))):
        nodes += [{"id": f"s{i}", "op": "slice", "args": ["v3"], "axis": 2, "start": i * H, "stop": (i + 1) * H},
                  {"id": f"b{i}", "op": "slice", "args": ["b"], "axis": 0, "start": i * H, "stop": (i + 1) * H},
                  {"id": f"a{i}", "op": "add", "args": [f"s{i}", f"b{i}"]},
                  {"id": f"h{i}", "op": "reshape", "args": [f"a{i}"], "shape": [B, S, nh, D]},
                  {"id": out, "op": "transpose", "args": [f"h{i}"], "perm": perm}]
    return float_graph({"qkv": [B * S, 3 * H], "b": [3 * H]}, nodes, ["q", "t", "v"])


CASES["qkv_bias"] = _qkv_bias(2, 40, 2, 32)
# inputs read once per tile (TransposeTile.fixed_along): a linear layer's bias over heads and columns added
# before the head split (BERT's K^T copy after addmm -> mm + add; S = 40 ragged), and a per-batch tensor
# above the transposed axis with a position table along it (S = 64: the tiles divide it, no guards)
CASES["bias_heads"] = float_graph({"x": [2, 40, 96], "b": [96]},
                                  [{"id": "a", "op": "add", "args": ["x", "b"]}] + _heads("a", [2, 40, 3, 32], [0, 2, 3, 1]),
                                  ["t"])
CASES["batch_bias"] = float_graph({"x": [3, 64, 32], "b": [3, 1, 32], "p": [64, 32]},
                                  [{"id": "a", "op": "add", "args": ["x", "b"]}, {"id": "m", "op": "mul", "args": ["a", "p"]},
                                   {"id": "t", "op": "transpose", "args": ["m"], "perm": [0, 2, 1]}], ["t"])


def test_the_fused_qkv_split_is_tiled_with_vector_loads_through_the_slices() -> None:
    """GPT-2's q / k / v split (slices of the fused projection, k transposed) at the GPU script's head
    size: tiled, every load and store of the heuristic kernel 128-bit and at its ideal sectors (the slices
    read through the chain's index arithmetic, a vector where the head's columns keep vectors aligned)."""
    from stitchtune.gpu.render import render

    g = _qkv_split(2, 128, 2, 64)
    plan = make_plan(g)
    assert plan.transpose is not None and plan.transpose.outputs == ("t",)
    space = SearchSpace.for_plan(plan, DEV)
    s = heuristic_schedule(plan, DEV, space)
    assert s.option(TRANSPOSE) in (32, 64) and s.vec == 4
    prog = lower(g, plan, s, DEV, space)
    src = render(prog)
    assert "reinterpret_cast<const float4*>(in0" in src and "const float* __restrict__ in0" in src
    trace: list = []
    emulate_program(prog, random_inputs(g, 1), trace=trace)
    assert count_sectors(trace, op="load").ratio == 1.0 and count_sectors(trace, op="store").ratio == 1.0


@pytest.mark.parametrize("batch", [2, 4, 8, 32])
def test_heuristic_tile_is_the_largest_whose_grid_keeps_the_wave_criterion(batch: int) -> None:
    """Rule 8 (cost/heuristic.py): the 64 tile where its grid, at the lowering's register estimate and
    shared memory, is at least two waves or one wave over every SM; else the 32 tile. The figures are
    the device's (blocks per SM from the occupancy calculator), not literals of the rule."""
    from stitchtune.hardware.occupancy import occupancy
    from stitchtune.lower.transpose import transpose_launch

    g = parse_graph({"name": "kt", "inputs": {"x": {"shape": [batch, 512, 12, 64], "dtype": "float32"}},
                     "nodes": [{"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 2, 3, 1]}],
                     "outputs": ["t"]})
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = heuristic_schedule(plan, DEV, space)
    t64 = dataclasses.replace(s, transpose=64)
    tasks, regs, smem = transpose_launch(plan, t64)
    cap = occupancy(DEV, 256, regs, smem).blocks_per_sm * DEV.sm_count
    ready = tasks >= 2 * cap or DEV.sm_count <= tasks <= cap
    assert s.option(TRANSPOSE) == (64 if ready else 32), (tasks, cap)
    # the cases cover both sides on the H200 (132 SMs): 192 / 384 tiles one wave, 768 1.45, 3072 5.8
    assert ready == (batch != 8) or DEV.sm_count != 132


HALF = parse_graph({"name": "half", "inputs": {"x": {"shape": [2, 50, 3, 40], "dtype": "float16"}},
                    "nodes": [{"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 2, 3, 1]}], "outputs": ["t"]})


def _tiled(space: SearchSpace, base) -> list:
    """Every legal tiled point of the mapping of ``base`` over edges, widths, blocks and grid forms."""
    out = []
    for edge in (32, 64):
        for vec in space.domains["vec"]:
            for block in (64, 128, 256, 1024):
                for tasks in (1, 0, 2):
                    s = dataclasses.replace(base, transpose=edge, vec=vec, block=block, tpr=block, split=1,
                                            tasks_per_block=tasks, min_blocks=0)
                    if not space.violations(s):
                        out.append(s)
    return out


@pytest.mark.parametrize("case", sorted(CASES) + ["half"])
def test_tiled_transpose_matches_the_reference(case: str) -> None:
    g = CASES.get(case, HALF)
    plan = make_plan(g)
    assert plan.transpose is not None and "t" in plan.transpose.outputs
    space = SearchSpace.for_plan(plan, DEV)
    scheds = _tiled(space, heuristic_schedule(plan, DEV, space))
    assert {s.option(TRANSPOSE) for s in scheds} == {32, 64}
    assert len({s.vec for s in scheds}) > 1 or case == "matrix_odd"   # (33 columns: vec 1 only)
    inputs = random_inputs(g, 3)
    ref = run_reference(g, inputs)
    tol = 1e-2 if case == "half" else 1e-6
    for s in scheds:
        out = emulate_program(lower(g, plan, s, DEV, space), inputs, coresident_limit=lambda k: 1 << 30)
        for o in ref:
            assert rel_err(out[o], ref[o]) < tol, (case, s.to_json(), o)


def test_heuristic_tiles_the_transposed_output_and_samples_draw_both() -> None:
    g, plan, space = setup("k_transpose.json")
    s = heuristic_schedule(plan, DEV, space)
    # batch 8 x 512 (BERT's K^T copy): 768 tiles of 64 at the estimated registers make 1.45 waves of
    # the H200 (rule 8's wave criterion fails), 3072 of 32 make 2.9: the 32 tile
    assert s.option(TRANSPOSE) == 32 and s.vec == 4
    drawn = {space.sample(random.Random(i)).option(TRANSPOSE) for i in range(40)}
    assert drawn == {0, 32, 64}
    _, plan_q, space_q = setup("bias_gelu.json")  # nothing transposed: the option never applies
    assert plan_q.transpose is None and heuristic_schedule(plan_q, DEV, space_q).option(TRANSPOSE) == 0


def test_stores_touch_the_ideal_sectors_only_when_tiled() -> None:
    """The emulator's address trace: the untiled kernel's stores touch 8 sectors per ideal one (each
    lane's float in its own sector), the tiled kernel's 1.0x; the loads are coalesced in both."""
    g, plan, space = setup("k_transpose_small.json")
    tiled = heuristic_schedule(plan, DEV, space)
    ratios = {}
    for s in (tiled, dataclasses.replace(tiled, transpose=0), dataclasses.replace(tiled, transpose=64, vec=2)):
        trace: list = []
        emulate_program(lower(g, plan, s, DEV, space), random_inputs(g, 1), trace=trace)
        ratios[s.option(TRANSPOSE), s.vec] = (count_sectors(trace, op="store").ratio,
                                                count_sectors(trace, op="load").ratio)
    assert ratios[(0, 4)][0] == pytest.approx(8.0)
    assert ratios[(32, 4)] == (1.0, 1.0) and ratios[(64, 2)] == (1.0, 1.0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_case_stores_near_the_ideal_sectors(case: str) -> None:
    """The transposed output's stores, heuristic schedule: within 1.3x of the ideal sectors where its
    rows are not 32-byte aligned (37 or 70 floats: a 32-float run spans 5 sectors, not 4), 1.0x
    where they are; the untiled kernel's 4x-8x."""
    g = CASES[case]
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    tiled = heuristic_schedule(plan, DEV, space)
    ratio = {}
    for s in (tiled, dataclasses.replace(tiled, transpose=0)):
        trace: list = []
        prog = lower(g, plan, s, DEV, space)
        emulate_program(prog, random_inputs(g, 1), trace=trace)
        out = next(b.name for b in prog.buffers if b.tensor == "t")
        ratio[s.option(TRANSPOSE)] = count_sectors(trace, buf=out, op="store").ratio
    assert ratio[tiled.option(TRANSPOSE)] <= 1.3 and ratio[0] >= 4.0, ratio
    if plan.transpose.dim % 8 == 0:
        assert ratio[tiled.option(TRANSPOSE)] == 1.0, ratio


def test_tile_padding_leaves_no_bank_conflict() -> None:
    for edge in (32, 64):
        for vec in (1, 2, 4, 8):
            assert bank_conflicts(edge, vec) == (1, 1), (edge, vec)


def test_sector_factor_from_the_index_map_ranks_the_tiled_kernel_first() -> None:
    """The profile counts a strided store's sectors at any tensor size (8x for BERT's K^T, 12.6 MB,
    inside half the H200's L2); the prediction then ranks the tiled kernel ahead (predicted times)."""
    g, plan, space = setup("k_transpose.json")
    assert row_sector_factor(plan.imap("kt"), 4, 4) == 8.0 and row_sector_factor(plan.imap("k"), 4, 4) == 1.0
    tiled = heuristic_schedule(plan, DEV, space)
    plain = dataclasses.replace(tiled, transpose=0)
    pt, pp = (lower(g, plan, s, DEV, space).profile for s in (tiled, plain))
    assert pt.kernels[0].dram_write_bytes * 8 == pp.kernels[0].dram_write_bytes == 8 * 8 * 512 * 768 * 4
    assert predict(pt, DEV).time_us * 2 < predict(pp, DEV).time_us


def test_resources_are_those_of_the_lowered_kernel() -> None:
    g, plan, space = setup("k_transpose.json")
    full = legal_space(g, plan, DEV, space)
    for s in [heuristic_schedule(plan, DEV, space)] + [full.sample(random.Random(i)) for i in range(6)]:
        prog = lower(g, plan, s, DEV, space)
        shape = launch_shapes(g, plan, s, DEV)
        k = prog.profile.kernels
        assert [(x.grid, x.block, x.smem_bytes) for x in shape] == [(p.grid, p.block, p.smem_bytes) for p in k]


def test_tiled_kernels_compile_for_sm90(tmp_path) -> None:
    progs = []
    for g in [*CASES.values(), HALF]:
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, DEV)
        scheds = _tiled(space, heuristic_schedule(plan, DEV, space))
        progs += [lower(g, plan, s, DEV, space) for s in (scheds[0], scheds[-1])]
    regs = compile_programs_sm90(progs, tmp_path)
    assert all(0 < r <= 255 for d in regs for r in d.values())


def test_a_generic_kernel_refuses_the_tile_and_the_generic_heuristic_goes_without() -> None:
    """Dynamic shapes: the tiled transpose is static only; the generic heuristic takes the untiled
    kernel (its refusal is data), which emulates equal to the float64 reference (the emulator faults
    on out-of-bounds accesses) at the smallest, an odd and the largest extent of every bucket."""
    from stitchtune.cost.heuristic import generic_heuristic
    from stitchtune.graph.dynamic import DynamicRefusal, parse_dynamic
    from stitchtune.lower.dynamic import fit_rows, lower_dynamic

    dg = parse_dynamic({"name": "kt", "dynamic": {"seq": {"min": 1, "max": 64}},
                        "inputs": {"x": {"shape": [2, "seq", 3, 16], "dtype": "float32"}},
                        "nodes": [{"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 2, 3, 1]}],
                        "outputs": ["t"]})
    fit = fit_rows(dg, dg.key_of({"seq": 40}))
    assert not isinstance(fit, DynamicRefusal) and fit.plan.transpose is not None
    space = SearchSpace.for_plan(fit.plan, DEV)
    tiled = heuristic_schedule(fit.plan, DEV, space)
    refused = lower_dynamic(fit, tiled, DEV, space)
    assert tiled.option(TRANSPOSE) > 0 and isinstance(refused, DynamicRefusal) and "transpose" in refused.part
    g = generic_heuristic(fit, DEV, space)
    assert g.option(TRANSPOSE) == 0
    prog = lower_dynamic(fit, g, DEV, space)
    assert not isinstance(prog, DynamicRefusal)
    keys = {dg.key_of({"seq": s}) for s in range(1, 65)}
    checked = 0
    for key in sorted(keys, key=lambda k: k.label()):
        kfit = fit_rows(dg, key)
        assert not isinstance(kfit, DynamicRefusal), (key.label(), kfit)
        kspace = SearchSpace.for_plan(kfit.plan, DEV)
        kprog = lower_dynamic(kfit, generic_heuristic(kfit, DEV, kspace), DEV, kspace)
        assert not isinstance(kprog, DynamicRefusal) and kprog.dynamic is not None, (key.label(), kprog)
        (bucket,) = key.buckets
        for seq in bucket.probes():
            gs = dg.at({"seq": seq})
            inputs = random_inputs(gs, seq)
            ref = run_reference(gs, inputs)
            out = emulate_program(kprog, inputs, extents={"seq": seq}, coresident_limit=lambda k: 1 << 30)
            assert rel_err(out["t"], ref["t"]) < 1e-5, (key.label(), seq)
            checked += 1
    assert len(keys) > 1 and checked >= 2 * len(keys)
