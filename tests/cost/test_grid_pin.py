"""The grid-barrier pin (heuristic rule 5c, issue 39): ``min_blocks`` is the fewest blocks per SM that hold
the grid, not the estimated blocks per SM rounded up to a drawn value. GPT-2's training ``view_41`` (the
tanh GELU's backward recomputing tanh, and its column sum, 4096 x 3072): 24 tiles x split 16 = 384 blocks
of 256 threads need 3 per SM on the H200's 132 SMs; pinned to 4 (space version 4 offered 0/1/2/4), its
64-register cap spilled 2 instructions (sm_90 cubin); pinned to 3 (space version 5: 3 legal, never drawn),
85 registers: 72, no spills, 384 blocks co-resident (``scripts/audit_models.py --models gpt2 --calls train
--regions region_view_41``)."""

from __future__ import annotations

import random
from typing import Any

import optuna
import pytest

from helpers.lowering import DEV, emulated_errors, float_graph
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.lower.entry import lower
from stitchtune.lower.resources import legal_space
from stitchtune.plan.planner import make_plan

C = 0.7978845608028654


def _tanh_gelu_backward_colsum(m: int, n: int) -> Any:
    """dx = dy * gelu'(x) with tanh recomputed from x (the min-cut partition saves only x), and sum(dx, 0)."""
    nodes = [
        {"id": "x2", "op": "square", "args": ["x"]}, {"id": "x3", "op": "mul", "args": ["x2", "x"]},
        {"id": "i0", "op": "mul", "args": ["x3", 0.044715]}, {"id": "i1", "op": "add", "args": ["x", "i0"]},
        {"id": "i", "op": "mul", "args": ["i1", C]}, {"id": "t", "op": "tanh", "args": ["i"]},
        {"id": "t2", "op": "square", "args": ["t"]}, {"id": "u", "op": "sub", "args": [1.0, "t2"]},
        {"id": "q0", "op": "mul", "args": ["x2", 3 * 0.044715]}, {"id": "q1", "op": "add", "args": ["q0", 1.0]},
        {"id": "q", "op": "mul", "args": ["q1", C]}, {"id": "v0", "op": "mul", "args": ["x", "u"]},
        {"id": "v1", "op": "mul", "args": ["v0", "q"]}, {"id": "w0", "op": "add", "args": ["t", 1.0]},
        {"id": "w1", "op": "add", "args": ["w0", "v1"]}, {"id": "w", "op": "mul", "args": ["w1", 0.5]},
        {"id": "dx", "op": "mul", "args": ["dy", "w"]},
        {"id": "s", "op": "reduce_sum", "args": ["dx"], "axes": [0], "keepdims": True}]
    return float_graph({"dy": [m, n], "x": [m, n]}, nodes, ["dx", "s"])


def _heuristic(g: Any) -> tuple[Any, Any, Any]:
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    return plan, space, heuristic_schedule(plan, DEV, space)


def test_the_pin_is_the_blocks_per_sm_the_grid_needs() -> None:
    g = _tanh_gelu_backward_colsum(4096, 3072)
    plan, space, s = _heuristic(g)
    prog = lower(g, plan, s, DEV, space)
    (launch,) = prog.launches
    assert launch.grid == 384 and launch.block == 256
    assert s.min_blocks == 3 == -(-launch.grid // DEV.sm_count)   # space version 4 pinned 4
    assert prog.kernels[0].min_blocks_per_sm == 3 and not space.violations(s)


def test_the_pinned_kernel_equals_the_reference() -> None:
    g = _tanh_gelu_backward_colsum(256, 384)
    plan, space, s = _heuristic(g)
    t = s if s.min_blocks == 3 else type(s).from_dict({**s.to_dict(), "min_blocks": 3})
    assert not space.violations(t)
    inputs = random_inputs(g, 0)
    errs = emulated_errors(g, plan, space, t, inputs, run_reference(g, inputs))
    assert max(errs.values()) < 1e-5, errs


def test_an_undrawn_value_is_legal_never_sampled_and_resumes_in_optuna() -> None:
    """As a study created before space version 6 draws (``as_of("5")``): 3 legal, never drawn."""
    g = _tanh_gelu_backward_colsum(4096, 3072)
    _, today, s = _heuristic(g)
    space = today.as_of("5")
    assert 3 not in space.domains["min_blocks"] and 3 in space.legal_values("min_blocks")
    rng = random.Random(0)
    assert all(space.sample(rng).min_blocks != 3 for _ in range(200))
    for sp in (space, space.flat_mode()):
        params = sp.params_of(s)
        assert any(k.startswith("min_blocks_all") and v == 3 for k, v in params.items()), params
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        study.enqueue_trial(params)
        assert sp.suggest(study.ask()) == s
        fresh = [sp.suggest(study.ask()) for _ in range(5)]   # fresh trials ask the drawn domain
        assert all(f.min_blocks != 3 for f in fresh)


def test_space_version_6_draws_the_pin() -> None:
    """Since space version 6 a new study and the seeded samples draw 3, under the names every other value has."""
    g = _tanh_gelu_backward_colsum(4096, 3072)
    _, space, s = _heuristic(g)
    assert space.domains["min_blocks"] == [0, 1, 2, 3, 4]
    rng = random.Random(0)
    assert any(space.sample(rng).min_blocks == 3 for _ in range(200))
    for sp in (space, space.flat_mode()):
        params = sp.params_of(s)
        assert not any(k.startswith("min_blocks_all") for k in params) and 3 in params.values(), params
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        study.enqueue_trial(params)
        assert sp.suggest(study.ask()) == s
        drawn = {sp.suggest(study.ask()).min_blocks for _ in range(40)}
        assert 3 in drawn, drawn


@pytest.mark.slow
def test_the_pinned_kernel_compiles_without_spills() -> None:
    from stitchtune.analysis.audit import audit_graph
    from stitchtune.gpu.build import nvcc_found
    from stitchtune.gpu.sass import find_cuobjdump

    if not nvcc_found() or find_cuobjdump() is None:
        pytest.skip("needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump)")
    (k,) = audit_graph(_tanh_gelu_backward_colsum(4096, 3072), DEV, slice_blocks=1).kernels
    assert k.sass is not None and k.sass.spills == 0 and k.blocks_per_sm >= 3, (k.sass, k.problems)
    assert k.grid <= k.blocks_per_sm * DEV.sm_count   # co-resident
