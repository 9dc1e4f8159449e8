"""Generic kernels with an ``iota`` of a symbolic shape (issue 41: a prompt's positions ``iota(S)`` and a
static cache's ``iota`` of its length now run in regions, :mod:`stitchtune.importers.torch_symsizes`).
The lowering took the iota's coordinate ``(offset // inner) % dim`` from the bucket's representative
(its largest extent): wrong at every smaller extent where the symbolic dim is not the last one
(``[3, L]`` along axis 0 read row 1 as row 0). Now ``dim`` and ``inner`` are fitted over the extents
(:attr:`stitchtune.lower.symbols.RowSymbols.iotas`). Each bucket emulated equal to the reference at its
smallest, an odd and its largest extent."""

from __future__ import annotations

from typing import Any

import pytest

from stitchtune.graph.dynamic import parse_dynamic
from stitchtune.lower.dynamic import RowFit, fit_rows
from test_generic_col_strides import check_bucket


def _iota(shape: list[Any], axis: int) -> Any:
    return parse_dynamic({
        "name": "iota_sym", "dynamic": {"L": {"min": 1, "max": 2048}},
        "inputs": {"x": {"shape": shape, "dtype": "float32"}},
        "nodes": [{"id": "i", "op": "iota", "args": [], "shape": shape, "axis": axis, "dtype": "int64"},
                  {"id": "f", "op": "cast", "args": ["i"], "to": "float32"},
                  {"id": "y", "op": "add", "args": ["x", "f"]}],
        "outputs": ["y"]})


@pytest.mark.parametrize("shape,axis", [([3, "L"], 0), ([1, 2, "L", 16], 2), (["L", 16], 0), ([2, "L", 4], 1),
                                        ([2, "L", 4], 0), (["L"], 0)])
@pytest.mark.parametrize("length", [2, 5, 40])
def test_an_iota_of_a_symbolic_shape_is_generic(shape: list[Any], axis: int, length: int) -> None:
    dg = _iota(shape, axis)
    key = dg.key_of({"L": length})
    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit), fit
    check_bucket(dg, key)


def test_an_iota_of_a_static_shape_keeps_the_static_expression() -> None:
    """An iota whose shape does not follow the extents has no fitted fields in use (its code is the
    static kernel's, unchanged)."""
    dg = parse_dynamic({
        "name": "iota_static", "dynamic": {"L": {"min": 1, "max": 64}},
        "inputs": {"x": {"shape": ["L", 8], "dtype": "float32"}},
        "nodes": [{"id": "i", "op": "iota", "args": [], "shape": [1, 8], "axis": 1, "dtype": "int64"},
                  {"id": "f", "op": "cast", "args": ["i"], "to": "float32"},
                  {"id": "y", "op": "add", "args": ["x", "f"]}],
        "outputs": ["y"]})
    key = dg.key_of({"L": 40})
    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit), fit
    assert fit.sym.iota_at("i", fit.sym.expr(fit.sym.M)) is None
    check_bucket(dg, key)
