"""The SymInt-value pre-pass (:mod:`stitchtune.importers.torch_symvalues`, issue 41): a decode step's
positions ``arange(1) + past`` read through a bound tensor ``full([1], past)``, an ``iota`` with a
SymInt start as ``iota + full([], start)``; the rewritten graph computes what the original did, and
the region finder then stitches those ops with the embedding that reads them (the bound tensor is a
region input)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from stitchtune.importers.torch_regions import find_regions  # noqa: E402
from stitchtune.importers.torch_symvalues import bound_inputs, is_bound, sym_values  # noqa: E402


def _step(ids: Any, cache: Any, wpe: Any) -> tuple[Any, Any]:
    past = cache.shape[1]
    pos = torch.arange(1) + past
    h = torch.nn.functional.embedding(pos.unsqueeze(0), wpe) * 2.0
    wide = torch.arange(past, past + 3) * 2                  # an iota with a SymInt start
    return h, wide


def _args(p: int) -> tuple[Any, ...]:
    return torch.tensor([[1]]), torch.zeros(1, p, 8), torch.randn(32, 8, generator=torch.Generator().manual_seed(0))


def _traced() -> Any:
    return make_fx(_step, tracing_mode="symbolic")(*_args(5))


def test_symint_values_become_bound_tensors_with_the_same_values() -> None:
    gm = _traced()
    new = sym_values(gm)
    assert new is not None
    bound = [n for n in new.graph.nodes if is_bound(n)]
    assert bound and all(isinstance(n.args[1].meta["val"], torch.SymInt) for n in bound)
    assert not any(is_bound(n) for n in gm.graph.nodes)   # gm itself untouched
    for p in (3, 9):
        for got, want in zip(new(*_args(p)), _step(*_args(p))):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            assert got.dtype == want.dtype


def test_the_region_finder_stitches_them_reading_the_bound_tensor() -> None:
    before = find_regions(_traced())
    assert any("SymInt" in d.reason for d in before.declined), before.declined
    split = find_regions(sym_values(_traced()))
    assert not [d for d in split.declined if "SymInt" in d.reason or "embedding" in d.what], split.declined
    ins = [bound_inputs(r.inputs) for r in split.regions]
    assert any(b for b in ins), ins
    ops = {op for r in split.regions for op in r.ops}
    assert "aten.embedding" in ops, ops


def test_a_graph_without_symint_values_is_left_alone() -> None:
    gm = make_fx(lambda x: x * 2 + 1, tracing_mode="fake")(torch.ones(3))
    assert sym_values(gm) is None


def _prompt(ids: Any, wte: Any, wpe: Any) -> Any:
    """GPT-2's prompt: token rows + the rows of positions ``arange(S)`` (S the prompt's length)."""
    pos = torch.arange(ids.shape[1]).unsqueeze(0)
    return torch.nn.functional.embedding(ids, wte) + torch.nn.functional.embedding(pos, wpe)


def _prompt_args(s: int) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(s)
    return torch.randint(0, 32, (1, s), generator=g), torch.randn(32, 8, generator=g), torch.randn(40, 8, generator=g)


def test_the_rows_of_positions_arange_s_are_a_slice_of_the_table() -> None:
    gm = make_fx(_prompt, tracing_mode="symbolic")(*_prompt_args(7))
    new = sym_values(gm)
    assert new is not None
    keys = [str(n.target) for n in new.graph.nodes if n.op == "call_function"]
    assert sum("embedding" in k for k in keys) == 1 and not any("arange" in k for k in keys), keys
    for s in (1, 5, 40):
        torch.testing.assert_close(new(*_prompt_args(s)), _prompt(*_prompt_args(s)), rtol=0, atol=0)
    before = find_regions(gm)
    assert any("embedding" in d.what or "arange" in d.what or "iota" in d.what for d in before.declined)
    split = find_regions(new)
    assert not [d for d in split.declined if "embedding" in d.what or "arange" in d.what], split.declined


def test_position_rows_returned_by_the_graph_stay_a_gather() -> None:
    """A view of the table must not escape where PyTorch returned a fresh tensor."""
    def f(ids: Any, wpe: Any) -> Any:
        return torch.nn.functional.embedding(torch.arange(ids.shape[1]).unsqueeze(0), wpe)

    gm = make_fx(f, tracing_mode="symbolic")(torch.zeros(1, 5, dtype=torch.int64), torch.randn(40, 8))
    assert sym_values(gm) is None


def test_a_fill_with_a_symint_is_bound() -> None:
    """``full(shape, s)`` (a mask's fill, a count): int -> the bound tensor, float -> its cast."""
    def f(x: Any) -> tuple[Any, Any]:
        s = x.shape[0]
        return torch.full((2, 3), s, dtype=torch.int32) * 2, x + torch.full((1,), s, dtype=torch.float32)

    gm = make_fx(f, tracing_mode="symbolic")(torch.ones(5))
    new = sym_values(gm)
    assert new is not None and sum(is_bound(n) for n in new.graph.nodes) == 2
    for n in (1, 7):
        for got, want in zip(new(torch.ones(n)), f(torch.ones(n))):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            assert got.dtype == want.dtype
    split = find_regions(new)
    assert not [d for d in split.declined if "SymInt" in d.reason], split.declined


def test_arange_one_plus_a_0d_tensor_is_a_view_of_it() -> None:
    """A static cache's decode position ``arange(1) + past`` with ``past`` a 0-d int tensor input: the
    ids are one view of that input, so the position embedding gathers by a graph input's view."""
    def f(past: Any, wpe: Any) -> Any:
        return torch.nn.functional.embedding((torch.arange(1) + past).unsqueeze(0), wpe) * 2.0

    args = (torch.tensor(5), torch.randn(40, 8))
    gm = make_fx(f, tracing_mode="fake")(*args)
    new = sym_values(gm)
    assert new is not None
    assert not any("arange" in str(n.target) or "add" in str(n.target) for n in new.graph.nodes)
    for p in (0, 7, 39):
        torch.testing.assert_close(new(torch.tensor(p), args[1]), f(torch.tensor(p), args[1]), rtol=0, atol=0)
    assert any("embedding" in d.what for d in find_regions(gm).declined)
    split = find_regions(new)
    assert not [d for d in split.declined if "embedding" in d.what], split.declined
    assert any("aten.embedding" in r.ops for r in split.regions)
