"""A column sweep guards its rows (``r < ke``) only where a chunk can end inside the sweep (issue 39 item 4).

BERT train's ``view_47`` (the erf GELU backward and its column sum, 4096 x 3072; split 16 chunks of 256 rows, 8 row
threads x 32 iterations) guarded every row with ``r < ke`` although every row of every chunk is inside it. Under
its 72-register cap (``min_blocks`` 3, the grid pin) ptxas kept 5 of the unrolled rows' loads in flight (80 B per
thread, sm_90 SASS); without the guard 6 (96 B, 80 registers, no spills); under a 64-register cap 48 -> 64 B.
"""

from __future__ import annotations

from typing import Any

import pytest

from helpers.common import experiment_cases
from helpers.lowering import DEV, emulated_errors
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.ir import kir
from stitchtune.lower.entry import lower
from stitchtune.lower.guarded_loads import rows_always_valid
from stitchtune.lower.resources import legal_space
from stitchtune.plan.planner import make_plan
from stitchtune.space import Schedule


def erf_gelu_backward_colsum(m: int, n: int) -> Any:
    """dx = dy * gelu'(x) (erf form) and sum(dx, 0): BERT train's ``view_47``, the GPU experiments' own graph."""
    return experiment_cases().bert_gelu_backward_colsum(m, n)


def _row_guards(stmts: tuple[kir.Stmt, ...]) -> int:
    """Assignments of a validity that compares a row with the chunk's end ``ke``."""
    n = 0
    for s in stmts:
        if isinstance(s, kir.Assign) and s.var.name.startswith("v") and "ke" in repr(s.expr):
            n += 1
        if isinstance(s, kir.For):
            n += _row_guards(s.body)
        if isinstance(s, kir.If):
            n += _row_guards(s.then) + _row_guards(s.orelse)
    return n


def _program(m: int, n: int, **changes: Any) -> tuple[Any, Any, Any, Schedule]:
    g = erf_gelu_backward_colsum(m, n)
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    s = heuristic_schedule(plan, DEV, space)
    if changes:
        s = Schedule.from_dict({**s.to_dict(), **changes})
    return g, plan, space, s


def test_the_rule() -> None:
    assert rows_always_valid(4096, 16, 256, 32, 8, 1)
    assert not rows_always_valid(4000, 16, 250, 32, 8, 1)      # the last chunk is short
    assert not rows_always_valid(4096, 16, 256, 16, 8, 1)      # the sweep covers half the chunk (not a sweep)
    assert not rows_always_valid(4096, 16, 256, 33, 8, 1)      # it overshoots the chunk
    assert rows_always_valid(4096, 16, 256, 8, 8, 4)           # row vectors: 4 rows per iteration


def test_whole_chunks_sweep_without_a_row_guard() -> None:
    g, plan, space, s = _program(4096, 3072)
    assert (s.split, s.tpr, s.min_blocks) == (16, 8, 3)
    (k,) = lower(g, plan, s, DEV, space).kernels
    assert _row_guards(k.body) == 0


@pytest.mark.parametrize("m,split", [(200, 4), (256, 4), (250, 2), (264, 2)])
def test_a_chunk_that_can_end_inside_the_sweep_keeps_it_and_both_equal_the_reference(m: int, split: int) -> None:
    g, plan, space, s = _program(m, 384, split=split, tpr=8, block=256)
    assert not space.violations(s)
    (k, *_) = lower(g, plan, s, DEV, space).kernels
    chunk = -(-m // split)
    assert (_row_guards(k.body) == 0) == (m == split * chunk and chunk % 8 == 0)
    inputs = random_inputs(g, 0)
    errs = emulated_errors(g, plan, space, s, inputs, run_reference(g, inputs))
    assert max(errs.values()) < 1e-5, errs


@pytest.mark.slow
def test_the_unguarded_sweep_keeps_six_loads_in_flight_without_spilling() -> None:
    from stitchtune.analysis.audit import audit_graph
    from stitchtune.gpu.build import nvcc_found
    from stitchtune.gpu.sass import find_cuobjdump

    if not nvcc_found() or find_cuobjdump() is None:
        pytest.skip("needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump)")
    (k,) = audit_graph(erf_gelu_backward_colsum(4096, 3072), DEV, slice_blocks=1).kernels
    assert k.sass is not None and k.sass.spills == 0 and k.blocks_per_sm >= 3, (k.sass, k.problems)
    assert k.sass.max_bytes_in_flight >= 96, k.sass   # 80 with the row guard (sm_90, nvcc 13)
