"""A sweep's guarded loads are independent, so a thread issues them all before it uses the first (issue 39).

A column-family thread sums its rows in an unrolled loop, one guarded vector load per row. A guarded load
that is not taken keeps its destinations' values; the renderer declares every variable once, so before
each load the compiler copied the previous load's registers into the next load's destinations, and the
loads ran one at a time (GPT-2's training bias gradient ``sum_13``, 4096 x 2304: 16 KiB in flight per SM,
the audit asks for ~25). The column lowering now zeroes a guarded load's destinations first
(``lower.guarded_loads.load_vec``): 96 KiB in flight per SM (sm_90 SASS, CPU static analysis). So does the
row lowering wherever its guard is not the constant true (a persistent grid, ragged rows or pieces): the
layer norm backward of a training step (GPT-2's ``view_38``, 4096 x 768, dx and the dgamma / dbeta column
sums on a persistent grid) went from 17 to 74 KiB in flight per SM.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.common import EXAMPLES
from helpers.lowering import DEV, emulated_errors, float_graph
from stitchtune.graph.parse import Graph, parse_graph
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


def _ln_backward(m: int, n: int) -> object:
    """examples/layernorm_backward.json (dx, dgamma, dbeta from the saved mean and rstd) at ``m`` x ``n``."""
    d = json.loads((EXAMPLES / "layernorm_backward.json").read_text())
    shapes = {"x": [m, n], "dy": [m, n], "gamma": [n], "mean": [m, 1], "rstd": [m, 1]}
    d["inputs"] = {k: {**v, "shape": shapes[k]} for k, v in d["inputs"].items()}
    return parse_graph(d)


def _zeroed(g: object, buf: str) -> list[bool]:
    """Per guarded vector load of ``buf`` in the heuristic program: whether its destinations are set to 0
    just before it."""
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    prog = lower(g, plan, heuristic_schedule(plan, DEV, space), DEV, space)
    out = []
    for k in prog.kernels:
        for i, body in _guarded_loads(tuple(k.body)):
            ld = body[i]
            assert isinstance(ld, kir.LoadVec)
            if ld.buf == buf:
                zeros = {s.var for s in body[max(0, i - len(ld.dsts)):i]
                         if isinstance(s, kir.Assign) and s.expr == kir.Const(0.0)}
                out.append(zeros == set(ld.dsts))
    return out


def test_a_guarded_column_load_starts_from_zeros() -> None:
    assert _zeroed(_colsum(4096, 2304), "in0") == [True]


def test_a_row_load_starts_from_zeros_only_where_its_guard_can_be_false() -> None:
    persistent = _zeroed(_ln_backward(4096, 768), "in0")   # a persistent grid: 4096 rows over 264 blocks
    assert persistent and all(persistent)
    # 8 rows a block, 512 blocks: every row guard is the constant true, and its loads stay as they were
    g = float_graph({"x": [4096, 1024]}, [{"id": "m", "op": "reduce_max", "args": ["x"], "axes": [1],
                                          "keepdims": True}, {"id": "y", "op": "sub", "args": ["x", "m"]}], ["y"])
    exact = _zeroed(g, "in0")
    assert exact and not any(exact)


def test_a_column_sum_over_few_rows_puts_no_more_threads_down_them() -> None:
    """Llama's training ``view_65`` sums 4 rows of 1048576: with 8 threads down the rows, half the warps of
    every block had no row (24 KiB in flight per SM, under the 24.9 needed); 4 threads, 32 KiB (sm_90)."""
    g = _colsum(4, 1 << 20)
    plan = make_plan(g)
    s = heuristic_schedule(plan, DEV, legal_space(g, plan, DEV))
    assert s.tpr == 4 and s.split == 1, s.to_json()
    g8 = _colsum(4096, 2304)
    plan8 = make_plan(g8)
    assert heuristic_schedule(plan8, DEV, legal_space(g8, plan8, DEV)).tpr == 8


@pytest.mark.parametrize("shape", [(3, 4100), (5, 300)])
def test_few_row_column_sums_equal_the_reference(shape: tuple[int, int]) -> None:
    errs = _heuristic_errors(_colsum(*shape), seed=5)
    assert max(errs.values()) < 1e-5, errs


@pytest.mark.parametrize("shape", [(37, 20), (300, 44)])
def test_a_persistent_layer_norm_backward_still_equals_the_reference(shape: tuple[int, int]) -> None:
    errs = _heuristic_errors(_ln_backward(*shape), seed=2)
    assert max(errs.values()) < 1e-5, errs


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
@pytest.mark.parametrize("make,shape,loads", [(_colsum, (4096, 2304), 4), (_ln_backward, (4096, 768), 4),
                                              (_colsum, (4, 1 << 20), 1)])
def test_the_sweep_issues_its_loads_before_the_first_use(make, shape, loads) -> None:  # type: ignore[no-untyped-def]
    from stitchtune.analysis.audit import audit_graph
    from stitchtune.gpu.sass import find_cuobjdump
    from stitchtune.gpu.build import nvcc_found

    if not nvcc_found() or find_cuobjdump() is None:
        pytest.skip("needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump)")
    a = audit_graph(make(*shape), DEV, slice_blocks=1)
    (k,) = [k for k in a.kernels if k.name == "st_k0"]
    assert k.sass is not None and k.sass.max_loads_in_flight >= loads, k.sass
    assert k.in_flight_per_sm >= k.in_flight_needed, (k.in_flight_per_sm, k.in_flight_needed)


def _heuristic_errors(g: Graph, seed: int) -> dict[str, float]:
    """The emulated heuristic kernel's errors against the float64 reference on random inputs (``seed``)."""
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    inputs = random_inputs(g, seed)
    return emulated_errors(g, plan, space, heuristic_schedule(plan, DEV, space), inputs, run_reference(g, inputs))
