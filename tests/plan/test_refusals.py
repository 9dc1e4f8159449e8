"""The planner as a pipeline (issue 43 item 3): its stages answer :class:`~stitchtune.plan.refusal.Refusal`
values, :func:`~stitchtune.plan.planner.plan_graph` returns one, only :func:`make_plan` raises (the same
exception and message), a graph with index ops is analysed through its named :class:`Surrogate`, and
equal graphs get one answer."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.lowering import float_graph as _graph
from lower.test_fused_qkv_rotary import _heads, _rot, fused_q, fused_q_and_k
from stitchtune.errors import GraphError, SeparateRegionsError, UnsupportedGraphError
from stitchtune.graph.parse import Graph, load_graph
from stitchtune.plan.planner import StitchPlan, make_plan, plan_graph
from stitchtune.plan.refusal import Refusal, rewritten
from stitchtune.plan.views import Surrogate

B, S, H, D = 2, 4, 2, 8


def _q_and_one_k() -> Any:
    """q's 2 heads and k's 1 head sliced from one input in one region (they belong in two)."""
    nodes = _heads(0, H, B, S, D, "q") + _rot("qh", D, "r") + _heads(H * D, 1, B, S, D, "k") + _rot("kh", D, "p")
    return _graph({"qkv": [B, S, (H + 2) * D], "cos": [S, D], "sin": [S, D]}, nodes, ["rout", "pout"])


def _broadcast_output() -> Any:
    """A per-row value broadcast along part of the row axes as an output: refused by the check stage."""
    return _graph({"x": [2, 3, 8], "p": [2, 1, 1]},
                  [{"id": "y", "op": "mul", "args": ["x", "p"]},
                   {"id": "q", "op": "mul", "args": ["p", 2.0]}],
                  ["y", "q"])


def test_a_refusal_naming_nodes_apart_is_a_value_and_make_plan_raises_it() -> None:
    g = _q_and_one_k()
    got = plan_graph(g)
    assert isinstance(got, Refusal)
    assert got.apart == ("qh", "ksl")
    assert got.reason.startswith("node 'qh' ") and "'ksl' also read" in got.reason
    with pytest.raises(SeparateRegionsError) as exc:
        make_plan(g)
    assert str(exc.value) == got.reason and exc.value.apart == got.apart


def test_a_plain_refusal_has_nothing_apart_and_raises_unsupported() -> None:
    nodes = [{"id": "sl", "op": "slice", "args": ["qkv"], "axis": -1, "start": 0, "stop": H * D},
             {"id": "hv", "op": "reshape", "args": ["sl"], "shape": [B, S, H, D]},
             {"id": "sq", "op": "mul", "args": ["hv", "hv"]},
             {"id": "ms", "op": "reduce_mean", "args": ["sq"], "axes": [-1], "keepdims": True},
             {"id": "nn", "op": "mul", "args": ["hv", "ms"]},
             {"id": "qh", "op": "transpose", "args": ["nn"], "perm": [0, 2, 1, 3]}] + _rot("qh", D, "r")
    g = _graph({"qkv": [B, S, 4 * D], "cos": [S, D], "sin": [S, D]}, nodes, ["rout"])
    got = plan_graph(g)
    assert isinstance(got, Refusal) and got.apart == ()
    assert "node 'hv'" in got.reason and "is read by 'sq'" in got.reason
    with pytest.raises(UnsupportedGraphError) as exc:
        make_plan(g)
    assert type(exc.value) is UnsupportedGraphError and str(exc.value) == got.reason


def test_the_check_stage_refuses_a_partially_broadcast_output() -> None:
    got = plan_graph(_broadcast_output())
    assert got == Refusal("output 'q' [2, 1, 1] broadcasts along part of the axes of the iteration domain "
                          "[2, 3, 8] (of the columns, or of the rows of a per-row value); stitched kernels store "
                          "full, per-row, per-column and scalar outputs, and full ones broadcast along row axes only")


def test_every_example_plans_through_the_value_path() -> None:
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.json")):
        got = plan_graph(load_graph(path))
        assert isinstance(got, StitchPlan), (path.name, got)


def test_equal_graphs_get_one_answer() -> None:
    g = fused_q()
    again = Graph.from_dict(g.to_dict())
    assert again == g and again is not g
    assert plan_graph(again) is plan_graph(g)
    r = _q_and_one_k()
    assert plan_graph(Graph.from_dict(r.to_dict())) == plan_graph(r)


def test_graphs_equal_but_for_a_zero_sign_get_their_own_plans() -> None:
    """``0.0 == -0.0`` makes the graphs equal, but a plan carries a rewritten graph with its constants."""
    def graph(zero: float) -> Any:
        return _graph({"x": [4, 1]}, [{"id": "d", "op": "div", "args": ["x", zero]},
                                      {"id": "m", "op": "reduce_max", "args": ["d"], "axes": [-1], "keepdims": True},
                                      {"id": "o", "op": "sub", "args": ["d", "m"]}], ["o"])

    pos, neg = graph(0.0), graph(-0.0)
    assert pos == neg
    p, n = plan_graph(pos), plan_graph(neg)
    assert isinstance(p, StitchPlan) and isinstance(n, StitchPlan) and p is not n
    assert p.moved_graph is not None and n.moved_graph is not None   # (the unit reduction's rewrite)
    assert repr(n.planned_graph(neg).nodes[0].args[1]) == "-0.0"


def test_the_surrogate_is_named() -> None:
    plain = _broadcast_output()
    assert Surrogate.of(plain) is None                    # no index ops: analysed as it is
    g = fused_q_and_k()
    sur = Surrogate.of(g)
    assert isinstance(sur, Surrogate)
    assert sur.real is g and sur.graph is not g and sur.graph.outputs == g.outputs
    assert {n.op for n in sur.graph.nodes} .isdisjoint({"slice", "concat", "gather"})
    from stitchtune.plan import chains   # the region facts, decided once with the surrogate
    assert (sur.mixed, sur.domain, sur.keep, sur.chained) == (
        chains.mixed_layout(g), chains.domain_of(g), frozenset(chains.layout_part(g)), frozenset(chains.chain_members(g)))
    assert sur.domain == (2, 2, 4, 8) and "qkv" in sur.chained
    refused = Surrogate.of(_q_and_one_k())               # its chains refuse: the value, not an exception
    assert isinstance(refused, Refusal) and refused.apart == ("qh", "ksl")


def test_a_refusal_raises_its_exception() -> None:
    err = Refusal("keep apart", ("a", "b")).error()
    assert isinstance(err, SeparateRegionsError) and err.apart == ("a", "b") and str(err) == "keep apart"
    assert type(Refusal("no").error()) is UnsupportedGraphError
    assert Refusal.of(err) == Refusal("keep apart", ("a", "b")) and Refusal.of(UnsupportedGraphError("no")) == Refusal("no")


def test_a_rewrite_over_the_format_limits_is_a_refusal() -> None:
    def too_big(graph: Graph) -> Graph:
        raise GraphError("nodes: too many nodes (limit 4096)")

    g = fused_q()
    assert rewritten(too_big, g) == Refusal("nodes: too many nodes (limit 4096)")
    assert rewritten(lambda x: x, g) is g


def test_a_mixed_regions_view_check_is_a_value() -> None:
    """``check_mixed`` (plan/view_checks.py) answers a :class:`Refusal`, not an exception: a gather
    beside a transpose, the message ``make_plan`` raises."""
    from stitchtune.graph.parse import parse_graph
    from stitchtune.plan.chains import domain_of
    from stitchtune.plan.remap import surrogate
    from stitchtune.plan.view_checks import check_mixed

    g = parse_graph({"name": "g", "inputs": {"t": {"shape": [10, 16], "dtype": "float32"},
                                             "i": {"shape": [4], "dtype": "int32"},
                                             "y": {"shape": [16, 4], "dtype": "float32"}},
                     "nodes": [{"id": "e", "op": "gather", "args": ["t", "i"], "axis": 0},
                               {"id": "yt", "op": "transpose", "args": ["y"], "perm": [1, 0]},
                               {"id": "o", "op": "add", "args": ["e", "yt"]}],
                     "outputs": ["o"]})
    with pytest.raises(UnsupportedGraphError) as e:
        make_plan(g)
    assert "gather 'e' is in a region with transpose / reshape" in str(e.value)
    sur = surrogate(g)
    assert isinstance(sur, Graph)
    assert check_mixed(g, sur, domain_of(g), (1,), (1,), "elementwise") == Refusal(str(e.value))
    assert plan_graph(g) == Refusal(str(e.value))


def test_the_remap_walk_and_its_bounds_proofs_are_values() -> None:
    """``check_remaps`` answers the walk's first :class:`Refusal` (a size-1 slice broadcast along the
    columns), the message ``make_plan`` raises; the bounds proofs of plan/shift.py answer values and
    their raising forms for the lowering (``shift_offset``, ``column_shift``, ``check_size1_slice``)
    raise the same message."""
    from stitchtune.graph.parse import parse_graph
    from stitchtune.plan.remap import check_remaps
    from stitchtune.plan.shift import (Shift, check_size1_slice, column_offset, column_shift, offset_of,
                                       shift_offset, size1_slice_refusal)

    g = parse_graph({"name": "g", "inputs": {"x": {"shape": [4, 8], "dtype": "float32"}},
                     "nodes": [{"id": "s", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": 1},
                               {"id": "o", "op": "add", "args": ["x", "s"]}],
                     "outputs": ["o"]})
    with pytest.raises(UnsupportedGraphError) as e:
        make_plan(g)
    assert "slice 's' has size 1" in str(e.value)
    assert check_remaps(g, (4, 8), (0,), {"x": True, "s": False, "o": True}) == Refusal(str(e.value))
    one = Shift().limited(1, 0, 1, 8)   # evaluated at one column only: not a broadcast
    assert one is not None and size1_slice_refusal(g.nodes[0], one, (4, 8)) is None
    check_size1_slice(g.nodes[0], one, (4, 8))
    with pytest.raises(UnsupportedGraphError, match="slice 's' has size 1"):
        check_size1_slice(g.nodes[0], Shift(), (4, 8))
    assert size1_slice_refusal(g.nodes[0], Shift(), (4, 8)) == Refusal(str(e.value))

    out = Shift().moved(1, 3)   # columns [3, 11) of an 8-wide tensor
    refused = offset_of("x", (4, 8), out, (4, 8))
    assert isinstance(refused, Refusal) and "positions [3, 11) along axis 1" in refused.reason
    with pytest.raises(UnsupportedGraphError) as raised:
        shift_offset("x", (4, 8), out, (4, 8))
    assert str(raised.value) == refused.reason
    inside = out.limited(1, 0, 5, 8)
    assert inside is not None and offset_of("x", (4, 8), inside, (4, 8)) == shift_offset("x", (4, 8), inside, (4, 8)) == 3
    col = column_offset("x", out, (4, 8))
    assert isinstance(col, Refusal) and "along the innermost axis" in col.reason
    with pytest.raises(UnsupportedGraphError, match="along the innermost axis"):
        column_shift("x", out, (4, 8))
    assert column_offset("x", out, (4, 8), width=11) == column_shift("x", out, (4, 8), width=11) == 3
    assert isinstance(column_offset("x", Shift().moved(0, 1), (4, 8)), Refusal)


@pytest.mark.parametrize(("shape", "want"), [
    ((4, 8), None),                      # the domain itself
    ((1, 8), None),                      # broadcast along the rows, right-aligned
    ((8,), None),                        # a lower rank, right-aligned
    ((4, 1), None),
    ((2, 8), "tensor 't' [2, 8] is read here"),   # a dim neither 1 nor the domain's
    ((3, 4, 8), "tensor 't' [3, 4, 8] has a higher rank than the iteration domain [4, 8]"),
])
def test_align_refusal_names_the_tensor_and_why(shape: tuple[int, ...], want: str | None) -> None:
    """The one helper both alignment refusals (chains' layout part, remap's stored / reduced roots) use."""
    from stitchtune.plan.index_ops import align_refusal

    got = align_refusal(shape, (4, 8), "t", "is read here")
    assert (None if got is None else got.reason) == want
