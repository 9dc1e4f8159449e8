"""The dynamic lowering reads the planner's refusal as a value (stitchtune.lower.dynamic asks
``plan_graph``): a refused plan is a ``DynamicRefusal("plan", ...)`` carrying the planner's reason word
for word, a graph the format refuses at the fit's extents is one too, and ``generic_profile`` answers
None where the planner refuses the graph at the extents asked."""

from __future__ import annotations

import pytest

from helpers.lowering import DEV
from stitchtune.cost.heuristic import generic_heuristic
from stitchtune.errors import GraphError
from stitchtune.graph.dynamic import DynamicRefusal
from stitchtune.lower import dynamic
from stitchtune.lower.dynamic import RowFit, fit_rows, generic_profile, lower_dynamic
from stitchtune.plan.refusal import Refusal
from stitchtune.space import SearchSpace
from test_generic_kernels import small


def _key(name: str):  # the widest bucket: seq symbolic
    dg = small(name)
    return dg, max(dg.keys(), key=lambda k: k.largest()["seq"])


def test_a_refused_plan_is_a_plan_refusal_with_the_planners_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    dg, key = _key("layernorm_seq")
    assert isinstance(fit_rows(dg, key), RowFit)   # planned as it is
    monkeypatch.setattr(dynamic, "plan_graph", lambda g: Refusal("tensor 'x' is refused (test)"))
    r = fit_rows(dg, key)
    assert r == DynamicRefusal("plan", f"the graph at {key.largest()} has no plan: tensor 'x' is refused (test)")


def test_a_refusal_at_a_fitting_extent_names_that_extent(monkeypatch: pytest.MonkeyPatch) -> None:
    dg, key = _key("layernorm_seq")
    rep = key.largest()
    real = dynamic.plan_graph
    monkeypatch.setattr(dynamic, "plan_graph", lambda g: real(g) if g.spec("x").shape[1] == rep["seq"]
                        else Refusal("no (test)"))   # x: [2, seq, 256]
    b = max(rep["seq"] // 2, key.buckets[0].lo)   # the second extent fitted: inside the bucket
    assert fit_rows(dg, key) == DynamicRefusal("plan", f"the graph at seq={b} has no plan: no (test)")


def test_a_graph_over_the_format_limits_at_a_fitting_extent_is_a_plan_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    dg, key = _key("layernorm_seq")
    rep = key.largest()["seq"]
    real = type(dg).at_unchecked

    def over(self, extents):  # noqa: ANN001 (the DynamicGraph method's signature)
        if extents["seq"] == rep:
            return real(self, extents)
        raise GraphError("a tensor over the format's limits (test)")

    monkeypatch.setattr(type(dg), "at_unchecked", over)
    assert fit_rows(dg, key) == DynamicRefusal(
        "plan", f"the graph at seq={max(rep // 2, key.buckets[0].lo)} has no plan: a tensor over the format's limits (test)")


def test_generic_profile_is_none_where_the_planner_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    dg, key = _key("layernorm_seq")
    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit)
    space = SearchSpace.for_plan(fit.plan, DEV)
    schedule = generic_heuristic(fit, DEV, space)
    prog = lower_dynamic(fit, schedule, DEV, space)
    assert not isinstance(prog, DynamicRefusal)
    ext = key.largest()
    assert generic_profile(fit, schedule, DEV, prog, ext) is not None
    monkeypatch.setattr(dynamic, "plan_graph", lambda g: Refusal("no (test)"))
    assert generic_profile(fit, schedule, DEV, prog, ext) is None
