"""A refused group whose refusal names nodes that must be apart (:class:`~stitchtune.errors.SeparateRegionsError`,
Phi-3's q with 2 heads and k with 1 sliced from one fused projection) is split at the chain of views of
the first one (:func:`stitchtune.importers.torch_cuts.chain_cut`) rather than giving up that node: two
regions, none declined, the shared view an alias of the input, and the compiled graph equals eager."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from stitchtune.importers.torch_cuts import Refusal, chain_cut, cut_for, plan_check  # noqa: E402
from stitchtune.importers.torch_regions import find_regions  # noqa: E402

B, S, D = 2, 4, 8


def _qk_rotary(x: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    """``x [B*S, 4D]`` (a matmul's output) viewed ``[B, S, 4D]``; q: 2 heads, k: 1 head, each rotated."""
    t = x.view(B, S, 4 * D)
    q = t[..., :2 * D].view(B, S, 2, D).transpose(1, 2)
    k = t[..., 2 * D:3 * D].view(B, S, 1, D).transpose(1, 2)

    def rot(u: Any) -> Any:
        return u * cos + torch.cat((-u[..., D // 2:], u[..., :D // 2]), -1) * sin

    return rot(q), rot(k)


def _args() -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(B * S, 4 * D, generator=g), torch.randn(S, D, generator=g), torch.randn(S, D, generator=g)


def _gm() -> Any:
    return make_fx(_qk_rotary, tracing_mode="fake")(*_args())


def test_q_and_k_are_two_regions_cut_at_the_shared_view() -> None:
    split = find_regions(_gm())
    assert not split.declined and not split.free
    assert len(split.regions) == 2
    names = [{n.name for n in r.nodes} for r in split.regions]
    assert {"transpose", "cat"} <= names[1] and {"transpose_1", "cat_1", "view"} <= names[0], names
    (first, second) = split.regions
    assert [(a.name, b.name) for a, b in first.aliases] == [("view", "x_1")]   # PyTorch views x again
    assert [x.name for x in second.inputs][0] == "view"


def test_a_plain_refusal_still_gives_up_the_node() -> None:
    """The same refusal as a line (no ``apart``): the finder leaves the named node out, as before."""
    def accept(graph: Any) -> str | None:
        why = plan_check(graph)
        return why.reason if isinstance(why, Refusal) else why

    split = find_regions(_gm(), accept=accept)
    assert [d.what for d in split.declined] == ["op aten.transpose"]


def test_chain_cut_needs_a_shared_source_in_the_group() -> None:
    gm = _gm()
    by = {n.name: n for n in gm.graph.nodes}
    group = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert chain_cut(by["transpose"], group) == (by["view"], by["slice_1"])
    assert chain_cut(by["transpose"], [n for n in group if n.name != "view"]) is None   # x is no node of it
    assert chain_cut(by["mul"], group) is None   # no view
    refusal = Refusal("planner: ...", ("transpose", "slice_2"))
    assert cut_for(refusal, group) == (by["view"], by["slice_1"])
    assert cut_for(refusal, group, {(by["view"], by["slice_1"])}) is None   # cut already: the refusal stands
    assert cut_for("planner: ...", group) is None


def test_the_compiled_graph_equals_eager() -> None:
    from stitchtune.deploy import torch_backend

    torch._dynamo.reset()
    torch_backend.LAST_REPORTS.clear()
    try:
        got = torch.compile(_qk_rotary, backend=torch_backend.stitchtune_backend,
                            options={"db": None, "fallback": "eager", "cpu": "emulate"})(*_args())
        reports = list(torch_backend.LAST_REPORTS)
    finally:
        torch._dynamo.reset()
    assert sum(len(r.stitched) for r in reports) == 2
    assert not [d for r in reports for d in r.declined if d.what.startswith(("region", "op aten.transpose"))]
    for a, b in zip(got, _qk_rotary(*_args())):
        assert torch.allclose(a, b, atol=1e-5)
