"""Scatters lowered as atomic adds: the stores of a scattered value become adds into its table.

The planner plans a region with ``scatter_add`` nodes through its core graph
(:mod:`stitchtune.plan.scatter`: the scatters removed, each scattered value ``v`` an output), so
:func:`~stitchtune.lower.entry.lower` first lowers the core as any other region. :func:`apply_scatters`
then rewrites that program:

* every :class:`~stitchtune.ir.kir.StoreVec` of ``v``'s buffer (element ``e`` of ``v`` in ``v``'s own
  row-major layout, whatever order the kernel computes it in) becomes, for each scatter of ``v``,
  ``r = idx[e / row_size]`` range-checked by :class:`~stitchtune.ir.kir.IndexLoad` (``-1`` outside
  ``[0, rows)``) and ``atomicAdd(&table[r * row_size + e % row_size], value)`` where ``r >= 0`` and a
  value is not zero: an index out of range adds nothing, nothing is accessed outside the table or the
  index, and an add of zeros (a padding mask's rows, all naming the padding row) is skipped, which is
  exact (a table that starts at +0.0 never holds -0.0). A table of few rows is added to through a
  block-private shared copy (:mod:`stitchtune.lower.scatter_private`). One index
  load serves a vector whose elements lie in one table row (``row_size`` a multiple of the width),
  and on a device with vector float atomics (``Device.atomic_vector_width``: ``float4`` on cc 9.x) one
  ``float2`` / ``float4`` add of a float32 table serves it too (a 128-bit access at the ideal sectors,
  instead of ``width`` 32-bit adds each lane ``width`` elements from the next: 4x the sectors);
* ``v``'s buffer goes away when ``v`` is not an output of the graph and no kernel reads it back (else
  the stores stay: an output, or a scratch buffer the kernels read);
* the table must be zeros before the first add. The zero fill is placed, in this order of preference:
  in an *earlier kernel* of the program (a grid-stride loop at its start: the kernel boundary orders
  it before the adds; no extra launch), at the start of the adding kernel when a grid barrier of it
  comes before its first add, or when it has grid barriers elsewhere (a ``grid`` cross combine: its
  blocks are co-resident already, so one more grid barrier right after the fill is legal), or when
  its grid has at most one block per SM (co-resident whatever its resources: it gets a grid barrier
  after the fill), else in a small zero-fill kernel launched first (one more launch, counted in the
  program's launches and profile like any other).

The adds are float atomics: the table's sums depend on the order the blocks add in (not bitwise
reproducible); a 16-bit table is added to at its own precision (each add rounded, as
``atomicAdd(__nv_bfloat16*)`` does: sm_80 or later, ``__half``: sm_70; an older device is a
:class:`~stitchtune.errors.ScheduleError` naming the scatter); the kernels' profiles count them (``KernelProfile.atomics``), which is what the
deterministic modes refuse. Names are generated here (``sct0``, ``sidx0``, ``zfill``); nothing from the
graph file reaches the generated code.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import assert_never

from stitchtune.errors import ScheduleError
from stitchtune.graph.parse import Graph
from stitchtune.hardware.device import Device
from stitchtune.ir import kir
from stitchtune.ir.kir import BufferRole, Const, F32, I32, Var
from stitchtune.lower.base import I
from stitchtune.lower.scatter_private import SmallTable, privatize_small_tables
from stitchtune.plan.scatter import Scatter, core_graph

__all__ = ["apply_scatters", "ZERO_FILL_KERNEL", "ZERO_FILL_BLOCK"]

#: the name of the zero-fill kernel (launched first when no earlier kernel or grid barrier can zero)
ZERO_FILL_KERNEL = "zfill"
#: threads per block of the zero-fill kernel and the elements each of its threads zeroes per pass
ZERO_FILL_BLOCK = 256
_ZERO_FILL_PER_THREAD = 4
#: registers of the zero-fill kernel (a loop counter and an address)
_ZERO_FILL_REGISTERS = 16
#: the most elements a thread of an existing kernel zeroes before a zero-fill launch of its own is used
_FILL_PER_THREAD_MAX = 16
#: tables this small are zeroed by whatever kernel runs first (a few microseconds on one SM)
_FILL_SMALL = 1 << 16
#: the compute capability a 16-bit table's atomic add needs (``atomicAdd(__half*)``, ``(__nv_bfloat16*)``)
_ATOMIC_ARCH = {"float16": (7, 0), "bfloat16": (8, 0)}


@dataclasses.dataclass(frozen=True)
class _Target:
    """One table a scattered value's stores add into: its buffer, the index input's buffer and the scatter."""

    table: str
    index: str
    scatter: Scatter


def apply_scatters(program: kir.Program, graph: Graph, scatters: tuple[Scatter, ...], device: Device) -> kir.Program:
    """The program of the core of ``graph`` (:func:`~stitchtune.plan.scatter.core_graph`) with its
    ``scatters`` added (see the module docstring); ``program`` itself when there are none."""
    if not scatters:
        return program
    if program.dynamic is not None:   # the planner refuses generic plans of scatters; a caller's bug otherwise
        raise ValueError("scatters are lowered in static programs only")
    for sc in scatters:
        need = _ATOMIC_ARCH.get(sc.dtype)
        if need is not None and device.compute_capability < need:
            raise ScheduleError(f"scatter_add '{sc.node}' adds into a {sc.dtype} table: the {sc.dtype} atomic add "
                                f"needs sm_{need[0]}{need[1]} or later, {device.name} is {device.arch}")
    buffers, targets = _targets(program, graph, scatters)
    read_back = {s.buf for k in program.kernels for s in kir.walk(k.body) if isinstance(s, kir.LoadVec)} | {
        e.buf for k in program.kernels for e in kir.exprs(k.body) if isinstance(e, kir.Load)}
    outputs = {b.name for b in buffers if b.role == BufferRole.OUTPUT and b.tensor in graph.outputs}
    kept = {b for b in targets if b in read_back or b in outputs}   # stores stay (scratch unless an output)
    dropped = set(targets) - kept
    buffers = [dataclasses.replace(b, role=BufferRole.SCRATCH, tensor="") if b.name in kept - outputs else b
               for b in buffers if b.name not in dropped]
    specs = {b.name: b for b in buffers}
    kernels, added = [], {}
    for k in program.kernels:
        nk, n = _rewrite_kernel(k, targets, kept, specs, device.atomic_vector_width)
        kernels.append(nk)
        added[k.name] = n
    by_name = {k.name: k for k in kernels}
    launches = [dataclasses.replace(la, args=tuple(p.name for p in by_name[la.kernel].params))
                for la in program.launches]
    profiles = [_with_adds(p, added.get(p.name, 0), specs, by_name[p.name], dropped) for p in program.profile.kernels]
    prog = dataclasses.replace(program, kernels=tuple(kernels), buffers=tuple(buffers), launches=tuple(launches),
                               profile=dataclasses.replace(program.profile, kernels=tuple(profiles)))
    small = {t.table: SmallTable(t.table, t.scatter.size, t.scatter.rows, math.prod(graph.spec(t.scatter.index).shape))
             for ts in targets.values() for t in ts}
    prog = privatize_small_tables(prog, tuple(small.values()), device)   # few-row tables: a shared copy per block
    for t in dict.fromkeys(t.table for ts in targets.values() for t in ts):
        prog = _zero(prog, t, specs[t].size, device)
    return prog


def _targets(program: kir.Program, graph: Graph, scatters: tuple[Scatter, ...]
             ) -> tuple[list[kir.BufferSpec], dict[str, list[_Target]]]:
    """The program's buffers plus a table per scatter (``sct<i>``) and an index buffer per index input
    the core does not read already (``sidx<j>``); each scattered value's buffer -> the tables it adds into."""
    buffers = list(program.buffers)
    by_tensor = {(b.role, b.tensor): b.name for b in buffers}
    targets: dict[str, list[_Target]] = {}
    for i, sc in enumerate(scatters):
        buffers.append(kir.BufferSpec(f"sct{i}", sc.dtype, sc.size, BufferRole.OUTPUT, sc.node))
        if (BufferRole.INPUT, sc.index) not in by_tensor:
            name = f"sidx{sum(b.name.startswith('sidx') for b in buffers)}"
            spec = graph.spec(sc.index)
            buffers.append(kir.BufferSpec(name, spec.dtype, math.prod(spec.shape), BufferRole.INPUT, sc.index))
            by_tensor[(BufferRole.INPUT, sc.index)] = name
        vbuf = by_tensor[(BufferRole.OUTPUT, sc.values)]
        targets.setdefault(vbuf, []).append(_Target(f"sct{i}", by_tensor[(BufferRole.INPUT, sc.index)], sc))
    return buffers, targets


# ---------------------------------------------------------------------------------------------- adds
def _rewrite_kernel(k: kir.Kernel, targets: dict[str, list[_Target]], kept: set[str],
                    specs: dict[str, kir.BufferSpec], vector: int = 1) -> tuple[kir.Kernel, int]:
    """``k`` with its stores of scattered values turned into adds (vector adds of up to ``vector``
    elements: the device's ``atomic_vector_width``), its parameters updated (a dropped value buffer
    removed, a kept one in its role, the tables it adds to and their indices added); the number of
    atomic add instructions one thread issues per store statement, summed (for the profile)."""
    count = [0]
    used: list[_Target] = []

    def store(s: kir.StoreVec) -> list[kir.Stmt]:
        out: list[kir.Stmt] = [s] if s.buf in kept else []
        for t in targets[s.buf]:
            adds = _adds(s, t, len(out), vector)
            out += adds
            count[0] += sum(isinstance(a, kir.AtomicAdd) for a in adds)
            used.append(t)
        return out

    body = _map_stores(k.body, lambda s: store(s) if s.buf in targets else [s])
    params = [dataclasses.replace(p, role=specs[p.name].role) if p.name in kept else p
              for p in k.params if p.name not in targets or p.name in kept]
    have = {p.name for p in params}
    for t in used:
        for name, role in ((t.table, BufferRole.OUTPUT), (t.index, BufferRole.INPUT)):
            if name not in have:
                b = specs[name]
                params.append(kir.Param(name, b.dtype, b.size, role))
                have.add(name)
    if not used and params == list(k.params):
        return k, 0
    return dataclasses.replace(k, params=tuple(params), body=body), count[0]


def _map_stores(stmts: tuple[kir.Stmt, ...], f: Callable[[kir.StoreVec], list[kir.Stmt]]) -> tuple[kir.Stmt, ...]:
    """``stmts`` with every :class:`StoreVec` replaced by ``f``'s statements (recursing into loops and ifs)."""
    out: list[kir.Stmt] = []
    for s in stmts:
        match s:
            case kir.StoreVec():
                out += f(s)
            case kir.For():
                out.append(dataclasses.replace(s, body=_map_stores(s.body, f)))
            case kir.If():
                out.append(dataclasses.replace(s, then=_map_stores(s.then, f), orelse=_map_stores(s.orelse, f)))
            case (kir.Assign() | kir.SetLocal() | kir.LoadVec() | kir.AtomicAdd() | kir.Barrier() | kir.GridSync()
                  | kir.ClusterSync() | kir.RemoteStore() | kir.Comment()):
                out.append(s)  # no statements nested in it
            case _:
                assert_never(s)
    return tuple(out)


def _adds(s: kir.StoreVec, t: _Target, tag: int, vector: int = 1) -> list[kir.Stmt]:
    """The adds of one store's values into ``t``'s table: one range-checked index load per table row
    the vector touches (one when ``row_size`` is a multiple of the width), one atomic add per value, or
    one vector add of them all (``float2`` / ``float4``) where the device adds ``vector >= width``
    float32 elements at once and they lie in one table row (aligned: the store's index and ``row_size``
    are multiples of the width) (``tag`` makes the row variables' names distinct from those of the
    store's other tables). An add whose values are all zero is skipped (exact: a table that starts at
    +0.0 never holds -0.0, so adding +-0.0 changes nothing): the rows an embedding's padding mask zeroes,
    which all name the padding row, cost no atomics and no contention on that row."""
    sc, w = t.scatter, len(s.values)
    same_row = sc.row_size % w == 0
    pre, values = _named_values(s.values, tag)
    if 1 < w <= vector and same_row and sc.dtype == "float32":
        row = Var(f"scr{tag}_0", I32)
        addr = kir.Bin("+", kir.Bin("*", row, I(sc.row_size)), kir.Bin("%", s.index, I(sc.row_size)))
        return pre + [kir.Assign(row, kir.IndexLoad(t.index, kir.Bin("/", s.index, I(sc.row_size)), sc.rows, s.pred)),
                      kir.AtomicAdd(t.table, addr, values[0], _add_pred(row, values), more=tuple(values[1:]))]
    out: list[kir.Stmt] = pre
    row = Var(f"scr{tag}_0", I32)
    for j, value in enumerate(values):
        e: kir.Expr = s.index if j == 0 else kir.Bin("+", s.index, I(j))
        if j == 0 or not same_row:
            row = Var(f"scr{tag}_{j}", I32)
            out.append(kir.Assign(row, kir.IndexLoad(t.index, kir.Bin("/", e, I(sc.row_size)), sc.rows, s.pred)))
        addr = kir.Bin("+", kir.Bin("*", row, I(sc.row_size)), kir.Bin("%", e, I(sc.row_size)))
        out.append(kir.AtomicAdd(t.table, addr, value, _add_pred(row, [value])))
    return out


def _named_values(values: tuple[kir.Expr, ...], tag: int) -> tuple[list[kir.Stmt], list[kir.Expr]]:
    """The values of a store as variables (``scv<tag>_<j>``; a variable or constant as it is), so that the
    add and its zero test read each once."""
    pre: list[kir.Stmt] = []
    out: list[kir.Expr] = []
    for j, v in enumerate(values):
        if isinstance(v, (Var, Const)):
            out.append(v)
            continue
        x = Var(f"scv{tag}_{j}", F32)
        pre.append(kir.Assign(x, v))
        out.append(x)
    return pre, out


def _add_pred(row: kir.Expr, values: list[kir.Expr]) -> kir.Expr:
    """``row >= 0`` (the index in range) and some value not zero."""
    nonzero: kir.Expr = kir.Bin("!=", values[0], Const(0.0, F32))
    for v in values[1:]:
        nonzero = kir.Bin("||", nonzero, kir.Bin("!=", v, Const(0.0, F32)))
    return kir.Bin("&&", kir.Bin(">=", row, I(0)), nonzero)


def _with_adds(p: kir.KernelProfile, adds: int, specs: dict[str, kir.BufferSpec], k: kir.Kernel,
               dropped: set[str]) -> kir.KernelProfile:
    """``p`` counting the kernel's atomic adds (``adds`` per thread and store pass, times its threads),
    without the bytes of a dropped value buffer, with the table's bytes (each element at most once per
    add it receives; counted as the table once, the adds' traffic stays in L2 mostly)."""
    if not adds:
        return p
    threads = p.grid * p.block
    tables = sum(specs[q.name].nbytes for q in k.params if q.name.startswith("sct"))
    gone = sum(specs[b].nbytes for b in dropped if b in specs) if dropped else 0
    return dataclasses.replace(p, atomics=p.atomics + adds * threads,
                               dram_write_bytes=max(0, p.dram_write_bytes - gone) + tables)


# ---------------------------------------------------------------------------------------------- zero fill
def _zero(prog: kir.Program, table: str, size: int, device: Device) -> kir.Program:
    """``prog`` with ``table`` zeroed before its first add (see the module docstring)."""
    order = [la.kernel for la in prog.launches]
    kernels = {k.name: k for k in prog.kernels}
    if _is_fill(order[0]):   # a zero fill runs first already: it zeroes this table too, its grid grown to fit
        return _grow_fill(prog, order[0], table, size, device)
    launch = next(la for la in prog.launches if la.kernel == order[0])
    if not _fills_well(launch, size, device):   # too few threads to zero it at the memory's speed
        return _zero_kernel(prog, table, size, device)
    first = next(i for i, name in enumerate(order) if _adds_to(kernels[name], table))
    if first > 0:
        return _zero_in(prog, order[0], table, size)
    k = kernels[order[0]]
    if _barrier_before_adds(k.body, table):
        return _zero_in(prog, order[0], table, size)
    if k.uses_grid_sync:   # its blocks are co-resident already: one more grid barrier orders the fill
        return _zero_in(prog, order[0], table, size, sync=True)
    if launch.grid <= device.sm_count and k.cluster == 1:   # a block per SM at most: co-resident
        return _zero_in(_with_barrier(prog, k.name), k.name, table, size, sync=True)
    return _zero_kernel(prog, table, size, device)


def _is_fill(name: str) -> bool:
    return name == ZERO_FILL_KERNEL or name.startswith(ZERO_FILL_KERNEL + "_")


def _fills_well(launch: kir.Launch, size: int, device: Device) -> bool:
    """Whether a kernel of ``launch``'s shape zeroes ``size`` elements at about the memory's speed: a
    block on every SM, or at most :data:`_FILL_PER_THREAD_MAX` elements per thread (a grid of two
    blocks zeroing BERT's 32000 x 768 word table took 779 us on an H200), or a table of at most
    :data:`_FILL_SMALL` elements (zeroed by one SM in about the time of a launch)."""
    return (launch.grid >= device.sm_count or size <= launch.grid * launch.block * _FILL_PER_THREAD_MAX
            or size <= _FILL_SMALL)


def _with_barrier(prog: kir.Program, name: str) -> kir.Program:
    """``prog`` whose kernel ``name`` has the grid barrier's counters (``gbar``, shared with the
    program's other grid-barrier kernels: the barrier resets itself)."""
    buffers = prog.buffers
    if not any(b.role == BufferRole.BARRIER for b in buffers):
        buffers += (kir.BufferSpec("gbar", "float32", 2, BufferRole.BARRIER, "", zero_init=True),)
    bar = next(b for b in buffers if b.role == BufferRole.BARRIER)
    kernels = tuple(dataclasses.replace(k, barrier_param=bar.name,
                                        params=k.params + (kir.Param(bar.name, "float32", 2, BufferRole.BARRIER),))
                    if k.name == name else k for k in prog.kernels)
    launches = tuple(dataclasses.replace(la, args=la.args + (bar.name,)) if la.kernel == name else la
                     for la in prog.launches)
    return dataclasses.replace(prog, kernels=kernels, buffers=buffers, launches=launches)


def _adds_to(k: kir.Kernel, table: str) -> bool:
    return any(isinstance(s, kir.AtomicAdd) and s.buf == table for s in kir.walk(k.body))


def _barrier_before_adds(body: tuple[kir.Stmt, ...], table: str) -> bool:
    """Whether a grid barrier that every thread reaches (not under an ``If``) comes before the first
    add into ``table`` in program order (depth first: the first round's barrier precedes its adds)."""
    def first(stmts: tuple[kir.Stmt, ...]) -> str | None:
        for s in stmts:
            if isinstance(s, kir.GridSync):
                return "sync"
            if isinstance(s, kir.AtomicAdd) and s.buf == table:
                return "add"
            if isinstance(s, kir.For):
                got = first(s.body)
                if got is not None:
                    return got
            if isinstance(s, kir.If) and any(isinstance(x, kir.AtomicAdd) and x.buf == table
                                             for x in kir.walk(s.then + s.orelse)):
                return "add"
        return None
    return first(body) == "sync"


def _fill_loop(table: str, size: int, threads: int, dtype: str = "float32") -> tuple[kir.Stmt, ...]:
    """A grid-stride loop of ``threads`` threads storing 0.0 to every element of ``table``: 16 bytes a
    store where ``size`` is a whole number of them (aligned: the loop steps by the width), else one
    element a store."""
    w = 16 // kir.ELEM_BYTES.get(dtype, 4)
    w = w if size % w == 0 and w <= 8 else 1
    i = Var("zi", I32)
    gtid = kir.Bin("+", kir.Bin("*", kir.Special("bid"), kir.Special("bdim")), kir.Special("tid"))
    start = gtid if w == 1 else kir.Bin("*", gtid, I(w))
    return (kir.Comment(f"zero {table} (scatter-add target)"),
            kir.For(i, start, I(size), threads * w, (kir.StoreVec(table, i, (Const(0.0),) * w),)))


def _zero_in(prog: kir.Program, name: str, table: str, size: int, sync: bool = False) -> kir.Program:
    """``prog`` whose kernel ``name`` zeroes ``table`` at its start (a parameter added if needed);
    ``sync``: followed by a grid barrier (the kernel has one already, so its grid is co-resident)."""
    launch = next(la for la in prog.launches if la.kernel == name)
    kernels, launches = [], list(prog.launches)
    spec = prog.buffer(table)
    for k in prog.kernels:
        if k.name == name:
            params = k.params if any(p.name == table for p in k.params) else \
                k.params + (kir.Param(table, spec.dtype, spec.size, BufferRole.OUTPUT),)
            fill = _fill_loop(table, size, launch.grid * launch.block, spec.dtype) + ((kir.GridSync(),) if sync else ())
            k = dataclasses.replace(k, params=params, body=fill + k.body)
            launches = [dataclasses.replace(la, args=tuple(p.name for p in params)) if la.kernel == name else la
                        for la in launches]
        kernels.append(k)
    profiles = tuple(dataclasses.replace(p, grid_barriers=p.grid_barriers + 1) if sync and p.name == name else p
                     for p in prog.profile.kernels)
    return dataclasses.replace(prog, kernels=tuple(kernels), launches=tuple(launches),
                               profile=dataclasses.replace(prog.profile, kernels=profiles))


def _fill_kernel(prog: kir.Program, name: str, tables: list[tuple[str, int]],
                 device: Device) -> tuple[kir.Kernel, kir.Launch, kir.KernelProfile]:
    """A zero-fill kernel ``name`` of ``tables`` ((buffer, elements)), its launch and profile: a grid
    for the largest table (:data:`_ZERO_FILL_PER_THREAD` elements a thread, at most 8 blocks an SM)."""
    threads_needed = -(-max(n for _, n in tables) // _ZERO_FILL_PER_THREAD)
    grid = max(1, min(-(-threads_needed // ZERO_FILL_BLOCK), device.sm_count * 8))
    specs = [prog.buffer(t) for t, _ in tables]
    params = tuple(kir.Param(t, spec.dtype, spec.size, BufferRole.OUTPUT) for (t, _), spec in zip(tables, specs))
    body = tuple(st for (t, n), sp in zip(tables, specs) for st in _fill_loop(t, n, grid * ZERO_FILL_BLOCK, sp.dtype))
    kern = kir.Kernel(name, params, body, ZERO_FILL_BLOCK)
    launch = kir.Launch(name, grid, ZERO_FILL_BLOCK, 0, tuple(t for t, _ in tables))
    prof = kir.KernelProfile(
        name=name, grid=grid, block=ZERO_FILL_BLOCK, smem_bytes=0, est_registers=_ZERO_FILL_REGISTERS,
        dram_read_bytes=0, dram_write_bytes=sum(sp.nbytes for sp in specs), reread_bytes=0, reread_working_set=0,
        flops=0, sfu_ops=0, block_barriers=0, grid_barriers=0, atomics=0, bytes_in_flight_per_thread=4)
    return kern, launch, prof


def _zero_kernel(prog: kir.Program, table: str, size: int, device: Device) -> kir.Program:
    """``prog`` with a zero-fill kernel of ``table`` launched first."""
    name = ZERO_FILL_KERNEL + ("" if not any(k.name == ZERO_FILL_KERNEL for k in prog.kernels) else f"_{table}")
    kern, launch, prof = _fill_kernel(prog, name, [(table, size)], device)
    return dataclasses.replace(prog, kernels=(kern,) + prog.kernels, launches=(launch,) + prog.launches,
                               profile=dataclasses.replace(prog.profile, kernels=(prof,) + prog.profile.kernels))


def _grow_fill(prog: kir.Program, name: str, table: str, size: int, device: Device) -> kir.Program:
    """``prog`` whose zero-fill kernel ``name`` zeroes ``table`` too, remade with a grid for its
    largest table (a second table zeroed by the first one's grid was the slow case)."""
    old = next(k for k in prog.kernels if k.name == name)
    tables = [(p.name, prog.buffer(p.name).size) for p in old.params] + [(table, size)]
    kern, launch, prof = _fill_kernel(prog, name, tables, device)
    return dataclasses.replace(
        prog, kernels=tuple(kern if k.name == name else k for k in prog.kernels),
        launches=tuple(launch if la.kernel == name else la for la in prog.launches),
        profile=dataclasses.replace(prog.profile, kernels=tuple(prof if p.name == name else p
                                                                for p in prog.profile.kernels)))
