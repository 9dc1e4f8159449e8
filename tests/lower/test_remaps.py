"""Index remaps in stitched kernels (slice, concat, gather; stitchtune/plan/remap.py and
stitchtune/lower/remap.py): the emulator (which faults on any out-of-bounds, unwritten or racy access)
matches the float64 reference for the examples and for patterns they do not cover; hostile gather
indices give zero rows and the flagged error, never an out-of-bounds read; the vector fast path is kept
where the shift keeps vectors aligned; the unsupported cases are one named line."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from helpers.lowering import DEV, emulated_errors, float_graph as _graph, rel_err, setup
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.deploy.compiled import compile as st_compile
from stitchtune.emulate.emulator import emulate_program
from stitchtune.errors import StitchtuneError, UnsupportedGraphError
from stitchtune.gpu.render import render
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.lower.entry import lower
from stitchtune.lower.gather import gather_flag_buffers
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace


def _rotate_half(x: str, d: int) -> list[dict]:
    return [{"id": "x2", "op": "slice", "args": [x], "axis": -1, "start": d // 2, "stop": d},
            {"id": "nx2", "op": "neg", "args": ["x2"]},
            {"id": "x1", "op": "slice", "args": [x], "axis": -1, "start": 0, "stop": d // 2},
            {"id": "r", "op": "concat", "args": ["nx2", "x1"], "axis": -1}]


CASES = {
    # the output is a slice of a larger input (the input keeps its own row stride), then a reduction
    "slice_smaller": _graph({"x": [3, 4, 20], "w": [10]}, [
        {"id": "s", "op": "slice", "args": ["x"], "axis": -1, "start": 5, "stop": 15},
        {"id": "z", "op": "mul", "args": ["s", "w"]},
        {"id": "m", "op": "reduce_sum", "args": ["z"], "axes": [-1], "keepdims": True},
        {"id": "y", "op": "sub", "args": ["z", "m"]}], ["y"]),
    # two inputs of odd widths concatenated (pieces not vector-aligned: scalar loads), softmax
    "concat_inputs_odd": _graph({"a": [5, 3], "b": [5, 7]}, [
        {"id": "c", "op": "concat", "args": ["a", "b"], "axis": 1},
        {"id": "e", "op": "exp", "args": ["c"]},
        {"id": "s", "op": "reduce_sum", "args": ["e"], "axes": [-1], "keepdims": True},
        {"id": "y", "op": "div", "args": ["e", "s"]}], ["y"]),
    # a slice along a row axis
    "slice_rows": _graph({"x": [6, 8, 16], "b": [6, 4, 16]}, [
        {"id": "s", "op": "slice", "args": ["x"], "axis": 1, "start": 2, "stop": 6},
        {"id": "y", "op": "add", "args": ["s", "b"]}], ["y"]),
    # rotate_half of an odd half (D = 10)
    "rotate_half_odd": _graph({"q": [3, 10]}, _rotate_half("q", 10) + [
        {"id": "y", "op": "add", "args": ["r", "q"]}], ["y"]),
    # a slice of a concat, and a reduction result output
    "slice_of_concat": _graph({"a": [4, 8], "b": [4, 8]}, [
        {"id": "c", "op": "concat", "args": ["a", "b"], "axis": -1},
        {"id": "s", "op": "slice", "args": ["c"], "axis": -1, "start": 4, "stop": 12},
        {"id": "m", "op": "reduce_max", "args": ["s"], "axes": [-1], "keepdims": True},
        {"id": "y", "op": "sub", "args": ["s", "m"]}], ["y", "m"]),
    # a value computed from a reduction, sliced and swapped along the columns
    "swap_after_reduction": _graph({"x": [4, 8]}, [
        {"id": "m", "op": "reduce_max", "args": ["x"], "axes": [-1], "keepdims": True},
        {"id": "d", "op": "sub", "args": ["x", "m"]}] + _rotate_half("d", 8) + [
        {"id": "y", "op": "mul", "args": ["r", "x"]}], ["y"]),
    # ViT: the class token (one row) concatenated before the patches along the sequence (a row
    # axis; the patches keep their own row stride), + position embedding, then a row reduction
    "vit_class_token": _graph({"cls": [2, 1, 8], "patches": [2, 5, 8], "pos": [1, 6, 8]}, [
        {"id": "c", "op": "concat", "args": ["cls", "patches"], "axis": 1},
        {"id": "x", "op": "add", "args": ["c", "pos"]},
        {"id": "m", "op": "reduce_mean", "args": ["x"], "axes": [-1], "keepdims": True},
        {"id": "y", "op": "sub", "args": ["x", "m"]}], ["y"]),
    # two gathers (int32 and int64 indices) + a broadcast position embedding, then a reduction
    "two_gathers": parse_graph({"name": "t", "inputs": {
        "ids": {"shape": [2, 5], "dtype": "int32"}, "tt": {"shape": [2, 5], "dtype": "int64"},
        "w": {"shape": [50, 16], "dtype": "float32"}, "t": {"shape": [2, 16], "dtype": "float32"},
        "pos": {"shape": [1, 5, 16], "dtype": "float32"}}, "nodes": [
        {"id": "a", "op": "gather", "args": ["w", "ids"], "axis": 0},
        {"id": "b", "op": "gather", "args": ["t", "tt"], "axis": 0},
        {"id": "s", "op": "add", "args": ["a", "b"]}, {"id": "z", "op": "add", "args": ["s", "pos"]},
        {"id": "m", "op": "reduce_mean", "args": ["z"], "axes": [-1], "keepdims": True},
        {"id": "y", "op": "sub", "args": ["z", "m"]}], "outputs": ["y"]}),
    # rotate_half of gathered rows (a column shift of a gather)
    "rotate_half_of_gather": parse_graph({"name": "t", "inputs": {
        "ids": {"shape": [2, 5], "dtype": "int32"}, "w": {"shape": [50, 16], "dtype": "float32"}},
        "nodes": [{"id": "a", "op": "gather", "args": ["w", "ids"], "axis": 0}] + _rotate_half("a", 16) + [
            {"id": "y", "op": "mul", "args": ["r", "a"]}], "outputs": ["y"]}),
    # a bool mask sliced along the columns, and a float16 rotate_half
    "bool_slice": parse_graph({"name": "t", "inputs": {
        "x": {"shape": [4, 16], "dtype": "float32"}, "m": {"shape": [4, 32], "dtype": "bool"}}, "nodes": [
        {"id": "ms", "op": "slice", "args": ["m"], "axis": 1, "start": 8, "stop": 24},
        {"id": "y", "op": "where", "args": ["ms", "x", -1e9]}], "outputs": ["y"]}),
    "rotate_half_f16": parse_graph({"name": "t", "inputs": {"q": {"shape": [2, 3, 32], "dtype": "float16"}},
                                    "nodes": _rotate_half("q", 32) + [{"id": "y", "op": "add", "args": ["r", "q"]}],
                                    "outputs": ["y"]}),
}


def _check(g, n_samples: int, seed: int = 3) -> None:
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, seed)
    ref = run_reference(g, inputs)
    scheds = [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(n_samples)]
    scheds += [s for s in (dataclasses.replace(x, prefetch=1, order="alternate") for x in scheds[:2])
               if not space.violations(s)]
    if plan.single_pass:  # the two statistics of a layer norm in one sweep (Welford)
        scheds += [s for s in (dataclasses.replace(x, single_pass=1) for x in scheds[:3]) if not space.violations(s)]
    for s in scheds:
        for o, err in emulated_errors(g, plan, space, s, inputs, ref).items():
            tol = 1e-5 if g.spec(o).dtype == "float32" else 1e-2
            assert err < tol, (g.name, s.to_json(), o)


@pytest.mark.parametrize("name", ["rotary_embedding_small.json", "embed_gather_layernorm_small.json"])
def test_examples_match_the_reference(name: str) -> None:
    g, _, _ = setup(name)
    _check(g, 6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_patterns_match_the_reference(case: str) -> None:
    _check(CASES[case], 3)


def _embed(dtype: str):
    g, _, _ = setup("embed_gather_layernorm_small.json")
    d = g.to_dict()
    d["inputs"]["ids"]["dtype"] = dtype
    return parse_graph(d)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_hostile_indices_give_zero_rows_and_the_flag(dtype: str) -> None:
    g = _embed(dtype)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    x = random_inputs(g, 1)
    bad = [-1, 50, 2**31 - 1, -2**31] if dtype == "int32" else [-1, 50, 2**31 - 1, 2**32 + 3, -2**40]
    x["ids"].flat[:len(bad)] = bad
    ref = run_reference(g, x)
    for s in [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(3)]:
        prog = lower(g, plan, s, DEV, space)
        scratch: dict[str, np.ndarray] = {}
        out = emulate_program(prog, x, coresident_limit=lambda k: 1 << 30, scratch_out=scratch)
        assert rel_err(out["y"], ref["y"]) < 1e-5, s.to_json()
        assert gather_flag_buffers(prog) == {"gerr0": "we"}
        assert scratch["gerr0"][0] > 0, s.to_json()
        ok = random_inputs(g, 1)
        clean: dict[str, np.ndarray] = {}
        emulate_program(prog, ok, coresident_limit=lambda k: 1 << 30, scratch_out=clean)
        assert clean["gerr0"][0] == 0


def test_compiled_graph_reports_the_gather_by_name(tmp_path) -> None:
    g = _embed("int32")
    cg = st_compile(g, db=tmp_path / "none", device="h200", build=False)
    x = random_inputs(g, 2)
    assert cg.emulate(**x)["y"].shape == (2, 5, 32)
    x["ids"][1, 4] = 50
    with pytest.raises(StitchtuneError) as e:
        cg.emulate(**x)
    assert e.value.problems[0].startswith("gather 'we': index out of range")


def test_the_index_is_range_checked_at_its_own_width() -> None:
    g, plan, space = setup("embed_gather_layernorm_small.json")
    src = render(lower(g, plan, heuristic_schedule(plan, DEV, space), DEV, space))
    assert "((unsigned int)(in0[" in src and "< (unsigned int)50)" in src
    src64 = render(lower(_embed("int64"), make_plan(_embed("int64")), heuristic_schedule(plan, DEV, space), DEV))
    assert "((unsigned long long)(in0[" in src64 and "const long long* __restrict__ in0" in src64


def test_rotate_half_keeps_vector_loads_when_aligned() -> None:
    g, plan, space = setup("rotary_embedding_small.json")  # D = 16, half 8
    s = dataclasses.replace(heuristic_schedule(plan, DEV, space), vec=4)
    src = render(lower(g, plan, s, DEV, space))
    assert src.count("reinterpret_cast<const float4*>(in0") == 3  # q, q shifted by +8 and by -8
    g2 = CASES["rotate_half_odd"]  # D = 10, half 5: the shifted pieces are loaded lane by lane
    p2 = make_plan(g2)
    sp2 = SearchSpace.for_plan(p2, DEV)
    s2 = next(x for x in (sp2.sample(random.Random(i)) for i in range(50)) if x.vec == 2)
    src2 = render(lower(g2, p2, s2, DEV, sp2))
    assert src2.count("reinterpret_cast<const float2*>(in0") == 1 and "st_ld(in0 + " in src2


def test_gather_reads_only_the_gathered_rows_in_the_profile() -> None:
    g, plan, space = setup("embed_gather_layernorm_small.json")
    prog = lower(g, plan, heuristic_schedule(plan, DEV, space), DEV, space)
    table = 50 * 32 * 4
    assert sum(k.dram_read_bytes for k in prog.profile.kernels) < table + 5 * 32 * 4 + 2 * 32 * 4 + 10 * 4 + 1


@pytest.mark.parametrize("inputs, nodes, outputs, want", [
    # a gather whose result is reduced over the leading axis: a column reduction
    ({"t": [10, 4]}, [{"id": "g", "op": "gather", "args": ["t", "ids"], "axis": 0},
                      {"id": "y", "op": "reduce_sum", "args": ["g"], "axes": [0], "keepdims": True}],
     ["y"], "index ops are supported in row-reduction and element-wise kernels only"),
    # the table is read by something else too
    ({"t": [4, 4]}, [{"id": "g", "op": "gather", "args": ["t", "ids"], "axis": 0},
                     {"id": "y", "op": "add", "args": ["g", "t"]}],
     ["y"], "reads gather table 't'"),
    # a size-1 slice would broadcast
    ({"x": [4, 8]}, [{"id": "s", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": 1},
                     {"id": "y", "op": "mul", "args": ["s", "x"]}],
     ["y"], "has size 1 along axis 1"),
    # an output that does not span the domain the reduction sets (part of each row: rows 2:4 would be
    # planned, the slice moved below the row-local computation: tests/plan/test_row_moves.py)
    ({"x": [6, 8]}, [{"id": "m", "op": "reduce_max", "args": ["x"], "axes": [-1], "keepdims": True},
                     {"id": "d", "op": "sub", "args": ["x", "m"]},
                     {"id": "y", "op": "slice", "args": ["d"], "axis": 1, "start": 2, "stop": 4}],
     ["y"], "does not span the iteration domain"),
    # a row-axis rotation of values computed from a per-row input: refused when planning (of a per-row
    # reduction's result, the rotation is moved below the reduction: tests/plan/test_row_moves.py)
    ({"x": [6, 8], "m": [6, 1]}, [{"id": "d", "op": "sub", "args": ["x", "m"]},
                     {"id": "a", "op": "slice", "args": ["d"], "axis": 0, "start": 2, "stop": 6},
                     {"id": "b", "op": "slice", "args": ["d"], "axis": 0, "start": 0, "stop": 2},
                     {"id": "y", "op": "concat", "args": ["a", "b"], "axis": 0}],
     ["y"], "tensor 'm': a per-row value under a slice/concat along a row axis"),
])
def test_unsupported_index_patterns_are_one_named_line(inputs, nodes, outputs, want) -> None:
    d = {"name": "t", "inputs": {k: {"shape": v, "dtype": "float32"} for k, v in inputs.items()},
         "nodes": nodes, "outputs": outputs}
    if any(n["op"] == "gather" for n in nodes):
        d["inputs"]["ids"] = {"shape": [3, 4], "dtype": "int32"}
    with pytest.raises(UnsupportedGraphError) as e:
        make_plan(parse_graph(d))
    assert want in str(e.value) and "\n" not in str(e.value)


def _random_remap_graph(rng: random.Random):
    """A random graph of slices and concats of two inputs along a random axis, an element-wise op,
    and (half the time) a row reduction: shapes, offsets and widths drawn small and odd."""
    rank = rng.choice([2, 3])
    shape = [rng.randint(2, 5) for _ in range(rank - 1)] + [rng.randint(3, 12)]
    ax = rng.randrange(rank)
    d = shape[ax]
    cut = rng.randint(1, d - 1)
    other = list(shape)
    other[ax] = rng.randint(1, 6)
    nodes = [{"id": "lo", "op": "slice", "args": ["x"], "axis": ax, "start": 0, "stop": cut},
             {"id": "hi", "op": "slice", "args": ["x"], "axis": ax - rank, "start": cut, "stop": d},
             {"id": "e", "op": rng.choice(["exp", "neg", "tanh"]), "args": ["hi"]},
             {"id": "c", "op": "concat", "args": rng.choice([["e", "b", "lo"], ["lo", "e"], ["b", "lo", "e"]]), "axis": ax}]
    if rng.random() < 0.5:
        nodes += [{"id": "m", "op": "reduce_max", "args": ["c"], "axes": [-1], "keepdims": True},
                  {"id": "y", "op": "sub", "args": ["c", "m"]}]
    else:
        nodes += [{"id": "y", "op": "mul", "args": ["c", 2.0]}]
    used = {a for n in nodes for a in n["args"] if isinstance(a, str)}
    inputs = {"x": shape, **({"b": other} if "b" in used else {})}
    return _graph(inputs, nodes, ["y"])


@pytest.mark.parametrize("seed", range(24))
def test_random_slice_concat_graphs_match_or_are_refused(seed: int) -> None:
    rng = random.Random(seed)
    g = _random_remap_graph(rng)
    try:
        plan = make_plan(g)
    except UnsupportedGraphError as e:  # e.g. a size-1 piece that would broadcast
        assert "\n" not in str(e)
        return
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, seed)
    ref = run_reference(g, inputs)
    for s in [heuristic_schedule(plan, DEV, space), space.sample(rng)]:
        out = emulate_program(lower(g, plan, s, DEV, space), inputs, coresident_limit=lambda k: 1 << 30)
        assert rel_err(out["y"], ref["y"]) < 1e-5, (g.to_dict(), s.to_json())
