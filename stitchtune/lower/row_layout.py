"""The layout of one row-family kernel (:func:`row_layout`): its shared and local arrays (reduction
exchange, cluster state, shared / register reuse caches, cross reductions), shared bytes, grid, rounds
and whether it needs a grid barrier; read by :class:`~stitchtune.lower.row_kernel.RowKernel` and by
:class:`~stitchtune.lower.row.RowLowerer` (resources without kernel bodies)."""

from __future__ import annotations

import math

from stitchtune.ir import kir
from stitchtune.lower.base import Lowerer
from stitchtune.lower.builder import RowLayout
from stitchtune.lower.cluster import STATE_SLOTS, cluster_shared, cluster_size
from stitchtune.lower.cross import cross_layout
from stitchtune.space import SINGLE_PASS, ReuseLevel


def row_layout(low: Lowerer, ki: int, seg: list[int], tasks: int, est_regs: int, is_last: bool = False) -> RowLayout:
    """The layout of kernel ``ki`` of the stages ``seg``; the last kernel also holds the cross reductions' buffers."""
    p, s = low.p, low.s
    levels = low.kernel_reuse[ki]
    wpr = max(1, s.tpr // 32)
    red_slots = max((len(p.stages[i]) if i not in low.merged else (4 if low.merged[i].kind == "welford" else 2)
                     for i in seg), default=0)
    shared: list[kir.SharedBuf] = []
    if red_slots and any(low.stage_scheme(i).exchanges_in_block(s.tpr) for i in seg):
        shared.append(kir.SharedBuf("sred", red_slots * low.rpb * wpr))
    cluster = cluster_size(s.schemes, seg, s.split, low.schemes)
    if cluster > 1:
        shared.append(cluster_shared(max(red_slots, STATE_SLOTS if s.option(SINGLE_PASS) else 0)))
    for c in p.reuse_candidates:
        if levels[c] == ReuseLevel.SHARED:
            shared.append(kir.SharedBuf(f"sc{low.tid_of[c]}", low.rpb * low.chunk))
    locals_ = [kir.LocalArray(f"rc{low.tid_of[c]}", low.per_thread)
               for c in p.reuse_candidates if levels[c] == ReuseLevel.REGISTER]
    cross_sync = False
    if is_last and p.cross:
        x_shared, x_locals, cross_sync = cross_layout(low)
        shared += x_shared
        locals_ += x_locals
    smem_bytes = 4 * sum(x.size for x in shared)
    needs_sync = any(low.stage_scheme(i).grid_barrier for i in seg) or cross_sync
    grid = low.grid_for(tasks, s.block, smem_bytes, est_regs, s.split if s.split > 1 else 1, needs_sync)
    return RowLayout(tuple(shared), tuple(locals_), smem_bytes, grid, math.ceil(tasks / grid), needs_sync,
                      cluster)
