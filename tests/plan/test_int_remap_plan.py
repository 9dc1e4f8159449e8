"""Int registers beside slice / concat: positions computed from ``iota`` apart from the index ops plan
(rotary's angles next to rotate_half); int values computed from an index op's result, or int inputs,
next to one stay refused naming the index op."""

from __future__ import annotations

import pytest

from helpers.graphs import rotary_positions_graph
from stitchtune.errors import UnsupportedGraphError
from stitchtune.plan.planner import TensorClass, make_plan


def test_iota_positions_beside_rotate_half_plan_with_their_own_axes() -> None:
    p = make_plan(rotary_positions_graph(batch=2, seq=8, dim=16))
    assert (p.family, p.M, p.N) == ("elementwise", 16, 16)
    # the iota [8, 1] indexes the domain's sequence axis (not a scalar): one value per (batch, seq) row
    for name in ("pos", "p1", "pf"):
        assert p.cls(name) is not TensorClass.SCALAR, name
        m = dict(p.index_maps)[name]
        assert [f.dim for f in m.rows.factors] == [8] and m.size == 8, (name, m)


def test_int_values_computed_from_a_slice_stay_refused() -> None:
    with pytest.raises(UnsupportedGraphError) as e:
        make_plan(rotary_positions_graph(from_slice=True))
    assert str(e.value).startswith("slice 'x0' is in a region that computes with int values")
