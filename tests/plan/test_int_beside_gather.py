"""Int arithmetic on runtime values beside slice / concat / gather (:func:`stitchtune.plan.remap.int_index_op`).

Int values the sweep computes itself (an ``iota`` counter, int inputs, the ``uniform`` draw of
dropout) plan next to index ops and are emulated equal to the numpy reference; int values a remapped
evaluation would read at a moved position (under a slice / concat), an index op's int result, and
int values computed from an index op's result stay refused, naming the index op."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.graphs import embedding_dropout_graph
from helpers.lowering import DEV
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.errors import UnsupportedGraphError
from stitchtune.graph.parse import INT_DTYPES, parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

S, H = 8, 32   # embedding_dropout_graph's sequence and hidden sizes


def _emulate_all(g: Any, inputs: dict[str, np.ndarray], n_samples: int = 2) -> None:
    """The heuristic schedule and ``n_samples`` seeded samples emulate ``g`` on ``inputs``: bool and
    int outputs equal to the reference, float ones within 1e-5 (relative L2)."""
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    ref = run_reference(g, inputs)
    for s in [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(n_samples)]:
        out = emulate_program(lower(g, plan, s, DEV, space), inputs, coresident_limit=lambda k: 1 << 30)
        for o in g.outputs:
            want = np.asarray(ref[o])
            got = np.asarray(out[o]).reshape(want.shape)
            if g.spec(o).dtype == "bool" or g.spec(o).dtype in INT_DTYPES:
                np.testing.assert_array_equal(got.astype(want.dtype), want, err_msg=f"{o} {s.to_json()}")
            else:
                err = float(np.linalg.norm(got.astype(np.float64) - want)) / max(float(np.linalg.norm(want)), 1e-30)
                assert err < 1e-5, (o, s.to_json(), err)


def test_dropout_drawn_beside_the_embedding_gathers_plans_as_one_row_kernel() -> None:
    """BERT's embedding dropout (was refused: ``gather 'embedding' is in a region that computes with
    int values``): the draw's int counter is computed by the sweep beside the gathers."""
    g = embedding_dropout_graph()
    p = make_plan(g)
    assert (p.family, p.M, p.N, p.stages) == ("row", S, H, (("mu",), ("var",)))
    inputs = random_inputs(g, 3)
    inputs["seed"] = np.array([0x5DEECE66D_1234], dtype=np.int64)   # a seed with high bits
    _emulate_all(g, inputs)


def test_the_draw_keeps_about_the_dropout_share() -> None:
    """The emulated mask is the reference's (above) and not degenerate: about ``1 - p`` of it is kept."""
    g = embedding_dropout_graph(p=0.25)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, 5)
    inputs["seed"] = np.array([987654321], dtype=np.int64)
    out = emulate_program(lower(g, plan, heuristic_schedule(plan, DEV, space), DEV, space), inputs,
                          coresident_limit=lambda k: 1 << 30)
    kept = float(np.mean(np.asarray(out["keep"], dtype=np.float64)))   # (flat: the order does not matter)
    assert 0.6 < kept < 0.9, kept


_OPS = ("add", "sub", "mul", "maximum", "minimum")


@settings(max_examples=25, deadline=None, derandomize=True)
@given(op1=st.sampled_from(_OPS), op2=st.sampled_from(_OPS), k=st.integers(-7, 7),
       cmp=st.sampled_from(("gt", "lt", "ge", "ne")), thr=st.integers(-20, 20),
       index_op=st.sampled_from(("gather", "slice", "concat")), dt=st.sampled_from(("int32", "int64")),
       seed=st.integers(0, 2**40))
def test_int_arithmetic_beside_an_index_op_emulates_the_reference(op1: str, op2: str, k: int, cmp: str, thr: int,
                                                                  index_op: str, dt: str, seed: int) -> None:
    """Random int arithmetic of ``iota``s and an int input ``t`` (``[R, 1]``), a mask from it, beside
    a gather, slice or concat of float inputs: planned and emulated equal to the reference."""
    R, C = 6, 16
    idx = {"gather": [{"id": "v", "op": "gather", "args": ["tab", "ix"], "axis": 0}],
           "slice": [{"id": "v", "op": "slice", "args": ["w"], "axis": 1, "start": 3, "stop": 3 + C}],
           "concat": [{"id": "v", "op": "concat", "args": ["a", "b"], "axis": 1}]}[index_op]
    g = parse_graph({
        "name": "ib", "inputs": {"tab": {"shape": [20, C], "dtype": "float32"}, "ix": {"shape": [R], "dtype": "int64"},
                                 "w": {"shape": [R, C + 5], "dtype": "float32"},
                                 "a": {"shape": [R, 5], "dtype": "float32"}, "b": {"shape": [R, C - 5], "dtype": "float32"},
                                 "t": {"shape": [R, 1], "dtype": dt}},
        "nodes": [*idx,
                  {"id": "r", "op": "iota", "args": [], "shape": [R, C], "dtype": dt, "axis": 0},
                  {"id": "c", "op": "iota", "args": [], "shape": [R, C], "dtype": dt, "axis": 1},
                  {"id": "n1", "op": op1, "args": ["c", "t"]}, {"id": "n2", "op": op2, "args": ["n1", "r"]},
                  {"id": "n3", "op": "mul", "args": ["n2", float(k)]},
                  {"id": "m", "op": cmp, "args": ["n3", float(thr)]},
                  {"id": "mf", "op": "cast", "args": ["m"], "to": "float32"},
                  {"id": "y", "op": "mul", "args": ["v", "mf"]}],
        "outputs": ["y", "m", "n3"]})
    inputs = random_inputs(g, seed % 1000)
    rng = np.random.default_rng(seed)
    inputs["t"] = rng.integers(-30, 30, (R, 1)).astype(dt)
    _emulate_all(g, inputs, n_samples=1)


def _graph(nodes: list[dict[str, Any]], outputs: list[str]) -> Any:
    return parse_graph({"name": "g", "inputs": {"x": {"shape": [4, 8], "dtype": "float32"},
                                                "t": {"shape": [4, 8], "dtype": "int32"}},
                        "nodes": nodes, "outputs": outputs})


@pytest.mark.parametrize("nodes,named", [
    # an int tensor read at a moved position (under a slice): the remap computes in float registers
    ([{"id": "ti", "op": "add", "args": ["t", 1]}, {"id": "tf", "op": "cast", "args": ["ti"], "to": "float32"},
      {"id": "sl", "op": "slice", "args": ["tf"], "axis": 1, "start": 1, "stop": 5},
      {"id": "sx", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": 4},
      {"id": "y", "op": "add", "args": ["sl", "sx"]}], "slice 'sl'"),
    # an index op's int result (a slice of an int input), computed with
    ([{"id": "sx", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": 4},
      {"id": "st", "op": "slice", "args": ["t"], "axis": 1, "start": 2, "stop": 6},
      {"id": "s1", "op": "add", "args": ["st", 1]},
      {"id": "tf", "op": "cast", "args": ["s1"], "to": "float32"}, {"id": "y", "op": "add", "args": ["sx", "tf"]}],
     "slice 'st'"),
    # an int iota under a concat piece
    ([{"id": "io", "op": "iota", "args": [], "shape": [4, 4], "dtype": "int32", "axis": 1},
      {"id": "iof", "op": "cast", "args": ["io"], "to": "float32"},
      {"id": "sx", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": 4},
      {"id": "cc", "op": "concat", "args": ["sx", "iof"], "axis": 1},
      {"id": "y", "op": "add", "args": ["cc", "x"]}], "concat 'cc'"),
])
def test_int_values_a_remap_would_read_stay_refused_naming_the_index_op(nodes: list[dict[str, Any]],
                                                                          named: str) -> None:
    outs = [nodes[-1]["id"]]
    with pytest.raises(UnsupportedGraphError) as e:
        make_plan(_graph(nodes, outs))
    assert str(e.value).startswith(f"{named} is in a region that computes with int values"), str(e.value)
