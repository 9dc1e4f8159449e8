"""Counters of the torch backend (stitchtune.torch.stats): exact counts of selections, builds, cache
hits and eager calls, on a fake region kernel and through torch.compile on a small block."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stitchtune.torch as st_torch  # noqa: E402
from stitchtune.deploy import torch_backend, torch_stats  # noqa: E402
from stitchtune.deploy.torch_region_dynamic import Built, DynamicRegionKernel  # noqa: E402
from helpers.torch_models import torch_block  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_backend")


def _fake_region(generic: bool, fail_at: int | None = None) -> tuple[DynamicRegionKernel, list[tuple[int, ...]]]:
    """A DynamicRegionKernel doubling its input: buckets of 4 rows; ``build`` records the shapes it was
    called for and counts a selection and a build; it refuses ``fail_at`` rows."""
    counter = torch_stats.region_counter("inference", "region_fake", ("aten.mul",), True)
    built: list[tuple[int, ...]] = []

    def build(inputs: Any) -> Built:
        rows = inputs[0].shape[0]
        if rows == fail_at:
            raise RuntimeError("no kernel at these shapes")
        built.append(tuple(inputs[0].shape))
        counter.add(selections=1, builds=1)
        return Built(lambda xs: [xs[0] * 2.0], (0,), generic)

    module = lambda x: [x * 2.0]   # noqa: E731 - the region's ATen ops
    k = DynamicRegionKernel("region_fake", ("aten.mul",), module, build,
                            bucket_of=lambda xs: (xs[0].shape[0] - 1) // 4, counter=counter)
    return k, built


def test_a_generic_kernel_serves_its_whole_bucket() -> None:
    k, built = _fake_region(generic=True)
    for rows in (1, 2, 3, 4, 5, 8, 2, 9):
        x = torch.randn(rows, 3)
        assert torch.equal(k([x])[0], x * 2.0)
    assert built == [(1, 3), (5, 3), (9, 3)]   # buckets 1-4, 5-8, 9-12
    s = st_torch.stats()
    assert (s.selections, s.builds, s.hits, s.eager) == (3, 3, 5, 0)
    assert [(b, sh) for b, sh, _ in k.entries()] == [(0, None), (1, None), (2, None)]


def test_specialised_kernels_are_kept_per_shape_inside_a_bucket() -> None:
    k, built = _fake_region(generic=False, fail_at=6)
    for rows in (1, 2, 1, 6, 6, 7, 2):
        x = torch.randn(rows, 3)
        assert torch.equal(k([x])[0], x * 2.0)   # rows=6 runs the ATen ops
    assert built == [(1, 3), (2, 3), (7, 3)]
    [r] = st_torch.stats().regions
    assert (r.selections, r.builds, r.hits, r.eager) == (3, 3, 2, 2)
    assert [(b, sh, e is None) for b, sh, e in k.entries()] == [
        (0, ((1, 3),), False), (0, ((2, 3),), False), (1, ((6, 3),), True), (1, ((7, 3),), False)]


def test_a_bucket_function_that_raises_keys_by_the_exact_shapes() -> None:
    k, built = _fake_region(generic=True)
    k.bucket_of = lambda xs: 1 // 0
    for rows in (3, 4, 3):
        k([torch.randn(rows, 3)])
    assert built == [(3, 3), (4, 3)]
    assert st_torch.stats().hits == 1


def test_dtypes_are_part_of_the_cache_key() -> None:
    k, built = _fake_region(generic=True)
    k([torch.randn(2, 3)])
    k([torch.randn(2, 3, dtype=torch.float64)])
    k([torch.randn(3, 3, dtype=torch.float64)])
    assert len(built) == 2 and st_torch.stats().hits == 1


def test_static_regions_count_one_selection_and_build_each() -> None:
    torch.manual_seed(0)
    m = torch_block()
    c = torch.compile(m, backend="stitchtune", options={"db": None, "fallback": "eager", "cpu": "reference"})
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 4, 16)
            assert torch.allclose(c(x), m(x), atol=1e-5)
    s = st_torch.stats()
    assert len(s.regions) == 2 and not any(r.dynamic for r in s.regions)
    assert (s.selections, s.builds, s.hits, s.eager) == (2, 2, 0, 0)


def test_symbolic_regions_count_one_generic_build_per_bucket() -> None:
    torch.manual_seed(0)
    m = torch_block()
    c = torch.compile(m, backend="stitchtune", dynamic=True,
                      options={"db": None, "fallback": "eager", "cpu": "reference"})
    with torch.no_grad():
        for b in (5, 6, 5, 5):   # one bucket (2-32)
            x = torch.randn(b, 4, 16)
            assert torch.allclose(c(x), m(x), atol=1e-5)
    s = st_torch.stats()
    assert len(s.regions) == 2 and all(r.dynamic for r in s.regions)
    # per region: one selection at the example shapes, then one selection and build for the bucket
    assert [(r.selections, r.builds, r.hits, r.eager) for r in s.regions] == [(2, 1, 3, 0)] * 2
    assert "2 kernel(s) built, 4 schedule selection(s), 6 cache hit(s)" in str(s)
    st_torch.reset_stats()
    assert st_torch.stats().regions == ()


def test_explain_reports_the_counts_of_its_call() -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        e = torch_backend.explain(torch_block(), torch.randn(2, 4, 16), db=None, fallback="eager", cpu="reference")
    assert (e.stats.builds, e.stats.selections, e.stats.hits) == (2, 2, 0)
    assert str(e).endswith("2 kernel(s) built, 2 schedule selection(s), 0 cache hit(s), 0 eager call(s) "
                           "over 2 region(s)")


def test_a_region_declined_after_its_selection_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from stitchtune.errors import StitchtuneError

    real = torch_backend._compile_region

    def flaky(region: Any, *a: Any) -> Any:
        k = real(region, *a)   # selected and made, then refused
        if "aten.gelu" in region.ops:
            raise StitchtuneError("refused after selection")
        return k

    monkeypatch.setattr(torch_backend, "_compile_region", flaky)
    torch.manual_seed(0)
    m = torch_block()
    c = torch.compile(m, backend="stitchtune", options={"db": None, "fallback": "eager", "cpu": "reference"})
    with torch.no_grad():
        x = torch.randn(2, 4, 16)
        assert torch.allclose(c(x), m(x), atol=1e-5)
    s = st_torch.stats()
    assert [(r.selections, r.builds, r.declined) for r in s.regions] == [
        (1, 1, None), (1, 1, "StitchtuneError: refused after selection")]
    assert str(s).splitlines()[-1].endswith("declined: StitchtuneError: refused after selection")
