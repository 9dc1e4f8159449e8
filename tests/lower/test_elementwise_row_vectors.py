"""Row vectors in element-wise row kernels (stitchtune/lower/row_vectors.py, plan/adjacent.py ``vector_rows``):
a concat whose piece reads an input transposed (GPT-2's training ``view_50``: k's gradient ``[B*H, D, S]``
merged to ``[B, S, H*D]`` between q's and v's) loads that piece 4 rows (float32; 8 for 16-bit) per 128-bit
access at the ideal sectors; every shape, dtype and schedule emulates like the float64 reference (the
emulator faults on any out-of-bounds or misaligned access); Llama's rotary gradient (one input read through
4 chains at 3 column shifts) takes its shifted reads from other lanes (plan/lane_shifts.py), so that its row
vectors hold one load per chain."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from helpers.lowering import DEV, emulated_errors
from helpers.nvcc import BUILDER_FLAGS, compile_programs_sm90
from stitchtune.analysis.audit import audit_graph
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.gpu.build import nvcc_found
from stitchtune.graph.parse import Graph, parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.ir import kir
from stitchtune.lower.entry import lower
from stitchtune.lower.row import RowLowerer
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace


def qkv_concat(B: int = 2, H: int = 4, S: int = 64, D: int = 16, dtype: str = "float32") -> Graph:
    """GPT-2's training ``view_50`` (2 layers, batch 8 x 512: ``B, H, S, D = 8, 12, 512, 64``): the q, k and
    v gradients merged from heads and concatenated, k's read from ``[B*H, D, S]`` (transposed)."""
    nodes: list[dict[str, Any]] = [
        {"id": "q", "op": "reshape", "args": ["in0"], "shape": [B, H, S, D]},
        {"id": "k", "op": "reshape", "args": ["in1"], "shape": [B, H, D, S]},
        {"id": "v", "op": "reshape", "args": ["in2"], "shape": [B, H, S, D]},
        {"id": "vp", "op": "transpose", "args": ["v"], "perm": [0, 2, 1, 3]},
        {"id": "vm", "op": "reshape", "args": ["vp"], "shape": [B, S, H * D]},
        {"id": "qp", "op": "transpose", "args": ["q"], "perm": [0, 2, 1, 3]},
        {"id": "qm", "op": "reshape", "args": ["qp"], "shape": [B, S, H * D]},
        {"id": "kp", "op": "transpose", "args": ["k"], "perm": [0, 3, 1, 2]},
        {"id": "km", "op": "reshape", "args": ["kp"], "shape": [B, S, H * D]},
        {"id": "cat", "op": "concat", "args": ["vm", "km", "qm"], "axis": 2}]
    spec = {"dtype": dtype}
    return parse_graph({"name": "qkv_concat", "inputs": {"in0": {"shape": [B * H, S, D], **spec},
                        "in1": {"shape": [B * H, D, S], **spec}, "in2": {"shape": [B * H, S, D], **spec}},
                        "nodes": nodes, "outputs": ["cat"]})


def rotary_backward(B: int = 2, KV: int = 2, S: int = 32, D: int = 16) -> Graph:
    """Llama's training ``view_68`` (``B, KV, S, D = 8, 4, 512, 64``, 4 query heads a key head): the rotary
    gradient of k, its 4 query-head groups summed, read from ``[B*4*KV, D, S]`` (transposed)."""
    h = D // 2
    nodes: list[dict[str, Any]] = [
        {"id": "v68", "op": "reshape", "args": ["in0"], "shape": [B, 4 * KV, D, S]},
        {"id": "p45", "op": "transpose", "args": ["v68"], "perm": [0, 1, 3, 2]},
        {"id": "v71", "op": "reshape", "args": ["p45"], "shape": [B, KV, 4, S, D]}]
    for i in range(4):
        nodes += [{"id": f"s{i}", "op": "slice", "args": ["v71"], "axis": 2, "start": i, "stop": i + 1},
                  {"id": f"s{i}v", "op": "reshape", "args": [f"s{i}"], "shape": [B, KV, S, D]}]
    nodes += [
        {"id": "a0", "op": "add", "args": ["s0v", "s1v"]}, {"id": "a1", "op": "add", "args": ["a0", "s2v"]},
        {"id": "a2", "op": "add", "args": ["a1", "s3v"]}, {"id": "m48", "op": "mul", "args": ["a2", "cos"]},
        {"id": "x1", "op": "slice", "args": ["m48"], "axis": 3, "start": 0, "stop": h},
        {"id": "x2", "op": "slice", "args": ["m48"], "axis": 3, "start": h, "stop": D},
        {"id": "n", "op": "neg", "args": ["x1"]},
        {"id": "g0", "op": "slice", "args": ["in2"], "axis": 3, "start": 0, "stop": h},
        {"id": "ss", "op": "concat", "args": ["g0", "n"], "axis": 3},
        {"id": "t1", "op": "slice", "args": ["in3"], "axis": 3, "start": h, "stop": D},
        {"id": "ss1", "op": "concat", "args": ["x2", "t1"], "axis": 3},
        {"id": "a23", "op": "add", "args": ["ss", "ss1"]}, {"id": "m49", "op": "mul", "args": ["a2", "sin"]},
        {"id": "a24", "op": "add", "args": ["a23", "m49"]},
        {"id": "out", "op": "transpose", "args": ["a24"], "perm": [0, 2, 1, 3]}]
    f32 = "float32"
    return parse_graph({"name": "rotary_backward", "inputs": {
        "in0": {"shape": [B * 4 * KV, D, S], "dtype": f32}, "cos": {"shape": [1, 1, S, D], "dtype": f32},
        "in2": {"shape": [B, KV, S, D], "dtype": f32}, "in3": {"shape": [B, KV, S, D], "dtype": f32},
        "sin": {"shape": [1, 1, S, D], "dtype": f32}}, "nodes": nodes, "outputs": ["out"]})


def _widths(prog: kir.Program, buf: str) -> set[int]:
    """The widths of every global load of ``buf`` in ``prog`` (a scalar load: 1)."""
    widths: set[int] = set()
    for k in prog.kernels:
        for st_ in kir.walk(k.body):
            if isinstance(st_, kir.LoadVec) and st_.buf == buf:
                widths.add(len(st_.dsts))
            widths |= {1 for e in kir.exprs(st_) if isinstance(e, kir.Load) and e.buf == buf}
    return widths


def _schedule(g: Graph, **changes: Any) -> tuple[Any, SearchSpace, Any]:
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = dataclasses.replace(heuristic_schedule(plan, DEV, space), **changes)
    assert not space.violations(s), space.violations(s)
    return plan, space, s


def _exact(g: Graph, plan: Any, space: SearchSpace, s: Any) -> None:
    inputs = random_inputs(g, 3)
    errs = emulated_errors(g, plan, space, s, inputs, run_reference(g, inputs))
    assert max(errs.values()) == 0.0, (s.to_json(), errs)   # a copy: bitwise


def test_the_transposed_piece_is_loaded_four_rows_per_128_bit_access() -> None:
    g = qkv_concat()
    plan, space, s = _schedule(g)
    assert (plan.adjacent_rows, plan.vector_rows, plan.vector_loads) == (8, 4, 1)
    assert dict(s.options).get("row_vectors")                # the heuristic takes them
    assert RowLowerer(g, plan, s, DEV).rows == 4
    prog = lower(g, plan, s, DEV, space)
    assert _widths(prog, "in1") == {4}                       # was one 32-bit load per element
    assert _widths(prog, "in0") == _widths(prog, "in2") == {4}
    _exact(g, plan, space, s)
    off = dataclasses.replace(s, row_vectors=False)           # the option off: one row a thread, as exact
    assert RowLowerer(g, plan, off, DEV).rows == 1 and _widths(lower(g, plan, off, DEV, space), "in1") == {1}
    _exact(g, plan, space, off)


def test_every_access_at_its_ideal_sectors() -> None:
    """The emulated trace: the transposed piece's 128-bit loads and the column accesses all at 1.00x."""
    g = qkv_concat(B=2, H=4, S=128, D=16)
    _, _, s = _schedule(g)
    a = audit_graph(g, DEV, s, sass=False, peer=False)
    acc = [x for k in a.kernels for x in k.accesses]
    assert {x.buf for x in acc} >= {"in0", "in1", "in2"}
    assert all(x.ratio == 1.0 for x in acc), [(x.buf, x.ratio) for x in acc]
    assert all(x.width == 4 for x in acc if x.buf == "in1")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("B,H,S,D,changes", [
    (2, 4, 64, 16, {}),
    (1, 3, 24, 8, {}),                                        # rows not a multiple of a block's: guarded groups
    (2, 2, 40, 8, {"tpr": 8, "block": 64}),                   # a concat piece narrower than a block's columns
    (3, 4, 32, 16, {"tpr": 16, "block": 128, "vec": 2}),
    (1, 2, 48, 16, {"tpr": 4, "block": 32, "vec": 1}),
])
def test_every_shape_dtype_and_mapping_emulates(dtype: str, B: int, H: int, S: int, D: int,
                                                changes: dict[str, Any]) -> None:
    g = qkv_concat(B, H, S, D, dtype)
    plan = make_plan(g)
    R = 4 if dtype == "float32" else 8
    if S % R or (S % 8 if dtype == "float32" else S % 16):
        assert plan.vector_rows == 0
        return
    assert plan.vector_rows == R
    plan, space, s = _schedule(g, row_vectors=True, **{"vec": 4, **changes})
    assert RowLowerer(g, plan, s, DEV).rows == R
    assert R in _widths(lower(g, plan, s, DEV, space), "in1")
    _exact(g, plan, space, s)


def _count(prog: kir.Program, kind: type, buf: str | None = None) -> int:
    """Statements (``LoadVec`` of ``buf``) or expressions (``Shfl``) of ``kind`` in ``prog``'s kernels."""
    n = 0
    for k in prog.kernels:
        for st_ in kir.walk(k.body):
            if kind is kir.LoadVec:
                n += isinstance(st_, kir.LoadVec) and st_.buf == buf
            else:
                n += sum(1 for e in kir.exprs(st_) if isinstance(e, kind))
    return n


def test_the_rotary_gradient_takes_its_column_shifts_from_other_lanes() -> None:
    """4 chains read at 3 column shifts (rotate_half's c + h where c < h, c - h where c >= h): with a row in one
    sweep iteration of adjacent lanes (tpr x vec = D), the shifted values are the partner lane's unshifted ones
    (plan/lane_shifts.py): one 128-bit load per chain, vec shuffles a row (both shifts are lane ^ h / vec: one
    shuffle serves them, as nvcc merged the IR's two before), the register cache of 4 loads
    (not 12), the heuristic takes row vectors; exact (bitwise equal to the row-by-row kernel)."""
    g = rotary_backward()                                      # D = 16, h = 8
    plan, space, s = _schedule(g)
    assert (plan.vector_rows, plan.vector_loads) == (4, 12)
    assert dict(s.options).get("row_vectors") and s.tpr * s.vec == 16, s
    prog = lower(g, plan, s, DEV, space)
    assert _widths(prog, "in0") == {4}
    assert _count(prog, kir.LoadVec, "in0") == 4 * s.vec       # a chain's R rows a column; was 12 x vec
    assert _count(prog, kir.Shfl) == 4 * s.vec                 # R rows x vec (2 shifts, 1 lane mask)
    inputs = random_inputs(g, 3)
    ref = run_reference(g, inputs)
    errs = emulated_errors(g, plan, space, s, inputs, ref)
    assert max(errs.values()) < 1e-6, errs
    off = dataclasses.replace(s, row_vectors=False)
    a, b = (emulate_program(lower(g, plan, x, DEV, space), inputs, coresident_limit=lambda k: 1 << 30)["out"]
            for x in (s, off))
    assert (a == b).all()                                      # the same sums, moved between lanes
    big = make_plan(rotary_backward(8, 4, 512, 64))            # the audit's shape (Llama's view_68)
    hb = heuristic_schedule(big, DEV)
    assert dict(hb.options).get("row_vectors") and (hb.tpr, hb.block, hb.vec) == (16, 256, 4), hb


@pytest.mark.parametrize("B,KV,S,D,changes,exchanged", [
    (2, 2, 32, 16, {"tpr": 8, "vec": 2, "block": 64}, True),   # h = 8 columns = 4 lanes: lane ^ 4
    (1, 2, 16, 32, {"tpr": 8, "vec": 4, "block": 64}, True),   # h = 16 = 4 lanes
    (2, 1, 24, 16, {"tpr": 4, "vec": 4, "block": 32}, True),   # rows not a multiple of a block's: guarded groups
    (2, 2, 32, 16, {"tpr": 4, "vec": 2, "block": 32}, False),  # tpr x vec = 8: a row in two sweep iterations
    (1, 1, 16, 24, {"tpr": 2, "vec": 4, "block": 32}, False),  # h = 12 = 3 lanes: not a butterfly
])
def test_rotary_mappings_emulate_with_and_without_exchanges(B: int, KV: int, S: int, D: int,
                                                          changes: dict[str, Any], exchanged: bool) -> None:
    g = rotary_backward(B, KV, S, D)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = dataclasses.replace(heuristic_schedule(plan, DEV, space), row_vectors=True, **changes)
    if space.violations(s):   # only a mapping that loads every shift can be over the register cache
        assert not exchanged and any("register cache" in v for v in space.violations(s)), space.violations(s)
        s = dataclasses.replace(s, vec=1, tpr=s.tpr * s.vec)
    prog = lower(g, plan, s, DEV, space)
    assert (_count(prog, kir.Shfl) > 0) == exchanged
    inputs = random_inputs(g, 5)
    errs = emulated_errors(g, plan, space, s, inputs, run_reference(g, inputs))
    assert max(errs.values()) < 1e-6, (s.to_json(), errs)


def test_no_row_vectors_where_a_thread_s_rows_would_share_a_per_row_value() -> None:
    """A per-row input (``[B, S, 1]``, one value a view row) beside the transposed piece: no row vectors."""
    g = qkv_concat()
    d = g.to_dict()
    d["inputs"]["r"] = {"shape": [2, 64, 1], "dtype": "float32"}
    d["nodes"].append({"id": "o", "op": "mul", "args": ["cat", "r"]})
    d["outputs"] = ["o"]
    plan = make_plan(parse_graph(d))
    assert plan.adjacent_rows == 8 and plan.vector_rows == 0


def test_the_heuristic_takes_them_at_gpt2_s_shape() -> None:
    """GPT-2's ``view_50`` at the audit's shape: row vectors, 64 threads a row (two row groups a warp), 256
    blocks of 256 threads."""
    plan = make_plan(qkv_concat(8, 12, 512, 64))
    s = heuristic_schedule(plan, DEV)
    assert dict(s.options).get("row_vectors") and (s.tpr, s.block, s.vec) == (64, 256, 4)


@pytest.mark.skipif(not nvcc_found(), reason="nvcc not installed")
def test_row_vector_concats_compile_for_sm90_without_spills(tmp_path) -> None:
    """GPT-2's ``view_50`` at the audit's shape (heuristic) and a 16-bit case build for sm_90; ptxas: 68
    registers under the heuristic's 2-block bound (56 without row vectors, CPU build, CUDA 13), no spill."""
    programs = []
    for g, changes in ((qkv_concat(8, 12, 512, 64), {}), (qkv_concat(2, 4, 64, 16, "bfloat16"), {"row_vectors": True,
                                                                                                  "vec": 4})):
        plan, space, s = _schedule(g, **changes)
        programs.append(lower(g, plan, s, DEV, space))
    regs = compile_programs_sm90(programs, tmp_path, flags=BUILDER_FLAGS)
    assert regs[0]["st_k0"] <= 96, regs


@pytest.mark.skipif(not nvcc_found(), reason="nvcc not installed")
def test_the_rotary_gradient_with_exchanges_keeps_two_blocks_per_sm_without_spills(tmp_path) -> None:
    """Llama's ``view_68`` at the audit's shape (heuristic: row vectors, 256 threads): ptxas sm_90 88 registers
    (CUDA 13; 188 when every shift was loaded), at most the 128 of two blocks per SM, no spill."""
    import re

    from helpers.nvcc import batch_source, ptxas_report

    g = rotary_backward(8, 4, 512, 64)
    plan, space, s = _schedule(g)
    assert dict(s.options).get("row_vectors") and s.block == 256
    src, _ = batch_source([lower(g, plan, s, DEV, space)])
    report = ptxas_report(src, tmp_path, 600, BUILDER_FLAGS)
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", report)]
    assert regs and max(regs) <= DEV.regs_per_sm // (2 * s.block), report
    assert all(int(b) == 0 for b in re.findall(r"(\d+) bytes spill", report)), report


def test_the_space_offers_them_only_where_the_plan_has_vector_rows() -> None:
    """The option on a plan without ``vector_rows`` (a per-row input beside the piece) is a violation; on
    the concat it is legal, and its registers count every row-vector load of an element."""
    d = qkv_concat().to_dict()
    d["inputs"]["r"] = {"shape": [2, 64, 1], "dtype": "float32"}
    d["nodes"].append({"id": "o", "op": "mul", "args": ["cat", "r"]})
    d["outputs"] = ["o"]
    g = parse_graph(d)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = heuristic_schedule(plan, DEV, space)
    assert any("row_vectors" in v for v in space.violations(dataclasses.replace(s, row_vectors=True)))
    plan2, space2, s2 = _schedule(qkv_concat())
    elems = space2.derived(s2)["reg_cache_elems"]
    assert elems == space2.derived(dataclasses.replace(s2, row_vectors=False))["reg_cache_elems"] + 3 * 4 * 1
    rot = make_plan(rotary_backward())
    space3 = SearchSpace.for_plan(rot, DEV)
    s3 = dataclasses.replace(heuristic_schedule(rot, DEV, space3), row_vectors=True)
    def extra(t: Any) -> int:
        return int(space3.derived(t)["reg_cache_elems"] - space3.derived(dataclasses.replace(t, row_vectors=False))[
            "reg_cache_elems"])
    assert s3.tpr * s3.vec == 16 and extra(s3) == 3 * s3.vec * 4   # 4 chains; the shifts from other lanes
    s4 = dataclasses.replace(s3, tpr=4, vec=2, block=32)           # a row in two iterations: no exchange
    assert extra(s4) == 3 * 2 * 12                                  # 4 chains x 3 column shifts


@st.composite
def concat_regions(draw: st.DrawFn) -> dict[str, Any]:
    """A concat along the merged heads of 2-3 pieces, each a head merge ``[B*H, S, D] -> [B, S, H*D]``, a
    transposed one ``[B*H, D, S]`` or a plain ``[B, S, W]`` input, maybe scaled by a per-column weight."""
    B, H = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    S, D = draw(st.sampled_from([8, 16, 24, 32, 40])), draw(st.sampled_from([4, 8, 12]))
    dtype = draw(st.sampled_from(["float32", "float32", "float16"]))
    inputs: dict[str, Any] = {}
    nodes: list[dict[str, Any]] = []
    pieces = []
    for i in range(draw(st.integers(2, 3))):
        kind = draw(st.sampled_from(["merge", "transposed", "transposed", "plain"]))
        x = f"in{i}"
        if kind == "plain":
            inputs[x] = {"shape": [B, S, H * D], "dtype": dtype}
            pieces.append(x)
            continue
        shape, perm = ([B, H, D, S], [0, 3, 1, 2]) if kind == "transposed" else ([B, H, S, D], [0, 2, 1, 3])
        inputs[x] = {"shape": [B * H, shape[2], shape[3]], "dtype": dtype}
        nodes += [{"id": f"v{i}", "op": "reshape", "args": [x], "shape": shape},
                  {"id": f"p{i}", "op": "transpose", "args": [f"v{i}"], "perm": perm},
                  {"id": f"m{i}", "op": "reshape", "args": [f"p{i}"], "shape": [B, S, H * D]}]
        pieces.append(f"m{i}")
    nodes.append({"id": "cat", "op": "concat", "args": pieces, "axis": 2})
    out = "cat"
    if draw(st.booleans()):
        inputs["w"] = {"shape": [len(pieces) * H * D], "dtype": "float32"}
        nodes.append({"id": "o", "op": "mul", "args": ["cat", "w"]})
        out = "o"
    return {"name": "cz", "inputs": inputs, "nodes": nodes, "outputs": [out]}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(concat_regions(), st.integers(0, 3))
def test_random_concats_with_row_vectors_emulate_like_the_reference(obj: dict[str, Any], seed: int) -> None:
    """Every concat region whose plan has ``vector_rows``, at the heuristic and at seeded samples of its space
    with row vectors on, emulates like the float64 reference (faults on a misaligned or stray access)."""
    g = parse_graph(obj)
    plan = make_plan(g)
    assume(plan.vector_rows > 1)
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, 3)
    ref = run_reference(g, inputs)
    h = heuristic_schedule(plan, DEV, space)
    tries = [h, dataclasses.replace(h, vec=2), space.sample(random.Random(seed))]
    ran = 0
    for s in tries:
        s = dataclasses.replace(s, row_vectors=True)
        if space.violations(s):
            continue
        assert RowLowerer(g, plan, s, DEV).rows == plan.vector_rows
        errs = emulated_errors(g, plan, space, s, inputs, ref)
        assert max(errs.values()) < 1e-6, (s.to_json(), errs)
        ran += 1
    assume(ran > 0)   # (16-bit rows of 8 with wide vectors can exceed the register cache: refused)


@st.composite
def rotated_regions(draw: st.DrawFn) -> dict[str, Any]:
    """A transposed chain ``[B*G*H, D, S] -> [B, H, S, D]`` (its ``G`` head groups summed), scaled by a
    ``[S, D]`` table, then its columns rotated at ``cut`` (rotate_half at ``D / 2``, negated or not; or at a
    quarter) plus another ``[B, H, S, D]`` input: concat pieces read at column shifts, which row-vector
    mappings whose row is one iteration take from other lanes (plan/lane_shifts.py) where the lanes allow."""
    B, H, G = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    S, D = draw(st.sampled_from([8, 16, 32])), draw(st.sampled_from([8, 16, 32]))
    cut = draw(st.sampled_from([D // 2, D // 2, D // 4, 3 * D // 4]))
    nodes: list[dict[str, Any]] = [
        {"id": "v", "op": "reshape", "args": ["x"], "shape": [B, G * H, D, S]},
        {"id": "p", "op": "transpose", "args": ["v"], "perm": [0, 1, 3, 2]},
        {"id": "w", "op": "reshape", "args": ["p"], "shape": [B, H, G, S, D]}]
    for i in range(G):
        nodes += [{"id": f"s{i}", "op": "slice", "args": ["w"], "axis": 2, "start": i, "stop": i + 1},
                  {"id": f"s{i}v", "op": "reshape", "args": [f"s{i}"], "shape": [B, H, S, D]}]
    acc = "s0v"
    for i in range(1, G):
        nodes.append({"id": f"a{i}", "op": "add", "args": [acc, f"s{i}v"]})
        acc = f"a{i}"
    nodes += [{"id": "m", "op": "mul", "args": [acc, "t"]},
              {"id": "lo", "op": "slice", "args": ["m"], "axis": 3, "start": 0, "stop": cut},
              {"id": "hi", "op": "slice", "args": ["m"], "axis": 3, "start": cut, "stop": D}]
    first = "hi"
    if draw(st.booleans()):
        nodes.append({"id": "n", "op": "neg", "args": ["hi"]})
        first = "n"
    nodes += [{"id": "r", "op": "concat", "args": [first, "lo"], "axis": 3},
              {"id": "o", "op": "add", "args": ["r", "y"]}]
    f32 = "float32"
    return {"name": "rot", "inputs": {"x": {"shape": [B * G * H, D, S], "dtype": f32},
                                      "t": {"shape": [1, 1, S, D], "dtype": f32},
                                      "y": {"shape": [B, H, S, D], "dtype": f32}}, "nodes": nodes, "outputs": ["o"]}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rotated_regions(), st.integers(0, 3))
def test_random_rotations_with_row_vectors_emulate_like_the_reference(obj: dict[str, Any], seed: int) -> None:
    """Every such region with ``vector_rows``, at the heuristic, at the mapping of a row in one iteration and at a
    seeded sample, row vectors on (column shifts exchanged or loaded), emulates like the float64 reference."""
    g = parse_graph(obj)
    plan = make_plan(g)
    assume(plan.vector_rows > 1)
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, seed)
    ref = run_reference(g, inputs)
    h = heuristic_schedule(plan, DEV, space)
    D = g.spec("o").shape[-1]
    tries = [h, dataclasses.replace(h, tpr=D // 4, vec=4), space.sample(random.Random(seed))]
    ran = 0
    for s in tries:
        s = dataclasses.replace(s, row_vectors=True)
        if space.violations(s):
            continue
        errs = emulated_errors(g, plan, space, s, inputs, ref)
        assert max(errs.values()) < 1e-6, (s.to_json(), errs)
        ran += 1
    assume(ran > 0)
