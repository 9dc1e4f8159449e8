"""stitchtune.importers.torch_consts: constant-only fx nodes evaluated at import time."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stitchtune.importers.torch_consts import fold_constants  # noqa: E402


def test_constant_chains_are_evaluated_and_nothing_that_reads_an_input_or_draws_randomly() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x: Any, buf: Any) -> Any:
        i = torch.arange(4)
        causal = i[None, :] <= i[:, None]
        m = torch.where(causal, torch.zeros(()), -1e9)
        noise = torch.rand(4, 4)          # random: never folded
        return x + m + noise + buf * 2.0  # buf: constant only when named so

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 4), torch.ones(4))
    by_name = {n.name: n for n in gm.graph.nodes}
    folded = fold_constants(list(gm.graph.nodes))
    where = next(n for n in folded if "where" in n.name)
    want = torch.where(torch.arange(4)[None, :] <= torch.arange(4)[:, None], 0.0, -1e9)
    assert torch.equal(folded[where], want)
    assert not any("rand" in n.name or n.name.startswith("add") for n in folded)
    assert all(by_name["buf_1"] not in n.all_input_nodes for n in folded)
    with_buf = fold_constants(list(gm.graph.nodes), {"buf_1": torch.ones(4)})
    [mul] = [n for n in with_buf if n.name.startswith("mul")]
    assert torch.equal(with_buf[mul], torch.full((4,), 2.0))
