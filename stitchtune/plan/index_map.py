"""Per-operand index maps: where element ``(r, c)`` of the plan's ``[M, N]`` view lives in a tensor.

The kernel iterates the view of :class:`~stitchtune.plan.planner.StitchPlan`: ``r`` in ``[0, M)``
(the row axes of the iteration domain, row-major) and ``c`` in ``[0, N)`` (the column axes, ``c``
contiguous; it is the vectorised axis in every family). A tensor of the graph, stored row-major in
its own shape, holds the value of view element ``(r, c)`` at::

    offset(r, c) = sum(((r // f.inner) % f.dim) * f.stride for f in rows.factors)
                 + sum(((c // f.inner) % f.dim) * f.stride for f in cols.factors)

Each :class:`Factor` is one tensor axis (or a run of adjacent axes merged because their strides
chain) that the kernel axis spans; an axis along which the tensor broadcasts has no factor (stride
0). So a position embedding ``[1, S, H]`` against ``[B, S, H]`` (rows ``B*S``) has the row factor
``(dim=S, inner=1, stride=H)``: row base ``(r % S) * H``; an attention mask ``[B, 1, 1, S]`` against
scores ``[B, H, S, S]`` (rows ``B*H*S``) has ``(dim=B, inner=H*S, stride=S)``: ``(r // (H*S)) * S``.

Contract: for every ``r < M``, ``c < N`` the offset lies in ``[0, size)`` (each factor contributes
at most ``(dim - 1) * stride``, and strides are those of the tensor's own row-major layout).
:attr:`IndexMap.plain` says whether the map is the one the kernels of the 2-D family always used
(full ``r * N + c``, per-row ``r``, per-column ``c``, scalar ``0``); lowering computes addresses
from the factors only for the others, so plain operands generate exactly the code of before.
:attr:`IndexMap.vector_contiguous`: ``vec`` adjacent ``c`` are adjacent in memory (vector loads
legal wherever ``N % vec == 0``, since every row stride is then a multiple of ``N``).
:meth:`IndexMap.vector_mode` generalises it per vector width: ``vector`` (the innermost column factor
is a stride-1 run whose length is a multiple of ``vec``: e.g. ``x [B, T, C]`` over columns ``B*C``),
``uniform`` (the tensor broadcasts along the innermost ``vec`` columns: one load, e.g. gamma of a
group norm when ``H*W % vec == 0``) or ``scalar`` (one load per element).
:attr:`IndexMap.bijective`: one view element per tensor element (what an output needs);
:attr:`IndexMap.store_once`: a full tensor that broadcasts along part of the rows only, which an
output may also be: stored by the rows at coordinate 0 of its :attr:`IndexMap.row_repeats`.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Generic, Mapping, TypeVar

from stitchtune.graph.dynamic import SymInt

#: a factor's field type: ``int`` in a plan's index maps, :class:`~stitchtune.graph.dynamic.SymInt` (a monomial
#: of the dynamic extents) in a generic lowering's row symbols (:class:`stitchtune.lower.symbols.RowSymbols`)
Ext = TypeVar("Ext", int, SymInt)


@dataclass(frozen=True)
class Factor(Generic[Ext]):
    """One term of an axis map: ``((i // inner) % dim) * stride`` (``dim >= 2``, ``stride >= 1``):
    ``Factor[int]`` in a plan's index maps, ``Factor[SymInt]`` (fields that follow the dynamic extents)
    in a generic lowering's row symbols."""

    dim: Ext
    inner: Ext
    stride: Ext


@dataclass(frozen=True)
class AxisMap:
    """The map of one kernel axis (``r`` over ``extent = M`` or ``c`` over ``extent = N``)."""

    extent: int
    factors: tuple[Factor[int], ...]

    def offset(self, i: int) -> int:
        """The element offset this axis contributes at index ``i`` (``0 <= i < extent``)."""
        return sum(((i // f.inner) % f.dim) * f.stride for f in self.factors)

    @property
    def broadcast(self) -> bool:
        """The tensor does not vary along this axis (stride 0 everywhere)."""
        return not self.factors

    def contiguous(self, stride: int = 1) -> bool:
        """The whole axis is one run ``i * stride`` (true for an axis of extent 1)."""
        return self.extent == 1 or self.factors == (Factor(self.extent, 1, stride),)

    def needs_mod(self, f: Factor[int]) -> bool:
        """Whether ``f`` needs its ``% dim``: not when ``i // inner < dim`` for every ``i < extent``."""
        return f.inner * f.dim < self.extent

    def vector_mode(self, vec: int) -> str:
        """How ``vec`` adjacent indices ``i0 .. i0 + vec - 1`` (``i0`` a multiple of ``vec``, ``extent %
        vec == 0``) are laid out: ``"vector"`` adjacent elements (the innermost factor has ``inner`` 1,
        stride 1 and ``dim % vec == 0``; every other factor and every stride of the tensor is then a
        multiple of ``vec``, so the access is aligned), ``"uniform"`` one element (every factor's
        ``inner`` is a multiple of ``vec``: the tensor broadcasts along the innermost ``vec``), else
        ``"scalar"`` (one load per element)."""
        if all(f.inner % vec == 0 for f in self.factors):
            return "uniform"
        f = self.factors[-1]
        if f.inner == 1 and f.stride == 1 and f.dim % vec == 0:
            return "vector"
        return "scalar"

    @property
    def span(self) -> int:
        """The number of distinct offsets along this axis (the product of the factor dims)."""
        return prod(f.dim for f in self.factors)


@dataclass(frozen=True)
class IndexMap:
    """The address of view element ``(r, c)`` in one tensor of ``size`` elements (module docstring)."""

    rows: AxisMap
    cols: AxisMap
    size: int
    #: for a tensor that varies along rows and columns: the runs of row axes it does not span,
    #: ``(dim, inner)`` each (``(r // inner) % dim`` is the coordinate along the run), outermost
    #: first; ``()`` when it spans every row axis or broadcasts along all rows or all columns
    row_repeats: tuple[tuple[int, int], ...] = ()

    def offset(self, r: int, c: int) -> int:
        return self.rows.offset(r) + self.cols.offset(c)

    def first_rows(self, r: int) -> bool:
        """Whether view row ``r`` is at coordinate 0 along every run of ``row_repeats``."""
        return all((r // inner) % dim == 0 for dim, inner in self.row_repeats)

    @property
    def vector_contiguous(self) -> bool:
        """Adjacent ``c`` are adjacent elements: ``vec``-wide loads/stores along ``c`` are legal."""
        return not self.cols.broadcast and self.cols.contiguous()

    @property
    def plain(self) -> bool:
        """The map of the 2-D family: rows broadcast or ``r * (N or 1)``, columns broadcast or ``c``."""
        col_ok = self.cols.broadcast or self.cols.contiguous()
        row_stride = 1 if self.cols.broadcast else self.cols.extent
        return col_ok and (self.rows.broadcast or self.rows.contiguous(row_stride))

    @property
    def partial_rows(self) -> bool:
        """Varies along some but not all of the row axes (or along them in a permuted way)."""
        return not self.rows.broadcast and not self.rows.contiguous(1 if self.cols.broadcast else self.cols.extent)

    @property
    def partial_cols(self) -> bool:
        return not self.cols.broadcast and not self.cols.contiguous()

    def vector_mode(self, vec: int) -> str:
        """``"vector"``, ``"uniform"`` or ``"scalar"``: how the ``vec`` elements ``(r, c0 .. c0 + vec - 1)``
        are read or written (see :meth:`AxisMap.vector_mode`); ``vec == 1`` is always ``"vector"``."""
        if vec == 1:
            return "vector"
        if self.cols.broadcast:
            return "uniform"
        mode = self.cols.vector_mode(vec)
        if mode == "vector" and any(f.stride % vec for f in self.rows.factors):
            return "scalar"  # a row stride off the vector grid (a sliced input's own row stride): unaligned
        return mode

    @property
    def bijective(self) -> bool:
        """Every element of the tensor is the image of exactly one element of the part of the view
        it varies along (rows, columns or both): it can be stored through the map without two
        threads writing one address (an output's requirement)."""
        want = (1 if self.rows.broadcast else self.rows.extent) * (1 if self.cols.broadcast else self.cols.extent)
        return self.size == want and self.rows.span * self.cols.span == self.size

    @property
    def store_once(self) -> bool:
        """A full tensor that broadcasts along part of the row axes (``row_repeats``) and is one-to-one
        along the rest of the view (Llama's rotated ``k [B, Hkv, S, D]`` over the domain of its
        grouped copy ``[B, Hkv*n, S, D]``): it can be stored through the map by the view rows whose
        coordinate along every repeat is 0 (:meth:`first_rows`), one writer per element."""
        return (bool(self.row_repeats) and not self.rows.broadcast and not self.cols.broadcast
                and self.cols.span == self.cols.extent and self.rows.span * self.cols.span == self.size)


def _axis_map(axes: tuple[int, ...], sizes: Mapping[int, int], stride_of: dict[int, int]) -> AxisMap:
    """The map of the kernel axis spanning the domain axes ``axes`` (row-major, last fastest)."""
    extent = prod(sizes[a] for a in axes) if axes else 1
    factors: list[Factor[int]] = []  # innermost first while building
    inner = 1
    for a in reversed(axes):
        st = stride_of.get(a, 0)
        if sizes[a] > 1 and st:
            f = Factor(sizes[a], inner, st)
            prev = factors[-1] if factors else None
            if prev is not None and prev.inner * prev.dim == inner and prev.stride * prev.dim == st:
                f = Factor(prev.dim * sizes[a], prev.inner, prev.stride)  # the two axes are one run
                factors.pop()
            factors.append(f)
        inner *= sizes[a]
    return AxisMap(extent, tuple(reversed(factors)))


def _row_repeats(axes: tuple[int, ...], sizes: Mapping[int, int], stride_of: dict[int, int]) -> tuple[tuple[int, int], ...]:
    """The runs of adjacent axes of ``axes`` (row-major) without a stride: ``(dim, inner)``, outermost first."""
    runs: list[tuple[int, int]] = []  # innermost first while building
    inner, prev_end = 1, -1
    for a in reversed(axes):
        if sizes[a] > 1 and not stride_of.get(a, 0):
            if runs and prev_end == inner:
                runs[-1] = (runs[-1][0] * sizes[a], runs[-1][1])
            else:
                runs.append((sizes[a], inner))
            prev_end = inner * sizes[a]
        inner *= sizes[a]
    return tuple(reversed(runs))


def index_map(shape: tuple[int, ...], groups: tuple[tuple[int, ...] | int | None, ...], sizes: Mapping[int, int],
              row_axes: tuple[int, ...], col_axes: tuple[int, ...]) -> IndexMap:
    """The map of a tensor of ``shape`` whose dim ``k`` spans the domain axes ``groups[k]`` (row-major
    inside the dim; ``()`` for a size-1 dim, broadcast), over the view with row axes ``row_axes`` and
    column axes ``col_axes``; ``sizes[a]`` is the extent of domain axis ``a``. A dim may also be given
    as one axis (an ``int``) or ``None`` (size 1), the form of :mod:`stitchtune.plan.remap`."""
    norm = tuple(() if g is None else ((g,) if isinstance(g, int) else tuple(g)) for g in groups)
    stride_of: dict[int, int] = {}
    for k, group in enumerate(norm):
        st = prod(shape[k + 1:])
        for a in reversed(group):
            stride_of[a] = st
            st *= sizes[a]
    rows, cols = _axis_map(row_axes, sizes, stride_of), _axis_map(col_axes, sizes, stride_of)
    full = bool(rows.factors and cols.factors)  # repeats only matter for a full tensor (store_once)
    return IndexMap(rows, cols, prod(shape), _row_repeats(row_axes, sizes, stride_of) if full else ())
