"""One contract over every stitching scheme (the built-in table and ``helpers.lowering.GLOBAL_ROWS``, a scheme
declared only in the tests): its legal points lower, emulate to the float64 reference, render, compile with
nvcc for sm_90, and the cost model reports the term the scheme declares. Small shapes (``*_small``
examples), seeded samples that use the scheme in at least one stage. About two minutes on one core:
marked slow (CI runs it)."""

from __future__ import annotations

import functools
import random

import pytest

from helpers.common import EXAMPLES
from helpers.lowering import DEV, GLOBAL_ROWS, local_scheme_space, rel_err, setup
from helpers.nvcc import BUILDER_FLAGS, compile_programs_sm90
from stitchtune.cost.model import explain
from stitchtune.emulate.emulator import emulate_program
from stitchtune.gpu.build import NvccBuilder, nvcc_found
from stitchtune.gpu.render import render
from stitchtune.graph.parse import load_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.lower.entry import lower
from stitchtune.space import SCHEMES, Schedule, SearchSpace

#: where each scheme is exercised: row reductions (one and two stages, a split-able wide row) and a
#: column reduction; every scheme is legal in at least one of them
WHERE = ("softmax_small.json", "layernorm_wide_small.json", "colsum_sigmoid_scale_small.json")
SCHEME_NAMES = [*SCHEMES.names, GLOBAL_ROWS.name]


def _space(name: str, scheme: str) -> SearchSpace:
    return local_scheme_space(name) if scheme == GLOBAL_ROWS.name else setup(name)[2]


def _points(space: SearchSpace, scheme: str, n: int) -> list[Schedule]:
    """Up to ``n`` seeded samples of ``space`` with ``scheme`` in some stage."""
    out: list[Schedule] = []
    rng = random.Random(7)
    for _ in range(3000):
        s = space.sample(rng)
        if scheme in s.schemes and s not in out:
            out.append(s)
            if len(out) == n:
                break
    return out


@functools.cache
def _case(name: str, scheme: str) -> tuple[str, SearchSpace, list[Schedule]] | None:
    """``(name, space, points)`` where example ``name`` offers ``scheme`` and samples of it were found, else
    None; computed once per process (the contract and compile tests ask for the same ones)."""
    space = _space(name, scheme)
    if scheme in space.domains["scheme"]:
        pts = _points(space, scheme, 2)
        if pts:
            return name, space, pts
    return None


def _cases(scheme: str) -> list[tuple[str, SearchSpace, list[Schedule]]]:
    return [c for name in WHERE if (c := _case(name, scheme)) is not None]


def _first_case(scheme: str) -> tuple[str, SearchSpace, list[Schedule]]:
    """``_cases(scheme)[0]`` without sampling the examples after it."""
    return next(c for name in WHERE if (c := _case(name, scheme)) is not None)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_legal_points_lower_emulate_and_report_the_cost_term(scheme: str) -> None:
    cases = _cases(scheme)
    assert cases, f"no example offers scheme {scheme}"
    term = SCHEMES.extended(GLOBAL_ROWS)[scheme].cost_term
    priced: list[float] = []  # the scheme's cost term (its largest over the kernels) of each priced point
    for name, space, points in cases:
        g = load_graph(EXAMPLES / name)
        inputs = random_inputs(g, 3)
        ref = run_reference(g, inputs)
        for s in points:
            assert space.violations(s) == []
            prog = lower(g, space.plan, s, DEV, space)
            out = emulate_program(prog, inputs, coresident_limit=lambda k: 1 << 30, cluster_limit=lambda k: 1 << 30)
            errs = {o: rel_err(out[o], ref[o]) for o in ref}
            assert max(errs.values()) < 1e-5, (name, s.to_json(), errs)
            rows = explain(prog.profile, DEV)
            if all(r["prune_reason"] is None for r in rows):  # (a legal point may still be pruned by occupancy)
                priced.append(max((r.get(term, 0.0) for r in rows), default=0.0) if term else 1.0)
    assert priced, f"every point of scheme {scheme} was pruned by the cost model"
    assert max(priced) > 0, f"the cost model never reports scheme {scheme}'s term {term!r}"


@pytest.mark.slow
def test_every_scheme_renders_and_compiles_for_sm_90(tmp_path) -> None:
    """The first legal point of every scheme renders and compiles for sm_90 with the NvccBuilder's flags,
    all in one nvcc call (ptxas must report every kernel); where that build fails, each scheme's program
    goes through the NvccBuilder alone, so that the failure names the scheme(s) at fault."""
    progs = []
    for scheme in SCHEME_NAMES:
        name, space, points = _first_case(scheme)
        g = load_graph(EXAMPLES / name)
        progs.append(lower(g, space.plan, points[0], DEV, space))
        assert "__global__" in render(progs[-1])
    if not nvcc_found():
        pytest.skip("nvcc not installed")
    try:
        compile_programs_sm90(progs, tmp_path, flags=BUILDER_FLAGS)
    except AssertionError as batched:
        alone = NvccBuilder(cache_dir=tmp_path / "cache").build([render(p) for p in progs], arch="sm_90")
        failed = [f"{scheme}: {res.error}" for scheme, res in zip(SCHEME_NAMES, alone) if res.status != "ok"]
        pytest.fail("\n".join(failed) or f"the batched build failed, every scheme alone built: {batched}")
