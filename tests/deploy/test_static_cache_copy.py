"""A static KV cache's index copy in a region (issue 41 item 2): ``cache.index_copy_(2, pos, new)`` (what
transformers' ``StaticCache.update`` does) reaches the backend as a functional ``index_put`` whose result
PyTorch copies back into the buffer. One position at a time it is stitched as ``where(iota == pos, new,
cache)`` or, the cache being the buffer the model overwrites, written in place (``deploy/torch_put``): the
region's values, the buffer after the call and its strides equal eager's, at every position, with static and
symbolic shapes. Several positions at once (a prompt) are written in place too."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stitchtune.deploy import torch_backend  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_backend")


class _Cache(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 2, 16, 8))

    def forward(self, x: Any, pos: Any) -> Any:
        self.k.index_copy_(2, pos, x * 2.0)
        return self.k.sum(-1) + 1.0


def _run(dynamic: bool, n: int = 1) -> tuple[list[Any], list[Any]]:
    m, e = _Cache(), _Cache()
    c = torch.compile(m, backend="stitchtune", dynamic=dynamic,
                      options={"db": None, "fallback": "eager", "cpu": "emulate"})
    torch_backend.LAST_REPORTS.clear()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in range(0, 5 * n, n):
            x = torch.randn(1, 2, n, 8, generator=g)
            pos = torch.arange(p, p + n)
            torch.testing.assert_close(c(x, pos), e(x, pos))
            torch.testing.assert_close(m.k, e.k, rtol=0, atol=0)
            assert m.k.stride() == e.k.stride()
    stitched = [s for r in torch_backend.LAST_REPORTS for s in r.stitched]
    declined = [d for r in torch_backend.LAST_REPORTS for d in r.declined]
    return stitched, declined


@pytest.mark.parametrize("dynamic", [False, True])
def test_one_position_index_copy_is_stitched_and_equal_to_eager(dynamic: bool) -> None:
    stitched, declined = _run(dynamic)
    assert not declined, declined
    assert any("aten.index_put" in s.ops for s in stitched), [s.ops for s in stitched]
    assert any(s.source == "cache write in place" for s in stitched), stitched   # the buffer: written in place


@pytest.mark.parametrize("dynamic", [False, True])
def test_several_positions_are_written_in_place(dynamic: bool) -> None:
    """A position tensor of several positions (a prompt) is written in place too (deploy/torch_put): the
    buffer equals eager's after every call (``_run``), nothing declined."""
    stitched, declined = _run(dynamic, n=3)
    assert not declined, declined
    assert any(s.source == "cache write in place" for s in stitched), stitched


def test_a_functional_one_position_copy_is_the_where_region() -> None:
    """An out-of-place ``index_copy`` of one position into an input the model does not overwrite cannot be
    written in place (the caller's tensor must not change): it is the ``where`` over the cache in a region."""
    def f(cache: Any, x: Any, pos: Any) -> Any:
        return torch.index_copy(cache, 2, pos, x * 2.0) + 1.0

    c = torch.compile(f, backend="stitchtune", dynamic=False,
                      options={"db": None, "fallback": "eager", "cpu": "emulate"})
    torch_backend.LAST_REPORTS.clear()
    cache, x = torch.randn(1, 2, 16, 8), torch.randn(1, 2, 1, 8)
    keep = cache.clone()
    with torch.no_grad():
        torch.testing.assert_close(c(cache, x, torch.tensor([5])), f(cache, x, torch.tensor([5])))
    torch.testing.assert_close(cache, keep, rtol=0, atol=0)
    stitched = [s for r in torch_backend.LAST_REPORTS for s in r.stitched]
    assert any("aten.index_put" in s.ops and s.source != "cache write in place" for s in stitched), stitched
