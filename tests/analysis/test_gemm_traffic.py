"""stitchtune/analysis/gemm_traffic.py: a GEMM's waves of output tiles (the L2 simulation's GEMM model)."""

from __future__ import annotations

import pytest

from stitchtune.analysis.gemm_traffic import GemmShape, GemmTiling, gemm_shape, waves
from stitchtune.hardware.device import get_device


def test_shapes_of_plain_and_batched_products() -> None:
    assert gemm_shape((4096, 768), (768, 3072)) == GemmShape(1, 4096, 3072, 768)
    assert gemm_shape((96, 512, 64), (96, 64, 512)) == GemmShape(96, 512, 512, 64)
    assert gemm_shape((4096, 768), (700, 3072)) is None          # K differs
    assert gemm_shape((8, 4, 4), (4, 4)) is None                 # mixed ranks: not a GEMM this model walks
    assert gemm_shape((4,), (4,)) is None


def test_tiling_takes_the_sm_count_from_the_device_and_checks_itself() -> None:
    dev = get_device("h200")
    assert GemmTiling.for_device(dev).concurrent == dev.sm_count
    assert GemmTiling.for_device(dev, 256, 128, ctas_per_sm=2).concurrent == 2 * dev.sm_count
    with pytest.raises(ValueError):
        GemmTiling(0, 128, 132)


def test_a_wide_output_re_reads_a_and_walks_b_column_by_column() -> None:
    """BERT's FFN up-projection [4096, 768] @ [768, 3072], 128 x 128 tiles, 132 at once: 768 tiles in 6 waves;
    blockIdx.x walks the 32 M tiles, so the first wave reads all of A and 5 of B's 24 column panels, every later
    wave reads A again and the next columns."""
    ws = waves(GemmShape(1, 4096, 3072, 768), GemmTiling(128, 128, 132))
    assert len(ws) == 6
    assert sum(w.out for w in ws) == pytest.approx(1.0)
    assert ws[0].a == pytest.approx(1.0) and ws[0].b == pytest.approx(5 / 24)
    assert all(w.a_seen == pytest.approx(1.0) for w in ws)
    assert [round(w.b_seen * 24) for w in ws] == [5, 9, 13, 17, 21, 24]
    assert ws[-1].out == pytest.approx((768 - 5 * 132) / 768)


def test_a_batched_product_walks_the_batches_in_order() -> None:
    """Attention scores [96, 512, 64] @ [96, 64, 512]: 16 tiles per batch, 1536 in 12 waves; each wave reads the
    operands of the 8-9 batches it covers, so an operand is seen whole only at the last wave."""
    ws = waves(GemmShape(96, 512, 512, 64), GemmTiling(128, 128, 132))
    assert len(ws) == 12
    assert ws[0].a == pytest.approx(9 * 4 / (96 * 4))            # tiles 0..131: batches 0..8 (8 whole, 1 part)
    assert ws[0].a_seen < ws[5].a_seen < ws[-1].a_seen == pytest.approx(1.0)
    assert sum(w.out for w in ws) == pytest.approx(1.0)


def test_a_small_grid_is_one_wave_that_streams_both_operands() -> None:
    """A weight gradient [768, 4096] @ [4096, 3072] with 256 x 128 tiles: 72 CTAs, one wave reading A and B whole."""
    (w,) = waves(GemmShape(1, 768, 3072, 4096), GemmTiling(256, 128, 132))
    assert (w.a, w.b, w.out, w.a_seen, w.b_seen) == (1.0, 1.0, 1.0, 1.0, 1.0)
