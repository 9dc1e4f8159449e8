"""The analytic profile of a lowered kernel (:class:`~stitchtune.ir.launches.KernelProfile`): what its
sweeps read, compute and synchronise, counted in the kernel's IR (:mod:`stitchtune.lower.counts`),
in bytes and operations through the plan's sizes (:func:`kernel_profile`), with the bytes one sweep
reads from a buffer (:func:`read_bytes`) and the sectors a warp access moves per ideal one
(the family's :meth:`~stitchtune.lower.base.Lowerer.sector_factor`). Every family's kernel builder calls :func:`kernel_profile` once per kernel.
"""

from __future__ import annotations

import math

from stitchtune.ir import kir
from stitchtune.ir.kir import BufferRole
from stitchtune.lower.base import Lowerer
from stitchtune.lower.counts import kern_barriers, scratch_loads_per_thread, sweep_counts
from stitchtune.plan.planner import TensorClass
from stitchtune.space import ORDER, Order

__all__ = ["kernel_profile", "read_bytes"]


def kernel_profile(low: Lowerer, kern: kir.Kernel, grid: int, rounds: int, smem_bytes: int, est_regs: int,
                   ki: int) -> kir.KernelProfile:
    """The profile of kernel ``ki`` of ``low``'s program (``kern``, launched on ``grid`` blocks for
    ``rounds`` rounds): what its sweeps read, compute and synchronise counted in its IR
    (:func:`~stitchtune.lower.counts.sweep_counts`, :func:`~stitchtune.lower.counts.kern_barriers`,
    :func:`~stitchtune.lower.counts.scratch_loads_per_thread`), in bytes and operations through the
    plan's sizes: a sweep's float operations per vector step stand for ``M * N / vec`` steps."""
    p, s = low.p, low.s
    elems = p.M * p.N
    specs = {b.name: b for b in low.buffers}
    counts = sweep_counts(kern, low.swept_inputs)
    dram_read = 0.0
    reread = 0.0
    for buf, n in counts.reads.items():
        b = specs[buf]
        size = read_bytes(low, b) * low.sector_factor(b)
        if ki == 0:
            dram_read += size
            reread += size * (n - 1)
        else:
            reread += size * n
    # small operands (per-reduced-index, per-row/column and scalar inputs): read once
    for name, spec in low.g.inputs:
        if name in low.gather_tables:  # counted by the sweeps that load it (read_bytes)
            continue
        if low.cls.get(name) is not TensorClass.FULL and low.in_buf[name] in {pp.name for pp in kern.params}:
            dram_read += math.prod(spec.shape) * kir.ELEM_BYTES[spec.dtype]
    writes = sum(specs[pp.name].nbytes * low.sector_factor(specs[pp.name])
                 for pp in kern.params if pp.role == BufferRole.OUTPUT)
    scratch = sum(specs[pp.name].nbytes for pp in kern.params if pp.role == BufferRole.SCRATCH)
    ws = low.tasks_in_flight_bytes(grid) if ki == 0 else max(
        (specs[b].nbytes for b in counts.reads), default=0)
    elem_bytes = min((kir.ELEM_BYTES[specs[b].dtype] for b in counts.reads), default=4)
    # up to 4 vector loads of the sweep in flight per thread, register-cached or not (what the
    # measured H200 rows show, scripts/model_quality.py)
    in_flight = s.vec * elem_bytes * min(low.iters, 4)
    if any(a.name.startswith("pf") for a in kern.locals):
        # prefetch: the next task's loads are in flight while this task reduces (model assumption)
        in_flight += s.vec * elem_bytes * min(low.iters, 4)
    return kir.KernelProfile(
        name=kern.name, grid=grid, block=s.block, smem_bytes=smem_bytes, est_registers=est_regs,
        dram_read_bytes=int(dram_read), dram_write_bytes=int(writes + scratch),
        reread_bytes=int(reread + scratch), reread_working_set=int(ws),
        flops=int(counts.flops * elems / max(1, s.vec)), sfu_ops=int(counts.sfu * elems / max(1, s.vec)),
        block_barriers=int(rounds * kern_barriers(kern)), grid_barriers=int(rounds * sum(
            1 for st in kir.walk(kern.body) if isinstance(st, kir.GridSync))),
        atomics=0, bytes_in_flight_per_thread=int(in_flight),
        scratch_loads=int(scratch_loads_per_thread(kern)),
        reversed_rereads=s.option(ORDER) == Order.ALTERNATE and reread > 0)


def read_bytes(low: Lowerer, buf: kir.BufferSpec) -> int:
    """Bytes one sweep over the view reads from ``buf``: its size; for an input broadcast along
    part of the rows (each of its rows is read by several view rows) its own size while it fits
    in half the L2 (the repeats hit there), else the view's ``M * N`` elements (each repeat
    misses). A simple model: the L2 share and the all-or-nothing switch are assumptions."""
    name = buf.tensor if buf.role == BufferRole.INPUT else ""
    if name in low.gather_tables:  # the gathered rows, at most the whole table
        return min(buf.nbytes, low.p.M * low.p.N * kir.ELEM_BYTES[buf.dtype])
    if not name or not low.p.mapped(name) or buf.nbytes <= low.dev.l2_bytes // 2:
        return buf.nbytes
    return low.p.M * low.p.N * kir.ELEM_BYTES[buf.dtype]
