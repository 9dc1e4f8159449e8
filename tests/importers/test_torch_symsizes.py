"""The SymInt-size pre-pass (:mod:`stitchtune.importers.torch_symsizes`, issue 41): an op reading a
SymInt as a *size* (``arange(S)``, ``full([1, 2, L, 16], 0)``) gets a carrier ``empty([S], bool)``; the
region finder then stitches the op, the region reading the carrier as an input (``S`` its extent) and
computing ``sym_size(carrier, 0)`` in its module. No-op symbolic views (``expand(m, [1, -1, 1, L])`` of a
``[1, 1, 1, L]`` mask) and whole-dim slices are their input. The rewritten graph computes what the
original did."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from stitchtune.importers.torch_fx_util import op_key  # noqa: E402
from stitchtune.importers.torch_regions import find_regions  # noqa: E402
from stitchtune.importers.torch_symsizes import carrier_of, is_carrier, sym_sizes  # noqa: E402
from stitchtune.importers.torch_symvalues import bound_inputs  # noqa: E402


def _positions(q: Any, inv: Any) -> Any:
    """A prompt's rotary angles from ``arange(S)`` (S = q's length), applied to q."""
    ang = torch.arange(q.shape[2]).float()[:, None] * inv[None, :]
    return q * ang.cos()


def _mask(x: Any, past: Any) -> Any:
    """A decode step's causal mask over a static cache of ``L`` positions (L = x's last dim)."""
    L = x.shape[-1]
    m = (torch.arange(L)[None, None, None, :] <= past.view(1, 1, 1, 1)).expand(1, -1, 1, L)
    return torch.where(m, 0.0, float("-inf"))


def _zeros(k: Any) -> Any:
    """A static cache's lazy zeros of a symbolic length, and a value read from them."""
    z = torch.full((1, 2, k.shape[0], 16), 0.0)
    return z, z + 1


CASES = {
    "positions": (_positions, lambda n: (torch.randn(1, 2, n, 8), torch.rand(8))),
    "mask": (_mask, lambda n: (torch.zeros(1, 1, 1, n), torch.tensor(n // 2))),
    "zeros": (_zeros, lambda n: (torch.randn(n),)),
}


def _traced(name: str) -> Any:
    fn, args = CASES[name]
    return make_fx(fn, tracing_mode="symbolic")(*args(7))


def _sized_declines(split: Any) -> list[Any]:
    return [d for d in split.declined if "SymInt" in d.reason or "constant tensor" in d.reason
            or d.what in ("op aten.arange", "op aten.full", "op prims.iota", "op aten.le", "op aten.expand")]


@pytest.mark.parametrize("name", sorted(CASES))
def test_carriers_are_added_and_the_graph_computes_the_same(name: str) -> None:
    gm = _traced(name)
    new = sym_sizes(gm)
    assert new is not None
    carriers = [n for n in new.graph.nodes if is_carrier(n)]
    assert carriers and all(isinstance(c.args[0][0].meta["val"], torch.SymInt) for c in carriers)
    assert all(carrier_of(c.args[0][0]) is c for c in carriers)
    assert not any(is_carrier(n) for n in gm.graph.nodes)   # gm itself untouched
    fn, args = CASES[name]
    for n in (3, 9):
        a = args(n)
        got, want = new(*a), fn(*a)
        for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_region_finder_stitches_the_sized_op_reading_the_carrier(name: str) -> None:
    before = find_regions(_traced(name))
    assert _sized_declines(before), before.declined
    split = find_regions(sym_sizes(_traced(name)))
    assert not _sized_declines(split), split.declined
    sized = [r for r in split.regions if {"aten.arange", "aten.full"} & set(r.ops)]
    assert sized, [r.ops for r in split.regions]
    for r in sized:   # the carrier is an input the call makes (shape None), its size read in the module
        assert any(shape is None for _, shape, _ in bound_inputs(r.inputs)), r.inputs
        assert any(n.op == "call_function" and op_key(n.target) == "aten.sym_size" for n in r.module.graph.nodes)


def test_the_mask_and_its_where_are_one_region() -> None:
    """``le`` (a bool output) and the ``where`` that reads it through a no-op ``expand`` are one region,
    not a region of bool outputs declined and a ``where`` reading the mask from memory."""
    def joined(split: Any) -> list[Any]:
        return [r for r in split.regions if "aten.le" in r.ops and "aten.where" in r.ops]

    assert not joined(find_regions(_traced("mask")))
    split = find_regions(sym_sizes(_traced("mask")))
    assert joined(split), [r.ops for r in split.regions]
    assert not [d for d in split.declined if "bool" in d.reason], split.declined


def test_a_graph_without_symint_sizes_is_left_alone() -> None:
    gm = make_fx(lambda x: x * 2 + torch.arange(3), tracing_mode="fake")(torch.ones(3))
    assert sym_sizes(gm) is None
