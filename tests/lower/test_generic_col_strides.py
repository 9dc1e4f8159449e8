"""Generic kernels whose column map follows the extents under a static row length: a transposed
output ``[2, 3, 16, s]`` whose columns (16) step by ``s``. The lowering read the representative's static
column strides there (out-of-bounds stores at every other extent of the bucket); now the symbolic column
factors (:meth:`stitchtune.lower.symbols.RowSymbols.cols_follow`), and a vector access needs its outer
column steps aligned for every extent (:func:`stitchtune.lower.dynamic.check_schedule`)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from helpers.lowering import DEV, generic_program, rel_err
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.dynamic import BucketKey, DynamicRefusal, parse_dynamic
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.ir import kir
from stitchtune.lower.dynamic import RowFit, fit_rows, lower_dynamic
from stitchtune.space import SearchSpace


def check_bucket(dg: Any, key: BucketKey) -> kir.Program:
    """The bucket's one generic program, emulated equal to the reference at every combination of its
    dims' probes (smallest, odd, largest); returned for the caller's checks."""
    prog = generic_program(dg, key)
    dims = [b.dim for b in key.buckets]
    for probe in itertools.product(*(b.probes() for b in key.buckets)):
        ext = dict(zip(dims, probe))
        g = dg.at(ext)
        inputs = random_inputs(g, sum(probe))
        ref = run_reference(g, inputs)
        out = emulate_program(prog, inputs, extents=ext, coresident_limit=lambda k: 1 << 30)
        for o in ref:
            assert rel_err(out[o], ref[o]) < 1e-5, (key.label(), ext, o)
    return prog


def _transposed() -> Any:
    """x ``[2, s, 3, 16]`` -> ``[2, 3, 16, s]``: the output's columns (16) step by ``s``."""
    return parse_dynamic({"name": "kt", "dynamic": {"s": {"min": 1, "max": 64}},
                          "inputs": {"x": {"shape": [2, "s", 3, 16], "dtype": "float32"}},
                          "nodes": [{"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 2, 3, 1]}],
                          "outputs": ["t"]})


@pytest.mark.parametrize("s", [1, 2, 4, 40])
def test_a_column_stride_that_follows_the_extents_is_symbolic(s: int) -> None:
    """Under a static row length the generic kernel used the representative's column strides: the
    output of bucket 33..64 was stored with stride 64 at s = 33 (out of bounds); now through the
    symbolic column factors."""
    dg = _transposed()
    key = dg.key_of({"s": s})
    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit) and fit.sym.N.static
    if s > 2:
        assert fit.sym.cols_follow("t") and not fit.sym.cols_follow("x")
    check_bucket(dg, key)


def test_sampled_schedules_of_a_symbolic_column_stride_emulate_or_are_refused() -> None:
    dg = _transposed()
    key = dg.key_of({"s": 64})
    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit)
    space = SearchSpace.for_plan(fit.plan, DEV)
    ran = 0
    for i in range(12):
        s = space.sample(random.Random(i))
        prog = lower_dynamic(fit, s, DEV, space)
        if isinstance(prog, DynamicRefusal):
            assert prog.part.startswith(("vec", "transpose", "split", "single_pass")), prog
            continue
        ran += 1
        for e in key.buckets[0].probes():
            g = dg.at({"s": e})
            inputs = random_inputs(g, e)
            out = emulate_program(prog, inputs, extents={"s": e}, coresident_limit=lambda k: 1 << 30)
            assert rel_err(out["t"], run_reference(g, inputs)["t"]) < 1e-5, (s.to_json(), e)
    assert ran
