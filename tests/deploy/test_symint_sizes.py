"""SymInts used as sizes inside regions (issue 41), through ``torch.compile(dynamic=True)``: a prompt's
positions ``arange(S)`` (Llama's ``cache_position``), a static cache's causal mask ``arange(L) <= past``
(a region of bool outputs before, declined) and its lazy zeros ``full([1, 2, L, 16], 0)``. They used to
stay with PyTorch ("reads a SymInt value, not a tensor"); now each region reads the size as the extent of
a carrier input its call makes (:mod:`stitchtune.importers.torch_symsizes`): values and strides equal
eager's over several lengths, and one generic kernel per bucket (a new length of a bucket never builds)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stitchtune.torch as st_torch  # noqa: E402
from stitchtune.deploy import torch_backend  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_backend")


class _Rotary(torch.nn.Module):
    """A prompt's rotary angles from ``arange(S)``, S the query's length, applied to the query."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv", 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16)))

    def forward(self, q: Any) -> Any:
        ang = torch.arange(q.shape[2]).float()[:, None] * self.inv[None, :]
        emb = torch.cat([ang, ang], -1)
        return q * emb.cos() + q * emb.sin()


class _Mask(torch.nn.Module):
    """A decode step's causal mask over a static cache of L positions (L = the cache's length)."""

    def forward(self, cache: Any, past: Any) -> Any:
        L = cache.shape[2]
        m = (torch.arange(L)[None, None, None, :] <= past.view(1, 1, 1, 1)).expand(1, -1, 1, L)
        return torch.where(m, 0.0, float("-inf"))


class _Zeros(torch.nn.Module):
    """A static cache's lazy zeros of the cache's length, returned, and a value read from them."""

    def forward(self, k: Any) -> tuple[Any, Any]:
        z = torch.zeros(1, 2, k.shape[0], 16)
        return z, z + 1.0


CASES = {"rotary": (_Rotary, lambda n: (torch.randn(1, 4, n, 16),)),
         "mask": (_Mask, lambda n: (torch.zeros(1, 2, n, 16), torch.tensor(n // 2))),
         "zeros": (_Zeros, lambda n: (torch.randn(n),))}
#: the lengths of one bucket (17..32) after a first call at another: one generic kernel serves them all
LENGTHS = (7, 17, 19, 23, 30, 32)


def _compiled(m: Any) -> Any:
    return torch.compile(m, backend="stitchtune", dynamic=True,
                         options={"db": None, "fallback": "eager", "cpu": "emulate"})


def _sized_declines(noop: bool = False) -> list[Any]:
    """Declines of the sized ops (``noop``: and of the mask's no-op ``expand``, its input's shape)."""
    return [d for r in torch_backend.LAST_REPORTS for d in r.declined
            if "SymInt" in d.reason or "bool outputs" in d.reason or "constant tensor" in d.reason
            or d.what in ("op prims.iota", "op aten.full", "op aten.le") or noop and d.what == "op aten.expand"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_sized_ops_are_stitched_and_equal_eager(name: str) -> None:
    cls, make = CASES[name]
    m = cls().eval()
    c = _compiled(m)
    torch_backend.LAST_REPORTS.clear()
    st_torch.reset_stats()
    with torch.no_grad():
        for n in LENGTHS:
            args = make(n)
            got, want = c(*args), m(*args)
            for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
                assert g.stride() == w.stride()
    assert not _sized_declines(name == "mask"), _sized_declines(name == "mask")
    ops = {op for r in torch_backend.LAST_REPORTS for s in r.stitched for op in s.ops}
    assert {"prims.iota", "aten.full"} & ops, ops
    if name == "mask":   # the mask and the where that reads it: one region, no bool output stored
        assert any({"aten.le", "aten.where"} <= set(s.ops) for r in torch_backend.LAST_REPORTS for s in r.stitched)
    s = st_torch.stats()
    assert s.eager == 0, s
    # dynamo compiles the first length with its sizes specialised, then one graph with them symbolic:
    # the lengths 17..32 are one bucket, one generic kernel per region (never a kernel per length)
    assert all(r.builds <= 2 for r in s.regions), s


class _Positions(torch.nn.Module):
    def forward(self, cache: Any) -> Any:
        return torch.arange(cache.shape[1]).float() * 0.5


def test_the_launch_path_passes_each_calls_length_as_the_extent() -> None:
    """Through the launch path (a stand-in driver, CPU tensors): the generic kernel's last argument (its
    extent ``ext0``) is each call's length, read from the carrier the call made; one build for the bucket,
    no eager call (the carrier itself is no kernel argument: nothing reads it)."""
    import ctypes

    from stitchtune.deploy import torch_ops
    from stitchtune.gpu.fake_driver import FakeDriver

    class Reading(FakeDriver):
        def __init__(self) -> None:
            super().__init__()
            self.extents: list[int] = []

        def launch(self, function: Any, grid: Any, block: Any, smem: int, stream: int, params: int,
                   nparams: int, cooperative: bool = False) -> None:
            slot = (ctypes.c_uint64 * nparams).from_address(params)[nparams - 1]
            self.extents.append(ctypes.c_int32.from_address(int(slot)).value)

    drv = Reading()
    lengths = (17, 19, 30, 30, 32)
    torch_backend.LAST_REPORTS.clear()
    with torch_ops.stand_in_driver(drv, lambda compiled: b"FAKE symsize test"), torch.no_grad():
        c = _compiled(_Positions())
        c(torch.zeros(1, 5, 2))   # the first call: dynamo's specialised graph
        st_torch.reset_stats()
        for n in lengths:
            assert tuple(c(torch.zeros(1, n, 2)).shape) == (n,)
    assert drv.extents[-len(lengths):] == list(lengths)
    assert any("prims.iota" in s.ops for r in torch_backend.LAST_REPORTS for s in r.stitched)   # in the kernel
    s = st_torch.stats()
    assert s.eager == 0 and s.builds <= 1, s
