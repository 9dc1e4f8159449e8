"""Generic kernels of dynamic graphs (stitchtune.lower.dynamic): one program per bucket, correct at
every extent of the bucket, every access checked by the emulator against the actual buffers."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import DEV, EXAMPLES_DIR, compile_programs_sm90, rel_err
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import EmulatorFault, emulate_kernel, emulate_program
from stitchtune.emulate.memory import elem_dtype
from stitchtune.graph.dynamic import Bucket, BucketKey, DynamicRefusal, parse_dynamic
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.gpu.render import render
from stitchtune.ir import kir
from stitchtune.lower.dynamic import RowFit, fit_rows, lower_dynamic
from stitchtune.space import SearchSpace

DYN = EXAMPLES_DIR / "dynamic"
EXAMPLES = ("layernorm_seq", "softmax_seq", "bias_gelu_seq", "embed_add_layernorm_seq")


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
            assert prog.part.startswith("vec"), prog  # the only refusal a legal schedule of these graphs may get
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
        fit = fitted(dg, key)
        space = SearchSpace.for_plan(fit.plan, DEV)
        schedules = [heuristic_schedule(fit.plan, DEV, space)]
        if key.buckets[0].hi == 64:  # seeded samples (split rows, persistent grids, options) in the last bucket
            schedules += [space.sample(random.Random(i)) for i in range(4)]
        refused = check_bucket(dg, key, schedules, fit, space)
        assert refused < len(schedules)


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
    row_len = _dyn({"name": "sm", "dynamic": {"seq": {"min": 1, "max": 64}},
                    "inputs": {"s": {"shape": [4, 8, "seq"], "dtype": "float32"}},
                    "nodes": [{"id": "m", "op": "reduce_max", "args": ["s"], "axes": [-1], "keepdims": True},
                              {"id": "y", "op": "sub", "args": ["s", "m"]}], "outputs": ["y"]})
    r = fit_rows(row_len, row_len.key_of({"seq": 30}))
    assert isinstance(r, DynamicRefusal) and r.part == "row length"
    col = _dyn({"name": "cs", "dynamic": {"seq": {"min": 1, "max": 64}},
                "inputs": {"x": {"shape": ["seq", 64], "dtype": "float32"}},
                "nodes": [{"id": "c", "op": "reduce_sum", "args": ["x"], "axes": [0], "keepdims": True}],
                "outputs": ["c"]})
    r = fit_rows(col, col.key_of({"seq": 30}))
    assert isinstance(r, DynamicRefusal) and r.part in ("family col", "row length")
    sl = _dyn({"name": "sl", "dynamic": {"seq": {"min": 1, "max": 64}},
               "inputs": {"x": {"shape": ["seq", 64], "dtype": "float32"}},
               "nodes": [{"id": "h", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": 32},
                         {"id": "y", "op": "exp", "args": ["h"]}], "outputs": ["y"]})
    r = fit_rows(sl, sl.key_of({"seq": 30}))
    assert isinstance(r, DynamicRefusal) and r.part == "index op h"


def test_generic_kernels_compile_with_nvcc(tmp_path: Path) -> None:
    programs = []
    for name in EXAMPLES:
        dg = small(name, 2048)
        fit = fitted(dg, dg.key_of({"seq": 1000}))
        space = SearchSpace.for_plan(fit.plan, DEV)
        for s in (heuristic_schedule(fit.plan, DEV, space), space.sample(random.Random(1))):
            prog = lower_dynamic(fit, s, DEV, space)
            if isinstance(prog, kir.Program):
                programs.append(prog)
    assert len(programs) >= len(EXAMPLES)
    regs = compile_programs_sm90(programs, tmp_path)  # one nvcc call; fails the test on any error
    assert all(1 <= r <= 255 for d in regs for r in d.values())
