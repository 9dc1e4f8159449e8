"""Int values computed inside stitched kernels: a causal mask built from two ``iota``s, a comparison and a
``where`` into a softmax; position ids (``iota`` + an int64 offset, wrapping int arithmetic) stored as
int outputs; a float -> int cast; a bool ``reduce_sum`` count (per row, and cross entropy's
``ignore_index`` count over the rows). Every schedule checked is emulated
against the reference: int outputs bit-exact, float ones within 1e-5."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from helpers.lowering import DEV, rel_err
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.errors import UnsupportedGraphError
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.gpu.render import render
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

S = 8


def causal_softmax(pos_dtype: str = "int64") -> Any:
    """Llama's mask: ``where(iota_col <= iota_row + past, x, -inf)`` into a softmax; the position ids
    ``iota + past`` (int64, wrapping) and ``3 * pos - col`` cast to int32 as outputs, ``probs * 100`` cast to int32,
    and the count of visible keys per row."""
    return parse_graph({
        "name": "causal", "inputs": {"x": {"shape": [2, S, S], "dtype": "float32"},
                                     "past": {"shape": [S, 1], "dtype": "int64"}},
        "nodes": [
            {"id": "r", "op": "iota", "args": [], "shape": [S, 1], "axis": 0, "dtype": pos_dtype},
            {"id": "c", "op": "iota", "args": [], "shape": [S], "axis": 0, "dtype": "int32"},
            {"id": "pos", "op": "add", "args": ["r", "past"]},
            {"id": "ok", "op": "le", "args": ["c", "pos"]},
            {"id": "y", "op": "where", "args": ["ok", "x", -np.inf]},
            {"id": "m", "op": "reduce_max", "args": ["y"], "axes": [-1], "keepdims": True},
            {"id": "e", "op": "sub", "args": ["y", "m"]},
            {"id": "ee", "op": "exp", "args": ["e"]},
            {"id": "s", "op": "reduce_sum", "args": ["ee"], "axes": [-1], "keepdims": True},
            {"id": "p", "op": "div", "args": ["ee", "s"]},
            {"id": "p100", "op": "mul", "args": ["p", 100.0]},
            {"id": "pq", "op": "cast", "args": ["p100"], "to": "int32"},
            {"id": "pos3", "op": "mul", "args": ["pos", 3]},
            {"id": "pc", "op": "sub", "args": ["pos3", "c"]},
            {"id": "pos32", "op": "cast", "args": ["pc"], "to": "int32"},
            {"id": "vis", "op": "gt", "args": ["y", -1e30]},
            {"id": "n", "op": "reduce_sum", "args": ["vis"], "axes": [-1]}],
        "outputs": ["p", "pq", "pos32", "n"]})


def position_ids() -> Any:
    """An element-wise region: ``pos = iota + past`` stored as int64 and the same clamped (int
    maximum / minimum) and compared (``ne``) into a float mask."""
    return parse_graph({
        "name": "positions", "inputs": {"past": {"shape": [4, 1], "dtype": "int64"},
                                        "ids": {"shape": [4, 16], "dtype": "int32"}},
        "nodes": [
            {"id": "i", "op": "iota", "args": [], "shape": [1, 16], "axis": 1},
            {"id": "pos", "op": "add", "args": ["i", "past"]},
            {"id": "cl", "op": "maximum", "args": ["pos", 0]},
            {"id": "cl2", "op": "minimum", "args": ["cl", 2**40]},
            {"id": "neg", "op": "neg", "args": ["ids"]},
            {"id": "keep", "op": "ne", "args": ["ids", -100]},
            {"id": "lab", "op": "where", "args": ["keep", "ids", 0]},
            {"id": "mask", "op": "cast", "args": ["keep"], "to": "float32"}],
        "outputs": ["pos", "cl2", "neg", "lab", "mask"]})


def ignore_index_count() -> Any:
    """Cross entropy's ``ignore_index``: ``valid = labels != -100`` (an int64 comparison per row), the
    log-sum-exp of each row kept where valid, their sum and the count of valid rows (a bool
    ``reduce_sum`` over the rows: cross reductions)."""
    return parse_graph({
        "name": "ce_count", "inputs": {"x": {"shape": [16, 32], "dtype": "float32"},
                                       "labels": {"shape": [16, 1], "dtype": "int64"}},
        "nodes": [
            {"id": "m", "op": "reduce_max", "args": ["x"], "axes": [-1], "keepdims": True},
            {"id": "e", "op": "sub", "args": ["x", "m"]},
            {"id": "ee", "op": "exp", "args": ["e"]},
            {"id": "s", "op": "reduce_sum", "args": ["ee"], "axes": [-1], "keepdims": True},
            {"id": "ls", "op": "log", "args": ["s"]},
            {"id": "valid", "op": "ne", "args": ["labels", -100]},
            {"id": "w", "op": "where", "args": ["valid", "ls", 0.0]},
            {"id": "loss", "op": "reduce_sum", "args": ["w"], "axes": [0, 1], "keepdims": True},
            {"id": "cnt", "op": "reduce_sum", "args": ["valid"], "axes": [0, 1], "keepdims": True}],
        "outputs": ["loss", "cnt"]})


HOSTILE_PAST = np.array([[5], [-7], [2**40], [0], [1], [2], [2**62], [-(2**62)]], np.int64)


def _inputs(g: Any) -> dict[str, np.ndarray]:
    x = random_inputs(g, 3)
    if "past" in x:
        x["past"] = np.resize(HOSTILE_PAST, x["past"].shape)
    if "labels" in x:
        x["labels"] = np.resize(np.array([[3], [-100], [2**40], [-100], [0]], np.int64), x["labels"].shape)
    if "ids" in x:
        x["ids"] = np.random.default_rng(0).integers(-(2**31), 2**31, x["ids"].shape).astype(np.int32)
        x["ids"].ravel()[::5] = -100
    return x


def schedules(g: Any, n: int) -> tuple[Any, SearchSpace, list[Any]]:
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    return plan, space, [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(n)]


def _check(g: Any, n: int) -> None:
    plan, space, scheds = schedules(g, n)
    x = _inputs(g)
    ref = run_reference(g, x)
    for s in scheds:
        out = emulate_program(lower(g, plan, s, DEV, space), x, coresident_limit=lambda k: 1 << 30)
        for o, want in ref.items():
            got = out[o].reshape(want.shape)
            if want.dtype.kind == "i":
                assert got.dtype == want.dtype and np.array_equal(got, want), (o, s.to_json())
            else:  # rows whose keys are all masked are NaN in both (a softmax of -inf only)
                nan = np.isnan(want)
                assert np.array_equal(np.isnan(got), nan) and rel_err(got[~nan], want[~nan]) < 1e-5, (o, s.to_json())


@pytest.mark.parametrize("pos_dtype", ["int64", "int32"])
def test_causal_mask_softmax_emulates_exactly(pos_dtype: str) -> None:
    _check(causal_softmax(pos_dtype), 10)


def test_position_ids_emulate_exactly() -> None:
    _check(position_ids(), 6)


def test_ignore_index_count_emulates_exactly() -> None:
    _check(ignore_index_count(), 6)


def test_int_values_are_registers_of_their_width() -> None:
    g = causal_softmax()
    plan, space, scheds = schedules(g, 0)
    assert not {"r", "c", "pos", "past"} & set(plan.reuse_candidates)  # never cached: reloaded / recomputed
    src = render(lower(g, plan, scheds[0], DEV, space))
    assert "long long" in src and "(unsigned long long)" in src  # int64 arithmetic, wrapping
    assert "__float2int_rz" in src and "int* __restrict__ out" in src  # float -> int; an int output
    assert "((float)(in1" not in src  # the int64 input is never converted to float


def test_legacy_int_inputs_keep_float_loads() -> None:
    """A graph that only casts an int input (no int arithmetic) still converts it at the load."""
    g = parse_graph({"name": "t", "inputs": {"x": {"shape": [4, 8], "dtype": "float32"}, "m": {"shape": [4, 8], "dtype": "int64"}},
                     "nodes": [{"id": "f", "op": "cast", "args": ["m"], "to": "float32"},
                               {"id": "y", "op": "mul", "args": ["x", "f"]}], "outputs": ["y"]})
    plan, space, scheds = schedules(g, 0)
    assert "((float)(" in render(lower(g, plan, scheds[0], DEV, space))


@pytest.mark.parametrize("nodes, outputs, want", [
    ([{"id": "i", "op": "iota", "args": [], "shape": [8, 4], "axis": 0},
      {"id": "s", "op": "slice", "args": ["i"], "axis": 1, "start": 0, "stop": 2}], ["s"], "slice, concat and gather"),
    ([{"id": "i", "op": "iota", "args": [], "shape": [8, 4], "axis": 0},
      {"id": "f", "op": "cast", "args": ["i"], "to": "float32"},
      {"id": "y", "op": "mul", "args": ["f", "x"]},
      {"id": "s", "op": "reduce_sum", "args": ["y"], "axes": [0]}], ["s"], "column-reduction region"),
])
def test_unsupported_int_regions_are_one_line(nodes: list[dict], outputs: list[str], want: str) -> None:
    g = parse_graph({"name": "t", "inputs": {"x": {"shape": [8, 4], "dtype": "float32"}}, "nodes": nodes,
                     "outputs": outputs})
    with pytest.raises(UnsupportedGraphError) as e:
        make_plan(g)
    assert want in str(e.value) and "\n" not in str(e.value)


def int_op_programs() -> list[Any]:
    """Programs of the graphs above for the batched sm_90 build (tests/lower/test_int_input_kernels.py)."""
    programs = []
    for g in (causal_softmax("int64"), causal_softmax("int32"), position_ids(), ignore_index_count()):
        plan, space, scheds = schedules(g, 2)
        programs += [lower(g, plan, s, DEV, space) for s in scheds]
    return programs
