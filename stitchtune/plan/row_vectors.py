"""Which column plans can take *row vectors*, and for which inputs: the plan's half of the schedule option
``row_vectors`` (:data:`stitchtune.space.options.ROW_VECTORS`; the kernels are
:mod:`stitchtune.lower.row_vectors`).

With row vectors a column-family thread owns ``R`` consecutive view rows of its ``vec`` columns, so an
input whose own stride-1 axis is the view's innermost row axis (BERT's training ``view_59``) is loaded
``R`` rows per 128-bit access. What the plan decides (the mapping adds ``M % (split * tpr * R) == 0``,
:func:`row_groups_fit`):

* the plan is of the column family, without index ops (slice / concat / gather: their remapped loads are
  row by row) and with at least one :func:`row_vector_inputs` input;
* such an input is a full-size float32 graph input read through its index map with strided columns (not
  contiguous, not broadcast) whose innermost row factor has ``inner`` 1, stride 1 and a ``dim`` multiple
  of ``R``, and whose every other stride (row and column factors) is a multiple of ``R``: so the ``R``
  rows ``r0 .. r0 + R - 1`` (``r0 % R == 0``) of a column are ``R`` adjacent, aligned elements.

Contract: pure functions of the plan (and the mapping for :func:`row_groups_fit`); the lowering takes row
vectors exactly where the schedule asks for them and these functions allow them (the space refuses the
option elsewhere).
"""

from __future__ import annotations

from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.plan.classes import TensorClass
from stitchtune.plan.family import Family
from stitchtune.plan.index_map import IndexMap
from stitchtune.plan.planner import StitchPlan

__all__ = ["ROW_VECTOR_BYTES", "ROW_VECTOR_ROWS", "loads_rows_as_vectors", "row_vector_inputs", "plan_row_vector_rows",
           "row_groups_fit"]

#: bytes of one row-vector access (the widest global access, 128 bits)
ROW_VECTOR_BYTES = 16
#: rows per row-vector access of a float32 input (``ROW_VECTOR_BYTES / 4``)
ROW_VECTOR_ROWS = ROW_VECTOR_BYTES // 4


def loads_rows_as_vectors(imap: IndexMap, R: int) -> bool:
    """Whether ``R`` consecutive rows ``r0 .. r0 + R - 1`` (``r0 % R == 0``) of any column are ``R``
    adjacent, aligned elements of a tensor of map ``imap`` whose columns are strided."""
    if imap.cols.broadcast or imap.cols.contiguous() or imap.row_repeats or not imap.rows.factors:
        return False
    unit = [f for f in imap.rows.factors if f.inner == 1]
    if len(unit) != 1 or unit[0].stride != 1 or unit[0].dim % R:
        return False
    others = [f for f in imap.rows.factors if f is not unit[0]] + list(imap.cols.factors)
    return all(f.stride % R == 0 for f in others)


def _has_index_ops(plan: StitchPlan) -> bool:
    """Whether the planned graph has index ops (slice / concat / gather ...; layout chains come only with them)."""
    return any(OPS[op].kind in INDEX_KINDS for _, op, _ in plan.dataflow)


def row_vector_inputs(plan: StitchPlan, R: int = ROW_VECTOR_ROWS) -> tuple[str, ...]:
    """The inputs of ``plan`` a column kernel with row vectors loads ``R`` rows per vector access (module
    docstring), in plan order; empty outside the column family or with index ops."""
    if plan.family != Family.COL or _has_index_ops(plan):
        return ()
    cls = dict(plan.classes)
    return tuple(n for n in plan.input_names
                 if cls.get(n) is TensorClass.FULL and plan.mapped(n) and plan.dtype(n) == "float32"
                 and loads_rows_as_vectors(plan.imap(n), R))


def plan_row_vector_rows(plan: StitchPlan) -> int:
    """:data:`ROW_VECTOR_ROWS` where ``plan`` has a :func:`row_vector_inputs` input, else 1 (the option
    ``row_vectors`` does not apply to it)."""
    return ROW_VECTOR_ROWS if row_vector_inputs(plan) else 1


def row_groups_fit(M: int, R: int, tpr: int, split: int) -> bool:
    """Whether the view's ``M`` rows split into whole groups of ``R`` rows for a mapping: every thread's
    groups are whole and in its chunk, no group straddles a chunk or the view's end (``M % (split * tpr *
    R) == 0``); False for ``R <= 1``."""
    return R > 1 and tpr > 0 and split > 0 and M % (split * tpr * R) == 0
