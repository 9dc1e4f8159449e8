"""Tensors of a tiled transpose read once per tile (lower/transpose.py, ``TransposeLowerer.tile_fixed``):
an input or node whose address does not depend on the tile's transposed axis ``t`` (a linear layer's bias added
before a head split: BERT's K^T copy since the backend turns ``addmm`` into ``mm`` + a bias add) is
loaded before the load phase's passes, not once per pass; guards only where a tile is ragged. The
plan's rule (:meth:`~stitchtune.plan.transpose.TransposeTile.fixed_along`), the kernel's loads, its
registers in the sm_90 build (ptxas) and emulation against the float64 reference."""

from __future__ import annotations

import dataclasses

import pytest

from helpers.lowering import DEV, float_graph, rel_err
from helpers.nvcc import compile_programs_sm90
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.hardware.occupancy import max_resident_blocks
from stitchtune.ir import kir
from stitchtune.lower.entry import lower
from stitchtune.lower.transpose import TransposeLowerer
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace
from stitchtune.space.options import TRANSPOSE


def _bias_kt(B: int, S: int, nh: int, D: int) -> object:
    """BERT's K^T copy with the bias of the K projection: ``(x [B*S, nh*D] + b [nh*D])`` split into
    heads and transposed to ``[B, nh, D, S]`` (the region the backend cuts after ``mm``)."""
    return float_graph({"x": [B * S, nh * D], "b": [nh * D]},
                       [{"id": "a", "op": "add", "args": ["x", "b"]},
                        {"id": "v", "op": "reshape", "args": ["a"], "shape": [B, S, nh, D]},
                        {"id": "t", "op": "transpose", "args": ["v"], "perm": [0, 2, 3, 1]}], ["t"])


def _loads(stmts: tuple[kir.Stmt, ...], buf: str) -> int:
    """Global loads of ``buf`` in ``stmts`` (vector loads and scalar load expressions), nested ones included."""
    n = sum(1 for s in kir.walk(stmts) if isinstance(s, kir.LoadVec) and s.buf == buf)
    return n + sum(1 for s in kir.walk(stmts) for e in kir.exprs(s) if isinstance(e, kir.Load) and e.buf == buf)


def _pass_loops(stmts: tuple[kir.Stmt, ...]) -> list[kir.For]:
    """The unrolled pass loops of a tiled kernel (the load and the store phase)."""
    return [s for s in kir.walk(stmts) if isinstance(s, kir.For) and s.unroll]


def test_fixed_along_reads_the_factors_below_and_above_the_tile_axis() -> None:
    """A bias over heads and columns (factor below ``t``) and a per-batch tensor (above) are fixed; the
    input itself, a position table (along ``t``) and a tensor whose one factor spans ``t`` and the heads
    are not."""
    g = float_graph({"x": [2, 16, 3, 8], "b": [3, 8], "bb": [2, 1, 1, 8], "p": [16, 1, 8], "sh": [16, 3, 1]},
                    [{"id": "a", "op": "add", "args": ["x", "b"]}, {"id": "a2", "op": "add", "args": ["a", "bb"]},
                     {"id": "a3", "op": "mul", "args": ["a2", "p"]}, {"id": "a4", "op": "mul", "args": ["a3", "sh"]},
                     {"id": "t", "op": "transpose", "args": ["a4"], "perm": [0, 2, 3, 1]}], ["t"])
    plan = make_plan(g)
    tile = plan.transpose
    assert tile is not None and (tile.dim, tile.inner) == (16, 3)
    fixed = {n: tile.fixed_along(plan.imap(n)) for n in ("x", "b", "bb", "p", "sh")}
    assert fixed == {"x": False, "b": True, "bb": True, "p": False, "sh": False}


def test_the_bias_of_bert_kt_copy_is_loaded_once_per_tile_and_keeps_six_blocks_per_sm(tmp_path) -> None:
    """At the GPU script's shapes (batch 8 x 512, 12 heads of 64), the heuristic's block and width with
    the 64 tile (rule 8 now takes the 32 tile here: its register estimate, 56, does not see the saving;
    tests/lower/test_transpose.py): the kernel loads the bias once per tile, outside the pass loops (4
    passes each loaded it before: 56 registers, 4 blocks per SM, 1.45 waves), and the input in every pass;
    no bounds guard but the task's (512 and 64 are multiples of the tile); ptxas's registers leave 6
    blocks of 256 threads per SM: 768 tiles in one wave on the H200."""
    g = _bias_kt(8, 512, 12, 64)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = dataclasses.replace(heuristic_schedule(plan, DEV, space), transpose=64)  # type: ignore[call-arg]
    assert not space.violations(s) and s.block == 256 and s.vec == 4
    prog = lower(g, plan, s, DEV, space)
    (k,) = prog.kernels
    bias, x = (next(b.name for b in prog.buffers if b.tensor == n) for n in ("b", "x"))
    loops = _pass_loops(k.body)
    assert len(loops) == 2 and loops[0].stop == kir.Const(4, kir.I32)
    assert _loads(k.body, bias) == 1 and _loads(loops[0].body, bias) == 0 and _loads(loops[0].body, x) == 1
    src_guards = [e for st in kir.walk(k.body) for e in kir.exprs(st) if isinstance(e, kir.Bin) and e.op == "min"]
    assert not src_guards   # no clamp of t: the tiles divide the axis
    (regs,) = compile_programs_sm90([prog], tmp_path)
    blocks = max_resident_blocks(DEV, s.block, regs["st_k0"], prog.launches[0].smem_bytes)
    assert blocks >= 6, (regs, blocks)
    assert prog.launches[0].grid <= blocks * DEV.sm_count


@pytest.mark.parametrize("block,hoisted", [(32, False), (64, True), (256, True)])
def test_a_lane_reads_the_same_columns_in_every_pass_or_the_input_stays_in_the_passes(block: int, hoisted: bool) -> None:
    """With a 64-wide tile a lane's columns repeat from pass to pass only when the block has an even number
    of warps: one warp (block 32) alternates the tile's two column halves, so the bias is loaded per pass
    there; both forms equal the float64 reference (ragged S = 40 and 3 heads, two rounds per block)."""
    g = _bias_kt(2, 40, 3, 32)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = dataclasses.replace(heuristic_schedule(plan, DEV, space), transpose=64, vec=4, block=block, tpr=block,
                            split=1, tasks_per_block=2, min_blocks=0)
    assert not space.violations(s)
    low = TransposeLowerer(g, plan, s, DEV)
    assert low.tile_fixed() == ({"b"} if hoisted else set())
    prog = lower(g, plan, s, DEV, space)
    bias = next(b.name for b in prog.buffers if b.tensor == "b")
    assert (_loads(_pass_loops(prog.kernels[0].body)[0].body, bias) == 0) == hoisted
    inputs = random_inputs(g, 5)
    out = emulate_program(prog, inputs, coresident_limit=lambda k: 1 << 30)
    assert rel_err(out["t"], run_reference(g, inputs)["t"]) < 1e-6


def test_slices_of_the_bias_are_computed_once_per_tile_in_gpt2s_qkv_split() -> None:
    """GPT-2's training q / k / v region with the bias added after the slices (k transposed): the three bias
    slices (row-broadcast maps) are loaded before the passes, the projection in every pass (the GPU script's
    shapes, the heuristic's block and width with the 64 tile, which rule 8 no longer takes there: 54 ptxas
    registers, 1.45 waves; a ragged S = 40, emulated equal to the float64 reference)."""
    from test_transpose import _qkv_bias

    for g, small in ((_qkv_bias(8, 512, 12, 64), False), (_qkv_bias(2, 40, 2, 32), True)):
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, DEV)
        s = dataclasses.replace(heuristic_schedule(plan, DEV, space), transpose=64)  # type: ignore[call-arg]
        if small:
            s = dataclasses.replace(s, transpose=64, vec=4, block=256, tpr=256, split=1, tasks_per_block=1)
        assert s.option(TRANSPOSE) == 64 and not space.violations(s)
        assert {"b0", "b1", "b2"} <= TransposeLowerer(g, plan, s, DEV).tile_fixed()
        prog = lower(g, plan, s, DEV, space)
        bias, x = (next(b.name for b in prog.buffers if b.tensor == n) for n in ("b", "qkv"))
        passes = _pass_loops(prog.kernels[0].body)[0]
        assert _loads(prog.kernels[0].body, bias) == 3 and _loads(passes.body, bias) == 0
        assert _loads(passes.body, x) == 3
        if small:
            inputs = random_inputs(g, 2)
            out, ref = emulate_program(prog, inputs), run_reference(g, inputs)
            assert all(rel_err(out[o], ref[o]) < 1e-6 for o in ref)
