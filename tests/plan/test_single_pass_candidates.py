"""Single-pass candidates of the planner: the patterns it recognises (mean then variance, in mean and
sum forms; max then sum of exp(x - max)) and those it must leave alone (E[x^2] - E[x]^2, a variance of
another tensor, a sum of exp(x) without the max, column reductions)."""

from __future__ import annotations

import pytest

from stitchtune.graph.parse import parse_graph
from stitchtune.plan.planner import make_plan
from stitchtune.plan.single_pass import ONLINE_SOFTMAX, WELFORD

from helpers.lowering import setup


def _plan(nodes: list[dict], outputs: list[str], shape: list[int] = [8, 64]):  # noqa: B006
    return make_plan(parse_graph({"name": "t", "inputs": {"x": {"shape": shape, "dtype": "float32"},
                                                          "w": {"shape": shape, "dtype": "float32"}},
                                  "nodes": nodes, "outputs": outputs}))


def _red(i: str, op: str, a: str, axes: list[int] = [-1]) -> dict:  # noqa: B006
    return {"id": i, "op": op, "args": [a], "axes": axes, "keepdims": True}


def _var_nodes(mean: list[dict], sq: dict, second: str = "reduce_mean", mean_id: str = "m") -> list[dict]:
    return mean + [{"id": "d", "op": "sub", "args": ["x", mean_id]}, sq, _red("v", second, "sq"),
                   {"id": "y", "op": "mul", "args": ["d", "v"]}]


@pytest.mark.parametrize("example,kind,first,second", [
    ("layernorm_small.json", WELFORD, "mean", "var"), ("softmax_small.json", ONLINE_SOFTMAX, "m", "s"),
    ("masked_softmax_small.json", ONLINE_SOFTMAX, "m", "s"),
    ("embed_add_layernorm_small.json", WELFORD, "mean", "var")])
def test_examples_have_their_candidate(example: str, kind: str, first: str, second: str) -> None:
    _, plan, _ = setup(example)
    (c,) = plan.single_pass
    assert (c.kind, c.stage, c.first, c.second) == (kind, 0, first, second)


@pytest.mark.parametrize("example", ["rmsnorm_small.json", "bias_gelu_small.json", "colsum_sigmoid_scale_small.json"])
def test_examples_without_a_pair_have_none(example: str) -> None:
    assert setup(example)[1].single_pass == ()


@pytest.mark.parametrize("sq", [{"id": "sq", "op": "mul", "args": ["d", "d"]},
                                {"id": "sq", "op": "square", "args": ["d"]},
                                {"id": "sq", "op": "pow", "args": ["d", 2.0]}])
@pytest.mark.parametrize("second", ["reduce_mean", "reduce_sum"])
def test_variance_forms(sq: dict, second: str) -> None:
    (c,) = _plan(_var_nodes([_red("m", "reduce_mean", "x")], sq, second), ["y"]).single_pass
    assert c.kind == WELFORD and c.source == "x" and not c.first_is_sum and c.second_is_sum == (second == "reduce_sum")


@pytest.mark.parametrize("scale", [{"id": "m", "op": "mul", "args": ["t", 1.0 / 64]},
                                   {"id": "m", "op": "mul", "args": [1.0 / 64, "t"]},
                                   {"id": "m", "op": "div", "args": ["t", 64.0]}])
def test_mean_as_a_scaled_sum(scale: dict) -> None:
    (c,) = _plan(_var_nodes([_red("t", "reduce_sum", "x"), scale], {"id": "sq", "op": "mul", "args": ["d", "d"]}),
                 ["y"]).single_pass
    assert c.first == "t" and c.first_is_sum


def test_sum_scaled_by_the_wrong_length_is_not_a_mean() -> None:
    nodes = _var_nodes([_red("t", "reduce_sum", "x"), {"id": "m", "op": "mul", "args": ["t", 1.0 / 32]}],
                       {"id": "sq", "op": "mul", "args": ["d", "d"]})
    assert _plan(nodes, ["y"]).single_pass == ()


def test_naive_variance_is_not_rewritten() -> None:
    """E[x^2] - E[x]^2: both reductions are one stage; the planner records nothing to merge."""
    nodes = [_red("m", "reduce_mean", "x"), {"id": "xx", "op": "mul", "args": ["x", "x"]},
             _red("m2", "reduce_mean", "xx"), {"id": "mm", "op": "mul", "args": ["m", "m"]},
             {"id": "v", "op": "sub", "args": ["m2", "mm"]}, {"id": "y", "op": "mul", "args": ["x", "v"]}]
    plan = _plan(nodes, ["y"])
    assert plan.nstages == 1 and plan.single_pass == ()


def test_deviation_of_another_tensor_is_not_a_variance() -> None:
    nodes = [_red("m", "reduce_mean", "x"), {"id": "d", "op": "sub", "args": ["w", "m"]},
             {"id": "sq", "op": "mul", "args": ["d", "d"]}, _red("v", "reduce_mean", "sq"),
             {"id": "y", "op": "mul", "args": ["d", "v"]}]
    assert _plan(nodes, ["y"]).nstages == 2 and _plan(nodes, ["y"]).single_pass == ()


def test_product_of_two_deviations_is_not_a_variance() -> None:
    nodes = [_red("m", "reduce_mean", "x"), {"id": "d", "op": "sub", "args": ["x", "m"]},
             {"id": "d2", "op": "mul", "args": ["d", "w"]}, {"id": "sq", "op": "mul", "args": ["d", "d2"]},
             _red("v", "reduce_mean", "sq"), {"id": "y", "op": "mul", "args": ["d", "v"]}]
    assert _plan(nodes, ["y"]).single_pass == ()


def test_softmax_needs_exp_of_x_minus_max() -> None:
    base = [_red("m", "reduce_max", "x")]
    wrong = base + [{"id": "d", "op": "sub", "args": ["m", "x"]}, {"id": "e", "op": "exp", "args": ["d"]},
                    _red("s", "reduce_sum", "e"), {"id": "y", "op": "div", "args": ["e", "s"]}]
    assert _plan(wrong, ["y"]).single_pass == ()
    no_exp = base + [{"id": "d", "op": "sub", "args": ["x", "m"]}, _red("s", "reduce_sum", "d"),
                     {"id": "y", "op": "div", "args": ["d", "s"]}]
    assert _plan(no_exp, ["y"]).single_pass == ()


def test_column_reductions_have_no_candidates() -> None:
    nodes = [_red("m", "reduce_mean", "x", [0]), {"id": "d", "op": "sub", "args": ["x", "m"]},
             {"id": "sq", "op": "mul", "args": ["d", "d"]}, _red("v", "reduce_mean", "sq", [0]),
             {"id": "y", "op": "mul", "args": ["d", "v"]}]
    plan = _plan(nodes, ["y"])
    assert plan.family == "col" and plan.nstages == 2 and plan.single_pass == ()
