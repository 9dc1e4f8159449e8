"""Transposed outputs: element-wise regions whose output's contiguous axis is a row axis of the view.

The kernels of the row family give a warp's lanes adjacent columns ``c`` of the view, the contiguous
axis of the domain tensor. An output whose own innermost (stride-1) axis is one of the view's *row*
axes (a permute copy ``x.permute(0, 2, 3, 1)``, BERT's ``k.transpose(-1, -2)`` made contiguous, with or
without element-wise ops fused) is then stored with a stride of many elements between lanes: each
lane's 4 bytes in its own 32-byte sector, 8x the sectors of a coalesced store. Such a region can be
lowered through a tile of shared memory instead (:mod:`stitchtune.lower.transpose`): loaded along
``c``, stored along that row axis.

:func:`transpose_tile` finds the row axis. The view row index decomposes as
``r = (hi * dim + t) * inner + lo`` where ``(r // inner) % dim = t`` is the output's stride-1 row
factor (:class:`~stitchtune.plan.index_map.Factor` ``(dim, inner, stride=1)``); a tile is ``E`` values
of ``t`` by ``E`` columns at fixed ``(hi, lo)``.

Contract: :func:`transpose_tile` returns a :class:`TransposeTile` only for a static element-wise plan
(no reductions, cross reductions, scatters or row-move rewrite) of a graph without index ops other than
``slice`` (GPT-2's fused q / k / v columns, k transposed), ``iota``
or int registers, whose outputs are all full-size with one writer per element, and at least one
of whose outputs (floating point) has
columns that are not contiguous and a stride-1 row factor of ``dim >= MIN_DIM``; every such output
has the same one. The lowering stores exactly those outputs (:attr:`TransposeTile.outputs`) through
the tile; other outputs are stored as the element-wise kernel stores them. :meth:`TransposeTile.fixed_along`
says which inputs have one value per column of a tile (read once per tile, not once per pass).
"""

from __future__ import annotations

from dataclasses import dataclass

from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.graph.parse import Graph
from stitchtune.plan.family import Family
from stitchtune.plan.index_map import Factor, IndexMap
from stitchtune.plan.ints import int_registers

__all__ = ["MIN_DIM", "TransposeTile", "transpose_tile", "stride_one_factor"]

#: the smallest extent of the transposed row axis worth a tile: a warp's store then covers at least
#: 8 consecutive elements (one 32-byte sector of float32) of that axis
MIN_DIM = 8

_FLOATS = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class TransposeTile:
    """The row axis a tiled transpose walks: view rows ``r`` with ``(r // inner) % dim == t``, the
    outputs' stride-1 axis; ``outputs``: the outputs stored through the tile (graph order)."""

    dim: int
    inner: int
    outputs: tuple[str, ...]

    def factor(self) -> Factor[int]:
        """The outputs' stride-1 row factor."""
        return Factor(self.dim, self.inner, 1)

    def fixed_along(self, imap: IndexMap) -> bool:
        """Whether a tensor read through ``imap`` has one address for every position ``t`` of a tile
        (view rows ``r = (hi * dim + t) * inner + lo`` at fixed ``hi``, ``lo`` and column): each row
        factor ``(r // f.inner) % f.dim`` lies below the tile's axis (``f.inner * f.dim`` divides
        ``inner``: it reads ``lo`` only) or above it (``f.inner`` a multiple of ``dim * inner``: it
        reads ``hi`` only). A bias over the view's columns, or over columns and the head axis ``lo``
        of a head split (BERT's ``[768]`` bias of the K^T copy: factor ``(12, 1, 64)``), is fixed."""
        span = self.dim * self.inner
        return all(self.inner % (f.inner * f.dim) == 0 or f.inner % span == 0 for f in imap.rows.factors)


def stride_one_factor(imap: IndexMap) -> Factor[int] | None:
    """The row factor of ``imap`` with stride 1 (the tensor's innermost axis runs along the view's
    rows), or None."""
    return next((f for f in imap.rows.factors if f.stride == 1), None)


def _transposed(imap: IndexMap) -> Factor[int] | None:
    """The stride-1 row factor of an output whose columns are strided (not a contiguous run), else None."""
    if imap.cols.broadcast or imap.cols.contiguous() or imap.row_repeats:
        return None
    return stride_one_factor(imap)


def transpose_tile(graph: Graph, family: Family, maps: dict[str, IndexMap], dtypes: dict[str, str],
                   plain_elementwise: bool) -> TransposeTile | None:
    """The tile of the transposed outputs of an element-wise plan (module docstring), or None.
    ``plain_elementwise``: the plan has no cross reductions, scatters or row-move rewrite."""
    if family != Family.ELEMENTWISE or not plain_elementwise or int_registers(graph):
        return None
    # slices (a fused projection's q / k / v columns) are read as the row kernel reads them; concat,
    # gathers and iota are not tiled
    if any(OPS[nd.op].kind in INDEX_KINDS - {"slice"} or nd.op == "iota" for nd in graph.nodes):
        return None
    found: Factor[int] | None = None
    outs: list[str] = []
    for name in dict.fromkeys(graph.outputs):
        m = maps[name]
        if m.rows.broadcast or m.cols.broadcast or not m.bijective:
            return None   # every output full-size and one writer per element (stored per view element)
        f = _transposed(m)
        if f is None:
            continue
        if dtypes[name] not in _FLOATS:
            return None
        if found is not None and (f.dim, f.inner) != (found.dim, found.inner):
            return None   # two different transposed axes: one tile cannot serve both
        found = f
        outs.append(name)
    if found is None or found.dim < MIN_DIM:
        return None
    return TransposeTile(found.dim, found.inner, tuple(outs))
