"""A cache write stitched in place: the rows of ``values`` stored into ``table`` from a runtime start.

transformers' ``StaticCache`` writes a step's new keys / values into a preallocated cache at
``cache_position`` (``iota(S) + start``: one position in a decode step, ``S`` in a prompt); after
functionalization the backend sees ``index_put(cache, [.., iota(S) + start], new)`` (issue 41 item 2,
:mod:`stitchtune.deploy.torch_put` finds it). This module builds the kernel that does that write *in
place*: only the ``S`` new rows are written, the rest of the cache is not read or written (the
functional ``index_put`` reads and writes the whole cache, and AOTAutograd then copies it back).

Contract: :func:`put_program` takes a :class:`PutShape` (``table`` viewed as ``[outer, rows,
row_size]`` row-major, ``values`` as ``[outer, count, row_size]``) and returns a static
:class:`~stitchtune.ir.kir.Program` of one kernel ``put`` over three buffers:

* ``table`` (role output, graph tensor ``"table"``): written in place; the caller binds the cache
  itself (nothing in it is read, and elements outside the new rows keep what they hold);
* ``vals`` (input ``"values"``): the new rows, row-major;
* ``start`` (input ``"start"``, int64, one element): the first row written; with
  ``PutShape.positions``, ``count`` positions (int32 / int64), one per values' row
  (``index_copy_(axis, positions, new)`` with a position tensor).

Element ``e`` of ``values`` (``o, j, c``) goes to ``table[(o * rows + start + j) * row_size + c]``
(``positions[j]`` in place of ``start + j``). The start is read by
:class:`~stitchtune.ir.kir.IndexLoad` bounded by ``rows - count + 1``: a start outside ``[0, rows -
count]`` (a position outside the cache) writes nothing at all; a position outside ``[0, rows)``
writes nothing for its row. So no address outside ``table`` or ``vals`` is ever formed (PyTorch
raises there; the caller checks on the host first where it can and runs PyTorch's op). Two equal
positions race (which row lands is unspecified, as on PyTorch's CUDA path). Accesses are
``width`` elements (16 bytes where ``row_size`` allows); a grid-stride loop over a grid sized
from the device's SMs. Names are generated here; nothing from a graph reaches the source. Sizes
must fit int32 indexing (:class:`ValueError` otherwise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stitchtune.hardware.device import Device
from stitchtune.ir import kir
from stitchtune.ir.kir import BufferRole, I32, Var
from stitchtune.lower.base import I

__all__ = ["PutShape", "PUT_KERNEL", "PUT_BLOCK", "put_program", "put_width"]

#: the kernel's name and block size
PUT_KERNEL = "put"
PUT_BLOCK = 256
#: blocks per SM at most (a grid-stride loop covers the rest)
_BLOCKS_PER_SM = 8
#: the float dtypes a cache may have
_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class PutShape:
    """A cache write's shape: ``table`` ``[outer, rows, row_size]``, ``values`` ``[outer, count,
    row_size]`` (the cache axis in the middle: e.g. ``[B*H, max_len, head_dim]``), of ``dtype``."""

    outer: int
    rows: int
    count: int
    row_size: int
    dtype: str
    #: the rows come from a tensor of ``count`` positions (``index_dtype``), not from one start
    positions: bool = False
    index_dtype: str = "int64"

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"a cache write into a {self.dtype} table (float32 / float16 / bfloat16 only)")
        if min(self.outer, self.rows, self.count, self.row_size) < 1 or self.count > self.rows:
            raise ValueError(f"bad cache write shape {self}")
        if self.index_dtype not in ("int32", "int64"):
            raise ValueError(f"cache positions of {self.index_dtype} (int32 / int64 only)")
        if self.table_size >= 2**31:
            raise ValueError(f"a cache of {self.table_size} elements (int32 indexing: < 2**31)")

    @property
    def table_size(self) -> int:
        return self.outer * self.rows * self.row_size

    @property
    def values_size(self) -> int:
        return self.outer * self.count * self.row_size


def put_width(shape: PutShape) -> int:
    """Elements per access: the most that fit 16 bytes and divide ``row_size`` (so a vector never
    straddles two rows and every access is aligned to its width)."""
    w = 16 // kir.ELEM_BYTES[shape.dtype]
    while shape.row_size % w:
        w //= 2
    return w


def _body(shape: PutShape, threads: int, w: int) -> tuple[kir.Stmt, ...]:
    """The grid-stride loop: per vector ``t``, its (o, j, c), the load of ``w`` values, the store."""
    start, t = Var("pstart", I32), Var("pt", I32)
    o, j, c = Var("po", I32), Var("pj", I32), Var("pc", I32)
    vals = tuple(Var(f"pv{k}") for k in range(w))
    e = kir.Bin("*", t, I(w))
    per_outer = shape.count * shape.row_size
    gtid = kir.Bin("+", kir.Bin("*", kir.Special("bid"), kir.Special("bdim")), kir.Special("tid"))
    ok = kir.Bin(">=", start, I(0))
    row = start if shape.positions else kir.Bin("+", start, j)
    dst = kir.Bin("+", kir.Bin("*", kir.Bin("+", kir.Bin("*", o, I(shape.rows)), row), I(shape.row_size)), c)
    where: tuple[kir.Stmt, ...] = (kir.Assign(o, kir.Bin("/", e, I(per_outer))),
                                    kir.Assign(j, kir.Bin("/", kir.Bin("%", e, I(per_outer)), I(shape.row_size))),
                                    kir.Assign(c, kir.Bin("%", e, I(shape.row_size))))
    if shape.positions:   # row j's position, checked against the table (-1 outside: not written)
        where += (kir.Assign(start, kir.IndexLoad("start", j, shape.rows)),)
    loop = where + (kir.LoadVec(vals, "vals", e, ok), kir.StoreVec("table", dst, vals, ok))
    if shape.positions:
        return (kir.Comment("cache write: values' row j at positions[j], in place (one outside: not written)"),
                kir.For(t, gtid, I(shape.values_size // w), threads, loop))
    return (kir.Comment("cache write: values' rows at start + j, in place (a start outside the cache writes nothing)"),
            kir.Assign(start, kir.IndexLoad("start", I(0), shape.rows - shape.count + 1)),
            kir.For(t, gtid, I(shape.values_size // w), threads, loop))


def _starts(shape: PutShape) -> int:
    """Elements of the ``start`` buffer: one start, or a position per values' row."""
    return shape.count if shape.positions else 1


def put_program(shape: PutShape, device: Device) -> kir.Program:
    """The in-place cache write of ``shape`` for ``device`` (see the module docstring)."""
    w = put_width(shape)
    vectors = shape.values_size // w
    grid = max(1, min(math.ceil(vectors / PUT_BLOCK), device.sm_count * _BLOCKS_PER_SM))
    params = (kir.Param("table", shape.dtype, shape.table_size, BufferRole.OUTPUT),
              kir.Param("vals", shape.dtype, shape.values_size, BufferRole.INPUT),
              kir.Param("start", shape.index_dtype, _starts(shape), BufferRole.INPUT))
    kernel = kir.Kernel(PUT_KERNEL, params, _body(shape, grid * PUT_BLOCK, w), PUT_BLOCK)
    buffers = (kir.BufferSpec("table", shape.dtype, shape.table_size, BufferRole.OUTPUT, "table"),
               kir.BufferSpec("vals", shape.dtype, shape.values_size, BufferRole.INPUT, "values"),
               kir.BufferSpec("start", shape.index_dtype, _starts(shape), BufferRole.INPUT, "start"))
    nbytes = shape.values_size * kir.ELEM_BYTES[shape.dtype]
    prof = kir.KernelProfile(
        name=PUT_KERNEL, grid=grid, block=PUT_BLOCK, smem_bytes=0, est_registers=16 + 2 * w,
        dram_read_bytes=nbytes + _starts(shape) * kir.ELEM_BYTES[shape.index_dtype], dram_write_bytes=nbytes,
        reread_bytes=0, reread_working_set=0,
        flops=0, sfu_ops=0, block_barriers=0, grid_barriers=0, atomics=0,
        bytes_in_flight_per_thread=w * kir.ELEM_BYTES[shape.dtype])
    launch = kir.Launch(PUT_KERNEL, grid, PUT_BLOCK, 0, ("table", "vals", "start"))
    return kir.Program((kernel,), buffers, (launch,),
                       kir.ProgramProfile((prof,), min_bytes=prof.dram_read_bytes + nbytes),
                       notes=(f"cache write in place: {shape.count} of {shape.rows} rows, {w}-wide accesses",))
