"""Column remaps in a column-family sweep: the values of ``slice`` / ``concat`` along the columns.

Contract
--------
The planner accepted the region (:func:`stitchtune.plan.col_remap.check_col_index_ops` and the bounds
walk of :func:`stitchtune.plan.remap.check_remaps`): every index op moves elements along the domain's
innermost axis, the view's innermost column axis, and no per-column value is read at a moved column.
A column sweep (:mod:`stitchtune.lower.col`) asks :class:`ColRemapValues` for the ``vec`` values of an
index-op node (or of a layout chain's head) at its element: row ``r`` of the sweep, columns ``c0 ..
c0 + vec - 1`` of the thread. A tensor is evaluated at a :class:`~stitchtune.plan.shift.Shift` (domain
position ``p + delta`` for the positions that satisfy its conditions), as the row family's
:class:`~stitchtune.lower.remap.RemapValues` does: a slice adds its start to the delta, a concat
selects per lane the piece whose range holds the moved column (the piece's range a condition), an
element-wise node is computed from its arguments at the same shift, a value that does not vary along
the columns (one per row, a scalar) is the sweep's own, an input is loaded at its map's address of
element ``(r, c)`` plus the delta in its own strides (:func:`~stitchtune.plan.shift.shift_offset`), a
layout chain's head through the chain's index arithmetic
(:func:`~stitchtune.lower.index_chain.chain_offset`). Every shifted load is one scalar load per lane,
predicated on the sweep's validity and the shift's conditions (a masked lane reads nothing and its
value is never selected), so no access leaves a tensor. With no shift, the sweep's own values are used
(caches included).
"""

from __future__ import annotations

from math import prod
from typing import Callable

from stitchtune.graph.ops import OPS, INDEX_KINDS
from stitchtune.ir import kir
from stitchtune.ir.kir import F32, Assign, Bin, Load, Select
from stitchtune.lower.base import I, Ctx, Lowerer, add
from stitchtune.lower.sweep_values import SweepValues
from stitchtune.lower.index_chain import chain_offset
from stitchtune.plan.chains import composed_chains, domain_of
from stitchtune.plan.family import Family
from stitchtune.plan.pick import node_axis
from stitchtune.plan.shift import Shift, shift_offset

__all__ = ["ColRemapValues"]


class ColRemapValues:
    """The values of one column sweep's index-op nodes (module docstring). ``low``: the column
    lowerer; ``cx`` / ``body``: the kernel's names and the sweep's loop body; ``sv``: the sweep's
    values; ``r``: the sweep's row (may pass ``M - 1`` where ``valid`` is false), ``c0``: the thread's
    first column (clamped to ``N - vec``), ``valid``: the element is the sweep's; ``use_input``:
    records a buffer the kernel reads (the profile counts the sweep's reads in its IR: :mod:`stitchtune.lower.counts`)."""

    def __init__(self, low: Lowerer, cx: Ctx, body: list[kir.Stmt], sv: SweepValues, r: kir.Expr, c0: kir.Expr,
                 valid: kir.Expr, use_input: Callable[[str], None]) -> None:
        self.low, self.cx, self.body, self.sv = low, cx, body, sv
        self.r, self.c0, self.valid, self.use_input = r, c0, valid, use_input
        self.vec = low.s.vec
        self.domain = domain_of(low.g)
        self.chains = composed_chains(low.g)
        D = len(self.domain)
        reduced: set[int] = set()
        for red in low.p.reductions:   # the view's rows: the axes the column reductions reduce
            nd = low.nodes[red]
            off = D - len(low.g.spec(str(nd.args[0])).shape)
            reduced |= {off + a for a in nd.axes}
        self.row_axes = tuple(a for a in range(D) if a in reduced)
        self.col_axes = tuple(a for a in range(D) if a not in reduced)
        self.memo: dict[tuple[str, Shift], list[kir.Expr]] = {}

    def node_value(self, name: str) -> list[kir.Expr]:
        """The ``vec`` values of index-op node (or chain head) ``name`` at the sweep's element."""
        return self.value(name, Shift())

    def value(self, name: str, sh: Shift) -> list[kir.Expr]:
        key = (name, sh)
        if key in self.memo:
            return self.memo[key]
        low = self.low
        nd = low.nodes.get(name)
        kind = OPS[nd.op].kind if nd is not None else "input"
        if name in self.chains:
            vals = self.composed(name, sh)
        elif nd is not None and kind == "slice":
            vals = self.value(str(nd.args[0]), sh.moved(len(self.domain) - 1, nd.start))
        elif nd is not None and kind == "concat":
            vals = self.concat(nd.id, sh)
        elif sh.identity or not low.cls[name].varies_along_cols(Family.COL):
            vals = self.sv.value(name)   # the sweep's own element (a per-row value is the same at any column)
        elif nd is None:
            vals = self.load(name, sh)
        else:
            assert kind not in INDEX_KINDS and kind not in ("reduce", "layout"), f"{nd.op} '{name}' under a column shift"
            argv = [self.value(a, sh) if isinstance(a, str) else [kir.Const(float(a), F32)] * self.vec
                    for a in nd.args]
            vals = []
            for j in range(self.vec):
                v = self.cx.var(f"t{low.tid_of[name]}_", low.vtype(name))
                self.body.append(Assign(v, low.expr_of_node(nd, [x[j] for x in argv])))
                vals.append(v)
        self.memo[key] = vals
        return vals

    # -- positions -------------------------------------------------------------------------------
    def pos(self, axis: int, lane: int) -> kir.Expr:
        """The domain position along ``axis`` of lane ``lane``'s element (0 along a size-1 axis)."""
        D = self.domain
        if D[axis] == 1:
            return I(0)
        axes, i, total = ((self.col_axes, add(self.c0, I(lane)), self.low.p.N) if axis in self.col_axes else
                          (self.row_axes, Bin("min", self.r, I(self.low.p.M - 1)), self.low.p.M))
        inner = prod(D[b] for b in axes if b > axis)
        t = Bin("/", i, I(inner)) if inner > 1 else i
        return Bin("%", t, I(D[axis])) if inner * D[axis] < total else t

    def cond(self, sh: Shift, lane: int) -> kir.Expr:
        """The sweep's validity and ``sh``'s conditions at lane ``lane``."""
        out: kir.Expr = self.valid
        for a, lo, hi in sh.conds:
            p = self.pos(a, lane)
            if lo > 0:
                out = Bin("&&", out, Bin(">=", p, I(lo)))
            if hi < self.domain[a]:
                out = Bin("&&", out, Bin("<", p, I(hi)))
        return out

    # -- ops and loads ---------------------------------------------------------------------------
    def concat(self, name: str, sh: Shift) -> list[kir.Expr]:
        nd = self.low.nodes[name]
        a = len(self.domain) - len(nd.shape) + node_axis(nd)
        pieces: list[tuple[Shift, list[kir.Expr]]] = []
        o = 0
        for arg in nd.tensor_args:
            ln = self.low.g.spec(arg).shape[node_axis(nd)]
            psh = sh.limited(a, o - sh.d(a), o + ln - sh.d(a), self.domain[a])
            if psh is not None:
                pieces.append((psh, self.value(arg, psh.moved(a, -o))))
            o += ln
        assert pieces, f"concat '{name}': no piece is reached (the planner's walk refuses it)"
        out = []
        for j in range(self.vec):
            v = pieces[-1][1][j]
            for psh, vals in reversed(pieces[:-1]):
                v = Select(self.cond(psh, j), vals[j], v)
            out.append(v)
        return out

    def _read(self, buf: str) -> None:
        self.use_input(buf)

    def load(self, name: str, sh: Shift) -> list[kir.Expr]:
        """Input ``name`` (full-size) at ``p + delta``: its map's address of element ``(r, c)`` plus the
        delta in its own strides, one predicated scalar load per lane."""
        low = self.low
        delta = shift_offset(name, low.g.spec(name).shape, sh, self.domain)
        buf = low.in_buf[name]
        self._read(buf)
        rb = low.row_base(name, Bin("min", self.r, I(low.p.M - 1)))
        out: list[kir.Expr] = []
        for j in range(self.vec):
            v = self.cx.var("g", F32)
            at = add(add(rb, low.col_offset(name, add(self.c0, I(j)))), I(delta))
            self.body.append(Assign(v, Load(buf, at, self.cond(sh, j))))
            out.append(v)
        return out

    def composed(self, head: str, sh: Shift) -> list[kir.Expr]:
        """Chain head ``head`` at ``p + delta``: each lane's coordinates in the head carried back
        through the chain to the input's offset (:func:`~stitchtune.lower.index_chain.chain_offset`)."""
        low = self.low
        chain = self.chains[head]
        hshape = low.g.spec(head).shape
        shift_offset(head, hshape, sh, self.domain)   # (proven by the planner: in bounds of the head)
        buf = low.in_buf[chain[-1]]
        self._read(buf)
        off = len(self.domain) - len(hshape)
        out: list[kir.Expr] = []
        for j in range(self.vec):
            coords = [I(0) if d == 1 else add(self.pos(off + k, j), I(sh.d(off + k))) for k, d in enumerate(hshape)]
            v = self.cx.var("g", F32)
            self.body.append(Assign(v, Load(buf, chain_offset(low.nodes, low.g, chain, coords), self.cond(sh, j))))
            out.append(v)
        return out
