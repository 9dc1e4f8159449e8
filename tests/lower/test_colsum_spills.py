"""Column sums under a grid barrier stay clear of register spills (issue 39 item 2).

A grid-barrier schedule is pinned to its estimated blocks per SM (``heuristic._pin_coresidency``), which
caps ptxas's registers. Two things used to spill under that cap at the GPU script's shapes: the loop over
the ``split`` partials (fully unrolled, every partial's load hoisted: 150 registers for split 32 x vec 4)
and a register cache of the rows a thread sums (GPT-2's ``view_41``: a 64-float cache estimated at 120
registers, 234 in ptxas). The partials' loop is now unrolled by ``COMBINE_UNROLL`` and rule 5c demotes a register cache that
the pinned budget cannot hold; these tests compile the heuristic kernels for sm_90 and read ptxas's
spill figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.lowering import float_graph
from helpers.nvcc import ptxas_report
from stitchtune.cost.heuristic import _pinned_need, heuristic_schedule
from stitchtune.gpu.build import parse_ptxas
from stitchtune.gpu.render import render
from stitchtune.hardware.device import get_device
from stitchtune.ir import kir
from stitchtune.ir.verify import check
from stitchtune.lower.col import COMBINE_UNROLL
from stitchtune.lower.entry import lower
from stitchtune.lower.resources import legal_space
from stitchtune.plan.planner import make_plan
from stitchtune.space import ReuseLevel

DEV = get_device("h200")


def _colsum(m: int, n: int) -> object:
    """GPT-2's training column sum (a bias gradient): ``sum(x, axis 0)`` of ``m x n``."""
    return float_graph({"x": [m, n]}, [{"id": "s", "op": "reduce_sum", "args": ["x"], "axes": [0]}], ["s"])


def _gelu_grad_colsum(m: int, n: int) -> object:
    """BERT's training ``view_47`` region (captured from scripts/gpu_models.py's BERT at batch 8 x 512): the
    exact GELU's backward times the incoming gradient, stored and summed over the rows (the bias gradient);
    the product is a register-cache candidate. ``m`` rows of ``n``."""
    nodes = [
        {"id": "mul_11", "op": "mul", "args": ["x", 0.7071067811865476]},
        {"id": "erf", "op": "erf", "args": ["mul_11"]},
        {"id": "add_7", "op": "add", "args": ["erf", 1.0]},
        {"id": "mul_12", "op": "mul", "args": ["add_7", 0.5]},
        {"id": "mul_13", "op": "mul", "args": ["x", "x"]},
        {"id": "mul_14", "op": "mul", "args": ["mul_13", -0.5]},
        {"id": "exp", "op": "exp", "args": ["mul_14"]},
        {"id": "mul_15", "op": "mul", "args": ["exp", 0.3989422804014327]},
        {"id": "mul_16", "op": "mul", "args": ["x", "mul_15"]},
        {"id": "add_8", "op": "add", "args": ["mul_12", "mul_16"]},
        {"id": "mul_17", "op": "mul", "args": ["dy", "add_8"]},
        {"id": "sum_7", "op": "reduce_sum", "args": ["mul_17"], "axes": [0], "keepdims": True},
    ]
    return float_graph({"dy": [m, n], "x": [m, n]}, nodes, ["mul_17", "sum_7"])


def _heuristic(g: object) -> tuple[object, object, object]:
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    s = heuristic_schedule(plan, DEV, space)
    return plan, space, s


def _loops(stmts: tuple[kir.Stmt, ...]) -> list[kir.For]:
    out: list[kir.For] = []
    for st in stmts:
        if isinstance(st, kir.For):
            out.append(st)
            out += _loops(st.body)
        elif isinstance(st, kir.If):
            out += _loops(st.then) + _loops(st.orelse)
    return out


def _partials_loops(prog: object) -> list[kir.For]:
    return [f for k in prog.kernels for f in _loops(tuple(k.body))
            if any(isinstance(st, kir.LoadVec) and st.buf.startswith("part") for st in f.body)]


def test_partials_loop_is_unrolled_by_a_bounded_factor() -> None:
    g = _colsum(4096, 2304)
    plan, space, s = _heuristic(g)
    assert s.split > COMBINE_UNROLL  # the partials' loop would be long enough to matter
    # the row threads share the partials (lower/col_exchange step 4): split / tpr each, fully unrolled
    (loop,) = _partials_loops(lower(g, plan, s, DEV, space))
    assert loop.stop == kir.Const(-(-s.split // s.tpr), kir.I32) and loop.unroll
    # one row thread per column: the whole split in one thread, unrolled by the bounded factor
    one = s.__class__.from_dict({**s.to_dict(), "tpr": 1, "block": 32})
    prog = lower(g, plan, one, DEV, space)
    assert check(prog) == ()
    (loop,) = _partials_loops(prog)
    assert loop.stop == kir.Const(s.split, kir.I32) and loop.unroll_by == COMBINE_UNROLL and not loop.unroll
    assert f"#pragma unroll {COMBINE_UNROLL}\n" in render(prog)


def test_register_cache_is_demoted_when_the_pinned_budget_cannot_hold_it() -> None:
    _, space, s = _heuristic(_gelu_grad_colsum(4096, 3072))
    assert ReuseLevel.REGISTER not in s.reuse
    assert s.min_blocks >= 2  # still pinned for co-residency
    budget = DEV.regs_per_sm // (s.block * s.min_blocks)
    assert budget >= _pinned_need(space, s)


@pytest.mark.slow
@pytest.mark.parametrize("make,shape", [(_colsum, (4096, 2304)), (_gelu_grad_colsum, (4096, 3072))])
def test_heuristic_column_sum_compiles_without_spills(make, shape, tmp_path: Path) -> None:
    g = make(*shape)
    plan, space, s = _heuristic(g)
    prog = lower(g, plan, s, DEV, space)
    res = parse_ptxas(ptxas_report(render(prog), tmp_path, timeout=600))
    assert res and all(r.spill_store_bytes == 0 and r.spill_load_bytes == 0 for r in res.values()), (s.to_json(), res)
