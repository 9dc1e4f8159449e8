"""Domain positions of a remap (:mod:`stitchtune.lower.remap`) as IR expressions, static or generic.

Contract
--------
:func:`coord` is the coordinate along one axis of the iteration domain of a row-major index ``i``:
``(i // prod(extents of the axes inside)) % extent(axis)``. In a static kernel (or a generic one
without symbolic domain extents) the extents are the representative graph's constants, exactly the
expressions of before; in a generic kernel (:class:`~stitchtune.lower.symbols.RowSymbols` with
``domain``) they are the fitted extents over the kernel's arguments, so a position along or outside an
axis whose extent follows the extents (a decode step's cache axis, ``P + 1``) is right at every extent
of the bucket.

:func:`moving_bounds` gives the conditions of the concats along such an axis
(:func:`stitchtune.lower.dynamic_shifts.shift_refusal` admits concats spanning the axis whose pieces after the
first are one position each): piece ``k`` of ``n`` covers
``[D - (n - k), D - (n - k) + 1)`` for ``k >= 1`` and the first ``[0, D - (n - 1))``, ``D`` the axis's
extent; keyed by the representative's ``(axis, lo, hi)`` (what the :class:`~stitchtune.plan.shift.Shift`
of that piece carries), each bound an expression or None where the condition is always true. Two such
concats (GPT-2's key and value caches) give equal keys equal bounds: a key fixes ``n - k`` by its
distance from the extent.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Graph
from stitchtune.ir import kir
from stitchtune.ir.kir import Bin
from stitchtune.lower.base import I
from stitchtune.lower.index_chain import node_axis
from stitchtune.lower.symbols import RowSymbols

__all__ = ["coord", "moving_bounds"]

Bounds = dict[tuple[int, int, int], tuple[kir.Expr | None, kir.Expr | None]]


def coord(sym: RowSymbols | None, domain: tuple[int, ...], i: kir.Expr, inner: Sequence[int], axis: int,
          keep_mod: bool) -> kir.Expr:
    """``(i // prod(domain[b] for b in inner)) % domain[axis]`` (the ``%`` only with ``keep_mod``), over the
    symbolic extents of ``sym.domain`` where a generic kernel has them."""
    if sym is None or not sym.domain:
        n = prod(domain[b] for b in inner)
        t = Bin("/", i, I(n)) if n > 1 else i
        return Bin("%", t, I(domain[axis])) if keep_mod else t
    ne = sym.dims_product(list(inner))
    t = i if ne is None else Bin("/", i, ne)
    return Bin("%", t, sym.dim(axis)) if keep_mod else t


def moving_bounds(g: Graph, domain: tuple[int, ...], sym: RowSymbols | None) -> Bounds:
    """The symbolic conditions of each concat piece along a domain axis whose extent follows the
    extents (module docstring); empty for a static kernel or without such a concat."""
    if sym is None or not sym.domain:
        return {}
    out: Bounds = {}
    for nd in g.nodes:
        if OPS[nd.op].kind != "concat":
            continue
        a = len(domain) - len(nd.shape) + node_axis(nd)
        if sym.domain[a].static:
            continue
        n, big = len(nd.tensor_args), domain[a]
        d = sym.dim(a)
        out[(a, 0, big - (n - 1))] = (None, Bin("-", d, I(n - 1)))
        for k in range(1, n):
            lo = Bin("-", d, I(n - k))
            out[(a, big - (n - k), big - (n - k) + 1)] = (lo, None if k == n - 1 else Bin("-", d, I(n - k - 1)))
    return out
