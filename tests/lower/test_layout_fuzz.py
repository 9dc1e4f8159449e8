"""Random regions of transposes, reshapes, broadcasts and one reduction stage: every one the planner
accepts lowers, for the heuristic and a sampled schedule, to kernels that the emulator runs without a
fault and that match the float64 reference; every one it refuses is refused in one line."""

from __future__ import annotations

import math
import random

from hypothesis import HealthCheck, given, settings

from helpers.layouts import layout_regions
from helpers.lowering import DEV, plan_or_refused, rel_err
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.lower.entry import lower
from stitchtune.space import SearchSpace


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(layout_regions())
def test_random_layout_regions_emulate_like_the_reference(obj: dict) -> None:
    g, plan = plan_or_refused(obj)
    if plan is None:
        return
    assert plan.M * plan.N == max(math.prod(sp.shape) for sp in [s for _, s in g.inputs] + [n.spec for n in g.nodes])
    if plan.family == "col" and plan.P < 8:  # the column space needs 8 column threads: empty (known limit)
        return
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, 1)
    ref = run_reference(g, inputs)
    for s in (heuristic_schedule(plan, DEV, space), space.sample(random.Random(len(g.nodes)))):
        out = emulate_program(lower(g, plan, s, DEV, space), inputs, coresident_limit=lambda k: 1 << 30)
        for o in ref:
            assert rel_err(out[o], ref[o]) < 1e-5, (obj, s.to_json(), o)
