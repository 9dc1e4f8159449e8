"""Block-private copies of small scatter tables (:mod:`stitchtune.lower.scatter_private`): a kernel that
adds every row of its values into a table of few rows (BERT's token-type embedding) adds them into a
shared copy first and each block adds its copy into the table once, skipping groups of zeros.

Emulated against the float64 reference (every index the same row, random rows, rows out of range) for
the heuristic and sampled schedules; the emulator checks every shared and global address and races
between the shared copy's zeroing, its adds and its flush; the large table of the same region keeps
its direct adds; the copy's shared adds are bank-conflict free in the IR walk; the kernels build."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stitchtune.graph.node_lists import layernorm_backward_rows
from helpers.lowering import DEV, rel_err
from helpers.nvcc import compile_programs_sm90
from stitchtune.analysis.sectors import program_sectors
from stitchtune.cost.features import program_features
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.ir import kir
from stitchtune.lower.entry import lower
from stitchtune.lower import scatter_private
from stitchtune.lower.scatter_private import PRIVATE_TABLE_BYTES
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

ALL = lambda k: 1 << 30  # noqa: E731  (every grid co-resident)


def embedding_backward(tokens: int = 512, width: int = 64, vocab: int = 300, types: int = 2) -> Any:
    """A layer norm's backward scattered into a word table (``ids``, ``vocab`` rows) and a token-type
    table (``tt``, ``types`` rows), as BERT's embedding backward has it."""
    return parse_graph({
        "name": "emb_bwd",
        "inputs": {"dy": {"shape": [tokens, width], "dtype": "float32"},
                   "xn": {"shape": [tokens, width], "dtype": "float32"},
                   "gamma": {"shape": [width], "dtype": "float32"},
                   "rstd": {"shape": [tokens, 1], "dtype": "float32"},
                   "ids": {"shape": [tokens], "dtype": "int64"}, "tt": {"shape": [tokens], "dtype": "int64"}},
        "nodes": layernorm_backward_rows() + [
            {"id": "dw", "op": "scatter_add", "args": ["dx", "ids"], "shape": [vocab, width]},
            {"id": "dt", "op": "scatter_add", "args": ["dx", "tt"], "shape": [types, width]}],
        "outputs": ["dw", "dt"]})


def _programs(g: Any, n: int) -> list[kir.Program]:
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    scheds = [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(n)]
    return [lower(g, plan, s, DEV, space) for s in scheds]


def _adders(prog: kir.Program, table: str) -> list[kir.Kernel]:
    return [k for k in prog.kernels if any(isinstance(s, kir.AtomicAdd) and s.buf == table for s in kir.walk(k.body))]


def _private(k: kir.Kernel) -> bool:
    return any(s.name.startswith("spt") for s in k.shared)


def _check(g: Any, x: dict[str, np.ndarray], progs: list[kir.Program]) -> None:
    ref = run_reference(g, x)
    for prog in progs:
        out = emulate_program(prog, x, coresident_limit=ALL, cluster_limit=ALL)
        for o in g.outputs:
            assert rel_err(out[o], ref[o]) < 1e-5, o


def test_the_heuristic_kernel_adds_the_small_table_through_a_shared_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The token-type table (2 rows) gets a shared copy; the word table (300 rows) keeps its direct adds;
    the global adds into the small table are the flush's only (one float4 per 4 elements and block)."""
    g = embedding_backward()
    [prog] = _programs(g, 0)
    [k] = _adders(prog, "sct1")
    assert _private(k)
    [copy] = [s for s in k.shared if s.name.startswith("spt")]
    assert copy.size == 2 * 64 and k.smem_bytes >= 4 * copy.size
    launch = next(la for la in prog.launches if la.kernel == k.name)
    assert launch.smem_bytes == k.smem_bytes
    direct = [s for s in kir.walk(k.body) if isinstance(s, kir.AtomicAdd) and s.buf == "sct1"]
    assert len(direct) == 1 and direct[0].width == 4   # the flush
    assert all(s.width == 1 for s in kir.walk(k.body) if isinstance(s, kir.AtomicAdd) and s.buf == copy.name)
    word = [s for s in kir.walk(k.body) if isinstance(s, kir.AtomicAdd) and s.buf == "sct0"]
    assert word and all(s.width == 4 for s in word)   # no copy of the large table
    # the IR walk counts the copy's adds as shared-memory accesses, conflict free, not as global atomics
    [feat] = [f for f in program_features(prog, DEV) if f.name == k.name]
    assert feat.bank_conflict == pytest.approx(1.0)
    # and in the emulated trace, as the renderer stores (a shared vector element by element): every
    # access of the copy (zeroing, adds, flush) one wavefront per request
    [res] = [r for r in program_sectors(prog, random_inputs(g, 2)) if r.kernel == k.name]
    ratios = {(a.op, a.width): a.wavefronts / a.requests for a in res.shared if a.buf == copy.name}
    assert {op for op, _ in ratios} == {"store", "atomic", "load"} and set(ratios.values()) == {1.0}, ratios
    monkeypatch.setattr(scatter_private, "PRIVATE_TABLE_BYTES", 0)   # every table added to directly
    [direct_prog] = _programs(g, 0)
    assert not any(_private(k) for k in direct_prog.kernels)
    [before] = [f for f in program_features(direct_prog, DEV) if f.name == k.name]
    assert feat.atomics < 0.6 * before.atomics   # the token-type half of the adds gone but for the flush


@pytest.mark.parametrize("case", ["all_type_0", "random", "out_of_range"])
def test_private_copies_match_the_reference(case: str) -> None:
    g = embedding_backward()
    x = random_inputs(g, 11)
    rng = np.random.default_rng(3)
    x["ids"] = rng.integers(0, 300, 512).astype(np.int64)
    x["tt"] = np.zeros(512, np.int64) if case == "all_type_0" else rng.integers(0, 2, 512).astype(np.int64)
    if case == "out_of_range":
        x["tt"][:6] = [-1, 2, 2**40, -2**40, 5, -3]
    progs = _programs(g, 5)
    assert any(_private(k) for p in progs for k in _adders(p, "sct1"))
    _check(g, x, progs)


def test_no_copy_where_it_does_not_pay_or_fit() -> None:
    """A table with more rows than half of a block's value rows, or over PRIVATE_TABLE_BYTES, is added to directly."""
    g = embedding_backward(tokens=64, types=40)   # 40 rows x 64: too many rows for 64 tokens
    for prog in _programs(g, 3):
        assert not any(_private(k) for k in _adders(prog, "sct1"))
    wide = PRIVATE_TABLE_BYTES // 4 // 2 + 64   # two rows over the limit
    g2 = embedding_backward(tokens=256, width=wide, types=2, vocab=3)
    [prog] = _programs(g2, 0)
    assert not any(_private(k) for k in _adders(prog, "sct1"))


def test_private_copy_kernels_build_for_sm90(tmp_path: Path) -> None:
    g = embedding_backward()
    progs = _programs(g, 2)
    assert any(_private(k) for p in progs for k in p.kernels)
    compile_programs_sm90(progs, tmp_path)


def test_adds_of_zeros_are_skipped_so_padding_rows_cost_no_atomics() -> None:
    """An embedding's padding mask (``where(ids != pad, v, 0)``) zeroes the rows of padding tokens, which
    all name the padding row: those adds are skipped (exact), so the emulated trace records no atomic
    lane into the word table for a batch of padding only, and the table still equals the reference."""
    g = parse_graph({
        "name": "emb_pad",
        "inputs": {"v": {"shape": [256, 64], "dtype": "float32"}, "ids": {"shape": [256], "dtype": "int64"}},
        "nodes": [{"id": "ok", "op": "ne", "args": ["ids", 0.0]},
                  {"id": "ok1", "op": "reshape", "args": ["ok"], "shape": [256, 1]},
                  {"id": "m", "op": "where", "args": ["ok1", "v", 0.0]},
                  {"id": "dw", "op": "scatter_add", "args": ["m", "ids"], "shape": [1000, 64]}],
        "outputs": ["dw"]})
    progs = _programs(g, 3)
    for ids, lanes in ((np.zeros(256, np.int64), 0), (np.arange(256, dtype=np.int64) + 1, 256 * 64)):
        x = {"v": random_inputs(g, 4)["v"], "ids": ids}
        _check(g, x, progs)
        for prog in progs:
            added = sum(a.lanes * a.width for r in program_sectors(prog, x, max_blocks=1 << 20) for a in r.accesses
                        if a.op == "atomic" and a.buf == "sct0")
            assert added == lanes, (ids[:3], added)
