"""Row vectors in the column family (stitchtune/lower/row_vectors.py): a column-sum region that reads its
input along the rows (BERT's training ``view_59``: a head merge of ``[B*H, D, S]`` summed over its
``B*S`` rows) loads 4 rows per 128-bit access at the ideal sectors; shapes whose rows do not split into
whole row groups keep the row-by-row sweep; every shape and schedule emulates like the float64 reference
(the emulator faults on any out-of-bounds or misaligned access)."""

from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from helpers.graphs import head_merge_colsum
from helpers.layouts import layout_regions
from helpers.lowering import DEV, emulated_errors, float_graph, plan_or_refused
from helpers.nvcc import BUILDER_FLAGS, compile_programs_sm90
from stitchtune.analysis.audit import audit_graph
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.gpu.build import nvcc_found
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.ir import kir
from stitchtune.lower.col import ColLowerer
from stitchtune.lower.entry import lower
from stitchtune.lower.sectors import row_sector_factor
from stitchtune.plan.planner import TensorClass, make_plan
from stitchtune.space import SearchSpace


def _loads_of(prog: kir.Program, buf: str) -> list[int]:
    """The widths of every global load of ``buf`` in ``prog`` (a scalar load: 1)."""
    widths = []
    for k in prog.kernels:
        for st_ in kir.walk(k.body):
            if isinstance(st_, kir.LoadVec) and st_.buf == buf:
                widths.append(len(st_.dsts))
            widths += [1 for e in kir.exprs(st_) if isinstance(e, kir.Load) and e.buf == buf]
    return widths


def _schedule(g: Any, **changes: Any) -> tuple[Any, SearchSpace, Any]:
    """The heuristic schedule of ``g`` with ``changes`` (row vectors on unless ``row_vectors`` is given)."""
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = dataclasses.replace(heuristic_schedule(plan, DEV, space), **{"row_vectors": True, **changes})
    assert not space.violations(s), space.violations(s)
    return plan, space, s


@pytest.mark.parametrize("scale", [False, True])
def test_a_transposed_input_is_loaded_four_rows_per_128_bit_access(scale: bool) -> None:
    g = head_merge_colsum(H=4, D=16, scale=scale)
    plan, space, s = _schedule(g, tpr=8, split=2, vec=4, block=64)
    assert plan.family == "col" and ColLowerer(g, plan, s, DEV).rows == 4
    prog = lower(g, plan, s, DEV, space)
    assert set(_loads_of(prog, "in0")) == {4}     # was one 32-bit load per element
    inputs = random_inputs(g, 3)
    ref = run_reference(g, inputs)
    assert max(emulated_errors(g, plan, space, s, inputs, ref).values()) < 1e-5
    off = dataclasses.replace(s, row_vectors=False)   # the option turned off: the row-by-row sweep, as exact
    assert ColLowerer(g, plan, off, DEV).rows == 1 and set(_loads_of(lower(g, plan, off, DEV, space), "in0")) == {1}
    assert max(emulated_errors(g, plan, space, off, inputs, ref).values()) < 1e-5


def test_row_vectors_reach_the_ideal_sectors() -> None:
    """The emulated sector trace of the transposed load: 1.00x with row vectors; the row-by-row sweep
    of a shape whose rows do not split into groups (one row fewer per batch) pays 2.00x."""
    g = head_merge_colsum(B=2, H=4, D=16, S=64)
    _, _, s = _schedule(g, tpr=8, split=2, vec=4, block=64)
    a = audit_graph(g, DEV, s, sass=False, peer=False)
    loads = [x for k in a.kernels for x in k.accesses if x.buf == "in0"]
    assert loads and all(x.width == 4 and x.ratio == 1.0 for x in loads)
    odd = head_merge_colsum(B=2, H=4, D=16, S=60)   # M = 120: not a multiple of split * tpr * 4
    plan2, space2, s2 = _schedule(odd, tpr=8, split=2, vec=4, block=64, row_vectors=False)
    assert space2.violations(dataclasses.replace(s2, row_vectors=True))   # the option does not apply there
    a2 = audit_graph(odd, DEV, s2, sass=False, peer=False)
    assert max(x.ratio for k in a2.kernels for x in k.accesses if x.buf == "in0") > 1.5
    off = audit_graph(g, DEV, dataclasses.replace(s, row_vectors=False), sass=False, peer=False)  # turned off
    assert max(x.ratio for k in off.kernels for x in k.accesses if x.buf == "in0") == 2.0


def test_the_profile_counts_the_row_vectors_sectors() -> None:
    """The cost model's sector factor of the transposed input (``lower.sectors``): 2.0 row by row, 1.0
    with 4 rows a lane, as the emulator counts them."""
    g = head_merge_colsum(B=2, H=4, D=16, S=64)
    imap = make_plan(g).imap("x")
    assert row_sector_factor(imap, 4, 4, lanes_per_row=8) == 2.0
    assert row_sector_factor(imap, 4, 4, lanes_per_row=8, rows=4) == 1.0


def test_two_sweeps_with_register_and_shared_caches_emulate() -> None:
    """A column softmax of the head merge (``exp(m) / colsum(exp(m))``: a second sweep re-reads its rows,
    from a register or shared cache or recomputed): every sampled reuse level with row vectors emulates."""
    B, H, D, S = 2, 4, 16, 64
    nodes: list[dict[str, Any]] = [
        {"id": "v", "op": "reshape", "args": ["x"], "shape": [B, H, D, S]},
        {"id": "p", "op": "transpose", "args": ["v"], "perm": [0, 3, 1, 2]},
        {"id": "m", "op": "reshape", "args": ["p"], "shape": [B * S, H * D]},
        {"id": "e", "op": "exp", "args": ["m"]},
        {"id": "s", "op": "reduce_sum", "args": ["e"], "axes": [0], "keepdims": True},
        {"id": "y", "op": "div", "args": ["e", "s"]}]
    g = float_graph({"x": [B * H, D, S]}, nodes, ["y"])
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, 1)
    ref = run_reference(g, inputs)
    levels: set[str] = set()
    for i in range(16):
        s = dataclasses.replace(space.sample(random.Random(i)), tpr=8, split=2, block=64, row_vectors=True)
        if space.violations(s):
            continue
        assert ColLowerer(g, plan, s, DEV).rows == 4
        levels |= set(s.reuse)
        assert max(emulated_errors(g, plan, space, s, inputs, ref).values()) < 1e-5, s.to_json()
    assert {"register", "shared"} <= levels, levels


def _with_row_vectors(space: SearchSpace, s: Any) -> Any:
    """``s`` with row vectors where the space allows them (option ``row_vectors``), else ``s``."""
    t = dataclasses.replace(s, row_vectors=True)
    return s if space.violations(t) else t


def _schedules(plan: Any, space: SearchSpace, seed: int) -> list[Any]:
    """The heuristic schedule, a sampled one, and every legal one of small ``tpr`` / ``split`` / ``block``
    (row groups whole for more shapes), each with row vectors where the space allows them."""
    base = heuristic_schedule(plan, DEV, space)
    out = [base, space.sample(random.Random(seed))]
    for tpr, split, block in itertools.product((1, 2, 4, 8), (1, 2), (32, 64)):
        s = dataclasses.replace(base, tpr=tpr, split=split, block=block)
        if not space.violations(s):
            out.append(s)
    return [_with_row_vectors(space, s) for s in out]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(B=st.sampled_from([1, 2, 3]), H=st.sampled_from([1, 2, 3]), D=st.sampled_from([4, 5, 8]),
       S=st.sampled_from([4, 6, 8, 12, 16, 20, 32]), scale=st.booleans(), seed=st.integers(0, 1000))
def test_every_shape_and_schedule_emulates(B: int, H: int, D: int, S: int, scale: bool, seed: int) -> None:
    """Odd shapes (rows or columns that do not divide) and several schedules: row vectors exactly where
    every row group is whole, and every program emulates like the reference without a fault."""
    g = head_merge_colsum(B, H, D, S, scale)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, seed)
    ref = run_reference(g, inputs)
    for s in _schedules(plan, space, seed) if plan.family == "col" else [heuristic_schedule(plan, DEV, space)]:
        if plan.family == "col":
            R = ColLowerer(g, plan, s, DEV).rows
            assert R in (1, 4)
            assert (R == 4) == (S % 4 == 0 and plan.M % (s.split * s.tpr * 4) == 0), (s.to_json(), R)
        errs = emulated_errors(g, plan, space, s, inputs, ref)
        assert max(errs.values()) < 1e-5, (s.to_json(), errs)


@pytest.mark.skipif(not nvcc_found(), reason="nvcc not installed")
def test_row_vector_kernels_compile_for_sm90(tmp_path) -> None:
    """BERT's ``view_59`` at the audit's shape (heuristic schedule) and the small cases build for sm_90."""
    programs = []
    for g, changes in ((head_merge_colsum(8, 12, 64, 512), {}), (head_merge_colsum(2, 4, 16, 64), {"tpr": 8, "split": 2,
                       "block": 64}), (head_merge_colsum(2, 4, 16, 64, True), {"tpr": 8, "split": 2, "block": 64})):
        plan, space, s = _schedule(g, **changes)
        assert ColLowerer(g, plan, s, DEV).rows == 4
        programs.append(lower(g, plan, s, DEV, space))
    compile_programs_sm90(programs, tmp_path, flags=BUILDER_FLAGS)


def test_a_row_by_row_input_beside_row_vectors_claims_the_sectors_the_emulator_counts() -> None:
    """A second input ``y [B, H, S, D]`` (strided columns, its rows ``D`` apart: not loaded as row vectors)
    is read one row at a time, but the rows of a warp's access are ``R`` apart (``tk * R + q``), not adjacent:
    the profile's factor (:meth:`Lowerer.sector_factor`) is the emulated trace's for every buffer
    (it claimed y's adjacent-row 1.00x / 2.00x where the trace counts 2.00x / 4.00x)."""
    for (B, H, D, S), (tpr, split, block, vec) in (((2, 2, 4, 32), (4, 2, 32, 1)), ((1, 8, 2, 16), (4, 1, 32, 2)),
                                                    ((1, 8, 2, 16), (2, 1, 32, 1))):
        nodes: list[dict[str, Any]] = [
            {"id": "v", "op": "reshape", "args": ["x"], "shape": [B, H, D, S]},
            {"id": "p", "op": "transpose", "args": ["v"], "perm": [0, 3, 1, 2]},
            {"id": "m", "op": "reshape", "args": ["p"], "shape": [B * S, H * D]},
            {"id": "yt", "op": "transpose", "args": ["y"], "perm": [0, 2, 1, 3]},
            {"id": "ym", "op": "reshape", "args": ["yt"], "shape": [B * S, H * D]},
            {"id": "z", "op": "mul", "args": ["m", "ym"]},
            {"id": "s", "op": "reduce_sum", "args": ["z"], "axes": [0], "keepdims": True}]
        g = float_graph({"x": [B * H, D, S], "y": [B, H, S, D]}, nodes, ["z", "s"])
        plan, space, s = _schedule(g, tpr=tpr, split=split, block=block, vec=vec)
        low = ColLowerer(g, plan, s, DEV)
        assert low.rows == 4 and low.row_vectors == {"x"}
        prog = lower(g, plan, s, DEV, space)
        claims = {b.name: low.sector_factor(b) for b in prog.buffers}
        a = audit_graph(g, DEV, s, sass=False, peer=False)
        traced = {(x.buf, x.ratio) for k in a.kernels for x in k.accesses if x.buf in claims}
        assert {b for b, _ in traced} >= {"in0", "in1"}
        for buf, ratio in traced:
            assert claims[buf] == pytest.approx(ratio, abs=0.05), (B, H, D, S, tpr, block, vec, buf, claims, ratio)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(layout_regions())
def test_random_layout_regions_with_row_vectors_emulate_and_claim_the_traced_sectors(obj: dict[str, Any]) -> None:
    """The layout fuzz's regions (transposes, reshapes, broadcasts, one reduction stage) in the column family,
    under every small schedule that takes row vectors: the program emulates like the float64 reference, and
    where the columns are whole tiles the profile's sector factor of every full-size mapped tensor
    (:meth:`Lowerer.sector_factor`; a plain one's is 1 by the profile's rule) is the emulated trace's."""
    g, plan = plan_or_refused(obj)
    assume(plan is not None and plan.family == "col" and plan.P >= 8)
    space = SearchSpace.for_plan(plan, DEV)
    base = heuristic_schedule(plan, DEV, space)
    taken = []
    for tpr, split, block, vec in itertools.product((1, 2, 4, 8), (1, 2), (32, 64), (1, 4)):
        s = dataclasses.replace(base, tpr=tpr, split=split, block=block, vec=vec, row_vectors=True)
        if not space.violations(s) and (low := ColLowerer(g, plan, s, DEV)).rows > 1:
            taken.append((s, low))
    assume(taken)   # regions where no schedule takes row vectors are not examples
    inputs = random_inputs(g, 1)
    ref = run_reference(g, inputs)
    for s, low in taken:
        assert max(emulated_errors(g, plan, space, s, inputs, ref).values()) < 1e-5, (obj, s.to_json())
        if plan.N % low.TC:   # the factor models a whole column tile (a partial last tile moves more per element)
            continue
        claims = {b.name: low.sector_factor(b) for b in lower(g, plan, s, DEV, space).buffers   # full-size, mapped:
                  if b.tensor and plan.mapped(b.tensor) and low.cls[b.tensor] is TensorClass.FULL}   # read row by row
        for k in audit_graph(g, DEV, s, sass=False, peer=False).kernels:
            for x in k.accesses:
                if x.buf in claims:
                    assert claims[x.buf] == pytest.approx(x.ratio, abs=0.05), (obj, s.to_json(), x.buf)
