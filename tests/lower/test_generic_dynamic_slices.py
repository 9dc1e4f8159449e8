"""Slices and concats along a dynamic axis as generic kernels (issue 41): a plain slice of the sequence
(``x[:, 1:]``, ``x[:, :-1]``: a constant shift, the extent ``s - 1``), a decode step's cache concat with
the batch and the past both dynamic (rows ``2*b*p + 2*b``: a polynomial of degree 1 in each extent), a
chunked prefill (``cat(past [B, H, P, D], new [B, H, C, D])`` with C static > 1 or dynamic: the later
piece's offset and conditions follow the fitted piece extents). Each bucket's one program is emulated
at every combination of its dims' smallest, an odd and its largest extent (the emulator faults on any
out-of-bounds, unwritten or racy access) and equal to the float64 reference; what stays refused says
why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers.lowering import generic_program
from helpers.nvcc import compile_programs_sm90
from stitchtune.gpu.render import render
from stitchtune.graph.dynamic import DynamicRefusal, SymInt, parse_dynamic
from stitchtune.lower.dynamic import RowFit, fit_rows
from stitchtune.lower.poly_fit import fit_monomial, fit_multilinear
from test_generic_col_strides import check_bucket


def _slices(b_max: int = 4) -> Any:
    """``exp(x[:, 1:] - x[:, :-1])`` of ``x [b, s, 16]``: the same domain ``[b, s - 1, 16]``, one read
    shifted by a position."""
    return parse_dynamic({
        "name": "diff", "dynamic": {"b": {"min": 1, "max": b_max}, "s": {"min": 2, "max": 64}},
        "inputs": {"x": {"shape": ["b", "s", 16], "dtype": "float32"}},
        "nodes": [{"id": "hi", "op": "slice", "args": ["x"], "axis": 1, "start": 1, "stop": None},
                  {"id": "lo", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": -1},
                  {"id": "d", "op": "sub", "args": ["hi", "lo"]}, {"id": "e", "op": "exp", "args": ["d"]}],
        "outputs": ["e"]})


@pytest.mark.parametrize("s,b", [(64, 4), (40, 1), (9, 3), (2, 2), (3, 4)])
def test_a_plain_slice_of_the_sequence_is_one_generic_kernel_per_bucket(s: int, b: int) -> None:
    dg = _slices()
    key = dg.key_of({"s": s, "b": b})
    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit), fit
    if s > 4 and b > 2:
        assert str(fit.sym.M) == "b*s + -1*b" and str(fit.sym.domain[1]) == "s + -1"
    check_bucket(dg, key)


def _last(start: int, stop: int | None) -> Any:
    """``exp(x[:, start:stop]) + y`` of ``x [b, s, 16]`` with a start counted from the end (the last
    positions of the sequence, e.g. the logits of the last token), ``y [b, 1, 16]`` broadcast."""
    return parse_dynamic({
        "name": "last", "dynamic": {"b": {"min": 1, "max": 4}, "s": {"min": 4, "max": 64}},
        "inputs": {"x": {"shape": ["b", "s", 16], "dtype": "float32"}, "y": {"shape": ["b", 1, 16], "dtype": "float32"}},
        "nodes": [{"id": "h", "op": "slice", "args": ["x"], "axis": 1, "start": start, "stop": stop},
                  {"id": "e", "op": "exp", "args": ["h"]}, {"id": "z", "op": "add", "args": ["e", "y"]}],
        "outputs": ["z"]})


@pytest.mark.parametrize("start,stop", [(-1, None), (-3, None), (-3, -1)])
@pytest.mark.parametrize("s,b", [(64, 4), (9, 3), (5, 1)])
def test_a_slice_counted_from_the_end_of_the_sequence_is_generic(start: int, stop: int | None, s: int, b: int) -> None:
    """The shift is the fitted start ``s - 3`` (a static domain axis of 3 or 2 positions)."""
    dg = _last(start, stop)
    key = dg.key_of({"s": s, "b": b})
    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit), fit
    if s > 8:
        assert dict(fit.sym.starts)["h"] == SymInt.poly([(1, ("s",)), (start, ())])
    check_bucket(dg, key)


def test_a_slice_from_the_end_beside_another_along_its_axis_is_refused() -> None:
    """``x[:, -3:] + x[:, :3]``: the two shifts along one axis, one symbolic (refused, saying why)."""
    dg = parse_dynamic({
        "name": "two", "dynamic": {"s": {"min": 4, "max": 64}},
        "inputs": {"x": {"shape": [2, "s", 16], "dtype": "float32"}},
        "nodes": [{"id": "h", "op": "slice", "args": ["x"], "axis": 1, "start": -3, "stop": None},
                  {"id": "f", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": 3},
                  {"id": "z", "op": "add", "args": ["h", "f"]}], "outputs": ["z"]})
    r = fit_rows(dg, dg.key_of({"s": 40}))
    assert isinstance(r, DynamicRefusal) and r.part == "index op h" and "combine" in r.reason, r


def _cache(C: int | str = 1, B: int | str = "b", chain: bool = False) -> Any:
    """``cat(past [B, 2, p, 16], k [B, 2, C, 16], 2)``; ``k`` is ``exp`` of an input of that shape, or
    (``chain``) the new keys split into heads from the projection's rows ``[B, C, 32]`` (a reshape and
    the head transpose: a layout chain), doubled."""
    dyn = {"p": {"min": 1, "max": 64}}
    for n, hi in ((B, 4), (C, 8)):
        if isinstance(n, str):
            dyn[n] = {"min": 1 if n == "b" else 2, "max": hi}
    ins: dict[str, Any] = {"past": {"shape": [B, 2, "p", 16], "dtype": "float32"}}
    if chain:
        ins["xk"] = {"shape": [B, C, 32], "dtype": "float32"}
        nodes: list[dict[str, Any]] = [{"id": "v", "op": "reshape", "args": ["xk"], "shape": [B, C, 2, 16]},
                                       {"id": "t", "op": "transpose", "args": ["v"], "perm": [0, 2, 1, 3]},
                                       {"id": "k", "op": "mul", "args": ["t", 2.0]}]
    else:
        ins["new"] = {"shape": [B, 2, C, 16], "dtype": "float32"}
        nodes = [{"id": "k", "op": "exp", "args": ["new"]}]
    nodes.append({"id": "c", "op": "concat", "args": ["past", "k"], "axis": 2})
    return parse_dynamic({"name": "cache", "dynamic": dyn, "inputs": ins, "nodes": nodes, "outputs": ["c"]})


@pytest.mark.parametrize("p,b", [(64, 4), (7, 3), (33, 1), (1, 2), (20, 2)])
def test_a_decode_cache_concat_under_a_dynamic_batch_is_generic(p: int, b: int) -> None:
    """One new position, batch and past both dynamic: rows ``2*b*(p + 1)``."""
    dg = _cache(1, "b", chain=True)
    key = dg.key_of({"p": p, "b": b})
    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit), fit
    if p > 2 and b > 2:
        assert str(fit.sym.M) == "2*b*p + 2*b" and str(fit.sym.domain[2]) == "p + 1"
    check_bucket(dg, key)


@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("p", [64, 7, 1, 20])
def test_a_chunk_of_three_positions_after_the_past_is_generic(p: int, chain: bool) -> None:
    """The later piece spans ``[p, p + 3)``: its offset ``p`` and conditions from the fitted extents."""
    dg = _cache(3, 1, chain)
    key = dg.key_of({"p": p})
    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit), fit
    if p > 2:
        assert dict(fit.sym.pieces)["c"] == (SymInt(1, ("p",)), SymInt(3))
    check_bucket(dg, key)


@pytest.mark.parametrize("p,c,b", [(64, 8, 4), (7, 3, 1), (33, 5, 2), (1, 2, 3)])
def test_a_chunked_prefill_of_a_dynamic_chunk_is_generic(p: int, c: int, b: int) -> None:
    """Chunk, past and batch all dynamic: the domain's axis ``c + p``, the new piece at offset ``p``."""
    dg = _cache("c", "b")
    key = dg.key_of({"p": p, "c": c, "b": b})
    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit), fit
    if p > 2 and c > 2:
        assert str(fit.sym.domain[2]) == "c + p"
    check_bucket(dg, key)


@pytest.mark.parametrize("s", [2, 9, 40])
def test_two_dynamic_pieces_are_generic(s: int) -> None:
    """``cat(x [2, s, 16], y [2, s, 16], 1)``: the second piece at offset ``s``."""
    dg = parse_dynamic({"name": "two", "dynamic": {"s": {"min": 2, "max": 64}},
                        "inputs": {"x": {"shape": [2, "s", 16], "dtype": "float32"},
                                   "y": {"shape": [2, "s", 16], "dtype": "float32"}},
                        "nodes": [{"id": "c", "op": "concat", "args": ["x", "y"], "axis": 1}], "outputs": ["c"]})
    check_bucket(dg, dg.key_of({"s": s}))


@pytest.mark.parametrize("p,c", [(64, 8), (7, 3), (40, 2)])
def test_a_dynamic_chunk_through_a_chain_of_its_shapes_is_generic(p: int, c: int) -> None:
    """The new keys' chain ``[1, c, 32] -> [1, c, 2, 16] -> [1, 2, c, 16]`` (``torch.compile`` hands a
    chunk's keys over so): positions carried back through the chain's fitted dims."""
    dg = _cache("c", 1, chain=True)
    key = dg.key_of({"p": p, "c": c})
    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit), fit
    if c > 2:
        assert dict(fit.sym.shapes)["xk"] == (SymInt(1), SymInt(1, ("c",)), SymInt(32))
    check_bucket(dg, key)


def _two_orders() -> Any:
    """``cat(past [1, 2, p, 16], new [.., c, ..]) + cat(x [.., c, ..], y [.., p, ..])``: two concats spanning
    ``p + c`` with their pieces in the other order."""
    shape = {n: {"shape": [1, 2, d, 16], "dtype": "float32"} for n, d in (("past", "p"), ("new", "c"), ("x", "c"),
                                                                        ("y", "p"))}
    return parse_dynamic({"name": "two", "dynamic": {"p": {"min": 1, "max": 64}, "c": {"min": 2, "max": 8}},
                          "inputs": shape,
                          "nodes": [{"id": "c1", "op": "concat", "args": ["past", "new"], "axis": 2},
                                    {"id": "c2", "op": "concat", "args": ["x", "y"], "axis": 2},
                                    {"id": "s", "op": "add", "args": ["c1", "c2"]}], "outputs": ["s"]})


def test_two_concats_whose_pieces_meet_only_at_the_largest_extents_are_refused() -> None:
    """Where the buckets' largest ``p`` and ``c`` are equal (8), both concats' later pieces start at 8 in the
    representative but at ``p`` and ``c`` elsewhere: refused as data; elsewhere one generic kernel."""
    dg = _two_orders()
    r = fit_rows(dg, dg.key_of({"p": 7, "c": 6}))
    assert isinstance(r, DynamicRefusal) and r.part == "index op c2" and "same bounds" in r.reason, r
    check_bucket(dg, dg.key_of({"p": 40, "c": 6}))


def test_a_slice_that_does_not_span_the_dynamic_axis_is_refused() -> None:
    """``x[:, 1:]`` beside ``x`` itself as an output: the domain is x's ``[2, s, 16]`` and the slice's
    result ``s - 1`` does not span it (the planner stores whole tensors only: refused there already)."""
    dg = parse_dynamic({"name": "ns", "dynamic": {"s": {"min": 2, "max": 64}},
                        "inputs": {"x": {"shape": [2, "s", 16], "dtype": "float32"}},
                        "nodes": [{"id": "h", "op": "slice", "args": ["x"], "axis": 1, "start": 1, "stop": None},
                                  {"id": "e", "op": "exp", "args": ["h"]}, {"id": "n", "op": "neg", "args": ["x"]}],
                        "outputs": ["e", "n"]})
    assert isinstance(fit_rows(dg, dg.key_of({"s": 40})), DynamicRefusal)


def test_the_polynomial_fits() -> None:
    """A monomial with a power (attention scores ``b*s*s``), and degree 1 in each of two extents."""
    assert fit_monomial(4 * 64 * 64, {"b": (4, 2, 2 * 64 * 64), "s": (64, 32, 4 * 32 * 32)}) == SymInt(1, ("b", "s", "s"))
    assert fit_monomial(4 * 63, {"b": (4, 2, 2 * 63), "s": (64, 32, 4 * 31)}) is None
    a, b = {"b": 4, "s": 64}, {"b": 2, "s": 32}

    def value(moved: frozenset[str]) -> int:
        e = {d: (b if d in moved else a)[d] for d in a}
        return 2 * e["b"] * (e["s"] - 1)

    assert fit_multilinear(["b", "s"], a, b, value) == SymInt.poly([(2, ("b", "s")), (-2, ("b",))])
    assert fit_multilinear(["s"], {"s": 4}, {"s": 6}, lambda m: 7 if m else 4) is None   # slope 3/2


def test_the_generic_kernels_compile_with_nvcc(tmp_path: Path) -> None:
    """A plain slice, a cache concat under a dynamic batch, and a dynamic chunk through its chain: the
    generic kernels (offsets and conditions over extent arguments) pass nvcc for sm_90."""
    programs = []
    for dg, ext in ((_slices(), {"s": 40, "b": 3}), (_cache(1, "b", chain=True), {"p": 40, "b": 3}),
                    (_cache("c", 1, chain=True), {"p": 40, "c": 5})):
        prog = generic_program(dg, dg.key_of(ext))
        assert "ext0" in render(prog)
        programs.append(prog)
    compile_programs_sm90(programs, tmp_path)  # one nvcc call; fails the test on any error
