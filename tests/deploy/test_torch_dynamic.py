"""Regions with symbolic sizes under torch.compile(dynamic=True): their dynamic graphs, the kernel
cache keyed by (structure, bucket), sizes outside the buckets, and results equal to eager."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stitchtune.torch as st_torch  # noqa: E402
from stitchtune.deploy import torch_backend, torch_ops  # noqa: E402
from stitchtune.deploy.torch_region_dynamic import DynamicRegionKernel  # noqa: E402
from stitchtune.errors import StitchtuneError  # noqa: E402
from helpers.torch_models import torch_block  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_backend")


def _dynamic_kernels() -> list[Any]:
    return [k.kernel for k in torch_ops._registry.values()
            if isinstance(getattr(k, "kernel", None), DynamicRegionKernel)]


def _run(sizes: list[int], **options: Any) -> list[Any]:
    torch.manual_seed(0)
    m = torch_block()
    before = len(_dynamic_kernels())
    c = torch.compile(m, backend="stitchtune", dynamic=True,
                      options={"db": None, "fallback": "eager", "cpu": "reference", **options})
    with torch.no_grad():
        for b in sizes:
            x = torch.randn(b, 4, 16)   # no size equal to another (dynamo duck-sizes equal ones)
            assert torch.allclose(c(x), m(x), atol=1e-5)
    return _dynamic_kernels()[before:]


def _buckets(key: Any) -> list[tuple[int, int]]:
    return sorted((b.lo, b.hi) for b in key.buckets)


def test_one_generic_kernel_per_bucket() -> None:
    kernels = _run([3, 5, 40, 5, 63])
    assert len(kernels) == 2
    for k in kernels:
        # both sizes of x are dynamo's symbols (4: bucket 2-32; 3 and 5 rows: 2-32, 40 and 63: 33-64)
        assert [(_buckets(b), sh) for b, sh, _ in k.entries()] == [([(2, 32), (2, 32)], None),
                                                                  ([(2, 32), (33, 64)], None)]
        assert all(e is not None and e.generic for _, _, e in k.entries())
    assert [(r.selections, r.builds, r.hits) for r in st_torch.stats().regions] == [(3, 2, 3)] * 2


def test_sizes_beyond_max_extent_get_kernels_per_shape() -> None:
    kernels = _run([3, 20, 20], max_extent=8)
    for k in kernels:
        assert [(b is None, sh if sh is None else sh[0][0]) for b, sh, _ in k.entries()] == [(False, None), (True, 20)]
    assert [(r.selections, r.builds, r.hits) for r in st_torch.stats().regions] == [(3, 2, 1)] * 2


class Lookup(torch.nn.Module):
    """An embedding gather (a static table, ids of dynamic batch and length), a position embedding
    sliced to the length, then a layer norm."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(64, 16)
        self.ln = torch.nn.LayerNorm(16)

    def forward(self, ids: Any) -> Any:
        return self.ln(self.emb(ids) * 2.0)


def test_an_embedding_gather_gets_one_generic_kernel_per_bucket() -> None:
    from stitchtune.deploy.torch_ops import RegionError

    torch.manual_seed(0)
    m = Lookup().eval()
    before = len(_dynamic_kernels())
    c = torch.compile(m, backend="stitchtune", dynamic=True,
                      options={"db": None, "fallback": "eager", "cpu": "emulate"})
    with torch.no_grad():
        for n in (5, 7, 5, 9, 40, 63):
            ids = torch.randint(0, 64, (3, n))
            assert torch.allclose(c(ids), m(ids), atol=1e-5)
        bad = torch.randint(0, 64, (3, 23))
        bad[2, 22] = 64   # the last row: the generic kernel's index check at an extent it was not built at
        with pytest.raises((RegionError, StitchtuneError), match="index out of range"):
            c(bad)
    [k] = _dynamic_kernels()[before:]
    assert [(_buckets(b), sh) for b, sh, _ in k.entries()] == [([(2, 32), (2, 32)], None), ([(2, 32), (33, 64)], None)]
    assert all(e is not None and e.generic for _, _, e in k.entries())
    [r] = st_torch.stats().regions
    assert (r.selections, r.builds, r.hits) == (3, 2, 5)


class Picked(torch.nn.Module):
    """One element per row picked by an index (``torch.gather`` along the hidden axis) added to the row,
    then a layer norm: a pick (``gather_elements``) is lowered for static shapes only, so no generic
    kernel serves it."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(16)

    def forward(self, x: Any, i: Any) -> Any:
        return self.ln(x + torch.gather(x, 2, i))


def test_a_bucket_the_generic_kernel_refuses_gets_kernels_per_extent(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    torch.manual_seed(0)
    m = Picked().eval()
    before = len(_dynamic_kernels())
    c = torch.compile(m, backend="stitchtune", dynamic=True,
                      options={"db": None, "fallback": "eager", "cpu": "emulate"})
    with caplog.at_level(logging.INFO, logger="stitchtune.deploy.torch_dynamic"), torch.no_grad():
        for n in (5, 7, 5, 9):
            x, i = torch.randn(3, n, 16), torch.randint(0, 16, (3, n, 1))
            assert torch.allclose(c(x, i), m(x, i), atol=1e-5)
    [k] = _dynamic_kernels()[before:]
    assert [sh[0] for _, sh, e in k.entries() if e is not None] == [(3, 5, 16), (3, 7, 16), (3, 9, 16)]
    assert not any(e.generic for _, _, e in k.entries())
    [why] = [r.message for r in caplog.records if "no generic kernel for bucket" in r.message]   # remembered
    assert "gather_elements" in why
    [r] = st_torch.stats().regions
    assert (r.selections, r.builds, r.hits) == (4, 3, 1)


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
    assert [(r.selections, r.builds, r.hits) for r in st_torch.stats().regions] == [(3, 2, 1)] * 2


def test_a_generic_kernel_binds_the_extents_on_the_launch_path() -> None:
    import dataclasses

    from stitchtune.gpu.fake_driver import FakeDriver

    generic = [e.kernel for k in _run([20]) for _, _, e in k.entries()]
    assert len(generic) == 2 and all(g.sym is not None for g in generic)
    g = generic[1]
    drv = FakeDriver()
    k = torch_ops.RegionKernel(g.name, g.ops, dataclasses.replace(g.compiled, cubin=b"FAKE"), driver=drv, sym=g.sym)
    n = len(k.compiled.program.launches)
    sizes = ((17, 4), (32, 4), (17, 4), (20, 5))
    for b, s in sizes:
        outs = k([torch.randn(b, s, 16)])
        assert [tuple(o.shape) for o in outs] == [(b, s, 16)]
    assert len(drv.launches) == len(sizes) * n and sum(c[0] == "load_module" for c in drv.calls) == 1   # one build
    # each launch gets the extents (by dim name: the bucket's order) after its pointers, and their grid
    names = [d.name for d in k.compiled.dgraph.dims]
    info = k.launcher(-1, 0)[0].plan.dynamic
    for i, (b, s) in enumerate(sizes):
        ext = k.sym.extents([(b, s, 16)])
        first = drv.launches[i * n]
        assert tuple(first.args[-len(names):]) == tuple(ext[d] for d in names)
        assert first.grid[0] == info.grid(0, ext)
    # arguments are packed once per extents (the pointers rewritten in place)
    assert set(k._launchers[(-1, 0)][1]) == {tuple(sorted(k.sym.extents([(b, s, 16)]).items())) for b, s in sizes}


def test_automatic_dynamic_gets_generic_kernels_after_its_recompile() -> None:
    torch.manual_seed(0)
    m = torch_block()
    c = torch.compile(m, backend="stitchtune", options={"db": None, "fallback": "eager", "cpu": "reference"})
    with torch.no_grad():
        for b in (3, 5, 7, 9):   # 3: a static graph; 5: dynamo recompiles with the batch symbolic
            x = torch.randn(b, 4, 16)
            assert torch.allclose(c(x), m(x), atol=1e-5)
    s = st_torch.stats()
    assert [(r.dynamic, r.selections, r.builds, r.hits) for r in s.regions] == [
        (False, 1, 1, 0), (False, 1, 1, 0), (True, 2, 1, 2), (True, 2, 1, 2)]
