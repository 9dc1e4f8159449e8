"""The mask and clamp ops end to end: for each of them, a tiny graph (a bool input broadcast along
the rows, NaN / infinities / ties planted in the float inputs) emulates bit for bit like the
reference for the heuristic schedule and seeded samples (vector widths included), and the rendered
CUDA of all of them compiles for sm_90."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.gpu.render import render
from stitchtune.hardware.device import get_device
from stitchtune.ir import kir
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

from helpers.nvcc import batch_source, ptxas_report

DEV = get_device("H200")
INF = float("inf")

#: name -> nodes computing ``o`` (float) from x, y [4, 64] float32 and m [1, 64] bool
CASES: dict[str, list[dict]] = {
    **{f"{op}_xy": [{"id": "c", "op": op, "args": ["x", "y"]}, {"id": "o", "op": "cast", "args": ["c"], "to": "float32"}]
       for op in ("lt", "le", "gt", "ge", "eq", "ne")},
    **{f"{op}_const": [{"id": "c", "op": op, "args": [0.25, "x"]}, {"id": "o", "op": "cast", "args": ["c"], "to": "float32"}]
       for op in ("lt", "ge", "ne")},
    **{op: [{"id": "a", "op": "gt", "args": ["x", 0.0]}, {"id": "b", "op": op, "args": ["a", "m"]},
            {"id": "o", "op": "cast", "args": ["b"], "to": "float32"}] for op in ("logical_and", "logical_or")},
    "logical_not": [{"id": "n", "op": "logical_not", "args": ["m"]}, {"id": "o", "op": "where", "args": ["n", "x", "y"]}],
    "where_mask_inf": [{"id": "o", "op": "where", "args": ["m", "x", -INF]}],
    "where_consts": [{"id": "c", "op": "le", "args": ["x", "y"]}, {"id": "w", "op": "where", "args": ["c", 1.5, -2.0]},
                     {"id": "o", "op": "add", "args": ["w", "x"]}],
    "clamp_consts": [{"id": "o", "op": "clamp", "args": ["x", -0.5, 0.5]}],
    "clamp_tensor_hi": [{"id": "o", "op": "clamp", "args": ["x", -0.5, "y"]}],
    "cast_to_bool": [{"id": "b", "op": "cast", "args": ["x"], "to": "bool"}, {"id": "o", "op": "cast", "args": ["b"], "to": "float32"}],
    "bool_mask_fill_rowmax": [{"id": "z", "op": "where", "args": ["m", "x", -1e4]},
                              {"id": "mx", "op": "reduce_max", "args": ["z"], "axes": [1], "keepdims": True},
                              {"id": "o", "op": "sub", "args": ["z", "mx"]}],
}


def _graph(name: str):
    return parse_graph({"name": name, "inputs": {"x": {"shape": [4, 64], "dtype": "float32"},
                                                 "y": {"shape": [4, 64], "dtype": "float32"},
                                                 "m": {"shape": [1, 64], "dtype": "bool"}},
                        "nodes": CASES[name], "outputs": ["o"]})


def _inputs(g) -> dict[str, np.ndarray]:
    ins = random_inputs(g, 3)
    x, y = ins["x"], ins["y"]
    x[0, :4] = [np.nan, INF, -INF, 0.0]
    y[0, 4:8] = [np.nan, INF, -INF, np.nan]
    x[1, :8] = y[1, :8]  # ties: eq / le / ge differ from lt / gt there
    x[2, :3] = [0.25, -0.0, -0.5]
    if g.reductions():  # reduce_max's NaN handling is not what this file tests (fmaxf drops NaN)
        x[np.isnan(x)] = 0.5
        y[np.isnan(y)] = 0.5
    if "m" in ins:
        assert ins["m"].dtype == np.bool_ and ins["m"].any() and not ins["m"].all()
    return ins


def _programs(g, n_samples: int) -> list[kir.Program]:
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    scheds = [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(n_samples)]
    return [lower(g, plan, s, DEV, space) for s in scheds]


@pytest.mark.parametrize("name", sorted(CASES))
def test_emulated_equals_reference(name: str) -> None:
    g = _graph(name)
    ins = _inputs(g)
    ref = run_reference(g, ins)["o"]
    for prog in _programs(g, 8):
        out = emulate_program(prog, ins, coresident_limit=lambda k: 1 << 30)["o"].reshape(ref.shape)
        np.testing.assert_array_equal(out, ref)  # NaN where the reference has NaN, every other bit equal


def test_some_schedule_loads_the_bool_mask_vectorised() -> None:
    """The byte tensor goes through the vector path too (one aligned 2..8-byte load, bytes converted)."""
    srcs = [render(p) for p in _programs(_graph("where_mask_inf"), 8)]
    assert any("const unsigned char* __restrict__" in s for s in srcs)
    assert any("reinterpret_cast<const unsigned char*>" in s for s in srcs)


@pytest.mark.slow
def test_rendered_programs_compile_for_sm90(tmp_path: Path) -> None:
    """Every case's heuristic and two sampled programs, in one translation unit (one nvcc call)."""
    progs = [prog for name in sorted(CASES) for prog in _programs(_graph(name), 2)]
    src, names = batch_source(progs)
    report = ptxas_report(src, tmp_path, 300)
    assert set(re.findall(r"Compiling entry function '(\w+)'", report)) == set(names)


_VALUES = [float("nan"), INF, -INF, 0.0, -0.0, 0.25, -0.5, 1.0, 2.0, -3.0]
_NEW_OPS = ("lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or", "logical_not", "where", "clamp")


def _operand_sets(op: str) -> list[tuple[float, ...]]:
    from itertools import product

    from stitchtune.graph.ops import OPS

    info = OPS[op]
    pools = [[0.0, 1.0] if info.arg_type(i) == "b" else _VALUES for i in range(info.arity)]
    return list(product(*pools))


def test_cuda_templates_compute_what_the_reference_computes(tmp_path: Path) -> None:
    """Each new op's CUDA template, compiled as host code by nvcc (same front end, no GPU needed),
    gives the bits np_fn gives on every combination of NaN, +-inf, +-0 and ordinary values (any NaN
    matches any NaN); the kernel op ``to_bool`` (cast to bool) too."""
    from stitchtune.graph.ops import kernel_op

    nvcc = shutil.which("nvcc") or shutil.which("/usr/local/cuda/bin/nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    ops = (*_NEW_OPS, "to_bool")
    lines = ["#include <cstdio>", "#include <cstring>", "#include <cmath>"]
    calls, expected = [], []
    for op in ops:
        info = kernel_op(op)
        params = ", ".join(f"float a{i}" for i in range(info.arity))
        body = info.render(*[f"a{i}" for i in range(info.arity)])
        lines.append(f"__host__ __device__ float f_{op}({params}) {{ return {body}; }}")
        sets = _operand_sets(op) if op != "to_bool" else [(v,) for v in _VALUES]
        for args in sets:
            lits = ", ".join(f"__builtin_bit_cast(float, {int(np.float32(a).view(np.uint32))}u)" for a in args)
            calls.append(f"  pr(f_{op}({lits}));")
            with np.errstate(all="ignore"):
                expected.append(np.float32(info.np_fn(*[np.array([a], np.float32) for a in args])[0]))
    lines.append("static void pr(float v) { unsigned u; std::memcpy(&u, &v, 4); std::printf(\"%u\\n\", u); }")
    lines += ["int main() {", *calls, "  return 0;", "}"]
    (tmp_path / "t.cu").write_text("\n".join(lines) + "\n")
    r = subprocess.run([nvcc, "-O2", "-std=c++20", "-o", "t", "t.cu"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = np.array([int(s) for s in subprocess.run([str(tmp_path / "t")], capture_output=True, text=True,
                                                   check=True).stdout.split()], np.uint32).view(np.float32)
    want = np.array(expected, np.float32)
    assert got.shape == want.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))  # -0.0 and 0.0 differ


@pytest.mark.parametrize("name,flops_per_elem", [("clamp_consts", 5), ("where_mask_inf", 1), ("lt_xy", 1),
                                                 ("logical_and", 3)])
def test_cost_model_counts_the_new_ops_flops(name: str, flops_per_elem: int) -> None:
    """Element-wise graphs: one kernel whose ``flops`` are the op table's per-element counts x elements
    (clamp's NaN tests and min/max: 5; gt + logical_and: 1 + 2; casts count 0, as before)."""
    from stitchtune.graph.ops import OPS

    g = _graph(name)
    assert sum(OPS[n.op].flops for n in g.nodes) == flops_per_elem
    assert make_plan(g).family == "elementwise"
    for prog in _programs(g, 3):
        assert [kp.flops for kp in prog.profile.kernels] == [flops_per_elem * 4 * 64]
