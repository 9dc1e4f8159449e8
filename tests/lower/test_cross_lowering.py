"""Cross reductions in row-family kernels (``stitchtune.lower.cross``): the heuristic and sampled
schedules of each ``cross_combine`` choice emulate correctly at small shapes against the float64
reference (bf16 inputs with float32 accumulation included); deterministic combines are bitwise
equal across emulated block orders, atomic ones agree within tolerance; the profile prices the combine."""

from __future__ import annotations

import random

import numpy as np
import pytest

from helpers.lowering import channels_last_ln_backward, DEV, rel_err, setup
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.cost.model import predict
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.lower.entry import lower
from stitchtune.space.options import CROSS_COMBINE

CROSS_SMALL = ["layernorm_backward_small.json", "layernorm_backward_bf16_small.json", "rmsnorm_backward_small.json",
               "cross_entropy_small.json", "softmax_colsum_small.json", "mse_loss_small.json"]
MODES = ("atomic", "grid", "kernel")
ALL = lambda k: 1 << 30  # noqa: E731  (every grid co-resident)


def _first_of(space, mode: str, start: int = 0):
    for seed in range(start, start + 400):
        s = space.sample(random.Random(seed))
        if s.option(CROSS_COMBINE) == mode:
            return s
    raise AssertionError(f"no sampled schedule with cross_combine {mode}")


def _errors(g, plan, space, s, seed: int | None = None) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Per output: relative error over its tolerance (float32 1e-5, 16-bit 1e-2, as test_codegen), and the outputs."""
    inputs = random_inputs(g, 0)
    ref = run_reference(g, inputs)
    out = emulate_program(lower(g, plan, s, DEV, space), inputs, coresident_limit=ALL, block_order_seed=seed)
    tol = {o: 1e-5 if g.spec(o).dtype == "float32" else 1e-2 for o in ref}
    return {o: rel_err(out[o], ref[o]) / tol[o] for o in ref}, out


@pytest.mark.parametrize("name", CROSS_SMALL)
def test_heuristic_and_each_combine_emulate_correctly(name: str) -> None:
    g, plan, space = setup(name)
    scheds = [heuristic_schedule(plan, DEV, space)] + [_first_of(space, m) for m in MODES]
    assert not space.violations(scheds[0])
    for s in scheds:
        errs, _ = _errors(g, plan, space, s)
        assert max(errs.values()) < 1, (s.to_json(), errs)


@pytest.mark.parametrize("name", ["layernorm_backward_small.json", "mse_loss_small.json",
                                  "cross_entropy_small.json"])
def test_deterministic_combines_are_bitwise_equal_across_block_orders(name: str) -> None:
    g, plan, space = setup(name)
    for mode in MODES:
        s = _first_of(space, mode, start=40)
        assert s.deterministic == (mode != "atomic")
        (e1, o1), (e2, o2) = _errors(g, plan, space, s, seed=1), _errors(g, plan, space, s, seed=2)
        assert max(e1.values()) < 1 and max(e2.values()) < 1
        if s.deterministic:
            assert all(o1[k].tobytes() == o2[k].tobytes() for k in o1), (mode, s.to_json())


def test_each_combine_has_its_kernels_and_priced_terms() -> None:
    g, plan, space = setup("layernorm_backward_small.json")
    by_mode = {m: lower(g, plan, _first_of(space, m), DEV, space) for m in MODES}
    names = {m: [ln.kernel for ln in p.launches] for m, p in by_mode.items()}
    assert names["atomic"][0] == "st_xzero" and names["kernel"][-1] == "st_xsum"
    assert not {"st_xzero", "st_xsum"} & set(names["grid"])
    main = {m: [k for k in p.profile.kernels if k.name.startswith("st_k")][-1] for m, p in by_mode.items()}
    assert main["atomic"].atomics > 0 and main["atomic"].atomic_serial == main["atomic"].grid
    grid_main = [k for k in by_mode["grid"].profile.kernels if k.grid_barriers]
    assert grid_main and grid_main[-1].grid_barriers >= 1
    assert any(b.name.startswith("xp") and b.role == "scratch" for b in by_mode["kernel"].buffers)
    for p in by_mode.values():
        assert predict(p.profile, DEV).time_us > 0


def test_grid_combine_needs_a_coresident_grid() -> None:
    """A grid-barrier combine whose grid cannot be co-resident is pruned by the cost model (as the
    global scheme is), and the emulator faults on it."""
    from stitchtune.emulate.emulator import EmulatorFault

    g, plan, space = setup("rmsnorm_backward.json")
    s = heuristic_schedule(plan, DEV, space)
    import dataclasses

    s = dataclasses.replace(s, tasks_per_block=1, cross_combine="grid")
    assert not space.violations(s)
    pred = predict(lower(g, plan, s, DEV, space).profile, DEV)
    assert pred.prune_reason and "co-resident" in pred.prune_reason
    gs, ps, sps = setup("rmsnorm_backward_small.json")
    small = dataclasses.replace(heuristic_schedule(ps, DEV, sps), tasks_per_block=1, cross_combine="grid")
    prog = lower(gs, ps, small, DEV, sps)
    with pytest.raises(EmulatorFault) as ei:
        emulate_program(prog, random_inputs(gs, 0), coresident_limit=lambda k: 1)
    assert ei.value.kind == "grid_not_coresident"


def _odd_graph() -> object:
    """Softmax and its column sums at 45 x 130 (rows not a multiple of a block's rows, columns not of
    a warp's vectors): every tail of the accumulators, the block reduce and the combine."""
    from stitchtune.graph.parse import parse_graph

    red = lambda i, op, a, axes, keep=True: {"id": i, "op": op, "args": [a], "axes": axes, "keepdims": keep}  # noqa: E731
    return parse_graph({"name": "odd", "inputs": {"x": {"shape": [45, 130], "dtype": "float32"}},
                        "nodes": [red("mx", "reduce_max", "x", [-1]), {"id": "sh", "op": "sub", "args": ["x", "mx"]},
                                  {"id": "e", "op": "exp", "args": ["sh"]}, red("se", "reduce_sum", "e", [-1]),
                                  {"id": "y", "op": "div", "args": ["e", "se"]},
                                  red("cs", "reduce_sum", "y", [0], False), red("tot", "reduce_mean", "x", [0, 1])],
                        "outputs": ["y", "cs", "tot"]})


def test_odd_shapes_emulate_correctly() -> None:
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    g = _odd_graph()
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    assert {c.kind for c in plan.cross} == {"per_reduced", "scalar"}
    for s in [heuristic_schedule(plan, DEV, space)] + [_first_of(space, m, start=7) for m in MODES]:
        errs, _ = _errors(g, plan, space, s, seed=5)
        assert max(errs.values()) < 1, (s.to_json(), errs)


@pytest.mark.parametrize("mode", MODES)
def test_cross_combines_with_single_pass_statistics(mode: str) -> None:
    """The online softmax (one sweep for max and sum) next to the column sums of its probabilities."""
    import dataclasses

    g, plan, space = setup("softmax_colsum_small.json")
    assert plan.single_pass
    s = dataclasses.replace(heuristic_schedule(plan, DEV, space), single_pass=1, cross_combine=mode)
    assert not space.violations(s)
    errs, _ = _errors(g, plan, space, s, seed=3)
    assert max(errs.values()) < 1, errs


@pytest.mark.parametrize("name", [n.replace("_small", "") for n in CROSS_SMALL] + CROSS_SMALL)
def test_heuristic_of_cross_plans_is_its_own_rule(name: str) -> None:
    """The AStitch heuristic's cross rule (whole rows, a persistent grid, the ordered combine), not the
    sampled fallback of an illegal heuristic (which the cluster rule's split would be)."""
    _, plan, space = setup(name)
    s = heuristic_schedule(plan, DEV, space)
    assert not space.violations(s) and s.split == 1 and s.persistent and s.deterministic


@pytest.mark.parametrize("grad", ["merged", "nchw"])
def test_channels_last_layer_norm_backward_emulates(grad: str) -> None:
    """ConvNeXt's layer norm backward (row sums over C of [1, H, W, C], dgamma and dbeta over H*W
    rows; the gradient a merged [H*W, C] or a transposed NCHW tensor): the heuristic and each combine."""
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    g = channels_last_ln_backward(4, 6, 24, grad)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    for s in [heuristic_schedule(plan, DEV, space)] + [_first_of(space, m, start=3) for m in MODES]:
        errs, _ = _errors(g, plan, space, s, seed=2)
        assert max(errs.values()) < 1, (s.to_json(), errs)


def test_a_cross_plan_whose_rows_fit_one_block_combines_in_its_kernel() -> None:
    """Every row in one block (a training step's layer norm backward at batch x sequence 8): the heuristic
    sums the block's partials after a grid barrier of that one block (``grid``), one launch instead of
    the partials kernel and the ``kernel`` combine's second launch, emulated like the reference; a
    plan of more blocks keeps the ``kernel`` combine."""
    from helpers.lowering import float_graph
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    def graph(rows: int):
        return float_graph({"x": [rows, 32], "g": [rows, 32]}, [
            {"id": "m", "op": "reduce_max", "args": ["x"], "axes": [-1], "keepdims": True},
            {"id": "d", "op": "sub", "args": ["x", "m"]},
            {"id": "e", "op": "exp", "args": ["d"]},
            {"id": "s", "op": "reduce_sum", "args": ["e"], "axes": [-1], "keepdims": True},
            {"id": "p", "op": "div", "args": ["e", "s"]},
            {"id": "c", "op": "reduce_sum", "args": ["g"], "axes": [0], "keepdims": True}], ["p", "c"])

    g = graph(8)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = heuristic_schedule(plan, DEV, space)
    assert plan.cross and s.option(CROSS_COMBINE) == "grid" and not space.violations(s) and s.deterministic
    prog = lower(g, plan, s, DEV, space)
    assert len(prog.launches) == 1 and prog.launches[0].grid == 1
    errs, _ = _errors(g, plan, space, s)
    assert max(errs.values()) < 1
    big = make_plan(graph(4096))
    assert heuristic_schedule(big, DEV, SearchSpace.for_plan(big, DEV)).option(CROSS_COMBINE) == "kernel"
