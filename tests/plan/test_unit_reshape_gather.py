"""A reshape that only adds or drops leading extents of 1 next to a gather (issue 41: GPT-2's ONNX
embedding subgraph, refused with "gather '...' is in a region with transpose / reshape"): no layout
change (:func:`stitchtune.plan.index_ops.unit_reshapes`), so the region is not mixed, plans as one
row kernel and emulates equal to the float64 reference; a reshape that does change the layout next
to a gather keeps its refusal."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from helpers.lowering import DEV
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.errors import UnsupportedGraphError
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.lower.entry import lower
from stitchtune.plan.chains import mixed_layout
from stitchtune.plan.index_ops import unit_reshapes
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

S, H, V = 8, 32, 100


def _embedding(view: list[int]) -> Any:
    """GPT-2's ONNX embedding subgraph as the ONNX importer cuts it: the token gather, plus the
    position embeddings, a layer norm, and its result reshaped to ``view`` (``[S, H]`` for c_attn's
    MatMul); the gather is an output too."""
    f32 = {"dtype": "float32"}
    return parse_graph({
        "name": "gpt2_onnx_embedding",
        "inputs": {"ids": {"shape": [1, S], "dtype": "int64"}, "wte": {"shape": [V, H], **f32},
                   "wpe": {"shape": [1, S, H], **f32}, "gamma": {"shape": [H], **f32}, "beta": {"shape": [H], **f32}},
        "nodes": [
            {"id": "emb", "op": "gather", "args": ["wte", "ids"], "axis": 0},
            {"id": "x", "op": "add", "args": ["emb", "wpe"]},
            {"id": "mu", "op": "reduce_mean", "args": ["x"], "axes": [2], "keepdims": True},
            {"id": "xc", "op": "sub", "args": ["x", "mu"]}, {"id": "sq", "op": "mul", "args": ["xc", "xc"]},
            {"id": "var", "op": "reduce_mean", "args": ["sq"], "axes": [2], "keepdims": True},
            {"id": "ve", "op": "add", "args": ["var", 1e-5]}, {"id": "rs", "op": "rsqrt", "args": ["ve"]},
            {"id": "xn", "op": "mul", "args": ["xc", "rs"]}, {"id": "xg", "op": "mul", "args": ["xn", "gamma"]},
            {"id": "ln", "op": "add", "args": ["xg", "beta"]},
            {"id": "flat", "op": "reshape", "args": ["ln"], "shape": view}],
        "outputs": ["emb", "flat"]})


@pytest.mark.parametrize("view", [[S, H], [1, 1, S, H]])
def test_a_reshape_of_leading_ones_after_a_gather_plans_and_emulates_equal(view: list[int]) -> None:
    g = _embedding(view)
    assert unit_reshapes(g) == {"flat"} and not mixed_layout(g)
    plan = make_plan(g)
    assert (plan.family, plan.M, plan.N) == ("row", S, H)
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, 7)
    inputs["ids"] = np.random.default_rng(7).integers(0, V, size=(1, S)).astype(np.int64)
    ref = run_reference(g, inputs)   # (float64)
    for s in [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(3)]:
        out = emulate_program(lower(g, plan, s, DEV, space), inputs, coresident_limit=lambda k: 1 << 30)
        for o in g.outputs:
            want = np.asarray(ref[o], dtype=np.float64)
            got = np.asarray(out[o], dtype=np.float64).reshape(want.shape)
            err = np.linalg.norm(got - want) / np.linalg.norm(want)
            assert err < 1e-5, (o, s.to_json(), err)


def test_a_reshape_that_moves_data_next_to_a_gather_is_still_refused() -> None:
    """``[1, S, H]`` viewed as ``[S, 2, H / 2]`` changes the layout: not a unit reshape, still refused."""
    g = _embedding([S, 2, H // 2])
    assert unit_reshapes(g) == set() and mixed_layout(g)
    with pytest.raises(UnsupportedGraphError, match="gather 'emb' is in a region with transpose / reshape"):
        make_plan(g)


def test_a_one_moved_between_other_extents_is_not_a_unit_reshape() -> None:
    """``[1, S, H]`` -> ``[S, 1, H]`` keeps the elements' order but not the right alignment the
    surrogate reads: not a unit reshape (the region stays mixed)."""
    g = _embedding([S, 1, H])
    assert unit_reshapes(g) == set() and mixed_layout(g)
