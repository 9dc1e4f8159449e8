"""Property: the space a search uses (``lower.resources.legal_space``) offers only schedules that run.

Over every example graph and every device preset, each schedule the space offers -- seeded samples,
define-by-run suggestions (a seeded fake trial), the variants of a point and, for the small spaces,
the whole grid -- lowers, passes ``check_fits``, has no prune reason in the cost model (block size,
shared memory, occupancy > 0, clusters) and, where a kernel has a grid barrier, a grid no larger than
the blocks that can be co-resident (what the emulator checks before a ``GridSync``). The fast test
takes one seed per (graph, device); the ``slow`` one three more, the variants of every example on every
preset and whole grids.
"""

from __future__ import annotations

import copy
import functools
import random
from pathlib import Path
from typing import Any

import pytest

from helpers.common import EXAMPLES_DIR
from stitchtune.cost.model import predict
from stitchtune.graph.parse import load_graph
from stitchtune.hardware.device import PRESETS, check_fits
from stitchtune.hardware.occupancy import clusters_resident, occupancy
from stitchtune.lower.entry import lower
from stitchtune.lower.resources import legal_space
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace, load_space_file

EXAMPLES = sorted(EXAMPLES_DIR.glob("*.json"))
DEVICES = sorted(PRESETS)


class SeededTrial:
    """A stand-in for an optuna trial: each parameter drawn from its domain by a seeded rng."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.params: dict[str, Any] = {}

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        self.params[name] = self.rng.choice(choices)
        return self.params[name]


@functools.lru_cache(maxsize=None)
def _setup(path: Path, device: str) -> tuple[Any, Any, Any, SearchSpace, SearchSpace]:
    dev = PRESETS[device]
    g = load_graph(str(path))
    plan = make_plan(g)
    bare = SearchSpace.for_plan(plan, dev)
    return g, plan, dev, bare, legal_space(g, plan, dev, bare)


def assert_runs(g: Any, plan: Any, dev: Any, bare: SearchSpace, s: Any, how: str) -> None:
    """``s`` lowers and every kernel of it fits ``dev`` (the cost model, and the co-residency of grid barriers)."""
    check_fits(g, dev)
    program = lower(g, plan, s, dev, bare)
    pred = predict(program.profile, dev)
    assert pred.prune_reason is None, (how, dev.name, s.to_json(), pred.prune_reason)
    for k in program.profile.kernels:
        blocks = occupancy(dev, k.block, k.est_registers, k.smem_bytes).blocks_per_sm
        assert blocks > 0, (how, s.to_json(), k.name)
        if k.grid_barriers:
            resident = min(blocks * dev.sm_count, k.cluster * clusters_resident(dev, blocks, k.cluster))
            assert k.grid <= resident, (how, dev.name, s.to_json(), k.name, k.grid, resident)


def _check_offers(path: Path, device: str, seeds: range, variants: bool) -> None:
    """Seeded samples and suggestions, and the variants of the first sample when ``variants``."""
    g, plan, dev, bare, space = _setup(path, device)
    for seed in seeds:
        s = space.sample(random.Random(seed))
        assert_runs(g, plan, dev, bare, s, f"sample {seed}")
        t = space.suggest(SeededTrial(seed))
        assert not space.violations(t)
        assert_runs(g, plan, dev, bare, t, f"suggest {seed}")
        if variants and seed == seeds[0]:
            for v in space.variants(s):
                assert_runs(g, plan, dev, bare, v, f"variant of sample {seed}")


#: narrowed domains (each holds its option's default) for grids small enough to enumerate: the space
#: file's grids of the examples are far over the search's MAX_GRID
GRID_DOMAINS: dict[str, list[Any]] = {
    "tpr": [1, 32, 256], "block": [32, 256, 1024], "split": [1, 4], "vec": [1, 4], "tasks_per_block": [1, 0],
    "min_blocks": [0], "combine": ["thread"], "single_pass": [0], "cluster": [1, 4]}


def _grid_spaces(path: Path, device: str) -> tuple[Any, Any, Any, SearchSpace, SearchSpace]:
    g, plan, dev, _, _ = _setup(path, device)
    data = copy.deepcopy(load_space_file())
    for name, keep in GRID_DOMAINS.items():
        data["params"][name]["choices"] = [c for c in data["params"][name]["choices"] if c in keep]
    bare = SearchSpace(plan, dev, data)
    return g, plan, dev, bare, legal_space(g, plan, dev, bare)


def _check_grid(path: Path, device: str, lowered: int | None) -> None:
    """Every grid point of the narrowed space runs (``lowered``: lower only that many, drawn by a seeded rng);
    the legal grid is the bare grid less the points the check refuses, in order."""
    g, plan, dev, bare, space = _grid_spaces(path, device)
    points = space.grid()
    assert points == [s for s in bare.grid() if not space.violations(s)]
    for s in points if lowered is None else random.Random(0).sample(points, min(lowered, len(points))):
        assert_runs(g, plan, dev, bare, s, "grid")


@pytest.mark.parametrize("device", DEVICES)
def test_every_offered_schedule_runs(device: str) -> None:
    """Per example on this preset: one sample and one suggestion (seed 0, or 1 on the H200), the variants
    of the sample on a sixth of the examples (another sixth per preset: each example's once)."""
    k = DEVICES.index(device)
    for i, path in enumerate(EXAMPLES):
        _check_offers(path, device, range(device == "h200", 1 + (device == "h200")), i % len(DEVICES) == k)


@pytest.mark.parametrize("device", ["h200", "t4"])
def test_every_grid_point_runs(device: str) -> None:
    _check_grid(EXAMPLES_DIR / "mse_loss_small.json", device, 12)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_every_offered_schedule_runs_exhaustive(device: str) -> None:
    """Three more seeds per example on this preset (2..4), the variants of the first, and on the H200
    the whole grid of the narrowed space of every small element-wise example (all of its points lowered).
    (Seeds 2..7 on every preset, with the grids of every element-wise example on the H200 and the T4,
    passed as well: about four minutes on two busy cores.)"""
    for path in EXAMPLES:
        _check_offers(path, device, range(2, 5), True)
        if device == "h200" and path.stem.endswith("_small") and make_plan(load_graph(str(path))).nstages == 0:
            _check_grid(path, device, None)


def test_the_bare_space_offers_unrunnable_schedules_the_legal_one_does_not() -> None:
    """The check is not vacuous: seeds whose bare sample cannot run (on the H200) draw again in the legal
    space, and such a point, legal by the rules, is a violation there that suggest's repair (``fit``) mends."""
    g, plan, dev, bare, space = _setup(EXAMPLES_DIR / "rmsnorm_backward.json", "h200")
    unrunnable = [seed for seed in range(12)
                  if predict(lower(g, plan, bare.sample(random.Random(seed)), dev, bare).profile, dev).prune_reason]
    assert unrunnable
    for seed in unrunnable:
        bad = bare.sample(random.Random(seed))
        s = space.sample(random.Random(seed))
        assert s != bad
        assert_runs(g, plan, dev, bare, s, f"sample {seed}")
        assert not bare.violations(bad)
        assert any("does not fit" in v for v in space.violations(bad)), space.violations(bad)
        fixed = space.fit(bad)
        assert fixed != bad and not space.violations(fixed)
        assert_runs(g, plan, dev, bare, fixed, f"fit of sample {seed}")


def test_seeded_samples_change_only_where_they_could_not_run() -> None:
    """A seed whose bare sample runs draws the same schedule in the legal space (so the recorded seeded
    samples of runnable points stay as they were)."""
    for name in ("layernorm_backward.json", "softmax_wide.json", "mse_loss.json"):
        g, plan, dev, bare, space = _setup(EXAMPLES_DIR / name, "h200")
        for seed in range(12):
            b = bare.sample(random.Random(seed))
            if predict(lower(g, plan, b, dev, bare).profile, dev).prune_reason is None:
                assert space.sample(random.Random(seed)) == b, (name, seed)
