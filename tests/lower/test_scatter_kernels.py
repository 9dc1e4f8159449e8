"""``scatter_add`` in stitched kernels: the stores of the scattered value become range-checked atomic
adds into the zeroed table (:mod:`stitchtune.lower.scatter`).

Emulated against the float64 reference for the heuristic and sampled schedules (the emulator checks
every address, flags an add into unwritten memory, i.e. a table not zeroed first, and a plain store
racing with another block's add); out-of-range indices add nothing and touch nothing out of bounds;
the zero fill is placed in an earlier kernel, behind the kernel's grid barrier, or in a zero-fill
launch counted in the program; the rendered kernels build with nvcc."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import pytest

from stitchtune.graph.node_lists import layernorm_backward_rows
from helpers.lowering import DEV, rel_err
from helpers.nvcc import compile_programs_sm90
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.ir import kir
from stitchtune.lower.entry import lower
from stitchtune.lower.scatter import ZERO_FILL_KERNEL
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace
from stitchtune.space.options import CROSS_COMBINE

ALL = lambda k: 1 << 30  # noqa: E731  (every grid co-resident)


def ln_backward_scatter(rows: int = 10, out_v: bool = False, batch: int = 2) -> Any:
    """An embedding layer norm's backward as BERT's training step has it: ``dx`` (a row reduction) and
    ``dgamma`` (a column sum), ``dx`` scattered into the word table by ``ids`` and the position table
    by ``pos`` (``dx`` itself an output with ``out_v``)."""
    return parse_graph({
        "name": "ln_bwd_emb",
        "inputs": {"dy": {"shape": [batch, 8, 32], "dtype": "float32"},
                   "xn": {"shape": [batch, 8, 32], "dtype": "float32"},
                   "gamma": {"shape": [32], "dtype": "float32"}, "rstd": {"shape": [batch, 8, 1], "dtype": "float32"},
                   "ids": {"shape": [batch, 8], "dtype": "int64"}, "pos": {"shape": [batch, 8], "dtype": "int32"}},
        "nodes": layernorm_backward_rows() + [
            {"id": "dyx", "op": "mul", "args": ["dy", "xn"]},
            {"id": "dgamma", "op": "reduce_sum", "args": ["dyx"], "axes": [0, 1]},
            {"id": "dw", "op": "scatter_add", "args": ["dx", "ids"], "shape": [rows, 32]},
            {"id": "dp", "op": "scatter_add", "args": ["dx", "pos"], "shape": [8, 32]}],
        "outputs": ["dw", "dp", "dgamma"] + (["dx"] if out_v else [])})


def padded_dropout_scatter(width: int = 24, batch: int = 3) -> Any:
    """Dropout's backward then an embedding's gradient with ``padding_idx``: ``where(keep, dy * 2, 0)``
    masked by ``ids != pad`` (the torch importer's form of the masked index put), element-wise only."""
    return parse_graph({
        "name": "drop_emb",
        "inputs": {"dy": {"shape": [batch, 5, width], "dtype": "float32"},
                   "keep": {"shape": [batch, 5, width], "dtype": "bool"},
                   "ids": {"shape": [batch, 5], "dtype": "int64"}, "ok": {"shape": [batch, 5, 1], "dtype": "bool"}},
        "nodes": [
            {"id": "s", "op": "mul", "args": ["dy", 2.0]},
            {"id": "d", "op": "where", "args": ["keep", "s", 0.0]},
            {"id": "v", "op": "where", "args": ["ok", "d", 0.0]},
            {"id": "dw", "op": "scatter_add", "args": ["v", "ids"], "shape": [7, width]}],
        "outputs": ["dw"]})


def _schedules(g: Any, n: int) -> tuple[Any, Any, list[Any]]:
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    return plan, space, [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(n)]


def _check(g: Any, x: dict[str, np.ndarray], n: int = 6) -> list[kir.Program]:
    ref = run_reference(g, x)
    plan, space, scheds = _schedules(g, n)
    progs = []
    for s in scheds:
        prog = lower(g, plan, s, DEV, space)
        out = emulate_program(prog, x, coresident_limit=ALL, cluster_limit=ALL)
        assert set(out) == set(g.outputs)
        for o in g.outputs:
            assert rel_err(out[o], ref[o]) < 1e-5, (o, s.to_json())
        progs.append(prog)
    return progs


def test_layernorm_backward_into_two_tables_matches_the_reference() -> None:
    g = ln_backward_scatter()
    x = random_inputs(g, 3)
    x["ids"][0, :3] = [1, 1, 1]   # repeated rows accumulate
    progs = _check(g, x, 8)
    assert all(sum(p.atomics for p in prog.profile.kernels) > 0 for prog in progs)


def test_a_scattered_value_that_is_an_output_is_stored_too() -> None:
    g = ln_backward_scatter(out_v=True)
    _check(g, random_inputs(g, 5), 3)


def test_out_of_range_indices_add_nothing_and_stay_in_bounds() -> None:
    """-1, ``rows``, 2**40 and -2**40: their rows add nothing (the reference's value); the emulator
    raises on any access outside a buffer, under every schedule."""
    g = ln_backward_scatter(rows=6)
    x = random_inputs(g, 1)
    x["ids"][0, :4] = [-1, 6, 2**40, -2**40]
    x["pos"][1, :2] = [-5, 8]
    assert run_reference(g, x)["dw"].any()
    _check(g, x, 6)


def test_element_wise_region_with_a_padding_mask() -> None:
    g = padded_dropout_scatter()
    x = random_inputs(g, 2)
    progs = _check(g, x, 6)
    plan = make_plan(g)
    assert plan.family.value == "elementwise" and [s.node for s in plan.scatters] == ["dw"]
    # no grid barrier, no earlier kernel, but at most a block per SM: the kernel gets a barrier of its own
    heur = progs[0]
    [k] = heur.kernels
    assert heur.launches[0].grid <= DEV.sm_count and k.barrier_param is not None
    first = next(i for i, st in enumerate(k.body) if isinstance(st, kir.GridSync))
    assert any(isinstance(st, kir.StoreVec) and st.buf == "sct0" for st in kir.walk(k.body[:first]))
    assert heur.profile.kernels[0].grid_barriers == 1 and any(b.role == "barrier" for b in heur.buffers)


def test_a_large_element_wise_region_counts_its_zero_fill_launch() -> None:
    """More blocks than SMs and no grid barrier: the zero fill is a launch of its own, counted."""
    g = padded_dropout_scatter(width=32, batch=600)
    plan, space, scheds = _schedules(g, 0)
    heur = lower(g, plan, scheds[0], DEV, space)
    assert heur.launches[-1].grid > DEV.sm_count
    assert [la.kernel for la in heur.launches][0] == ZERO_FILL_KERNEL
    assert len(heur.launches) == len(heur.profile.kernels) == 2
    x = random_inputs(g, 5)
    out = emulate_program(heur, x)
    assert rel_err(out["dw"], run_reference(g, x)["dw"]) < 1e-5


def test_the_value_buffer_is_dropped_when_nothing_reads_it() -> None:
    g = padded_dropout_scatter()
    plan, space, scheds = _schedules(g, 0)
    prog = lower(g, plan, scheds[0], DEV, space)
    assert {b.tensor for b in prog.buffers if b.role == "output"} == {"dw"}
    assert not any(isinstance(s, kir.StoreVec) and s.buf not in ("sct0",) and s.buf.startswith("out")
                   for k in prog.kernels for s in kir.walk(k.body))


def _zero_placement(g: Any, combine: str) -> kir.Program:
    plan, space, scheds = _schedules(g, 0)
    s = dataclasses.replace(scheds[0], cross_combine=combine)
    assert not space.violations(s), space.violations(s)
    prog = lower(g, plan, s, DEV, space)
    x = random_inputs(g, 7)
    out = emulate_program(prog, x, coresident_limit=ALL)
    assert rel_err(out["dw"], run_reference(g, x)["dw"]) < 1e-5
    return prog


def test_a_grid_combine_zeroes_behind_a_grid_barrier_in_one_launch() -> None:
    prog = _zero_placement(ln_backward_scatter(), "grid")
    assert len(prog.launches) == 1
    body = prog.kernels[0].body
    first_sync = next(i for i, s in enumerate(body) if isinstance(s, kir.GridSync))
    assert any(isinstance(s, kir.StoreVec) and s.buf == "sct0" for s in kir.walk(body[:first_sync]))
    assert prog.profile.kernels[0].grid_barriers >= 2


def test_an_atomic_combine_zeroes_in_its_zeroing_kernel() -> None:
    prog = _zero_placement(ln_backward_scatter(), "atomic")
    assert ZERO_FILL_KERNEL not in [la.kernel for la in prog.launches]
    first = prog.kernel(prog.launches[0].kernel)
    assert any(isinstance(s, kir.StoreVec) and s.buf == "sct0" for s in kir.walk(first.body))
    assert not any(isinstance(s, kir.AtomicAdd) and s.buf == "sct0" for s in kir.walk(first.body))


def test_a_kernel_combine_counts_its_zero_fill_launch() -> None:
    """(A grid of more blocks than SMs: a smaller one zeroes behind a barrier of its own, as above.)"""
    prog = _zero_placement(ln_backward_scatter(batch=3000), "kernel")
    assert prog.launches[1].grid > DEV.sm_count
    names = [la.kernel for la in prog.launches]
    assert names[0] == ZERO_FILL_KERNEL and len(names) == len(prog.profile.kernels) >= 3


def test_generated_names_only() -> None:
    """No node id or input name of the graph reaches the kernels (their names are generated)."""
    g = ln_backward_scatter()
    plan, space, scheds = _schedules(g, 0)
    from stitchtune.gpu.render import render

    src = render(lower(g, plan, scheds[0], DEV, space))
    for name in ("ids", "pos", "dw", "dp", "dgamma"):
        assert f" {name}" not in src and f"({name}" not in src


def test_kernels_build_with_nvcc(tmp_path: Any) -> None:
    progs = []
    for g in (ln_backward_scatter(), padded_dropout_scatter()):
        plan, space, scheds = _schedules(g, 2)
        progs += [lower(g, plan, s, DEV, space) for s in scheds]
    regs = compile_programs_sm90(progs, tmp_path)
    assert all(r for r in regs)


@pytest.mark.parametrize("seed", range(3))
def test_sampled_schedules_of_random_widths(seed: int) -> None:
    rng = random.Random(seed)
    g = padded_dropout_scatter(width=rng.choice([8, 20, 33]))
    _check(g, random_inputs(g, seed), 4)


def test_a_generic_kernel_refuses_a_scatter_as_data() -> None:
    from stitchtune.graph.dynamic import DynamicRefusal, parse_dynamic
    from stitchtune.lower.dynamic import fit_rows

    dg = parse_dynamic({"name": "sd", "dynamic": {"seq": {"min": 1, "max": 64}},
                        "inputs": {"dy": {"shape": [2, "seq", 16], "dtype": "float32"},
                                   "ids": {"shape": [2, "seq"], "dtype": "int64"}},
                        "nodes": [{"id": "v", "op": "mul", "args": ["dy", 2.0]},
                                  {"id": "dw", "op": "scatter_add", "args": ["v", "ids"], "shape": [10, 16]}],
                        "outputs": ["dw"]})
    r = fit_rows(dg, dg.key_of({"seq": 30}))
    assert isinstance(r, DynamicRefusal) and r.part == "scatter dw" and "static shapes only" in r.reason


def test_the_heuristic_takes_the_grid_combine_one_launch_at_model_shapes() -> None:
    """BERT-base's embedding layer norm backward (8 x 512 tokens, hidden 768, vocabulary 30522): the
    heuristic combines dgamma by ``grid`` (rule 7), so the tables are zeroed behind its barrier and the
    region is one launch, not three (zero fill, main, combine); emulated at a smaller shape of the same
    heuristic."""
    from stitchtune.lower.resources import legal_space

    def at(b: int, s: int, h: int, v: int) -> Any:
        obj = ln_backward_scatter().to_dict()
        for spec in obj["inputs"].values():
            r = len(spec["shape"])
            spec["shape"] = {3: [b, s, h if spec["shape"][-1] > 1 else 1], 2: [b, s], 1: [h]}[r]
        obj["nodes"][-2]["shape"], obj["nodes"][-1]["shape"] = [v, h], [s, h]
        return parse_graph(obj)

    for g, emulate in ((at(8, 512, 768, 30522), False), (at(2, 64, 128, 300), True)):
        plan = make_plan(g)
        space = legal_space(g, plan, DEV)
        s = heuristic_schedule(plan, DEV, space)
        prog = lower(g, plan, s, DEV, space)
        assert s.option(CROSS_COMBINE) == "grid" and len(prog.launches) == 1, (s.to_json(), prog.launches)
        if emulate:
            x = random_inputs(g, 3)
            out = emulate_program(prog, x)
            ref = run_reference(g, x)
            assert all(rel_err(out[o], ref[o]) < 1e-5 for o in g.outputs)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_tables_add_at_their_precision(dtype: str, tmp_path: Any) -> None:
    """A 16-bit gradient's table: each add rounded to the type (the emulator as ``atomicAdd`` of the
    type), within the 16-bit tolerance of the float64 reference; the rendered adds convert the float32
    value and build for sm_90 with nvcc; a device without the atomic add of the type is refused by name."""
    from stitchtune.errors import ScheduleError
    from stitchtune.gpu.render import render
    from stitchtune.hardware.device import get_device

    obj = padded_dropout_scatter().to_dict()
    obj["inputs"]["dy"]["dtype"] = dtype
    g = parse_graph(obj)
    progs = _check_16(g, dtype)
    assert f"__float2{'bfloat16' if dtype == 'bfloat16' else 'half'}_rn(" in render(progs[0])
    compile_programs_sm90(progs, tmp_path)
    if dtype == "bfloat16":   # (a T4 has the float16 one)
        old = get_device("t4")
        plan, space, scheds = _schedules(g, 0)
        with pytest.raises(ScheduleError, match=r"scatter_add 'dw' adds into a bfloat16 table: the bfloat16 atomic "
                                                r"add needs sm_80 or later, .* is sm_75"):
            lower(g, plan, scheds[0], old, SearchSpace.for_plan(plan, old))


def _check_16(g: Any, dtype: str) -> list[kir.Program]:
    x = random_inputs(g, 4)
    x["ids"][0, :4] = [3, 3, 3, 3]
    ref = run_reference(g, x)
    plan, space, scheds = _schedules(g, 3)
    progs = [lower(g, plan, s, DEV, space) for s in scheds]
    for prog in progs:
        out = emulate_program(prog, x, coresident_limit=ALL)
        assert str(out["dw"].dtype) == dtype and rel_err(out["dw"], ref["dw"]) < 1e-2
    return progs


@pytest.mark.parametrize("src", [[1, 8, 16], [2, 1, 16], [16]])
def test_scattered_values_broadcast_from_a_smaller_tensor(src: list[int]) -> None:
    """Values that an ``expand`` makes (a position embedding's gradient read per batch row): each row of
    ``v`` is added once per index, whatever it broadcasts along."""
    from helpers.lowering import check_emulates

    check_emulates(parse_graph({
        "name": "b", "inputs": {"p": {"shape": src, "dtype": "float32"}, "ids": {"shape": [2, 8], "dtype": "int32"}},
        "nodes": [{"id": "e", "op": "expand", "args": ["p"], "shape": [2, 8, 16]},
                  {"id": "v", "op": "mul", "args": ["e", 2.0]},
                  {"id": "dw", "op": "scatter_add", "args": ["v", "ids"], "shape": [5, 16]}],
        "outputs": ["dw"]}), 4)


def test_a_scatter_of_an_input_alone() -> None:
    """The region is the scatter only (its core stores nothing else): a zero fill and the adds."""
    g = parse_graph({"name": "only", "inputs": {"v": {"shape": [3, 4, 8], "dtype": "float32"},
                                                "ids": {"shape": [3, 4], "dtype": "int64"}},
                     "nodes": [{"id": "dw", "op": "scatter_add", "args": ["v", "ids"], "shape": [6, 8]}],
                     "outputs": ["dw"]})
    progs = _check(g, random_inputs(g, 2), 3)
    assert all({b.tensor for b in p.buffers if b.role == "output"} == {"dw"} for p in progs)


def test_kernels_carry_only_the_buffers_they_use() -> None:
    """In a program of several kernels (independent stages, a combine kernel) only the kernel that
    stores the scattered value adds to the tables (and reads the indices); the dropped value buffer is
    nobody's parameter; the zero fill goes to the first launch where that is an earlier kernel."""
    g = ln_backward_scatter()
    plan, space, scheds = _schedules(g, 12)
    multi = [lower(g, plan, s, DEV, space) for s in scheds]
    multi = [p for p in multi if len(p.kernels) > 1]
    assert multi
    for prog in multi:
        names = {b.name for b in prog.buffers}
        for k in prog.kernels:
            params = {p.name for p in k.params}
            assert params <= names
            adds = any(isinstance(s, kir.AtomicAdd) and s.buf.startswith("sct") for s in kir.walk(k.body))
            zeroes = any(isinstance(s, kir.StoreVec) and s.buf.startswith("sct") for s in kir.walk(k.body))
            assert ("sidx0" in params) == adds and (adds or zeroes or not params & {"sct0", "sct1"})


def two_tables(batch: int, small: int, large: int, width: int = 32) -> Any:
    """An element-wise region adding into a small table first and a large one second (BERT's token
    type and word embeddings' gradients)."""
    return parse_graph({
        "name": "two_tables",
        "inputs": {"dy": {"shape": [batch, 5, width], "dtype": "float32"},
                   "tt": {"shape": [batch, 5], "dtype": "int64"}, "ids": {"shape": [batch, 5], "dtype": "int64"}},
        "nodes": [
            {"id": "v", "op": "mul", "args": ["dy", 2.0]},
            {"id": "dt", "op": "scatter_add", "args": ["v", "tt"], "shape": [small, width]},
            {"id": "dw", "op": "scatter_add", "args": ["v", "ids"], "shape": [large, width]}],
        "outputs": ["dt", "dw"]})


def test_one_zero_fill_of_several_tables_has_a_grid_for_the_largest() -> None:
    """The zero fill made for the small table zeroes the large one too, with the grid the large one
    needs (on an H200 a fill of BERT's word table by the token-type table's 2 blocks took 779 us), and
    every table's loop strides over that whole grid (16 bytes a store: the float32 tables' rows are whole float4s)."""
    g = two_tables(batch=600, small=2, large=200_000)
    plan, space, scheds = _schedules(g, 0)
    prog = lower(g, plan, scheds[0], DEV, space)
    [fill] = [la for la in prog.launches if la.kernel == ZERO_FILL_KERNEL]
    assert prog.launches[0] is fill and set(fill.args) == {"sct0", "sct1"}
    assert fill.grid == min(-(-200_000 * 32 // 4 // 256), DEV.sm_count * 8) > DEV.sm_count
    [kern] = [k for k in prog.kernels if k.name == ZERO_FILL_KERNEL]
    loops = [s for s in kern.body if isinstance(s, kir.For)]
    assert len(loops) == 2 and {lp.step for lp in loops} == {fill.grid * fill.block * 4}
    assert all(len(st.values) == 4 for lp in loops for st in lp.body if isinstance(st, kir.StoreVec))
    [prof] = [p for p in prog.profile.kernels if p.name == ZERO_FILL_KERNEL]
    assert prof.grid == fill.grid and prof.dram_write_bytes == (2 + 200_000) * 32 * 4


def test_a_large_table_is_not_zeroed_by_a_few_blocks_of_another_kernel() -> None:
    """Emulated at a size where the small table's fill grid would leave the large one to a few
    threads: the values still match the reference, whichever kernel zeroes."""
    g = two_tables(batch=40, small=3, large=3000, width=24)
    plan, space, scheds = _schedules(g, 2)
    x = random_inputs(g, 11)
    ref = run_reference(g, x)
    for s in scheds:
        prog = lower(g, plan, s, DEV, space)
        for la in prog.launches:
            if la.kernel == ZERO_FILL_KERNEL:
                assert la.grid * la.block * 4 >= 3000 * 24 or la.grid == DEV.sm_count * 8
        out = emulate_program(prog, x)
        assert all(rel_err(out[o], ref[o]) < 1e-5 for o in g.outputs), s.to_json()


@pytest.mark.slow
def test_the_grid_combine_stays_co_resident_with_the_compilers_registers(tmp_path: Any) -> None:
    """Rule 7's grid combine makes the persistent grid a grid barrier's: sized by the estimated registers
    (2 blocks per SM), it must stay co-resident with ptxas's. Llama's training RMS-norm backward with the
    embedding gradient (view_102) took 156-228 registers uncapped, one block per SM for 264 blocks, and the
    cost model pruned it (the launch would be refused); rules 5c and the pin now apply to it: a register
    cache the pinned budget cannot hold is demoted, the cap keeps ptxas within it (BERT-base's shape here)."""
    from stitchtune.cost.model import predict
    from stitchtune.lower.resources import legal_space

    obj = ln_backward_scatter().to_dict()
    b, s, h, v = 8, 512, 768, 30522
    for spec in obj["inputs"].values():
        r = len(spec["shape"])
        spec["shape"] = {3: [b, s, h if spec["shape"][-1] > 1 else 1], 2: [b, s], 1: [h]}[r]
    obj["nodes"][-2]["shape"], obj["nodes"][-1]["shape"] = [v, h], [s, h]
    g = parse_graph(obj)
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    sch = heuristic_schedule(plan, DEV, space)
    prog = lower(g, plan, sch, DEV, space)
    assert sch.option(CROSS_COMBINE) == "grid" and prog.launches[0].grid > DEV.sm_count
    regs = compile_programs_sm90([prog], tmp_path)[0]
    assert predict(prog.profile, DEV, registers=regs).prune_reason is None, (sch.to_json(), regs)
