"""Every new kernel shape of the cross reductions (main kernel with per-column and scalar combines,
the zeroing kernel, the partial-sum kernel, the grid-barrier combine; max / min combines and the
scalar epilogue; cross entropy with a ``gather_elements`` pick of the target, also with ``ignore_index``: an
index computed in int registers and a mean over the rows kept) renders and compiles
with nvcc for sm_90."""

from __future__ import annotations

import random

import pytest

from helpers.graphs import ce_graph, ce_ignore_graph
from helpers.lowering import DEV, float_graph, setup
from helpers.nvcc import compile_programs_sm90
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.gpu.build import nvcc_found
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace
from stitchtune.space.options import CROSS_COMBINE


def _one_of_each(space, n: int = 3):
    got = {}
    for seed in range(400):
        s = space.sample(random.Random(seed))
        got.setdefault(s.option(CROSS_COMBINE), s)
        if len(got) == n:
            return list(got.values())
    raise AssertionError("not every combine sampled")


@pytest.mark.slow
@pytest.mark.skipif(not nvcc_found(), reason="nvcc not installed")
def test_cross_kernels_compile_for_sm90(tmp_path) -> None:
    programs = []
    for name in ("layernorm_backward_bf16_small.json", "cross_entropy_small.json", "mse_loss_small.json"):
        g, plan, space = setup(name)
        for s in [heuristic_schedule(plan, DEV, space)] + _one_of_each(space):
            programs.append(lower(g, plan, s, DEV, space))
    g = ce_graph(16, 1000, outputs=("loss", "picked"))   # the loss head: pick + epilogue (grid / kernel)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    drawn = [x for x in _one_of_each(space, 2) if x.option(CROSS_COMBINE) != "atomic"]
    for s in [heuristic_schedule(plan, DEV, space)] + drawn:
        programs.append(lower(g, plan, s, DEV, space))
    g = ce_ignore_graph(16, 1000, outputs=("loss", "picked"))   # the pick's index computed in i64 registers
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    programs += [lower(g, plan, s, DEV, space) for s in [heuristic_schedule(plan, DEV, space)] + _one_of_each(space, 2)]
    g = float_graph({"x": [8, 64]}, [{"id": "hi", "op": "reduce_max", "args": ["x"], "axes": [0, 1], "keepdims": True},
                                     {"id": "lo", "op": "reduce_min", "args": ["x"], "axes": [0, 1], "keepdims": True},
                                     {"id": "d", "op": "sub", "args": ["hi", "lo"]}], ["d", "lo"])
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    programs += [lower(g, plan, s, DEV, space) for s in _one_of_each(space, 2)]   # grid and kernel only
    registers = compile_programs_sm90(programs, tmp_path)  # one nvcc call for all of them
    assert any("st_xzero" in r for r in registers) and any("st_xsum" in r for r in registers)
