"""The one exchange path (``stitchtune.lower.exchange``) driven through a fake kernel builder that implements
the ``ExchangeBuilder`` Protocol: what each scheme emits for a one-slot state and for a Welford state (the
statement kinds and counts the scheme's declaration implies). End to end, every scheme is emulated by
``tests/lower/test_scheme_contract.py``."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from stitchtune.graph.ops import OPS
from stitchtune.ir import kir
from stitchtune.ir.kir import F32, I32, Var
from stitchtune.lower.builder import ExchangeBuilder, RowIndex
from stitchtune.lower.exchange import combine_partials, exchange
from stitchtune.lower.single_pass import new_state
from stitchtune.lower.state import PlainState, ReductionState
from stitchtune.plan.single_pass import SinglePassCandidate
from stitchtune.space import SCHEMES


class FakeSchedule(SimpleNamespace):
    """The fields of a ``Schedule`` the exchange reads, and its typed option read (``option(COMBINE)``)."""

    def option(self, opt: Any) -> Any:
        return getattr(self, opt if isinstance(opt, str) else opt.name)


class FakeKernel:
    """A kernel builder reduced to what the exchange uses (an ``ExchangeBuilder``)."""

    def __init__(self, tpr: int, block: int, split: int = 1, combine: str = "thread") -> None:
        self.rb: list[kir.Stmt] = []
        self.ix = RowIndex(Var("lane", I32), Var("rib", I32), Var("rd", I32), Var("row", I32), Var("sidx", I32),
                           Var("rv", kir.BOOL), Var("kb", I32), Var("ke", I32))
        self._s = FakeSchedule(tpr=tpr, block=block, split=split, combine=combine)
        self._p = SimpleNamespace(M=64, N=4096)
        self.n = 0
        self.parts: list[str] = []

    @property
    def schedule(self) -> Any:
        return self._s

    @property
    def plan(self) -> Any:
        return self._p

    @property
    def rows_per_block(self) -> int:
        return self._s.block // self._s.tpr

    @property
    def chunk(self) -> int:
        return self._p.N // self._s.split

    def var(self, prefix: str, dtype: str = F32) -> Var:
        self.n += 1
        return Var(f"{prefix}{self.n}", dtype)

    def emit(self, *stmts: kir.Stmt) -> None:
        self.rb.extend(stmts)

    def last_row(self) -> kir.Expr:
        return kir.Const(self._p.M - 1, I32)

    def state_parts(self, st: ReductionState) -> tuple[str, ...]:
        names = st.part_names({"r": 0, "m": 0, "v": 1})
        self.parts += names
        return names


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


def _plain(k: FakeKernel) -> PlainState:
    return PlainState("r", k.var("acc"), OPS["reduce_sum"])


def _welford(k: FakeKernel) -> ReductionState:
    return new_state(SinglePassCandidate("welford", 0, "m", "v", "x"), k.var)


def test_the_fake_is_an_exchange_builder() -> None:
    k: ExchangeBuilder = FakeKernel(32, 256)  # (checked by mypy: the fake implements the Protocol)
    assert k.rows_per_block == 8


@pytest.mark.parametrize("tpr", [4, 16, 32])
def test_local_is_the_shuffle_tree_only(tpr: int) -> None:
    k = FakeKernel(tpr, 256)
    exchange(k, [_plain(k)], SCHEMES["local"])
    assert _exprs(k.rb, kir.Shfl) == tpr.bit_length() - 1
    assert _count(k.rb, kir.Barrier) == 0 and not k.parts


def test_regional_meets_in_shared_memory_once_per_state_slot() -> None:
    k = FakeKernel(128, 256)  # 4 warps per row, 2 rows per block
    exchange(k, [_plain(k), _plain(k)], SCHEMES["regional"])
    stores = [st for st in k.rb if isinstance(st, kir.StoreVec)]
    assert len(stores) == 2 and all(st.buf == "sred" for st in stores)
    assert _count(k.rb, kir.Barrier) == 2
    k2 = FakeKernel(128, 256)
    exchange(k2, [_welford(k2)], SCHEMES["regional"])
    assert len([st for st in k2.rb if isinstance(st, kir.StoreVec)]) == 4  # n, mean, M2, shift


@pytest.mark.parametrize("name", ["global", "independent"])
def test_split_partials(name: str) -> None:
    k = FakeKernel(1024, 1024, split=4)
    exchange(k, [_welford(k)], SCHEMES[name])
    assert k.parts[:3] == ["part0", "part1", "pshift0"]  # the stored slots (the count follows from the split)
    scheme = SCHEMES[name]
    assert _count(k.rb, kir.GridSync) == int(scheme.grid_barrier)
    assert len(k.parts) == (6 if scheme.grid_barrier else 3)  # combined again after the barrier


def test_cluster_exchanges_through_dsmem() -> None:
    k = FakeKernel(512, 512, split=4)
    exchange(k, [_plain(k), _welford(k)], SCHEMES["cluster"])
    assert _count(k.rb, kir.ClusterSync) == 2
    assert _exprs(k.rb, kir.RemoteLoad) == 4 * (1 + 4)  # every rank's slots, for both states
    assert not k.parts


@pytest.mark.parametrize("combine", ["thread", "warp"])
def test_combine_partials_loads_every_split(combine: str) -> None:
    k = FakeKernel(256, 256, split=8, combine=combine)
    st = _plain(k)
    combine_partials(k, st)
    loads = _exprs(k.rb, kir.Load)
    assert loads == (8 if combine == "thread" else 1)  # the lanes of a warp load them together
    assert _exprs(k.rb, kir.Shfl) == (0 if combine == "thread" else 5)
