"""The symbols of a generic (dynamic-rows) lowering: the view's row count and the operands' row index
maps as monomials of the dynamic extents, and how they become kernel expressions.

:class:`RowSymbols` is fitted by :mod:`stitchtune.lower.dynamic` (from plans at several extents) and
read by the row lowering (:class:`~stitchtune.lower.base.Lowerer`'s ``sym``): where a static kernel has
the constant ``M`` (row guards, clamps, the round count) a generic one has an expression over its
``int`` arguments (:class:`~stitchtune.ir.kir.Extent`). The static lowering never builds one, so its
kernels stay byte-identical.
"""

from __future__ import annotations

from dataclasses import dataclass

from stitchtune.graph.dynamic import SymInt
from stitchtune.ir import kir
from stitchtune.ir.kir import I32, Bin, Const
from stitchtune.plan.index_map import Factor


@dataclass(frozen=True)
class RowSymbols:
    """``M`` (view rows) as a monomial, each tensor's row factors, and the kernel argument of each dim."""

    M: SymInt
    rows: tuple[tuple[str, tuple[Factor[SymInt], ...]], ...]
    args: tuple[tuple[str, str], ...]   # graph dim -> generated argument name (ext0, ext1, ...)
    #: the row length and each tensor's column factors (a dynamic reduced axis; N static otherwise)
    N: SymInt = SymInt(0)
    cols: tuple[tuple[str, tuple[Factor[SymInt], ...]], ...] = ()
    #: the iteration domain's extents (a region with slice / concat; ``()`` otherwise): the positions of a
    #: remap (:mod:`stitchtune.lower.remap`) along axes whose extent follows the extents
    domain: tuple[SymInt, ...] = ()
    #: each store-once output's row repeats ``(dim, inner)`` (:attr:`IndexMap.row_repeats
    #: <stitchtune.plan.index_map.IndexMap.row_repeats>`) as monomials of the extents
    repeats: tuple[tuple[str, tuple[tuple[SymInt, SymInt], ...]], ...] = ()
    #: each concat along a domain axis whose extent follows the extents: its pieces' extents along the
    #: axis as fitted (a decode step's cache ``(p, 1)``, a chunked prefill's ``(p, c)``): the pieces'
    #: offsets and conditions (:func:`stitchtune.lower.remap_positions.moving_bounds`)
    pieces: tuple[tuple[str, tuple[SymInt, ...]], ...] = ()
    #: each tensor of a layout chain of an input whose shape follows the extents: its fitted dims (a
    #: chunk of new keys ``[1, c, H, D]`` transposed to heads: positions carried back through them)
    shapes: tuple[tuple[str, tuple[SymInt, ...]], ...] = ()
    #: each slice whose start follows the extents (``x[:, -3:]``: ``s - 3``), as fitted: its shift
    #: (:func:`stitchtune.lower.remap_positions.moving_deltas`)
    starts: tuple[tuple[str, SymInt], ...] = ()
    #: each ``iota`` node's ``(dim, inner)``: the extent of its axis and the product of the extents after
    #: it, as monomials of the extents (an ``iota`` of a symbolic shape: a prompt's positions)
    iotas: tuple[tuple[str, tuple[SymInt, SymInt]], ...] = ()

    @property
    def dynamic_rows_length(self) -> bool:
        """The row length ``N`` follows the extents (a generic kernel sweeps up to its largest value)."""
        return not self.N.static

    def arg_names(self) -> tuple[str, ...]:
        return tuple(a for _, a in self.args)

    def expr(self, s: SymInt) -> kir.Expr:
        """``s`` as an i32 expression over the kernel's extent arguments (a polynomial: its terms summed,
        a negative coefficient subtracted)."""
        out: kir.Expr | None = None
        for c, ds in s.terms:
            t = self._term(abs(c) if out is not None else c, ds)
            out = t if out is None else Bin("-" if c < 0 else "+", out, t)
        assert out is not None
        return out

    def _term(self, coef: int, dims: tuple[str, ...]) -> kir.Expr:
        names = dict(self.args)
        out: kir.Expr | None = None if coef == 1 and dims else Const(coef, I32)
        for d in dims:
            e: kir.Expr = kir.Extent(names[d])
            out = e if out is None else Bin("*", out, e)
        assert out is not None
        return out

    def dim(self, axis: int) -> kir.Expr:
        """The extent of iteration-domain axis ``axis`` (a fit with :attr:`domain`)."""
        return self.expr(self.domain[axis])

    def dims_product(self, axes: "list[int] | range") -> kir.Expr | None:
        """The product of the domain's extents along ``axes`` (None for an empty or all-1 product)."""
        static = 1
        out: kir.Expr | None = None
        for a in axes:
            d = self.domain[a]
            if d.static:
                static *= d.coef
                continue
            out = self.expr(d) if out is None else Bin("*", out, self.expr(d))
        if static != 1:
            out = Const(static, I32) if out is None else Bin("*", out, Const(static, I32))
        return out

    def shape(self, name: str) -> tuple[kir.Expr, ...] | None:
        """Chain tensor ``name``'s dims as expressions where its shape follows the extents, else None."""
        dims = dict(self.shapes).get(name)
        return None if dims is None else tuple(self.expr(d) for d in dims)

    def factors(self, name: str) -> tuple[Factor[SymInt], ...]:
        return dict(self.rows)[name]

    def first_repeat(self, name: str, r: kir.Expr) -> list[kir.Expr]:
        """The conditions that view row ``r`` is at coordinate 0 along each of output ``name``'s row
        repeats, ``(r // inner) % dim == 0`` over the symbolic fields (the ``%`` always kept: ``r // inner
        < dim`` need not hold for every extent); ``[]`` for a tensor without repeats."""
        out: list[kir.Expr] = []
        for dim, inner in dict(self.repeats).get(name, ()):
            t = r if inner == SymInt(1) else Bin("/", r, self.expr(inner))
            out.append(Bin("==", Bin("%", t, self.expr(dim)), Const(0, I32)))
        return out

    def iota_at(self, name: str, offset: kir.Expr) -> kir.Expr | None:
        """``(offset // inner) % dim`` of ``iota`` node ``name`` over its fitted fields (the ``%`` always
        kept); None for an iota of a static shape or without fitted fields (the static expression serves)."""
        fields = dict(self.iotas).get(name)
        if fields is None or fields[0].static and fields[1].static:   # a static shape: the static lowering's
            return None
        dim, inner = fields
        t = offset if inner == SymInt(1) else Bin("/", offset, self.expr(inner))
        return t if dim == SymInt(1) else Bin("%", t, self.expr(dim))

    def cols_follow(self, name: str) -> bool:
        """Whether tensor ``name``'s column map follows the extents (a field of a column factor is
        symbolic: a transposed output ``[B, H, D, S]`` whose columns ``D`` step by ``S``)."""
        return any(not (f.dim.static and f.inner.static and f.stride.static) for f in dict(self.cols).get(name, ()))

    def row_offset(self, name: str, r: kir.Expr) -> kir.Expr:
        """``sum(((r // inner) % dim) * stride)`` over tensor ``name``'s symbolic row factors (the ``%``
        kept whenever a field is symbolic: ``r // inner < dim`` need not hold for every extent)."""
        return self._offset(self.factors(name), self.M, r)

    def col_offset(self, name: str, c: kir.Expr) -> kir.Expr:
        """The same over the column factors (a dynamic row length)."""
        return self._offset(dict(self.cols)[name], self.N, c)

    def _offset(self, factors: tuple[Factor[SymInt], ...], extent: SymInt, r: kir.Expr) -> kir.Expr:
        out: kir.Expr = Const(0, I32)
        for f in factors:
            t = r if f.inner == SymInt(1) else Bin("/", r, self.expr(f.inner))
            if not (f.dim.static and f.inner.static and f.inner.coef * f.dim.coef >= extent.coef and extent.static):
                t = Bin("%", t, self.expr(f.dim))
            term = t if f.stride == SymInt(1) else Bin("*", t, self.expr(f.stride))
            out = term if isinstance(out, Const) and out.value == 0 else Bin("+", out, term)
        return out
