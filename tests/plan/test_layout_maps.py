"""transpose and reshape inside a region are index maps: the planner regroups the axes (splitting
one where a reshape needs it, e.g. the channels of a group norm into groups x channels per group),
picks the domain from the largest tensor, and every map still agrees with numpy element by element;
what is not only a split/merge/permutation is refused in one line naming the node."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.lowering import float_graph as _graph
from stitchtune.errors import UnsupportedGraphError
from stitchtune.plan.index_map import Factor
from stitchtune.plan.planner import TensorClass, make_plan


def _group_norm(N: int, C: int, H: int, W: int, G: int, gamma: list[int]) -> list[dict]:
    return [{"id": "r", "op": "reshape", "args": ["x"], "shape": [N, G, C // G * H * W]},
            {"id": "m", "op": "reduce_mean", "args": ["r"], "axes": [2], "keepdims": True},
            {"id": "d", "op": "sub", "args": ["r", "m"]},
            {"id": "n", "op": "reshape", "args": ["d"], "shape": [N, C, H, W]},
            {"id": "y", "op": "mul", "args": ["n", "g"]}]


@pytest.mark.parametrize("gamma", [[1, 8, 1, 1], [8, 1, 1]])
def test_group_norm_through_reshapes_splits_the_channel_axis(gamma: list[int]) -> None:
    N, C, H, W, G = 2, 8, 3, 4, 4
    p = make_plan(_graph({"x": [N, C, H, W], "g": gamma}, _group_norm(N, C, H, W, G, gamma), ["y"]))
    assert (p.family, p.M, p.N) == ("row", N * G, C // G * H * W)
    g = p.imap("g")
    assert p.cls("g") is TensorClass.FULL and p.mapped("g")
    assert g.rows.factors == (Factor(G, 1, C // G),) and g.cols.factors == (Factor(C // G, H * W, 1),)
    for n in ("x", "r", "d", "n", "y"):
        assert not p.mapped(n), n  # the big tensors stay plain: row-major over (N, G) x (C/G, H, W)
    # element by element: view (row = n*G + grp, col = cg*H*W + hw) is x[n, grp*Cg + cg, h, w]
    Cg = C // G
    r, c = np.meshgrid(np.arange(p.M), np.arange(p.N), indexing="ij")
    ch = (r % G) * Cg + c // (H * W)
    np.testing.assert_array_equal(np.vectorize(g.offset)(r, c), ch)


def test_a_transpose_permutes_the_map_and_the_domain_follows_the_largest_tensor() -> None:
    B, T, C = 2, 6, 8
    p = make_plan(_graph({"x": [B, T, C]}, [
        {"id": "t", "op": "transpose", "args": ["x"], "perm": [0, 2, 1]},
        {"id": "m", "op": "reduce_max", "args": ["t"], "axes": [2], "keepdims": True},
        {"id": "y", "op": "sub", "args": ["t", "m"]}], ["y", "m"]))
    # the reduced axis is x's middle axis: a column kernel, lanes along x's contiguous C
    assert (p.family, p.M, p.N) == ("col", T, B * C)
    assert p.imap("x").cols.factors == (Factor(B, C, T * C), Factor(C, 1, 1))
    y = p.imap("y")  # y = [B, C, T]: stored through its (bijective) map
    assert y.bijective and y.rows.factors == (Factor(T, 1, 1),) and y.vector_mode(4) == "scalar"
    r, c = np.meshgrid(np.arange(T), np.arange(B * C), indexing="ij")
    want = np.arange(B * C * T).reshape(B, C, T)[c // C, c % C, r]
    np.testing.assert_array_equal(np.vectorize(y.offset)(r, c), want)


def test_the_domain_can_come_from_a_reshape_result() -> None:
    """x [N, C*H*W] reshaped to [N, C, H*W]: the largest-rank tensor is the reshape's result."""
    p = make_plan(_graph({"x": [2, 24], "b": [1, 3, 1]}, [
        {"id": "r", "op": "reshape", "args": ["x"], "shape": [2, 3, 8]},
        {"id": "y", "op": "add", "args": ["r", "b"]},
        {"id": "s", "op": "reduce_sum", "args": ["y"], "axes": [2], "keepdims": True},
        {"id": "o", "op": "mul", "args": ["y", "s"]}], ["o"]))
    assert (p.family, p.M, p.N) == ("row", 6, 8) and not p.mapped("x") and p.cls("b") is TensorClass.PER_KEPT


@pytest.mark.parametrize("nodes,pattern", [
    ([{"id": "r", "op": "reshape", "args": ["x"], "shape": [4, 6]},
      {"id": "y", "op": "add", "args": ["r", 1.0]}], "node 'r' reshapes \\[6, 4\\] to \\[4, 6\\] in a way"),
    ([{"id": "t", "op": "transpose", "args": ["x"], "perm": [1, 0]},
      {"id": "r", "op": "reshape", "args": ["t"], "shape": [24]},
      {"id": "r2", "op": "reshape", "args": ["x"], "shape": [24]},
      {"id": "y", "op": "add", "args": ["r", "r2"]}], "node 'y' broadcasts values of different axes"),
])
def test_layouts_that_are_no_index_map_are_refused(nodes: list[dict], pattern: str) -> None:
    with pytest.raises(UnsupportedGraphError, match=pattern) as e:
        make_plan(_graph({"x": [6, 4]}, nodes, ["y"]))
    assert "\n" not in str(e.value)


def test_x_plus_its_transpose_is_refused() -> None:
    with pytest.raises(UnsupportedGraphError, match="node 'y' uses one axis of the region in two of its dims"):
        make_plan(_graph({"x": [6, 6]}, [{"id": "t", "op": "transpose", "args": ["x"], "perm": [1, 0]},
                                         {"id": "y", "op": "add", "args": ["x", "t"]}], ["y"]))
