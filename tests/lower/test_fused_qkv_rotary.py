"""Rotary after a fused qkv projection (Phi-3): ``qkv [B, S, (H + 2 KV) * D]`` sliced to q's (or k's)
columns, viewed as heads ``[B, S, H, D]``, transposed to ``[B, H, S, D]`` and rotated (rotate_half:
slice + neg + concat along ``D``). The slice, reshape and transpose are one chain of the input
(``plan.chains.sliced_chains``): each element (at its own and at the rotate-half positions) is loaded
through the chain's index arithmetic, so the region is one kernel. Each case plans, emulates like the
float64 reference (the emulator faults on any out-of-bounds, unwritten or racy access) and compiles;
vector loads where the columns and the slice start are multiples of the width; what stays refused is
one named line."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.lowering import check_emulates, DEV, float_graph as _graph, plan_or_refused
from helpers.nvcc import compile_programs_sm90, heuristic_programs
from lower.test_layout_index_mixes import _rotate
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.errors import SeparateRegionsError, UnsupportedGraphError
from stitchtune.gpu.build import nvcc_found
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.plan.chains import composed_chains, sliced_chains, wide_inputs
from stitchtune.space import SearchSpace


def _heads(start: int, n: int, B: int, S: int, D: int, pre: str) -> list[dict[str, Any]]:
    """``qkv[..., start : start + n*D]`` viewed as ``[B, S, n, D]``, transposed to ``[B, n, S, D]`` (``{pre}h``)."""
    return [{"id": f"{pre}sl", "op": "slice", "args": ["qkv"], "axis": -1, "start": start, "stop": start + n * D},
            {"id": f"{pre}hv", "op": "reshape", "args": [f"{pre}sl"], "shape": [B, S, n, D]},
            {"id": f"{pre}h", "op": "transpose", "args": [f"{pre}hv"], "perm": [0, 2, 1, 3]}]


def _rot(src: str, D: int, pre: str, cos: str = "cos", sin: str = "sin") -> list[dict[str, Any]]:
    return [dict(n, args=[{"cos": cos, "sin": sin}.get(a, a) for a in n["args"]]) for n in _rotate(src, D, pre)]


def fused_q(B: int = 2, S: int = 4, H: int = 2, KV: int = 1, D: int = 8) -> Any:
    """q's rotary: the first ``H*D`` columns of the fused projection, cos / sin ``[S, D]``."""
    return _graph({"qkv": [B, S, (H + 2 * KV) * D], "cos": [S, D], "sin": [S, D]},
                  _heads(0, H, B, S, D, "q") + _rot("qh", D, "r"), ["rout"])


def fused_k_unsqueezed(B: int = 2, S: int = 4, H: int = 2, KV: int = 1, D: int = 8) -> Any:
    """k's rotary (columns ``[H*D, (H+KV)*D)``) with cos / sin ``[B, S, D]`` unsqueezed to ``[B, 1, S, D]``
    in the region, as PyTorch's graph has them (a mixed region: the unsqueeze keeps its map)."""
    nodes = [{"id": "cu", "op": "reshape", "args": ["c"], "shape": [B, 1, S, D]},
             {"id": "su", "op": "reshape", "args": ["s"], "shape": [B, 1, S, D]}]
    return _graph({"qkv": [B, S, (H + 2 * KV) * D], "c": [B, S, D], "s": [B, S, D]},
                  nodes + _heads(H * D, KV, B, S, D, "k") + _rot("kh", D, "r", "cu", "su"), ["rout"])


def fused_q_and_k(B: int = 2, S: int = 4, H: int = 2, D: int = 8) -> Any:
    """q's and k's rotary in one region (as many k heads as q heads): two chains of one input."""
    nodes = _heads(0, H, B, S, D, "q") + _rot("qh", D, "r") + _heads(H * D, H, B, S, D, "k") + _rot("kh", D, "p")
    return _graph({"qkv": [B, S, 3 * H * D], "cos": [S, D], "sin": [S, D]}, nodes, ["rout", "pout"])


def fused_partial(B: int = 2, S: int = 4, H: int = 2, KV: int = 1, D: int = 8) -> Any:
    """A partial rotary (Phi-3's ``q_rot, q_pass`` with rotary dim ``D/2``): the rotated half concatenated
    with the passed-through one."""
    R = D // 2
    nodes = _heads(0, H, B, S, D, "q") + [
        {"id": "qr", "op": "slice", "args": ["qh"], "axis": -1, "start": 0, "stop": R},
        {"id": "qp", "op": "slice", "args": ["qh"], "axis": -1, "start": R, "stop": D}] + _rot("qr", R, "r") + [
        {"id": "y", "op": "concat", "args": ["rout", "qp"], "axis": -1}]
    return _graph({"qkv": [B, S, (H + 2 * KV) * D], "cos": [S, R], "sin": [S, R]}, nodes, ["y"])


def fused_q_softmax(B: int = 2, S: int = 4, H: int = 2, D: int = 8) -> Any:
    """A row reduction after the rotary (max over each head's D): a row kernel over the chain."""
    nodes = _heads(D, H, B, S, D, "q") + _rot("qh", D, "r") + [
        {"id": "mx", "op": "reduce_max", "args": ["rout"], "axes": [-1], "keepdims": True},
        {"id": "y", "op": "sub", "args": ["rout", "mx"]}]
    return _graph({"qkv": [B, S, 4 * D], "cos": [S, D], "sin": [S, D]}, nodes, ["y"])


def fused_q_odd_start(B: int = 2, S: int = 4, H: int = 2, D: int = 8) -> Any:
    """q's columns start off the vector grid (column 3): scalar loads, still in bounds."""
    nodes = [{"id": "qsl", "op": "slice", "args": ["qkv"], "axis": -1, "start": 3, "stop": 3 + H * D},
             {"id": "qhv", "op": "reshape", "args": ["qsl"], "shape": [B, S, H, D]},
             {"id": "qh", "op": "transpose", "args": ["qhv"], "perm": [0, 2, 1, 3]}] + _rot("qh", D, "r")
    return _graph({"qkv": [B, S, 4 * D], "cos": [S, D], "sin": [S, D]}, nodes, ["rout"])


def fused_k_reshaped_per_reader(B: int = 2, S: int = 8, H: int = 2, D: int = 16) -> Any:
    """k's rotary as the ONNX import gives it (one key/value head): the slice viewed as ``[B, 1, S, D]`` by
    one reshape per reader, then repeated for the q heads and transposed for the scores (stored tails)."""
    nodes = [{"id": "ks", "op": "slice", "args": ["qkv"], "axis": 2, "start": H * D, "stop": (H + 1) * D}]
    nodes += [{"id": f"kv{i}", "op": "reshape", "args": ["ks"], "shape": [B, 1, S, D]} for i in range(3)]
    nodes += [{"id": "x2", "op": "slice", "args": ["kv1"], "axis": 3, "start": D // 2, "stop": D},
              {"id": "x1", "op": "slice", "args": ["kv2"], "axis": 3, "start": 0, "stop": D // 2},
              {"id": "n", "op": "neg", "args": ["x2"]},
              {"id": "rot", "op": "concat", "args": ["n", "x1"], "axis": 3},
              {"id": "kc", "op": "mul", "args": ["kv0", "cos"]},
              {"id": "rs", "op": "mul", "args": ["rot", "sin"]},
              {"id": "k", "op": "add", "args": ["kc", "rs"]},
              {"id": "u", "op": "reshape", "args": ["k"], "shape": [B, 1, 1, S, D]},
              {"id": "e", "op": "expand", "args": ["u"], "shape": [B, 1, H, S, D]},
              {"id": "r", "op": "reshape", "args": ["e"], "shape": [B, H, S, D]},
              {"id": "kt", "op": "transpose", "args": ["r"], "perm": [0, 1, 3, 2]}]
    return _graph({"qkv": [B, S, (H + 2) * D], "cos": [1, 1, S, D], "sin": [1, 1, S, D]}, nodes, ["kt"])


def fused_v_repeated(B: int = 2, S: int = 8, H: int = 2, D: int = 16) -> Any:
    """v's columns (the last ``D``) only rearranged: repeated for the q heads into an output; the input is
    wider than the domain along its innermost axis (``plan.chains.wide_inputs``)."""
    nodes = [{"id": "vs", "op": "slice", "args": ["qkv"], "axis": 2, "start": (H + 1) * D, "stop": (H + 2) * D},
             {"id": "u", "op": "reshape", "args": ["vs"], "shape": [B, 1, 1, S, D]},
             {"id": "e", "op": "expand", "args": ["u"], "shape": [B, 1, H, S, D]},
             {"id": "v", "op": "reshape", "args": ["e"], "shape": [B, H, S, D]}]
    return _graph({"qkv": [B, S, (H + 2) * D]}, nodes, ["v"])


CASES: dict[str, Callable[[], Any]] = {"fused_q": fused_q, "fused_k_unsqueezed": fused_k_unsqueezed, "fused_q_and_k": fused_q_and_k,
         "fused_partial": fused_partial, "fused_q_softmax": fused_q_softmax, "fused_q_odd_start": fused_q_odd_start,
         "fused_q_wide": lambda: fused_q(2, 8, 4, 2, 16), "fused_k_reshaped_per_reader": fused_k_reshaped_per_reader,
         "fused_v_repeated": fused_v_repeated}


def test_the_slice_reshape_and_transpose_are_one_chain() -> None:
    g = fused_q()
    assert sliced_chains(g) == {"qh": ("qh", "qhv", "qsl", "qkv")}
    assert composed_chains(g) == sliced_chains(g)
    plan = make_plan(g)
    assert (plan.family, plan.M, plan.N) == ("elementwise", 2 * 2 * 4, 8)   # rows B*H*S, columns a head's D
    assert set(sliced_chains(fused_q_and_k())) == {"qh", "kh"}
    assert set(sliced_chains(fused_k_reshaped_per_reader())) == {"kv0", "kv1", "kv2"}   # sharing the slice
    assert wide_inputs(fused_v_repeated()) == {"qkv"} and sliced_chains(fused_v_repeated()) == {}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cases_match_the_reference(case: str) -> None:
    check_emulates(CASES[case](), 3, 3)


@pytest.mark.parametrize("case,loads", [("fused_q", 3), ("fused_q_and_k", 6), ("fused_q_odd_start", 0)])
def test_vector_loads_where_the_chain_keeps_the_grid(case: str, loads: int) -> None:
    # the own element and the two rotate-half positions (c + D/2, c - D/2), one float4 each
    from stitchtune.gpu.render import render

    g = CASES[case]()
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = dataclasses.replace(heuristic_schedule(plan, DEV, space), vec=4)
    assert not space.violations(s)
    assert render(lower(g, plan, s, DEV, space)).count("reinterpret_cast<const float4*>(in0") == loads


def test_what_stays_refused_is_one_named_line() -> None:
    B, S, H, D = 2, 4, 2, 8
    # a per-head norm between the head split and the transpose (Qwen3-style, on a fused projection)
    nodes: list[dict[str, Any]] = [{"id": "sl", "op": "slice", "args": ["qkv"], "axis": -1, "start": 0, "stop": H * D},
             {"id": "hv", "op": "reshape", "args": ["sl"], "shape": [B, S, H, D]},
             {"id": "sq", "op": "mul", "args": ["hv", "hv"]},
             {"id": "ms", "op": "reduce_mean", "args": ["sq"], "axes": [-1], "keepdims": True},
             {"id": "nn", "op": "mul", "args": ["hv", "ms"]},
             {"id": "qh", "op": "transpose", "args": ["nn"], "perm": [0, 2, 1, 3]}, *_rot("qh", D, "r")]
    g = _graph({"qkv": [B, S, 4 * D], "cos": [S, D], "sin": [S, D]}, nodes, ["rout"])
    assert sliced_chains(g) == {}
    with pytest.raises(UnsupportedGraphError, match="node 'hv' .* is read by 'sq'"):
        make_plan(g)
    # q's 2 heads and k's 1 head from one input in one region (they belong in two)
    nodes = _heads(0, H, B, S, D, "q") + _rot("qh", D, "r") + _heads(H * D, 1, B, S, D, "k") + _rot("kh", D, "p")
    g = _graph({"qkv": [B, S, (H + 2) * D], "cos": [S, D], "sin": [S, D]}, nodes, ["rout", "pout"])
    assert sliced_chains(g) == {}
    with pytest.raises(SeparateRegionsError, match="^node 'qh' .* a slice of input 'qkv' .* 'ksl' also read") as exc:
        make_plan(g)
    assert exc.value.apart == ("qh", "ksl")   # (data for a region finder: cut q's chain off k's)


@st.composite
def _sliced(draw: Any) -> dict[str, Any]:
    """A random input ``[B, S, W]`` sliced along its last (or middle) axis, the slice split into heads by a
    reshape and (maybe) transposed, then rotated along the last axis or just scaled; several such chains
    of the one input may share it (all heads of one shape) or have different head counts (refused)."""
    B, S, D = draw(st.sampled_from([1, 2])), draw(st.sampled_from([2, 3, 4])), draw(st.sampled_from([2, 4, 6]))
    n = draw(st.integers(1, 3))
    heads = [n] + {"none": [], "same": [n], "other": [n % 3 + 1]}[draw(st.sampled_from(["none", "same", "other"]))]
    along_seq = draw(st.booleans()) and len(heads) == 1
    extra = 0 if along_seq else draw(st.integers(0, 5))
    W = sum(heads) * D + extra
    nodes: list[dict[str, Any]] = []
    outs = []
    start = draw(st.integers(0, extra))
    for i, n in enumerate(heads):
        if along_seq:   # rows 1.. of the sequence, all columns of q: [B, S - 1, n*D]
            sl = {"id": f"s{i}", "op": "slice", "args": ["x"], "axis": 1, "start": 1, "stop": S}
            shape = [B, S - 1, n, D]
        else:
            sl = {"id": f"s{i}", "op": "slice", "args": ["x"], "axis": 2, "start": start, "stop": start + n * D}
            shape = [B, S, n, D]
        nodes += [sl, {"id": f"h{i}", "op": "reshape", "args": [f"s{i}"], "shape": shape}]
        head = f"h{i}"
        if draw(st.booleans()):
            nodes.append({"id": f"t{i}", "op": "transpose", "args": [head], "perm": [0, 2, 1, 3]})
            head = f"t{i}"
        if draw(st.booleans()):
            nodes += _rot(head, D, f"r{i}", "c", "c")
            outs.append(f"r{i}out")
        else:
            nodes.append({"id": f"m{i}", "op": "mul", "args": [head, 2.0]})
            outs.append(f"m{i}")
        start += n * D
    return {"name": "sl", "inputs": {"x": {"shape": [B, S, W], "dtype": "float32"}, "c": {"shape": [D], "dtype": "float32"}},
            "nodes": nodes, "outputs": outs}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(_sliced())
def test_random_sliced_chains_emulate_like_the_reference(obj: dict[str, Any]) -> None:
    g, plan = plan_or_refused(obj)
    if plan is None:
        return
    check_emulates(g, 1, 2)


@pytest.mark.skipif(not nvcc_found(), reason="nvcc not installed")
def test_cases_compile_for_sm90(tmp_path) -> None:
    # the heuristic schedule of every case, and its vec = 4 variant where legal, in one nvcc call
    programs = heuristic_programs([make() for make in CASES.values()], vec4=True)
    assert all(compile_programs_sm90(programs, tmp_path))
