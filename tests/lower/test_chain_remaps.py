"""Slice / concat of a transposed or reshaped input along any axis (``plan.chains.composed_chains``):
ViT's patch flatten (conv ``[1, C, h, w]`` -> reshape ``[1, C, h*w]`` -> transpose ``[1, h*w, C]``)
concatenated after the class token along the sequence, + position embedding, LayerNorm, is one
kernel; the patches are loaded through the chain's index arithmetic. Random chains of transposes
and reshapes, concatenated or sliced along a random axis, emulate like the float64 reference for the
heuristic and a sampled schedule (the emulator faults on any out-of-bounds, unwritten or racy access);
a refusal is one line. The vector fast path is kept where the chain keeps the innermost axis."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.lowering import check_emulates, DEV, float_graph as _graph, plan_or_refused
from helpers.nvcc import check_compiles_sm90
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.gpu.build import nvcc_found
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.plan.chains import composed_chains
from stitchtune.space import SearchSpace


def _vit(B: int, C: int, h: int, w: int):
    L = h * w
    nodes = [{"id": "flat", "op": "reshape", "args": ["conv"], "shape": [B, C, L]},
             {"id": "pt", "op": "transpose", "args": ["flat"], "perm": [0, 2, 1]},
             {"id": "cat", "op": "concat", "args": ["cls", "pt"], "axis": 1},
             {"id": "x", "op": "add", "args": ["cat", "pos"]},
             {"id": "m", "op": "reduce_mean", "args": ["x"], "axes": [2], "keepdims": True},
             {"id": "y", "op": "sub", "args": ["x", "m"]}]
    return _graph({"conv": [B, C, h, w], "cls": [B, 1, C], "pos": [1, L + 1, C]}, nodes, ["x", "y"])


def test_vit_patch_flatten_and_class_token_are_one_kernel() -> None:
    g = _vit(2, 16, 3, 3)
    assert composed_chains(g) == {"pt": ("pt", "flat", "conv")}
    plan = make_plan(g)
    assert (plan.family, plan.M, plan.N) == ("row", 2 * 10, 16)
    check_emulates(g, 4, 2)


def test_a_chain_that_keeps_the_innermost_axis_loads_vectors() -> None:
    # a [B, S, H] input split and merged back (innermost kept), concatenated along the sequence
    g = _graph({"a": [2, 4, 32], "b": [2, 3, 32]}, [
        {"id": "r", "op": "reshape", "args": ["a"], "shape": [2, 2, 2, 32]},
        {"id": "t", "op": "transpose", "args": ["r"], "perm": [0, 2, 1, 3]},
        {"id": "r2", "op": "reshape", "args": ["t"], "shape": [2, 4, 32]},
        {"id": "c", "op": "concat", "args": ["b", "r2"], "axis": 1},
        {"id": "y", "op": "mul", "args": ["c", 2.0]}], ["y"])
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    s = dataclasses.replace(heuristic_schedule(plan, DEV, space), vec=4)
    assert not space.violations(s)
    from stitchtune.gpu.render import render

    assert "reinterpret_cast<const float4*>(in0" in render(lower(g, plan, s, DEV, space))
    check_emulates(g, 3, 2)


def test_gpt2_qkv_split_into_heads_is_one_kernel() -> None:
    # c_attn's output [B*S, 3H] -> [B, S, 3H], split into q, k, v along the innermost axis, each split
    # into heads (reshape + transpose; k^T for the scores): a mixed region every input of which is a
    # chain, so the view's columns (a head's D) need not be the whole innermost axis
    B, S, nh, D = 2, 8, 4, 8
    H = nh * D
    nodes = [{"id": "v3", "op": "reshape", "args": ["qkv"], "shape": [B, S, 3 * H]}]
    for i, perm in enumerate(([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3])):
        nodes += [{"id": f"s{i}", "op": "slice", "args": ["v3"], "axis": 2, "start": i * H, "stop": (i + 1) * H},
                  {"id": f"h{i}", "op": "reshape", "args": [f"s{i}"], "shape": [B, S, nh, D]},
                  {"id": f"t{i}", "op": "transpose", "args": [f"h{i}"], "perm": perm}]
    g = _graph({"qkv": [B * S, 3 * H]}, nodes, ["t0", "t1", "t2"])
    assert composed_chains(g) == {"v3": ("v3", "qkv")}
    plan = make_plan(g)
    assert (plan.M, plan.N) == (B * S * nh, D)
    check_emulates(g, 4, 2)


@st.composite
def _chains(draw) -> dict:
    shape = draw(st.lists(st.sampled_from([2, 3, 4, 6]), min_size=2, max_size=3))
    nodes: list[dict] = []
    cur, cur_shape = "x", list(shape)
    for _ in range(draw(st.integers(1, 3))):
        nid = f"n{len(nodes)}"
        if draw(st.booleans()):
            perm = draw(st.permutations(range(len(cur_shape))))
            new = [cur_shape[p] for p in perm]
            nodes.append({"id": nid, "op": "transpose", "args": [cur], "perm": list(perm)})
        else:
            k = draw(st.integers(0, len(cur_shape) - 1))
            d = cur_shape[k]
            if d in (4, 6) and len(cur_shape) < 4:
                new = cur_shape[:k] + [2, d // 2] + cur_shape[k + 1:]
            elif k + 1 < len(cur_shape):
                new = cur_shape[:k] + [d * cur_shape[k + 1]] + cur_shape[k + 2:]
            else:
                continue
            nodes.append({"id": nid, "op": "reshape", "args": [cur], "shape": new})
        cur, cur_shape = nid, new
    axis = draw(st.integers(0, len(cur_shape) - 1))
    other = list(cur_shape)
    other[axis] = draw(st.integers(1, 3))
    inputs = {"x": shape, "o": other}
    if draw(st.booleans()):
        nodes.append({"id": "c", "op": "concat", "args": [cur, "o"] if draw(st.booleans()) else ["o", cur],
                      "axis": axis})
    else:  # a slice of the chain next to a tensor of the sliced size
        ln = cur_shape[axis]
        start = draw(st.integers(0, ln - 1))
        stop = draw(st.integers(start + 1, ln))
        other[axis] = stop - start
        nodes.append({"id": "c", "op": "slice", "args": [cur], "axis": axis, "start": start, "stop": stop})
    nodes.append({"id": "a", "op": "add", "args": ["c", "o"] if nodes[-1]["op"] == "slice" else ["c", 1.0]})
    outs = ["a"]
    if draw(st.booleans()):
        nodes += [{"id": "m", "op": "reduce_max", "args": ["a"], "axes": [len(cur_shape) - 1], "keepdims": True},
                  {"id": "y", "op": "sub", "args": ["a", "m"]}]
        outs = ["y"]
    return {"name": "ch", "inputs": {k: {"shape": v, "dtype": "float32"} for k, v in inputs.items()},
            "nodes": nodes, "outputs": outs}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(_chains())
def test_random_chains_under_slices_and_concats_emulate_like_the_reference(obj: dict) -> None:
    g, plan = plan_or_refused(obj)
    if plan is None:
        return
    assert plan.M * plan.N == max(math.prod(n.shape) for n in g.nodes if n.id in g.outputs)
    check_emulates(g, 1, 2)


@pytest.mark.slow  # nvcc
@pytest.mark.skipif(not nvcc_found(), reason="nvcc not installed")
def test_vit_embeddings_compile_for_sm90(tmp_path) -> None:
    check_compiles_sm90(_vit(8, 768, 14, 14), 3, tmp_path)
