"""The per-element values of one sweep (:class:`SweepValues`, shared by every family): inputs loaded
through the family's ``load_input``, full-size tensors read back from their register or shared-memory
cache, intermediates recomputed from their arguments, index ops and ``iota`` through the family's
hooks. The families are :mod:`stitchtune.lower.row_kernel`, :mod:`stitchtune.lower.col` and
:mod:`stitchtune.lower.transpose`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.graph.parse import Node
from stitchtune.ir import kir
from stitchtune.ir.kir import F32, Assign, Bin, Const, Load, LocalRef
from stitchtune.lower.base import Ctx, Lowerer
from stitchtune.plan.planner import TensorClass
from stitchtune.space import ReuseLevel

__all__ = ["SweepValues"]


class SweepValues:
    """Per-element values of the tensors one sweep needs (shared by both families).

    ``broadcast(name)`` returns the values of a per-row/per-column/scalar tensor (or None for a
    full-size or per-reduced-index one); ``load_input(name)`` appends the loads of an input to the
    loop body and returns its ``vec`` values; ``cache_index(j)`` / ``smem_index(j)`` address the
    register / shared-memory cache of element ``j`` of the current vector. A full-size tensor with a
    register or shared reuse level is written to its cache the first time a sweep computes it
    (``newly``) and read from there by later sweeps (``filled``).
    """

    def __init__(self, low: Lowerer, cx: Ctx, body: list[kir.Stmt], vec: int, filled: set[str],
                 broadcast: Callable[[str], list[kir.Expr] | None], load_input: Callable[[str], list[kir.Expr]],
                 cache_index: Callable[[int], kir.Expr], smem_index: Callable[[int], kir.Expr],
                 levels: dict[str, str] | None = None) -> None:
        self.low, self.cx, self.body, self.vec, self.filled = low, cx, body, vec, filled
        #: the reuse levels of this sweep's kernel (:attr:`Lowerer.kernel_reuse`); the program's by default
        self.levels = low.reuse if levels is None else levels
        self.broadcast, self.load_input = broadcast, load_input
        self.cache_index, self.smem_index = cache_index, smem_index
        self.memo: dict[str, list[kir.Expr]] = {}
        self.newly: set[str] = set()
        #: the values of an index-op node (slice / concat / gather), set by the family's sweep
        #: (:class:`stitchtune.lower.remap.RemapValues`); None where the family has no index ops
        self.index_value: Callable[[str], list[kir.Expr]] | None = None
        #: the ``vec`` values of a full-size or per-reduced-index ``iota`` at the sweep's element, set by
        #: the family's sweep; None where the family has no iota
        self.iota_value: Callable[[str], list[kir.Expr]] | None = None
        #: the reciprocal of a per-row (or scalar) value, computed once per row, set by the row family's
        #: sweep; None where the family divides element by element (fast arithmetic: ``fast_div``)
        self.reciprocal: Callable[[str], kir.Expr] | None = None

    def row_reciprocal(self, nd: Node) -> kir.Expr | None:
        """For a division by a constant or a per-row value (fast arithmetic, a family that sets
        :attr:`reciprocal`): the divisor's reciprocal, computed once per row (a float32 constant, or
        the kernel's per-row ``1 / s``), that each element is multiplied by; None otherwise."""
        low = self.low
        if nd.op != "div" or low.exact or self.reciprocal is None or low.int_regs:
            return None
        d = nd.args[1]
        if not isinstance(d, str):
            with np.errstate(divide="ignore", over="ignore"):
                return Const(float(np.float32(1.0) / np.float32(d)), F32)
        if low.cls[d].varies_along_reduced:
            return None
        return self.reciprocal(d)

    def value(self, name: str) -> list[kir.Expr]:
        low, vec = self.low, self.vec
        b = self.broadcast(name)
        if b is not None:
            return b
        if name in self.memo:
            return self.memo[name]
        tix = low.tid_of[name]
        level = self.levels.get(name)
        if name in self.filled:
            vals: list[kir.Expr] = ([LocalRef(f"rc{tix}", self.cache_index(j)) for j in range(vec)]
                                    if level == ReuseLevel.REGISTER else
                                    [Load(f"sc{tix}", self.smem_index(j)) for j in range(vec)])
            self.memo[name] = vals
            return vals
        if name in low.in_buf:
            vals = self.load_input(name)
        elif OPS[low.nodes[name].op].kind in INDEX_KINDS or name in low.chain_heads:
            assert self.index_value is not None, f"index op {name} in a family without index ops"
            vals = self.index_value(name)
        elif low.nodes[name].op == "iota":
            assert self.iota_value is not None, f"iota {name} in a family without iota"
            vals = self.iota_value(name)
        else:
            nd = low.nodes[name]
            argv = [self.value(a) if isinstance(a, str) else [Const(float(a), F32)] * vec for a in nd.args]
            recip = self.row_reciprocal(nd)
            vals = []
            for j in range(vec):
                v = self.cx.var(f"t{tix}_", low.vtype(name))
                expr = Bin("*", argv[0][j], recip) if recip is not None else low.expr_of_node(nd, [a[j] for a in argv])
                self.body.append(Assign(v, expr))
                vals.append(v)
        if low.cls[name] is TensorClass.FULL and level in (ReuseLevel.REGISTER, ReuseLevel.SHARED):
            for j in range(vec):
                if level == ReuseLevel.REGISTER:
                    self.body.append(kir.SetLocal(f"rc{tix}", self.cache_index(j), vals[j]))
                else:
                    self.body.append(kir.StoreVec(f"sc{tix}", self.smem_index(j), (vals[j],)))
            self.newly.add(name)
        self.memo[name] = vals
        return vals
