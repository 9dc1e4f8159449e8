"""SymInt values inside regions (issue 41). Under ``torch.compile(dynamic=True)`` a decode step's
position is ``arange(1) + past`` with ``past`` a SymInt; its ops (the add, the position embedding's
gather) used to stay with PyTorch ("reads a SymInt value, not a tensor"). Now the region reads the
value as an int64 input that its call makes from the SymInt
(:mod:`stitchtune.importers.torch_symvalues`): values equal eager's at every past length, and a new
past length is data, not a new kernel."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stitchtune.torch as st_torch  # noqa: E402
from stitchtune.deploy import torch_backend  # noqa: E402
from stitchtune.importers import torch_candidates  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_backend")

D = 16


class _Embeds(torch.nn.Module):
    """Token and position embeddings and a layer norm, seeded: the modules both test models read."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.wte = torch.nn.Embedding(32, D)
        self.wpe = torch.nn.Embedding(64, D)
        self.ln = torch.nn.LayerNorm(D)


class _Step(_Embeds):
    """A decode step's input: token embedding + the position embedding of ``past`` (the cache's
    length), layer-normed; and the positions ``iota + past`` of the new tokens as floats."""

    def forward(self, ids: Any, cache: Any) -> tuple[Any, Any]:
        past = cache.shape[1]
        pos = torch.arange(1) + past                       # a SymInt value: the new token's position
        h = self.wte(ids) + self.wpe(pos.unsqueeze(0))
        wide = (torch.arange(ids.shape[1] + 3) + past).float() * 0.5   # iota + SymInt, then float
        return self.ln(h), wide


def _compiled(m: Any) -> Any:
    return torch.compile(m, backend="stitchtune", dynamic=True,
                         options={"db": None, "fallback": "eager", "cpu": "emulate"})


def _sym_declines() -> list[Any]:
    return [d for r in torch_backend.LAST_REPORTS for d in r.declined
            if "SymInt" in d.reason or "aten.embedding" in d.what or "graph input" in d.reason]


def test_positions_from_a_symint_are_in_regions_and_equal_eager() -> None:
    m = _Step().eval()
    c = _compiled(m)
    torch_backend.LAST_REPORTS.clear()
    st_torch.reset_stats()
    ids = torch.tensor([[5]])
    with torch.no_grad():
        for past in range(3, 15):
            cache = torch.zeros(1, past, D)
            got, want = c(ids, cache), m(ids, cache)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
                assert g.stride() == w.stride()
    assert not _sym_declines(), _sym_declines()
    ops = [op for r in torch_backend.LAST_REPORTS for s in r.stitched for op in s.ops]
    assert "aten.embedding" in ops and "aten.add" in ops, ops
    s = st_torch.stats()
    # 12 past lengths: the value is an argument, so the kernels do not grow with the steps (dynamo
    # compiles the first lengths with a specialised past, then one graph with it symbolic)
    assert s.eager == 0, s
    assert s.builds <= 2 * len(s.regions), s


def test_the_region_call_passes_the_symint() -> None:
    """The rewritten graph's region call takes the SymInt itself (``scalars``), never a constant."""
    seen: list[Any] = []
    real = torch_backend.stitch_graph

    def spy(gm: Any, ex: Any, opts: Any, kind: str) -> Any:
        new_gm, report = real(gm, ex, opts, kind)
        seen.extend(n for n in new_gm.graph.nodes if n.op == "call_function"
                    and n.target is torch.ops.stitchtune.region.default and len(n.args) > 2)
        return new_gm, report

    m = _Step().eval()
    c = _compiled(m)
    torch_backend.stitch_graph = spy
    try:
        with torch.no_grad():
            for past in (3, 4, 5):
                c(torch.tensor([[1]]), torch.zeros(1, past, D))
    finally:
        torch_backend.stitch_graph = real
    assert seen
    assert all(isinstance(a.meta.get("val"), torch.SymInt) for n in seen for a in n.args[2]), \
        [n.args for n in seen]


class _ReadingDriver:
    """Made lazily (the fake driver imports the GPU room): a FakeDriver whose launches record the
    int64 that their first argument points at (CPU tensors stand in for device memory)."""

    @staticmethod
    def make() -> Any:
        import ctypes

        from stitchtune.gpu.fake_driver import FakeDriver

        class Reading(FakeDriver):
            def __init__(self) -> None:
                super().__init__()
                self.first: list[int] = []
                self.pointers: list[int] = []

            def launch(self, function: Any, grid: Any, block: Any, smem: int, stream: int, params: int,
                       nparams: int, cooperative: bool = False) -> None:
                slot = (ctypes.c_uint64 * nparams).from_address(params)[0]
                ptr = ctypes.c_uint64.from_address(int(slot)).value
                self.pointers.append(int(ptr))
                self.first.append(ctypes.c_int64.from_address(ptr).value)

        return Reading()


class _Positions(torch.nn.Module):
    def forward(self, cache: Any) -> Any:
        return (torch.arange(4) + cache.shape[1]).float() * 0.5


def test_the_launch_path_passes_each_calls_value() -> None:
    """Through the launch path (a stand-in driver, CPU tensors): the full path, then the thin one,
    each launch's bound input holds that call's past length (one buffer filled in place, no rebuild)."""
    from stitchtune.deploy import torch_ops

    drv = _ReadingDriver.make()
    with torch_ops.stand_in_driver(drv, lambda compiled: b"FAKE symint test"), torch.no_grad():
        c = _compiled(_Positions())
        st_torch.reset_stats()
        pasts = (5, 6, 9, 9, 31)
        for p in pasts:
            c(torch.zeros(1, p, 2))
    assert drv.first[-len(pasts):] == list(pasts)
    guarded = [g for g in torch_ops._registry.values() if getattr(g, "bound", ())][-1]
    assert guarded._fast is not None   # the later calls took the thin path
    s = st_torch.stats()
    assert s.eager == 0 and s.builds <= 1, s


def test_a_region_call_makes_no_tensor_for_its_symint_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """12 past lengths through the launch path: after the first call every launch reads the same
    bound buffer (filled in place with the call's value; no ``torch.full`` / ``torch.empty`` per call,
    which on a GPU is an allocation and a fill launch per region and call), its value that call's
    past length, and no new kernel is built."""
    from stitchtune.deploy import torch_ops

    drv = _ReadingDriver.make()
    made: list[str] = []
    for name in ("full", "empty"):
        real = getattr(torch, name)

        def counting(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            made.append(_name)
            return _real(*args, **kwargs)
        monkeypatch.setattr(torch, name, counting)
    with torch_ops.stand_in_driver(drv, lambda compiled: b"FAKE symint test"), torch.no_grad():
        c = _compiled(_Positions())
        for p in (3, 4):   # dynamo's first lengths, then its graph with ``past`` symbolic
            c(torch.zeros(1, p, 2))
        guarded = [g for g in torch_ops._registry.values() if getattr(g, "bound", ())][-1]
        st_torch.reset_stats()
        made.clear()
        pasts = list(range(5, 17))
        calls = len(drv.first)
        for p in pasts:
            guarded([], [p])
    assert made == [], made
    assert drv.first[calls:] == pasts
    assert len(set(drv.pointers[calls:])) == 1, drv.pointers[calls:]
    s = st_torch.stats()
    assert s.builds == 0, s


class _Prompt(_Embeds):
    """GPT-2's prompt input: token embedding + the position embedding of ``arange(S)`` (S symbolic),
    which :func:`~stitchtune.importers.torch_symvalues.sym_values` reads as the view ``wpe[0:S]``."""

    def forward(self, ids: Any) -> Any:
        return self.ln(self.wte(ids) + self.wpe(torch.arange(ids.shape[1]).unsqueeze(0)))


def test_the_prompt_position_view_is_explained_as_a_view_a_region_reads() -> None:
    """The slice ``wpe[0:S]`` stays with PyTorch (a view, no kernel) and the region reads it as an
    input: explain says so, not that the slice "reads a SymInt value" (its SymInt is a bound)."""
    m = _Prompt().eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    torch._dynamo.mark_dynamic(ids, 1)
    with torch.no_grad():
        e = torch_backend.explain(m, ids, db=None, fallback="eager", cpu="emulate")
        torch.testing.assert_close(e.outputs, m(ids), rtol=1e-5, atol=1e-5)
    slices = [d for d in e.declined if d.what == "op aten.slice"]
    assert slices and all(d.reason == torch_candidates.SYMBOLIC_VIEW for d in slices), e.declined
    assert not _sym_declines(), _sym_declines()
    reads = [s for s in e.stitched if "aten.embedding" in s.ops and "aten.native_layer_norm" in s.ops]
    assert reads and any(shape == (5, D) for s in reads for shape in s.shapes), e.stitched   # wpe[0:5] read
