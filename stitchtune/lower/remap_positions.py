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
(:func:`stitchtune.lower.dynamic_shifts.shift_refusal` admits concats spanning the axis, with any
pieces): piece ``k`` covers ``[o_k, o_k + n_k)``, ``n_k`` its fitted extent along the axis
(:attr:`RowSymbols.pieces <stitchtune.lower.symbols.RowSymbols.pieces>`: ``p`` and ``1`` for a decode
step's cache, ``p`` and ``c`` for a chunked prefill) and ``o_k`` the sum of the earlier ones; keyed by the
representative's ``(axis, lo, hi)`` (what the :class:`~stitchtune.plan.shift.Shift` of that piece
carries), each bound an expression or None where the condition is always true (the first piece's
``lo``, the last one's ``hi``: the domain's extent). :func:`moving_deltas` gives each later piece's
shift ``-o_k`` over the fitted extents, keyed by the representative's ``(axis, -o_k)`` (the Shift's
delta there). Two such concats (GPT-2's key and value caches) give equal keys equal bounds and shifts;
a key with two symbolic forms is a bug (asserted).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from stitchtune.graph.dynamic import SymInt
from stitchtune.graph.parse import Graph
from stitchtune.ir import kir
from stitchtune.ir.kir import Bin
from stitchtune.lower.base import I
from stitchtune.lower.index_chain import node_axis
from stitchtune.lower.symbols import RowSymbols

__all__ = ["coord", "moving_bounds", "moving_deltas", "piece_conflict"]

Bounds = dict[tuple[int, int, int], tuple[kir.Expr | None, kir.Expr | None]]
Deltas = dict[tuple[int, int], SymInt]


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


def _offsets(g: Graph, domain: tuple[int, ...], sym: RowSymbols | None
             ) -> list[tuple[int, list[tuple[int, int, SymInt]]]]:
    """Per concat along a domain axis whose extent follows the extents: ``(axis, [(rep offset, rep
    extent, symbolic offset)] per piece)``."""
    if sym is None or not sym.domain:
        return []
    out = []
    for name, lens in sym.pieces:
        nd = g.node(name)
        a = len(domain) - len(nd.shape) + node_axis(nd)
        o_rep, o_sym, rows = 0, SymInt(0), []
        for x, ln in zip(nd.tensor_args, lens):
            n = g.spec(x).shape[node_axis(nd)]
            rows.append((o_rep, n, o_sym))
            o_rep, o_sym = o_rep + n, SymInt.poly([*o_sym.terms, *ln.terms])
        out.append((a, rows))
    return out


def piece_conflict(g: Graph, domain: tuple[int, ...], sym: RowSymbols | None) -> str | None:
    """The second of two concats along an axis that follows the extents whose pieces have the same
    representative bounds or shift but other symbolic ones (``cat(past [p], new [c])`` beside
    ``cat(x [c], y [p])`` where the buckets' largest ``p`` and ``c`` are equal: the lowering keys both
    by the representative's numbers), or None. :func:`stitchtune.lower.dynamic.fit_rows` refuses it."""
    seen: dict[tuple[int, ...], tuple[SymInt, ...]] = {}
    for (a, rows), (name, _) in zip(_offsets(g, domain, sym), sym.pieces if sym is not None else ()):
        for k, (o, n, o_sym) in enumerate(rows):
            end = rows[k + 1][2] if k + 1 < len(rows) else None
            for key, val in (((a, o, o + n), (o_sym, end if end is not None else SymInt(-1))), ((a, -o), (o_sym,))):
                if seen.setdefault(key, val) != val:
                    return name
    return None


def moving_bounds(g: Graph, domain: tuple[int, ...], sym: RowSymbols | None) -> Bounds:
    """The symbolic conditions of each concat piece along a domain axis whose extent follows the
    extents (module docstring); empty for a static kernel or without such a concat."""
    out: Bounds = {}
    for a, rows in _offsets(g, domain, sym):
        assert sym is not None
        for k, (o, n, o_sym) in enumerate(rows):
            lo = None if k == 0 else sym.expr(o_sym)
            hi = None if k == len(rows) - 1 else sym.expr(rows[k + 1][2])
            key = (a, o, o + n)
            assert out.get(key, (lo, hi)) == (lo, hi), f"two concats' pieces {key} with other symbolic bounds"
            out[key] = (lo, hi)
    return out


def moving_deltas(g: Graph, domain: tuple[int, ...], sym: RowSymbols | None) -> Deltas:
    """The symbolic shift of each later concat piece along a domain axis whose extent follows the
    extents, keyed by the representative's ``(axis, -offset)`` (the delta the remap's :class:`Shift`
    carries): ``-offset`` over the fitted extents (module docstring); and of each slice whose start follows
    the extents (``x[:, -3:]``), keyed by ``(axis, representative start)``: the fitted start (the only
    shift along its axis: :func:`stitchtune.lower.dynamic_shifts.shift_refusal`)."""
    out: Deltas = {}
    for name, start in sym.starts if sym is not None else ():   # a slice counted from a moving axis's end
        nd = g.node(name)
        out[(len(domain) - len(nd.shape) + node_axis(nd), nd.start)] = start
    for a, rows in _offsets(g, domain, sym):
        assert sym is not None
        for o, _, o_sym in rows[1:]:
            neg = SymInt.poly([(-c, d) for c, d in o_sym.terms])
            assert out.get((a, -o), neg) == neg, f"two concats' pieces at offset {o} with other symbolic offsets"
            out[(a, -o)] = neg
    return out
