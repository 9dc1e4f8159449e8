"""Planning ``gather_elements`` picks (one element per row along the kernel's column axis: cross
entropy's target logit) and the forms still refused, each with one line naming the node."""

from __future__ import annotations

import pytest

from helpers.graphs import ce_graph, ce_ignore_graph, int_next_to_pick_graph
from helpers.lowering import check_emulates
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


def test_int_arithmetic_next_to_a_pick_plans() -> None:
    """Int registers beside a pick read by input index: one row plan (the int values are per-row)."""
    g = int_next_to_pick_graph(4, 8)
    p = make_plan(g)
    assert (p.family, p.M, p.N) == ("row", 4, 8) and p.cls("ti") is TensorClass.PER_KEPT


def test_cross_entropy_with_ignore_index_is_one_row_plan() -> None:
    """The pick's index computed in the region, the mask's count and the masked sum as two cross
    reductions, their quotient the scalar epilogue."""
    p = make_plan(ce_ignore_graph())
    assert (p.family, p.M, p.N, p.stages) == ("row", 16, 100, (("mx",), ("se",)))
    assert p.cls("tc") is TensorClass.PER_KEPT and p.cls("valid") is TensorClass.PER_KEPT
    assert [(c.node, c.source, c.kind, c.source_full, c.output) for c in p.cross] == [
        ("total", "nz", "scalar", False, False), ("cnt", "valid", "scalar", False, False)]
    assert p.epilogue == ("loss",)


def test_a_slice_next_to_int_arithmetic_of_an_int_input_plans() -> None:
    """Int arithmetic of an int input beside a slice (not under it) is the sweep's own, in int
    registers (was refused: ``slice 'sl' is in a region that computes with int values``), and
    emulates equal to the reference."""
    g = parse_graph({"name": "g", "inputs": {"x": {"shape": [4, 8], "dtype": "float32"},
                                             "t": {"shape": [4, 1], "dtype": "int64"}},
                     "nodes": [{"id": "sl", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": 4},
                               {"id": "ti", "op": "add", "args": ["t", 1]},
                               {"id": "tf", "op": "cast", "args": ["ti"], "to": "float32"},
                               {"id": "y", "op": "add", "args": ["sl", "tf"]}],
                     "outputs": ["y"]})
    p = make_plan(g)
    assert (p.family, p.M, p.N) == ("elementwise", 4, 4)
    assert p.cls("ti") is TensorClass.PER_KEPT
    check_emulates(g)


def test_a_pick_index_viewed_without_int_arithmetic_is_refused() -> None:
    """A computed index that is no int register (a reshape of an int input) names the pick."""
    g = parse_graph({"name": "g", "inputs": {"x": {"shape": [4, 8], "dtype": "float32"},
                                             "t": {"shape": [4], "dtype": "int64"}},
                     "nodes": [{"id": "t2", "op": "reshape", "args": ["t"], "shape": [4, 1]},
                               {"id": "p", "op": "gather_elements", "args": ["x", "t2"], "axis": 1}],
                     "outputs": ["p"]})
    with pytest.raises(UnsupportedGraphError) as e:
        make_plan(g)
    assert "gather_elements 'p'" in str(e.value) and "'t2'" in str(e.value) and "\n" not in str(e.value)


def test_the_pick_checks_return_refusals_and_the_lowering_form_raises() -> None:
    """``check_picks`` / ``check_gathers`` / ``pick_refusal`` state a refusal as a value (the message
    make_plan raises); ``pick_leaves`` (the lowering's form, after planning) raises that message."""
    from stitchtune.plan.pick import check_picks, pick_leaves, pick_refusal
    from stitchtune.plan.refusal import Refusal
    from stitchtune.plan.view_checks import check_gathers

    bad = ce_graph(idx_shape=[16, 2])
    with pytest.raises(UnsupportedGraphError) as e:
        make_plan(bad)
    domain, cols = (16, 1000), (1,)
    node = next(n for n in bad.nodes if n.op == "gather_elements")
    for refused in (check_picks(bad, domain, cols), check_gathers(bad, domain, cols, "row"),
                    pick_refusal(bad, node, domain)):
        assert refused == Refusal(str(e.value))
    with pytest.raises(UnsupportedGraphError, match="pick one element per row"):
        pick_leaves(bad, node, domain)
    good = ce_graph(outputs=("loss", "picked"))
    pick = next(n for n in good.nodes if n.op == "gather_elements")
    assert check_picks(good, domain, cols) is None and check_gathers(good, domain, cols, "row") is None
    assert pick_refusal(good, pick, domain) is None and pick_leaves(good, pick, domain)[1]
    assert check_picks(good, domain, (0,)) == Refusal(str(e.value).replace("'picked'", f"'{pick.id}'"))
