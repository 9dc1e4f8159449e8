"""Cross reductions (reductions over the rows of a row-family plan): which graphs get them, of which
kind, and the graphs still refused, each with one line naming the node."""

from __future__ import annotations


import pytest

from helpers.common import EXAMPLES, FULL_EXAMPLES, SMALL_EXAMPLES
from helpers.lowering import channels_last_ln_backward
from stitchtune.errors import UnsupportedGraphError
from stitchtune.graph.parse import Graph, load_graph, parse_graph
from stitchtune.plan.planner import TensorClass, make_plan

CROSS_EXAMPLES = ("layernorm_backward", "layernorm_backward_bf16", "rmsnorm_backward", "cross_entropy",
                  "softmax_colsum", "mse_loss")


@pytest.mark.parametrize("name", CROSS_EXAMPLES)
@pytest.mark.parametrize("suffix", ["", "_small"])
def test_examples_plan_with_cross_reductions(name: str, suffix: str) -> None:
    g = load_graph(EXAMPLES / f"{name}{suffix}.json")
    p = make_plan(g)
    assert p.family == "row" and p.cross
    kinds = {c.node: c.kind for c in p.cross}
    for c in p.cross:
        assert c.node in g.outputs and c.node not in p.reductions
        want = TensorClass.PER_REDUCED if c.kind == "per_reduced" else TensorClass.SCALAR
        assert p.cls(c.node) is want
    if name.startswith("layernorm_backward"):
        assert kinds == {"dgamma": "per_reduced", "dbeta": "per_reduced"} and p.stages == (("m1", "m2"),)
    if name == "cross_entropy":
        (c,) = p.cross
        assert (c.kind, c.source_full, c.mean, c.count) == ("scalar", False, True, p.M)
    if name == "mse_loss":
        (c,) = p.cross
        assert (c.kind, c.source_full, c.count) == ("scalar", True, p.M * p.N) and p.stages == ()


def test_plans_without_cross_reductions_are_unchanged() -> None:
    """Every other example has no cross reduction (its plan is the one it always had: the kernel
    hash test pins the kernels)."""
    for path in FULL_EXAMPLES + SMALL_EXAMPLES:
        if not path.stem.removesuffix("_small") in CROSS_EXAMPLES:
            assert make_plan(load_graph(path)).cross == ()


def _graph(nodes: list[dict], outputs: list[str], inputs: dict | None = None) -> Graph:
    return parse_graph({"name": "g", "inputs": inputs or {"x": {"shape": [8, 16], "dtype": "float32"}},
                        "nodes": nodes, "outputs": outputs})


def _red(i: str, op: str, a: str, axes: list[int], keep: bool = True) -> dict:
    return {"id": i, "op": op, "args": [a], "axes": axes, "keepdims": keep}


@pytest.mark.parametrize("nodes,outputs,needle", [
    ([_red("t", "reduce_sum", "x", [0, 1]), {"id": "z", "op": "sub", "args": ["x", "t"]}], ["z"],
     "read by another node"),
    ([_red("m", "reduce_max", "x", [-1]), {"id": "y", "op": "sub", "args": ["x", "m"]},
      _red("c", "reduce_sum", "y", [0]), {"id": "z", "op": "mul", "args": ["c", 2.0]}], ["z"],
     "scalar epilogue"),
    ([_red("m", "reduce_max", "x", [-1]), {"id": "y", "op": "sub", "args": ["x", "m"]},
      _red("c", "reduce_sum", "y", [0]), {"id": "z", "op": "mul", "args": ["y", "c"]}], ["z"], "read by another node"),
    ([_red("c", "reduce_sum", "x", [0]), _red("t", "reduce_sum", "x", [0, 1])], ["c", "t"], "column-reduction"),
])
def test_refused_cross_reductions_name_the_node(nodes, outputs, needle) -> None:
    with pytest.raises(UnsupportedGraphError) as e:
        make_plan(_graph(nodes, outputs))
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


def test_column_sum_alone_stays_a_column_family_plan() -> None:
    p = make_plan(_graph([_red("c", "reduce_sum", "x", [0])], ["c"]))
    assert p.family == "col" and p.cross == ()


def test_partial_row_axes_are_refused() -> None:
    g = _graph([_red("m", "reduce_sum", "x", [-1]), {"id": "y", "op": "sub", "args": ["x", "m"]},
                _red("c", "reduce_sum", "y", [0], False)], ["y", "c"],
               {"x": {"shape": [4, 8, 16], "dtype": "float32"}})
    with pytest.raises(UnsupportedGraphError, match="reduces other axes|part of the row axes"):
        make_plan(g)


def test_max_and_min_over_every_axis_are_cross_reductions() -> None:
    p = make_plan(_graph([_red("m", "reduce_max", "x", [-1]), {"id": "y", "op": "sub", "args": ["x", "m"]},
                          _red("hi", "reduce_max", "y", [0, 1]), _red("lo", "reduce_min", "x", [0, 1])],
                         ["y", "hi", "lo"]))
    assert [(c.node, c.kind, c.combine) for c in p.cross] == [("hi", "scalar", "max"), ("lo", "scalar", "min")]
    assert p.epilogue == ()


def test_scalar_epilogue_reads_cross_reductions_after_the_combine() -> None:
    """``mean = sum(l) / sum(w)`` and ``loss = mean * -1``: the two sums are cross reductions (``s``
    is not an output: only the epilogue reads it), the division and the scaling the epilogue."""
    p = make_plan(_graph([_red("m", "reduce_max", "x", [-1]), {"id": "l", "op": "sub", "args": ["m", "w"]},
                          _red("s", "reduce_sum", "l", [0, 1]), _red("n", "reduce_sum", "w", [0, 1]),
                          {"id": "q", "op": "div", "args": ["s", "n"]},
                          {"id": "loss", "op": "mul", "args": ["q", -1.0]}], ["loss", "n"],
                         {"x": {"shape": [8, 16], "dtype": "float32"}, "w": {"shape": [8, 1], "dtype": "float32"}}))
    assert [(c.node, c.output) for c in p.cross] == [("s", False), ("n", True)]
    assert p.epilogue == ("q", "loss")
    assert p.cls("loss") is TensorClass.SCALAR


@pytest.mark.parametrize("grad", ["merged", "nchw"])
def test_channels_last_layer_norm_backward_is_one_row_plan(grad: str) -> None:
    """ConvNeXt's layer norm backward over ``[1, H, W, C]``: the gradient as a matmul's ``[H*W, C]``
    (a dim merged from two row axes) or a convolution's NCHW tensor (the default domain tensor, whose
    innermost axis is ``W``: the plan takes the layout of the NHWC output instead) gives one row plan
    with ``dgamma`` and ``dbeta`` as column sums."""
    p = make_plan(channels_last_ln_backward(4, 4, 32, grad))
    assert (p.family, p.M, p.N) == ("row", 16, 32)
    assert [(c.node, c.kind) for c in p.cross] == [("dgamma", "per_reduced"), ("dbeta", "per_reduced")]
    assert p.stages == (("s1", "s2"),)


def test_other_layouts_keep_the_default_refusal() -> None:
    """A graph no layout plans raises the default layout's refusal, naming its node."""
    g = _graph([_red("m", "reduce_sum", "x", [-1]), {"id": "y", "op": "sub", "args": ["x", "m"]},
                _red("c", "reduce_sum", "y", [0, 1], False), {"id": "z", "op": "mul", "args": ["y", "c"]}], ["z"],
               {"x": {"shape": [4, 8, 16], "dtype": "float32"}})
    with pytest.raises(UnsupportedGraphError, match="'c'"):
        make_plan(g)
