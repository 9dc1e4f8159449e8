"""A static cache's write in place (issue 41 item 2, ``stitchtune.deploy.torch_put``): ``cache.index_copy_
(2, arange(start, start + S), new)`` (what transformers' ``StaticCache.update`` does, positions an
``iota`` shifted by a SymInt or a 0-d tensor) becomes one ``stitchtune::put`` call that writes the ``S``
new rows into the cache buffer itself (emulated kernel on the CPU). The buffer after each call, its
strides and its identity equal eager's, a prompt's several positions too; a position outside the cache
raises PyTorch's own error; an ``index_put`` whose base must not change (a functional one on an input)
is not done in place. A tiny Llama with a StaticCache decodes the tokens eager does."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stitchtune.deploy import torch_backend, torch_stats  # noqa: E402
from stitchtune.deploy.torch_put import PUT_INPLACE_OP  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_backend")


@pytest.fixture(autouse=True)
def _no_reports() -> None:
    torch_backend.LAST_REPORTS.clear()

OPTS = {"db": None, "fallback": "eager", "cpu": "emulate"}


class _SymStart(torch.nn.Module):
    """Positions ``arange(start, start + S)`` from an int (a SymInt under ``dynamic=True``)."""

    def __init__(self, rows: int = 16) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 2, rows, 8))

    def forward(self, x: Any, start: int) -> Any:
        self.k.index_copy_(2, torch.arange(start, start + x.shape[2]), x * 2.0)
        return self.k.sum(-1) + 1.0


class _TensorStart(torch.nn.Module):
    """Positions ``arange(S) + start`` from a 0-d int tensor (StaticCache's prompt)."""

    def __init__(self, rows: int = 16) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 2, rows, 8))

    def forward(self, x: Any, start: Any) -> Any:
        self.k.index_copy_(2, torch.arange(x.shape[2]) + start, x + 1.0)
        return self.k * 3.0


def _puts() -> list[Any]:
    return [s for r in torch_backend.LAST_REPORTS for s in r.stitched if s.source == "cache write in place"]


@pytest.mark.parametrize("module,dynamic,fallback", [(_SymStart, False, "eager"), (_SymStart, True, "eager"),
                                                     (_TensorStart, False, "eager"), (_TensorStart, True, "eager"),
                                                     (_TensorStart, True, "inductor")])
def test_the_cache_is_written_in_place_and_equal_to_eager(module: Any, dynamic: bool, fallback: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    m, e = module(), module()
    c = torch.compile(m, backend="stitchtune", dynamic=dynamic, options={**OPTS, "fallback": fallback})
    torch_backend.LAST_REPORTS.clear()
    buffer, ptr = m.k, m.k.data_ptr()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for start, n in ((0, 5), (5, 1), (6, 1), (7, 3), (10, 1), (15, 1)):   # a prompt, then steps
            x = torch.randn(1, 2, n, 8, generator=g)
            s = start if module is _SymStart else torch.tensor(start)
            torch.testing.assert_close(c(x, s), e(x, s))   # the readers' regions: emulated float32 sums
            torch.testing.assert_close(m.k, e.k, rtol=0, atol=0)   # the cache: bit for bit
            assert m.k.stride() == e.k.stride()
    assert m.k is buffer and m.k.data_ptr() == ptr   # the buffer itself, not a new tensor
    puts = _puts()
    assert puts, [s.region for r in torch_backend.LAST_REPORTS for s in r.stitched]
    assert all(p.shapes[0] == (1, 2, 16, 8) and p.dtype == "float32" for p in puts), puts   # what explain shows
    declined = [d for r in torch_backend.LAST_REPORTS for d in r.declined
                if "index_put" in d.what or d.what == "graph" or "Inductor" in d.reason]
    assert not declined, declined
    assert "Inductor failed" not in caplog.text   # Inductor lowers the write (stitchtune::put_, no result)
    counts = [r for r in torch_stats.stats().regions if r.region.startswith("put_")]
    assert counts and all(r.eager == 0 for r in counts), counts
    assert sum(r.builds for r in counts) <= 3 * len(counts)   # one kernel per values' extent: 5, 1, 3


def test_a_position_outside_the_cache_raises_as_eager_does() -> None:
    m, e = _SymStart(rows=8), _SymStart(rows=8)
    c = torch.compile(m, backend="stitchtune", dynamic=True, options=OPTS)
    with torch.no_grad():
        c(torch.ones(1, 2, 3, 8), 0)
        with pytest.raises(IndexError) as want:
            e(torch.ones(1, 2, 3, 8), 6)
        with pytest.raises(IndexError) as got:
            c(torch.ones(1, 2, 3, 8), 6)
    assert "out of bounds" in str(got.value) and "out of bounds" in str(want.value)   # PyTorch's own error
    assert _puts()


class _Positions(torch.nn.Module):
    """``index_copy_(2, positions, new)`` with a position tensor (older StaticCache, user code)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 2, 8, 8))

    def forward(self, x: Any, pos: Any) -> Any:
        self.k.index_copy_(2, pos, x)
        return self.k * 2.0


def test_a_position_tensor_is_written_in_place_and_outside_or_repeated_positions_are_eagers() -> None:
    m, e = _Positions(), _Positions()
    c = torch.compile(m, backend="stitchtune", dynamic=False, options=OPTS)
    with torch.no_grad():
        for pos in ([6, 1, 3], [2, 7, 0], [5, 5, 4]):   # the last: a position twice, PyTorch's index_put_
            x = torch.randn(1, 2, 3, 8)
            c(x, torch.tensor(pos)), e(x, torch.tensor(pos))
            torch.testing.assert_close(m.k, e.k, rtol=0, atol=0)
        with pytest.raises(IndexError):
            c(torch.ones(1, 2, 3, 8), torch.tensor([1, 8, 2]))
    counts = [r for r in torch_stats.stats().regions if r.region.startswith("put_")]
    assert [(r.builds, r.eager) for r in counts] == [(1, 2)], counts   # one kernel; the repeat and the raise eager
    assert _puts()


class _Broadcast(_SymStart):
    """One new row written at 3 positions (values broadcast along the positions): not a cache write."""

    def forward(self, x: Any, start: int) -> Any:
        torch.ops.aten.index_put_(self.k, [None, None, torch.arange(start, start + 3)], x * 2.0)
        return self.k * 1.0


def test_values_broadcast_along_the_positions_are_not_written_in_place() -> None:
    m, e = _Broadcast(), _Broadcast()
    c = torch.compile(m, backend="stitchtune", dynamic=False, options=OPTS)
    with torch.no_grad():
        for start in (0, 4):
            x = torch.randn(1, 2, 1, 8)
            c(x, start), e(x, start)
            torch.testing.assert_close(m.k, e.k, rtol=0, atol=0)
    assert not _puts()


def test_a_functional_index_put_on_an_input_is_not_done_in_place() -> None:
    def f(cache: Any, x: Any, start: Any) -> Any:
        return torch.ops.aten.index_put(cache, [None, None, torch.arange(x.shape[2]) + start], x) * 2.0

    c = torch.compile(f, backend="stitchtune", dynamic=False, options=OPTS)
    cache = torch.zeros(1, 2, 16, 8)
    x = torch.randn(1, 2, 3, 8)
    with torch.no_grad():
        torch.testing.assert_close(c(cache, x, torch.tensor(4)), f(cache, x, torch.tensor(4)))
    assert not cache.any()   # the caller's tensor is unchanged
    assert not _puts()


def test_the_graph_calls_the_put_op_and_returns_the_buffer_itself() -> None:
    seen: list[Any] = []
    real = torch_backend.stitch_graph

    def spy(gm: Any, *a: Any, **kw: Any) -> Any:
        out = real(gm, *a, **kw)
        seen.append(out[0])
        return out

    m = _TensorStart()
    torch_backend.stitch_graph = spy   # type: ignore[assignment]
    try:
        c = torch.compile(m, backend="stitchtune", dynamic=False, options=OPTS)
        with torch.no_grad():
            c(torch.randn(1, 2, 1, 8), torch.tensor(3))
    finally:
        torch_backend.stitch_graph = real   # type: ignore[assignment]
    [gm] = seen
    puts = [n for n in gm.graph.nodes if n.target is PUT_INPLACE_OP]
    assert len(puts) == 1 and puts[0].args[1].op == "placeholder"
    assert not [n for n in gm.graph.nodes if "index_put" in str(n.target)]
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert out[0] is puts[0].args[1]   # the mutated input's new value: the buffer itself (a copy onto itself)


def test_the_launch_path_binds_the_buffer_itself_and_each_calls_start() -> None:
    """Through the launch path (a stand-in FakeDriver, CPU tensors' pointers as device memory): each
    launch of ``put`` gets the cache buffer's own pointer as its table (in place) and a start tensor
    holding that call's start, without a host read or a rebuild for a new start."""
    import ctypes

    from stitchtune.deploy import torch_ops
    from stitchtune.gpu.fake_driver import FakeDriver

    seen: list[tuple[int, int]] = []
    start_ptrs: list[int] = []

    def put(driver: Any, args: tuple[int, ...], launch: Any) -> None:
        seen.append((args[0], ctypes.c_int64.from_address(args[2]).value))
        start_ptrs.append(args[2])

    images: list[Any] = []
    drv = FakeDriver({"put": put})
    m = _SymStart()
    with torch_ops.stand_in_driver(drv, lambda prog: images.append(prog) or b"FAKE put"), torch.no_grad():
        c = torch.compile(m, backend="stitchtune", dynamic=True, options=OPTS)
        starts = (0, 4, 5, 9, 15)
        for start in starts:
            c(torch.ones(1, 2, 4 if start == 0 else 1, 8), start)
    assert [p for p, _ in seen] == [m.k.data_ptr()] * len(starts)
    assert [s for _, s in seen] == list(starts)
    # the decode graph (one position, four calls): one start buffer refilled at each call, none made per call
    assert len(set(start_ptrs[1:])) == 1, start_ptrs
    puts = [p for p in images if getattr(p, "kernels", ()) and p.kernels[0].name == "put"]
    assert len(puts) == 2   # one program per values' extent (4 positions, then 1); the regions' images too


def test_the_start_is_written_into_one_buffer_per_stream_and_a_ready_start_is_passed_as_it_is() -> None:
    """:meth:`PutKernel._start_tensor`: an int start, an int32 start tensor and a start tensor plus an int
    all land in the one start buffer (int64, refilled: a call's value, never an earlier one's); an aligned
    int64 start tensor on the device with nothing to add is passed as it is; a buffer first made under
    ``torch.inference_mode`` is refilled outside it (no inference tensor)."""
    from stitchtune.deploy.torch_put import PutKernel
    from stitchtune.hardware.device import get_device

    k = PutKernel("put_t", 2, get_device("H200"))
    cpu = torch.device("cpu")
    with torch.inference_mode():
        first = k._start_tensor(None, 7, cpu)
    assert first.tolist() == [7] and first.dtype == torch.int64 and not first.is_inference()
    ptr = first.data_ptr()
    got = [k._start_tensor(None, 3, cpu).tolist(), k._start_tensor(torch.tensor(5, dtype=torch.int32), 0, cpu).tolist(),
           k._start_tensor(torch.tensor(5), 4, cpu).tolist()]
    assert got == [[3], [5], [9]] and k._start_tensor(None, 0, cpu).data_ptr() == ptr
    ready = torch.tensor([11])
    assert ready.data_ptr() % 16 == 0 and k._start_tensor(ready, 0, cpu) is not None
    assert k._start_tensor(ready, 0, cpu).data_ptr() == ready.data_ptr()
    other = PutKernel("put_u", 2, get_device("H200"))
    assert other._start_tensor(None, 1, cpu).data_ptr() != ptr and k == dataclasses.replace(k)


@pytest.mark.slow
def test_tiny_llama_static_cache_decodes_as_eager_with_its_cache_writes_in_place() -> None:
    pytest.importorskip("transformers")
    from helpers.common import REPO

    sys.path.insert(0, str(REPO / "scripts"))
    import decode_matrix

    row: dict[str, Any] = decode_matrix.run_model("llama", steps=3, prompt_len=5, cache_kind="static",
                                                  cpu="emulate", shown=1000)
    assert row["tokens_equal"], row
    assert row["eager"] == 0 and row["graphs"] <= 3, row
    assert not [k for k in row["left_out"] if k.startswith("aten.index_put")], row["left_out"]
    puts = _puts()
    assert len(puts) == 8, [s.region for s in puts]   # K and V of 2 layers, prompt and decode graphs
    counts = [r for r in torch_stats.stats().regions if r.region.startswith("put_")]
    # one kernel per shape: the prompt's 5 positions, a decode step's one; no eager call
    assert sum(r.builds for r in counts) == 8 and all(r.eager == 0 for r in counts), counts
