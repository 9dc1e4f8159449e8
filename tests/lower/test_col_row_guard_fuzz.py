"""Column sweeps with and without the row guard never read or write outside their buffers, whatever the shape
and schedule (review of CODEGEN_VERSION 7's ``rows_always_valid``): a hypothesis fuzz of column sums with a
stored elementwise output and a per-row input over row counts that do and do not split into whole chunks, through
the emulator (whose loads and stores are bounds-checked) against the float64 reference. Dynamic sizes never reach
the column sweep: a generic kernel refuses the column family (``lower.dynamic``), checked here too."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from helpers.lowering import DEV, emulated_errors, float_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.lower.guarded_loads import rows_always_valid
from stitchtune.lower.resources import legal_space
from stitchtune.plan.planner import make_plan
from stitchtune.space import Schedule


def _graph(m: int, n: int):
    nodes = [{"id": "a", "op": "mul", "args": ["x", "w"]}, {"id": "b", "op": "add", "args": ["a", 1.0]},
             {"id": "s", "op": "reduce_sum", "args": ["b"], "axes": [0], "keepdims": True}]
    return float_graph({"x": [m, n], "w": [m, 1]}, nodes, ["b", "s"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(split=st.sampled_from([1, 2, 3, 4, 8]), tpr=st.sampled_from([1, 2, 4, 8]), k=st.integers(1, 6),
       extra=st.sampled_from([0, 0, 1, 3]), n=st.sampled_from([32, 64, 96, 160]), seed=st.integers(0, 10_000))
def test_column_sweeps_stay_in_bounds_and_equal_the_reference(split: int, tpr: int, k: int, extra: int, n: int,
                                                               seed: int) -> None:
    m = split * tpr * k + extra      # whole chunks a sweep covers exactly (no row guard), or a short last chunk
    g = _graph(m, n)
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    s = space.sample(random.Random(seed))
    for change in ({"split": split, "tpr": tpr}, {"split": split}):   # the drawn shape where the space allows it
        cand = Schedule.from_dict({**s.to_dict(), **change})
        if not space.violations(cand):
            s = cand
            break
    chunk = -(-m // s.split)
    exact = rows_always_valid(m, s.split, chunk, -(-chunk // s.tpr), s.tpr, 1)
    event(f"whole chunks: {exact}")
    inputs = random_inputs(g, seed)
    errs = emulated_errors(g, plan, space, s, inputs, run_reference(g, inputs))
    assert max(errs.values()) < 1e-4, (m, n, s, errs)
