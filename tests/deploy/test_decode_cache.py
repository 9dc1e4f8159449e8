"""A KV cache's concat under ``torch.compile(dynamic=True)`` (issue 41, item 2): GPT-2's split of the
fused qkv, the head split of k and v and their concat to the past keys / values along the sequence
axis. The region also returns q's view of the fused qkv (a no-op view: an *alias*); that view was
returned by its fake result too, so the region was declined at every step ("cat: [1, 1, 192] where
PyTorch has [1, 4, s + 1, 16]"), and its outputs' extent ``s + 1`` (a symbol plus one) kept it from a
graph with named dims. Now it is stitched; values and strides equal eager's at every past length."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stitchtune.torch as st_torch  # noqa: E402
from stitchtune.deploy import torch_backend  # noqa: E402
from stitchtune.importers.torch_symbolic import _extent, _offset_names  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_backend")


def _attention_inputs(x: Any, w: Any, b: Any, pk: Any, pv: Any) -> tuple[Any, Any, Any]:
    qkv = torch.addmm(b, x.view(-1, 64), w).view(1, 1, 192)
    q, k, v = qkv.split(64, dim=2)
    q = q.view(1, 1, 4, 16).transpose(1, 2)
    k = torch.cat([pk, k.view(1, 1, 4, 16).transpose(1, 2)], dim=-2)
    v = torch.cat([pv, v.view(1, 1, 4, 16).transpose(1, 2)], dim=-2)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v), k, v


def test_offset_output_dims_are_named_and_evaluated() -> None:
    va, vb = {"d0": 1009, "d1": 1013}, {"d0": 1051, "d1": 1061}
    # a static 1024 (near the probes) stays static; s, s + 1 and t - 1 are named
    assert _offset_names(((1024, 1009, 1010, 1012),), ((1024, 1051, 1052, 1060),), va, vb) == \
        ((1024, "d0", "d0+1", "d1-1"),)
    assert _offset_names(((2018,),), ((2102,),), va, vb) is None   # 2 * d0: no symbol plus an offset
    assert _extent("d0+1", {"d0": 7}) == 8 and _extent("d1-1", {"d1": 7}) == 6 and _extent("d0", {"d0": 7}) == 7
    # a chunked prefill's cache: past and new positions, two symbols summed (plus an offset)
    assert _offset_names(((2022, 2023),), ((2112, 2113),), va, vb) == (("d0+d1", "d0+d1+1"),)
    assert _extent("d0+d1", {"d0": 7, "d1": 3}) == 10 and _extent("d0+d1-2", {"d0": 7, "d1": 3}) == 8


def test_the_cache_concat_region_is_stitched_and_equal_to_eager() -> None:
    torch.manual_seed(0)
    x, w, b = torch.randn(1, 1, 64), torch.randn(64, 192), torch.randn(192)
    c = torch.compile(_attention_inputs, backend="stitchtune", dynamic=True, options={"db": None, "fallback": "eager"})
    with torch.no_grad():
        for past in (5, 6, 9):
            pk, pv = torch.randn(1, 4, past, 16), torch.randn(1, 4, past, 16)
            got, want = c(x, w, b, pk, pv), _attention_inputs(x, w, b, pk, pv)
            for g, e in zip(got, want):
                assert g.shape == e.shape and g.stride() == e.stride(), past
                assert (g - e).abs().max().item() < 1e-5, past
    declined = [d for r in torch_backend.LAST_REPORTS for d in r.declined if d.what.startswith("region")]
    assert not declined, declined
    stitched = [s for r in torch_backend.LAST_REPORTS for s in r.stitched]
    assert any("aten.cat" in s.ops for s in stitched)
    assert st_torch.stats().eager == 0


def test_kernels_per_extent_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a bucket has no generic kernel (refused here: the key and value concats now get one,
    tests/deploy/test_torch_dynamic_kv_pair.py), past lengths beyond MAX_SPECIALISED kernels run the
    region's ATen ops instead of building a kernel per decode step; the values stay eager's."""
    from stitchtune.deploy import dynamic, torch_dynamic
    from stitchtune.graph.dynamic import DynamicRefusal

    monkeypatch.setattr(torch_dynamic, "MAX_SPECIALISED", 2)
    monkeypatch.setattr(dynamic, "compile_dynamic", lambda *a, **k: DynamicRefusal("test", "no generic kernel"))
    torch.manual_seed(0)
    x, w, b = torch.randn(1, 1, 64), torch.randn(64, 192), torch.randn(192)
    c = torch.compile(_attention_inputs, backend="stitchtune", dynamic=True, options={"db": None, "fallback": "eager"})
    with torch.no_grad():
        for past in (5, 6, 9, 12):
            pk, pv = torch.randn(1, 4, past, 16), torch.randn(1, 4, past, 16)
            for g, e in zip(c(x, w, b, pk, pv), _attention_inputs(x, w, b, pk, pv)):
                assert g.shape == e.shape and (g - e).abs().max().item() < 1e-5, past
    [r] = [r for r in st_torch.stats().regions if r.dynamic]
    assert r.builds == 2 and r.eager == 2, r


def test_slices_of_a_symbolic_axis_are_written_from_its_end() -> None:
    """At the probe extents (1009 positions) ``x[:, 1:]``, ``x[:, :-1]`` and ``x[:, -3:]`` become
    ``1:null``, ``0:-1`` and ``-3:null`` (one template for both probe sets); a slice of a static axis
    keeps its bounds."""
    from stitchtune.graph.parse import parse_graph
    from stitchtune.importers.torch_symbolic import _slices_from_end

    def sl(i: str, axis: int, start: int, stop: int) -> dict[str, object]:
        return {"id": i, "op": "slice", "args": ["x"], "axis": axis, "start": start, "stop": stop}

    g = parse_graph({"name": "s", "inputs": {"x": {"shape": [2, 1009, 16], "dtype": "float32"}},
                     "nodes": [sl("a", 1, 1, 1009), sl("b", 1, 0, 1008), sl("c", 1, 1006, 1009), sl("d", 2, 0, 8)],
                     "outputs": ["a", "b", "c", "d"]})
    got = {n["id"]: (n["start"], n["stop"]) for n in _slices_from_end(g, {1009: "d0"})["nodes"]}
    assert got == {"a": (1, None), "b": (0, -1), "c": (-3, None), "d": (0, 8)}
