"""Which reuse candidates the heuristic caches (rule 4 of :mod:`stitchtune.cost.heuristic`), before levels.

A reuse candidate is a full-size tensor two or more sweeps need when nothing is cached. Caching every one
of them (the rule before issue 39) filled caches nobody reads: with ``e = exp(x - max)`` cached, no sweep
after its fill reads ``d = x - max`` (:mod:`stitchtune.lower.liveness`). :func:`tensors_to_cache` chooses:

1. **latest first**: the candidates in reverse graph order; one is taken when, with the ones already
   taken, a later sweep would read it back from its cache (so a tensor every later reader of which reads
   a taken later tensor instead is left out);
2. **cheap steps recomputed**: then each taken tensor (latest first) is dropped again when the sweeps
   that read it could recompute it from the other taken tensors and per-row values alone, with no
   full-size load, no special-function op (``exp``, division, ``rsqrt``: ``OPS[op].sfu``), no index op,
   and at most :data:`CHEAP_FLOPS` flops per element (a layer norm's ``x - mean`` is recomputed from the
   cached ``x``; a softmax's ``exp`` is not).

The sweeps are those of one kernel (the heuristic's schemes keep every stage in one kernel; with an
``independent`` stage the lowering drops the caches it then leaves unread itself).
"""

from __future__ import annotations

from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.lower.liveness import cache_reads, col_sweeps, row_sweeps
from stitchtune.plan.family import Family
from stitchtune.plan.planner import StitchPlan, TensorClass

#: flops per element a recomputation may cost and still count as cheap (one or two FMA-class steps)
CHEAP_FLOPS = 2


def _sweeps(plan: StitchPlan, args: dict[str, tuple[str, ...]]) -> list[list[tuple[str, ...]]]:
    segs = [list(range(plan.nstages))]
    if plan.family == Family.COL:
        return col_sweeps(plan, args, plan.output_names, segs)
    return row_sweeps(plan, args, plan.output_names, segs, {})


def _cheap(plan: StitchPlan, name: str, kept: set[str]) -> bool:
    """Whether ``name`` can be recomputed from the tensors ``kept`` cached (and per-row values) with no
    full-size load, no special function, no index op, and at most :data:`CHEAP_FLOPS` flops per element."""
    cls = dict(plan.classes)
    ops = {n: (op, a) for n, op, a in plan.dataflow}
    inputs = set(plan.input_names)
    flops, seen, stack = 0, set(), [name]
    while stack:
        n = stack.pop()
        if n in seen or cls.get(n) is not TensorClass.FULL or (n in kept and n != name):
            continue
        seen.add(n)
        if n in inputs or n not in ops:
            return False
        op, args = ops[n]
        info = OPS[op]
        if info.sfu or info.kind in INDEX_KINDS or info.kind == "reduce":
            return False
        flops += info.flops
        stack.extend(args)
    return flops <= CHEAP_FLOPS


def tensors_to_cache(plan: StitchPlan) -> frozenset[str]:
    """The reuse candidates worth a cache (module docstring); the rest are re-read or recomputed."""
    if not plan.dataflow:  # a plan made before the dataflow was recorded: every candidate, as before
        return frozenset(plan.reuse_candidates)
    args = {n: a for n, _, a in plan.dataflow}
    classes = dict(plan.classes)
    sweeps = _sweeps(plan, args)
    taken: set[str] = set()
    for c in reversed(plan.reuse_candidates):
        if c in cache_reads(args, classes, taken | {c}, sweeps):
            taken.add(c)
    for c in [c for c in reversed(plan.reuse_candidates) if c in taken]:
        if _cheap(plan, c, taken - {c}):
            taken.discard(c)
    return frozenset(taken)
