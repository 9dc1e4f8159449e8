"""Row vectors: a column-family thread that takes ``R`` consecutive view rows at once, so that an input
read *along the rows* is loaded ``R`` rows per vector access.

The column family gives a thread ``vec`` adjacent columns and one row per sweep iteration
(:mod:`stitchtune.lower.col`): coalesced along the columns. An input whose own stride-1 axis is the
view's innermost row axis (BERT's training ``view_59``: the gradient of a head split ``[B*H, D, S]``
read as ``[B*S, H*D]`` and summed over its rows; consecutive rows ``s`` adjacent in memory, consecutive
columns 512 floats apart) is then loaded one 4-byte element per column: with 8 column threads and 4 row
threads in a warp, each column's 4 rows are 16 bytes of their own 32-byte sector (2.00x the ideal
sectors, 32-bit loads).

With row vectors a thread owns an ``R x vec`` tile: rows ``r0 .. r0 + R - 1`` (``r0 = kbase + (it *
tpr + tk) * R``) of its ``vec`` columns. Such an input is read with one ``R``-element vector load per
column (``R = 16 / 4``: 128-bit for float32), every other tensor row by row as before (a vector along
the columns per row). A warp's load of the transposed input then covers, per column, 4 row threads x
16 bytes = 64 contiguous bytes (two whole sectors: 1.00x); its stores along the columns stay one
128-byte run per row (1.00x). The values, the reduction's operands and the outputs are those of the
same rows: only which thread computes which row changes (and so the order of a column's partial sums).

**Element-wise row kernels** (the row family) have the same need: GPT-2's training concat (``view_50``, k's
gradient ``[B*H, D, S]`` one of three pieces) and Llama's rotary gradient (``view_68``) read such an input
through a layout chain at the ideal sectors (:mod:`stitchtune.plan.adjacent`: 8 rows of 4 lanes a warp, 32
bytes per column) but one 32-bit load per element. With row vectors (``plan.vector_rows = R``,
:func:`elementwise_rows`) a row-kernel thread takes the ``R`` consecutive view rows ``r0 .. r0 + R - 1``
(``r0 = (task x rows a block + row in block) x R``) of its columns: each sweep iteration evaluates its
element ``R`` times, row ``r0 + q`` for ``q < R`` (the row index reassigned, everything else as one row
is evaluated: its remaps, chains, stores), and the chain loads of a transposed input go through
:class:`RowGroupLoads`: the ``q = 0`` copy issues one ``R``-element vector load at row ``r0`` (128 bits: 4
float32, 8 16-bit) per lane column, every copy takes its element ``q`` of it. The other tensors keep their
``vec``-wide vectors along the columns, one row at a time. A warp holds ``G / R`` row groups (``G`` the
plan's :attr:`~stitchtune.plan.planner.StitchPlan.adjacent_rows`, :func:`stitchtune.lower.lane_order.piece_lanes`):
its transposed loads cover ``G`` rows (a sector) per column, its column accesses ``32 R / G`` lanes x
``vec`` elements of a row: every access at its ideal sectors.

Contract: :func:`row_vector_rows` returns ``R > 1`` only where the schedule asks for row vectors (option
``row_vectors``, :data:`~stitchtune.space.options.ROW_VECTORS`) and the plan and the mapping allow them
(:mod:`stitchtune.plan.row_vectors`: a static column plan without index ops with at least one
:func:`row_vector_inputs` input, rows ``M`` that split into whole groups, ``M % (split * tpr * R) == 0``:
every thread's groups are whole and in its chunk, no row group straddles a chunk or the view's end, so a
group's rows are valid together). Else 1 (the row-by-row sweep). The space refuses the option where it does
not apply, so a lowered schedule never asks in vain. :func:`row_vector_sectors` is what the option trades:
the bytes-weighted sector factors of the plan's full-size tensors with and without row vectors.
"""

from __future__ import annotations

from collections.abc import Callable

from stitchtune.graph.parse import ITEMSIZE
from stitchtune.ir import kir
from stitchtune.ir.kir import F32, Var
from stitchtune.lower.base import Ctx, I, Lowerer, add
from stitchtune.lower.guarded_loads import load_vec
from stitchtune.lower.sectors import row_sector_factor
from stitchtune.plan.family import Family
from stitchtune.plan.planner import StitchPlan, TensorClass
from stitchtune.plan.row_vectors import ROW_VECTOR_BYTES, ROW_VECTOR_ROWS, row_groups_fit
from stitchtune.plan.row_vectors import row_vector_inputs as plan_row_vector_inputs
from stitchtune.space import ROW_VECTORS, Schedule

__all__ = ["ROW_VECTOR_BYTES", "row_vector_rows", "row_vector_inputs", "row_vector_sectors", "RowVectorLoads",
           "elementwise_rows", "RowGroupLoads"]


def row_vector_inputs(low: Lowerer, R: int) -> tuple[str, ...]:
    """The inputs of ``low``'s plan loaded ``R`` rows per vector access (:func:`stitchtune.plan.row_vectors.
    row_vector_inputs`), in plan order; those the program reads from a global buffer."""
    return tuple(n for n in plan_row_vector_inputs(low.p, R) if n in low.in_buf and n not in low.int_regs)


def asks_row_vectors(s: Schedule) -> bool:
    """Whether schedule ``s`` asks for row vectors (option ``row_vectors``; a table without it: no)."""
    return "row_vectors" in s.table and bool(s.option(ROW_VECTORS))


def row_vector_rows(low: Lowerer, index_ops: bool) -> int:
    """Rows a column-family thread takes at once: ``R = 16 / 4`` where the schedule asks for row vectors and
    the plan and mapping allow them (module docstring), else 1. ``index_ops``: the graph has index ops or
    layout chains (not handled)."""
    p, s = low.p, low.s
    R = ROW_VECTOR_ROWS
    if (p.family != Family.COL or low.sym is not None or index_ops or not asks_row_vectors(s)
            or not row_groups_fit(p.M, R, s.tpr, s.split)):
        return 1
    return R if row_vector_inputs(low, R) else 1


def row_vector_sectors(plan: StitchPlan, s: Schedule, R: int = ROW_VECTOR_ROWS) -> tuple[float, float]:
    """What option ``row_vectors`` trades for column plan ``plan`` under ``s``'s mapping: the sector factors
    (:func:`~stitchtune.lower.sectors.row_sector_factor`, the profile's) of its full-size mapped inputs
    and outputs, summed weighted by their element bytes (``ITEMSIZE``; every full-size tensor has ``M x N`` elements), row by
    row and with row vectors (the row-vector inputs ``R`` rows a lane, every other tensor one row a lane
    at rows ``R`` apart): ``(without, with)``. A plain (unmapped) tensor counts 1 either way (its factor
    by the profile's rule), so only the mapped ones can differ."""
    cls = dict(plan.classes)
    lanes = min(32, max(1, s.block // max(1, s.tpr)))
    rv = set(plan_row_vector_inputs(plan, R))
    off = on = 0.0
    for name in dict.fromkeys(list(plan.input_names) + list(plan.output_names)):
        if cls.get(name) is not TensorClass.FULL or name not in dict(plan.index_maps):
            continue
        nbytes = ITEMSIZE[plan.dtype(name)]
        if not plan.mapped(name):
            off, on = off + nbytes, on + nbytes
            continue
        imap = plan.imap(name)
        off += nbytes * row_sector_factor(imap, nbytes, s.vec, lanes)
        on += nbytes * row_sector_factor(imap, nbytes, s.vec, lanes, R if name in rv else 1, row_step=R)
    return off, on


class RowVectorLoads:
    """The row-vector loads of one sweep iteration: the first row to ask for an input's values emits
    its ``vec`` loads of ``R`` rows each (one per column, into ``R`` registers per column); every row
    of the group then takes its own ``vec`` values."""

    def __init__(self, low: Lowerer, cx: Ctx, body: list[kir.Stmt], R: int, r0: kir.Expr, c0: kir.Expr,
                 valid: kir.Expr, use_input: Callable[[str], None]) -> None:
        """``r0``: the group's first row (a multiple of ``R``, below ``M``); ``c0``: the thread's first
        column (clamped into the view); ``valid``: the group's validity (its rows are valid together);
        ``use_input``: the kernel's record of the global buffers it reads."""
        self._low, self._cx, self._body, self._R, self._use = low, cx, body, R, use_input
        self._r0, self._c0, self._valid = r0, c0, valid
        self.names = frozenset(row_vector_inputs(low, R))
        self._vals: dict[str, list[list[Var]]] = {}

    def values(self, name: str, q: int) -> list[kir.Expr]:
        """The ``vec`` values of input ``name`` (one of :attr:`names`) at row ``r0 + q``."""
        if name not in self._vals:
            low, R = self._low, self._R
            base = low.row_base(name, self._r0)
            self._use(low.in_buf[name])
            cols: list[list[Var]] = []
            for j in range(low.s.vec):
                dsts = tuple(self._cx.var(f"t{low.tid_of[name]}_", F32) for _ in range(R))
                idx = add(base, low.col_offset(name, add(self._c0, I(j))))
                self._body.extend(load_vec(dsts, low.in_buf[name], idx, self._valid, zeroed=True))
                cols.append(list(dsts))
            self._vals[name] = cols
        return [col[q] for col in self._vals[name]]

    def loader(self, q: int, load: Callable[[str], list[kir.Expr]]) -> Callable[[str], list[kir.Expr]]:
        """Row ``q``'s input loads: by the row vectors for an input in :attr:`names`, else by ``load``."""
        return lambda name: self.values(name, q) if name in self.names else load(name)


def elementwise_rows(plan: StitchPlan, s: Schedule, dynamic: bool) -> int:
    """View rows an element-wise row-kernel thread takes per sweep iteration: ``plan.vector_rows`` where the
    schedule asks for row vectors (option ``row_vectors``; the space offers it only where the plan has such
    rows, ``split`` 1), else 1. ``dynamic``: a generic kernel (never)."""
    if (plan.family != Family.ELEMENTWISE or dynamic or plan.vector_rows <= 1 or not asks_row_vectors(s)
            or s.split != 1):
        return 1
    return plan.vector_rows


class RowGroupLoads:
    """The row-vector loads of one sweep iteration of an element-wise row kernel with ``R`` rows a thread
    (module docstring): :meth:`load` of copy ``q = 0`` issues the vector load of ``R`` rows at an address and
    predicate, later copies take their element of it. The address and predicate are the same expressions in
    every copy (the row index is one variable, reassigned per copy), so they are the key."""

    def __init__(self, R: int, body: list[kir.Stmt], var: Callable[[str], Var]) -> None:
        self._R, self._body, self._var = R, body, var
        self._vals: dict[tuple[str, kir.Expr, kir.Expr | None], tuple[Var, ...]] = {}

    def load(self, q: int, buf: str, at: kir.Expr, pred: kir.Expr | None) -> kir.Expr | None:
        """Element ``q`` of the ``R`` elements ``buf[at ..]`` (row ``r0 + q`` of this lane column, ``at`` the
        address of row ``r0 + q`` when copy ``q`` evaluates it), or None where copy 0 did not load them (the
        caller loads the element itself)."""
        key = (buf, at, pred)
        if q == 0 and key not in self._vals:
            dsts = tuple(self._var("h") for _ in range(self._R))
            self._body.extend(load_vec(dsts, buf, at, pred, zeroed=True))
            self._vals[key] = dsts
        got = self._vals.get(key)
        return None if got is None else got[q]
