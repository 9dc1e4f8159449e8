"""The per-column cross partials (``stitchtune.lower.cross`` and ``cross_bands``): the row kernel stores
each block's column sums ``vec`` columns per access (128-bit) through a bank-conflict-free exchange sized
for one reduction at a time; the combine kernel (``st_xsum``) sums the partial rows by column bands, 128-bit where the width allows, every load issued
before the first add; it emulates equal to the float64 reference (sums, means, max and min per column,
widths a band does not divide, more partial rows than one batch) and is bitwise equal across block
orders."""

from __future__ import annotations

import random

import numpy as np
import pytest

from helpers.lowering import DEV, channels_last_ln_backward, float_graph, rel_err, setup
from stitchtune.analysis.audit import audit_program
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.ir import kir
from stitchtune.lower.cross_bands import UNROLL, band_layout
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import Schedule, SearchSpace
from stitchtune.space.options import CROSS_COMBINE, cross_smem_floats

ALL = lambda k: 1 << 30  # noqa: E731  (every grid co-resident)


def _colstats(rows: int, cols: int):
    """A row softmax's output next to per-column sum, mean, max and min over the rows (cross reductions
    of each combine op)."""
    def red(i: str, op: str, a: str, axes: list[int], keep: bool = True) -> dict:
        return {"id": i, "op": op, "args": [a], "axes": axes, "keepdims": keep}
    return float_graph({"x": [rows, cols], "y": [rows, cols]}, [
        red("m", "reduce_max", "x", [1]), {"id": "sh", "op": "sub", "args": ["x", "m"]},
        {"id": "e", "op": "exp", "args": ["sh"]}, red("se", "reduce_sum", "e", [1]),
        {"id": "p", "op": "div", "args": ["e", "se"]}, {"id": "py", "op": "mul", "args": ["p", "y"]},
        red("cs", "reduce_sum", "py", [0], False), red("cm", "reduce_mean", "y", [0], False),
        red("cx", "reduce_max", "x", [0], False), red("cn", "reduce_min", "py", [0], False)],
        ["p", "cs", "cm", "cx", "cn"])


def _errors(g, prog, seed: int | None = None) -> tuple[float, dict[str, np.ndarray]]:
    inputs = random_inputs(g, 0)
    ref = run_reference(g, inputs)
    out = emulate_program(prog, inputs, coresident_limit=ALL, block_order_seed=seed)
    return max(rel_err(out[o], ref[o]) for o in ref), out


def _kernel(prog: kir.Program, name: str) -> kir.Kernel:
    return next(k for k in prog.kernels if k.name == name)


def _with(s: Schedule, **kw) -> Schedule:
    d = s.to_dict()
    d.update(kw)
    return Schedule.from_dict(d)


def test_band_layout_of_a_bert_layer_norm_backward() -> None:
    lay = band_layout(768, 132, 3, 256, DEV)
    assert (lay.vec, lay.lanes, lay.band, lay.bands, lay.rows, lay.passes, lay.rounds) == (4, 4, 16, 48, 64, 3, 1)
    assert lay.smem_floats == 8 * 3 * 16
    wide = band_layout(768, 5000, 3, 256, DEV)     # more partial rows than one batch of loads
    assert wide.rounds > 1 and 3 * wide.batch <= UNROLL
    odd = band_layout(37, 10, 1, 128, DEV)
    assert odd.vec == 1 and odd.lanes * 4 >= 64 and odd.bands * odd.band >= 37


@pytest.mark.parametrize("cols", [768, 100, 90, 37])
def test_combine_kernel_emulates_and_loads_every_partial_before_adding(cols: int) -> None:
    g = channels_last_ln_backward(4, 16, cols)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = _with(heuristic_schedule(plan, DEV, space), cross_combine="kernel")
    prog = lower(g, plan, s, DEV, space)
    err, _ = _errors(g, prog)
    assert err < 1e-5
    xsum = _kernel(prog, "st_xsum")
    loads = [x for x in kir.walk(xsum.body) if isinstance(x, kir.LoadVec)]
    want = 4 if cols % 4 == 0 else 2 if cols % 2 == 0 else 1
    assert loads and {len(x.dsts) for x in loads} == {want}
    assert not any(isinstance(x, kir.For) for x in kir.walk(xsum.body))   # unrolled: one batch
    stores = [x for x in kir.walk(xsum.body) if isinstance(x, kir.StoreVec) and not x.buf.startswith("sx")]
    assert {len(x.values) for x in stores} == {want}
    launch = next(ln for ln in prog.launches if ln.kernel == "st_xsum")
    assert launch.grid == band_layout(cols, prog.launches[0].grid, 2, s.block, DEV).bands


def test_many_partial_rows_take_several_batches_and_stay_exact() -> None:
    g = channels_last_ln_backward(64, 64, 32)   # 4096 rows of 32: one task per block, 1024+ partial rows
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = _with(heuristic_schedule(plan, DEV, space), cross_combine="kernel", tpr=8, block=32, tasks_per_block=1,
              min_blocks=0)
    assert not space.violations(s), space.violations(s)
    prog = lower(g, plan, s, DEV, space)
    assert prog.launches[0].grid >= 1024
    assert any(isinstance(x, kir.For) for x in kir.walk(_kernel(prog, "st_xsum").body))
    (e1, o1), (e2, o2) = _errors(g, prog, seed=1), _errors(g, prog, seed=2)
    assert e1 < 1e-5 and all(o1[k].tobytes() == o2[k].tobytes() for k in o1)


@pytest.mark.parametrize("rows,cols", [(70, 96), (33, 52)])
def test_sum_mean_max_min_per_column_in_each_deterministic_combine(rows: int, cols: int) -> None:
    g = _colstats(rows, cols)
    plan = make_plan(g)
    assert {c.combine for c in plan.cross if c.kind == "per_reduced"} == {"+", "max", "min"}
    space = SearchSpace.for_plan(plan, DEV)
    scheds = [heuristic_schedule(plan, DEV, space)]
    for seed in range(300):
        s = space.sample(random.Random(seed))
        if s.option(CROSS_COMBINE) in ("kernel", "grid") and len(scheds) < 7:
            scheds.append(s)
    for s in scheds:
        prog = lower(g, plan, s, DEV, space)
        (e1, o1), (e2, o2) = _errors(g, prog, seed=1), _errors(g, prog, seed=2)
        assert e1 < 1e-5, (s.to_json(), e1)
        assert all(o1[k].tobytes() == o2[k].tobytes() for k in o1), s.to_json()


def test_row_kernel_partials_are_vector_stores_through_one_conflict_free_exchange() -> None:
    g, plan, space = setup("layernorm_backward_small.json")
    s = _with(heuristic_schedule(plan, DEV, space), cross_combine="kernel", tpr=32, block=256, vec=4)
    assert not space.violations(s)
    prog = lower(g, plan, s, DEV, space)
    main = prog.kernels[0]
    partials = [x for x in kir.walk(main.body) if isinstance(x, kir.StoreVec) and x.buf.startswith("xp")]
    assert partials and all(len(x.values) == 4 for x in partials)
    sxk = next(b for b in main.shared if b.name == "sxk")
    nk = sum(c.kind == "per_reduced" for c in plan.cross)
    assert nk == 2 and sxk.size == (256 // 32) * 256   # one row piece per warp row group, not one per reduction
    assert 4 * sxk.size == 4 * cross_smem_floats(32, 256, 256, nk, 0)
    audit = audit_program(g, prog, DEV, sass=False, peer=False)
    for k in audit.kernels:
        assert k.worst_bank_ratio in (None, 1.0), (k.name, [a for a in k.shared_accesses if a.ratio > 1])
        assert not [a for a in k.accesses if a.wide and a.access_bits < 128], k.name


def test_grid_combine_sums_by_bands_in_the_row_kernel() -> None:
    g = channels_last_ln_backward(8, 32, 256)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = _with(heuristic_schedule(plan, DEV, space), cross_combine="grid", tpr=32, block=256, vec=4)
    assert not space.violations(s), space.violations(s)
    prog = lower(g, plan, s, DEV, space)
    assert [ln.kernel for ln in prog.launches] == ["st_k0"]
    body = prog.kernels[0].body
    after = body[next(i for i, x in enumerate(body) if isinstance(x, kir.GridSync)):]
    vector = [x for x in kir.walk(tuple(after)) if isinstance(x, kir.LoadVec) and x.buf.startswith("xp")]
    scalar = [x for x in kir.exprs(tuple(after)) if isinstance(x, kir.Load) and x.buf.startswith("xp")]
    assert vector and all(len(x.dsts) == 4 for x in vector) and not scalar
    (e1, o1), (e2, o2) = _errors(g, prog, seed=1), _errors(g, prog, seed=2)
    assert e1 < 1e-5 and all(o1[k].tobytes() == o2[k].tobytes() for k in o1)



@pytest.mark.parametrize("combine", ["kernel", "grid"])
def test_a_16_bit_graphs_vec_8_partials_are_16_byte_stores(combine: str) -> None:
    """Regression (found by the CLI fuzz, seed 141417): a float16 graph's ``vec`` 8 made one 32-byte store
    of eight float32 partials, which the IR verifier refuses: they are two 16-byte stores, and the per-column
    sums stay exact."""
    from stitchtune.graph.parse import parse_graph

    g = parse_graph({"name": "g", "inputs": {"x": {"shape": [32, 256], "dtype": "float16"}}, "nodes": [
        {"id": "n1", "op": "minimum", "args": ["x", "x"]},
        {"id": "n2", "op": "reduce_sum", "args": ["n1"], "axes": [0], "keepdims": True},
        {"id": "n3", "op": "reduce_min", "args": ["n1"], "axes": [-1], "keepdims": False}], "outputs": ["n2", "n3"]})
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = _with(heuristic_schedule(plan, DEV, space), cross_combine=combine, vec=8)
    assert not space.violations(s), space.violations(s)
    prog = lower(g, plan, s, DEV, space)   # verified on the way out
    partials = [x for x in kir.walk(prog.kernels[0].body) if isinstance(x, kir.StoreVec) and x.buf.startswith("xp")]
    assert partials and all(len(x.values) == 4 for x in partials)
    err, _ = _errors(g, prog)
    assert err < 1e-3, err
