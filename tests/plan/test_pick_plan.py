"""Planning ``gather_elements`` picks (one element per row along the kernel's column axis: cross
entropy's target logit) and the forms still refused, each with one line naming the node."""

from __future__ import annotations

import pytest

from helpers import ce_graph
from stitchtune.errors import UnsupportedGraphError
from stitchtune.graph.parse import parse_graph
from stitchtune.plan.planner import TensorClass, make_plan


def test_cross_entropy_is_one_row_plan_with_a_pick_and_an_epilogue() -> None:
    p = make_plan(ce_graph(outputs=("loss", "picked")))
    assert (p.family, p.M, p.N, p.stages) == ("row", 16, 1000, (("mx",), ("se",)))
    assert p.cls("picked") is TensorClass.PER_KEPT and p.cls("nll") is TensorClass.PER_KEPT
    assert [(c.node, c.kind, c.source_full, c.output) for c in p.cross] == [("total", "scalar", False, False)]
    assert p.epilogue == ("loss",)
    assert "logp" not in p.reuse_candidates  # the pick is a load per row, not a sweep


@pytest.mark.parametrize("kw,needle", [
    ({"idx_shape": [16, 2]}, "pick one element per row"),
    ({"idx_shape": [8, 1]}, "pick one element per row"),
    ({"idx_shape": [1, 1000], "axis": 0}, "pick one element per row"),
])
def test_other_gathers_along_an_axis_are_refused(kw, needle) -> None:
    with pytest.raises(UnsupportedGraphError) as e:
        make_plan(ce_graph(**kw))
    assert needle in str(e.value) and "'picked'" in str(e.value) and "\n" not in str(e.value)


def test_a_pick_from_a_reduction_result_is_refused() -> None:
    g = parse_graph({"name": "g", "inputs": {"x": {"shape": [4, 8, 16], "dtype": "float32"},
                                             "i": {"shape": [4, 1, 16], "dtype": "int32"}},
                     "nodes": [{"id": "p", "op": "gather_elements", "args": ["x", "i"], "axis": 1}],
                     "outputs": ["p"]})
    with pytest.raises(UnsupportedGraphError, match="gather_elements 'p'"):
        make_plan(g)


def test_int_arithmetic_next_to_a_pick_is_refused_naming_the_pick() -> None:
    """Int registers in a region with index ops are not lowered yet: the refusal names the index op,
    so that an importer can leave it out and keep the rest of the region."""
    g = parse_graph({"name": "g", "inputs": {"x": {"shape": [4, 8], "dtype": "float32"},
                                             "t": {"shape": [4, 1], "dtype": "int64"}},
                     "nodes": [{"id": "s", "op": "reduce_sum", "args": ["x"], "axes": [-1], "keepdims": True},
                               {"id": "p", "op": "gather_elements", "args": ["x", "t"], "axis": 1},
                               {"id": "ti", "op": "add", "args": ["t", 1]},
                               {"id": "tf", "op": "cast", "args": ["ti"], "to": "float32"},
                               {"id": "o", "op": "add", "args": ["p", "tf"]},
                               {"id": "y", "op": "add", "args": ["o", "s"]}],
                     "outputs": ["y"]})
    with pytest.raises(UnsupportedGraphError) as e:
        make_plan(g)
    assert str(e.value).startswith("gather_elements 'p' is in a region that computes with int values")
