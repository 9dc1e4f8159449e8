"""Every new kernel shape of the cross reductions (main kernel with per-column and scalar combines,
the zeroing kernel, the partial-sum kernel, the grid-barrier combine) renders and compiles with nvcc
for sm_90."""

from __future__ import annotations

import random

import pytest

from helpers import DEV, compile_programs_sm90, setup
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.gpu.build import nvcc_found
from stitchtune.lower.entry import lower


def _one_of_each(space):
    got = {}
    for seed in range(400):
        s = space.sample(random.Random(seed))
        got.setdefault(s.cross_combine, s)
        if len(got) == 3:
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
    registers = compile_programs_sm90(programs, tmp_path)  # one nvcc call for all of them
    assert any("st_xzero" in r for r in registers) and any("st_xsum" in r for r in registers)
