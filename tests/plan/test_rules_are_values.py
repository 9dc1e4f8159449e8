"""The planner's rules answer values (issue 43 item 3): the surrogate, the layout rules of plan/chains.py
and the int rule return :class:`~stitchtune.plan.refusal.Refusal` values (no ``ask`` wrapper turns an
exception into one any more), with the messages ``make_plan`` raises; and the guard every test runs under
(``helpers.planning.refusals_stay_values``, autouse in tests/conftest.py) fails a rule that raises."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.common import FULL_EXAMPLES, SMALL_EXAMPLES
from helpers.lowering import float_graph
from helpers.planning import refusals_stay_values
from plan.test_refusals import _q_and_one_k
from stitchtune.errors import SeparateRegionsError, UnsupportedGraphError
from stitchtune.graph.parse import Graph, load_graph, parse_graph
from stitchtune.plan import chains, planner, remap
from stitchtune.plan.index_ops import aligned_shape, gather_shapes
from stitchtune.plan.planner import StitchPlan, make_plan, plan_graph
from stitchtune.plan.refusal import Refusal


def _fresh(graph: Graph) -> StitchPlan | Refusal:
    """``plan_graph(graph)`` planned now (not a remembered answer), under the guard."""
    planner._remembered.cache_clear()
    with refusals_stay_values():
        return plan_graph(graph)


def _raised(graph: Graph) -> UnsupportedGraphError:
    planner._remembered.cache_clear()
    with pytest.raises(UnsupportedGraphError) as exc:
        make_plan(graph)
    return exc.value


def _tail_read() -> Any:
    """A transpose of a computed slice read by an add: a layout tail that does not only make an output."""
    return float_graph({"x": [4, 8]}, [{"id": "s", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": 4},
                                       {"id": "n", "op": "neg", "args": ["s"]},
                                       {"id": "t", "op": "transpose", "args": ["n"], "perm": [1, 0]},
                                       {"id": "o", "op": "add", "args": ["t", 1.0]}], ["o"])


def _table_read() -> Any:
    """A gather table also read by a neg."""
    return parse_graph({"name": "g", "inputs": {"t": {"shape": [10, 16], "dtype": "float32"},
                                                "i": {"shape": [4], "dtype": "int32"}},
                        "nodes": [{"id": "e", "op": "gather", "args": ["t", "i"], "axis": 0},
                                  {"id": "n", "op": "neg", "args": ["t"]}],
                        "outputs": ["e", "n"]})


def _higher_rank() -> Any:
    """An output of a higher rank (and fewer elements) than the sliced tensor a reduction reads."""
    return float_graph({"x": [16, 16], "y": [1, 1, 8]},
                       [{"id": "s", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": 8},
                        {"id": "r", "op": "reduce_sum", "args": ["s"], "axes": [1]},
                        {"id": "y2", "op": "add", "args": ["y", 1.0]}], ["r", "y2"])


def test_the_layout_tail_rule_is_a_value() -> None:
    g = _tail_read()
    assert chains.layout_tails(g) == {"t"}   # (the fact: no refusal)
    got = chains.tails_refusal(g)
    assert got is not None and got.reason.startswith("node 't' (transpose / reshape) rearranges a tensor computed")
    assert remap.surrogate(g) == got == _fresh(g) and str(_raised(g)) == got.reason


def test_a_shared_slice_is_a_refusal_naming_the_heads_apart() -> None:
    g = _q_and_one_k()
    got = chains.tails_refusal(g)
    assert got is not None and got.apart == ("qh", "ksl") and remap.surrogate(g) == got == _fresh(g)
    err = _raised(g)
    assert isinstance(err, SeparateRegionsError) and err.apart == got.apart and str(err) == got.reason


def test_the_surrogate_rules_are_values() -> None:
    g = _table_read()
    got = remap.surrogate(g)
    assert got == Refusal("node 'n' reads gather table 't'; a gather table may only be read by gather")
    assert gather_shapes(g, (4, 16)) == got == _fresh(g) and str(_raised(g)) == got.reason
    h = _higher_rank()
    got = remap.surrogate(h)
    assert isinstance(got, Refusal) and "has a higher rank than the iteration domain" in got.reason
    assert _fresh(h) == got and str(_raised(h)) == got.reason
    assert aligned_shape((1, 1, 8), (16, 8), "y") == Refusal("tensor 'y' [1, 1, 8] has a higher rank than the "
                                                             "iteration domain [16, 8]")
    assert aligned_shape((1, 8), (16, 8), "y") == (1, 8)


def test_the_int_rule_answers_the_domain_refusal() -> None:
    """``int_index_op`` asks for the chains only where an int tensor is a layout node (``yt``, beside
    the index ops): a layout tail read by an op refuses them, the value it answers."""
    g = parse_graph({"name": "g", "inputs": {"x": {"shape": [4, 8], "dtype": "float32"},
                                             "y": {"shape": [8, 4], "dtype": "int32"}},
                     "nodes": [{"id": "s", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": 4},
                               {"id": "n", "op": "neg", "args": ["s"]},
                               {"id": "t", "op": "transpose", "args": ["n"], "perm": [1, 0]},
                               {"id": "o", "op": "add", "args": ["t", 1.0]},
                               {"id": "yt", "op": "transpose", "args": ["y"], "perm": [1, 0]}],
                     "outputs": ["o", "yt"]})
    assert remap.int_index_op(g, frozenset()) is None
    got = remap.int_index_op(g, frozenset({"yt"}))
    assert isinstance(got, Refusal) and got == chains.domain_refusal(g) == chains.tails_refusal(g)
    assert _fresh(g) == got


def test_no_rule_raises_over_every_example() -> None:
    """Every example planned afresh under the guard: a plan, and nothing raised inside the pipeline."""
    for path in (*SMALL_EXAMPLES, *FULL_EXAMPLES):
        assert isinstance(_fresh(load_graph(path)), StitchPlan), path.name


def test_the_guard_fails_a_rule_that_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard can fail: a surrogate that raises (as the rules did behind ``ask``) fails the test."""
    def raising(graph: Graph) -> Graph:
        raise UnsupportedGraphError("a rule that raises")

    monkeypatch.setattr(remap, "surrogate", raising)
    with pytest.raises(pytest.fail.Exception, match="a planner rule raised UnsupportedGraphError"):
        _fresh(_tail_read())
    planner._remembered.cache_clear()
