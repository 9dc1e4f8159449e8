"""Random numbers drawn inside stitched kernels (``uniform``: a counter-based hash of an int64 seed and
the element's flat index, graph/ops.py): training dropout's ``rand > p`` mask and ``mask * x / (1 - p)``
before a layer norm, emulated against the reference bit for bit (the mask) for the heuristic and
sampled schedules; the CUDA form compiles to the same bits (nvcc, where installed)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from helpers.graphs import embedding_dropout_graph
from helpers.lowering import DEV, rel_err
from helpers.nvcc import heuristic_programs
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.errors import StitchtuneError
from stitchtune.graph.ops import uniform
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.gpu.render import render
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

R, C = 6, 24


def dropout_layer_norm() -> Any:
    """``y = layer_norm(x + where(u > 0.1, h, 0) * 1/0.9)`` with ``u = uniform(seed + 7, r * C + c)``;
    outputs the mask (bool) and ``y``."""
    return parse_graph({
        "name": "drop_ln", "inputs": {"x": {"shape": [R, C], "dtype": "float32"},
                                      "h": {"shape": [R, C], "dtype": "float32"},
                                      "seed": {"shape": [1], "dtype": "int64"}},
        "nodes": [
            {"id": "s", "op": "add", "args": ["seed", 7]},
            {"id": "r", "op": "iota", "args": [], "shape": [R, C], "axis": 0, "dtype": "int32"},
            {"id": "c", "op": "iota", "args": [], "shape": [R, C], "axis": 1, "dtype": "int32"},
            {"id": "rc", "op": "mul", "args": ["r", C]},
            {"id": "i", "op": "add", "args": ["rc", "c"]},
            {"id": "u", "op": "uniform", "args": ["s", "i"]},
            {"id": "keep", "op": "gt", "args": ["u", 0.1]},
            {"id": "kf", "op": "cast", "args": ["keep"], "to": "float32"},
            {"id": "d", "op": "mul", "args": ["kf", "h"]},
            {"id": "d2", "op": "mul", "args": ["d", 1.1111111111111112]},
            {"id": "z", "op": "add", "args": ["x", "d2"]},
            {"id": "m", "op": "reduce_mean", "args": ["z"], "axes": [-1], "keepdims": True},
            {"id": "zc", "op": "sub", "args": ["z", "m"]},
            {"id": "sq", "op": "mul", "args": ["zc", "zc"]},
            {"id": "v", "op": "reduce_mean", "args": ["sq"], "axes": [-1], "keepdims": True},
            {"id": "ve", "op": "add", "args": ["v", 1e-5]},
            {"id": "rs", "op": "rsqrt", "args": ["ve"]},
            {"id": "y", "op": "mul", "args": ["zc", "rs"]}],
        "outputs": ["keep", "y"]})


def _inputs(g: Any, seed: int) -> dict[str, np.ndarray]:
    ins = random_inputs(g, seed=0)
    ins["seed"] = np.array([seed], dtype=np.int64)
    return ins


def test_uniform_is_in_the_unit_interval_and_uncorrelated_along_the_counter() -> None:
    u = uniform(np.int64(-(2**62) + 12345), np.arange(1 << 16, dtype=np.int64)).astype(np.float64)
    assert u.dtype == np.float64 and 0.0 <= u.min() and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.02        # neighbours independent
    v = uniform(np.int64(-(2**62) + 12346), np.arange(1 << 16, dtype=np.int64))
    assert abs(np.corrcoef(u, v)[0, 1]) < 0.02                  # a seed one apart: another stream


@pytest.mark.parametrize("seed", [0, 2**62 + 3, -5])
def test_dropout_drawn_in_the_kernel_matches_the_reference(seed: int) -> None:
    g = dropout_layer_norm()
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    ins = _inputs(g, seed)
    ref = run_reference(g, ins)
    assert 0.8 < ref["keep"].mean() < 1.0
    rng = random.Random(seed)
    for s in [heuristic_schedule(plan, DEV, space), *(space.sample(rng) for _ in range(3))]:
        out = emulate_program(lower(g, plan, s, DEV, space), ins, coresident_limit=lambda k: 1 << 30)
        assert np.array_equal(out["keep"].reshape(R, C), ref["keep"].reshape(R, C)), s
        assert rel_err(out["y"], ref["y"]) < 1e-5


def test_uniform_reads_int_tensors_only() -> None:
    with pytest.raises(StitchtuneError, match="uniform needs an int tensor"):
        parse_graph({"name": "bad", "inputs": {"x": {"shape": [4], "dtype": "float32"},
                                               "i": {"shape": [4], "dtype": "int32"}},
                     "nodes": [{"id": "u", "op": "uniform", "args": ["x", "i"]}], "outputs": ["u"]})


def random_programs() -> list[Any]:
    """Programs of the dropout graph (heuristic and two sampled schedules) and of BERT's embedding dropout
    beside its gathers (heuristic, and ``vec = 4``) for the batched sm_90 build
    (tests/lower/test_int_input_kernels.py): the CUDA form of ``uniform`` compiles."""
    g = dropout_layer_norm()
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    rng = random.Random(0)
    own = [lower(g, plan, s, DEV, space) for s in (heuristic_schedule(plan, DEV, space), space.sample(rng),
                                                      space.sample(rng))]
    return own + heuristic_programs([embedding_dropout_graph()], vec4=True)


def test_the_cuda_form_is_one_expression_of_the_seed_and_the_counter() -> None:
    src = render(random_programs()[0])
    assert src.count("0x9E3779B1u") >= 1 and "(unsigned long long)(" in src   # one lambda per element
