"""Kernels of regions with int registers beside slice / concat (rotary's positions ``iota + start``
cast to float, next to rotate_half): emulated against the float64 reference."""

from __future__ import annotations

import pytest

from helpers.graphs import rotary_positions_graph
from helpers.lowering import check_emulates


@pytest.mark.parametrize("batch,seq,dim,start", [(2, 8, 16, 3), (1, 5, 8, 0), (3, 12, 32, 7)])
def test_rotary_with_iota_positions_emulates(batch: int, seq: int, dim: int, start: int) -> None:
    check_emulates(rotary_positions_graph(batch, seq, dim, start), n_samples=3)
