"""Generic kernels with an output stored once per row repeat (issue 41: Phi-3's decode rotary + cache
region was refused "stored once per row repeat (static rows only)"): a full output broadcast along part
of the view's rows, written only by the rows at coordinate 0 of each repeat, with the repeats' dims and
inner sizes symbolic. Each bucket emulated at its smallest, an odd and its largest extent (the emulator
checks every access against buffers of that extent) and equal to the float64 reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers.lowering import generic_program
from helpers.nvcc import compile_programs_sm90
from stitchtune.gpu.render import render
from stitchtune.graph.dynamic import parse_dynamic
from stitchtune.lower.dynamic import RowFit, fit_rows
from test_generic_col_strides import check_bucket


def _once(x_shape: list[Any], y_shape: list[Any], dims: dict[str, int]) -> Any:
    """``p = exp(x)`` (an output) broadcast against ``y`` in ``p + y`` (another output): ``p`` is full
    along the view's columns and broadcast along part of its rows."""
    return parse_dynamic({
        "name": "once", "dynamic": {d: {"min": 1, "max": m} for d, m in dims.items()},
        "inputs": {"x": {"shape": x_shape, "dtype": "float32"}, "y": {"shape": y_shape, "dtype": "float32"}},
        "nodes": [{"id": "p", "op": "exp", "args": ["x"]}, {"id": "z", "op": "add", "args": ["p", "y"]}],
        "outputs": ["z", "p"]})


@pytest.mark.parametrize("b", [1, 2, 3, 11, 16])
def test_a_repeat_along_the_dynamic_batch_is_generic(b: int) -> None:
    """``p [1, 6, 8]`` repeated along ``b`` of ``[b, 6, 8]``: the repeat's dim is the extent itself."""
    dg = _once([1, 6, 8], ["b", 6, 8], {"b": 16})
    key = dg.key_of({"b": b})
    if b > 1:
        fit = fit_rows(dg, key)
        assert isinstance(fit, RowFit) and dict(fit.sym.repeats).get("p"), fit
    check_bucket(dg, key)


@pytest.mark.parametrize("s", [1, 2, 5, 40, 64])
def test_a_static_repeat_over_dynamic_inner_rows_is_generic(s: int) -> None:
    """``p [1, 2, s, 16]`` repeated 3 times along the heads of ``[2, 3, s, 16]`` (a GQA-style grouped
    copy): the repeat's inner size ``s`` follows the extent."""
    dg = _once([2, 1, "s", 16], [2, 3, "s", 16], {"s": 64})
    check_bucket(dg, dg.key_of({"s": s}))


def _decode_rotary() -> Any:
    """Phi-3's decode rotary + cache region (``region_view_2`` of a tiny Phi-3 under
    ``torch.compile(dynamic=True)``): the rotated query ``[1, 4, 1, 16]`` is an output of a region whose
    domain is the key cache after the concat, ``[1, 4, p + 1, 16]``; the query broadcasts along the
    cache positions (a repeat of dim ``p + 1``) and is stored by the rows at position 0."""
    return parse_dynamic({
        "name": "phi3_decode_rotary", "dynamic": {"p": {"min": 1, "max": 64}},
        "inputs": {"ang": {"shape": [1, 1, 16], "dtype": "float32"}, "q": {"shape": [1, 4, 1, 16], "dtype": "float32"},
                   "k": {"shape": [1, 4, 1, 16], "dtype": "float32"},
                   "kp": {"shape": [1, 4, "p", 16], "dtype": "float32"}},
        "nodes": [{"id": "c", "op": "cos", "args": ["ang"]},
                  {"id": "qr", "op": "mul", "args": ["q", "c"]}, {"id": "kr", "op": "mul", "args": ["k", "c"]},
                  {"id": "kc", "op": "concat", "args": ["kp", "kr"], "axis": 2}],
        "outputs": ["qr", "kc"]})


@pytest.mark.parametrize("p", [1, 2, 7, 32, 33, 64])
def test_the_query_beside_the_cache_concat_is_stored_once_generically(p: int) -> None:
    dg = _decode_rotary()
    key = dg.key_of({"p": p})
    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit), fit
    if key.buckets[0].hi > 1:
        assert dict(fit.sym.repeats).get("qr"), fit.sym.repeats
    check_bucket(dg, key)


def test_the_store_once_generic_kernels_compile_with_nvcc(tmp_path: Path) -> None:
    """The three regions' generic kernels (the store guard over extent arguments) pass nvcc."""
    programs = []
    for dg, ext in ((_once([1, 6, 8], ["b", 6, 8], {"b": 16}), {"b": 11}),
                    (_once([2, 1, "s", 16], [2, 3, "s", 16], {"s": 64}), {"s": 40}), (_decode_rotary(), {"p": 40})):
        prog = generic_program(dg, dg.key_of(ext))
        assert "ext0" in render(prog)
        programs.append(prog)
    compile_programs_sm90(programs, tmp_path)  # one nvcc call; fails the test on any error
