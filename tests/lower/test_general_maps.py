"""General index maps in both families: operands that vary along part of the column axes (group
norm's per-channel gamma, in uniform / vector / scalar loads), middle-axis reductions (column kernels
whose operands and outputs are addressed through two-factor column maps) and strided-column row
kernels match the float64 reference in the emulator (which faults on any out-of-bounds, misaligned,
unwritten or racy access) for the heuristic and seeded samples, the prefetch path included."""

from __future__ import annotations

import dataclasses
import random

import pytest

from pathlib import Path

from helpers.lowering import DEV, float_graph as _graph, rel_err, setup
from helpers.nvcc import compile_programs_sm90
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.gpu.render import render
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace


def _norm(x: str, axes: list[int], tail: list[dict]) -> list[dict]:
    """``n = (x - mean) * rsqrt(var + eps)`` over ``axes`` (two stages), then ``tail``."""
    return [{"id": "m", "op": "reduce_mean", "args": [x], "axes": axes, "keepdims": True},
            {"id": "d", "op": "sub", "args": [x, "m"]},
            {"id": "q", "op": "mul", "args": ["d", "d"]},
            {"id": "v", "op": "reduce_mean", "args": ["q"], "axes": axes, "keepdims": True},
            {"id": "e", "op": "add", "args": ["v", 1e-5]},
            {"id": "rs", "op": "rsqrt", "args": ["e"]},
            {"id": "n", "op": "mul", "args": ["d", "rs"]}] + tail


_AFFINE = [{"id": "a", "op": "mul", "args": ["n", "g"]}, {"id": "y", "op": "add", "args": ["a", "b"]}]

CASES = {
    # gamma/beta per channel: column factor (Cg, inner HW): one load per vector (HW % vec == 0)
    "group_norm_uniform": _graph({"x": [2, 4, 2, 16], "g": [1, 4, 2, 1], "b": [1, 4, 2, 1]},
                                 _norm("x", [2, 3], _AFFINE), ["y"]),
    # HW = 3: a vector spans two channels: one scalar load per element
    "group_norm_scalar": _graph({"x": [2, 3, 4, 3], "g": [1, 3, 4, 1], "b": [1, 1, 4, 1]},
                                _norm("x", [2, 3], _AFFINE), ["y", "v"]),
    # x - mean over the middle axis: a column kernel over (B*C), x and y through two column factors
    "middle_center": _graph({"x": [2, 6, 32], "w": [1, 1, 32]},
                            [{"id": "m", "op": "reduce_mean", "args": ["x"], "axes": [1], "keepdims": True},
                             {"id": "d", "op": "sub", "args": ["x", "m"]},
                             {"id": "y", "op": "mul", "args": ["d", "w"]}], ["y", "m"]),
    "middle_norm_odd": _graph({"x": [3, 5, 6], "t": [1, 5, 1]},
                              _norm("x", [1], [{"id": "y", "op": "mul", "args": ["n", "t"]}]), ["y", "v"]),
    # reduction over the outer and inner axes: a row kernel whose columns are strided
    "outer_inner_reduce": _graph({"x": [3, 5, 8]},
                                 [{"id": "s", "op": "reduce_max", "args": ["x"], "axes": [0, 2], "keepdims": True},
                                  {"id": "y", "op": "sub", "args": ["x", "s"]}], ["y"]),
    # a column reduction over the leading axes with a per-channel scale: per-row, partial rows
    "col_channel_scale": _graph({"x": [4, 6, 16], "w": [1, 6, 1]},
                                [{"id": "a", "op": "mul", "args": ["x", "w"]},
                                 {"id": "s", "op": "reduce_sum", "args": ["a"], "axes": [0, 1], "keepdims": True},
                                 {"id": "y", "op": "sub", "args": ["a", "s"]}], ["y", "s"]),
    # a transposed view: the reduced axis is x's middle one; y [B, C, T] stored one element at a time
    "transpose_reduce": _graph({"x": [2, 6, 32]},
                               [{"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 2, 1]},
                                {"id": "m", "op": "reduce_max", "args": ["t"], "axes": [2], "keepdims": True},
                                {"id": "y", "op": "sub", "args": ["t", "m"]}], ["y", "m"]),
}

#: the new examples (small sizes), emulated and compiled like the cases above
EXAMPLES = ("group_norm_silu_small.json", "middle_center_small.json")


def _schedules(space: SearchSpace, plan, n: int) -> list:
    """The heuristic, ``n`` seeded samples, and prefetch / alternate-order and single-pass (Welford)
    variants where legal."""
    out = [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(200 + i)) for i in range(n)]
    extra = [dataclasses.replace(s, prefetch=1, order="alternate") for s in out]
    extra += [dataclasses.replace(s, single_pass=1) for s in out[:3]]
    return out + [s for s in extra if not space.violations(s)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_general_maps_match_the_reference(case: str) -> None:
    g = CASES[case]
    plan = make_plan(g)
    assert any(plan.mapped(n) for n, _ in plan.index_maps)
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, 5)
    ref = run_reference(g, inputs)
    scheds = _schedules(space, plan, 8)
    assert len({s.vec for s in scheds}) > 1, "one vector width only"
    for s in scheds:
        out = emulate_program(lower(g, plan, s, DEV, space), inputs, coresident_limit=lambda k: 1 << 30)
        for o in ref:
            assert rel_err(out[o], ref[o]) < 1e-5, (case, s.to_json(), o)


def test_load_kinds_follow_the_map() -> None:
    """gamma of a group norm: one scalar load per vector (uniform) or per element; x of a middle
    reduction: vector loads through its two column factors."""
    from stitchtune.ir import kir

    def loads(case: str, vec: int) -> tuple[int, int]:
        g = CASES[case]
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, DEV)
        s = next(s for s in (space.sample(random.Random(i)) for i in range(400)) if s.vec == vec)
        prog = lower(g, plan, s, DEV, space)
        in_g = {b.name for b in prog.buffers if b.tensor in ("g", "x")}
        body = [st for k in prog.kernels for st in kir.walk(k.body)]
        nvec = sum(1 for st in body if isinstance(st, kir.LoadVec) and st.buf in in_g and len(st.dsts) == vec)
        nscal = sum(1 for st in body if isinstance(st, kir.Assign) and isinstance(st.expr, kir.Load)
                    and st.expr.buf in in_g)
        return nvec, nscal

    assert loads("middle_center", 4)[0] > 0
    assert loads("group_norm_scalar", 2)[1] >= 2
    src = render(lower(CASES["middle_center"], make_plan(CASES["middle_center"]),
                       heuristic_schedule(make_plan(CASES["middle_center"]), DEV,
                                          SearchSpace.for_plan(make_plan(CASES["middle_center"]), DEV)), DEV))
    assert "/ 32)" in src and "% 32)" in src  # x's column map: (c // C) * T * C + c % C


@pytest.mark.parametrize("name", EXAMPLES)
def test_new_examples_match_the_reference(name: str) -> None:
    g, plan, space = setup(name)
    inputs = random_inputs(g, 7)
    ref = run_reference(g, inputs)
    for s in _schedules(space, plan, 6):
        out = emulate_program(lower(g, plan, s, DEV, space), inputs, coresident_limit=lambda k: 1 << 30)
        for o in ref:
            assert rel_err(out[o], ref[o]) < 1e-5, (name, s.to_json(), o)


@pytest.mark.slow
def test_rendered_programs_compile_for_sm90(tmp_path: Path) -> None:
    """Every new kernel shape (each case and example: the heuristic and two samples, vector widths
    and load kinds mixed) renders to CUDA that nvcc compiles for sm_90: all of them in one translation
    unit, one nvcc call (``helpers.nvcc.compile_programs_sm90``: each nvcc process costs ~0.8 s of CPU before
    it compiles anything), where ptxas must report every kernel."""
    graphs = [(c, CASES[c], make_plan(CASES[c])) for c in sorted(CASES)]
    graphs += [(n, *setup(n)[:2]) for n in EXAMPLES]
    programs = []
    for _, g, plan in graphs:
        space = SearchSpace.for_plan(plan, DEV)
        scheds = [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(300 + j)) for j in range(2)]
        programs += [lower(g, plan, s, DEV, space) for s in scheds]
    regs = compile_programs_sm90(programs, tmp_path)
    assert len(regs) == len(programs) == 3 * len(graphs)
    assert all(regs)  # every program has kernels, each one in the report


def _heuristic_program(g, plan):
    space = SearchSpace.for_plan(plan, DEV)
    s = heuristic_schedule(plan, DEV, space)
    return s, space, lower(g, plan, s, DEV, space)


@pytest.mark.parametrize("name", sorted(CASES) + [e.replace("_small", "") for e in EXAMPLES] + list(EXAMPLES))
def test_the_heuristic_is_legal_for_every_new_graph(name: str, caplog) -> None:
    g = CASES[name] if name in CASES else setup(name)[0]
    plan = make_plan(g)
    with caplog.at_level("WARNING", logger="stitchtune.cost.heuristic"):
        s, space, prog = _heuristic_program(g, plan)
    assert not space.violations(s) and not caplog.records, [r.getMessage() for r in caplog.records]
    from stitchtune.cost.model import predict
    assert predict(prog.profile, DEV).prune_reason is None


def test_the_profile_counts_mapped_bytes() -> None:
    """group norm: gamma and beta (2 KiB each) are read once, not once per element of x; a transposed
    output of 64 MiB is written one 32-byte sector per element (8x its size), the plain one 1x."""
    from stitchtune.cost.model import predict

    g, plan, _ = setup("group_norm_silu.json")
    _, _, prog = _heuristic_program(g, plan)
    k0 = prog.profile.kernels[0]
    assert len(prog.profile.kernels) == 1
    assert k0.dram_read_bytes == (8 * 512 * 32 * 32 + 2 * 512) * 4
    B, T, C = 16, 512, 1024
    nodes = [{"id": "m", "op": "reduce_max", "args": ["t"], "axes": [2], "keepdims": True},
             {"id": "y", "op": "sub", "args": ["t", "m"]}]
    trans = _graph({"x": [B, T, C]}, [{"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 2, 1]}] + nodes, ["y"])
    plain = _graph({"x": [B, C, T]}, [{"id": "t", "op": "exp", "args": ["x"]}] + nodes, ["y"])
    writes = {}
    for key, gg in (("trans", trans), ("plain", plain)):
        pl = make_plan(gg)
        _, _, pr = _heuristic_program(gg, pl)
        writes[key] = sum(k.dram_write_bytes for k in pr.profile.kernels)
        assert predict(pr.profile, DEV).prune_reason is None
    out_bytes = B * T * C * 4
    assert writes["trans"] >= 8 * out_bytes and out_bytes <= writes["plain"] < 2 * out_bytes
