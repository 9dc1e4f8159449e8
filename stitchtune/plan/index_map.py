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
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod


@dataclass(frozen=True)
class Factor:
    """One term of an axis map: ``((i // inner) % dim) * stride`` (``dim >= 2``, ``stride >= 1``)."""

    dim: int
    inner: int
    stride: int


@dataclass(frozen=True)
class AxisMap:
    """The map of one kernel axis (``r`` over ``extent = M`` or ``c`` over ``extent = N``)."""

    extent: int
    factors: tuple[Factor, ...]

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

    def needs_mod(self, f: Factor) -> bool:
        """Whether ``f`` needs its ``% dim``: not when ``i // inner < dim`` for every ``i < extent``."""
        return f.inner * f.dim < self.extent


@dataclass(frozen=True)
class IndexMap:
    """The address of view element ``(r, c)`` in one tensor of ``size`` elements (module docstring)."""

    rows: AxisMap
    cols: AxisMap
    size: int

    def offset(self, r: int, c: int) -> int:
        return self.rows.offset(r) + self.cols.offset(c)

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


def _axis_map(axes: tuple[int, ...], domain: tuple[int, ...], stride_of: dict[int, int]) -> AxisMap:
    """The map of the kernel axis spanning the domain axes ``axes`` (row-major, last fastest)."""
    extent = prod(domain[a] for a in axes) if axes else 1
    factors: list[Factor] = []  # innermost first while building
    inner = 1
    for a in reversed(axes):
        st = stride_of.get(a, 0)
        if domain[a] > 1 and st:
            f = Factor(domain[a], inner, st)
            prev = factors[-1] if factors else None
            if prev is not None and prev.inner * prev.dim == inner and prev.stride * prev.dim == st:
                f = Factor(prev.dim * domain[a], prev.inner, prev.stride)  # the two axes are one run
                factors.pop()
            factors.append(f)
        inner *= domain[a]
    return AxisMap(extent, tuple(reversed(factors)))


def index_map(shape: tuple[int, ...], axes: tuple[int | None, ...], domain: tuple[int, ...],
              row_axes: tuple[int, ...], col_axes: tuple[int, ...]) -> IndexMap:
    """The map of a tensor of ``shape`` whose dim ``k`` indexes domain axis ``axes[k]`` (None: a
    size-1 dim, broadcast), over the view with row axes ``row_axes`` and column axes ``col_axes``."""
    strides = [prod(shape[k + 1:]) for k in range(len(shape))]
    stride_of = {a: strides[k] for k, a in enumerate(axes) if a is not None}
    return IndexMap(_axis_map(row_axes, domain, stride_of), _axis_map(col_axes, domain, stride_of), prod(shape))
