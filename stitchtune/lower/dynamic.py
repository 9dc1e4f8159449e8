"""Generic kernels: one program per bucket of a dynamic graph, run for every extent in the bucket.

Contract
--------
:func:`fit_rows` plans a :class:`~stitchtune.graph.dynamic.DynamicGraph` at the bucket's largest
extents (the *representative* graph and plan that search, the cost model and the heuristic see) and
expresses every number of the plan that follows the extents as a monomial of them
(:class:`~stitchtune.graph.dynamic.SymInt`): the view's rows ``M``, each operand's row factors and each
input's and output's size. It fits them from plans at other extents (one dim moved at a time) and
checks the fit at a third, odd extent of every dim; a plan whose *structure* changes with the extents,
or a number that is not a monomial, is refused.

:func:`lower_dynamic` lowers a schedule of that plan with the rows symbolic
(:class:`~stitchtune.lower.symbols.RowSymbols`): every kernel takes the extents as ``int`` arguments
(``ext0``, ... in dim-name order; never a name from the graph), guards rows against ``M`` computed
from them, clamps to ``M - 1``, computes its round count from ``M`` and ``gridDim.x``, and addresses
operands that broadcast along part of the rows (a position embedding ``[S, H]`` under ``[B, S, H]``:
``(r % S) * H``) through the symbolic factors. The grid of each launch is a
:class:`~stitchtune.ir.launches.GridRule` of the extents; buffers are sized for the largest extents and
:class:`~stitchtune.ir.launches.DynamicInfo` gives the sizes at any others.

What a generic kernel cannot serve is a :class:`~stitchtune.graph.dynamic.DynamicRefusal` (data):
a dynamic extent in the reduced axis (``row length``: the row length, vector width and shared memory of
a row kernel are static), the column family (it reduces over the rows), cross reductions, index ops,
outputs broadcast along rows, and a vector width whose alignment does not hold for every extent.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from collections.abc import Mapping
from typing import Any

from stitchtune.errors import StitchtuneError
from stitchtune.graph.dynamic import BucketKey, DynamicGraph, DynamicRefusal, SymInt
from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.graph.parse import Graph
from stitchtune.hardware.device import Device
from stitchtune.hardware.occupancy import max_resident_blocks
from stitchtune.ir import kir
from stitchtune.ir.launches import DynamicInfo, GridRule
from stitchtune.lower.row import RowLowerer
from stitchtune.lower.symbols import RowSymbols, SymFactor
from stitchtune.plan.family import Family
from stitchtune.plan.planner import StitchPlan, make_plan
from stitchtune.space import Schedule, SearchSpace


@dataclasses.dataclass(frozen=True)
class RowFit:
    """A dynamic graph fitted for one bucket: the representative ``graph`` and ``plan`` (largest
    extents), the row symbols, and the size of each graph input/output as a monomial."""

    key: BucketKey
    extents: tuple[tuple[str, int], ...]     # the representative extents (each dim at its bucket's largest)
    graph: Graph
    plan: StitchPlan
    sym: RowSymbols
    sizes: tuple[tuple[str, SymInt], ...]    # graph tensor -> elements


def _numbers(g: Graph, p: StitchPlan) -> tuple[Any, list[tuple[str, int]]]:
    """The structure of a plan (what must not change with the extents) and its numbers, labelled."""
    nums: list[tuple[str, int]] = [("M", p.M), ("N", p.N)]
    shape = []
    for name, im in p.index_maps:
        shape.append((name, len(im.rows.factors), len(im.cols.factors), len(im.row_repeats), im.plain))
        for i, f in enumerate(im.rows.factors):
            nums += [(f"rows:{name}:{i}:dim", f.dim), (f"rows:{name}:{i}:inner", f.inner),
                     (f"rows:{name}:{i}:stride", f.stride)]
        for i, f in enumerate(im.cols.factors):
            nums += [(f"cols:{name}:{i}:dim", f.dim), (f"cols:{name}:{i}:inner", f.inner),
                     (f"cols:{name}:{i}:stride", f.stride)]
        for i, (d, inner) in enumerate(im.row_repeats):
            nums += [(f"repeat:{name}:{i}:dim", d), (f"repeat:{name}:{i}:inner", inner)]
    for name, spec in g.inputs:
        nums.append((f"size:{name}", spec.numel))
    for o in dict.fromkeys(g.outputs):
        nums.append((f"size:{o}", g.spec(o).numel))
    skeleton = dataclasses.replace(p, M=0, N=0, index_maps=())
    return (skeleton, tuple(shape)), nums


def _fit(base: int, moved: Mapping[str, tuple[int, int, int]], label: str) -> SymInt | None:
    """The monomial through ``base`` (all dims at a) and, per dim, its value with that dim at b:
    ``moved[d] = (a, b, value)``; None when there is none with integer exponents >= 0."""
    dims: list[str] = []
    coef = Fraction(base)
    for d, (a, b, v) in sorted(moved.items()):
        if v == base:
            continue
        if base == 0 or v == 0:
            return None
        ratio, e, step = Fraction(v, base), 0, Fraction(b, a)
        power = Fraction(1)
        while power != ratio and e < 4:
            e += 1
            power *= step
        if power != ratio:
            return None
        dims += [d] * e
        coef /= Fraction(a) ** e
    if coef.denominator != 1:
        return None
    return SymInt(int(coef), tuple(sorted(dims)))


def _at(dg: DynamicGraph, ext: Mapping[str, int]) -> Graph:
    g: Graph = dg.at_unchecked(ext)
    return g


def fit_rows(dg: DynamicGraph, key: BucketKey) -> RowFit | DynamicRefusal:
    """Fit the row symbols of ``dg`` for bucket ``key`` (module docstring); a refusal as data."""
    for nd in _at(dg, key.largest()).nodes:
        if OPS[nd.op].kind in INDEX_KINDS:
            return DynamicRefusal(f"index op {nd.id}", "slice / concat / gather are lowered for static shapes only")
    rep = key.largest()
    symbolic = [b.dim for b in key.buckets if b.lo < b.hi]
    try:
        g0 = _at(dg, rep)
        p0 = make_plan(g0)
    except StitchtuneError as e:
        return DynamicRefusal("plan", f"the graph at {rep} has no plan: {e.problems[0]}")
    if p0.family == Family.COL:
        return DynamicRefusal("family col", "a column reduction reduces over the dynamic rows")
    if p0.cross:
        return DynamicRefusal("cross reduction", "a reduction over the rows combines across blocks by a static count")
    s0, n0 = _numbers(g0, p0)
    moved: dict[str, dict[str, tuple[int, int, int]]] = {label: {} for label, _ in n0}
    for d in symbolic:
        a = rep[d]
        b = a // 2 if a >= 4 else a + 2
        try:
            gd = _at(dg, {**rep, d: b})
            sd, nd_ = _numbers(gd, make_plan(gd))
        except StitchtuneError as e:
            return DynamicRefusal("plan", f"the graph at {d}={b} has no plan: {e.problems[0]}")
        if sd != s0 or [x for x, _ in nd_] != [x for x, _ in n0]:
            return DynamicRefusal("plan", f"the plan at {d}={b} differs in structure from the one at {d}={a}")
        for (label, _), (_, v) in zip(n0, nd_):
            moved[label][d] = (a, b, v)
    fitted: dict[str, SymInt] = {}
    for label, v in n0:
        f = _fit(v, moved[label], label)
        if f is None:
            return DynamicRefusal("index map", f"{label.split(':')[0]} of the plan is no monomial of the extents")
        fitted[label] = f
    # the check: every dim at an odd extent other than the fitted ones
    check = {d: (rep[d] + 1 if rep[d] % 2 == 0 else rep[d] + 2) for d in symbolic}
    gc = _at(dg, {**rep, **check})
    sc, nc = _numbers(gc, make_plan(gc))
    full = {**rep, **check}
    if sc != s0 or any(fitted[label].value(full) != v for label, v in nc):
        return DynamicRefusal("plan", f"the plan at {check} does not follow the fitted extents")
    if not fitted["N"].static:
        return DynamicRefusal("row length", "a dynamic extent in the reduced axis (the row length of a row "
                              "kernel, its vector width and shared memory are static); planned per extent")
    for label, f in fitted.items():
        if label.startswith("cols:") and not f.static:
            return DynamicRefusal("index map", f"{label.split(':')[1]} varies along the columns with an extent")
    rows: list[tuple[str, tuple[SymFactor, ...]]] = []
    for name, im in p0.index_maps:
        rows.append((name, tuple(SymFactor(fitted[f"rows:{name}:{i}:dim"], fitted[f"rows:{name}:{i}:inner"],
                                           fitted[f"rows:{name}:{i}:stride"]) for i in range(len(im.rows.factors)))))
    args = tuple((d, f"ext{i}") for i, d in enumerate(dg.dim_names))
    sym = RowSymbols(fitted["M"], tuple(rows), args)
    sizes = tuple((label[5:], f) for label, f in fitted.items() if label.startswith("size:"))
    return RowFit(key, tuple(sorted(rep.items())), g0, p0, sym, sizes)


def check_schedule(fit: RowFit, schedule: Schedule) -> DynamicRefusal | None:
    """Whether ``schedule`` can run generically: every vector access aligned for every extent (the row
    strides of vector-loaded operands a multiple of ``vec`` whatever the extents), no output that
    broadcasts along part of the rows."""
    p, vec = fit.plan, schedule.vec
    for name, im in p.index_maps:
        if im.store_once and name in fit.graph.outputs:
            return DynamicRefusal(f"output {ascii(name)[1:-1]}", "stored once per row repeat (static rows only)")
        if vec > 1 and im.vector_mode(vec) == "vector":
            for f in fit.sym.factors(name):
                if f.stride.coef % vec:
                    return DynamicRefusal(f"vec {vec}", f"a row stride ({f.stride}) is not a multiple of {vec} "
                                          "for every extent")
    return None


def lower_dynamic(fit: RowFit, schedule: Schedule, device: Device,
                  space: SearchSpace | None = None) -> kir.Program | DynamicRefusal:
    """The generic program of ``schedule`` (checked against the representative plan's space) for every
    extent of ``fit.key``; a refusal (data) where the schedule cannot run generically."""
    space = space or SearchSpace.for_plan(fit.plan, device)
    space.check(schedule)
    why = check_schedule(fit, schedule)
    if why is not None:
        return why
    low = RowLowerer(fit.graph, fit.plan, schedule, device, space.schemes)
    low.sym = fit.sym
    prog = low.lower()
    rules = []
    for ln, prof in zip(prog.launches, prog.profile.kernels):
        k = prog.kernel(ln.kernel)
        rule = GridRule(fit.sym.M, low.rpb, schedule.split, schedule.tasks_per_block, schedule.persistent,
                        k.uses_grid_sync, schedule.split if schedule.split > 1 else 1,
                        max_resident_blocks(device, k.block, prof.est_registers, k.smem_bytes))
        assert rule.grid(dict(fit.extents)) == ln.grid, "the grid rule must give the lowered grid"
        rules.append(rule)
    tensors = dict(fit.sizes)
    sizes = tuple((b.name, tensors[b.tensor]) for b in prog.buffers if b.tensor in tensors and b.role in ("input", "output"))
    info = DynamicInfo(tuple(d for d, _ in fit.sym.args), fit.sym.arg_names(), sizes, tuple(rules), fit.extents)
    return dataclasses.replace(prog, dynamic=info)
