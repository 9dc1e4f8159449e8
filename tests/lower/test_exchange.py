"""The one exchange path (``stitchtune.lower.exchange``) over the row family's layout
(``stitchtune.lower.row_exchange.RowExchange``), driven through the fake kernel builder of
``helpers.lowering`` (an ``ExchangeBuilder``): what each scheme emits for a one-slot state and for a Welford
state (the statement kinds and counts the scheme's declaration implies), and the shared steps (``meet``,
``combine_partials``) with a planted layout. End to end, every scheme is emulated by
``tests/lower/test_scheme_contract.py``; that the kernels are the ones recorded is pinned by
``tests/lower/test_kernel_hashes.py``."""

from __future__ import annotations

import dataclasses

import pytest

from helpers.lowering import FakeStateBuilder, fake_row_builder
from stitchtune.graph.ops import OPS
from stitchtune.ir import kir
from stitchtune.ir.kir import I32
from stitchtune.lower.builder import ExchangeBuilder, RowIndex
from stitchtune.lower.exchange import Body, StateGroup, combine_partials, exchange, meet
from stitchtune.lower.row_exchange import RowExchange
from stitchtune.lower.single_pass import new_state
from stitchtune.lower.state import PlainState, ReductionState
from stitchtune.plan.single_pass import SinglePassCandidate
from stitchtune.space import SCHEMES


def _count(stmts: list[kir.Stmt], kind: type) -> int:
    return sum(1 for st in kir.walk(tuple(stmts)) if isinstance(st, kind))


def _exprs(stmts: list[kir.Stmt], kind: type) -> int:
    """Expression nodes of ``kind`` in the statements (shuffles, remote loads)."""

    def count(x: object) -> int:
        if isinstance(x, tuple):
            return sum(count(y) for y in x)
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            inner = sum(count(getattr(x, f.name)) for f in dataclasses.fields(x))
            return inner + int(isinstance(x, kind))
        return 0

    return sum(count(st) for st in kir.walk(tuple(stmts)))


def _plain(k: FakeStateBuilder[RowIndex]) -> PlainState:
    return PlainState("r", k.var("acc"), OPS["reduce_sum"])


def _welford(k: FakeStateBuilder[RowIndex]) -> ReductionState:
    return new_state(SinglePassCandidate("welford", 0, "m", "v", "x"), k.var)


def _row_exchange(k: FakeStateBuilder[RowIndex], states: list[ReductionState], scheme: str) -> None:
    exchange(k, RowExchange(k), [(st,) for st in states], SCHEMES[scheme])


def test_the_fake_is_an_exchange_builder() -> None:
    k: ExchangeBuilder = fake_row_builder(32, 256)  # (checked by mypy: the fake implements the Protocol)
    assert k.rows_per_block == 8


@pytest.mark.parametrize("tpr", [4, 16, 32])
def test_local_is_the_shuffle_tree_only(tpr: int) -> None:
    k = fake_row_builder(tpr, 256)
    _row_exchange(k, [_plain(k)], "local")
    assert _exprs(k.rb, kir.Shfl) == tpr.bit_length() - 1
    assert _count(k.rb, kir.Barrier) == 0 and not k.parts


def test_regional_meets_in_shared_memory_once_per_state_slot() -> None:
    k = fake_row_builder(128, 256)  # 4 warps per row, 2 rows per block
    _row_exchange(k, [_plain(k), _plain(k)], "regional")
    stores = [st for st in k.rb if isinstance(st, kir.StoreVec)]
    assert len(stores) == 2 and all(st.buf == "sred" for st in stores)
    assert _count(k.rb, kir.Barrier) == 2
    loads = _exprs(k.rb, kir.Load)
    assert loads == 2 * 4  # every warp's slot, unrolled, for both states
    k2 = fake_row_builder(128, 256)
    _row_exchange(k2, [_welford(k2)], "regional")
    assert len([st for st in k2.rb if isinstance(st, kir.StoreVec)]) == 4  # n, mean, M2, shift


@pytest.mark.parametrize("name", ["global", "independent"])
def test_split_partials(name: str) -> None:
    k = fake_row_builder(1024, 1024, split=4)
    _row_exchange(k, [_welford(k)], name)
    assert k.parts[:3] == ["part0", "part1", "pshift0"]  # the stored slots (the count follows from the split)
    scheme = SCHEMES[name]
    assert _count(k.rb, kir.GridSync) == int(scheme.grid_barrier)
    assert len(k.parts) == (6 if scheme.grid_barrier else 3)  # combined again after the barrier


def test_cluster_exchanges_through_dsmem() -> None:
    k = fake_row_builder(512, 512, split=4)
    _row_exchange(k, [_plain(k), _welford(k)], "cluster")
    assert _count(k.rb, kir.ClusterSync) == 2
    assert _exprs(k.rb, kir.RemoteLoad) == 4 * (1 + 4)  # every rank's slots, for both states
    assert not k.parts


@pytest.mark.parametrize("combine", ["thread", "warp"])
def test_combine_partials_loads_every_split(combine: str) -> None:
    k = fake_row_builder(256, 256, split=8, combine=combine)
    combine_partials(k, RowExchange(k), (_plain(k),))
    loads = _exprs(k.rb, kir.Load)
    assert loads == (8 if combine == "thread" else 1)  # the lanes of a warp load them together
    assert _exprs(k.rb, kir.Shfl) == (0 if combine == "thread" else 5)
    assert _exprs(k.rb, kir.Select) == (0 if combine == "thread" else 1)  # lanes past the split merge nothing


@dataclasses.dataclass
class _Place:
    """A planted meeting of ``n`` holders that records what it was asked."""

    n: int
    asked: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)

    def store(self, slot: int, j: int, value: kir.Expr) -> kir.Stmt:
        self.asked.append(("store", slot, j))
        return kir.StoreVec("place", kir.Const(slot, I32), (value,))

    def load(self, slot: int, peer: kir.Expr, j: int) -> kir.Expr:
        self.asked.append(("load", slot, j))
        return kir.Load("place", kir.Const(slot, I32))

    def sync(self) -> kir.Stmt:
        return kir.Barrier()

    def peers(self, body: Body) -> list[kir.Stmt]:
        return [st for p in range(self.n) for st in body(kir.Const(p, I32))]


def test_meet_numbers_the_slots_of_all_groups_in_order() -> None:
    k = fake_row_builder(32, 256)
    g: StateGroup = (_welford(k), _welford(k))   # two states of one reduction (a column thread's vec 2)
    h: StateGroup = (_plain(k), _plain(k))
    place = _Place(3)
    meet(k, place, [g, h])
    stores = [a for a in place.asked if a[0] == "store"]
    assert stores == [("store", i, j) for i in range(4) for j in range(2)] + [("store", 4, 0), ("store", 4, 1)]
    assert len([a for a in place.asked if a[0] == "load"]) == 3 * (2 * 4 + 2)   # every peer's slots
    assert [type(st) for st in k.rb].count(kir.Barrier) == 2
