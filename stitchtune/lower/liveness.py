"""Which reuse caches a program reads: no cache is filled that no later sweep reads.

A reuse candidate is a full-size tensor that two or more sweeps need *when nothing is cached*
(:func:`stitchtune.plan.planner._reuse_candidates`). Once a later tensor of the same element-wise chain is
cached, the sweeps after its fill read that one and stop there: in a softmax with ``e = exp(x - max)``
cached, the output sweep reads ``e`` and never ``d = x - max``, so a cache of ``d`` would be written by the
second sweep and read by none (the H200 audit, issue 39: half of the attention softmax's 128 KB of shared
memory per block was such dead caches). :func:`kernel_levels` walks the sweeps of each kernel as
:class:`~stitchtune.lower.sweep_values.SweepValues` evaluates them (a tensor is taken from its cache once filled by
an earlier sweep of the same kernel, else loaded or computed from its arguments, and a cached one is filled
the first time a sweep computes it) and demotes, per kernel, the caches that no sweep of it reads back to
a re-read / recomputation (in fact never needed again); the lowering does so before sizing registers and
shared memory, so ``resources()`` and ``lower()`` agree. Caches do not outlive a kernel: with an
``independent`` stage a tensor may be cached in one kernel and not in the other.

The walk descends into every argument of a node (an index op's shifted evaluations bypass the caches, so it
may count a cache as read that is not): a cache is only ever kept where it might be read, never dropped where
it is read. Demoting a cache never changes a result, only where a value comes from.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from stitchtune.graph.parse import Node
from stitchtune.plan.planner import StitchPlan, TensorClass
from stitchtune.plan.single_pass import SinglePassCandidate
from stitchtune.space import ReuseLevel, uncached_level

CACHED = (ReuseLevel.REGISTER, ReuseLevel.SHARED)


def node_args(nodes: dict[str, Node]) -> dict[str, tuple[str, ...]]:
    """Each node's tensor arguments (constants left out)."""
    return {n: tuple(a for a in nd.args if isinstance(a, str)) for n, nd in nodes.items()}


def cache_reads(args: dict[str, tuple[str, ...]], classes: dict[str, TensorClass], cached: Iterable[str],
                kernels: Sequence[Sequence[Sequence[str]]]) -> frozenset[str]:
    """The tensors of ``cached`` that some sweep reads from its cache. ``kernels``: per kernel, its sweeps in
    order, each as the tensors it evaluates (reduction sources, outputs); caches do not outlive a kernel."""
    cached = frozenset(cached)
    read: set[str] = set()
    for sweeps in kernels:
        filled: set[str] = set()
        for roots in sweeps:
            seen: set[str] = set()
            newly: set[str] = set()
            stack = [(r, False) for r in reversed(list(roots))]
            while stack:  # post-order walk: a tensor is filled after its arguments are evaluated
                name, done = stack.pop()
                if done:
                    if name in cached:
                        newly.add(name)
                    continue
                if classes.get(name) is not TensorClass.FULL or name in seen:
                    continue
                seen.add(name)
                if name in filled:
                    read.add(name)
                    continue
                stack.append((name, True))
                stack.extend((a, False) for a in reversed(args.get(name, ())))
            filled |= newly
    return frozenset(read)


def row_sweeps(plan: StitchPlan, args: dict[str, tuple[str, ...]], outputs: Sequence[str], segs: Sequence[Sequence[int]],
               merged: dict[int, SinglePassCandidate]) -> list[list[tuple[str, ...]]]:
    """The sweeps of each kernel of a row-family program (:class:`~stitchtune.lower.row_kernel.RowKernel`):
    one per stage (a single-pass pair's one sweep reads the first stage's source), then in the last kernel
    the output sweep (full-size and per-reduced-index outputs, the cross reductions' sources)."""
    cls = dict(plan.classes)
    out: list[list[tuple[str, ...]]] = []
    for ki, seg in enumerate(segs):
        sweeps: list[tuple[str, ...]] = []
        for st in seg:
            if st - 1 in merged:
                continue
            if st in merged:
                sweeps.append((merged[st].source,))
            else:
                sweeps.append(tuple(args[r][0] for r in plan.stages[st]))
        if ki == len(segs) - 1:
            last = [o for o in dict.fromkeys(outputs) if cls[o].varies_along_reduced]
            sweeps.append(tuple(last) + tuple(c.source for c in plan.cross))
        out.append(sweeps)
    return out


def early_outputs(plan: StitchPlan, args: dict[str, tuple[str, ...]], outputs: Sequence[str]) -> tuple[str, ...]:
    """The outputs of ``outputs`` that vary along the reduced axis and that no reduction precedes (a
    column program stores them in its first sweep, :func:`col_sweeps`): a bias gradient's copy of its
    input (``y = x.T; db = y.sum(0)``) needs no reduction result, so it is written as it is read, not held
    in a cache until the combine is done."""
    cls, reds = dict(plan.classes), set(plan.reductions)
    after: dict[str, bool] = {}

    def follows(name: str) -> bool:   # whether a reduction is among name's ancestors (or is name)
        if name not in after:
            after[name] = name in reds or any(follows(a) for a in args.get(name, ()))
        return after[name]

    return tuple(o for o in dict.fromkeys(outputs) if cls[o].varies_along_reduced and not follows(o))


def col_sweeps(plan: StitchPlan, args: dict[str, tuple[str, ...]], outputs: Sequence[str],
               segs: Sequence[Sequence[int]]) -> list[list[tuple[str, ...]]]:
    """The sweeps of each kernel of a column-family program: one per stage, then the output sweep. The
    :func:`early_outputs` are evaluated by the first kernel's first sweep, the other outputs that vary along
    the reduced axis by the last kernel's output sweep."""
    cls = dict(plan.classes)
    early = early_outputs(plan, args, outputs)
    out: list[list[tuple[str, ...]]] = []
    for ki, seg in enumerate(segs):
        sweeps = [tuple(args[r][0] for r in plan.stages[st]) + (early if ki == 0 and i == 0 else ())
                  for i, st in enumerate(seg)]
        if ki == len(segs) - 1:
            sweeps.append(tuple(o for o in dict.fromkeys(outputs) if cls[o].varies_along_reduced and o not in early))
        out.append(sweeps)
    return out


def kernel_levels(plan: StitchPlan, args: dict[str, tuple[str, ...]], reuse: dict[str, str],
                  kernels: Sequence[Sequence[Sequence[str]]]) -> list[dict[str, str]]:
    """Per kernel of ``kernels``, the levels of ``reuse`` with every cache (register or shared) that no sweep
    of that kernel reads back demoted to a re-read (inputs) or a recomputation (intermediates)."""
    cached = [c for c, lvl in reuse.items() if lvl in CACHED]
    inputs, classes = set(plan.input_names), dict(plan.classes)
    out = []
    for sweeps in kernels:
        read = cache_reads(args, classes, cached, [sweeps])
        out.append({c: (lvl if lvl not in CACHED or c in read else uncached_level(c in inputs))
                    for c, lvl in reuse.items()})
    return out


def merged_levels(levels: Sequence[dict[str, str]], reuse: dict[str, str]) -> dict[str, str]:
    """The program's levels: each candidate's level in ``reuse`` where some kernel keeps its cache, else the
    demoted one (what register and shared-memory estimates count)."""
    return {c: lvl if any(k[c] == lvl for k in levels) else levels[0][c] for c, lvl in reuse.items()}
