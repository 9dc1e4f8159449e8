"""Int graph inputs read by ``cast`` (an int64 attention mask cast to bool, int ids cast to floats):
emulated kernels against the float64 reference with hostile values (beyond int32, negative, above
2**24), the rendered loads (the int's own width, vectors split into 16-byte accesses), the cost
model's bytes, and an nvcc sm_90 build of the new loads."""

from __future__ import annotations

import random

import numpy as np
import pytest

from helpers.lowering import DEV, emulated_errors
from helpers.nvcc import compile_programs_sm90
from test_bool_output_kernels import bool_output_programs
from test_int_ops_kernels import int_op_programs
from test_one_hot_kernels import one_hot_programs
from test_random_kernels import random_programs
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.gpu.build import nvcc_found
from stitchtune.gpu.render import render
from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

HOSTILE = np.array([0, 1, -1, 2**33, -(2**62), 2**40 + 3, 2**24 + 1, 7], np.int64)


def _mask_softmax(dt: str, B: int = 2, H: int = 2, S: int = 8):
    """BERT's padding mask: an int mask [B, S] viewed [B, 1, 1, S], cast to bool, where(m, 0, -big)
    added to the scores, then softmax over the last axis."""
    return parse_graph({"name": "t", "inputs": {"s": {"shape": [B, H, S, S], "dtype": "float32"},
                                                "m": {"shape": [B, S], "dtype": dt}}, "nodes": [
        {"id": "mr", "op": "reshape", "args": ["m"], "shape": [B, 1, 1, S]},
        {"id": "mb", "op": "cast", "args": ["mr"], "to": "bool"},
        {"id": "w", "op": "where", "args": ["mb", 0.0, -1e30]},
        {"id": "a", "op": "add", "args": ["s", "w"]},
        {"id": "mx", "op": "reduce_max", "args": ["a"], "axes": [3], "keepdims": True},
        {"id": "d", "op": "sub", "args": ["a", "mx"]},
        {"id": "e", "op": "exp", "args": ["d"]},
        {"id": "z", "op": "reduce_sum", "args": ["e"], "axes": [3], "keepdims": True},
        {"id": "y", "op": "div", "args": ["e", "z"]}], "outputs": ["y"]})


def _cast_mul(dt: str, to: str):
    return parse_graph({"name": "t", "inputs": {"x": {"shape": [4, 64], "dtype": "float32"},
                                                "m": {"shape": [4, 64], "dtype": dt}}, "nodes": [
        {"id": "mf", "op": "cast", "args": ["m"], "to": to},
        {"id": "y", "op": "mul", "args": ["x", "mf"]}], "outputs": ["y"]})


def _masked_max_f16():
    """A float16 row reduction reading an int64 mask: vec 8, so one int64 vector is four 16-byte loads."""
    return parse_graph({"name": "t", "inputs": {"x": {"shape": [8, 64], "dtype": "float16"},
                                                "m": {"shape": [8, 64], "dtype": "int64"}}, "nodes": [
        {"id": "mb", "op": "cast", "args": ["m"], "to": "bool"},
        {"id": "w", "op": "where", "args": ["mb", "x", -1e4]},
        {"id": "y", "op": "reduce_max", "args": ["w"], "axes": [1], "keepdims": True}], "outputs": ["y"]})


def _vec8(space, n: int):
    return [s for s in (space.sample(random.Random(i)) for i in range(300)) if s.vec == 8][:n]


def _schedules(g, n: int):
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    return plan, space, [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(n)]


@pytest.mark.parametrize("dt", ["int64", "int32"])
def test_int_mask_softmax_matches_the_reference(dt: str) -> None:
    g = _mask_softmax(dt)
    plan, space, scheds = _schedules(g, 4)
    x = random_inputs(g, 0)
    x["m"] = np.resize(HOSTILE if dt == "int64" else HOSTILE.astype(np.int32), x["m"].shape).astype(x["m"].dtype)
    ref = run_reference(g, x)
    assert ref["y"][0, 0, 0, 0] == 0.0 and ref["y"][0, 0, 0, 2] > 0  # 0 masks out, -1 does not
    if dt == "int64":
        assert ref["y"][0, 0, 0, 3] > 0  # nor does 2**33 (its low 32 bits are zero)
    for s in scheds:
        assert emulated_errors(g, plan, space, s, x, ref)["y"] < 1e-5, s.to_json()


@pytest.mark.parametrize("dt, to, vals", [
    ("int64", "float32", HOSTILE), ("int64", "bfloat16", np.array([2**25 + 2**17 + 1, -(2**33) - 5, 3, -7])),
    ("int32", "float16", np.array([65504, -2048, 2049, 1, 0, -1, 65519, 3]))])
def test_int_casts_to_floats_are_exact_against_the_reference(dt: str, to: str, vals: np.ndarray) -> None:
    g = _cast_mul(dt, to)
    plan, space, scheds = _schedules(g, 3)
    x = random_inputs(g, 1)
    x["x"] = np.ones_like(x["x"])
    x["m"] = np.resize(vals, x["m"].shape).astype(dt)
    ref = run_reference(g, x)
    for s in scheds:
        assert emulated_errors(g, plan, space, s, x, ref)["y"] == 0.0, s.to_json()


def test_int64_vec8_loads_match_the_reference() -> None:
    g = _masked_max_f16()
    plan, space, _ = _schedules(g, 0)
    x = random_inputs(g, 0)
    x["m"] = np.resize(HOSTILE, x["m"].shape)
    ref = run_reference(g, x)
    scheds = _vec8(space, 2)
    assert scheds and render(lower(g, plan, scheds[0], DEV, space)).count("reinterpret_cast<const uint4*>(in1") >= 4
    for s in scheds:
        assert emulated_errors(g, plan, space, s, x, ref)["y"] == 0.0, s.to_json()


def test_int_loads_render_in_their_width_and_bytes_count_so() -> None:
    g = _cast_mul("int64", "float32")
    plan, space, scheds = _schedules(g, 0)
    s = next(s for s in (space.sample(random.Random(i)) for i in range(200)) if s.vec == 4)
    prog = lower(g, plan, s, DEV, space)
    src = render(prog)
    assert src.count("*reinterpret_cast<const uint4*>(in1") == 2   # vec 4 of int64: two 16-byte loads
    assert "((float)(_v" in src
    assert sum(k.dram_read_bytes for k in prog.profile.kernels) == 4 * 64 * (4 + 8)


@pytest.mark.slow
@pytest.mark.skipif(not nvcc_found(), reason="nvcc not installed")
def test_int_loads_compile_for_sm90(tmp_path) -> None:
    programs = []
    for g in (_mask_softmax("int64"), _mask_softmax("int32"), _cast_mul("int64", "bfloat16"), _cast_mul("int32", "float16")):
        plan, space, scheds = _schedules(g, 2)
        programs += [lower(g, plan, s, DEV, space) for s in scheds]
    g = _masked_max_f16()
    plan, space, _ = _schedules(g, 0)
    programs += [lower(g, plan, s, DEV, space) for s in _vec8(space, 1)]
    programs += int_op_programs()  # int registers: iota, wrapping int64 arithmetic, int outputs
    programs += bool_output_programs()  # bool outputs: 0 / 1 bytes, one by one and packed in vectors
    programs += one_hot_programs()  # cross entropy's backward: a one-hot of an int register, [1] inputs
    programs += random_programs()  # uniform: dropout's random numbers drawn in the kernel
    compile_programs_sm90(programs, tmp_path)  # one nvcc call; fails the test on any error


_MAPS = {  # int64 inputs moved by index maps before their cast
    "expand": ({"x": [4, 8], "m": [1, 8]}, [
        {"id": "e", "op": "expand", "args": ["m"], "shape": [4, 8]}, {"id": "b", "op": "cast", "args": ["e"], "to": "bool"},
        {"id": "y", "op": "where", "args": ["b", "x", -5.0]},
        {"id": "z", "op": "reduce_sum", "args": ["y"], "axes": [1], "keepdims": True}]),
    "slice_concat": ({"x": [4, 16], "m": [4, 16]}, [
        {"id": "a", "op": "slice", "args": ["m"], "axis": 1, "start": 8, "stop": 16},
        {"id": "c", "op": "slice", "args": ["m"], "axis": 1, "start": 0, "stop": 8},
        {"id": "r", "op": "concat", "args": ["a", "c"], "axis": 1},
        {"id": "f", "op": "cast", "args": ["r"], "to": "float32"}, {"id": "z", "op": "mul", "args": ["x", "f"]}]),
    "transpose": ({"x": [8, 4], "m": [4, 8]}, [
        {"id": "t", "op": "transpose", "args": ["m"], "perm": [1, 0]}, {"id": "f", "op": "cast", "args": ["t"], "to": "float32"},
        {"id": "y", "op": "add", "args": ["x", "f"]}, {"id": "z", "op": "reduce_max", "args": ["y"], "axes": [1], "keepdims": True}]),
}


@pytest.mark.parametrize("case", sorted(_MAPS))
def test_index_maps_of_int_inputs_match_the_reference(case: str) -> None:
    if "expand" in case and "expand" not in OPS:
        pytest.skip("graph.json has no expand op")
    shapes, nodes = _MAPS[case]
    g = parse_graph({"name": "t", "inputs": {"x": {"shape": shapes["x"], "dtype": "float32"},
                                             "m": {"shape": shapes["m"], "dtype": "int64"}}, "nodes": nodes, "outputs": ["z"]})
    plan, space, scheds = _schedules(g, 3)
    x = random_inputs(g, 0)
    x["m"] = np.random.default_rng(2).integers(-(2**40), 2**40, x["m"].shape)
    ref = run_reference(g, x)
    for s in scheds:
        assert emulated_errors(g, plan, space, s, x, ref)["z"] < 1e-6, s.to_json()
