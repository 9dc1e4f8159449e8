"""The key / value cache concat of a decoding step (issue 41, item 2): the new position's key split
into heads from a matmul's output (``[B, H*D]`` viewed ``[B, 1, H*D]``, ``[B, 1, H, D]``, then the head
transpose of one position, which PyTorch writes as a view ``[B, H, 1, D]``), rotated or not, and
concatenated after the cache ``[B, H, P, D]`` along the sequence. The chain of views is loaded through
its index arithmetic (:func:`stitchtune.plan.chains.composed_chains`), the cache through its own strides
(a piece of the domain: :func:`stitchtune.plan.remap.concat_pieces`, also a one-position cache:
:func:`~stitchtune.plan.remap.unit_pieces`), and rotary angles computed in the region from the
position (a layout part) do not move along the sequence (:func:`~stitchtune.plan.remap.layout_reader_shift`).
Each plans and emulates like the float64 reference (the emulator faults on any out-of-bounds,
unwritten or racy access) for every schedule tried."""

from __future__ import annotations

from typing import Any

import pytest

from helpers import check_emulates, float_graph
from stitchtune.graph.parse import parse_graph
from stitchtune.plan.chains import composed_chains
from stitchtune.plan.planner import make_plan
from stitchtune.plan.pieces import concat_pieces, unit_pieces


def _key_split(x: str, B: int, H: int, D: int, torch_views: bool) -> list[dict[str, Any]]:
    """``x [B, H*D]`` -> ``k [B, H, 1, D]`` as PyTorch writes it (three views) or as reshape + transpose."""
    if torch_views:
        return [{"id": "v1", "op": "reshape", "args": [x], "shape": [B, 1, H * D]},
                {"id": "v2", "op": "reshape", "args": ["v1"], "shape": [B, 1, H, D]},
                {"id": "k", "op": "reshape", "args": ["v2"], "shape": [B, H, 1, D]}]
    return [{"id": "v2", "op": "reshape", "args": [x], "shape": [B, 1, H, D]},
            {"id": "k", "op": "transpose", "args": ["v2"], "perm": [0, 2, 1, 3]}]


def _rotary(src: str, D: int) -> list[dict[str, Any]]:
    h = D // 2
    return [{"id": "x2", "op": "slice", "args": [src], "axis": 3, "start": h, "stop": D},
            {"id": "n", "op": "neg", "args": ["x2"]},
            {"id": "x1", "op": "slice", "args": [src], "axis": 3, "start": 0, "stop": h},
            {"id": "rot", "op": "concat", "args": ["n", "x1"], "axis": 3},
            {"id": "kc", "op": "mul", "args": [src, "cos"]},
            {"id": "ks", "op": "mul", "args": ["rot", "sin"]},
            {"id": "kr", "op": "add", "args": ["kc", "ks"]}]


def _angles(D: int) -> list[dict[str, Any]]:
    """Llama's angles of one position in the region: ``pos * inv_freq``, ``cat(freqs, freqs)`` as
    PyTorch decomposes it (expand, reshape), cos and sin scaled by a scalar (attention scaling)."""
    return [{"id": "pf", "op": "cast", "args": ["pos"], "to": "float32"},
            {"id": "fr", "op": "mul", "args": ["pf", "inv"]},
            {"id": "fe", "op": "expand", "args": ["fr"], "shape": [1, 1, 2, D // 2]},
            {"id": "emb", "op": "reshape", "args": ["fe"], "shape": [1, 1, D]},
            {"id": "c0", "op": "cos", "args": ["emb"]},
            {"id": "cos", "op": "mul", "args": ["c0", "scale"]},
            {"id": "s0", "op": "sin", "args": ["emb"]},
            {"id": "sin", "op": "mul", "args": ["s0", "scale"]}]


def decode_kv(P: int, B: int = 1, H: int = 2, D: int = 16, rotary: str = "none", torch_views: bool = True) -> Any:
    """One decoding step's cache concat: ``cat(past [B, H, P, D], k [B, H, 1, D], 2)``; ``rotary``:
    ``none`` (values), ``inputs`` (cos / sin ``[1, 1, 1, D]`` read) or ``angles`` (computed in the region)."""
    nodes = _key_split("x", B, H, D, torch_views)
    ins: dict[str, Any] = {"x": [B, H * D], "past": [B, H, P, D]}
    src = "k"
    if rotary == "inputs":
        ins.update(cos=[1, 1, 1, D], sin=[1, 1, 1, D])
    if rotary == "angles":
        nodes = _angles(D) + nodes
        ins.update(pos=[1], inv=[D // 2], scale=[1])
    if rotary != "none":
        nodes += _rotary("k", D)
        src = "kr"
    nodes.append({"id": "cat", "op": "concat", "args": ["past", src], "axis": 2})
    if rotary != "angles":
        return float_graph(ins, nodes, ["cat"])
    spec = {k: {"shape": v, "dtype": "int64" if k == "pos" else "float32"} for k, v in ins.items()}
    return parse_graph({"name": "t", "inputs": spec, "nodes": nodes, "outputs": ["cat"]})


@pytest.mark.parametrize("torch_views", [True, False])
@pytest.mark.parametrize("P", [1, 7])
@pytest.mark.parametrize("rotary", ["none", "inputs", "angles"])
def test_decode_step_cache_concat_emulates(rotary: str, P: int, torch_views: bool) -> None:
    check_emulates(decode_kv(P, rotary=rotary, torch_views=torch_views), n_samples=2)


def test_batched_heads_and_a_longer_cache() -> None:
    check_emulates(decode_kv(33, B=2, H=4, rotary="angles"), n_samples=2)


def test_the_views_of_one_position_are_a_chain() -> None:
    g = decode_kv(7)
    assert composed_chains(g) == {"k": ("k", "v2", "v1", "x")}
    assert concat_pieces(g, (1, 2, 8, 16)) == {"past"}
    assert unit_pieces(g, (1, 2, 8, 16)) == {}
    plan = make_plan(g)
    assert (plan.M, plan.N) == (2 * 8, 16)


def test_a_one_position_cache_spans_the_sequence() -> None:
    """Cache and new key both one position: the cache's size 1 is a position, not a broadcast."""
    g = decode_kv(1)
    assert unit_pieces(g, (1, 2, 2, 16)) == {"past": (1, 2, 2, 16)}
    assert make_plan(g).M == 2 * 2
