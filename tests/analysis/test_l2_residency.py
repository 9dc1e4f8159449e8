"""stitchtune/analysis/l2_residency.py (the L2 simulation) and l2_credit.py (the audit's L2-credited times)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from stitchtune.analysis.gemm_traffic import GemmTiling
from stitchtune.analysis.l2_credit import L2Params, capacity, credited_us, l2_params, simulate_l2
from stitchtune.analysis.l2_residency import GEMM_OPS, L2Occurrence, resident_bytes, simulate
from stitchtune.cost.fitted import Coefficients
from stitchtune.hardware.device import get_device

DEV = get_device("h200")
MB = 1 << 20


class _G:
    """A hand-built FX graph of fp32 tensors (``meta["val"]`` on the meta device) and its regions."""

    def __init__(self) -> None:
        self.torch = pytest.importorskip("torch")
        self.fx = pytest.importorskip("torch.fx")
        self.g = self.fx.Graph()

    def _val(self, mib: float) -> Any:
        return self.torch.empty(int(mib * MB) // 4, device="meta")

    def input(self, name: str, mib: float) -> Any:
        n = self.g.placeholder(name)
        n.meta["val"] = self._val(mib)
        return n

    def op(self, target: Any, args: tuple[Any, ...], mib: float | tuple[float, ...]) -> Any:
        n = self.g.call_function(target, args)
        n.meta["val"] = tuple(self._val(m) for m in mib) if isinstance(mib, tuple) else self._val(mib)
        return n

    def mm(self, *args: Any, mib: float) -> Any:
        return self.op(self.torch.ops.aten.mm.default, args, mib)

    def matrix(self, name: str, rows: int, cols: int) -> Any:
        """A 2-D fp32 placeholder (the GEMM model reads operand shapes)."""
        n = self.g.placeholder(name)
        n.meta["val"] = self.torch.empty(rows, cols, device="meta")
        return n

    def matmul(self, a: Any, b: Any) -> Any:
        """``a @ b`` with its 2-D output shape."""
        n = self.g.call_function(self.torch.ops.aten.mm.default, (a, b))
        n.meta["val"] = self.torch.empty(a.meta["val"].shape[0], b.meta["val"].shape[1], device="meta")
        return n

    def getitem(self, src: Any, i: int) -> Any:
        import operator

        n = self.g.call_function(operator.getitem, (src, i))
        n.meta["val"] = src.meta["val"][i]
        return n

    def region(self, name: str, *inputs: Any, mib: float) -> SimpleNamespace:
        """One element-wise node reading ``inputs``, writing ``mib``: a region of one node."""
        n = self.op(self.torch.ops.aten.add.Tensor, inputs, mib)
        return SimpleNamespace(name=name, nodes=(n,), inputs=inputs, outputs=(n,))


def test_a_tensor_larger_than_the_cache_is_partly_resident_by_bytes() -> None:
    """A 100 MiB GEMM output read right after it by a region, in a 60 / 30 MiB cache: the cache's worth of it is
    resident, not all of it (the old producer rule's ``min(S, C - D)``, kept) and not nothing."""
    g = _G()
    a, w = g.input("a", 4), g.input("w", 1)
    h = g.mm(a, w, mib=100)
    r = g.region("r", h, mib=100)
    for cap in (60 * MB, 30 * MB):
        o = simulate([r], cap)["r"]
        assert o.resident == pytest.approx(cap)
        assert o.read_bytes == pytest.approx(100 * MB)
    assert simulate([r], 200 * MB)["r"].resident == pytest.approx(100 * MB)


def test_an_input_counts_from_its_last_touch_not_its_producer() -> None:
    """A model input (a placeholder: no producer) read by the GEMM just before the region is in the L2 when the
    region reads it again; a tensor written long ago (80 MiB moved since) but read just before is too. The
    producer-only rule said 0 for both (a placeholder is not counted; 80 MiB since the producer)."""
    g = _G()
    x, w, big = g.input("x", 8), g.input("w", 1), g.input("big", 40)
    old = g.mm(x, w, mib=8)              # written, then 80 MiB move through (big read, 40 MiB written)
    g.mm(big, w, mib=40)
    g.mm(old, x, mib=1)                  # both read again just before the region: their last touch
    r = g.region("r", x, old, mib=8)
    assert simulate([r], 60 * MB)["r"].resident == pytest.approx(8 * MB + 8 * MB)
    assert resident_bytes([r], 17 * MB)["r"] == pytest.approx(16 * MB)   # 1 MiB of mm output + both fit


def test_a_multi_output_producer_is_one_storage_per_output() -> None:
    """``sort`` writes values and indices (here 8 and 16 MiB): a region reading only the indices reads 16 MiB, and
    the values it does not read are still traffic that evicts (they were counted together, or not at all)."""
    g = _G()
    y, w = g.input("y", 8), g.input("w", 1)
    h = g.mm(y, w, mib=4)
    s = g.op(g.torch.ops.aten.sort.default, (y,), (8, 16))
    idx = g.getitem(s, 1)
    r = g.region("r", h, idx, mib=4)
    o = simulate([r], 60 * MB)["r"]
    assert o.read_bytes == pytest.approx(4 * MB + 16 * MB)
    assert o.resident == pytest.approx(20 * MB)
    # a 26 MiB cache: sort's 8 + 16 MiB written after h (and y, read again by sort) push h out; the indices stay
    small = simulate([r], 26 * MB)["r"]
    assert small.resident == pytest.approx(16 * MB)
    both = g.region("both", g.getitem(s, 0), idx, mib=1)
    assert simulate([both], 60 * MB)["both"].read_bytes == pytest.approx(24 * MB)


def test_dirty_bytes_are_written_back_when_evicted_and_clean_ones_are_not() -> None:
    g = _G()
    x, w = g.input("x", 10), g.input("w", 10)
    g.mm(x, w, mib=30)                    # 60 MiB cache: x, w (clean) and h (30 MiB dirty): 50 MiB
    r1 = g.region("r1", x, mib=10)        # reads x (resident), writes 10 MiB: 60 MiB, nothing evicted
    r2 = g.region("r2", w, mib=20)        # reads w (resident), writes 20 MiB: evicts 20 MiB of h (dirty)
    out = simulate([r1, r2], 60 * MB)
    assert out["r1"].resident == pytest.approx(10 * MB) and out["r1"].writeback == pytest.approx(0.0)
    assert out["r2"].resident == pytest.approx(10 * MB)
    assert out["r2"].writeback == pytest.approx(20 * MB) and out["r2"].own_writeback == pytest.approx(0.0)
    assert out["r2"].saved("reads") == pytest.approx(10 * MB)
    assert out["r2"].saved("writeback") == pytest.approx(-10 * MB)
    # a 15 MiB cache: r2 writes 20 MiB, 5 more than the cache: its overflow is its own write-back
    small = simulate([r1, r2], 15 * MB)["r2"]
    assert small.own_writeback == pytest.approx(5 * MB) and small.writeback >= small.own_writeback


def test_random_replacement_takes_room_from_every_storage_in_proportion() -> None:
    g = _G()
    a, b = g.input("a", 20), g.input("b", 20)
    ha = g.mm(a, a, mib=20)
    hb = g.mm(b, b, mib=20)
    g.mm(ha, hb, mib=30)                  # 60 MiB cache after this: everything touched competes
    r = g.region("r", ha, mib=1)
    lru = simulate([r], 60 * MB, "lru")["r"].resident
    rnd = simulate([r], 60 * MB, "random")["r"].resident
    assert lru == pytest.approx(10 * MB)               # LRU: b went first, then the older half of ha
    assert 0 < rnd < 20 * MB and rnd != pytest.approx(lru)   # random replacement: a share of every storage


def test_streaming_reads_hit_but_do_not_enter_the_cache() -> None:
    """With ``streaming={"mm"}`` a GEMM's operand reads hit what is resident but neither enter the cache nor evict:
    the dX GEMM's output survives the dW GEMM's 50 MiB operand read (BERT's GELU backward after two GEMMs)."""
    g = _G()
    dy, w, act = g.input("dy", 12), g.input("w", 9), g.input("act", 50)
    dx = g.mm(dy, w, mib=50)              # the region's input
    g.mm(dy, act, mib=9)                  # reads the 50 MiB saved activation
    r = g.region("r", dx, act, mib=50)
    plain = simulate([r], 60 * MB)["r"].resident
    streamed = simulate([r], 60 * MB, streaming=frozenset({"mm"}))["r"].resident
    assert plain < 10 * MB                # the activation's read pushed dx out
    assert streamed >= 40 * MB            # dx stays; act was never inserted


def test_credited_time_bounds() -> None:
    c = dataclasses.replace(Coefficients.defaults(DEV), bw_efficiency=0.5, ramp_us=1.0)
    p = L2Params("lru", 1.0, 2.0)
    per_us = 0.5 * DEV.effective_copy_bandwidth_gbs() * 1000.0           # bytes per microsecond at the ceiling
    copy_us = DEV.effective_copy_bandwidth_gbs() * 1000.0
    assert credited_us(10.0, 0.0, [0.0, 0.0], DEV, c, p) == pytest.approx(20.0)   # two occurrences, nothing saved
    assert credited_us(10.0, 0.0, [2 * per_us], DEV, c, p) == pytest.approx(8.0)
    assert credited_us(10.0, 0.0, [100 * per_us], DEV, c, p) == pytest.approx(1.0)  # never below the ramp
    assert credited_us(0.5, 0.0, [100 * per_us], DEV, c, p) == pytest.approx(0.5)   # nor above the time itself
    # never below the launch's bytes at the L2 streaming rate (2 x copy): 12 us of copy -> 6 us
    assert credited_us(10.0, 12 * copy_us, [100 * per_us], DEV, c, p) == pytest.approx(6.0)
    assert credited_us(10.0, 0.0, [-2 * per_us], DEV, c, p) == pytest.approx(12.0)  # write-backs slow it down


def test_params_are_checked_and_the_h200_has_fitted_ones() -> None:
    with pytest.raises(ValueError):
        L2Params("fifo", 0.5, 1.1)
    with pytest.raises(ValueError):
        L2Params("lru", 0.0, 1.1)
    p = l2_params(DEV)
    assert p.source and capacity(DEV, p) == pytest.approx(p.keep * DEV.l2_bytes)
    assert l2_params(get_device("a100")) == p                             # another device: the H200's (documented)


def test_occurrence_accounting() -> None:
    o = L2Occurrence(read_bytes=10.0, write_bytes=4.0, resident=6.0, writeback=5.0, own_writeback=1.0,
                     flush_writeback=3.0)
    assert o.dram_bytes == pytest.approx(9.0)
    assert o.saved("reads") == 6.0 and o.saved("writeback") == pytest.approx(2.0)
    assert o.saved("deferred") == pytest.approx(5.0) == o.saved_bytes
    assert o.saved("flushed") == pytest.approx(5.0)     # 6 resident - 4 earlier write-backs + 3 of the flush's
    with pytest.raises(ValueError):
        o.saved("all")


def _model() -> tuple[object, tuple[object, ...]]:
    torch = pytest.importorskip("torch")

    class TwoRegions(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(64, 64))
            self.v = torch.nn.Parameter(torch.randn(64, 4096))

        def forward(self, x: "torch.Tensor") -> "torch.Tensor":
            h = torch.nn.functional.layer_norm(x * 2.0, (64,)) @ self.w   # region 1 reads x; mm writes h
            big = (x @ self.v).sum()                                       # 1 MiB written between h and region 2
            return torch.softmax(h + 1.0, dim=-1) * big                     # region 2 reads h (8 KiB)

    return TwoRegions(), (torch.randn(32, 64),)


def test_captured_regions_read_the_gemm_output_from_the_l2() -> None:
    from stitchtune.deploy.model_tuning import capture_regions

    model, inputs = _model()
    regions = capture_regions(model, inputs, "inference")
    out = simulate(regions, DEV.l2_bytes)
    assert set(out) == {r.name for r in regions}
    first, second = (out[r.name] for r in regions)
    assert first.resident == 0.0                    # x: a model input nothing touched before
    assert second.resident >= 32 * 64 * 4           # h, written by the mm just before
    assert simulate(regions, 1024.0)[regions[1].name].resident < 32 * 64 * 4   # a 1 KiB cache holds part of it


def test_audit_model_records_each_occurrences_saved_bytes_per_call() -> None:
    from stitchtune.analysis.audit import RegionAudit, audit_model

    model, inputs = _model()
    audits, _ = audit_model(model, inputs, DEV, sass=False, peer=False)
    assert all(set(a.l2_resident) == {"inference"} and len(a.l2_resident["inference"]) == 1 for a in audits)
    assert sorted(a.l2_resident["inference"][0] > 0 for a in audits) == [False, True]
    assert RegionAudit.from_dict(audits[0].to_dict()) == audits[0]


def test_the_audit_summary_sets_inductors_measured_time_beside_the_l2_sums() -> None:
    """scripts/audit_models.py reads Inductor's own kernels' time per step from the committed H200 run."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "audit_models.py"
    spec = importlib.util.spec_from_file_location("audit_models_for_test", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    assert mod.inductor_measured("bert", "train") == pytest.approx(887.0, abs=0.5)
    assert mod.inductor_measured("llama", "inference") == pytest.approx(412.0, abs=0.5)
    assert mod.inductor_measured("bert", "eval-grad") is None


def test_the_per_model_audit_lists_each_regions_l2_credit() -> None:
    """scripts/audit_models.py's per-region section: one row per region and call, credited <= fitted."""
    import importlib.util
    from pathlib import Path

    from stitchtune.analysis.audit import audit_model

    path = Path(__file__).resolve().parents[2] / "scripts" / "audit_models.py"
    spec = importlib.util.spec_from_file_location("audit_models_for_test2", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    model, inputs = _model()
    audits, _ = audit_model(model, inputs, DEV, sass=False, peer=False)
    rows = [r for r in mod._l2_regions(audits, ("inference",), DEV).splitlines() if r.startswith("| region_")]
    assert len(rows) == len(audits)
    for r in rows:
        fitted, credited = (float(x) for x in r.strip("| ").split(" | ")[-2:])
        assert credited <= fitted + 1e-9


def test_a_storage_read_first_through_a_small_view_is_still_read_whole_later() -> None:
    """A 40 MiB input whose first reader takes a 1 MiB slice of it, then a region reading all of it: the region
    reads 40 MiB, of which the slice's 1 MiB is resident. (The first read's bytes were kept as the storage's size,
    and the region read 1 MiB in all.) A view wider than its storage (an ``expand``) reads at most the storage."""
    g = _G()
    x, w = g.input("x", 40), g.input("w", 1)
    part = g.op(g.torch.ops.aten.slice.Tensor, (x, 0, 0, 10), 1)
    g.mm(part, w, mib=1)
    r = g.region("r", x, mib=40)
    o = simulate([r], 60 * MB)["r"]
    assert o.read_bytes == pytest.approx(40 * MB)
    assert o.resident == pytest.approx(1 * MB)
    g2 = _G()
    b = g2.input("b", 1)
    wide = g2.op(g2.torch.ops.aten.expand.default, (b, [64, -1]), 64)
    r2 = g2.region("r2", wide, mib=1)
    assert simulate([r2], 60 * MB)["r2"].read_bytes == pytest.approx(1 * MB)


def test_audit_model_credits_each_graphs_region_by_its_own_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two FX graphs of one call (a graph break) each holding a region named ``r``: the first's input was just
    written by a GEMM (8 MiB resident), the second's is a model input (nothing resident). Each occurrence gets its
    own graph's bytes (the simulation's result was looked up by name over the whole call: both got the last)."""
    from stitchtune.analysis import audit
    from stitchtune.deploy import model_tuning

    g1, g2 = _G(), _G()
    h = g1.mm(g1.input("x", 8), g1.input("w", 1), mib=8)
    r1 = g1.region("r", h, mib=8)
    r2 = g2.region("r", g2.input("y", 8), mib=8)
    r1.graph = SimpleNamespace(name="first", workload_key=lambda: "k1")
    r2.graph = SimpleNamespace(name="second", workload_key=lambda: "k2")
    monkeypatch.setattr(model_tuning, "capture_regions", lambda model, inputs, call: [r1, r2])

    def fake_audit(g: Any, device: Any, **options: Any) -> Any:
        return audit.RegionAudit(g.name, g.workload_key(), device.name, "row", 1, 1, "{}", 0, 0.0, None, ())

    monkeypatch.setattr(audit, "audit_graph", fake_audit)
    audits, skipped = audit.audit_model(None, (), DEV, ("inference",))
    assert not skipped
    got = {a.graph: a.l2_resident["inference"] for a in audits}
    params = l2_params(DEV)
    assert capacity(DEV, params) > 8 * MB
    assert got == {"first": [pytest.approx(8 * MB)], "second": [0.0]}


def test_after_a_flush_a_regions_traffic_writes_the_flushs_dirty_bytes_back() -> None:
    """The fitted rows ran after a memset flush (the L2 full of dirty bytes): an op moving 20 MiB through a 60 MiB
    LRU cache writes 20 MiB of the flush back; one moving more than the cache, the whole cache."""
    g = _G()
    x, y = g.input("x", 10), g.input("y", 100)
    small, big = g.region("small", x, mib=10), g.region("big", y, mib=10)
    out = simulate([small, big], 60 * MB)
    assert out["small"].flush_writeback == pytest.approx(20 * MB)
    assert out["big"].flush_writeback == pytest.approx(60 * MB)


def _ffn_up(g: _G) -> tuple[Any, SimpleNamespace]:
    """BERT's FFN up-projection [4096, 768] @ [768, 3072] (48 MiB out) and a region reading its output."""
    x, w = g.matrix("x", 4096, 768), g.matrix("w", 768, 3072)
    h = g.matmul(x, w)
    return h, g.region("r", h, mib=48)


def test_a_gemm_in_waves_leaves_its_last_tiles_most_recent() -> None:
    """Wave by wave (128 x 128 tiles, 132 at once: 6 waves), the output enters the L2 in pieces between re-reads
    of A and B: in a 24 MiB LRU cache, the last wave's tiles (108 of 768) stay with A and B, not the last 24 MiB
    of the output; with the operands read evict-first, the output's last 24 MiB. A whole-op GEMM (no ``gemm``)
    writes the output after both operands: its last 24 MiB too."""
    g = _G()
    _, r = _ffn_up(g)
    tiles = GemmTiling(128, 128, 132)
    assert simulate([r], 24 * MB)["r"].resident == pytest.approx(24 * MB)
    assert simulate([r], 24 * MB, gemm=tiles)["r"].resident == pytest.approx(48 * MB * 108 / 768)
    evict_first = simulate([r], 24 * MB, streaming=frozenset(GEMM_OPS), gemm=tiles)["r"]
    assert evict_first.resident == pytest.approx(24 * MB)       # every resident piece counted before any is touched
    assert evict_first.read_bytes == pytest.approx(48 * MB)


def test_the_dx_gemms_output_survives_the_dw_gemm_only_with_operands_evict_first() -> None:
    """BERT's GELU backward after two GEMMs (results/l2-2026-12-07-s15): dX = dY @ W2 (48 MiB), then dW2 = dY^T @ act
    streams the 48 MiB saved activation. Inductor's kernel implies at least 13 MB of dX still in the L2. The H200's
    fitted parameters (tiles, operands evict-first) keep more than that; the same with the GEMMs as whole ops
    entering the cache (results/l2-2026-12-07-s14) keep almost none."""
    g = _G()
    dy, dyt, w2 = g.matrix("dy", 4096, 768), g.matrix("dyt", 768, 4096), g.matrix("w2", 768, 3072)
    act = g.matrix("act", 4096, 3072)
    dx = g.matmul(dy, w2)
    g.matmul(dyt, act)
    r = g.region("r", dx, act, mib=48)
    shipped = l2_params(DEV)
    assert (shipped.gemm_tile, shipped.gemm_evict_first) == (128, True)
    assert simulate_l2([r], DEV, shipped)["r"].resident > 13e6
    before = L2Params(shipped.policy, shipped.keep, shipped.stream_factor, shipped.accounting)
    assert simulate_l2([r], DEV, before)["r"].resident < 1e6
    assert before.gemm == "whole" and shipped.gemm == "tiles 128, operands evict-first"
    with pytest.raises(ValueError):
        L2Params("lru", 0.5, 1.1, gemm_tile=-1)
