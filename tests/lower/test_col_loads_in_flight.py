"""A column sweep's loads are independent, so a thread issues them all before it uses the first (issue 39).

A column-family thread sums its rows in an unrolled loop, one guarded vector load per row. A guarded load
that is not taken keeps its destinations' values; the renderer declares every variable once, so before
each load the compiler copied the previous load's registers into the next load's destinations, and the
loads ran one at a time (GPT-2's training bias gradient ``sum_13``, 4096 x 2304: 16 KiB in flight per SM,
the audit asks for ~25). The column lowering now zeroes a guarded load's destinations first
(``lower.guarded_loads.load_vec``): 96 KiB in flight per SM (sm_90 SASS, CPU static analysis).
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.lowering import DEV, emulated_errors, float_graph
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.ir import kir
from stitchtune.lower.entry import lower
from stitchtune.lower.resources import legal_space
from stitchtune.plan.planner import make_plan


def _colsum(m: int, n: int) -> object:
    return float_graph({"x": [m, n]}, [{"id": "s", "op": "reduce_sum", "args": ["x"], "axes": [0]}], ["s"])


def _guarded_loads(stmts: tuple[kir.Stmt, ...]) -> list[tuple[int, tuple[kir.Stmt, ...]]]:
    """(position, enclosing statement list) of every guarded vector load, at any depth."""
    out: list[tuple[int, tuple[kir.Stmt, ...]]] = []
    for i, st in enumerate(stmts):
        if isinstance(st, kir.LoadVec) and st.pred is not None:
            out.append((i, stmts))
        elif isinstance(st, kir.For):
            out += _guarded_loads(st.body)
        elif isinstance(st, kir.If):
            out += _guarded_loads(st.then) + _guarded_loads(st.orelse)
    return out


def test_a_guarded_column_load_starts_from_zeros() -> None:
    g = _colsum(4096, 2304)
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    prog = lower(g, plan, heuristic_schedule(plan, DEV, space), DEV, space)
    loads = [(i, body) for k in prog.kernels for i, body in _guarded_loads(tuple(k.body)) if body[i].buf == "in0"]
    assert loads  # the sweep over the rows loads the input under the row guard
    for i, body in loads:
        ld = body[i]
        assert isinstance(ld, kir.LoadVec)
        zeroed = {s.var for s in body[max(0, i - len(ld.dsts)):i]
                  if isinstance(s, kir.Assign) and s.expr == kir.Const(0.0)}
        assert zeroed == set(ld.dsts), body[max(0, i - len(ld.dsts)):i + 1]


@pytest.mark.parametrize("shape", [(37, 20), (130, 44)])
def test_ragged_column_sums_still_equal_the_reference(shape: tuple[int, int]) -> None:
    """Rows and columns that the tiles do not divide: guards false for some loads, whose zeros the
    sums must not see in place of the values (they are masked) nor miss (they are not loaded)."""
    g = float_graph({"x": list(shape), "w": [shape[1]]},
                    [{"id": "p", "op": "mul", "args": ["x", "w"]},
                     {"id": "s", "op": "reduce_sum", "args": ["p"], "axes": [0]}], ["p", "s"])
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    inputs = random_inputs(g, 3)
    ref = run_reference(g, inputs)
    errs = emulated_errors(g, plan, space, heuristic_schedule(plan, DEV, space), inputs, ref)
    assert max(errs.values()) < 1e-5, errs
    assert all(np.isfinite(v) for v in errs.values())


@pytest.mark.slow
def test_the_column_sum_issues_its_rows_loads_before_the_first_use() -> None:
    from stitchtune.analysis.audit import audit_graph
    from stitchtune.analysis.sass import find_cuobjdump
    from stitchtune.gpu.build import nvcc_found

    if not nvcc_found() or find_cuobjdump() is None:
        pytest.skip("needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump)")
    a = audit_graph(_colsum(4096, 2304), DEV, slice_blocks=1)
    (k,) = [k for k in a.kernels if k.name == "st_k0"]
    assert k.sass is not None and k.sass.max_loads_in_flight >= 4, k.sass
    assert k.in_flight_per_sm >= k.in_flight_needed, (k.in_flight_per_sm, k.in_flight_needed)
