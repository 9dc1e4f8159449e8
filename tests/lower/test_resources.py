"""The resource check of the space (``stitchtune.lower.resources``) is the lowering's own sizing and the
cost model's own rules: for seeded samples of the space without the check (runnable or not) on every
example, the launch shapes equal the lowered program's profile and the refusal is the cost model's
prune reason, word for word."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from helpers.common import EXAMPLES_DIR
from stitchtune.cost.model import predict
from stitchtune.graph.parse import load_graph
from stitchtune.hardware.device import get_device
from stitchtune.ir.launches import LaunchShape
from stitchtune.lower.entry import lower
from stitchtune.lower.resources import launch_shapes, legal_space, resource_refusal
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

EXAMPLES = sorted(EXAMPLES_DIR.glob("*.json"))


@pytest.mark.parametrize("device", ["h200", "a100"])
def test_launch_shapes_are_the_lowered_profile_and_the_refusal_the_cost_models(device: str) -> None:
    dev = get_device(device)
    refused = 0
    for path in EXAMPLES:
        g = load_graph(str(path))
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, dev)
        for seed in range(3):
            s = space.sample(random.Random(seed))
            profile = lower(g, plan, s, dev, space).profile
            shapes = launch_shapes(g, plan, s, dev, space.schemes)
            assert shapes == tuple(LaunchShape.of(k) for k in profile.kernels), (path.name, seed)
            reason = resource_refusal(shapes, dev)
            assert reason == predict(profile, dev).prune_reason, (path.name, seed)
            refused += reason is not None
    assert refused  # the samples include kernels the device refuses: the comparison is not vacuous


def test_legal_space_refuses_through_violations_and_lower(tmp_path: Path) -> None:
    """A rule-legal schedule whose grid barrier cannot be co-resident: the legal space names the kernel
    and the limit; ``lower`` with that space refuses it (ScheduleError), with the bare space lowers it."""
    from stitchtune.errors import ScheduleError

    dev = get_device("h200")
    g = load_graph(str(EXAMPLES_DIR / "rmsnorm_backward.json"))
    plan = make_plan(g)
    bare = SearchSpace.for_plan(plan, dev).as_of("5")   # the probe's draws (space version 5)
    space = legal_space(g, plan, dev, bare)
    s = bare.sample(random.Random(1))  # cross_combine grid over 1024 blocks, 132 co-resident (recorded probe)
    assert not bare.violations(s)
    (v,) = space.violations(s)
    assert v.startswith("does not fit NVIDIA H200: kernel st_k1: grid barrier needs all") and "co-resident" in v
    lower(g, plan, s, dev, bare)
    with pytest.raises(ScheduleError, match="does not fit"):
        lower(g, plan, s, dev, space)
    assert space.version == bare.version and space.resources is not None and bare.resources is None
