"""Llama's grouped-query rotary, q (``nh`` heads) and k (``nkv`` heads) with the grouped copy of k
that ``repeat_kv`` makes, as one region: the two parts meet only in the angles (``cos`` / ``sin``
of positions x ``inv_freq``, computed in the region), so their domains differ in the head axis
(``plan.chains.part_domains``) and one kernel iterates both (``plan.axes`` unifies the independent
head axes of q and of k's grouped copy, tensors of one size). The kernel emulates like the float64
reference for the heuristic and sampled schedules; without the grouped copy (k's tensors smaller
than q's, as the backward's rotary gradients are) the region is still refused in one line; a region
of one domain gets the plan it always had."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.lowering import check_emulates, float_graph as _graph
from helpers.nvcc import check_compiles_sm90
from stitchtune.errors import UnsupportedGraphError
from stitchtune.gpu.build import nvcc_found
from stitchtune.plan.chains import part_domains
from stitchtune.plan.family import Family
from stitchtune.plan.planner import make_plan


def _rotary(x: str, src: str, heads: int, S: int, D: int) -> list[dict[str, Any]]:
    """rotate_half rotary of ``src [1, S, heads*D]``: head split, permute, ``x * cos + rot(x) * sin``."""
    h = D // 2
    return [{"id": f"{x}v", "op": "reshape", "args": [src], "shape": [1, S, heads, D]},
            {"id": f"{x}t", "op": "transpose", "args": [f"{x}v"], "perm": [0, 2, 1, 3]},
            {"id": f"{x}c", "op": "mul", "args": [f"{x}t", "cos4"]},
            {"id": f"{x}1", "op": "slice", "args": [f"{x}t"], "axis": 3, "start": 0, "stop": h},
            {"id": f"{x}2", "op": "slice", "args": [f"{x}t"], "axis": 3, "start": h, "stop": D},
            {"id": f"{x}n", "op": "neg", "args": [f"{x}2"]},
            {"id": f"{x}r", "op": "concat", "args": [f"{x}n", f"{x}1"], "axis": 3},
            {"id": f"{x}s", "op": "mul", "args": [f"{x}r", "sin4"]},
            {"id": f"{x}o", "op": "add", "args": [f"{x}c", f"{x}s"]}]


def _gqa(nh: int = 4, nkv: int = 2, S: int = 8, D: int = 8, grouped: bool = True):
    """q's and k's rotary sharing the angles; k's output is its grouped copy ``[1, nkv, nh/nkv, S, D]``
    (``grouped``) or k itself ``[1, nkv, S, D]``."""
    nodes = [{"id": "pos", "op": "iota", "shape": [S], "dtype": "int64", "axis": 0},
             {"id": "pf", "op": "cast", "args": ["pos"], "to": "float32"},
             {"id": "pc", "op": "reshape", "args": ["pf"], "shape": [1, S, 1]},
             {"id": "fr", "op": "mul", "args": ["pc", "inv"]},
             {"id": "fu", "op": "reshape", "args": ["fr"], "shape": [1, S, 1, D // 2]},
             {"id": "fe", "op": "expand", "args": ["fu"], "shape": [1, S, 2, D // 2]},
             {"id": "ang", "op": "reshape", "args": ["fe"], "shape": [1, S, D]},
             {"id": "cos", "op": "cos", "args": ["ang"]},
             {"id": "sin", "op": "sin", "args": ["ang"]},
             {"id": "cos4", "op": "reshape", "args": ["cos"], "shape": [1, 1, S, D]},
             {"id": "sin4", "op": "reshape", "args": ["sin"], "shape": [1, 1, S, D]}]
    nodes += _rotary("q", "xq", nh, S, D) + _rotary("k", "xk", nkv, S, D)
    outs = ["qo", "ko"]
    if grouped:
        nodes += [{"id": "ku", "op": "reshape", "args": ["ko"], "shape": [1, nkv, 1, S, D]},
                  {"id": "kg", "op": "expand", "args": ["ku"], "shape": [1, nkv, nh // nkv, S, D]}]
        outs = ["qo", "kg"]
    return _graph({"inv": [D // 2], "xq": [1, S, nh * D], "xk": [1, S, nkv * D]}, nodes, outs)


def test_q_and_k_rotary_with_the_grouped_copy_are_one_kernel() -> None:
    g = _gqa()
    parts = part_domains(g)
    assert parts["qo"] == (1, 4, 8, 8) and parts["ko"] == (1, 2, 8, 8) and parts["cos"] == (1, 4, 8, 8)
    plan = make_plan(g)
    assert (plan.family, plan.M, plan.N) == (Family.ELEMENTWISE, 4 * 8, 8)
    check_emulates(g, 6, 2)


def test_more_query_heads_per_key_head() -> None:
    check_emulates(_gqa(nh=8, nkv=2, S=4, D=16), 4, 3)


def test_k_smaller_than_q_without_the_grouped_copy_stays_refused() -> None:
    with pytest.raises(UnsupportedGraphError) as err:
        make_plan(_gqa(grouped=False))
    assert "\n" not in str(err.value)


def test_a_region_of_one_domain_has_no_parts() -> None:
    g = _graph({"inv": [4], "xq": [1, 8, 32]}, [
        {"id": "c", "op": "cos", "args": ["xq"]},
        {"id": "a", "op": "slice", "args": ["c"], "axis": 2, "start": 0, "stop": 16},
        {"id": "b", "op": "slice", "args": ["c"], "axis": 2, "start": 16, "stop": 32},
        {"id": "y", "op": "concat", "args": ["b", "a"], "axis": 2}], ["y"])
    assert part_domains(g) == {}


@pytest.mark.slow  # nvcc
@pytest.mark.skipif(not nvcc_found(), reason="nvcc not installed")
def test_the_joined_rotary_compiles_for_sm90(tmp_path) -> None:
    check_compiles_sm90(_gqa(nh=32, nkv=8, S=64, D=128), 3, tmp_path)
