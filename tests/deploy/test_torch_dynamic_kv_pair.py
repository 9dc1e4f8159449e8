"""A GPT-2-style decode step under ``torch.compile(dynamic=True)`` (issue 41): the key and the value
cache concats in one region. Dynamo gives the past keys and past values separate symbols (nothing in
the graph compares them: SDPA's CPU kernel does not guard their lengths equal); the importer takes them
as one (:func:`~stitchtune.importers.torch_symbolic.unify_symbols`) and the backend checks them equal
at every call, so the region builds one generic kernel per bucket of the past length, equal to eager;
past keys and values of unequal lengths still run right (kernels per shape)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stitchtune.torch as st_torch  # noqa: E402
from stitchtune.deploy import torch_ops  # noqa: E402
from helpers.torch_models import dynamic_kernels_since  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_backend")

H, D = 2, 16


@pytest.fixture(autouse=True)
def _own_registry() -> Any:
    """Drop the kernels these tests register (other tests of dynamic kernels read the registry)."""
    before = set(torch_ops._registry)
    yield
    for key in set(torch_ops._registry) - before:
        del torch_ops._registry[key]


class KVStep(torch.nn.Module):
    """GPT-2's attention step after ``c_attn``: split q / k / v, head split, concat both caches, SDPA."""

    def forward(self, qkv: Any, pk: Any, pv: Any) -> Any:
        q, k, v = (t.view(1, 1, H, D).transpose(1, 2) for t in qkv.split(H * D, -1))
        k, v = torch.cat((pk, k), 2), torch.cat((pv, v), 2)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v), k, v


class Cat2(torch.nn.Module):
    """Two concats of unrelated dynamic pieces that are equal at the first call."""

    def forward(self, x: Any, a: Any, b: Any) -> Any:
        n = x.view(1, 1, H, D).transpose(1, 2)
        return torch.cat((a, n), 2), torch.cat((b, n), 2)


def _compiled(m: Any) -> Any:
    return torch.compile(m, backend="stitchtune", dynamic=True,
                         options={"db": None, "fallback": "eager", "cpu": "emulate"})


def test_key_and_value_concats_build_one_generic_kernel_per_bucket() -> None:
    torch.manual_seed(0)
    m = KVStep().eval()
    c = _compiled(m)
    before = set(torch_ops._registry)
    lengths = (3, 5, 9, 16, 31, 33, 40, 64, 50, 47)   # the backend's buckets 2..32 and 33..64
    with torch.no_grad():
        for p in lengths:
            args = (torch.randn(1, 3 * H * D), torch.randn(1, H, p, D), torch.randn(1, H, p, D))
            got, want = c(*args), m(*args)
            assert all(g.shape == w.shape and torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want)), p
    entries = [e for k in dynamic_kernels_since(before) for _, _, e in k.entries()]
    assert entries and all(e is not None and e.generic for e in entries)
    s = st_torch.stats()
    assert s.eager == 0 and max(r.builds for r in s.regions) <= 2, [(r.region, r.builds) for r in s.regions]


def test_unequal_extents_taken_as_one_run_right(monkeypatch: pytest.MonkeyPatch) -> None:
    # without duck shapes dynamo gives the two pasts separate symbols though equal at the first call (as in
    # transformers' GPT-2), with no guard: later calls of unequal pasts reach the same graph
    import torch.fx.experimental._config as fx_config

    monkeypatch.setattr(fx_config, "use_duck_shape", False)
    torch.manual_seed(0)
    m = Cat2().eval()
    c = _compiled(m)
    with torch.no_grad():
        for pa, pb in ((5, 5), (7, 7), (9, 4), (6, 11), (8, 8)):
            args = (torch.randn(1, H * D), torch.randn(1, H, pa, D), torch.randn(1, H, pb, D))
            got, want = c(*args), m(*args)
            assert all(g.shape == w.shape and torch.allclose(g, w) for g, w in zip(got, want)), (pa, pb)
    s = st_torch.stats()
    # one graph (the unequal pasts did not recompile); the generic kernel serves the equal pasts, and the
    # two unequal ones, refused by the tie check, run the region's ATen ops (the planner does not take a
    # region of unequal concats): without the check the generic kernel would be handed them
    assert len(s.regions) == 1 and s.regions[0].declined is None, s
    assert s.eager == 2 and s.builds == 1, s
