"""Fast arithmetic (issue 39): ``exp`` through ``ex2.approx``, a per-row reciprocal and a multiply for a
division by a per-row value, ``__fdividef`` elsewhere; ``exact_math`` 1 keeps CUDA's accurate forms.

The emulator models what the GPU computes (:mod:`stitchtune.graph.fast_ops`), so the errors below are
those of the kernels' arithmetic against the float64 reference; the documented tolerance
(``docs/fast-math.md``) is a relative L2 error below 1e-5 per float32 output.
"""

from __future__ import annotations

import dataclasses
import random
import re
import shutil
import subprocess

import numpy as np
import pytest

from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.fast_ops import fast_div, fast_exp
from stitchtune.graph.parse import load_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.gpu.render import render
from stitchtune.hardware.device import get_device
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

from helpers.common import REPO
from helpers.lowering import check_emulates, float_graph, rel_err
from stitchtune.space.options import EXACT_MATH

DEV = get_device("H200")


def _softmax(exact: int):
    g = load_graph(REPO / "examples" / "softmax_small.json")
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = dataclasses.replace(heuristic_schedule(plan, DEV, space), exact_math=exact)  # type: ignore[call-arg]
    return g, plan, space, s


def test_fast_exp_model_is_within_a_few_ulp_of_exp() -> None:
    x = np.linspace(-87.0, 88.0, 200001, dtype=np.float32)
    want = np.exp(x.astype(np.float64))
    got = fast_exp(x).astype(np.float64)
    assert got.dtype == np.float64 and np.max(np.abs(got / want - 1)) < 1e-5  # argument rounding of x * log2 e
    assert fast_exp(np.float32(-104.0)) == 0.0  # below the smallest normal: flushed, as ex2.approx.ftz


def test_fast_div_model() -> None:
    a = np.array([1.0, 3.0, -2.0, 5.0], np.float32)
    b = np.array([3.0, 7.0, 1e-3, 2.0 ** 127], np.float32)
    got = fast_div(a, b)
    assert np.allclose(got[:3], (a / b)[:3], rtol=2e-7) and got[3] == 0.0  # __fdividef's range gives 0


def test_fast_gelu_tanh_model() -> None:
    """GELU's tanh form through exp and a fast division: within 6e-7 of the float64 reference (the float32
    tanhf form: 4.6e-7), the limits right (-0 far left, x far right), and rendered without tanhf."""
    from stitchtune.graph.fast_ops import FAST_KERNEL_OPS, fast_gelu_tanh
    from stitchtune.graph.ops import OPS

    x = np.concatenate([np.linspace(-20.0, 20.0, 200001), np.random.default_rng(0).normal(0, 3, 100000)])
    x = x.astype(np.float32)
    want = OPS["gelu_tanh"].np_fn(x.astype(np.float64))
    got = fast_gelu_tanh(x)
    assert got.dtype == np.float32 and np.max(np.abs(got - want)) < 6e-7
    assert fast_gelu_tanh(np.float32(-60.0)) == 0.0 and fast_gelu_tanh(np.float32(60.0)) == np.float32(60.0)
    assert "tanhf" not in FAST_KERNEL_OPS["fast_gelu_tanh"][1]


def test_fast_tanh_model_and_integer_powers() -> None:
    """tanh without branches: within 1e-6 relative of the float64 reference (float32 tanhf: 1.1e-7), exact
    signs and limits; x ** 3 lowered as products (GPT-2's GELU), powf kept with exact_math 1."""
    from stitchtune.graph.fast_ops import fast_tanh

    x = np.concatenate([np.linspace(-20.0, 20.0, 400001), np.geomspace(1e-30, 1.0, 1000),
                        -np.geomspace(1e-30, 1.0, 1000)]).astype(np.float32)
    want = np.tanh(x.astype(np.float64))
    got = fast_tanh(x).astype(np.float64)
    assert np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-38)) < 1e-6
    assert fast_tanh(np.float32(100.0)) == 1.0 and fast_tanh(np.float32(-100.0)) == -1.0 and fast_tanh(np.float32(0.0)) == 0.0
    g = float_graph({"x": [4, 64]}, [{"id": "p", "op": "pow", "args": ["x", 3.0]},
                                     {"id": "y", "op": "tanh", "args": ["p"]}], ["y"])
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = heuristic_schedule(plan, DEV, space)
    fast, exact = (render(lower(g, plan, dataclasses.replace(s, exact_math=e), DEV, space)) for e in (0, 1))
    assert "powf" not in fast and "tanhf" not in fast and "st_tanh(" in fast and "ex2.approx.ftz.f32" in fast
    assert "powf" in exact and "tanhf" in exact
    check_emulates(g, 2, 3)


def test_softmax_renders_fast_forms_and_exact_ones_on_request() -> None:
    g, plan, space, s = _softmax(0)
    src = render(lower(g, plan, s, DEV, space))
    assert "st_exp(" in src and "expf(" not in src and "ex2.approx.ftz.f32" in src
    assert len(re.findall(r"st_fdiv\(1\.0f, acc\d+\)", src)) == 1   # one reciprocal per row
    assert not re.search(r"/ acc\d+\)", src)                            # no per-element division
    g, plan, space, s = _softmax(1)
    src = render(lower(g, plan, s, DEV, space))
    assert "st_exp" not in src and "st_fdiv" not in src and "ex2.approx" not in src and re.search(r"/ acc\d+\)", src)


@pytest.mark.parametrize("exact", [0, 1])
def test_softmax_of_wide_range_scores_within_tolerance(exact: int) -> None:
    g, plan, space, s = _softmax(exact)
    inputs = {k: (v * 30.0).astype(v.dtype) for k, v in random_inputs(g, 3).items()}  # exp over ~ +-60
    ref = run_reference(g, inputs)
    out = emulate_program(lower(g, plan, s, DEV, space), inputs)
    assert rel_err(out["y"], ref["y"]) < 1e-5


def test_exact_math_is_never_drawn() -> None:
    g = load_graph(REPO / "examples" / "softmax_small.json")
    space = SearchSpace.for_plan(make_plan(g), DEV)
    assert all(space.sample(random.Random(i)).option(EXACT_MATH) == 0 for i in range(20))
    _, _, _, s = _softmax(1)
    assert '"exact_math":1' in s.to_json() and not space.violations(s)


def _tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    import glob
    import os
    for base in nvidia.__path__:
        for p in glob.glob(os.path.join(base, "*", "bin", name)):
            return p
    return None


def _sass(tmp_path, name: str, source: str) -> str:
    """sm_90 SASS of ``source`` (skips the test without nvcc / cuobjdump / nvdisasm)."""
    import os

    from stitchtune.gpu.build import find_nvcc

    cuobjdump, nvdisasm = _tool("cuobjdump"), _tool("nvdisasm")
    if cuobjdump is None or nvdisasm is None or shutil.which("nvcc") is None:
        pytest.skip("nvcc / cuobjdump / nvdisasm not available")
    src, cubin = tmp_path / f"{name}.cu", tmp_path / f"{name}.cubin"
    src.write_text(source)
    subprocess.run([find_nvcc(), "-cubin", "-arch=sm_90", "-O3", "-o", str(cubin), str(src)], check=True,
                   capture_output=True, timeout=300)
    env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run([cuobjdump, "-sass", str(cubin)], check=True, capture_output=True, text=True,
                          timeout=300, env=env).stdout


def test_softmax_sass_has_no_division_slow_path(tmp_path) -> None:
    """sm_90 SASS of the fast softmax: MUFU.EX2 per element, one MUFU.RCP, no FCHK and no CALL (the IEEE
    division's check and slow path), no FSETP (``__expf``'s subnormal fix-up, an FSETP and two predicated
    FMULs per element, gone with ``ex2.approx.ftz``); the exact one has them."""
    counts = {}
    for exact in (0, 1):
        g, plan, space, s = _softmax(exact)
        sass = _sass(tmp_path, f"k{exact}", render(lower(g, plan, s, DEV, space)))
        counts[exact] = {op: len(re.findall(rf"\b{re.escape(op)}\b", sass))
                         for op in ("MUFU.EX2", "MUFU.RCP", "FCHK", "CALL", "FSETP")}
    fast, exact_ = counts[0], counts[1]
    assert fast["FCHK"] == 0 and fast["CALL"] == 0 and fast["MUFU.RCP"] == 1 and fast["MUFU.EX2"] >= 8
    assert fast["FSETP"] == 0
    assert exact_["FCHK"] > 0


def test_fast_tanh_and_sigmoid_sass_have_no_branch_per_element(tmp_path) -> None:
    """sm_90 SASS of fast ``tanh`` and ``sigmoid`` kernels: both arms of ``tanh`` computed and one selected
    (the ternary of ``__expf`` / ``__fdividef`` arms compiled to a branch per element, BSSY/BSYNC), no
    subnormal fix-up predicates on the MUFU results."""
    for op in ("tanh", "sigmoid"):
        g = float_graph({"x": [64, 1024]}, [{"id": "y", "op": op, "args": ["x"]}], ["y"])
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, DEV)
        sass = _sass(tmp_path, op, render(lower(g, plan, heuristic_schedule(plan, DEV, space), DEV, space)))
        ex2 = len(re.findall(r"\bMUFU\.EX2\b", sass))
        assert ex2 >= 4, op
        assert not re.search(r"\bBSSY\b", sass), op
        assert not re.search(r"@!?P\d+ FMUL (R\d+), \1, \1 ;", sass), op   # ex2's r*r fix-up
