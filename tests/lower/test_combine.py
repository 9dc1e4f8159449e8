"""Combining a split row's partials (``Schedule.combine``): ``thread`` (every thread loads all of its
row's partials, one load per partial) or ``warp`` (the lanes of each warp load them together and reduce
them by shuffles). Same results in the emulator, fewer scratch loads per thread (its rules in the space:
``tests/space/test_space.py``)."""

from __future__ import annotations

import random

import pytest

from stitchtune.lower.entry import lower, scratch_loads_per_thread
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.gpu.render import render
from helpers.lowering import DEV, emulated_errors, setup
from stitchtune.space import Schedule
from stitchtune.space.options import COMBINE

WIDE = {"block": 256, "min_blocks": 0, "reuse": ["global", "recompute"], "schemes": ["global", "independent"],
        "split": 8, "tasks_per_block": 0, "tpr": 256, "vec": 4}




@pytest.mark.parametrize("name", ["layernorm_wide_small.json", "layernorm_small.json", "softmax_small.json",
                                  "rmsnorm_small.json", "softmax_odd_small.json"])
def test_warp_combine_gives_the_reference_results(name: str) -> None:
    g, plan, space = setup(name)
    inputs = random_inputs(g, 4)
    ref = run_reference(g, inputs)
    rng = random.Random(0)
    seen_splits = []
    for _ in range(3000):
        s = space.sample(rng)
        if s.option(COMBINE) != "warp":
            continue
        seen_splits.append(s.split)
        errs = emulated_errors(g, plan, space, s, inputs, ref)
        assert max(errs.values()) < 1e-5, (s.to_json(), errs)
        if len(seen_splits) >= 6:
            break
    assert len(seen_splits) >= 3 and all(x > 1 for x in seen_splits)


@pytest.mark.parametrize("split", [2, 8, 64])
def test_warp_combine_loads_each_partial_once_per_warp(split: int) -> None:
    g, plan, space = setup("layernorm_wide.json")
    d = {**WIDE, "split": split, "block": 1024, "tpr": 1024}
    thread = lower(g, plan, Schedule.from_dict(d), DEV, space)
    warp = lower(g, plan, Schedule.from_dict({**d, "combine": "warp"}), DEV, space)
    saved = split - -(-split // 32)  # per set of partials: `split` loads become ceil(split / 32)
    combined = 0
    for kt, kw in zip(thread.kernels, warp.kernels):
        t, w = scratch_loads_per_thread(kt), scratch_loads_per_thread(kw)
        if t != w:
            assert t - w > 0 and (t - w) % saved == 0, (t, w)
            combined += (t - w) // saved
    assert combined >= 2  # the grid-barrier stage and the stage after the kernel boundary
    assert "__shfl_xor_sync" in render(warp)
    # results (small rows in the emulator, same schedule shape)
    gs, ps, sps = setup("layernorm_wide_small.json")
    inputs = random_inputs(gs, 1)
    ref = run_reference(gs, inputs)
    s = Schedule.from_dict({**WIDE, "split": min(split, 32), "combine": "warp"})
    if not sps.violations(s):
        assert emulated_errors(gs, ps, sps, s, inputs, ref)["y"] < 1e-5


