"""Column shifts taken from another lane: the lowering of :mod:`stitchtune.plan.lane_shifts` in a row sweep.

:class:`~stitchtune.lower.remap.RemapValues` asks :func:`exchange_mask` before it evaluates a tensor at a
shifted position: where the kernel takes row vectors in the row-major lane order (:func:`exchanging`;
:func:`~stitchtune.lower.lane_order.piece_lanes` keeps that order for such a mapping) and the tensor is an
element-wise node or a layout chain of the domain's full shape, varying along the columns, whose shift is
one :func:`~stitchtune.plan.lane_shifts.xor_mask` serves, its values are :func:`exchanged`: the unshifted
values (the sweep's own, evaluated by every lane) passed through one ``__shfl_xor_sync`` each. Each
shuffle is an assignment at the sweep's top level, executed by every lane of the warp (never under a
condition: the piece's select picks it afterwards). Contract: the value at column ``c`` equals the
tensor's element at ``c + d`` for every lane the shift's conditions select, in every row of the thread's
group (the partner holds the same rows); other lanes get a value the select discards.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from stitchtune.ir import kir
from stitchtune.ir.kir import F32, Assign
from stitchtune.lower.base import Lowerer
from stitchtune.plan.lane_shifts import exchanges, xor_mask
from stitchtune.plan.shift import Shift

__all__ = ["exchanging", "exchange_mask", "exchanged"]

#: node kinds whose value at a shifted position is the same expression of its arguments there
_ELEMENTWISE = ("unary", "binary", "ternary", "cast")


def exchanging(low: Lowerer, grouped: bool) -> bool:
    """A sweep of ``low``'s kernel takes column shifts from other lanes: row vectors (``grouped``), a static
    kernel of split 1 whose mapping exchanges some shifted chain read (the lane order is then row-major)."""
    return (grouped and low.sym is None and low.s.split == 1
            and exchanges(low.p.vector_visits, low.s.tpr, low.s.vec, low.dev.warp_size))


def exchange_mask(low: Lowerer, domain: Sequence[int], chains: Collection[str], name: str, kind: str,
                  sh: Shift) -> int | None:
    """The lane mask serving tensor ``name`` (op kind ``kind``; ``chains``: the layout chain heads) at ``sh``
    by a shuffle (module docstring), or None. Only for a sweep that is :func:`exchanging`."""
    if sh.identity or (kind not in _ELEMENTWISE and name not in chains):
        return None
    if tuple(low.g.spec(name).shape) != tuple(domain) or not low.cls[name].varies_along_reduced:
        return None
    return xor_mask(sh, tuple(domain), low.p.N, low.s.tpr, low.s.vec, low.dev.warp_size)


def exchanged(low: Lowerer, body: list[kir.Stmt], var: Callable[[str, str], kir.Var], own: Sequence[kir.Expr],
              mask: int) -> list[kir.Expr]:
    """The unshifted values ``own``, each through ``__shfl_xor_sync(.., mask, min(tpr, warp))`` into a fresh
    register assigned at the end of ``body`` (the sweep's top level)."""
    width = min(low.s.tpr, low.dev.warp_size)
    out: list[kir.Expr] = []
    for x in own:
        v = var("xl", F32)
        body.append(Assign(v, kir.Shfl(x, mask, width)))
        out.append(v)
    return out
