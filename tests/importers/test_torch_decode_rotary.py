"""A decode step of a grouped-query attention (Llama, Qwen2, Mistral): q with 4 heads and k with 2,
each one position split from a matmul's output ``[1, H*D]`` (PyTorch writes the head transpose of
one position as a view), both rotated by angles computed from the position in the graph, and k
appended to the key cache ``[1, 2, P, D]`` along the sequence. q's and k's parts differ in size, so
one kernel cannot iterate both: the planner names the reads between them and the angles they share
(:class:`~stitchtune.errors.SeparateRegionsError` with ``edges``), the region finder cuts them all at
once (:func:`stitchtune.importers.torch_cuts.edge_cuts`), and each part is a region: no
memory-intensive op declined, and the compiled step equals eager (issue 41, item 2)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from stitchtune.errors import SeparateRegionsError  # noqa: E402
from stitchtune.importers.torch_cuts import Refusal, edge_cuts  # noqa: E402
from stitchtune.importers.torch_regions import find_regions  # noqa: E402

H, KV, D, P = 4, 2, 16, 7


def _step(xq: Any, xk: Any, past: Any, pos: Any, inv: Any) -> tuple[Any, Any]:
    """q ``[1, H, 1, D]`` rotated, and the key cache ``[1, KV, P + 1, D]`` with the rotated new key."""
    freqs = pos.float()[:, None] * inv[None, :]          # [1, D/2]
    emb = freqs[:, None].expand(1, 2, D // 2).reshape(1, D)[None, None]   # cat((freqs, freqs), -1) as
    # the backend decomposes it: [1, 1, 1, D]
    cos, sin = emb.cos(), emb.sin()
    q = xq.view(1, 1, H, D).transpose(1, 2)
    k = xk.view(1, 1, KV, D).transpose(1, 2)

    def rot(u: Any) -> Any:
        return u * cos + torch.cat((-u[..., D // 2:], u[..., :D // 2]), -1) * sin

    return rot(q), torch.cat((past, rot(k)), 2)


def _args(p: int = P) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(1, H * D, generator=g), torch.randn(1, KV * D, generator=g),
            torch.randn(1, KV, p, D, generator=g), torch.tensor([p]), torch.rand(D // 2, generator=g))


def test_q_and_the_cache_concat_are_regions_cut_at_the_shared_angles() -> None:
    split = find_regions(make_fx(_step, tracing_mode="fake")(*_args()))
    kept_out = [d for d in split.declined if not d.what.startswith(("op aten.view", "op aten.unsqueeze"))]
    assert not kept_out, kept_out
    ops = [{n.name for n in r.nodes} for r in split.regions]
    assert len(split.regions) == 2, ops
    assert any("cat_2" in o or "cat_3" in o for o in ops)   # the cache concat is stitched


def test_the_refusal_names_every_read_between_the_parts() -> None:
    """The whole step as one region: refused naming the edges between q's part and k's."""
    from stitchtune.importers.torch_mapping import _map_group

    gm = make_fx(_step, tracing_mode="fake")(*_args())
    group = [n for n in gm.graph.nodes if n.op == "call_function"]
    from stitchtune.importers.torch_cuts import plan_check
    res = _map_group(group, "step", {}, set(), set(), True)
    why = plan_check(res.graph)
    assert isinstance(why, Refusal) and why.edges, why
    cuts = edge_cuts(why, group)
    assert cuts and all(src in group and reader in group for src, reader in cuts)
    assert edge_cuts(why, group, set(cuts)) == ()   # all cut already: the refusal stands


def test_parts_of_one_size_still_share_a_kernel() -> None:
    """No refusal where the parts can be iterated together (the prompt's q and k's grouped copy)."""
    from stitchtune.plan.axes import TensorAxes, tensor_axes
    from helpers import float_graph

    g = float_graph({"a": [1, 4, 8], "b": [1, 2, 16]},
                    [{"id": "x", "op": "neg", "args": ["a"]}, {"id": "y", "op": "neg", "args": ["b"]}], ["x", "y"])
    got = tensor_axes(g)
    assert isinstance(got, TensorAxes), got   # not a Refusal: one iteration domain for both parts
    assert got.size_of == {5: 2, 6: 2, 2: 8} and got.order == (5, 6, 2)
    assert got.of["a"] == ((), (5, 6), (2,)) and got.of["b"] == ((), (5,), (6, 2))   # 4 x 8 and 2 x 16 of one 2x2x8


@pytest.mark.parametrize("p", [1, 7, 30])
def test_the_compiled_step_equals_eager(p: int) -> None:
    from stitchtune.deploy import torch_backend

    torch._dynamo.reset()
    torch_backend.LAST_REPORTS.clear()
    try:
        got = torch.compile(_step, backend=torch_backend.stitchtune_backend,
                            options={"db": None, "fallback": "eager", "cpu": "emulate"})(*_args(p))
        reports = list(torch_backend.LAST_REPORTS)
    finally:
        torch._dynamo.reset()
    assert sum(len(r.stitched) for r in reports) == 2
    assert not [d for r in reports for d in r.declined if d.what.startswith(("region", "op aten.cat", "op aten.mul"))]
    for a, b in zip(got, _step(*_args(p))):
        assert a.shape == b.shape and a.stride() == b.stride()
        assert torch.allclose(a, b, atol=1e-5)


def test_separate_regions_error_carries_edges() -> None:
    e = SeparateRegionsError("x", ("a",), (("a", "b"),))
    assert e.apart == ("a",) and e.edges == (("a", "b"),)
