"""The ``cluster`` scheme end to end (sm_90): offered only where the device has thread-block clusters,
sampled cluster schedules of the wide examples emulate correctly against the float64 reference, render
with ``__cluster_dims__`` and the cooperative-groups cluster API and compile with nvcc for sm_90; the
emulator catches a lowered cluster kernel without its cluster barriers; the cost model and the heuristic
know clusters. All at small shapes (the ``*_small`` examples)."""

from __future__ import annotations

import dataclasses
import random

import optuna
import pytest

from helpers.common import EXAMPLES
from helpers.lowering import DEV, rel_err, setup
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.cost.model import predict
from stitchtune.emulate.emulator import EmulatorFault, emulate_program
from stitchtune.gpu.build import NvccBuilder, nvcc_found
from stitchtune.gpu.render import render
from stitchtune.graph.parse import load_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.hardware.device import get_device
from stitchtune.hardware.occupancy import max_active_clusters
from stitchtune.ir import kir
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import Schedule, SearchSpace
from stitchtune.space.options import CLUSTER

WIDE_SMALL = ("layernorm_wide_small.json", "logsoftmax_small.json", "softmax_wide_small.json")
A100 = get_device("A100")


def _cluster_samples(space: SearchSpace, n: int, seed: int = 0) -> list[Schedule]:
    """The first ``n`` seeded samples with a cluster stage, drawn as space version 5 did (the seeds were chosen then)."""
    rng, out, space = random.Random(seed), [], space.as_of("5")
    for _ in range(4000):
        s = space.sample(rng)
        if "cluster" in s.schemes:
            out.append(s)
            if len(out) == n:
                break
    return out


def _cluster_limit(kernel: kir.Kernel) -> int:
    return max_active_clusters(DEV, kernel.block, 32, kernel.smem_bytes, kernel.cluster)


@pytest.mark.parametrize("name", WIDE_SMALL)
def test_sampled_cluster_schedules_emulate_correctly(name: str) -> None:
    g, plan, space = setup(name)
    inputs = random_inputs(g, 1)
    ref = run_reference(g, inputs)
    samples = _cluster_samples(space, 3)
    assert len(samples) == 3, "the space offers the cluster scheme on the H200"
    for s in samples:
        assert s.option(CLUSTER) == s.split > 1
        prog = lower(g, plan, s, DEV, space)
        assert any(k.cluster == s.split for k in prog.kernels)
        out = emulate_program(prog, inputs, coresident_limit=lambda k: 1 << 30, cluster_limit=_cluster_limit)
        errs = [rel_err(out[o], ref[o]) for o in ref]
        assert max(errs) < 1e-5, (s.to_json(), errs)


def test_cluster_kernel_renders_and_compiles_for_sm_90(tmp_path) -> None:
    g, plan, space = setup("logsoftmax_small.json")
    s = _cluster_samples(space, 1, seed=3)[0]
    src = render(lower(g, plan, s, DEV, space))
    assert f"__cluster_dims__({s.option(CLUSTER)}, 1, 1)" in src and "cg::this_cluster()" in src
    assert "st_cluster.sync();" in src and "st_cluster.map_shared_rank(scl" in src
    if not nvcc_found():
        pytest.skip("nvcc not installed")
    (res,) = NvccBuilder(cache_dir=tmp_path).build([src], arch="sm_90")
    assert res.status == "ok", res.error


def test_a_program_without_clusters_renders_without_cooperative_groups() -> None:
    g, plan, space = setup("layernorm_wide_small.json")
    s = next(x for x in (space.sample(random.Random(i)) for i in range(200)) if "cluster" not in x.schemes)
    assert "cooperative_groups" not in render(lower(g, plan, s, DEV, space))


@pytest.mark.parametrize("name", WIDE_SMALL)
def test_never_offered_on_sm_80(name: str) -> None:
    g = load_graph(EXAMPLES / name)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, A100)
    assert not A100.supports_clusters and "cluster" not in space.domains["scheme"]
    assert all("cluster" not in space.sample(random.Random(i)).schemes for i in range(40))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(30):
        t = study.ask()
        s = space.suggest(t)
        assert "cluster" not in s.schemes and "cluster" not in t.params
        assert all("cluster" not in d.choices for d in t.distributions.values())
        study.tell(t, 1.0)
    h100 = SearchSpace.for_plan(plan, DEV)
    s = _cluster_samples(h100, 1)[0]
    assert any("scheme cluster is not legal" in v for v in space.violations(s))
    assert "cluster" not in heuristic_schedule(plan, A100, space).schemes


def test_cluster_constraints() -> None:
    _, plan, space = setup("softmax_wide_small.json")
    s = _cluster_samples(space, 1)[0]
    wrong = dataclasses.replace(s, cluster=s.split * 2 if s.split < 8 else 2)
    assert any("split == cluster" in v for v in space.violations(wrong))
    big = dataclasses.replace(s, split=16, cluster=16, tpr=s.tpr, block=s.block)
    assert any("scheme cluster is not legal" in v or "cluster larger" in v for v in space.violations(big))
    assert space.derived(s)["cluster_fits"]


def test_removing_the_cluster_barriers_is_caught() -> None:
    g, plan, space = setup("layernorm_wide_small.json")
    inputs = random_inputs(g, 0)
    prog = lower(g, plan, _cluster_samples(space, 1, seed=5)[0], DEV, space)

    def strip(body):
        out = []
        for st in body:
            if isinstance(st, kir.ClusterSync):
                continue
            if isinstance(st, kir.For):
                st = dataclasses.replace(st, body=tuple(strip(st.body)))
            out.append(st)
        return out

    mutant = dataclasses.replace(prog, kernels=tuple(dataclasses.replace(k, body=tuple(strip(k.body)))
                                                     for k in prog.kernels))
    with pytest.raises(EmulatorFault) as ei:
        emulate_program(mutant, inputs, coresident_limit=lambda k: 1 << 30)
    assert ei.value.kind == "cluster_race"


def test_cost_model_prices_and_prunes_clusters() -> None:
    g, plan, space = setup("layernorm_wide_small.json")
    s = _cluster_samples(space, 1, seed=2)[0]
    prof = lower(g, plan, s, DEV, space).profile
    k = next(k for k in prof.kernels if k.cluster > 1)
    assert k.cluster_barriers > 0 and k.dsmem_loads > 0
    ok = predict(prof, DEV)
    assert ok.prune_reason is None
    cheap = dataclasses.replace(prof, kernels=tuple(dataclasses.replace(x, cluster_barriers=0, dsmem_loads=0)
                                                    for x in prof.kernels))
    assert predict(cheap, DEV).time_us < ok.time_us  # the exchange costs time
    too_big = dataclasses.replace(prof, kernels=tuple(dataclasses.replace(x, cluster=16, grid=16)
                                                      if x.cluster > 1 else x for x in prof.kernels))
    assert "at most 8 (portable size)" in predict(too_big, DEV).prune_reason
    # a device whose GPCs have 4 SMs cannot hold a cluster of 8 blocks of 200 KiB shared memory each
    small_gpcs = dataclasses.replace(DEV, gpc_sms=(4,) * 33)
    huge = dataclasses.replace(prof, kernels=tuple(dataclasses.replace(x, smem_bytes=200 * 1024, cluster=8,
                                                                       grid=8 * max(1, x.grid // 8))
                                                   if x.cluster > 1 else x for x in prof.kernels))
    assert max_active_clusters(small_gpcs, k.block, 32, 200 * 1024, 8) == 0
    assert max_active_clusters(DEV, k.block, 32, 200 * 1024, 8) == 16  # one block per SM: 2 per GPC of 16-17 SMs
    assert predict(huge, DEV).prune_reason is None
    assert "cannot be resident on one GPC" in predict(huge, small_gpcs).prune_reason
    assert max_active_clusters(A100, 128, 32, 0, 2) == 0 and max_active_clusters(A100, 128, 32, 0, 1) > 0


def test_heuristic_picks_a_cluster_for_rows_too_wide_for_one_block() -> None:
    for name in ("layernorm_wide.json", "softmax_wide.json"):  # rows of 1 MiB and 256 KiB
        g, plan, space = setup(name)
        h = heuristic_schedule(plan, DEV, space)
        assert set(h.schemes) == {"cluster"} and h.option(CLUSTER) == h.split > 1, (name, h)
        assert predict(lower(g, plan, h, DEV, space).profile, DEV).prune_reason is None
    # 1024 elements: one block's registers hold the row; 32000 (125 KiB): its shared memory does
    for name in ("layernorm.json", "logsoftmax.json"):
        _, plan, space = setup(name)
        assert "cluster" not in heuristic_schedule(plan, DEV, space).schemes, name


def test_space_command_shows_the_cluster_parameter(capsys) -> None:
    from stitchtune.cli import main

    assert main(["space", str(EXAMPLES / "layernorm_wide.json"), "--device", "h200", "--heuristic"]) == 0
    assert '"cluster":' in capsys.readouterr().out


@pytest.mark.parametrize("name", ("layernorm_wide_small.json", "softmax_wide_small.json"))
def test_single_pass_state_merged_through_the_cluster(name: str) -> None:
    """Welford / online-softmax states of a single-pass stage with the cluster scheme: exchanged through
    distributed shared memory (every state variable in its own slot), as correct as the two-pass form."""
    g, plan, space = setup(name)
    inputs = random_inputs(g, 2)
    ref = run_reference(g, inputs)
    s = next(x for x in (dataclasses.replace(c, single_pass=1) for c in _cluster_samples(space, 40))
             if set(x.schemes) == {"cluster"} and not space.violations(x))
    prog = lower(g, plan, s, DEV, space)
    assert any(isinstance(st, kir.ClusterSync) for k in prog.kernels for st in kir.walk(k.body))
    out = emulate_program(prog, inputs, coresident_limit=lambda k: 1 << 30, cluster_limit=_cluster_limit)
    assert max(rel_err(out[o], ref[o]) for o in ref) < 1e-5, s.to_json()
