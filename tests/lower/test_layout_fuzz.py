"""Random regions of transposes, reshapes, broadcasts and one reduction stage: every one the planner
accepts lowers, for the heuristic and a sampled schedule, to kernels that the emulator runs without a
fault and that match the float64 reference; every one it refuses is refused in one line."""

from __future__ import annotations

import math
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.lowering import DEV, plan_or_refused, rel_err
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.lower.entry import lower
from stitchtune.space import SearchSpace


@st.composite
def _regions(draw) -> dict:
    shape = draw(st.lists(st.sampled_from([2, 3, 4, 8, 16]), min_size=2, max_size=3))
    nodes: list[dict] = []
    cur, cur_shape = "x", list(shape)
    inputs = {"x": {"shape": list(shape), "dtype": "float32"}}

    def add(node: dict, new_shape: list[int]) -> None:
        nonlocal cur, cur_shape
        nodes.append(node)
        cur, cur_shape = node["id"], new_shape

    for step in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["transpose", "reshape", "bcast"]))
        nid = f"n{len(nodes)}"
        if kind == "transpose" and len(cur_shape) > 1:
            perm = draw(st.permutations(range(len(cur_shape))))
            add({"id": nid, "op": "transpose", "args": [cur], "perm": list(perm)}, [cur_shape[p] for p in perm])
        elif kind == "reshape":
            k = draw(st.integers(0, len(cur_shape) - 1))
            d = cur_shape[k]
            if d in (4, 8, 16) and len(cur_shape) < 4:  # split
                f = 2
                new = cur_shape[:k] + [f, d // f] + cur_shape[k + 1:]
            elif k + 1 < len(cur_shape):  # merge with the next
                new = cur_shape[:k] + [d * cur_shape[k + 1]] + cur_shape[k + 2:]
            else:
                continue
            add({"id": nid, "op": "reshape", "args": [cur], "shape": new}, new)
        else:
            wshape = [s if draw(st.booleans()) else 1 for s in cur_shape]
            w = f"w{len(inputs)}"
            inputs[w] = {"shape": wshape, "dtype": "float32"}
            add({"id": nid, "op": draw(st.sampled_from(["add", "mul"])), "args": [cur, w]}, cur_shape)
    axes = sorted(draw(st.sets(st.integers(0, len(cur_shape) - 1), min_size=1, max_size=len(cur_shape))))
    op = draw(st.sampled_from(["reduce_sum", "reduce_max", "reduce_mean"]))
    nodes.append({"id": "s", "op": op, "args": [cur], "axes": axes, "keepdims": True})
    nodes.append({"id": "y", "op": "sub", "args": [cur, "s"]})
    outs = ["y"]
    if draw(st.booleans()) and len(cur_shape) > 1:
        perm = draw(st.permutations(range(len(cur_shape))))
        nodes.append({"id": "yt", "op": "transpose", "args": ["y"], "perm": list(perm)})
        outs = ["yt"]
    return {"name": "fz", "inputs": inputs, "nodes": nodes, "outputs": outs + ["s"]}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(_regions())
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
