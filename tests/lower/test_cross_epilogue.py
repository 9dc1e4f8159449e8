"""Max / min cross reductions and the scalar epilogue (``stitchtune.lower.cross``): each deterministic
``cross_combine`` choice emulates correctly against the float64 reference (the epilogue after the
final combine, in the main kernel or the combine kernel), is bitwise equal across emulated block
orders, and the space refuses the float-atomic combine for them."""

from __future__ import annotations

import random

import numpy as np
import pytest

from helpers.lowering import DEV, float_graph, rel_err
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import Schedule, SearchSpace
from stitchtune.space.options import CROSS_COMBINE

ALL = lambda k: 1 << 30  # noqa: E731  (every grid co-resident)


def _red(i: str, op: str, a: str, axes: list[int]) -> dict:
    return {"id": i, "op": op, "args": [a], "axes": axes, "keepdims": True}


def _loss_graph(rows: int = 37, cols: int = 300):
    """A masked mean of a per-row loss: ``sum(l * w) / sum(w) * -1`` (a sum divided by a count that is
    itself a cross reduction), next to the max and min of the logits over every axis."""
    return float_graph({"x": [rows, cols], "w": [rows, 1]}, [
        _red("m", "reduce_max", "x", [-1]), {"id": "sh", "op": "sub", "args": ["x", "m"]},
        {"id": "e", "op": "exp", "args": ["sh"]}, _red("se", "reduce_sum", "e", [-1]),
        {"id": "ls", "op": "log", "args": ["se"]}, {"id": "lw", "op": "mul", "args": ["ls", "w"]},
        _red("s", "reduce_sum", "lw", [0, 1]), _red("n", "reduce_sum", "w", [0, 1]),
        {"id": "q", "op": "div", "args": ["s", "n"]}, {"id": "loss", "op": "mul", "args": ["q", -1.0]},
        _red("hi", "reduce_max", "x", [0, 1]), _red("lo", "reduce_min", "e", [0, 1])],
        ["loss", "hi", "lo"])


def _first_of(space: SearchSpace, mode: str, start: int = 0):
    for seed in range(start, start + 400):
        s = space.sample(random.Random(seed))
        if s.option(CROSS_COMBINE) == mode:
            return s
    raise AssertionError(f"no sampled schedule with cross_combine {mode}")


def _run(g, plan, space, s, inputs, seed: int | None = None) -> dict[str, np.ndarray]:
    return emulate_program(lower(g, plan, s, DEV, space), inputs, coresident_limit=ALL, block_order_seed=seed)


@pytest.mark.parametrize("rows,cols", [(37, 300), (4, 33)])
def test_epilogue_and_max_min_emulate_in_each_deterministic_combine(rows: int, cols: int) -> None:
    g = _loss_graph(rows, cols)
    plan = make_plan(g)
    assert plan.epilogue == ("q", "loss") and {c.combine for c in plan.cross} == {"+", "max", "min"}
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, 3)
    inputs["x"] = inputs["x"] - inputs["x"].max() - 0.5  # negative logits, positive exps: max / min combined from 0.0 would be wrong
    ref = run_reference(g, inputs)
    scheds = [heuristic_schedule(plan, DEV, space), _first_of(space, "grid"), _first_of(space, "kernel")]
    assert [s.option(CROSS_COMBINE) for s in scheds[1:]] == ["grid", "kernel"]
    for s in scheds:
        assert not space.violations(s), s.to_json()
        out = _run(g, plan, space, s, inputs)
        errs = {o: rel_err(out[o], ref[o]) for o in ref}
        assert max(errs.values()) < 1e-5, (s.to_json(), errs)
    assert float(ref["hi"].ravel()[0]) < 0 < float(ref["lo"].ravel()[0])


def test_epilogue_is_bitwise_equal_across_block_orders() -> None:
    g = _loss_graph()
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, 5)
    for mode in ("grid", "kernel"):
        s = _first_of(space, mode, start=40)
        o1, o2 = _run(g, plan, space, s, inputs, 1), _run(g, plan, space, s, inputs, 2)
        assert all(o1[k].tobytes() == o2[k].tobytes() for k in o1), (mode, s.to_json())


def test_atomic_combine_is_refused_for_max_min_and_the_epilogue() -> None:
    for outputs, nodes in ((["hi"], [_red("hi", "reduce_max", "x", [0, 1])]),
                           (["q"], [_red("s", "reduce_sum", "x", [0, 1]), {"id": "q", "op": "mul", "args": ["s", 0.5]}])):
        plan = make_plan(float_graph({"x": [8, 64]}, nodes, outputs))
        space = SearchSpace.for_plan(plan, DEV)
        s = _first_of(space, "grid")
        bad = Schedule.from_dict({**s.to_dict(), "cross_combine": "atomic"})
        assert any("atomic combine adds floats" in v for v in space.violations(bad)), space.violations(bad)
    # sums and means stored as they are keep the atomic choice
    plan = make_plan(float_graph({"x": [8, 64]}, [_red("s", "reduce_sum", "x", [0, 1])], ["s"]))
    assert _first_of(SearchSpace.for_plan(plan, DEV), "atomic").option(CROSS_COMBINE) == "atomic"
