"""float64 graph inputs (issue 41 item 3): a framework's float64 scalar (dynamo's unspecialised Python
float: ``eps``, ``math.pi``, rotary's ``attention_scaling``) is a graph input that only ``cast`` reads;
kernels load it rounded to float32 (``__double2float_rn``; the emulator's ``astype(float32)``), and
never compute or store float64. Validation (one named line per misuse), the emulated kernel against the
reference, and the rendered CUDA through nvcc where it is installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stitchtune.errors import GraphError
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import run_reference

INS = {"x": {"shape": [4, 96], "dtype": "float32"}, "s": {"shape": [1], "dtype": "float64"}}
NODES = [{"id": "s32", "op": "cast", "args": ["s"], "to": "float32"},
         {"id": "y", "op": "mul", "args": ["x", "s32"]},
         {"id": "z", "op": "reduce_sum", "args": ["y"], "axes": [1], "keepdims": True},
         {"id": "o", "op": "div", "args": ["y", "z"]}]


def _g(nodes: list[dict], outputs: tuple[str, ...] = ("o",)) -> dict:
    return {"name": "scale64", "inputs": INS, "nodes": nodes, "outputs": list(outputs)}


def _problems(d: dict) -> list[str]:
    with pytest.raises(GraphError) as e:
        parse_graph(d)
    return e.value.problems


def test_a_float64_input_read_by_cast_is_valid() -> None:
    g = parse_graph(_g(NODES))
    assert g.spec("s").dtype == "float64" and g.spec("s32").dtype == "float32"
    assert parse_graph(g.to_dict()) == g


@pytest.mark.parametrize("node, want", [
    ({"id": "o", "op": "mul", "args": ["x", "s"]},
     "nodes[0].args[1]: mul cannot take 's' (float64): a float64 input is read only by cast"),
    ({"id": "o", "op": "reshape", "args": ["s"], "shape": [1, 1]}, "reshape cannot take 's' (float64)"),
    ({"id": "o", "op": "cast", "args": ["x"], "to": "float64"}, "nodes[0].to: cast cannot make float64"),
])
def test_float64_misuse_is_one_named_problem(node: dict, want: str) -> None:
    problems = _problems(_g([node]))
    assert any(want in p for p in problems), problems


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    # a value float32 cannot hold exactly: the kernel's load rounds it to nearest
    return {"x": rng.standard_normal((4, 96)).astype(np.float32), "s": np.array([0.1234567890123456])}


def _program(g: Any) -> Any:
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    dev = get_device("H200")
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, dev)
    return lower(g, plan, heuristic_schedule(plan, dev, space), dev, space)


def test_emulated_kernel_loads_the_float64_input_rounded_to_float32() -> None:
    from stitchtune.emulate.emulator import emulate_program

    g = parse_graph(_g(NODES))
    prog = _program(g)
    assert [b.dtype for b in prog.buffers if b.tensor == "s"] == ["float64"]
    ins = _inputs()
    got = emulate_program(prog, ins)["o"].reshape(4, 96)
    want = run_reference(g, ins)["o"]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    # the same graph with the scalar rounded to float32 first: the load is that rounding
    want32 = run_reference(g, {**ins, "s": ins["s"].astype(np.float32).astype(np.float64)})["o"]
    np.testing.assert_allclose(got, want32, rtol=2e-6, atol=1e-7)
    assert all(p.dtype != "float64" for k in prog.kernels for p in k.params if p.role != "input")


def test_rendered_kernel_reads_double_and_compiles(tmp_path: Path) -> None:
    from stitchtune.gpu.build import NvccBuilder, nvcc_found
    from stitchtune.gpu.render import render

    src = render(_program(parse_graph(_g(NODES))))
    assert "const double*" in src and "st_ld(const double* p) { return __double2float_rn(*p); }" in src
    if not nvcc_found():
        pytest.skip("nvcc not installed")
    (r,) = NvccBuilder(jobs=1, cache_dir=tmp_path).build([src])
    assert r.status == "ok", r.error
