"""stitchtune/analysis/l2_residency.py: a region's input bytes still in the L2, and the audit's L2-credited times."""

from __future__ import annotations

import dataclasses

import pytest

from stitchtune.analysis.l2_residency import credited_us, producer_inputs, resident_bytes
from stitchtune.cost.fitted import Coefficients
from stitchtune.hardware.device import get_device

DEV = get_device("h200")


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


def test_an_input_written_just_before_is_resident_unless_the_ops_since_moved_more_than_the_cache() -> None:
    from stitchtune.deploy.model_tuning import capture_regions

    model, inputs = _model()
    regions = capture_regions(model, inputs, "inference")
    reads_model_input = [r for r in regions if not producer_inputs(r)]
    reads_h = [r for r in regions if any(p.nbytes == 32 * 64 * 4 for p in producer_inputs(r))]
    assert reads_model_input and reads_h
    assert all(resident_bytes(r, DEV.l2_bytes) == 0.0 for r in reads_model_input)   # a model input: not counted
    (h,) = [p for p in producer_inputs(reads_h[0]) if p.nbytes == 32 * 64 * 4]
    assert h.moved_since >= 32 * 4096 * 4                      # the second mm's output (and its operands) since
    assert resident_bytes(reads_h[0], DEV.l2_bytes) >= h.nbytes  # 60 MiB hold it
    # the region also reads the 4-byte sum, written after h: it stays in any cache of these sizes
    assert resident_bytes(reads_h[0], h.moved_since) == pytest.approx(4.0)   # h is gone from a cache this small
    half = h.moved_since + h.nbytes / 2
    assert resident_bytes(reads_h[0], half) == pytest.approx(h.nbytes / 2 + 4.0)


def test_credited_time_takes_the_resident_bytes_off_at_the_ceiling_and_keeps_the_ramp() -> None:
    c = dataclasses.replace(Coefficients.defaults(DEV), bw_efficiency=0.5, ramp_us=1.0)
    per_us = 0.5 * DEV.effective_copy_bandwidth_gbs() * 1000.0            # bytes per microsecond at the ceiling
    assert credited_us(10.0, [0.0, 0.0], DEV, c) == pytest.approx(20.0)   # two occurrences, nothing resident
    assert credited_us(10.0, [2 * per_us], DEV, c) == pytest.approx(8.0)
    assert credited_us(10.0, [100 * per_us], DEV, c) == pytest.approx(1.0)  # never below the ramp
    assert credited_us(0.5, [100 * per_us], DEV, c) == pytest.approx(0.5)   # nor above the time itself


def test_audit_model_records_each_occurrences_resident_bytes_per_call() -> None:
    from stitchtune.analysis.audit import RegionAudit, audit_model

    model, inputs = _model()
    audits, _ = audit_model(model, inputs, DEV, sass=False, peer=False)
    assert all(set(a.l2_resident) == {"inference"} and len(a.l2_resident["inference"]) == 1 for a in audits)
    assert sorted(a.l2_resident["inference"][0] > 0 for a in audits) == [False, True]
    assert RegionAudit.from_dict(audits[0].to_dict()) == audits[0]


def test_a_tuple_valued_op_between_counts_the_bytes_it_writes() -> None:
    """``torch.sort`` writes two tensors through one FX node whose ``meta["val"]`` is a tuple (values and
    indices, 1.5 MiB here): they evict the region's input as any other op's outputs do (they counted 0 bytes
    before, so the input was claimed resident in a cache that small)."""
    from stitchtune.deploy.model_tuning import capture_regions

    torch = pytest.importorskip("torch")

    class SortBetween(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(64, 64))

        def forward(self, x: "torch.Tensor", y: "torch.Tensor") -> "torch.Tensor":
            h = x @ self.w                                   # written first (8 KiB)
            s = torch.sort(y, dim=1)                         # then values (512 KiB) and int64 indices (1 MiB)
            return torch.softmax(h + 1.0, dim=-1) * s.values[:, :1] + s.indices[:, :1]

    regions = capture_regions(SortBetween(), (torch.randn(32, 64), torch.randn(32, 4096)), "inference")
    (h,) = [p for r in regions for p in producer_inputs(r) if p.nbytes == 32 * 64 * 4]
    assert h.moved_since >= 32 * 4096 * (4 + 8)              # the sort's two outputs (and its input)


def test_an_input_listed_twice_is_counted_once() -> None:
    """A region that reads one produced tensor through two of its inputs holds it once in the L2."""
    from types import SimpleNamespace

    from stitchtune.deploy.model_tuning import capture_regions

    model, inputs = _model()
    r = next(r for r in capture_regions(model, inputs, "inference") if producer_inputs(r))
    twice = SimpleNamespace(nodes=r.nodes, inputs=(*r.inputs, *r.inputs))
    assert producer_inputs(twice) == producer_inputs(r)
    assert resident_bytes(twice, DEV.l2_bytes) == resident_bytes(r, DEV.l2_bytes)
