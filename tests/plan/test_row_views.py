"""Rows rearranged before a slice / concat and viewed again after it (stitchtune/plan/row_views.py, Swin's roll
back after attention): the rewritten graph computes exactly what the given graph computes (float64 reference,
same inputs and outputs), each graph the rewrite does not apply to is returned as it is, and random window
reverses, rolls and row-local computations plan and emulate like the reference."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from stitchtune.graph.node_lists import layernorm_rows
from helpers.lowering import check_emulates, float_graph as _graph
from stitchtune.errors import UnsupportedGraphError
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.plan.planner import make_plan
from stitchtune.plan.row_views import commute_row_views

from lower.test_layout_index_mixes import rolled_back, rolled_layernorm, shifted_windows  # the Swin graphs


def _same_values(g: Any, h: Any) -> None:
    assert (g.input_names, g.outputs) == (h.input_names, h.outputs)
    inputs = random_inputs(g, 3)
    want, got = run_reference(g, inputs), run_reference(h, inputs)
    for o in g.outputs:
        assert want[o].shape == got[o].shape and np.array_equal(want[o], got[o]), o


def test_the_bias_moves_after_the_reverse_and_the_layernorm_into_the_rows_layout() -> None:
    g = rolled_back()
    h = commute_row_views(g)
    nodes = {nd.id: nd for nd in h.nodes}
    assert nodes["wv"].args == ("p",) and nodes["x"].op == "add"   # the reverse of p alone, then + pb
    assert set(nodes["x"].args) == {"x_rows", "pb"} and nodes["x_rows"].op == "reshape"
    assert "tv" not in nodes                                         # the tokens view is gone ...
    assert nodes["y_rows"].op == "reshape" and nodes["y_rows"].shape == (1, 8, 8, 8)   # ... y is viewed as rows
    assert nodes["m"].shape == (1, 8, 8, 1) and nodes["m"].axes == (3,)
    for o in g.outputs:   # made in the rows' layout, reshaped back under their own ids
        assert nodes[o].op == "reshape" and nodes[o].shape == (1, 64, 8)
    _same_values(g, h)


def test_graphs_the_rewrite_does_not_apply_to_are_returned_as_they_are() -> None:
    cases = {"no index op": _graph({"x": [4, 8], "g": [8], "b": [8]}, layernorm_rows("x"), ["xb"]),
             "the roll of an input": shifted_windows(),
             "a LayerNorm before the roll (row_moves)": rolled_layernorm()}
    body = rolled_back(bias=False).to_dict()   # a statistic over the tokens after the view: not row-local
    body["nodes"] = [dict(n, axes=[1]) if n["id"] == "m" else n for n in body["nodes"]]
    cases["a mean over the tokens"] = _graph({k: v["shape"] for k, v in body["inputs"].items()}, body["nodes"],
                                             body["outputs"])
    for why, g in cases.items():
        assert commute_row_views(g) is g, why


def test_a_full_size_sum_before_the_reverse_stays_refused() -> None:
    body = rolled_back().to_dict()
    body["inputs"]["pb"]["shape"] = [4, 16, 8]   # p + a full-size tensor: the reverse reads a computed tensor
    g = _graph({k: v["shape"] for k, v in body["inputs"].items()}, body["nodes"], body["outputs"])
    with pytest.raises(UnsupportedGraphError, match="node 'tv' .* rearranges a tensor computed") as e:   # the given graph's
        make_plan(g)
    assert "\n" not in str(e.value)


def _random_case(seed: int) -> Any:
    """A window reverse of ``p`` ``[nW, w*w, C]`` (maybe plus a bias), a roll back along H (and maybe W), the
    tokens view, maybe a residual sum, a max- or mean-centred row times a weight (maybe its exp); the
    centred value and maybe the residual sum outputs."""
    rnd = random.Random(seed)
    w, nh, nw, C = rnd.choice([2, 4]), rnd.choice([1, 2]), rnd.choice([1, 2, 3]), rnd.choice([4, 8])
    H, W = nh * w, nw * w
    inputs: dict[str, list[int]] = {"p": [nh * nw, w * w, C], "g": [C]}
    nodes: list[dict[str, Any]] = []
    src = "p"
    if rnd.random() < 0.6:
        inputs["pb"] = [C]
        nodes.append({"id": "pa", "op": rnd.choice(["add", "mul"]), "args": ["p", "pb"]})
        src = "pa"
    nodes += [{"id": "wv", "op": "reshape", "args": [src], "shape": [1, nh, nw, w, w, C]},
              {"id": "wt", "op": "transpose", "args": ["wv"], "perm": [0, 1, 3, 2, 4, 5]},
              {"id": "r0", "op": "reshape", "args": ["wt"], "shape": [1, H, W, C]}]
    top = "r0"
    for k, (axis, n) in enumerate([(1, H), (2, W)][:rnd.choice([1, 2])]):
        s = rnd.randrange(1, n)
        nodes += [{"id": f"a{k}", "op": "slice", "args": [top], "axis": axis, "start": n - s, "stop": n},
                  {"id": f"b{k}", "op": "slice", "args": [top], "axis": axis, "start": 0, "stop": n - s},
                  {"id": f"r{k + 1}", "op": "concat", "args": [f"a{k}", f"b{k}"], "axis": axis}]
        top = f"r{k + 1}"
    nodes.append({"id": "tv", "op": "reshape", "args": [top], "shape": [1, H * W, C]})
    res, outputs = "tv", []
    if rnd.random() < 0.6:
        inputs["y"] = [1, H * W, C]
        nodes.append({"id": "res", "op": "add", "args": ["y", "tv"]})
        res = "res"
        outputs += ["res"] if rnd.random() < 0.5 else []
    nodes += [{"id": "m", "op": rnd.choice(["reduce_mean", "reduce_max"]), "args": [res], "axes": [-1], "keepdims": True},
              {"id": "d", "op": "sub", "args": [res, "m"]},
              {"id": "o", "op": "mul", "args": ["d", "g"]}]
    if rnd.random() < 0.4:
        nodes.append({"id": "e", "op": "exp", "args": ["o"]})
    return _graph(inputs, nodes, [nodes[-1]["id"]] + outputs)


@pytest.mark.parametrize("seed", range(6))
def test_random_roll_backs_plan_and_emulate_like_the_reference(seed: int) -> None:
    g = _random_case(seed)
    _same_values(g, commute_row_views(g))
    plan = make_plan(g)
    assert plan.family == "row" and plan.moved_rows, seed
    check_emulates(g, 1, seed)
