"""Generic kernels of dynamic graphs (stitchtune.lower.dynamic): one program per bucket, correct at
every extent of the bucket, every access checked by the emulator against the actual buffers."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers.common import EXAMPLES_DIR
from stitchtune.graph.node_lists import layernorm_rows
from helpers.lowering import DEV, rel_err
from helpers.nvcc import compile_programs_sm90
from stitchtune.cost.heuristic import generic_heuristic, heuristic_schedule
from stitchtune.emulate.emulator import EmulatorFault, emulate_kernel, emulate_program
from stitchtune.emulate.memory import elem_dtype
from stitchtune.graph.dynamic import Bucket, BucketKey, DynamicRefusal, parse_dynamic
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.gpu.render import render
from stitchtune.ir import kir
from stitchtune.lower.dynamic import RowFit, fit_rows, lower_dynamic
from stitchtune.lower.gather import gather_flag_buffers
from stitchtune.space import SearchSpace
from stitchtune.space.options import SINGLE_PASS

DYN = EXAMPLES_DIR / "dynamic"
EXAMPLES = ("layernorm_seq", "softmax_seq", "bias_gelu_seq", "embed_add_layernorm_seq", "attention_softmax_seq",
            "gather_embed_layernorm_seq", "rotate_half_seq")
#: what a generic kernel may refuse of a legal schedule of these graphs (a dynamic row length: vector widths
#: its extents do not align, split rows, single passes)
REFUSED_PARTS = ("vec", "split", "single_pass")


def small(name: str, hi: int = 64) -> Any:
    """``examples/dynamic/<name>.json`` with seq 1..hi (small enough to emulate every bucket)."""
    obj = json.loads((DYN / f"{name}.json").read_text())
    obj["dynamic"]["seq"] = {"min": 1, "max": hi}
    return parse_dynamic(obj)


def fitted(dg: Any, key: BucketKey) -> RowFit:
    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit), fit
    return fit


def check_bucket(dg: Any, key: BucketKey, schedules: list[Any], fit: RowFit, space: SearchSpace) -> int:
    """Every schedule's generic program emulates within 1e-5 of the reference at the bucket's probes;
    returns the number of schedules refused (as data)."""
    refused = 0
    for s in schedules:
        prog = lower_dynamic(fit, s, DEV, space)
        if isinstance(prog, DynamicRefusal):
            assert prog.part.startswith(REFUSED_PARTS), prog
            refused += 1
            continue
        for e in key.buckets[0].probes():
            g = dg.at({"seq": e})
            inputs = random_inputs(g, e)
            ref = run_reference(g, inputs)
            out = emulate_program(prog, inputs, extents={"seq": e}, coresident_limit=lambda k: 1 << 30)
            for o in ref:
                assert rel_err(out[o], ref[o]) < 1e-5, (dg.at({"seq": e}).name, key.label(), s.to_json(), e, o)
    return refused


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_bucket_emulates_at_smallest_odd_and_largest(name: str) -> None:
    dg = small(name)
    for key in dg.keys():
        r = fit_rows(dg, key)
        if isinstance(r, DynamicRefusal) and key.label() == "seq=1..1" and name == "attention_softmax_seq":
            assert r.part == "plan"  # softmax over one key: the planner has no plan at seq=1 (a size-1 reduction)
            continue
        fit = fitted(dg, key)
        space = SearchSpace.for_plan(fit.plan, DEV)
        assert check_bucket(dg, key, [generic_heuristic(fit, DEV, space)], fit, space) == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_sampled_schedules_emulate_in_the_last_bucket(name: str) -> None:
    """Seeded samples (split rows, persistent grids, clusters, options) of the bucket 33..64 at 33, 49, 64."""
    dg = small(name)
    key = dg.key_of({"seq": 64})
    fit = fitted(dg, key)
    space = SearchSpace.for_plan(fit.plan, DEV)
    schedules = [space.sample(random.Random(i)) for i in range(4)]
    check_bucket(dg, key, schedules, fit, space)  # refusals are data (REFUSED_PARTS), the others right


def test_position_embedding_row_map_uses_the_extent() -> None:
    dg = small("embed_add_layernorm_seq")
    key = dg.key_of({"seq": 40})
    fit = fitted(dg, key)
    assert str(fit.sym.M) == "2*seq"
    (f,) = fit.sym.factors("pos")
    assert (str(f.dim), str(f.inner), str(f.stride)) == ("seq", "1", "128")
    prog = lower_dynamic(fit, heuristic_schedule(fit.plan, DEV), DEV)
    assert isinstance(prog, kir.Program) and prog.dynamic is not None
    src = render(prog)
    assert "const int ext0" in src and "% ext0" in src
    assert "seq" not in src  # the kernel names its argument itself: nothing from the graph


def test_one_program_serves_the_bucket_and_its_grid_follows_the_extent() -> None:
    dg = small("layernorm_seq")
    key = BucketKey((Bucket("seq", 33, 64),))
    fit = fitted(dg, key)
    prog = lower_dynamic(fit, heuristic_schedule(fit.plan, DEV), DEV)
    assert isinstance(prog, kir.Program) and prog.dynamic is not None
    grids = {e: prog.dynamic.grid(0, {"seq": e}) for e in (33, 47, 64)}
    assert grids[64] == prog.launches[0].grid and grids[33] <= grids[47] <= grids[64]
    assert prog.dynamic.size("in0", 0, {"seq": 47}) == 2 * 47 * 256


def test_emulator_faults_an_extent_beyond_the_buffers() -> None:
    """The kernel argument is what guards the rows: told seq=41 over buffers of seq=40, it reads past them."""
    dg = small("layernorm_seq")
    key = dg.key_of({"seq": 40})
    fit = fitted(dg, key)
    prog = lower_dynamic(fit, heuristic_schedule(fit.plan, DEV), DEV)
    assert isinstance(prog, kir.Program) and prog.dynamic is not None
    k = prog.kernels[0]
    g = dg.at({"seq": 40})
    ins = random_inputs(g, 0)
    bufs: dict[str, np.ndarray] = {}
    for p in k.params:
        b = prog.buffer(p.name)
        size = prog.dynamic.size(b.name, b.size, {"seq": 40})
        bufs[p.name] = (np.asarray(ins[b.tensor]).ravel().astype(elem_dtype(b.dtype, b.role)) if b.role == "input"
                        else np.zeros(size, elem_dtype(b.dtype, b.role)))
    emulate_kernel(k, prog.dynamic.grid(0, {"seq": 40}), dict(bufs), extents={"ext0": 40})
    with pytest.raises(EmulatorFault) as e:
        emulate_kernel(k, prog.dynamic.grid(0, {"seq": 41}), dict(bufs), extents={"ext0": 41})
    assert e.value.kind == "out_of_bounds"


def _dyn(obj: dict[str, Any]) -> Any:
    return parse_dynamic(obj)


def test_refusals_are_data_naming_the_part() -> None:
    col = _dyn({"name": "cs", "dynamic": {"seq": {"min": 1, "max": 64}},
                "inputs": {"x": {"shape": ["seq", 64], "dtype": "float32"}},
                "nodes": [{"id": "c", "op": "reduce_sum", "args": ["x"], "axes": [0], "keepdims": True}],
                "outputs": ["c"]})
    r = fit_rows(col, col.key_of({"seq": 30}))
    assert isinstance(r, DynamicRefusal) and r.part == "family col"
    sl = _dyn({"name": "sl", "dynamic": {"seq": {"min": 1, "max": 64}},
               "inputs": {"x": {"shape": [4, "seq", 64], "dtype": "float32"}},
               "nodes": [{"id": "h", "op": "slice", "args": ["x"], "axis": 0, "start": 0, "stop": 2},
                         {"id": "y", "op": "exp", "args": ["h"]}], "outputs": ["y"]})
    r = fit_rows(sl, sl.key_of({"seq": 30}))
    assert isinstance(r, DynamicRefusal) and r.part == "index op h" and "axis 1 inside it follows the extents" in r.reason
    tr = _dyn({"name": "tr", "dynamic": {"seq": {"min": 1, "max": 64}},
               "inputs": {"x": {"shape": [2, 8, "seq"], "dtype": "float32"}},
               "nodes": [{"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 2, 1]},
                         {"id": "h", "op": "slice", "args": ["t"], "axis": 2, "start": 0, "stop": 4},
                         {"id": "y", "op": "exp", "args": ["h"]}], "outputs": ["y"]})
    r = fit_rows(tr, tr.key_of({"seq": 30}))
    # (the chain's shapes following the extents are served now; its plan's adjacent rows follow seq % 8)
    assert isinstance(r, DynamicRefusal) and r.part == "plan" and "differs in structure" in r.reason, r
    rl = _dyn({"name": "rl", "dynamic": {"seq": {"min": 1, "max": 64}},
               "inputs": {"x": {"shape": [4, "seq", 16], "dtype": "float32"}},
               "nodes": [{"id": "h", "op": "slice", "args": ["x"], "axis": 2, "start": 0, "stop": 8},
                         {"id": "m", "op": "reduce_max", "args": ["h"], "axes": [1, 2], "keepdims": True},
                         {"id": "y", "op": "sub", "args": ["h", "m"]}], "outputs": ["y"]})
    r = fit_rows(rl, rl.key_of({"seq": 30}))
    assert isinstance(r, DynamicRefusal) and r.part == "index op h" and "dynamic row length" in r.reason, r


def _gather_graph(**change: Any) -> Any:
    """``examples/dynamic/gather_embed_layernorm_seq.json`` with seq 1..64 and ``change`` applied to its
    inputs (name -> spec)."""
    obj = json.loads((DYN / "gather_embed_layernorm_seq.json").read_text())
    obj["dynamic"]["seq"] = {"min": 1, "max": 64}
    obj["inputs"].update(change)
    return parse_dynamic(obj)


def test_a_gather_the_generic_kernel_cannot_serve_is_refused_by_name() -> None:
    dg = _gather_graph(word={"shape": ["seq", 64], "dtype": "float32"})   # the table follows the extents
    r = fit_rows(dg, dg.key_of({"seq": 30}))
    assert isinstance(r, DynamicRefusal) and r.part == "index op we" and "table" in r.reason
    pk = _dyn({"name": "pk", "dynamic": {"seq": {"min": 1, "max": 64}},
               "inputs": {"x": {"shape": [2, "seq", 64], "dtype": "float32"},
                          "i": {"shape": [2, "seq", 1], "dtype": "int32"}},
               "nodes": [{"id": "p", "op": "gather_elements", "args": ["x", "i"], "axis": 2},
                         {"id": "y", "op": "add", "args": ["x", "p"]}], "outputs": ["y"]})
    r = fit_rows(pk, pk.key_of({"seq": 30}))
    assert isinstance(r, DynamicRefusal) and r.part == "index op p" and "gather_elements" in r.reason


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_an_out_of_range_id_raises_the_flag_of_a_generic_gather(dtype: str) -> None:
    """In bucket 33..64 at 33, 49 and 64: hostile ids (negative, the table's row count, huge) in the first
    and the last row give zero rows and the node's error flag, never an access out of bounds (the
    emulator checks every one against buffers of that extent); in-range ids leave the flag at 0."""
    dg = _gather_graph(ids={"shape": [2, "seq"], "dtype": dtype})
    key = dg.key_of({"seq": 64})
    fit = fitted(dg, key)
    space = SearchSpace.for_plan(fit.plan, DEV)
    prog = lower_dynamic(fit, generic_heuristic(fit, DEV, space), DEV, space)
    assert isinstance(prog, kir.Program) and gather_flag_buffers(prog) == {"gerr0": "we"}
    for e in key.buckets[0].probes():
        g = dg.at({"seq": e})
        x = random_inputs(g, e)
        clean: dict[str, np.ndarray] = {}
        emulate_program(prog, dict(x), extents={"seq": e}, coresident_limit=lambda k: 1 << 30, scratch_out=clean)
        assert clean["gerr0"][0] == 0, e
        bad = [-1, 50, 2**31 - 1] if dtype == "int32" else [-1, 50, 2**32 + 3]
        x["ids"].flat[:len(bad)] = bad
        x["ids"].flat[-1] = bad[1]
        ref = run_reference(g, x)
        scratch: dict[str, np.ndarray] = {}
        out = emulate_program(prog, dict(x), extents={"seq": e}, coresident_limit=lambda k: 1 << 30,
                              scratch_out=scratch)
        assert rel_err(out["y"], ref["y"]) < 1e-5, e
        assert scratch["gerr0"][0] > 0, e


def test_a_generic_gather_reads_ids_of_two_dynamic_dims() -> None:
    """ids [batch, seq]: the rows are batch x seq, the id of row r is ids[r] whatever the extents."""
    obj = json.loads((DYN / "gather_embed_layernorm_seq.json").read_text())
    obj["dynamic"] = {"seq": {"min": 1, "max": 32}, "batch": {"min": 1, "max": 8}}
    obj["inputs"]["ids"]["shape"] = ["batch", "seq"]
    dg = parse_dynamic(obj)
    key = dg.key_of({"seq": 20, "batch": 3})
    fit = fitted(dg, key)
    assert str(fit.sym.M) == "batch*seq"
    prog = lower_dynamic(fit, generic_heuristic(fit, DEV), DEV)
    assert isinstance(prog, kir.Program) and prog.kernels[0].extents == ("ext0", "ext1")
    src = render(prog)
    assert "< (unsigned int)50)" in src and "seq" not in src   # the static table's bound; nothing from the graph
    for ext in ({"seq": 17, "batch": 3}, {"seq": 23, "batch": 4}, {"seq": 32, "batch": 3}):
        g = dg.at(ext)
        ins = random_inputs(g, 1)
        out = emulate_program(prog, ins, extents=ext)
        assert rel_err(out["y"], run_reference(g, ins)["y"]) < 1e-5, ext


def test_dynamic_row_length_refuses_what_its_extents_do_not_allow() -> None:
    """softmax over a dynamic row: a vector width the row length does not align, a split row and the
    single pass are refused as data; the generic heuristic avoids them and is right at every probe."""
    dg = small("attention_softmax_seq")
    key = dg.key_of({"seq": 40})
    fit = fitted(dg, key)
    assert fit.sym.dynamic_rows_length and str(fit.sym.N) == "seq" and str(fit.sym.M) == "8*seq"
    space = SearchSpace.for_plan(fit.plan, DEV)
    h = heuristic_schedule(fit.plan, DEV, space)
    assert h.vec > 1
    r = lower_dynamic(fit, h, DEV, space)
    assert isinstance(r, DynamicRefusal) and r.part.startswith(REFUSED_PARTS)
    g = generic_heuristic(fit, DEV, space)
    assert g.vec == 1 and not g.option(SINGLE_PASS) and g.split == 1
    prog = lower_dynamic(fit, g, DEV, space)
    assert isinstance(prog, kir.Program)
    assert re.search(r"= min\(\(kb\d+ \+ 64\), ext0\);", render(prog))  # the row ends at the extent argument


def test_generic_kernels_compile_with_nvcc(tmp_path: Path) -> None:
    programs = []
    for name in EXAMPLES:
        dg = small(name, 2048)
        fit = fitted(dg, dg.key_of({"seq": 1000}))
        space = SearchSpace.for_plan(fit.plan, DEV)
        for s in (generic_heuristic(fit, DEV, space), space.sample(random.Random(1))):
            prog = lower_dynamic(fit, s, DEV, space)
            if isinstance(prog, kir.Program):
                programs.append(prog)
    assert len(programs) >= len(EXAMPLES)
    regs = compile_programs_sm90(programs, tmp_path)  # one nvcc call; fails the test on any error
    assert all(1 <= r <= 255 for d in regs for r in d.values())


def test_two_dynamic_dims_batch_and_seq() -> None:
    """rows = batch x seq (a product of two extents), the position embedding's rows follow seq alone."""
    obj = json.loads((DYN / "embed_add_layernorm_seq.json").read_text())
    obj["dynamic"] = {"seq": {"min": 1, "max": 32}, "batch": {"min": 1, "max": 8}}
    obj["inputs"]["tok"]["shape"] = ["batch", "seq", 128]
    dg = parse_dynamic(obj)
    assert len(dg.keys()) == 4 * 6
    key = dg.key_of({"seq": 20, "batch": 3})
    fit = fitted(dg, key)
    assert str(fit.sym.M) == "batch*seq" and str(fit.sym.factors("pos")[0].dim) == "seq"
    prog = lower_dynamic(fit, generic_heuristic(fit, DEV), DEV)
    assert isinstance(prog, kir.Program) and prog.kernels[0].extents == ("ext0", "ext1")
    for ext in ({"seq": 17, "batch": 3}, {"seq": 23, "batch": 4}, {"seq": 32, "batch": 3}):
        g = dg.at(ext)
        ins = random_inputs(g, 1)
        out = emulate_program(prog, ins, extents=ext)
        assert rel_err(out["y"], run_reference(g, ins)["y"]) < 1e-5, ext


@pytest.mark.parametrize("name", EXAMPLES)
def test_a_bucket_from_one(name: str) -> None:
    """The default first bucket is extent 1 alone (1..1), planned at 1 like any other extent, also for
    a dynamic row length (a softmax over one key: its reductions are identities there,
    stitchtune/plan/unit_reductions.py)."""
    obj = json.loads((DYN / f"{name}.json").read_text())
    obj["dynamic"]["seq"] = {"min": 1, "max": 2048}
    dg = parse_dynamic(obj)
    key = dg.key_of({"seq": 1})
    assert key.label() == "seq=1..1"
    fit = fitted(dg, key)
    space = SearchSpace.for_plan(fit.plan, DEV)
    assert check_bucket(dg, key, [generic_heuristic(fit, DEV, space)], fit, space) == 0


def test_a_row_move_below_a_layernorm_is_refused_as_data() -> None:
    """A LayerNorm rolled along its rows plans only through the row-move rewrite (stitchtune/plan/row_moves.py),
    which the generic kernels do not take: every bucket is a ``row move`` refusal, not an error."""
    nodes = layernorm_rows("x") + [
        {"id": "s1", "op": "slice", "args": ["xb"], "axis": 1, "start": 2, "stop": 8},
        {"id": "s2", "op": "slice", "args": ["xb"], "axis": 1, "start": 0, "stop": 2},
        {"id": "r", "op": "concat", "args": ["s1", "s2"], "axis": 1}]
    f32 = "float32"
    dg = parse_dynamic({"name": "t", "inputs": {"x": {"shape": ["n", 8, 8], "dtype": f32}, "g": {"shape": [8], "dtype": f32},
                                                "b": {"shape": [8], "dtype": f32}},
                        "nodes": nodes, "outputs": ["r"], "dynamic": {"n": {"min": 1, "max": 4}}})
    for key in dg.keys():
        r = fit_rows(dg, key)
        assert isinstance(r, DynamicRefusal) and r.part == "row move", r
