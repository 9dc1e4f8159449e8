"""Index remaps in a sweep: the values of ``slice``, ``concat`` and ``gather`` nodes (row family).

Contract
--------
A stitched kernel never materialises an index op's result. The sweep asks for the ``vec`` values of
a tensor at the view element of the thread (domain position ``p``, see
:mod:`stitchtune.plan.remap`); :class:`RemapValues` answers for a tensor evaluated at a *shifted*
position under *conditions*, a :class:`Shift`: the tensor's element ``p + delta`` for positions
``p`` that satisfy every ``(axis, lo, hi)`` (``lo <= p[axis] < hi``; elsewhere the value is never
used). ``slice(x)`` adds ``start`` to the delta of its axis; ``concat`` selects per position the
piece whose range holds ``p[axis] + delta`` and evaluates it with the piece's offset subtracted and
the range added as a condition; an element-wise node is evaluated from its arguments under the same
shift; an input is loaded at ``address(p) + sum(delta[a] * stride[a])`` (its own strides) with the
conditions in the predicate, one vector load when every condition is uniform over the ``vec`` lanes
and the shifted address stays ``vec``-aligned, else one predicated scalar load per lane. Per-row
and scalar values are unchanged by column shifts. With no delta and no condition the sweep's own
evaluation is used (caches, prefetch).

Every load is proven in bounds (:func:`stitchtune.plan.shift.shift_offset`): for each axis the
positions the conditions allow, shifted, lie inside the tensor's own dims; the planner already walked
the same remaps (:func:`stitchtune.plan.remap.check_remaps`), so a refusal is a planning error. ``gather(table, idx)``: once per round the row's index is read by :class:`~stitchtune.ir.kir.IndexLoad`
(``-1`` when out of ``[0, V)``), a table element is ``table[i * N + c]`` loaded only where ``i >= 0``
(else 0.0), and the row's first lane raises the node's error flag for an out-of-range index
(:func:`stitchtune.lower.gather.gather_index`).
Refused: a row-axis shift of a per-row value or of a gather.

In a *mixed* region (transpose / reshape of the inputs, then slice / concat along the innermost
axis: Llama's rotary after the head split) a shift that reaches an input through a layout node is a
column shift ``d`` (:func:`stitchtune.plan.shift.column_shift`); a layout node passes the shift to its
argument and an input is loaded at its general map's address of view element ``(r, c + d)``: its row
offset plus ``c + d`` for a contiguous column map, its map of column ``c + d`` otherwise (inv_freq
repeated along the head dim); an input wider than the domain along that axis
(:func:`stitchtune.plan.chains.wide_inputs`) has its own row strides and takes ``c + d`` up to its width. An input of the domain's own layout read by slice / concat directly
may be shifted along any axis (Swin's roll): loaded at its own address plus the delta in its own
strides, the row positions of the conditions taken from the map of a computed tensor of the
domain's shape (the view's rows follow the largest tensor's layout, not the domain's).

In a generic kernel (:mod:`stitchtune.lower.dynamic`) the shift of a later concat piece along an axis
whose extent follows the extents, and of a slice counted from such an axis's end, is symbolic
(:func:`~stitchtune.lower.remap_positions.moving_deltas`, keyed by the representative's number): a load
in its own strides adds ``(symbolic - representative) * stride`` (vector loads only where that stride
is a multiple of ``vec``), a layout chain takes the symbolic coordinate, and the pieces' conditions are
:func:`~stitchtune.lower.remap_positions.moving_bounds`.

A layout chain of an input (:func:`stitchtune.plan.chains.composed_chains`) is loaded at the head's
position ``p + delta`` along any axis (also where a sweep reads the head as it is): the head's
coordinates are carried back through the chain's transposes (permuted), reshapes (row-major linear
index) and slices (the start added) to the input's offset, one vector load
where the head's innermost dim stays the input's innermost, else one predicated load per lane. An
input whose columns are not one contiguous run (its own strides) is loaded lane by lane through its map.
"""

from __future__ import annotations

from math import prod

from stitchtune.errors import UnsupportedGraphError
from stitchtune.graph.dynamic import SymInt
from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Node
from stitchtune.ir import kir
from stitchtune.ir.kir import F32, Assign, Bin, Const, Load, Select
from stitchtune.lower.base import I, add, and_, mul
from stitchtune.lower.sweep_values import SweepValues
from stitchtune.lower.builder import RowKernelBuilder, RowSweep
from stitchtune.lower.gather import gather_index
from stitchtune.lower.lane_exchange import exchange_mask, exchanged, exchanging
from stitchtune.lower.index_chain import chain_offset, node_axis, split_axes
from stitchtune.lower.remap_positions import coord, moving_bounds, moving_deltas
from stitchtune.lower.row_vectors import RowGroupLoads
from stitchtune.plan.adjacent import transposed_heads
from stitchtune.plan.planner import TensorClass
from stitchtune.plan.chains import composed_chains, domain_of, layout_part, mixed_layout, wide_inputs
from stitchtune.plan.index_ops import has_index_ops
from stitchtune.plan.pieces import index_free, layout_reader_shift, unit_pieces
from stitchtune.plan.remap import outer_sources, root_shift
from stitchtune.plan.shift import Shift, column_shift, shift_offset

__all__ = ["Shift", "RemapValues"]


class RemapValues:
    """The values of one sweep's index-op nodes (module docstring). ``kern`` is the row kernel
    (``low``, ``ix``, ``var``, ``emit``, ``use_input``, ``f_index``), ``sw`` the sweep, ``sv`` its
    :class:`~stitchtune.lower.sweep_values.SweepValues`."""

    def __init__(self, kern: RowKernelBuilder, sw: RowSweep, sv: SweepValues,
                 group: tuple[RowGroupLoads, int] | None = None) -> None:
        """``group``: with row vectors (:mod:`stitchtune.lower.row_vectors`), the sweep iteration's row-group
        loads and the index ``q`` of the row this evaluation is of; None for one row a thread."""
        self.k, self.sw, self.sv = kern, sw, sv
        self.group = group
        low = kern.low
        self.low, self.p, self.g, self.vec = low, low.p, low.g, low.s.vec
        self.domain = domain_of(low.g)
        self.mixed = mixed_layout(low.g)
        self.chains = composed_chains(low.g)
        self.outer = outer_sources(low.g, self.domain)
        # (layout_part: the tensors of a region with index ops that keep their shapes; none without them)
        self.keep = layout_part(low.g) if self.mixed and has_index_ops(low.g) else set()
        self.unit = unit_pieces(low.g, self.domain)
        self.free = index_free(low.g)
        self.wide = wide_inputs(low.g)   # wider than the domain along its innermost axis (own row strides)
        self.dom_t = self._domain_tensor()
        # mixed: the columns are the innermost domain axis (check_mixed); the view's rows may hold
        # axes the domain lacks (an expand), so they are not split from M
        D = len(self.domain)
        self.row_axes, self.col_axes = ((tuple(range(D - 1)), (D - 1,)) if self.mixed else
                                        split_axes(self.domain, self.p.M))
        self.memo: dict[tuple[str, Shift], list[kir.Expr]] = {}
        #: the chain heads loaded R rows a lane with row vectors (their input's stride 1 along the rows)
        self.row_heads = transposed_heads(low.g, self.p.M) if group is not None else frozenset()
        self.moving = moving_bounds(low.g, self.domain, low.sym)   # (generic: a concat along a dynamic axis)
        self.deltas = moving_deltas(low.g, self.domain, low.sym)   # (its pieces' / end slices' symbolic shifts)
        self.exchange = exchanging(low, group is not None)   # column shifts from other lanes (lower/lane_exchange.py)
        self.swapped: dict[tuple[str, int], list[kir.Expr]] = {}   # (tensor, lane mask): one shuffle for all its shifts

    # -- entry -----------------------------------------------------------------------------------
    def node_value(self, name: str) -> list[kir.Expr]:
        """The values of index-op node ``name`` at the sweep's element (no shift)."""
        return self.value(name, Shift())

    def output_value(self, name: str) -> list[kir.Expr] | None:
        """The values of output ``name`` where it is evaluated at a non-trivial
        :func:`~stitchtune.plan.remap.root_shift` (a stored size-1 slice), else None (the sweep's own)."""
        sh = root_shift(self.g, name, self.domain, self.row_axes)
        return None if sh.identity else self.value(name, sh)

    def value(self, name: str, sh: Shift) -> list[kir.Expr]:
        low = self.low
        nd = low.nodes.get(name)
        if self.mixed:   # (a broadcast tensor does not move along the axes it broadcasts along)
            sh = layout_reader_shift(self.g, self.keep, name, sh, self.domain,
                                     not self.low.cls[name].varies_along_reduced, self.free)
        key = (name, sh)
        if key in self.memo:
            return self.memo[key]
        kind = OPS[nd.op].kind if nd is not None else "input"
        mask = exchange_mask(low, self.domain, self.chains, name, kind, sh) if self.exchange else None
        if mask is not None:   # (rotate_half's c + h and c - h are both lane ^ m: the same shuffles)
            if (name, mask) not in self.swapped:
                self.swapped[name, mask] = exchanged(low, self.sw.body, self.k.var, self.value(name, Shift()), mask)
            vals = self.swapped[name, mask]
        elif not self.low.cls[name].varies_along_reduced:
            if {a for a, _ in sh.delta} & set(self.row_axes):  # conditions alone keep the own element
                raise UnsupportedGraphError(f"tensor '{name}': a per-row value under a slice/concat along a "
                                            "row axis is not supported")
            vals = self.sv.value(name)
        elif name in self.chains:  # a layout chain of an input (plan.chains.composed_chains)
            vals = self.composed(name, sh)
        elif nd is not None and kind == "layout":  # transpose / reshape: index maps move the element
            vals = self.value(str(nd.args[0]), sh)
        elif nd is not None and kind == "slice":
            vals = self.value(str(nd.args[0]), sh.moved(self._axis(nd), nd.start))
        elif nd is not None and kind == "concat":
            vals = self.concat(nd, sh)
        elif nd is not None and kind == "gather":
            vals = self.gather(nd, sh)
        elif sh.identity or (not sh.delta and kind == "input" and self._spans(name)):
            vals = self.sv.value(name)
        elif kind == "input":
            vals = self.load(name, sh)
        else:
            assert nd is not None, name  # the other kinds are nodes'
            vals = self.elementwise(nd, sh)
        self.memo[key] = vals
        return vals

    # -- positions -------------------------------------------------------------------------------
    def _axis(self, nd: Node) -> int:
        return len(self.domain) - len(nd.shape) + node_axis(nd)

    def _spans(self, name: str) -> bool:
        if name in self.unit:   # a one-position concat piece: its size 1 is a position (plan.remap.unit_pieces)
            return False
        spec = self.g.spec(name)
        off = len(self.domain) - len(spec.shape)
        return all(s == 1 or s == self.domain[off + k] for k, s in enumerate(spec.shape))

    def _domain_tensor(self) -> str | None:
        """In a mixed region with chains: a computed tensor of the domain's shape (its map's offset is
        the row-major index of the domain position), else None."""
        if not (self.mixed and self.chains):
            return None
        chained = {n for c in self.chains.values() for n in c}
        return next((n.id for n in self.g.nodes if n.id not in chained and OPS[n.op].kind != "layout"
                     and tuple(n.shape) == tuple(self.domain)), None)

    def pos(self, axis: int, lane: int) -> kir.Expr:
        """Domain position along ``axis`` of lane ``lane``'s element (in a mixed region with chains,
        from the row-major domain index through the map of a domain-shaped tensor: any view)."""
        D = self.domain
        if self.dom_t is None and self.mixed and axis not in self.col_axes:
            return self._row_pos(axis)
        if self.dom_t is not None:
            lin = add(self.low.row_base(self.dom_t, Bin("min", self.k.ix.row, self.low.m_last())),
                       self.low.col_offset(self.dom_t, add(self.sw.k0, I(lane))))
            return coord(self.low.sym, D, lin, range(axis + 1, len(D)), axis, axis > 0)
        if axis in self.col_axes:
            inner = [b for b in self.col_axes if b > axis]
            i: kir.Expr = add(self.sw.k0, I(lane))
            total = self.p.N
        else:
            inner = [b for b in self.row_axes if b > axis]
            i = Bin("min", self.k.ix.row, self.low.m_last())
            total = self.p.M
        # (a generic kernel: the extents are its symbolic ones, remap_positions.coord; where the
        # representative needs no %, the axis is the outermost non-1 one at every extent of the bucket)
        return coord(self.low.sym, D, i, inner, axis, prod(D[b] for b in inner) * D[axis] < total)

    def _row_pos(self, axis: int) -> kir.Expr:
        """In a mixed region: the domain position along row axis ``axis`` of the round's row, from the
        map of a computed tensor of the domain's shape (the view's rows need not be the domain's
        leading axes in order: they follow the largest tensor's layout)."""
        D = self.domain
        dom_t = next((n.id for n in self.g.nodes if OPS[n.op].kind != "layout" and tuple(n.shape) == tuple(D)
                      and self.p.imap(n.id).cols.contiguous()), None)
        if dom_t is None:
            raise UnsupportedGraphError("a slice/concat along an outer axis in a region with transpose / reshape "
                                        "needs a computed tensor of the iteration domain's shape")
        lin = self.low.row_base(dom_t, Bin("min", self.k.ix.row, self.low.m_last()))
        return coord(self.low.sym, D, lin, range(axis + 1, len(D)), axis, axis > 0)

    def cond(self, sh: Shift, lane: int) -> kir.Expr | None:
        out = None
        for a, lo, hi in sh.conds:
            p = self.pos(a, lane)
            if (a, lo, hi) in self.moving:   # a generic kernel's concat along a dynamic axis: symbolic bounds
                slo, shi = self.moving[(a, lo, hi)]
                out = out if slo is None else and_(out, Bin(">=", p, slo))
                out = out if shi is None else and_(out, Bin("<", p, shi))
                continue
            assert self.low.sym is None or not self.low.sym.domain or self.low.sym.domain[a].static, \
                f"a condition along dynamic axis {a} not of a concat's piece (lower.dynamic refuses it)"
            if lo > 0:
                out = and_(out, Bin(">=", p, I(lo)))
            if hi < self.domain[a]:
                out = and_(out, Bin("<", p, I(hi)))
        return out

    def delta(self, axis: int, d: int) -> kir.Expr:
        """The shift ``d`` along domain ``axis`` as an expression: a later concat piece's offset along an
        axis whose extent follows the extents, and a slice's start counted from such an axis's end, are
        symbolic (:func:`~stitchtune.lower.remap_positions.moving_deltas`)."""
        sd = self.deltas.get((axis, d))
        return I(d) if sd is None or self.low.sym is None else self.low.sym.expr(sd)

    def moving_extra(self, shape: tuple[int, ...], sh: Shift) -> tuple[kir.Expr | None, bool]:
        """The part of the element offset of ``sh``'s delta in a tensor of ``shape`` (right-aligned to the
        domain, its own strides) that follows the extents: ``(symbolic - representative delta) * stride``
        along each axis with a symbolic shift where the tensor is not 1; None without one. And whether it
        is a multiple of ``vec`` at every extent (every such stride is)."""
        off = len(self.domain) - len(shape)
        out: kir.Expr | None = None
        aligned = True
        for a, d in sh.delta:
            sd = self.deltas.get((a, d))
            k = a - off
            if sd is None or self.low.sym is None or k < 0 or shape[k] == 1:
                continue
            stride = prod(shape[k + 1:])
            term = mul(self.low.sym.expr(SymInt.poly([*sd.terms, (-d, ())])), I(stride))
            out = term if out is None else add(out, term)
            aligned = aligned and stride % self.vec == 0
        return out, aligned

    def uniform(self, sh: Shift) -> bool:
        """Every condition has the same truth over the ``vec`` lanes of a vector."""
        v, D = self.vec, self.domain
        for a, lo, hi in sh.conds:
            if a not in self.col_axes:
                continue
            inner = prod(D[b] for b in self.col_axes if b > a)
            if inner % v == 0:
                continue
            if inner != 1 or lo % v or hi % v or D[a] % v:
                return False
        return True

    # -- ops -------------------------------------------------------------------------------------
    def concat(self, nd: Node, sh: Shift) -> list[kir.Expr]:
        a = self._axis(nd)
        pieces: list[tuple[Shift, list[kir.Expr]]] = []
        o = 0
        for arg in nd.tensor_args:
            ln = self.g.spec(arg).shape[node_axis(nd)]
            d = sh.d(a)
            psh = sh.limited(a, o - d, o + ln - d, self.domain[a])
            if psh is not None:
                pieces.append((psh, self.value(arg, psh.moved(a, -o))))
            o += ln
        if not pieces:
            raise UnsupportedGraphError(f"concat '{nd.id}': no piece is reached (an empty remap)")
        out = []
        for j in range(self.vec):
            v = pieces[-1][1][j]
            for psh, vals in reversed(pieces[:-1]):
                c = self.cond(psh, j)
                v = vals[j] if c is None else Select(c, vals[j], v)
            out.append(v)
        return out

    def elementwise(self, nd: Node, sh: Shift) -> list[kir.Expr]:
        low, vec = self.low, self.vec
        argv = [self.value(a, sh) if isinstance(a, str) else [Const(float(a), F32)] * vec for a in nd.args]
        vals: list[kir.Expr] = []
        for j in range(vec):
            v = self.k.var(f"t{low.tid_of[nd.id]}_", F32)
            self.sw.body.append(Assign(v, low.expr_of_node(nd, [x[j] for x in argv])))
            vals.append(v)
        return vals

    # -- loads -----------------------------------------------------------------------------------
    def _check_bounds(self, who: str, shape: tuple[int, ...], sh: Shift) -> int:
        return shift_offset(who, shape, sh, self.domain)

    def _outer(self, sh: Shift) -> bool:
        """In a mixed region: ``sh`` shifts or limits an outer axis (loads in row-major strides)."""
        return self.mixed and bool(sh.axes() - {len(self.domain) - 1})

    def load(self, name: str, sh: Shift) -> list[kir.Expr]:
        """Input ``name`` at ``p + delta`` under the conditions (a FULL or per-column input)."""
        low = self.low
        extra: kir.Expr | None = None
        extra_ok = True
        if self._outer(sh):  # p + delta in the row-major strides of plan.remap.outer_sources (checked there)
            shape = self.outer.shape(name)
            assert shape is not None, f"input '{name}' under an outer shift (the planner refuses it)"
            delta = self._check_bounds(name, shape, sh)
            extra, extra_ok = self.moving_extra(shape, sh)
        elif self.mixed:  # view element (r, c + d): a contiguous column map adds d (the planner checked it)
            delta = column_shift(name, sh, self.domain, self.g.spec(name).shape[-1] if name in self.wide else None)
        else:
            delta = self._check_bounds(name, self.g.spec(name).shape, sh)
            extra, extra_ok = self.moving_extra(self.g.spec(name).shape, sh)
        buf = low.in_buf[name]
        self.k.use_input(buf)
        im = self.p.imap(name)
        if not (im.cols.broadcast or im.cols.contiguous()):  # strided columns: each lane's own address
            if self._outer(sh):
                raise UnsupportedGraphError(f"input '{name}': a slice/concat along an outer axis of an input "
                                            "whose columns are not contiguous, in a region with transpose / reshape")
            return self._strided_load(name, buf, delta, sh, extra)
        if low.cls[name] is TensorClass.FULL:
            base = self.k.f_index(self.k.ix.row, self.sw.k0, name)
            row_ok = all(f.stride % self.vec == 0 for f in im.rows.factors)
        else:  # per-column input: varies along the columns only
            base = self.sw.k0
            row_ok = True
        at = add(base, I(delta)) if extra is None else add(add(base, I(delta)), extra)
        return self._emit(buf, at, sh, row_ok and delta % self.vec == 0 and extra_ok and
                          (im.cols.broadcast or im.cols.contiguous()), None)

    def _strided_load(self, name: str, buf: str, delta: int, sh: Shift,
                      extra: kir.Expr | None = None) -> list[kir.Expr]:
        """Input ``name`` (columns not one contiguous run: its own strides) at ``p + delta``, one
        predicated scalar load per lane at row offset + the map's column offset + ``delta``."""
        low = self.low
        full = low.cls[name] is TensorClass.FULL
        rowb = low.row_base(name, Bin("min", self.k.ix.row, low.m_last())) if full else I(0)
        out: list[kir.Expr] = []
        for j in range(self.vec):
            v = self.k.var("g", F32)
            if self.mixed:  # delta is a column shift (column_shift): the map of column c + delta
                at = add(rowb, low.col_offset(name, add(self.sw.k0, I(j + delta))))
            else:  # delta is in the input's own strides (shift_offset; extra: its symbolic part)
                at = add(add(rowb, low.col_offset(name, add(self.sw.k0, I(j)))), I(delta))
                at = at if extra is None else add(at, extra)
            self.sw.body.append(Assign(v, Load(buf, at, and_(self.sw.valid, self.cond(sh, j)))))
            out.append(v)
        return out

    def composed(self, head: str, sh: Shift) -> list[kir.Expr]:
        """Chain head ``head`` at ``p + delta`` under the conditions: each lane's coordinates in the
        head (its positions, right-aligned), carried back through the chain's transposes (permuted)
        and reshapes (the row-major linear index) to the input's offset; one vector load where the
        head's innermost dim (the domain's, or wider: a slice of its columns) is the input's innermost and the
        shift keeps vectors aligned
        (:meth:`_chain_contiguous`), else one predicated scalar load per lane."""
        chain = self.chains[head]
        self._check_bounds(head, self.g.spec(head).shape, sh)
        buf = self.low.in_buf[chain[-1]]
        self.k.use_input(buf)
        if self._chain_contiguous(chain, sh):
            return self._emit(buf, self._chain_offset(chain, sh, 0), sh, True, None)
        grouped = self.group is not None and head in self.row_heads and self._row_uniform(sh)
        out: list[kir.Expr] = []
        for j in range(self.vec):
            pj = and_(self.sw.valid, self.cond(sh, j))
            at = self._chain_offset(chain, sh, j)
            if grouped:   # row vectors: element q of the R rows copy 0 loaded (lower/row_vectors.py)
                assert self.group is not None
                got = self.group[0].load(self.group[1], buf, at, pj)
                if got is not None:
                    out.append(got)
                    continue
            v = self.k.var("g", F32)
            self.sw.body.append(Assign(v, Load(buf, at, pj)))
            out.append(v)
        return out

    def _row_uniform(self, sh: Shift) -> bool:
        """``sh`` moves the same way at every row of a thread's row group: no condition along a row axis,
        and no shift along the innermost row axis (the rows' vector would not start at a multiple of R)."""
        ra = self.row_axes[-1] if self.row_axes else -1
        return not any(a in self.row_axes for a, _, _ in sh.conds) and sh.d(ra) == 0

    def _chain_offset(self, chain: tuple[str, ...], sh: Shift, lane: int) -> kir.Expr:
        """The offset in the chain's input of lane ``lane``'s element of the head at ``p + delta``."""
        hshape = self.g.spec(chain[0]).shape
        off = len(self.domain) - len(hshape)
        sym = self.low.sym
        return chain_offset(self.low.nodes, self.g, chain, [
            I(0) if d == 1 else add(self.pos(off + k, lane), self.delta(off + k, sh.d(off + k)))
            for k, d in enumerate(hshape)], None if sym is None else sym.shape)

    def _chain_contiguous(self, chain: tuple[str, ...], sh: Shift) -> bool:
        """The ``vec`` lanes of a vector load adjacent, aligned elements of the chain's input: the
        domain's innermost axis is the head's innermost dim (of the domain's extent, wider, or narrower: a
        concat piece), both multiples of ``vec`` (as the delta along it), the conditions are uniform over the lanes, and the
        head's innermost dim stays innermost
        through every transpose and reshape (whose innermost dims are multiples of ``vec``)."""
        v, D = self.vec, self.domain
        shape = self.g.spec(chain[0]).shape
        if v == 1 or (self.low.sym is not None and any(self.low.sym.shape(t) is not None for t in chain)) or \
                any(k in self.deltas for k in sh.delta):
            return False   # (a generic kernel: a chain whose shapes or shift follow the extents: lane by lane)
        # the head's innermost dim is the domain's, wider (a fused projection read through a slice of its
        # columns) or narrower (a concat piece, reached under the piece's uniform conditions): c + d stays
        # inside it (_check_bounds), with rows a whole number of vectors
        if shape[-1] % v or D[-1] % v or sh.d(len(D) - 1) % v or not self.uniform(sh):
            return False
        if self.col_axes[-1:] != (len(D) - 1,):
            return False
        if self.dom_t is not None and self.p.imap(self.dom_t).vector_mode(v) != "vector":
            return False  # the lanes' domain positions are not adjacent
        k = len(shape) - 1
        for name in chain[:-1]:
            nd = self.low.nodes[name]
            src = self.g.spec(str(nd.args[0])).shape
            if nd.op == "transpose":
                k = nd.perm[k]
            elif nd.op == "slice":  # along the innermost dim: aligned where the start and the source's dim are
                if node_axis(nd) == k and nd.start % v or src[-1] % v:
                    return False
            elif k != len(shape) - 1 or shape[-1] % v or src[-1] % v:
                return False
            else:
                k = len(src) - 1
            shape = src
        return k == len(shape) - 1 and shape[-1] % v == 0

    def gather(self, nd: Node, sh: Shift) -> list[kir.Expr]:
        """``table[idx[row], c]`` at ``p + delta`` (column shifts only), 0.0 for an out-of-range index."""
        if sh.axes() & set(self.row_axes):
            raise UnsupportedGraphError(f"gather '{nd.id}' under a slice/concat along a row axis is not supported")
        table = str(nd.args[0])
        tshape = self.g.spec(table).shape
        # a generic kernel: the table is static (lower.dynamic) and its rows are the view's columns
        assert self.low.sym is None or self.low.sym.N.static, "a gather under a dynamic row length"
        delta = self._check_bounds(nd.id, tuple(tshape[1:]), sh)
        gi = self.k_gather_row(nd)
        buf = self.low.in_buf[table]
        self.k.use_input(buf)
        base = add(mul(Bin("max", gi, I(0)), I(self.p.N)), add(self.sw.k0, I(delta)))
        return self._emit(buf, base, sh, self.p.N % self.vec == 0 and delta % self.vec == 0,
                          Bin(">=", gi, I(0)))

    def k_gather_row(self, nd: Node) -> kir.Var:
        """The round's table row of gather ``nd`` (once per kernel round), and its error flag."""
        return gather_index(self.k, nd, self.g.spec(str(nd.args[0])).shape[0])

    def _emit(self, buf: str, base: kir.Expr, sh: Shift, aligned: bool, extra: kir.Expr | None) -> list[kir.Expr]:
        """``vec`` values from ``buf[base + j]``: one vector load when aligned and the conditions are
        uniform over the lanes, else one predicated scalar load per lane (0.0 where masked)."""
        vec, low = self.vec, self.low
        pred0 = and_(and_(self.sw.valid, extra), self.cond(sh, 0))
        if aligned and self.uniform(sh):
            dsts = tuple(self.k.var("g", F32) for _ in range(vec))
            # a masked vector keeps its destinations: zero them first so that masked lanes read 0.0
            for v in dsts:
                self.sw.body.append(Assign(v, Const(0.0, F32)))
            self.sw.body.append(kir.LoadVec(dsts, buf, base, pred0))
            return list(dsts)
        out: list[kir.Expr] = []
        for j in range(vec):
            pj = and_(and_(self.sw.valid, extra), self.cond(sh, j))
            v = self.k.var("g", F32)
            self.sw.body.append(Assign(v, Load(buf, add(base, I(j)), pj)))
            out.append(v)
        return out
