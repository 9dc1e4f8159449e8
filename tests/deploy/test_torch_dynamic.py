"""Regions with symbolic sizes under torch.compile(dynamic=True): their dynamic graphs, the kernel
cache keyed by (structure, bucket), sizes outside the buckets, and results equal to eager."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stitchtune.torch as st_torch  # noqa: E402
from stitchtune.deploy import torch_backend, torch_ops, torch_stats  # noqa: E402
from stitchtune.errors import StitchtuneError  # noqa: E402


@pytest.fixture(autouse=True)
def _reset() -> Any:
    torch_backend.register()
    torch._dynamo.reset()
    torch_stats.reset()
    yield
    torch._dynamo.reset()


class Block(torch.nn.Module):
    """LayerNorm -> Linear -> GELU softmax: two memory-intensive regions around a matmul."""

    def __init__(self, h: int = 16) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(h)
        self.fc = torch.nn.Linear(h, h)

    def forward(self, x: Any) -> Any:
        return torch.nn.functional.gelu(self.fc(self.ln(x * 2.0 + 1.0))).softmax(-1)


def _dynamic_kernels() -> list[Any]:
    return [k.kernel for k in torch_ops._registry.values()
            if isinstance(getattr(k, "kernel", None), torch_ops.DynamicRegionKernel)]


def _run(sizes: list[int], **options: Any) -> list[Any]:
    torch.manual_seed(0)
    m = Block().eval()
    before = len(_dynamic_kernels())
    c = torch.compile(m, backend="stitchtune", dynamic=True,
                      options={"db": None, "fallback": "eager", "cpu": "reference", **options})
    with torch.no_grad():
        for b in sizes:
            x = torch.randn(b, 4, 16)   # no size equal to another (dynamo duck-sizes equal ones)
            assert torch.allclose(c(x), m(x), atol=1e-5)
    return _dynamic_kernels()[before:]


def test_the_cache_is_keyed_by_the_bucket_of_the_symbols() -> None:
    kernels = _run([3, 5, 20, 5])
    assert len(kernels) == 2
    for k in kernels:
        got = [(sorted((x.lo, x.hi) for x in b.buckets), sh[0][0]) for b, sh, e in k.entries() if e is not None]
        # both sizes of x are dynamo's symbols (4: bucket 1-16; 3 and 5 rows: 1-16, 20 rows: 17-32);
        # today a bucket keeps kernels per shape
        assert got == [([(1, 16), (1, 16)], 3), ([(1, 16), (1, 16)], 5), ([(1, 16), (17, 32)], 20)]
    s = st_torch.stats()
    assert [(r.selections, r.builds, r.hits) for r in s.regions] == [(4, 3, 1)] * 2


def test_sizes_beyond_max_extent_get_kernels_per_shape() -> None:
    kernels = _run([3, 20], max_extent=8)
    for k in kernels:
        assert [(b is None, sh[0][0]) for b, sh, _ in k.entries()] == [(False, 3), (True, 20)]


def test_max_extent_is_checked() -> None:
    for bad in (0, True, 2.5, 2**31):
        with pytest.raises(StitchtuneError, match="max_extent"):
            torch_backend.BackendOptions.from_options({"max_extent": bad})


def test_a_region_without_a_dynamic_graph_keys_by_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    from stitchtune.deploy import torch_dynamic

    def refuse(*a: Any) -> Any:
        raise StitchtuneError("no named sizes here")

    monkeypatch.setattr(torch_dynamic, "region_dynamic_graph", refuse)
    kernels = _run([3, 5, 3])
    for k in kernels:
        assert [(b, sh[0][0]) for b, sh, _ in k.entries()] == [(None, 3), (None, 5)]
