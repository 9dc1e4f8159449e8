"""Block-private copies of small scatter tables: the adds of a block meet in shared memory first.

A ``scatter_add`` into a table of few rows (BERT's token-type embedding: 2 x 768, every one of the
4096 tokens adding into row 0) makes every element of the table the target of thousands of global
atomic adds, which the L2 applies one after another. :func:`privatize_small_tables` rewrites a kernel
that adds into such a table (after :func:`stitchtune.lower.scatter.apply_scatters` turned its stores
into :class:`~stitchtune.ir.kir.AtomicAdd` statements) so that

1. the block zeroes a shared copy of the table (``spt<i>``), then a block barrier;
2. each add of the kernel becomes scalar shared-memory adds into the copy (``atomicAdd`` on a shared
   address: the kernel's other threads add to the same elements), under the same predicate;
3. after the kernel's last statement, a block barrier and one global add per 4 elements of the copy
   (``float4`` where :attr:`Device.atomic_vector_width` allows, else narrower), skipped where all of
   them are zero (exact: a table that starts at +0.0 never holds -0.0, so adding +-0.0 changes nothing).

The global adds into the table per element go from one per row of values to one per block (BERT's
token-type table: 4096 -> 512 adds per element, and a block whose tokens are all of type 0 adds
nothing to row 1). The copy's elements are placed with an XOR swizzle inside each aligned group of
four (``e ^ ((e >> 5) & 3)``) so that a warp adding element ``j`` of its lanes' ``float4`` columns hits
32 distinct banks (the row layout's lane stride is 4 words: 4-way conflicts without it).

When: a float32 table of at most :data:`PRIVATE_TABLE_BYTES` whose rows are at most half the rows of
values one block adds (so the flush moves fewer adds than it saves), in a kernel without clusters
whose blocks per SM the extra shared memory leaves as they were (:func:`~stitchtune.hardware.occupancy.occupancy`
at the kernel's estimated registers: the schedule's resource check stays true). Nothing from the
graph file reaches the generated code (the names are ``spt<i>`` and ``pt*``).

Determinism: the sums stay float atomics (shared, then global): not bitwise reproducible run to run,
like every scatter (docs/architecture.md, "Scatter-add and determinism").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from stitchtune.hardware.device import Device
from stitchtune.hardware.occupancy import occupancy
from stitchtune.ir import kir
from stitchtune.ir.kir import Const, F32, I32, Var
from stitchtune.lower.base import I

__all__ = ["PRIVATE_TABLE_BYTES", "privatize_small_tables"]

#: the largest table (bytes) a block keeps a shared copy of (a policy, not a device limit: the
#: copy must leave the kernel's occupancy as it was, which the device description decides)
PRIVATE_TABLE_BYTES = 16 * 1024


@dataclasses.dataclass(frozen=True)
class SmallTable:
    """A scatter table a kernel may keep a block-private copy of: its buffer, elements, table rows
    and the rows of values the scatter adds (one per index element)."""

    table: str
    size: int
    rows: int
    value_rows: int


def privatize_small_tables(program: kir.Program, tables: tuple[SmallTable, ...], device: Device) -> kir.Program:
    """``program`` whose kernels keep a shared copy of each of ``tables`` they add to (module docstring),
    where the conditions hold; ``program`` itself where none does."""
    prog = program
    grids = {la.kernel: la.grid for la in prog.launches}
    for t in tables:
        for name in [k.name for k in prog.kernels]:
            k = prog.kernel(name)   # as the tables before this one left it (shared memory, profile)
            prof = next(p for p in prog.profile.kernels if p.name == name)
            if _eligible(k, t, grids[name], prof, device, prog):
                prog = _privatize(prog, k, t, device)
    return prog


def _eligible(k: kir.Kernel, t: SmallTable, grid: int, prof: kir.KernelProfile, device: Device,
              prog: kir.Program) -> bool:
    adds = [s for s in kir.walk(k.body) if isinstance(s, kir.AtomicAdd) and s.buf == t.table]
    if not adds or k.cluster > 1 or prog.buffer(t.table).dtype != "float32":
        return False
    if t.size * 4 > PRIVATE_TABLE_BYTES or 2 * t.rows * grid > t.value_rows:
        return False   # too large for a copy, or too few value rows per block to repay the flush
    extra = 4 * _padded(t.size)
    before = occupancy(device, k.block, prof.est_registers, prof.smem_bytes)
    after = occupancy(device, k.block, prof.est_registers, prof.smem_bytes + extra)
    return after.blocks_per_sm >= max(1, before.blocks_per_sm)


def _padded(size: int) -> int:
    """Elements of the shared copy: the table's, rounded up to a whole group of four (the swizzle's)."""
    return -(-size // 4) * 4


def _swizzle(e: kir.Expr) -> kir.Expr:
    """Where element ``e`` of the table lies in the shared copy: ``e ^ ((e >> 5) & 3)``, a permutation
    inside each aligned group of four (so inside the copy)."""
    return kir.Bin("^", e, kir.Bin("&", kir.Bin(">>", e, I(5)), I(3)))


def _privatize(prog: kir.Program, k: kir.Kernel, t: SmallTable, device: Device) -> kir.Program:
    """``prog`` whose kernel ``k`` adds into a shared copy of ``t`` and flushes it at its end."""
    n = sum(1 for s in k.shared if s.name.startswith("spt"))
    copy = f"spt{n}"
    size = _padded(t.size)
    body = _map_adds(k.body, t.table, lambda s: _shared_adds(s, copy))
    counted = sum(1 for s in kir.walk(k.body) if isinstance(s, kir.AtomicAdd) and s.buf == t.table)
    head = (kir.Comment(f"block-private copy of {t.table} (a small scatter table)"),
            *_zero_copy(copy, size, k.block, f"pt{n}z"), kir.Barrier())
    flush = _flush(copy, t.table, t.size, k.block, device.atomic_vector_width, f"pt{n}")
    tail = (kir.Barrier(), kir.Comment(f"add the block's copy into {t.table}"), *flush)
    flushed = sum(1 for s in kir.walk(flush) if isinstance(s, kir.AtomicAdd))
    nk = dataclasses.replace(k, body=head + body + tail, shared=k.shared + (kir.SharedBuf(copy, size),))
    extra = 4 * size
    kernels = tuple(nk if x.name == k.name else x for x in prog.kernels)
    launches = tuple(dataclasses.replace(la, smem_bytes=la.smem_bytes + extra) if la.kernel == k.name else la
                     for la in prog.launches)
    threads = {la.kernel: la.grid * la.block for la in prog.launches}[k.name]
    profiles = tuple(
        dataclasses.replace(p, smem_bytes=p.smem_bytes + extra, block_barriers=p.block_barriers + 2,
                            atomics=max(0, p.atomics - counted * threads) + flushed * threads)
        if p.name == k.name else p for p in prog.profile.kernels)
    return dataclasses.replace(prog, kernels=kernels, launches=launches,
                               profile=dataclasses.replace(prog.profile, kernels=profiles))


def _map_adds(stmts: tuple[kir.Stmt, ...], table: str,
              f: Callable[[kir.AtomicAdd], list[kir.Stmt]]) -> tuple[kir.Stmt, ...]:
    """``stmts`` with every :class:`AtomicAdd` into ``table`` replaced by ``f``'s statements."""
    out: list[kir.Stmt] = []
    for s in stmts:
        if isinstance(s, kir.AtomicAdd) and s.buf == table:
            out += f(s)
        elif isinstance(s, kir.For):
            out.append(dataclasses.replace(s, body=_map_adds(s.body, table, f)))
        elif isinstance(s, kir.If):
            out.append(dataclasses.replace(s, then=_map_adds(s.then, table, f), orelse=_map_adds(s.orelse, table, f)))
        else:
            out.append(s)
    return tuple(out)


def _shared_adds(s: kir.AtomicAdd, copy: str) -> list[kir.Stmt]:
    """One scalar shared add per element of ``s`` (shared memory has no vector float adds)."""
    return [kir.AtomicAdd(copy, _swizzle(s.index if j == 0 else kir.Bin("+", s.index, I(j))), v, s.pred)
            for j, v in enumerate(s.values)]


def _tid4() -> kir.Expr:
    return kir.Bin("*", kir.Special("tid"), I(4))


def _zero_copy(copy: str, size: int, block: int, var: str) -> tuple[kir.Stmt, ...]:
    """The block's threads store zeros to the whole copy, a word per thread and store (consecutive
    threads, consecutive banks: the renderer stores a shared vector element by element)."""
    z = Var(var, I32)
    return (kir.For(z, kir.Special("tid"), I(size), block, (kir.StoreVec(copy, z, (Const(0.0, F32),)),)),)


def _flush(copy: str, table: str, size: int, block: int, vector: int, var: str) -> tuple[kir.Stmt, ...]:
    """The block's threads add its copy into ``table``: a group of four elements per thread and pass,
    read back through the swizzle, added as ``min(4, vector)``-wide atomic adds unless all are zero."""
    z = Var(f"{var}f", I32)
    vals = [Var(f"{var}v{j}", F32) for j in range(4)]
    s = kir.Bin("&", kir.Bin(">>", z, I(5)), I(3))
    loads: list[kir.Stmt] = [kir.LoadVec((vals[j],), copy, kir.Bin("+", z, kir.Bin("^", I(j), s)))
                             for j in range(4)]
    w = 4 if vector >= 4 and size % 4 == 0 else 2 if vector >= 2 and size % 2 == 0 else 1
    adds: list[kir.Stmt] = []
    for j0 in range(0, 4, w):
        idx: kir.Expr = z if j0 == 0 else kir.Bin("+", z, I(j0))
        group = vals[j0:j0 + w]
        nonzero: kir.Expr = kir.Bin("!=", group[0], Const(0.0, F32))
        for v in group[1:]:
            nonzero = kir.Bin("||", nonzero, kir.Bin("!=", v, Const(0.0, F32)))
        pred = nonzero if size % 4 == 0 else kir.Bin("&&", kir.Bin("<", idx, I(size)), nonzero)   # the last group
        adds.append(kir.AtomicAdd(table, idx, group[0], pred, more=tuple(group[1:])))
    return (kir.For(z, _tid4(), I(_padded(size)), 4 * block, tuple(loads + adds)),)
