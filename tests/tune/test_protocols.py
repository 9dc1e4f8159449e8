"""One contract over every implementation: the real stages and the test fakes both implement what the
search loop calls (tune.protocols, gpu.runners.Runner, gpu.build.Builder), so the loop needs no
``hasattr`` for a member one of them might lack."""

from __future__ import annotations

import random

import pytest

from helpers import search_fakes
from helpers.common import EXAMPLES
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.gpu import runners
from stitchtune.gpu.build import Builder, NvccBuilder
from stitchtune.gpu.runner import CudaRunner
from stitchtune.graph.parse import load_graph
from stitchtune.hardware.device import get_device
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace
from stitchtune.tune.config import SkipBuilder, default_components
from stitchtune.tune.protocols import DeviceLike, GraphLike, PlanLike, ScheduleLike, SpaceLike


@pytest.fixture(scope="module")
def real() -> dict[str, object]:
    g = load_graph(EXAMPLES / "layernorm_small.json")
    plan, dev = make_plan(g), get_device("h200")
    space = SearchSpace.for_plan(plan, dev)
    return {"graph": g, "plan": plan, "device": dev, "space": space,
            "schedule": heuristic_schedule(plan, dev, space)}


def test_spaces(real: dict[str, object]) -> None:
    for space in (real["space"], search_fakes.FakeSpace()):
        assert isinstance(space, SpaceLike), type(space)
        for other in (space.deterministic_only(), space.flat_mode(), space.as_of("5")):
            assert isinstance(other, SpaceLike)
        s = space.sample(random.Random(0))
        assert isinstance(s, ScheduleLike)
        assert type(s).from_dict(s.to_dict()).key() == s.key()
        assert all(isinstance(v, ScheduleLike) for v in space.variants(s))
    assert real["space"].deterministic_only().deterministic


def test_graphs_plans_devices_schedules(real: dict[str, object]) -> None:
    for graph in (real["graph"], search_fakes.FakeGraph()):
        assert isinstance(graph, GraphLike) and graph.min_bytes() > 0
    for plan in (real["plan"], search_fakes.FakePlan()):
        assert isinstance(plan, PlanLike)
    for dev in (real["device"], search_fakes.FakeDevice()):
        assert isinstance(dev, DeviceLike) and dev.effective_copy_bandwidth_gbs() > 0
    for s in (real["schedule"], search_fakes.FakeSchedule(128, 4)):
        assert isinstance(s, ScheduleLike)


def test_runners_and_builders() -> None:
    for cls in (CudaRunner, runners.EmulateRunner, runners.FakeRunner, search_fakes.FakeRunner):
        assert issubclass(cls, runners.Runner), cls
    for cls in (NvccBuilder, SkipBuilder, search_fakes.FakeBuilder):
        assert issubclass(cls, Builder), cls


def test_the_fake_components_give_what_the_real_ones_give(real: dict[str, object]) -> None:
    comp, fake = default_components(), search_fakes.fake_components()
    assert isinstance(comp.make_plan(real["graph"]), PlanLike)
    for c, graph in ((comp, real["graph"]), (fake, search_fakes.FakeGraph())):
        plan = c.make_plan(graph)
        dev = c.get_device("h200")
        assert isinstance(c.space_for_plan(plan, dev), SpaceLike)
        assert isinstance(c.heuristic_schedule(plan, dev), ScheduleLike)
        assert isinstance(c.make_runner("emulate", graph, dev), runners.Runner)
