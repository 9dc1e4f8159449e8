"""The one exchange path (``stitchtune.lower.exchange``) over the column family's layout
(``stitchtune.lower.col_exchange.ColExchange``), driven through the fake kernel builder of
``helpers.lowering`` (a ``ColExchangeBuilder``): what each scheme emits for the ``vec`` one-slot states of
a reduction and for multi-slot (Welford) states. That the column kernels it builds are the ones recorded
is pinned by ``tests/lower/test_kernel_hashes.py``; end to end, every scheme is emulated by the column
tests of ``tests/lower`` and ``tests/emulate``."""

from __future__ import annotations

import pytest

from helpers.lowering import FakeStateBuilder, fake_col_builder
from stitchtune.graph.ops import OPS
from stitchtune.ir import kir
from stitchtune.ir.kir import I32
from stitchtune.lower.col_exchange import ColExchange, ColExchangeBuilder, ColIndex, ColState
from stitchtune.lower.exchange import exchange
from stitchtune.lower.single_pass import new_state
from stitchtune.lower.state import PlainState
from stitchtune.plan.single_pass import SinglePassCandidate
from stitchtune.space import SCHEMES


def _plain(k: FakeStateBuilder[ColIndex]) -> ColState:
    return tuple(PlainState("r", k.var("acc"), OPS["reduce_sum"]) for _ in range(k.schedule.vec))


def _welford(k: FakeStateBuilder[ColIndex]) -> ColState:
    return tuple(new_state(SinglePassCandidate("welford", 0, "m", "v", "x"), k.var) for _ in range(k.schedule.vec))


def _col_exchange(k: FakeStateBuilder[ColIndex], groups: list[ColState], scheme: str) -> None:
    exchange(k, ColExchange(k), groups, SCHEMES[scheme])


def _slot_base(st: kir.StoreVec) -> int:
    """The constant slot offset of an ``sred`` store (``I(slot * tpr * TC) + ...``; slot 0's is folded away)."""
    assert isinstance(st.index, kir.Bin)
    return int(st.index.a.value) if isinstance(st.index.a, kir.Const) else 0


def test_the_fake_is_a_col_exchange_builder() -> None:
    k: ColExchangeBuilder = fake_col_builder(4, 256, 2)  # (checked by mypy: the fake implements the Protocol)
    assert k.tile_cols == 128


def test_local_exchanges_nothing() -> None:
    k = fake_col_builder(1, 256, 4)
    _col_exchange(k, [_plain(k)], "local")
    assert k.rb == [] and not k.parts


def test_regional_meets_in_shared_memory_per_reduction_and_column() -> None:
    k = fake_col_builder(4, 256, 2)
    _col_exchange(k, [_plain(k), _plain(k)], "regional")
    stores = [st for st in k.rb if isinstance(st, kir.StoreVec)]
    assert len(stores) == 4 and all(st.buf == "sred" for st in stores)
    assert all(st.pred is None for st in stores)                         # every row thread writes
    assert sorted({_slot_base(st) for st in stores}) == [0, 4 * 128]   # one slot per reduction
    loops = [st for st in k.rb if isinstance(st, kir.For)]
    assert [lp.stop for lp in loops] == [kir.Const(4, I32)] * 2         # a loop over the row threads
    assert all(len(lp.body) == 2 for lp in loops)                        # one merge per column
    assert sum(isinstance(st, kir.Barrier) for st in k.rb) == 2 and not k.parts


def test_regional_with_one_row_thread_exchanges_nothing() -> None:
    k = fake_col_builder(1, 256, 4)
    _col_exchange(k, [_plain(k)], "regional")
    assert k.rb == []


def test_multi_slot_states_keep_a_slot_each() -> None:
    k = fake_col_builder(4, 256, 2)
    g, h = _welford(k), _welford(k)
    _col_exchange(k, [g, h], "regional")
    stores = [st for st in k.rb if isinstance(st, kir.StoreVec)]
    n = len(g[0].vars)
    assert n > 1 and len(stores) == 2 * n * 2                   # (2 states x n slots x 2 columns)
    assert sorted({_slot_base(st) for st in stores}) == [i * 4 * 128 for i in range(2 * n)]


def test_global_stores_partials_then_combines_them_after_the_grid_barrier() -> None:
    k = fake_col_builder(4, 256, 4, split=8)
    _col_exchange(k, [_plain(k)], "global")
    sync = next(i for i, st in enumerate(k.rb) if isinstance(st, kir.GridSync))
    before, after = k.rb[:sync], k.rb[sync + 1:]
    stored = [st for st in before if isinstance(st, kir.StoreVec) and st.buf != "sred"]
    assert [st.buf for st in stored] == ["part0"] and len(stored[0].values) == 4   # the vec columns at once
    loop = next(st for st in after if isinstance(st, kir.For))
    # the 4 row threads share the 8 partials: two each (split indices tk and tk + 4), then meet in sred
    assert loop.stop == kir.Const(2, I32) and k.parts == ["part0", "part0"]
    assert [len(st.dsts) for st in loop.body if isinstance(st, kir.LoadVec)] == [4]  # one load of the vec partials
    assert k.ix.tk in set(kir.exprs(next(st for st in loop.body if isinstance(st, kir.LoadVec))))
    met = after[after.index(loop) + 1:]
    assert sum(isinstance(st, kir.Barrier) for st in met) == 2
    assert [st.buf for st in met if isinstance(st, kir.StoreVec)] == ["sred"] * 4   # the vec columns' states


def test_one_row_thread_combines_every_partial_itself() -> None:
    k = fake_col_builder(1, 256, 4, split=8)
    _col_exchange(k, [_plain(k)], "global")
    loop = next(st for st in k.rb if isinstance(st, kir.For))
    assert loop.stop == kir.Const(8, I32) and not any(isinstance(st, kir.Barrier) for st in k.rb)


def test_row_threads_past_a_short_split_merge_the_identity() -> None:
    k = fake_col_builder(8, 256, 4, split=4)   # 8 row threads, 4 partials: threads 4..7 have none
    _col_exchange(k, [_plain(k)], "global")
    sync = next(i for i, st in enumerate(k.rb) if isinstance(st, kir.GridSync))
    loop = next(st for st in k.rb[sync + 1:] if isinstance(st, kir.For))
    assert loop.stop == kir.Const(1, I32)
    (ld,) = [st for st in loop.body if isinstance(st, kir.LoadVec)]
    assert ld.pred is not None and any(isinstance(e, kir.Bin) and e.op == "<" and e.b == kir.Const(4, I32)
                                       for e in kir.exprs(ld))
    assert any(isinstance(e, kir.Select) for st in loop.body for e in kir.exprs(st))   # else the identity


def test_independent_stores_partials_only() -> None:
    k = fake_col_builder(1, 256, 4, split=8)
    _col_exchange(k, [_plain(k)], "independent")
    assert [type(st) for st in k.rb] == [kir.StoreVec] and k.parts == ["part0"]


def test_columns_have_no_cluster() -> None:
    with pytest.raises(AssertionError, match="row family"):
        ColExchange(fake_col_builder(4, 256, 2)).cluster_meeting()
