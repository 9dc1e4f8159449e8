"""Planning, schedule space, lowering, rendering: every sampled schedule is proven right on the CPU.

* For every small example and 50 seeded schedules of its space, the emulator's output matches the
  numpy reference (float32 rel. error < 1e-5, 16-bit < 1e-2) with no emulator fault: the heuristic and
  the first ``QUICK_SCHEDULES`` samples in the quick suite, the other samples in the ``slow`` half (a
  third of the CPU time, the same check); the run reports how many distinct (scheme, mapping, reuse)
  combinations the quick set covers and asserts that every scheme, every thread-mapping kind and every
  value of the options order/prefetch/combine appears in it.
* The heuristic and the first ``COMPILE_SCHEDULES`` of those samples (default 20, env
  ``STITCHTUNE_COMPILE_SAMPLES``; 50 = all) compile with nvcc for sm_90 and ptxas reports their
  resources (nvcc costs ~0.1 s per kernel here and ~1 s per translation unit, the emulator a fraction
  of that: all 50 compiled took a third of the suite's time); the examples are built in six groups,
  one translation unit each.
* Golden files pin the rendered source of a few fixed schedules (regenerate with
  ``STITCHTUNE_REGEN_GOLDEN=1``).
"""

from __future__ import annotations

import functools
import os
import random
import re
from collections import Counter
from pathlib import Path

import pytest

from stitchtune.hardware.device import get_device
from stitchtune.cost.model import predict
from stitchtune.emulate.emulator import emulate_program
from stitchtune.errors import ScheduleError, UnsupportedGraphError
from stitchtune.graph.parse import load_graph, parse_graph
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import TensorClass, make_plan
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.gpu.build import KernelResources, parse_ptxas
from stitchtune.gpu.render import render, render_kernel
from stitchtune.space import COMBINE, ORDER, PREFETCH, Schedule, SearchSpace

from helpers.lowering import assert_matches_golden, rel_err, setup
from helpers.nvcc import batch_source, ptxas_report, shared_ptxas_report

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SMALL = sorted(p.name for p in EXAMPLES.glob("*_small.json"))
FULL = sorted(p.name for p in EXAMPLES.glob("*.json") if not p.name.endswith("_small.json"))
GOLDEN = Path(__file__).resolve().parent / "golden"
N_SCHEDULES = 50
#: the samples the quick suite emulates per example (the rest are the slow test's)
QUICK_SCHEDULES = 16
COMPILE_SCHEDULES = min(N_SCHEDULES, int(os.environ.get("STITCHTUNE_COMPILE_SAMPLES", "20")))
DEV = get_device("H200")

def mapping_kind(plan, s: Schedule) -> str:
    """The thread-mapping kind of a schedule (AStitch's vocabulary)."""
    if plan.family == "col":
        return "column-split" if s.split > 1 else "column-tile"
    if s.split > 1:
        return "split-row (several blocks per row)"
    if s.tpr < 32:
        return "sub-warp (packed rows)"
    if s.tpr == 32:
        return "warp per row"
    return "block per row" if s.tpr == s.block else "multi-warp rows (packed)"


def sampled(space: SearchSpace, n: int, seed0: int = 0) -> list[Schedule]:
    return [space.sample(random.Random(seed0 + i)) for i in range(n)]


@functools.cache
def emulated_schedules(name: str) -> tuple[object, object, SearchSpace, tuple[Schedule, ...]]:
    """(graph, plan, space, schedules) of one small example: the heuristic and ``N_SCHEDULES`` seeded
    samples, the set :func:`test_sampled_schedules_match_reference_in_emulator` emulates. Drawn once
    per example and process (all frozen values), so that the coverage test and the emulation test
    that run in one worker share the draws."""
    g, plan, space = setup(name)
    return g, plan, space, (heuristic_schedule(plan, DEV, space), *sampled(space, N_SCHEDULES))


def _emulate_against_reference(name: str, scheds: tuple[Schedule, ...]) -> None:
    assert scheds, "no schedule to emulate"
    g, plan, space, _ = emulated_schedules(name)
    inputs = random_inputs(g, 7)
    ref = run_reference(g, inputs)
    tol = 1e-5 if all(g.spec(o).dtype == "float32" for o in g.outputs) else 1e-2
    failures = []
    for s in scheds:
        prog = lower(g, plan, s, DEV, space)
        out = emulate_program(prog, inputs, coresident_limit=lambda k: 1 << 30)
        errs = {o: rel_err(out[o], ref[o]) for o in ref}
        if not max(errs.values()) < tol:
            failures.append((s.to_json(), errs))
    assert not failures, failures[:3]


@pytest.mark.parametrize("name", SMALL)
def test_sampled_schedules_match_reference_in_emulator(name: str) -> None:
    """The heuristic and the first QUICK_SCHEDULES samples."""
    _emulate_against_reference(name, emulated_schedules(name)[3][:QUICK_SCHEDULES + 1])


@pytest.mark.slow
@pytest.mark.parametrize("name", SMALL)
def test_more_sampled_schedules_match_reference_in_emulator(name: str) -> None:
    """The samples after the quick test's, up to N_SCHEDULES."""
    _emulate_against_reference(name, emulated_schedules(name)[3][QUICK_SCHEDULES + 1:])


def test_coverage_of_schemes_and_mappings() -> None:
    """The schedules the quick emulator test above checks (the same seeds, recomputed here without
    emulating, so this test stands alone) exercise every scheme, every mapping kind and every value
    of the options order/prefetch/combine."""
    coverage: Counter = Counter()
    kinds: set[str] = set()
    schemes: set[str] = set()
    options: set[tuple[str, object]] = set()
    for name in SMALL:
        _, plan, _, scheds = emulated_schedules(name)
        for s in scheds[:QUICK_SCHEDULES + 1]:
            kind = mapping_kind(plan, s)
            kinds.add(kind)
            schemes.update(s.schemes)
            options.update((opt.name, s.option(opt)) for opt in (ORDER, PREFETCH, COMBINE))
            coverage[(plan.family, kind, s.schemes, s.reuse)] += 1
    print(f"\ncovered {len(coverage)} distinct (family, mapping, schemes, reuse) combinations; "
          f"mapping kinds: {sorted(kinds)}; schemes: {sorted(schemes)}")
    assert schemes == {"local", "regional", "global", "independent", "cluster"}
    assert options == {("order", "forward"), ("order", "alternate"), ("prefetch", 0), ("prefetch", 1),
                       ("combine", "thread"), ("combine", "warp")}
    assert kinds >= {"sub-warp (packed rows)", "warp per row", "block per row", "multi-warp rows (packed)",
                     "split-row (several blocks per row)", "column-tile", "column-split"}


#: the small examples in groups of about five, one nvcc translation unit per group: each nvcc process spends
#: ~1 CPU-s on its headers (cuda_runtime.h, cuda_fp16.h, cuda_bf16.h) before the first kernel, so 29
#: translation units (one per example) cost ~25 CPU-s more than six; a group stays one test of ~15 s
COMPILE_GROUPS = [tuple(SMALL[i::6]) for i in range(6)]


def _check_compiled(name: str, names: list[str], report: str) -> None:
    """ptxas reported every kernel of ``name`` (``names``) with 1..255 registers and its spill line."""
    regs = dict(re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", report, re.S))
    assert set(regs) == set(names), (name, sorted(set(regs) ^ set(names)))
    for n, v in regs.items():
        assert 1 <= int(v) <= 255, (name, n, v)
    assert len(re.findall(r"bytes spill stores", report)) == len(names), name


@pytest.mark.slow
@pytest.mark.parametrize("group", COMPILE_GROUPS, ids=["+".join(n.removesuffix("_small.json") for n in g)
                                                       for g in COMPILE_GROUPS])
def test_sampled_schedules_compile_for_sm90(group: tuple[str, ...], tmp_path: Path) -> None:
    """The heuristic and the first ``COMPILE_SCHEDULES`` samples of each small example of ``group`` compile
    for sm_90, all in one nvcc call; ptxas reports each example's kernels (registers, spill line). Where
    that build fails, each example is built alone, so that the failure names the example(s) at fault."""
    progs: dict[str, list] = {}
    for name in group:
        g, plan, space = setup(name)
        progs[name] = [lower(g, plan, s, DEV, space)
                       for s in [heuristic_schedule(plan, DEV, space)] + sampled(space, COMPILE_SCHEDULES)]
    src, names = batch_source([p for name in group for p in progs[name]])
    try:
        report = ptxas_report(src, tmp_path, 600)
    except AssertionError as group_error:
        failed = []
        for name in group:
            (tmp_path / name).mkdir()
            src, names = batch_source(progs[name])
            try:
                _check_compiled(name, names, ptxas_report(src, tmp_path / name, 600))
            except AssertionError as exc:
                failed.append(f"{name}: {exc}")
        pytest.fail("\n".join(failed) or f"the group's build failed, every example alone compiled: {group_error}")
    # batch_source names the kernels p<i>_..., i counting the programs over the whole group
    reports = _entries_by_kernel(report)
    assert set(reports) == set(names), sorted(set(reports) ^ set(names))
    offset = 0
    for name in group:
        mine = [f"p{offset + j}_{k.name}" for j, p in enumerate(progs[name]) for k in p.kernels]
        offset += len(progs[name])
        _check_compiled(name, mine, "".join(reports[n] for n in mine))


def _entries_by_kernel(report: str) -> dict[str, str]:
    """ptxas' ``-v`` report cut into one piece per entry function (from its "Compiling entry function"
    line to the next one): the piece of kernel ``k`` holds its properties (spill line) and its "Used"
    line."""
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"ptxas info\s*: Compiling entry function '(\w+)'", report)]
    ends = [s for s, _ in starts[1:]] + [len(report)]
    return {k: report[s:e] for (s, k), e in zip(starts, ends)}


def _full_size_heuristics() -> list[tuple[object, object]]:
    """(schedule, program) of the heuristic of every full-size example, in ``FULL`` order."""
    out = []
    for name in FULL:
        g, plan, space = setup(name)
        s = heuristic_schedule(plan, DEV, space)
        out.append((s, lower(g, plan, s, DEV, space)))
    return out


@pytest.fixture(scope="module")
def full_size_resources(shared_build_dir: Path) -> dict[str, KernelResources]:
    """ptxas' resources of every kernel of every full-size heuristic (``p<i>_<kernel>``, ``i`` the example's
    index in ``FULL``), from one nvcc build that the whole run shares."""
    src, names = batch_source([prog for _, prog in _full_size_heuristics()])
    report = shared_ptxas_report(src, shared_build_dir, 600)
    res = parse_ptxas(report)
    assert set(res) == set(names)
    assert all(f"Function properties for {n}" in report for n in names)  # the spill figures are ptxas' own
    return res


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL)
def test_heuristic_full_size_compiles_without_spills(name: str, full_size_resources) -> None:
    g, plan, space = setup(name)
    s = heuristic_schedule(plan, DEV, space)
    assert space.violations(s) == []
    prog = lower(g, plan, s, DEV, space)
    i = FULL.index(name)
    mine = {k.name: full_size_resources[f"p{i}_{k.name}"] for k in prog.kernels}
    assert all(r.spill_store_bytes == 0 and r.spill_load_bytes == 0 for r in mine.values()), mine
    # with the compiler's register counts every kernel is still legal: in particular a grid-barrier
    # grid stays co-resident (the colsum heuristic was pruned after its build on the H200 before
    # heuristic._pin_coresidency)
    regs = {n: r.registers for n, r in mine.items()}
    assert all(1 <= r <= 255 for r in regs.values()), regs
    assert predict(prog.profile, DEV, registers=regs).prune_reason is None, (s.to_json(), regs)


@pytest.mark.parametrize("name", SMALL + FULL)
def test_heuristic_is_legal_everywhere(name: str) -> None:
    g = load_graph(EXAMPLES / name)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = heuristic_schedule(plan, DEV, space)
    assert space.violations(s) == []
    prog = lower(g, plan, s, DEV, space)
    assert prog.launches and all(l.grid >= 1 for l in prog.launches)


# --------------------------------------------------------------------------------- golden files
GOLDEN_CASES = {
    "layernorm_small_warp": ("layernorm_small.json",
                             Schedule(32, 256, 1, 4, 1, 1, ("local", "local"), ("register", "register"))),
    "softmax_small_regional": ("softmax_small.json",
                               Schedule(128, 256, 1, 2, 2, 0, ("regional", "independent"),
                                        ("shared", "recompute", "register"))),
    "layernorm_wide_small_split": ("layernorm_wide_small.json",
                                   Schedule(256, 256, 4, 4, 0, 0, ("global", "global"), ("register", "recompute"))),
    "colsum_small_global": ("colsum_sigmoid_scale_small.json",
                            Schedule(8, 256, 8, 4, 0, 0, ("global",), ("global",))),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden_rendered_source(case: str) -> None:
    fname, s = GOLDEN_CASES[case]
    g = load_graph(EXAMPLES / fname)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    src = render(lower(g, plan, s, DEV, space))
    assert src == render(lower(g, plan, s, DEV, space))  # deterministic
    assert_matches_golden(GOLDEN / f"{case}.cu", src, f"rendered source of {case}")


# --------------------------------------------------------------------------------- plan and space
def test_plan_families_and_classes() -> None:
    ln = make_plan(load_graph(EXAMPLES / "layernorm.json"))
    assert (ln.family, ln.M, ln.N) == ("row", 16384, 1024)
    assert ln.cls("gamma") is TensorClass.PER_REDUCED and ln.cls("mean") is TensorClass.PER_KEPT
    assert ln.cls("y") is TensorClass.FULL
    assert ln.nstages == 2 and "x" in ln.reuse_candidates
    col = make_plan(load_graph(EXAMPLES / "colsum_sigmoid_scale.json"))
    assert (col.family, col.M, col.N, col.nstages) == ("col", 65536, 1024, 1)
    bg = make_plan(load_graph(EXAMPLES / "bias_gelu.json"))
    assert bg.family == "elementwise" and bg.nstages == 0


def _g(nodes, inputs, outputs):
    return parse_graph({"name": "t", "inputs": inputs, "nodes": nodes, "outputs": outputs})


def test_rank3_row_and_column_reductions_collapse_to_2d() -> None:
    g = _g([{"id": "m", "op": "reduce_max", "args": ["x"], "axes": [-1], "keepdims": True},
            {"id": "y", "op": "sub", "args": ["x", "m"]}],
           {"x": {"shape": [4, 6, 10], "dtype": "float32"}}, ["y"])
    p = make_plan(g)
    assert (p.family, p.M, p.N) == ("row", 24, 10)
    g2 = _g([{"id": "s", "op": "reduce_sum", "args": ["x"], "axes": [0, 1]},
             {"id": "y", "op": "mul", "args": ["x", "s"]}],
            {"x": {"shape": [4, 6, 8], "dtype": "float32"}}, ["y"])
    p2 = make_plan(g2)
    assert (p2.family, p2.M, p2.N) == ("col", 24, 8)
    space = SearchSpace.for_plan(p2, DEV)
    inputs = random_inputs(g2, 1)
    ref = run_reference(g2, inputs)
    for s in sampled(space, 5):
        out = emulate_program(lower(g2, p2, s, DEV, space), inputs, coresident_limit=lambda k: 1 << 30)
        assert rel_err(out["y"], ref["y"]) < 1e-5


def test_unsupported_pattern_is_a_clear_error() -> None:
    # an output broadcast along part of the columns ([4, 1, 8] against rows 4, columns 6 x 8); one
    # broadcast along part of the rows is stored once (tests/plan/test_expand.py)
    g = _g([{"id": "p2", "op": "mul", "args": ["pos", 2.0]}, {"id": "a", "op": "add", "args": ["x", "p2"]},
            {"id": "s", "op": "reduce_sum", "args": ["a"], "axes": [1, 2], "keepdims": True},
            {"id": "y", "op": "div", "args": ["a", "s"]}],
           {"x": {"shape": [4, 6, 8], "dtype": "float32"}, "pos": {"shape": [4, 1, 8], "dtype": "float32"}},
           ["y", "p2"])
    with pytest.raises(UnsupportedGraphError, match="output 'p2' .* broadcasts along part of the axes"):
        make_plan(g)


def test_illegal_schedule_names_every_violation() -> None:
    g = load_graph(EXAMPLES / "layernorm_small.json")
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    bad = Schedule(64, 32, 2, 4, 1, 0, ("local", "local"), ("register", "register"))
    with pytest.raises(ScheduleError) as e:
        lower(g, plan, bad, DEV, space)
    text = " ".join(e.value.problems)
    assert "threads per row exceed the block" in text and "scheme local is not legal" in text


@pytest.mark.parametrize("to", ["float16", "bfloat16"])
def test_casts_to_16_bit_round_inside_the_kernel(to: str) -> None:
    """A float32 output computed through a 16-bit cast matches the reference (which rounds at the
    cast) at the float32 tolerance: the kernel rounds its float32 register there too."""
    g = _g([{"id": "h", "op": "cast", "args": ["x"], "to": to},
            {"id": "m", "op": "reduce_mean", "args": ["h"], "axes": [-1], "keepdims": True},
            {"id": "d", "op": "sub", "args": ["h", "m"]},
            {"id": "y", "op": "cast", "args": ["d"], "to": "float32"}],
           {"x": {"shape": [64, 256], "dtype": "float32"}}, ["y"])
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, 3)
    ref = run_reference(g, inputs)
    for s in sampled(space, 6):
        prog = lower(g, plan, s, DEV, space)
        rounding = {"float16": "__half2float(__float2half_rn(",
                    "bfloat16": "__bfloat162float(__float2bfloat16_rn("}[to]
        assert any(rounding in render_kernel(k) for k in prog.kernels)
        out = emulate_program(prog, inputs, coresident_limit=lambda k: 1 << 30)
        assert rel_err(out["y"], ref["y"]) < 1e-5


