"""An input that no node reads (a *shape carrier*: the torch backend's region input whose extent is a
size the region computes with, :mod:`stitchtune.importers.torch_symsizes`) spans no axis and is never
the domain tensor (:func:`stitchtune.plan.axes.unread_inputs`). Before, it was aligned to the domain by
broadcasting: a carrier ``[L]`` of a cache's zeros ``[1, 2, L, 16]`` met the last axis (16) and the
planner refused the region ("no tensor of the region spans all of its axes"), and a carrier as large as
the region's only output was taken as the domain tensor. Each bucket emulated at its smallest, an odd
and its largest extent."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from stitchtune.graph.dynamic import parse_dynamic
from stitchtune.graph.parse import parse_graph
from stitchtune.plan.axes import domain_candidates, tensor_axes, unread_inputs

from lower.test_generic_col_strides import check_bucket


def _graph(nodes: list[dict[str, Any]], out: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": "carried", "dynamic": {"L": {"min": 1, "max": 2048}},
            "inputs": {"c": {"shape": ["L"], "dtype": "bool"}, **(extra or {})}, "nodes": nodes, "outputs": [out]}


#: a static cache's lazy zeros ``[1, 2, L, 16]`` (``iota * 0 + 0``): L on an inner axis
_ZEROS: list[dict[str, Any]] = [{"id": "i", "op": "iota", "args": [], "shape": [1, 2, "L", 16], "axis": 0, "dtype": "int32"},
          {"id": "z", "op": "mul", "args": ["i", 0]}, {"id": "f", "op": "cast", "args": ["z"], "to": "float32"}]
#: a decode step's causal mask over a static cache of L positions: ``where(iota(L) <= past, 0, -inf)``
_MASK: list[dict[str, Any]] = [{"id": "i", "op": "iota", "args": [], "shape": [1, 1, 1, "L"], "axis": 3, "dtype": "int64"},
         {"id": "le", "op": "le", "args": ["i", "p"]}, {"id": "w", "op": "where", "args": ["le", 0.0, -1e30]}]
#: a prompt's positions ``iota(S)`` as floats
_POSITIONS: list[dict[str, Any]] = [{"id": "i", "op": "iota", "args": [], "shape": ["L"], "axis": 0, "dtype": "int64"},
              {"id": "f", "op": "cast", "args": ["i"], "to": "float32"}]


def test_an_unread_input_spans_no_axis_and_is_no_domain() -> None:
    g = parse_graph({"name": "carried", "inputs": {"c": {"shape": [48], "dtype": "bool"}},
                     "nodes": [{**_ZEROS[0], "shape": [1, 2, 48, 16]}, *_ZEROS[1:]], "outputs": ["f"]})
    assert unread_inputs(g) == frozenset({"c"})
    axes = tensor_axes(g)
    assert not hasattr(axes, "reason"), axes
    assert all(grp == () for grp in axes.of["c"])
    assert "c" not in domain_candidates(g)


def test_a_read_input_is_not_unread() -> None:
    g = parse_graph({"name": "read", "inputs": {"x": {"shape": [4, 8], "dtype": "float32"},
                                                "y": {"shape": [4, 8], "dtype": "float32"}},
                     "nodes": [{"id": "e", "op": "exp", "args": ["x"]}], "outputs": ["e", "y"]})
    assert unread_inputs(g) == frozenset()   # (``y`` is an output: named, so not unread)


@pytest.mark.parametrize("nodes,out,extra", [
    (_ZEROS, "f", None),
    (_MASK, "w", {"p": {"shape": [1], "dtype": "int64"}}),
    (_POSITIONS, "f", None)], ids=["cache_zeros", "causal_mask", "positions"])
@pytest.mark.parametrize("length", [1, 2, 5, 33, 700])
def test_a_region_with_a_carrier_gets_one_generic_kernel_per_bucket(nodes: Any, out: str, extra: Any,
                                                                    length: int) -> None:
    dg = parse_dynamic(_graph(nodes, out, extra))
    check_bucket(dg, dg.key_of({"L": length}))


def test_the_carried_generic_kernels_read_the_extent_as_an_argument_and_compile(tmp_path: Path) -> None:
    """The generic kernels of the three carried regions take the extent as an argument (the iota's
    coordinate is taken modulo it, never modulo the bucket's largest extent, 64 here), load nothing from
    the carrier, and pass nvcc for sm_90."""
    from helpers.lowering import generic_program
    from helpers.nvcc import compile_programs_sm90
    from stitchtune.gpu.render import render

    programs = []
    for nodes, out, extra in ((_ZEROS, "f", None), (_MASK, "w", {"p": {"shape": [1], "dtype": "int64"}}),
                              (_POSITIONS, "f", None)):
        dg = parse_dynamic(_graph(nodes, out, extra))
        prog = generic_program(dg, dg.key_of({"L": 40}))
        src = render(prog)
        assert "ext0" in src and not re.search(r"[%/] *64\b", src), src   # (iota's coordinate: % ext0)
        assert "c[" not in src, src   # the carrier: an argument no kernel loads
        programs.append(prog)
    compile_programs_sm90(programs, tmp_path)  # one nvcc call; fails the test on any error
