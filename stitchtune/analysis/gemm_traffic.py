"""A GEMM's traffic through the L2, wave by wave of output tiles, as cuBLAS / CUTLASS tile it (an estimate).

Contract
--------
* :class:`GemmTiling`: the output tile (``tile_m`` x ``tile_n`` elements) each CTA computes and how many CTAs run at
  once (``concurrent``: the device's SMs x ``ctas_per_sm``). :meth:`GemmTiling.for_device` takes the SM count from
  a :class:`~stitchtune.hardware.device.Device` (never a literal).
* :func:`gemm_shape(a_shape, b_shape) -> GemmShape | None`: ``(batch, M, N, K)`` of ``A @ B`` from the operands'
  shapes (2-D: ``[M, K] @ [K, N]``; 3-D: batched, ``[b, M, K] @ [b, K, N]``); ``None`` for anything else.
* :func:`waves(shape, tiling) -> list[GemmWave]`: the GEMM as the waves of CTAs the hardware runs, in launch order;
  each wave's share (0..1) of ``A``, of ``B`` and of the output it touches. Output tiles are ordered the way CUTLASS's
  identity threadblock swizzle numbers them (``blockIdx.x`` walks the M tiles, ``blockIdx.y`` the N tiles,
  ``blockIdx.z`` the batch; blocks are issued in linear block order), so a wave covers a run of M tiles for one or
  a few N columns of tiles. The shares of one GEMM's waves of the output sum to 1; an operand's shares sum to more
  than 1 where later waves read its panels again.

How the L2 simulation uses it (:func:`stitchtune.analysis.l2_residency.simulate` with ``gemm=``): per wave, the
wave's ``A`` row panels and ``B`` column panels are touched (read: what is resident hits, the rest comes from DRAM:
an operand's first touch), then the wave's output tiles are written (the epilogue, once per tile, after its K loop).
So a GEMM's output enters the L2 in pieces, the last wave's tiles most recent, with the operand panels that later
waves re-read kept warm between them; a single-wave GEMM (a weight gradient: few tiles, a long K loop) streams both
operands whole and then writes its output.

What was read for this (public sources, not copied): CUTLASS's hierarchical GEMM (``media/docs/efficient_gemm.md``:
one CTA per output tile, a K main loop over operand slabs staged through shared memory, the epilogue writing the tile
once) and ``include/cutlass/gemm/threadblock/threadblock_swizzle.h`` (``GemmIdentityThreadblockSwizzle``:
``get_tile_offset`` maps ``blockIdx.x`` to the M tile, ``blockIdx.y`` to the N tile, with an optional 2^k-wide
interleave of N tiles; ``GemmBatchedIdentityThreadblockSwizzle``: the batch in ``blockIdx.z``). cuBLAS's own kernels
(``sm80_xmma_gemm_*``, ``cutlass_80_simt_sgemm_256x128_*`` in the H200 traces) are closed; their tile (128 or 256
by 128 in the names) and raster are taken as CUTLASS's. Not modelled: split-K (partial tiles through a workspace),
stream-K, the swizzle's N interleave, L2 cache hints, and the order of blocks inside a wave.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from stitchtune.hardware.device import Device

__all__ = ["GemmShape", "GemmTiling", "GemmWave", "gemm_shape", "waves"]


@dataclass(frozen=True)
class GemmTiling:
    """Output tile of one CTA (elements) and the CTAs resident at once (module docstring)."""

    tile_m: int
    tile_n: int
    concurrent: int   # no default: the SM count comes from a Device (for_device)

    def __post_init__(self) -> None:
        if min(self.tile_m, self.tile_n, self.concurrent) < 1:
            raise ValueError(f"GemmTiling: tiles and concurrent CTAs >= 1 (got {self})")

    @classmethod
    def for_device(cls, device: Device, tile_m: int = 128, tile_n: int = 128, ctas_per_sm: int = 1) -> GemmTiling:
        """The tiling with ``device.sm_count`` x ``ctas_per_sm`` CTAs at once."""
        return cls(tile_m, tile_n, max(1, device.sm_count * ctas_per_sm))


@dataclass(frozen=True)
class GemmShape:
    """``batch`` independent ``[M, K] @ [K, N]`` products."""

    batch: int
    m: int
    n: int
    k: int


@dataclass(frozen=True)
class GemmWave:
    """One wave of CTAs: the share (0..1) of ``A``, ``B`` and the output it touches, and of ``A`` and ``B`` touched
    by this wave and the ones before it (``a_seen``, ``b_seen``: an operand's bytes that have come from DRAM)."""

    a: float
    b: float
    out: float
    a_seen: float
    b_seen: float


def gemm_shape(a_shape: Sequence[int], b_shape: Sequence[int]) -> GemmShape | None:
    """See the module docstring."""
    a, b = tuple(int(x) for x in a_shape), tuple(int(x) for x in b_shape)
    if len(a) == len(b) == 2 and a[1] == b[0]:
        return GemmShape(1, a[0], b[1], a[1])
    if len(a) == len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        return GemmShape(a[0], a[1], b[2], a[2])
    return None


def waves(shape: GemmShape, tiling: GemmTiling) -> list[GemmWave]:
    """See the module docstring."""
    mt, nt = math.ceil(shape.m / tiling.tile_m), math.ceil(shape.n / tiling.tile_n)
    per_batch = mt * nt
    total = shape.batch * per_batch
    if total == 0:
        return []
    out: list[GemmWave] = []
    seen_rows: set[tuple[int, int]] = set()
    seen_cols: set[tuple[int, int]] = set()
    for start in range(0, total, tiling.concurrent):
        stop = min(total, start + tiling.concurrent)
        rows: set[tuple[int, int]] = set()
        cols: set[tuple[int, int]] = set()
        for t in range(start, stop):
            batch, r = divmod(t, per_batch)
            n_tile, m_tile = divmod(r, mt)      # blockIdx.x (M tiles) fastest
            rows.add((batch, m_tile))
            cols.add((batch, n_tile))
        seen_rows |= rows
        seen_cols |= cols
        out.append(GemmWave(len(rows) / (shape.batch * mt), len(cols) / (shape.batch * nt), (stop - start) / total,
                            len(seen_rows) / (shape.batch * mt), len(seen_cols) / (shape.batch * nt)))
    return out
