"""Index arithmetic of layout chains and views, as IR expressions: the offset in an input of a layout
chain's head element (:func:`chain_offset`: back through transposes, slices and reshapes), the
row-major offset of coordinates and its inverse, the view's row and column axes of a domain
(:func:`split_axes`) and a slice / concat / gather node's axis (:func:`node_axis`). Used by the row
sweeps' remaps (:mod:`stitchtune.lower.remap`), the column ones (:mod:`stitchtune.lower.col_remap`),
the picks and gathers (:mod:`stitchtune.lower.gather`) and the generic lowering
(:mod:`stitchtune.lower.dynamic`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from math import prod

from stitchtune.graph.parse import Graph, Node
from stitchtune.ir import kir
from stitchtune.ir.kir import Bin, Const
from stitchtune.lower.base import I, add, mul

__all__ = ["chain_offset", "node_axis", "split_axes"]


def node_axis(nd: Node) -> int:
    """The axis of a slice / concat / gather node (set, normalised, by the graph's validation)."""
    assert nd.axis is not None, f"{nd.op} '{nd.id}' has no axis"
    return nd.axis


def chain_offset(nodes: Mapping[str, Node], g: Graph, chain: tuple[str, ...], coords: Sequence[kir.Expr],
                 dims: Callable[[str], tuple[kir.Expr, ...] | None] | None = None) -> kir.Expr:
    """The offset in the input of layout chain ``chain`` (``(head, ..., input)``,
    :func:`~stitchtune.plan.chains.composed_chains`) of the head's element at coordinates ``coords``
    (one per head dim, inside the head): carried back through the chain's transposes (permuted),
    slices (the start added) and reshapes (the row-major linear index). ``nodes``: the graph's nodes
    by id. ``dims(tensor)``: a generic kernel's symbolic dims of a chain tensor whose shape follows the
    extents (:meth:`~stitchtune.lower.symbols.RowSymbols.shape`), None for a static one (its numbers are
    the graph's; a dim 1 in the graph is 1 at every extent: the representative's extents are the
    largest). Used by the row sweeps (:class:`~stitchtune.lower.remap.RemapValues`) and the column ones
    (:mod:`stitchtune.lower.col_remap`)."""
    def of(t: str) -> _Shape:
        shape = g.spec(t).shape
        sym = dims(t) if dims is not None else None
        return shape, (sym if sym is not None else tuple(I(d) for d in shape))

    cur: list[kir.Expr] | None = list(coords)
    lin: kir.Expr | None = None
    shape = of(chain[0])
    for name in chain[:-1]:
        nd = nodes[name]
        src = of(str(nd.args[0]))
        if nd.op in ("transpose", "slice") and cur is None:
            assert lin is not None  # one of the two forms is always set
            cur = _unravel(lin, shape)
        if nd.op == "transpose":
            assert cur is not None
            back: list[kir.Expr] = [I(0)] * len(src[0])
            for i, p in enumerate(nd.perm):
                back[p] = cur[i]
            cur, lin = back, None
        elif nd.op == "slice":  # the same position in the source, moved by the start
            assert cur is not None
            a = node_axis(nd)
            cur = [add(c, I(nd.start)) if k == a and nd.start else c for k, c in enumerate(cur)]
        else:  # reshape: the row-major linear index is the same in the source
            lin, cur = (_linear(cur, shape) if cur is not None else lin), None
        shape = src
    if cur is not None:
        return _linear(cur, shape)
    assert lin is not None  # one of the two forms is always set
    return lin


#: a tensor's dims: the representative graph's, and as expressions (symbolic where they follow the extents)
_Shape = tuple[tuple[int, ...], tuple[kir.Expr, ...]]


def _prod(xs: Sequence[kir.Expr]) -> kir.Expr:
    """The product of ``xs``, its constants folded into one (last): a static shape's stride is one constant."""
    static, out = 1, None
    for x in xs:
        if isinstance(x, Const):
            static *= int(x.value)
        else:
            out = x if out is None else Bin("*", out, x)
    return I(static) if out is None else mul(out, I(static))


def _linear(coords: list[kir.Expr], shape: _Shape) -> kir.Expr:
    """The row-major offset of ``coords`` in a tensor of ``shape`` (size-1 dims contribute nothing)."""
    rep, dims = shape
    out: kir.Expr = I(0)
    for k, c in enumerate(coords):
        if rep[k] == 1 or (isinstance(c, Const) and c.value == 0):
            continue
        out = add(out, mul(c, _prod(dims[k + 1:])))
    return out


def _unravel(lin: kir.Expr, shape: _Shape) -> list[kir.Expr]:
    """The coordinates of row-major offset ``lin`` (``0 <= lin < prod(shape)``) in ``shape``."""
    rep, dims = shape
    out: list[kir.Expr] = []
    for k, d in enumerate(dims):
        inner = _prod(dims[k + 1:])
        if rep[k] == 1:
            out.append(I(0))
            continue
        t = lin if isinstance(inner, Const) and inner.value == 1 else Bin("/", lin, inner)
        out.append(Bin("%", t, d) if k > 0 else t)
    return out


def split_axes(domain: tuple[int, ...], M: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Row axes (the leading axes whose product is ``M``) and column axes of the view."""
    k = 0
    while k < len(domain) and prod(domain[:k]) < M:
        k += 1
    while k < len(domain) and domain[k] == 1 and prod(domain[:k + 1]) == M:
        k += 1
    return tuple(range(k)), tuple(range(k, len(domain)))
