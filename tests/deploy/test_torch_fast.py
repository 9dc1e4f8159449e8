"""Issue 40: the thin per-call path of a static region (``deploy/torch_fast.py``) and the compiled
graph's direct region calls. A BERT-style ``LayerNorm(x + res)`` region (4 inputs, 1 output) is
compiled with ``fallback="eager"`` and launched through a stand-in FakeDriver that only counts
launches (CPU tensors: the pointers are passed, nothing is run). Checked: the thin path takes only
inputs like those of the call that ran the full path (shape, dtype, device, strides, 16-byte
alignment, requires-grad), with dynamo's C++ tensor check and allocator entry point and without
them; a wrong
shape never reaches a kernel; the compiled graph calls its regions without torch's dispatcher (no
``stitchtune::region`` op in the profiler), a direct op call goes through it."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stitchtune.deploy import torch_ops  # noqa: E402
from stitchtune.deploy.torch_fast import FastCall  # noqa: E402
from stitchtune.gpu.fake_driver import FakeDriver  # noqa: E402

H = 64


class CountingDriver(FakeDriver):
    """A FakeDriver whose launch only counts (kernels are never run: outputs stay uninitialised)."""

    def __init__(self) -> None:
        super().__init__()
        self.launched = 0
        self.grids: list[Any] = []


    def launch(self, function: Any, grid: Any, block: Any, smem: int, stream: int, params: int,
               nparams: int, cooperative: bool = False) -> None:
        self.launched += 1
        self.grids.append(tuple(grid))


class AddLN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(H)

    def forward(self, x: Any, res: Any) -> Any:
        return self.ln(x + res)


@pytest.fixture
def region(fresh_backend) -> Iterator[tuple[Any, Any, tuple[Any, ...], str, CountingDriver]]:
    """(compiled model, its GuardedRegion, the model's inputs, the region's key, the driver)."""
    drv = CountingDriver()
    model = AddLN().eval()
    args = (torch.randn(8, H), torch.randn(8, H))
    with torch_ops.stand_in_driver(drv, lambda compiled: b"FAKE thin-path test"), torch.no_grad():
        compiled = torch.compile(model, backend="stitchtune", options={"db": None, "fallback": "eager"})
        compiled(*args)
        key = list(torch_ops._registry)[-1]
        yield compiled, torch_ops.lookup(key), args, key, drv


def _inputs(guarded: Any) -> list[Any]:
    return [torch.randn(spec.shape) for _, spec in guarded.kernel.graph.inputs]


def _bad(inputs: list[Any]) -> dict[str, list[Any]]:
    """Inputs the thin path must refuse, each differing from ``inputs`` in one way (input 0 is (8, H))."""
    x = inputs[0]
    misaligned = torch.randn(x.numel() + 1)[1:].view(x.shape)   # 4 bytes past an aligned block
    return {
        "shape": [x[:4], *inputs[1:]],
        "strides": [torch.randn(H, 8).t(), *inputs[1:]],
        "dtype": [x.double(), *inputs[1:]],
        "device": [torch.empty(x.shape, device="meta"), *inputs[1:]],
        "alignment": [misaligned, *inputs[1:]],
        "requires_grad": [x.clone().requires_grad_(True), *inputs[1:]],
        "count": inputs[:-1],
    }


@pytest.mark.parametrize("check", ["c++", "python"])
def test_the_thin_path_takes_only_inputs_like_its_first_calls(region, check: str, monkeypatch) -> None:
    _, guarded, _, _, drv = region
    inputs = _inputs(guarded)
    if check == "python":   # a torch without dynamo's TensorGuards and _empty_strided_cpu: its own
        monkeypatch.delattr(torch._C._dynamo.guards, "TensorGuards")
        monkeypatch.delattr(torch._C._dynamo.guards, "_empty_strided_cpu")
    fast = guarded.kernel.fast_path(inputs[0].device, (), inputs)
    assert isinstance(fast, FastCall)
    before = drv.launched
    outs = fast(inputs)
    assert outs is not None and drv.launched == before + 1
    assert [(o.shape, o.dtype) for o in outs] == [(f.shape, f.dtype) for f in guarded.fake(inputs)]
    for what, bad in _bad(inputs).items():
        assert fast(bad) is None, what
    assert drv.launched == before + 1   # none of them launched
    assert fast([t.clone() for t in inputs]) is not None   # other tensors like the first: thin path


def test_threads_never_share_the_packed_arguments(region, monkeypatch) -> None:
    """No lock per call: each thread rewrites its own packed arguments. Thread B's whole call runs
    inside thread A's launch (between A's pointer rewrite and the driver reading A's parameters):
    A's launch must still read A's pointers (shared slots would hold B's; a lock held across the
    launch would block B). The driver's context is pushed and popped around each call's launches."""
    _, guarded, _, _, drv = region
    a, b = _inputs(guarded), _inputs(guarded)
    fast = guarded.kernel.fast_path(a[0].device, (), a)
    seen: dict[str, list[int]] = {}   # thread name -> the pointer arguments its launch read
    done: dict[str, Any] = {}

    def launch(function: Any, grid: Any, block: Any, smem: int, stream: int, params: int, nparams: int,
               cooperative: bool = False) -> None:
        name = threading.current_thread().name
        if name == "A":
            other = threading.Thread(target=lambda: done.update(B=fast(b)), name="B")
            other.start()
            other.join(timeout=10)
            assert not other.is_alive(), "thread B waited for thread A's call"
        slots = (ctypes.c_uint64 * nparams).from_address(params)
        seen[name] = [ctypes.c_uint64.from_address(int(q)).value for q in slots]

    def body() -> None:
        try:
            done["A"] = fast(a)
        except BaseException as exc:  # noqa: BLE001 - reported below
            done["error"] = exc

    monkeypatch.setattr(drv, "launch", launch, raising=False)
    pushes = drv.context_calls.count("push")
    thread = threading.Thread(target=body, name="A")
    thread.start()
    thread.join(timeout=30)
    assert "error" not in done, done.get("error")
    assert done["A"] is not None and done["B"] is not None
    for name, ins in (("A", a), ("B", b)):
        ptrs = [t.data_ptr() for t in (*ins, *done[name])]
        assert set(ptrs) <= set(seen[name]), name
    assert fast.calls == 2
    assert drv.context_calls.count("push") == pushes + 2 and drv.active == 0


def test_a_wrong_shape_never_reaches_a_kernel(region) -> None:
    _, guarded, _, _, drv = region
    inputs = _inputs(guarded)
    before = drv.launched
    with torch_ops.stand_in_driver(drv, lambda compiled: b"FAKE thin-path test"):
        with pytest.raises(torch_ops.RegionError, match=r"input 0 .*\[4, 64\].* the region reads \[8, 64\]"):
            guarded.kernel([inputs[0][:4], *inputs[1:]])
    assert drv.launched == before


def test_the_compiled_graph_calls_its_regions_without_the_dispatcher(region) -> None:
    compiled, guarded, args, key, drv = region
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        compiled(*args)   # the thin path is made
        assert guarded._fast is not None
        before = drv.launched
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            compiled(*args)
        assert drv.launched == before + 1
        assert not [e.name for e in prof.events() if "stitchtune::region" in e.name]
        with profile(activities=[ProfilerActivity.CPU]) as prof:   # the op itself goes through it
            torch.ops.stitchtune.region.default(key, _inputs(guarded))
        assert [e.name for e in prof.events() if "stitchtune::region" in e.name]
        assert drv.launched == before + 2


def test_a_region_with_symbolic_shapes_gets_a_thin_path_per_shapes(fresh_backend, monkeypatch) -> None:
    from stitchtune.deploy.torch_fast import ShapeCalls
    from stitchtune.deploy.torch_region_dynamic import DynamicRegionKernel

    drv = CountingDriver()
    model = AddLN().eval()
    with torch_ops.stand_in_driver(drv, lambda compiled: b"FAKE thin-path test"), torch.no_grad():
        compiled = torch.compile(model, backend="stitchtune", dynamic=True,
                                 options={"db": None, "fallback": "eager"})
        rows = (3, 60, 250)
        grids = []   # per rows: the grid the full path launched (the generic kernel's for its extents)
        for n in rows:
            compiled(torch.randn(n, H), torch.randn(n, H))   # the full path, then a thin one kept
            grids.append(drv.grids[-1])
        assert len(set(grids)) > 1, grids   # the extents choose the grid
        guarded = [g for g in torch_ops._registry.values()
                   if isinstance(getattr(g, "kernel", None), DynamicRegionKernel)][-1]
        calls = guarded._fast
        assert isinstance(calls, ShapeCalls)
        kept = [c for c in calls.calls.values() if c is not None]
        assert len(kept) == len(rows) and all(c.ext for c in kept)   # generic kernels, extents bound

        def no_full_path(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the full path ran")

        monkeypatch.setattr(DynamicRegionKernel, "__call__", no_full_path)
        before = drv.launched
        for n, grid in zip(rows, grids):
            out = compiled(torch.randn(n, H), torch.randn(n, H))
            assert out.shape == (n, H)
            assert drv.grids[-1] == grid, n   # the thin path launches the extents' grid too
        assert drv.launched == before + len(rows)


def test_inductors_wrapper_calls_the_regions_without_the_dispatcher(fresh_backend) -> None:
    """fallback="inductor": the generated wrapper calls ``stitchtune_region_op`` (imported from
    torch_ops), not ``torch.ops.stitchtune.region.default``."""
    from torch.profiler import ProfilerActivity, profile

    from stitchtune.deploy.torch_direct import inductor_direct_calls

    if not inductor_direct_calls():
        pytest.skip("this torch has no custom extern-kernel codegen registry")
    drv = CountingDriver()
    model = AddLN().eval()
    args = (torch.randn(8, H), torch.randn(8, H))
    with torch_ops.stand_in_driver(drv, lambda compiled: b"FAKE thin-path test"), torch.no_grad():
        compiled = torch.compile(model, backend="stitchtune", options={"db": None, "fallback": "inductor"})
        compiled(*args)
        compiled(*args)
        before = drv.launched
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = compiled(*args)
    assert out.shape == (8, H)
    assert drv.launched == before + 1
    assert not [e.name for e in prof.events() if "stitchtune::region" in e.name]


def test_shape_calls_try_the_last_thin_path_then_the_one_of_the_shapes() -> None:
    from stitchtune.deploy.torch_fast import ShapeCalls

    class Stub:
        """A thin path for one shape of input 0 (None for any other), counting its calls."""

        def __init__(self, n: int) -> None:
            self.n, self.calls = n, 0

        def run(self, inputs: list[Any]) -> list[Any] | None:
            if inputs[0].shape[0] != self.n:
                return None
            self.calls += 1
            return [self.n]

    calls = ShapeCalls(limit=2)
    two, three = Stub(2), Stub(3)
    calls.add([torch.empty(2)], two)
    calls.add([torch.empty(3)], three)
    assert [calls([torch.empty(n)]) for n in (2, 2, 3, 2)] == [[2], [2], [3], [2]]
    assert calls([torch.empty(4)]) is None          # no thin path for these shapes: the full path
    assert calls.hits == 4
    calls.add([torch.empty(4)], None)               # the oldest (2, the last one run) is dropped
    assert calls([torch.empty(2)]) is None and calls([torch.empty(3)]) == [3]
    assert calls.hits == 5 and two.calls == 3
