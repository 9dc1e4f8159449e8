"""Generic kernels of regions that mix layout ops with index ops (issue 41 item 4): one program per
bucket for slice / concat beside transpose / reshape (Llama's q/k rotary after the head split, as
``torch.compile(dynamic=True)`` hands it over) and for a concat along a row axis of static extent under
a dynamic batch; each emulated at the smallest, an odd and the largest extent of every dynamic dim of
its bucket (the emulator checks every access against buffers of that extent) and equal to the float64
reference. What cannot be generic is refused as data, saying why."""

from __future__ import annotations

from typing import Any

import pytest

from stitchtune.graph.dynamic import DynamicRefusal, SymInt, parse_dynamic
from stitchtune.lower.dynamic import RowFit, fit_rows
from test_generic_col_strides import check_bucket


def _rotary(max_s: int = 64, max_b: int = 4) -> Any:
    """Llama's prefill q/k rotary region (region_permute_1 of the torch backend): q and k ``[b, s, 2,
    16]`` transposed to heads ``[b, 2, s, 16]``, rotate_half (slice / neg / concat along the head dim)
    times the angles ``[1, s, 16]`` scaled by a float64 scalar, stored transposed back."""
    def rot(src: str, t: str, k: str) -> list[dict[str, Any]]:
        return [{"id": t, "op": "transpose", "args": [src], "perm": [0, 2, 1, 3]},
                {"id": f"xc{k}", "op": "mul", "args": [t, "cs"]},
                {"id": f"lo{k}", "op": "slice", "args": [t], "axis": 3, "start": 0, "stop": 8},
                {"id": f"hi{k}", "op": "slice", "args": [t], "axis": 3, "start": 8, "stop": 16},
                {"id": f"n{k}", "op": "neg", "args": [f"hi{k}"]},
                {"id": f"r{k}", "op": "concat", "args": [f"n{k}", f"lo{k}"], "axis": 3},
                {"id": f"rs{k}", "op": "mul", "args": [f"r{k}", "sn"]},
                {"id": f"y{k}", "op": "add", "args": [f"xc{k}", f"rs{k}"]},
                {"id": f"o{k}", "op": "transpose", "args": [f"y{k}"], "perm": [0, 2, 1, 3]}]

    return parse_dynamic({
        "name": "llama_rotary", "dynamic": {"s": {"min": 1, "max": max_s}, "b": {"min": 1, "max": max_b}},
        "inputs": {"ang": {"shape": [1, "s", 16], "dtype": "float32"}, "scale": {"shape": [1], "dtype": "float64"},
                   "q": {"shape": ["b", "s", 2, 16], "dtype": "float32"},
                   "k": {"shape": ["b", "s", 2, 16], "dtype": "float32"}},
        "nodes": [{"id": "sc", "op": "cast", "args": ["scale"], "to": "float32"},
                  {"id": "c0", "op": "cos", "args": ["ang"]}, {"id": "cs", "op": "mul", "args": ["c0", "sc"]},
                  {"id": "s0", "op": "sin", "args": ["ang"]}, {"id": "sn", "op": "mul", "args": ["s0", "sc"]},
                  *rot("q", "tq", "q"), *rot("k", "tk", "k")],
        "outputs": ["oq", "ok"]})


def _heads(max_b: int = 16) -> Any:
    """Two head groups ``[b, 2, 64]`` concatenated along the heads (a row axis of static extent; the
    dynamic batch outside it), the first head's half negated through a slice, then exp."""
    return parse_dynamic({
        "name": "heads", "dynamic": {"b": {"min": 1, "max": max_b}},
        "inputs": {"x": {"shape": ["b", 2, 64], "dtype": "float32"}, "y": {"shape": ["b", 3, 64], "dtype": "float32"}},
        "nodes": [{"id": "ys", "op": "slice", "args": ["y"], "axis": 1, "start": 1, "stop": 3},
                  {"id": "c", "op": "concat", "args": ["x", "ys"], "axis": 1},
                  {"id": "e", "op": "exp", "args": ["c"]}],
        "outputs": ["e"]})


@pytest.mark.parametrize("s,b", [(64, 4), (40, 1), (6, 3), (1, 2), (2, 4)])
def test_the_rotary_after_the_head_split_is_one_generic_kernel_per_bucket(s: int, b: int) -> None:
    dg = _rotary()
    key = dg.key_of({"s": s, "b": b})
    prog = check_bucket(dg, key)
    assert prog.dynamic is not None and set(prog.dynamic.dims) == {"b", "s"}


def test_the_rotary_rows_follow_both_extents() -> None:
    dg = _rotary()
    fit = fit_rows(dg, dg.key_of({"s": 50, "b": 3}))
    assert isinstance(fit, RowFit) and str(fit.sym.M) == "2*b*s" and fit.sym.N.static


@pytest.mark.parametrize("b", [1, 2, 3, 11, 16])
def test_a_concat_along_a_static_row_axis_under_a_dynamic_batch_is_generic(b: int) -> None:
    dg = _heads()
    check_bucket(dg, dg.key_of({"b": b}))


def _cache(rotary: bool = False) -> Any:
    """A decode step's key cache: the past ``[1, 2, p, 16]`` and the new position, a chain of views of
    the projection's row ``[1, 32]`` -> ``[1, 2, 1, 16]`` (rotated by angles ``[1, 1, 16]`` when
    ``rotary``: rotate_half along the head dim), concatenated along the dynamic axis: ``p + 1``."""
    nodes: list[dict[str, Any]] = [{"id": "v0", "op": "reshape", "args": ["new"], "shape": [1, 1, 2, 16]},
                                   {"id": "v", "op": "reshape", "args": ["v0"], "shape": [1, 2, 1, 16]}]
    inputs: dict[str, Any] = {"past": {"shape": [1, 2, "p", 16], "dtype": "float32"},
                              "new": {"shape": [1, 32], "dtype": "float32"}}
    last = "v"
    if rotary:
        inputs["ang"] = {"shape": [1, 1, 16], "dtype": "float32"}
        nodes += [{"id": "c0", "op": "cos", "args": ["ang"]}, {"id": "s0", "op": "sin", "args": ["ang"]},
                  {"id": "xc", "op": "mul", "args": ["v", "c0"]},
                  {"id": "lo", "op": "slice", "args": ["v"], "axis": 3, "start": 0, "stop": 8},
                  {"id": "hi", "op": "slice", "args": ["v"], "axis": 3, "start": 8, "stop": 16},
                  {"id": "n", "op": "neg", "args": ["hi"]},
                  {"id": "r", "op": "concat", "args": ["n", "lo"], "axis": 3},
                  {"id": "rs", "op": "mul", "args": ["r", "s0"]}, {"id": "k", "op": "add", "args": ["xc", "rs"]}]
        last = "k"
    nodes.append({"id": "c", "op": "concat", "args": ["past", last], "axis": 2})
    return parse_dynamic({"name": "cache", "dynamic": {"p": {"min": 1, "max": 64}}, "inputs": inputs,
                          "nodes": nodes, "outputs": ["c"]})


@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("p", [1, 2, 3, 7, 20, 64])
def test_a_cache_concat_along_the_dynamic_axis_is_one_generic_kernel_per_bucket(p: int, rotary: bool) -> None:
    """The pieces' conditions are the fitted extent ``p + 1`` minus constants; the rows ``2 * (p + 1)``."""
    dg = _cache(rotary)
    key = dg.key_of({"p": p})
    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit)
    if p > 2:
        assert str(fit.sym.M) == "2*p + 2" and str(fit.sym.domain[2]) == "p + 1"
    check_bucket(dg, key)


def _concat_refusal(nodes: list[dict[str, Any]], inputs: dict[str, Any]) -> DynamicRefusal:
    dg = parse_dynamic({"name": "r", "dynamic": {"s": {"min": 2, "max": 64}}, "inputs": inputs, "nodes": nodes,
                        "outputs": [nodes[-1]["id"]]})
    r = fit_rows(dg, dg.key_of({"s": 30}))
    assert isinstance(r, DynamicRefusal), r
    return r


def test_what_a_dynamic_axis_cannot_serve_is_refused_saying_why() -> None:
    """A slice whose start counts from the end of the sequence beside a concat of it along that axis
    (``cat(x[:, -2:], x[:, :1])``: the slice does not span the concat's domain axis), a concat of a concat along
    the dynamic axis (the inner one does not span it): refused as data, naming the node. (Two dynamic
    pieces, a plain slice of the sequence and one counted from its end alone are served:
    tests/lower/test_generic_dynamic_slices.py.)"""
    x = {"x": {"shape": [2, "s", 16], "dtype": "float32"}}
    r = _concat_refusal([{"id": "h", "op": "slice", "args": ["x"], "axis": 1, "start": -2, "stop": None},
                         {"id": "f", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": 1},
                         {"id": "c", "op": "concat", "args": ["h", "f"], "axis": 1},
                         {"id": "e", "op": "exp", "args": ["c"]}], x)
    assert r.part == "index op h" and "start counts from the end" in r.reason and "does not span" in r.reason, r
    one = {"shape": [2, 1, 16], "dtype": "float32"}
    r = _concat_refusal([{"id": "c", "op": "concat", "args": ["x", "a"], "axis": 1},
                         {"id": "d", "op": "concat", "args": ["c", "b"], "axis": 1}], {"x": x["x"], "a": one, "b": one})
    # the inner concat (s + 1 of the domain's s + 2) does not span the axis: its conditions would not follow
    assert r.part == "index op c" and "does not span the axis" in r.reason, r


@pytest.mark.parametrize("b", [1, 2, 7, 30, 64])
def test_a_slice_beside_a_chain_whose_shapes_follow_the_extents_is_generic(b: int) -> None:
    """x ``[b, 8, 16]`` transposed to ``[b, 16, 8]`` and sliced along the head dim: a layout chain of an
    input whose shapes follow the extents (refused before: positions were carried back through the
    representative's shapes); its transpose carried back through the fitted dims. (With the sequence
    ``[2, 8, s]`` instead, the plan's adjacent rows follow ``s % 8``: its structure changes in a bucket.)"""
    dg = parse_dynamic({
        "name": "tr", "dynamic": {"b": {"min": 1, "max": 64}},
        "inputs": {"x": {"shape": ["b", 8, 16], "dtype": "float32"}},
        "nodes": [{"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 2, 1]},
                  {"id": "h", "op": "slice", "args": ["t"], "axis": 2, "start": 0, "stop": 4},
                  {"id": "y", "op": "exp", "args": ["h"]}],
        "outputs": ["y"]})
    key = dg.key_of({"b": b})
    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit), fit
    if b > 2:
        assert dict(fit.sym.shapes)["x"] == (SymInt(1, ("b",)), SymInt(8), SymInt(16))
    check_bucket(dg, key)
