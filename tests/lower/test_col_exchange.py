"""The column family's exchange (``stitchtune.lower.col_exchange``) driven through a fake kernel builder
that implements the ``ColExchangeBuilder`` Protocol: what each scheme emits for the ``vec`` one-slot
states of a reduction and for multi-slot (Welford) states. That the column kernels it builds are the
ones recorded is pinned by ``tests/lower/test_kernel_hashes.py``; end to end, every scheme is emulated
by the column tests of ``tests/lower`` and ``tests/emulate``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from stitchtune.graph.ops import OPS
from stitchtune.ir import kir
from stitchtune.ir.kir import F32, I32, Var
from stitchtune.lower.col_exchange import ColExchangeBuilder, ColIndex, ColState, exchange
from stitchtune.lower.single_pass import new_state
from stitchtune.lower.state import PlainState, ReductionState
from stitchtune.plan.single_pass import SinglePassCandidate
from stitchtune.space import SCHEMES


class FakeColKernel:
    """A column kernel builder reduced to what the column exchange uses."""

    def __init__(self, tpr: int, block: int, vec: int, split: int = 1) -> None:
        self.rb: list[kir.Stmt] = []
        v = [Var(n, I32) for n in ("tc", "tk", "rd", "tile", "sidx", "c")]
        self.ix = ColIndex(*v, Var("cv", kir.BOOL), Var("kb", I32), Var("ke", I32), Var("task", I32), v[5])
        self._s = SimpleNamespace(tpr=tpr, block=block, vec=vec, split=split)
        self._p = SimpleNamespace(M=1000, N=512)
        self.n = 0
        self.parts: list[str] = []

    @property
    def schedule(self) -> Any:
        return self._s

    @property
    def plan(self) -> Any:
        return self._p

    @property
    def chunk(self) -> int:
        return -(-self._p.M // self._s.split)

    @property
    def tile_cols(self) -> int:
        return self._s.block // self._s.tpr * self._s.vec

    def var(self, prefix: str, dtype: str = F32) -> Var:
        self.n += 1
        return Var(f"{prefix}{self.n}", dtype)

    def emit(self, *stmts: kir.Stmt) -> None:
        self.rb.extend(stmts)

    def state_parts(self, st: ReductionState) -> tuple[str, ...]:
        names = st.part_names({"r": 0, "m": 0, "v": 1})
        self.parts += [n for n in names if n not in self.parts]
        return names


def _plain(k: FakeColKernel) -> ColState:
    return tuple(PlainState("r", k.var("acc"), OPS["reduce_sum"]) for _ in range(k.schedule.vec))


def _welford(k: FakeColKernel) -> ColState:
    return tuple(new_state(SinglePassCandidate("welford", 0, "m", "v", "x"), k.var) for _ in range(k.schedule.vec))


def _slot_base(st: kir.StoreVec) -> int:
    """The constant slot offset of an ``sred`` store (``I(slot * tpr * TC) + ...``; slot 0's is folded away)."""
    assert isinstance(st.index, kir.Bin)
    return int(st.index.a.value) if isinstance(st.index.a, kir.Const) else 0


def test_the_fake_is_a_col_exchange_builder() -> None:
    k: ColExchangeBuilder = FakeColKernel(4, 256, 2)  # (checked by mypy: the fake implements the Protocol)
    assert k.tile_cols == 128


def test_local_exchanges_nothing() -> None:
    k = FakeColKernel(1, 256, 4)
    exchange(k, [_plain(k)], SCHEMES["local"])
    assert k.rb == [] and not k.parts


def test_regional_meets_in_shared_memory_per_reduction_and_column() -> None:
    k = FakeColKernel(4, 256, 2)
    exchange(k, [_plain(k), _plain(k)], SCHEMES["regional"])
    stores = [st for st in k.rb if isinstance(st, kir.StoreVec)]
    assert len(stores) == 4 and all(st.buf == "sred" for st in stores)
    assert sorted({_slot_base(st) for st in stores}) == [0, 4 * 128]   # one slot per reduction
    loops = [st for st in k.rb if isinstance(st, kir.For)]
    assert [lp.stop for lp in loops] == [kir.Const(4, I32)] * 2         # a loop over the row threads
    assert all(len(lp.body) == 2 for lp in loops)                        # one merge per column
    assert sum(isinstance(st, kir.Barrier) for st in k.rb) == 2 and not k.parts


def test_multi_slot_states_keep_a_slot_each() -> None:
    k = FakeColKernel(4, 256, 2)
    g, h = _welford(k), _welford(k)
    exchange(k, [g, h], SCHEMES["regional"])
    stores = [st for st in k.rb if isinstance(st, kir.StoreVec)]
    n = len(g[0].vars)
    assert n > 1 and len(stores) == 2 * n * 2                   # (2 states x n slots x 2 columns)
    assert sorted({_slot_base(st) for st in stores}) == [i * 4 * 128 for i in range(2 * n)]


def test_global_stores_partials_then_combines_them_after_the_grid_barrier() -> None:
    k = FakeColKernel(4, 256, 4, split=8)
    exchange(k, [_plain(k)], SCHEMES["global"])
    sync = next(i for i, st in enumerate(k.rb) if isinstance(st, kir.GridSync))
    before, after = k.rb[:sync], k.rb[sync + 1:]
    assert [st.buf for st in before if isinstance(st, kir.StoreVec) and st.buf != "sred"] == ["part0"]
    loop = next(st for st in after if isinstance(st, kir.For))
    assert loop.stop == kir.Const(8, I32) and k.parts == ["part0"]


def test_independent_stores_partials_only() -> None:
    k = FakeColKernel(1, 256, 4, split=8)
    exchange(k, [_plain(k)], SCHEMES["independent"])
    assert [type(st) for st in k.rb] == [kir.StoreVec] and k.parts == ["part0"]
