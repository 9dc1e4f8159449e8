"""Rule 9 of the heuristic (:mod:`stitchtune.cost.heuristic`): whether a column mapping takes row vectors.

A column plan with an input read along its rows (:mod:`stitchtune.plan.row_vectors`) can load it 4 rows per
128-bit access (option ``row_vectors``, :mod:`stitchtune.lower.row_vectors`); its other tensors are then
accessed one row at a time at rows 4 apart, which can cost them sectors. The rule weighs both with the
profile's sector factors (:func:`~stitchtune.lower.row_vectors.row_vector_sectors`): BERT's training
``view_59`` takes them (its transposed input 2.00x -> 1.00x, the stored product 1.00x either way); a second
strided input that loses more than the first gains keeps the row-by-row sweep. It is decided on rule 2's
mapping, before the reuse levels and the launch, so that the registers row vectors cost (the space's
``reg_cache_elems``, :func:`~stitchtune.space.options.row_vector_registers`) size the launch. Only that
mapping is judged: a mapping whose rows do not split into whole groups of 4 per thread keeps the row-by-row
sweep, and no smaller split is tried for them (the search tries the option wherever it applies): a smaller split
halves the blocks in flight for the sectors of one tensor, and no model workload needs it (docs/architecture.md,
``lower/row_vectors.py``: BERT's ``view_59``, the only column plan of BERT / GPT-2 / Llama with a row-vector input,
splits its 4096 rows into whole groups at rule 2's split 16).
"""

from __future__ import annotations

import dataclasses

from stitchtune.lower.row_vectors import row_vector_sectors
from stitchtune.plan.planner import StitchPlan
from stitchtune.space import Schedule, SearchSpace

__all__ = ["with_row_vectors"]


def with_row_vectors(space: SearchSpace, plan: StitchPlan, s: Schedule) -> Schedule:
    """``s`` (a column mapping, rule 2's with nothing cached yet) with row vectors where they are legal and
    the bytes-weighted sector factors of all its full-size tensors are lower with them than without; ``s``
    otherwise (a tie keeps the row-by-row sweep: fewer registers), and for a space without the option or a
    plan without row-vector inputs."""
    if "row_vectors" not in space.table or not space.row_vector_inputs:
        return s
    t = dataclasses.replace(s, row_vectors=True)  # type: ignore[call-arg]  # an option (Schedule docs)
    if space.rule_violations(t):
        return s
    without, with_ = row_vector_sectors(plan, t)
    return t if with_ < without else s
