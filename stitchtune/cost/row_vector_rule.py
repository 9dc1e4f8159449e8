"""Rule 9 of the heuristic (:mod:`stitchtune.cost.heuristic`): whether a mapping takes row vectors (a column plan's;
an element-wise plan's with transposed inputs: the last paragraph).

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

An element-wise plan whose transposed inputs a thread can load ``R`` rows at a time (``plan.vector_rows``,
:mod:`stitchtune.plan.adjacent`) takes row vectors where the registers they are estimated to cost
(:func:`~stitchtune.space.options.elementwise_row_vector_registers`) keep two blocks per SM
(:func:`with_elementwise_row_vectors`): GPT-2's training concat does (estimated 68 registers; ptxas 50, 68 under
a 2-block launch bound), and so does Llama's rotary gradient, whose one input is read through 4 chains at 3 column
shifts, since its mapping (16 lanes of 4 columns: a row in one sweep iteration) takes the shifted reads from other
lanes (:mod:`stitchtune.plan.lane_shifts`): 4 loads an element are counted, not 12 (ptxas 88 registers; 188 when
every shift was loaded). Its mapping then gives a block's
warps ``adjacent_rows / R`` row groups each and doubles ``tpr`` (while it divides the row) until the grid
has two blocks per SM, as rule 2 does for one row a thread.
"""

from __future__ import annotations

import dataclasses
import math

from stitchtune.lower.base import estimate_registers
from stitchtune.lower.row_vectors import row_vector_sectors
from stitchtune.plan.family import Family
from stitchtune.plan.planner import StitchPlan
from stitchtune.space import Schedule, SearchSpace

__all__ = ["with_row_vectors", "with_elementwise_row_vectors"]


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


def with_elementwise_row_vectors(space: SearchSpace, plan: StitchPlan, s: Schedule) -> Schedule:
    """``s`` (rule 2's element-wise mapping) with row vectors (module docstring) where the plan can take them,
    the option is legal and the estimated registers keep two blocks per SM; ``s`` otherwise."""
    R = plan.vector_rows
    if plan.family != Family.ELEMENTWISE or R <= 1 or "row_vectors" not in space.table:
        return s
    dev = space.device
    t = dataclasses.replace(s, row_vectors=True)  # type: ignore[call-arg]  # an option (Schedule docs)
    G = max(1, plan.adjacent_rows // R)   # row groups a warp spans (lower.lane_order.piece_lanes)
    while (math.ceil(plan.M / max(1, t.block // t.tpr * R)) < 2 * dev.sm_count and t.block // (2 * t.tpr) >= G
           and plan.N % (2 * t.tpr * t.vec) == 0):
        t = dataclasses.replace(t, tpr=2 * t.tpr)
    if space.violations(t):
        return s
    est = estimate_registers(int(space.derived(t)["reg_cache_elems"]), t.vec, 4)
    return t if est <= dev.regs_per_sm // (2 * t.block) else s
