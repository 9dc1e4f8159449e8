"""Layer-norm / RMS-norm backward row kernels (issue 39): their persistent grid sized by the registers the
kernel really needs, and the per-column inputs (gamma) held in registers across the tasks
(``stitchtune.lower.column_cache``).

The regions are BERT's ``region_view_50`` (a residual gradient added to dy, dx of a layer norm and three
column sums: dgamma, dbeta and the next linear layer's bias gradient) and Llama's ``region_view_74`` (three
gradients added, an RMS norm's dx and dweight), as ``scripts/gpu_models.py``'s training step captures them
at batch 8 x 512 (CPU static analysis on the H200 description)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from helpers.lowering import DEV, float_graph, rel_err
from helpers.nvcc import ptxas_report
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.gpu.build import parse_ptxas
from stitchtune.gpu.render import render
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.hardware.occupancy import occupancy
from stitchtune.ir import kir
from stitchtune.lower import column_cache
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

ALL = lambda k: 1 << 30  # noqa: E731  (every grid co-resident)


def _red(i: str, a: str, axes: list[int], keep: bool) -> dict:
    return {"id": i, "op": "reduce_sum", "args": [a], "axes": axes, "keepdims": keep}


def bert_ln_backward(b: int = 8, s: int = 512, h: int = 768):
    """BERT's ``region_view_50``: ``dy = in1 + in0`` (two gradients), the layer norm's dx from the saved
    mean ``in3`` and rstd ``in4``, dx stored twice (as captured), and three column sums."""
    nodes = [
        {"id": "v50", "op": "reshape", "args": ["in0"], "shape": [b, s, h]},
        {"id": "add_9", "op": "add", "args": ["in1", "v50"]}, {"id": "sub_4", "op": "sub", "args": ["in2", "in3"]},
        {"id": "mul_18", "op": "mul", "args": ["sub_4", "in4"]}, {"id": "mul_19", "op": "mul", "args": ["add_9", "in5"]},
        {"id": "mul_20", "op": "mul", "args": ["mul_19", float(h)]}, _red("sum_8", "mul_19", [2], True),
        {"id": "mul_21", "op": "mul", "args": ["mul_19", "mul_18"]}, _red("sum_9", "mul_21", [2], True),
        {"id": "mul_22", "op": "mul", "args": ["mul_18", "sum_9"]}, {"id": "sub_5", "op": "sub", "args": ["mul_20", "sum_8"]},
        {"id": "sub_6", "op": "sub", "args": ["sub_5", "mul_22"]}, {"id": "div_1", "op": "div", "args": ["in4", float(h)]},
        {"id": "mul_23", "op": "mul", "args": ["div_1", "sub_6"]}, {"id": "mul_24", "op": "mul", "args": ["add_9", "mul_18"]},
        _red("sum_10", "mul_24", [0, 1], False), _red("sum_11", "add_9", [0, 1], False),
        {"id": "v51", "op": "reshape", "args": ["mul_23"], "shape": [b * s, h]}, _red("sum_12", "v51", [0], True)]
    return float_graph({"in0": [b * s, h], "in1": [b, s, h], "in2": [b, s, h], "in3": [b, s, 1], "in4": [b, s, 1],
                        "in5": [h]}, nodes, ["mul_23", "sum_10", "sum_11", "v51", "sum_12"])


def llama_rms_backward(b: int = 8, s: int = 512, h: int = 1024):
    """Llama's ``region_view_74``: three gradients added, the RMS norm's dx from the input ``in5`` and
    rstd ``in8`` plus the residual gradient ``in7``, and dweight (a column sum)."""
    nodes = [
        {"id": "v74", "op": "reshape", "args": ["in0"], "shape": [b, s, h]},
        {"id": "v77", "op": "reshape", "args": ["in1"], "shape": [b, s, h]},
        {"id": "add_27", "op": "add", "args": ["v74", "v77"]},
        {"id": "v80", "op": "reshape", "args": ["in2"], "shape": [b, s, h]},
        {"id": "add_28", "op": "add", "args": ["add_27", "v80"]}, {"id": "mul_52", "op": "mul", "args": ["add_28", "in3"]},
        {"id": "mul_53", "op": "mul", "args": ["add_28", "in4"]}, _red("sum_8", "mul_53", [0, 1], True),
        {"id": "mul_54", "op": "mul", "args": ["mul_52", "in5"]}, {"id": "mul_55", "op": "mul", "args": ["mul_52", "in6"]},
        _red("sum_9", "mul_54", [2], True), {"id": "add_29", "op": "add", "args": ["in7", "mul_55"]},
        {"id": "pow_10", "op": "pow", "args": ["in8", 3.0]}, {"id": "mul_56", "op": "mul", "args": ["sum_9", -0.5]},
        {"id": "mul_57", "op": "mul", "args": ["mul_56", "pow_10"]}, {"id": "div_2", "op": "div", "args": ["mul_57", float(h)]},
        {"id": "mul_58", "op": "mul", "args": ["in5", 2.0]}, {"id": "mul_59", "op": "mul", "args": ["div_2", "mul_58"]},
        {"id": "add_30", "op": "add", "args": ["add_29", "mul_59"]}]
    full = [b * s, h]
    return float_graph({"in0": full, "in1": full, "in2": full, "in3": [h], "in4": [b, s, h], "in5": [b, s, h],
                        "in6": [b, s, 1], "in7": [b, s, h], "in8": [b, s, 1]}, nodes, ["sum_8", "add_30"])


def _lowered(g, **kw):
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = heuristic_schedule(plan, DEV, space)
    if kw:
        s = dataclasses.replace(s, **kw)
        assert not space.violations(s), space.violations(s)
    return plan, space, s, lower(g, plan, s, DEV, space)


def _loads_of(stmts, buf: str) -> int:
    n = 0
    for st in stmts:
        if isinstance(st, (kir.LoadVec,)) and st.buf == buf:
            n += 1
        for sub in ("body", "then", "orelse"):
            n += _loads_of(getattr(st, sub, ()) or (), buf)
    return n


def _round_loop(kernel: kir.Kernel) -> kir.For:
    return next(st for st in kernel.body if isinstance(st, kir.For) and st.var.name.startswith("rd"))


@pytest.mark.parametrize("graph", [bert_ln_backward, llama_rms_backward], ids=["bert_view_50", "llama_view_74"])
def test_persistent_grid_is_one_wave_of_the_blocks_the_kernel_holds(graph) -> None:
    """The persistent row kernel of a norm backward is sized by an estimate that counts its hoisted loads:
    one block per SM at these shapes (253 / 254 registers in ptxas), so its grid is the SM count, not two
    waves of it with twice the partial rows (main before: 264 blocks of an estimated 128 registers)."""
    _, _, s, prog = _lowered(graph())
    assert s.persistent
    main = prog.launches[0]
    assert main.grid == DEV.sm_count, (main.grid, prog.profile.kernels[0].est_registers)


@pytest.mark.parametrize("combine", ["kernel", "grid"])
@pytest.mark.parametrize("graph", [bert_ln_backward, llama_rms_backward], ids=["bert_view_50", "llama_view_74"])
def test_grid_fits_the_compiled_registers_without_spills(graph, combine: str, tmp_path: Path) -> None:
    """The same kernels built for sm_90: ptxas's registers leave every block of the grid resident at
    once (one wave), and nothing spills; so the one-launch deterministic combine (``cross_combine`` grid,
    a grid barrier) is runnable too (main before: 264 blocks for 132 co-resident, refused)."""
    _, _, _, prog = _lowered(graph(), cross_combine=combine)
    res = parse_ptxas(ptxas_report(render(prog), tmp_path, timeout=600))
    for launch in prog.launches:
        r = res[launch.kernel]
        assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0, (launch.kernel, r)
        occ = occupancy(DEV, launch.block, r.registers, launch.smem_bytes)
        assert launch.grid <= occ.blocks_per_sm * DEV.sm_count, (launch.kernel, launch.grid, r.registers)


def test_gamma_is_loaded_once_before_the_task_loop() -> None:
    """BERT's layer-norm backward: gamma (``in5``) is read by both sweeps of every row; the thread's piece
    of it is loaded before the persistent task loop, never inside it."""
    _, _, _, prog = _lowered(bert_ln_backward())
    k = prog.kernels[0]
    gamma = next(b.name for b in prog.buffers if b.tensor == "in5")
    assert _loads_of(_round_loop(k).body, gamma) == 0
    assert _loads_of(k.body, gamma) == 1   # one vector load in the (unrolled) fill loop
    assert any(a.name.startswith("cw") and a.size == 24 for a in k.locals)


def _small(graph):
    g = graph(2, 64, 64)
    return g, random_inputs(g, 3)


@pytest.mark.parametrize("graph", [bert_ln_backward, llama_rms_backward], ids=["bert_view_50", "llama_view_74"])
def test_column_cache_emulates_bitwise_as_the_per_row_loads(graph, monkeypatch) -> None:
    """At a small shape with several tasks per block (4 rounds), the kernels with the column cache equal
    the float64 reference and are bitwise equal to the same schedule loading gamma per row (the cache
    off), in any block order."""
    g, inputs = _small(graph)
    _, _, s, prog = _lowered(g, tasks_per_block=4)
    k = prog.kernels[0]
    assert any(a.name.startswith("cw") for a in k.locals), "the column cache applies"
    ref = run_reference(g, inputs)
    out = emulate_program(prog, inputs, coresident_limit=ALL)
    assert max(rel_err(out[o], ref[o]) for o in ref) < 1e-5
    shuffled = emulate_program(prog, inputs, coresident_limit=ALL, block_order_seed=7)
    monkeypatch.setattr(column_cache, "MAX_CACHED_FLOATS", 0)
    plan = make_plan(g)
    plain = lower(g, plan, s, DEV, SearchSpace.for_plan(plan, DEV))
    assert not any(a.name.startswith("cw") for a in plain.kernels[0].locals)
    base = emulate_program(plain, inputs, coresident_limit=ALL)
    for o in ref:
        np.testing.assert_array_equal(out[o], base[o])
        np.testing.assert_array_equal(shuffled[o], base[o])


def test_one_task_per_block_keeps_per_row_loads() -> None:
    """A kernel whose blocks take one task each reads gamma once per sweep anyway: no column cache (the
    layer-norm forward and the one-task schedules keep their code)."""
    g, _ = _small(bert_ln_backward)
    _, _, _, prog = _lowered(g, tasks_per_block=1)
    assert not any(a.name.startswith("cw") for a in prog.kernels[0].locals)


@pytest.mark.parametrize("exact", [0, 1])
def test_pow_of_one_is_the_value_itself(exact: int) -> None:
    """Llama's RMS-norm backward multiplies by ``pow(x, 1.0)`` (as torch captures it): the kernel uses ``x``
    itself, in exact arithmetic too (``powf`` cost a reciprocal and a branch per element); only the cube of
    rstd stays a ``powf`` with ``exact_math``, and the results equal the reference."""
    g, inputs = _small(llama_rms_backward)
    _, _, _, prog = _lowered(g, tasks_per_block=4, exact_math=exact)
    src = render(prog)
    assert src.count("powf(") == (1 if exact else 0), src.count("powf(")
    ref = run_reference(g, inputs)
    out = emulate_program(prog, inputs, coresident_limit=ALL)
    assert max(rel_err(out[o], ref[o]) for o in ref) < 1e-5


def test_no_column_cache_under_a_register_cap() -> None:
    """Under a ``min_blocks`` cap below the device's per-thread maximum (2 blocks of 256 threads: 128
    registers) the cache's registers would come out of the loads in flight (Llama's ``view_102`` spilled
    68 bytes with it): the per-row loads stay."""
    g, _ = _small(bert_ln_backward)
    _, _, _, prog = _lowered(g, tasks_per_block=4, min_blocks=2)
    assert not any(a.name.startswith("cw") for a in prog.kernels[0].locals)
    _, _, _, uncapped = _lowered(g, tasks_per_block=4, min_blocks=1)
    assert any(a.name.startswith("cw") for a in uncapped.kernels[0].locals)
