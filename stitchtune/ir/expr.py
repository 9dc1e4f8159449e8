"""The expressions of the kernel IR (:mod:`stitchtune.ir.kir` holds the statements, kernels and programs
and re-exports every name here, so consumers write ``kir.Const``): values that a thread computes
(constants, variables, the special registers, arithmetic, selects, casts, loads, shuffles, cluster
ranks and remote loads, the extents of a generic kernel), the scalar types and the identifier check every
name of the IR passes. Their semantics are the module docstring of :mod:`stitchtune.ir.kir`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

from stitchtune.graph.values import ITEMSIZE


IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")

#: scalar types of IR values
F32 = "f32"
I32 = "i32"
I64 = "i64"
BOOL = "bool"
#: the IR type holding a graph int dtype exactly (int registers, see :class:`IntOp`)
INT_VTYPE = {"int32": I32, "int64": I64}

#: element types of buffers (graph dtypes) and their sizes: graph/values.py's ITEMSIZE
ELEM_BYTES = ITEMSIZE


def check_ident(name: str) -> str:
    """Return ``name`` if it is a safe C identifier, else raise ``ValueError`` (a bug, not user input)."""
    if not IDENT_RE.match(name):
        raise ValueError(f"not a safe identifier: {name!r}")
    return name


# ----------------------------------------------------------------------------------------------
# Expressions
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Const:
    """A literal. ``dtype`` is f32, i32 or bool."""

    value: float | int | bool
    dtype: str = F32


@dataclass(frozen=True)
class Var:
    """A per-thread scalar variable."""

    name: str
    dtype: str = F32

    def __post_init__(self) -> None:
        check_ident(self.name)


@dataclass(frozen=True)
class Special:
    """A launch coordinate: ``tid`` (threadIdx.x), ``bid`` (blockIdx.x), ``bdim``, ``gdim``."""

    kind: str

    def __post_init__(self) -> None:
        if self.kind not in ("tid", "bid", "bdim", "gdim"):
            raise ValueError(self.kind)


#: binary operators on i32/f32/bool operands. Comparisons give bool.
BIN_OPS = ("+", "-", "*", "/", "%", "min", "max", "<", "<=", ">", ">=", "==", "!=", "&&", "||", "&", "^", ">>", "<<")
CMP_OPS = ("<", "<=", ">", ">=", "==", "!=")


@dataclass(frozen=True)
class Bin:
    """``a op b``. Integer ``/`` and ``%`` are C's (truncating; operands here are non-negative)."""

    op: str
    a: "Expr"
    b: "Expr"

    def __post_init__(self) -> None:
        if self.op not in BIN_OPS:
            raise ValueError(self.op)


@dataclass(frozen=True)
class MathOp:
    """A float32 graph operator from :mod:`stitchtune.graph.ops` applied to float32 operands (int
    operands where the op's ``arg_types`` say ``i``: ``uniform``'s seed and counter)."""

    op: str
    args: tuple["Expr", ...]


@dataclass(frozen=True)
class IntOp:
    """A graph int operator (a key of :data:`stitchtune.graph.int_ops.INT_CUDA`: add, sub, mul, neg, abs,
    maximum, minimum, or ``from_float``, the saturating float32 -> int conversion) at int type
    ``dtype`` (i32 / i64). Operands are converted to ``dtype`` first (``from_float``: a float32
    operand); arithmetic wraps (two's complement)."""

    op: str
    args: tuple["Expr", ...]
    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in (I32, I64):
            raise ValueError(self.dtype)


@dataclass(frozen=True)
class Select:
    """``cond ? a : b``."""

    cond: "Expr"
    a: "Expr"
    b: "Expr"


@dataclass(frozen=True)
class Cast:
    """Conversion between i32 and f32."""

    expr: "Expr"
    dtype: str


@dataclass(frozen=True)
class Load:
    """Scalar load of ``buf[index]`` (global parameter or shared buffer), as float32; with ``dtype``
    i32 / i64 (an int buffer only), the element itself at that width (int registers).

    ``pred`` false: no memory access, the value is 0.0 (0).
    """

    buf: str
    index: "Expr"
    pred: "Expr | None" = None
    dtype: str = F32


@dataclass(frozen=True)
class IndexLoad:
    """An i32 row index read from an ``int32``/``int64`` input: ``buf[index]`` when it lies in
    ``[0, bound)``, else ``-1`` (compared at the buffer's own width, so no value wraps into range).

    ``pred`` false: no memory access, the value is ``-1``. (A :class:`Load` of an int buffer gives its float value.)
    """

    buf: str
    index: "Expr"
    bound: int
    pred: "Expr | None" = None


@dataclass(frozen=True)
class LocalRef:
    """Read ``array[index]`` of a per-thread :class:`LocalArray`."""

    array: str
    index: "Expr"


@dataclass(frozen=True)
class Shfl:
    """``__shfl_xor_sync(0xffffffff, value, lane_mask, width)`` (float32)."""

    value: "Expr"
    lane_mask: int
    width: int = 32


@dataclass(frozen=True)
class ClusterRank:
    """This block's rank in its cluster, ``cluster.block_rank()`` (i32, ``0 <= rank < Kernel.cluster``)."""


@dataclass(frozen=True)
class RemoteLoad:
    """``cluster.map_shared_rank(buf, rank)[index]``: a float32 load of shared buffer ``buf`` of the
    block of rank ``rank`` in this block's cluster (distributed shared memory). ``pred`` false: no
    access, the value is 0.0."""

    buf: str
    rank: "Expr"
    index: "Expr"
    pred: "Expr | None" = None


@dataclass(frozen=True)
class Extent:
    """A dynamic extent: the kernel's ``int`` argument ``name`` (i32, ``>= 1``), one of
    ``Kernel.extents``; the same value in every thread of a launch (a generic kernel, see
    :class:`~stitchtune.ir.launches.DynamicInfo`)."""

    name: str

    def __post_init__(self) -> None:
        check_ident(self.name)


Expr = Union[Const, Var, Special, Bin, MathOp, IntOp, Select, Cast, Load, IndexLoad, LocalRef, Shfl, ClusterRank,
             RemoteLoad, Extent]
