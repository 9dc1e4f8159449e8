"""Generic kernels: one program per bucket of a dynamic graph, run for every extent in the bucket.

Contract
--------
:func:`fit_rows` plans a :class:`~stitchtune.graph.dynamic.DynamicGraph` at the bucket's largest
extents (the *representative* graph and plan that search, the cost model and the heuristic see) and
expresses every number of the plan that follows the extents as a monomial of them, else as a
polynomial of degree 1 in each (:class:`~stitchtune.graph.dynamic.SymInt`, :mod:`stitchtune.lower.poly_fit`:
``B*H*(P + 1)`` rows of a cache concat under a dynamic batch): the view's rows ``M``, each operand's row
factors, each input's and output's size and, in a region with index ops, the domain's extents, each
concat piece's extent and each layout chain tensor's dims. It fits them from plans at other extents
(one dim moved at a time, inside its bucket where it has room; the corners of two or more moved where
a number needs them) and checks the fit at a third, odd extent of every dim; a plan whose *structure*
changes with the extents, or a number that is neither, is refused.

:func:`lower_dynamic` lowers a schedule of that plan with the rows symbolic
(:class:`~stitchtune.lower.symbols.RowSymbols`): every kernel takes the extents as ``int`` arguments
(``ext0``, ... in dim-name order; never a name from the graph), guards rows against ``M`` computed
from them, clamps to ``M - 1``, computes its round count from ``M`` and ``gridDim.x``, and addresses
operands that broadcast along part of the rows (a position embedding ``[S, H]`` under ``[B, S, H]``:
``(r % S) * H``) through the symbolic factors. The grid of each launch is a
:class:`~stitchtune.ir.launches.GridRule` of the extents; buffers are sized for the largest extents and
:class:`~stitchtune.ir.launches.DynamicInfo` gives the sizes at any others.

A dynamic extent in the reduced axis (the row length ``N``, e.g. softmax over the keys of attention
scores ``[B, H, S, S]``) is bounded by the bucket's largest: the sweep runs the iterations of the largest
row, each guarded by ``k < N`` from the arguments; register caches and shared memory are sized for the
largest row; a mean divides by ``N`` at run time; column maps use the symbolic column factors.

An embedding ``gather`` of rows of a static table (an input without named dims) is served: the row's
id is read through the ids' symbolic row map at the row clamped to ``M - 1`` and range-checked against
the table's static row count, with the static kernel's error flag (:mod:`stitchtune.lower.gather`).
So are slice / concat as :func:`~stitchtune.lower.dynamic_shifts.shift_refusal` says: along an axis
of the iteration domain whose extent, and every extent inside it, is the same for every extent of the
bucket (along the view's columns, beside transpose / reshape: Llama's rotary after the head split; along a
row axis of static extent: a concat of heads under a dynamic batch), and along an axis whose extent
follows the extents (a plain slice of the sequence; a cache concat or chunked prefill, its pieces'
offsets and conditions over their fitted extents).

What a generic kernel cannot serve is a :class:`~stitchtune.graph.dynamic.DynamicRefusal` (data):
the column family (it reduces over the rows), cross reductions, scatter_add, gather_elements, a gather from a
table with named dims (:func:`_index_refusal`), the slices / concats
:func:`~stitchtune.lower.dynamic_shifts.shift_refusal` refuses (a start counted from a moving axis's end, one that does not
span a moving axis, one with a moving axis inside it), any index op under a dynamic row length, outputs broadcast along rows (the
graph); and of a schedule (:func:`check_schedule`): a vector width whose alignment does not hold for
every extent (with a dynamic row length: unless the row length is a multiple of it), and,
with a dynamic row length, split rows (their pieces and partial counts) and the single pass (Welford /
online softmax finish with a static count). :func:`stitchtune.cost.heuristic.generic_heuristic` gives
a schedule every bucket accepts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, assert_never

from stitchtune.errors import GraphError, StitchtuneError
from stitchtune.graph.dynamic import BucketKey, DynamicGraph, DynamicRefusal, SymInt
from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.graph.parse import Graph, Node
from stitchtune.hardware.device import Device
from stitchtune.hardware.occupancy import max_resident_blocks
from stitchtune.ir import kir
from stitchtune.ir.launches import DynamicInfo, GridRule
from stitchtune.ir.verify import verify
from stitchtune.lower.dynamic_shifts import shift_refusal
from stitchtune.lower.poly_fit import fit_monomial, fit_multilinear
from stitchtune.lower.remap_positions import piece_conflict
from stitchtune.lower.row import RowLowerer
from stitchtune.lower.transpose import tile_edge
from stitchtune.lower.symbols import RowSymbols
from stitchtune.plan.family import Family
from stitchtune.plan.index_map import Factor
from stitchtune.plan.planner import StitchPlan, plan_graph
from stitchtune.plan.refusal import Refusal
from stitchtune.plan.chains import composed_chains, domain_of
from stitchtune.space import SINGLE_PASS, Schedule, SearchSpace


@dataclasses.dataclass(frozen=True)
class RowFit:
    """A dynamic graph fitted for one bucket: the representative ``graph`` and ``plan`` (largest
    extents), the row symbols, and the size of each graph input/output as a monomial."""

    key: BucketKey
    dgraph: DynamicGraph
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
    if any(OPS[nd.op].kind in ("slice", "concat") for nd in g.nodes):   # (remap positions: RowSymbols.domain)
        nums += [(f"dom:{k}", d) for k, d in enumerate(domain_of(g))]
    for nd in g.nodes:   # an iota's coordinate along its axis (RowSymbols.iotas): its dim and inner size
        if OPS[nd.op].kind == "iota" and nd.axis is not None:
            nums += [(f"iota:{nd.id}:dim", nd.shape[nd.axis]), (f"iota:{nd.id}:inner", math.prod(nd.shape[nd.axis + 1:]))]
    if any(OPS[nd.op].kind in INDEX_KINDS for nd in g.nodes):   # layout chains' shapes (RowSymbols.shapes)
        nums += [(f"chain:{t}:{k}", d) for t in _chain_tensors(g) for k, d in enumerate(g.spec(t).shape)]
    for nd in g.nodes:   # each concat piece's extent along the concat's axis (RowSymbols.pieces), slice starts
        if OPS[nd.op].kind == "slice":
            nums.append((f"start:{nd.id}", nd.start))
        if OPS[nd.op].kind == "concat":
            nums += [(f"piece:{nd.id}:{k}", g.spec(x).shape[nd.axis or 0]) for k, x in enumerate(nd.tensor_args)]
    for name, spec in g.inputs:
        nums.append((f"size:{name}", spec.numel))
    for o in dict.fromkeys(g.outputs):
        nums.append((f"size:{o}", g.spec(o).numel))
    # (plan.transpose: a static lowering's choice, refused by check_schedule, so not part of the structure)
    skeleton = dataclasses.replace(p, M=0, N=0, index_maps=(), transpose=None)
    return (skeleton, tuple(shape)), nums


def _second(rep: int, lo: int) -> int:
    """The second extent a dim's numbers are fitted at: inside its bucket ``lo..rep`` where it has one
    other than 1 (half the largest, at least ``lo``: a slice ``x[:, 1:]`` of a bucket ``3..4`` has one
    position at 2), else ``rep + 2``."""
    b = max(rep // 2, lo, 2)
    return b if b < rep else rep + 2


def _fit_number(label: str, base: int, symbolic: list[str], rep: Mapping[str, int], b_of: Mapping[str, int],
                numbers_at: Callable[[frozenset[str]], "dict[str, int] | DynamicRefusal"]
                ) -> SymInt | DynamicRefusal | None:
    """Plan number ``label`` (``base`` at ``rep``) as a monomial of the extents, else as a multilinear
    polynomial (:mod:`stitchtune.lower.poly_fit`: the corners of the dims that change it planned on demand);
    None where neither fits, a refusal where a corner has no plan like the representative's."""
    moved: dict[str, tuple[int, int, int]] = {}
    for d in symbolic:
        at = numbers_at(frozenset({d}))
        assert not isinstance(at, DynamicRefusal), "the one-dim corners are planned first"
        moved[d] = (rep[d], b_of[d], at[label])
    f = fit_monomial(base, moved)
    if f is not None and all(f.value({**rep, d: b}) == v for d, (_, b, v) in moved.items()):
        return f
    changing = [d for d in symbolic if moved[d][2] != base]
    failed: list[DynamicRefusal] = []

    def value(dims: frozenset[str]) -> int:
        got = numbers_at(dims)
        if isinstance(got, DynamicRefusal):
            failed.append(got)
            return 0
        return got[label]

    f = fit_multilinear(changing, rep, b_of, value)
    return failed[0] if failed else f


def _at(dg: DynamicGraph, ext: Mapping[str, int]) -> Graph:
    g: Graph = dg.at_unchecked(ext)
    return g


def _index_refusal(dg: DynamicGraph, nd: Node) -> DynamicRefusal | None:
    """Why index node ``nd`` keeps ``dg`` from a generic kernel, or None: a ``gather`` of rows of a
    static table (an input none of whose dims is named) along its axis 0 is served (its index read per
    row through the symbolic row map, its checks against the table's static row count);
    ``gather_elements`` is not; slice and concat are checked on the plan (:func:`~stitchtune.lower.dynamic_shifts.shift_refusal`)."""
    kind = OPS[nd.op].kind
    if kind not in INDEX_KINDS or kind in ("slice", "concat"):  # slice / concat: checked on the plan
        return None
    if kind != "gather":
        return DynamicRefusal(f"index op {nd.id}", "gather_elements is lowered for static shapes only")
    table = str(nd.args[0])
    spec = dg.template["inputs"].get(table)
    if spec is None:
        return DynamicRefusal(f"index op {nd.id}", "a gather from a computed tensor is lowered for static shapes only")
    if any(isinstance(d, str) for d in spec["shape"]):
        return DynamicRefusal(f"index op {nd.id}", "the gathered table's shape follows the extents")
    if nd.axis != 0:  # normalised by the graph's validation
        return DynamicRefusal(f"index op {nd.id}", "a gather along an axis other than the table's rows")
    return None


def fit_rows(dg: DynamicGraph, key: BucketKey) -> RowFit | DynamicRefusal:
    """Fit the row symbols of ``dg`` for bucket ``key`` (module docstring); a refusal as data."""
    for nd in _at(dg, key.largest()).nodes:
        why = _index_refusal(dg, nd)
        if why is not None:
            return why
    rep = key.largest()
    symbolic = [b.dim for b in key.buckets if b.lo < b.hi]
    try:
        g0 = _at(dg, rep)
    except GraphError as e:   # the graph at these extents is over the format's limits
        return DynamicRefusal("plan", f"the graph at {rep} has no plan: {e.problems[0]}")
    p0 = plan_graph(g0)
    if isinstance(p0, Refusal):
        return DynamicRefusal("plan", f"the graph at {rep} has no plan: {p0.reason}")
    why = _plan_refusal(p0)
    if why is not None:
        return why
    s0, n0 = _numbers(g0, p0)
    labels = [x for x, _ in n0]
    corners: dict[frozenset[str], dict[str, int]] = {frozenset(): dict(n0)}   # dims moved to b -> numbers
    b_of = {d: _second(rep[d], b.lo) for d in symbolic for b in key.buckets if b.dim == d}

    def numbers_at(moved_dims: frozenset[str]) -> dict[str, int] | DynamicRefusal:
        """The plan's numbers with the dims of ``moved_dims`` at b (memoised: each corner is a plan)."""
        if moved_dims not in corners:
            ext = {**rep, **{d: b_of[d] for d in moved_dims}}
            at = ", ".join(f"{d}={ext[d]}" for d in sorted(moved_dims))
            try:
                gd = _at(dg, ext)
            except GraphError as e:
                return DynamicRefusal("plan", f"the graph at {at} has no plan: {e.problems[0]}")
            pd = plan_graph(gd)
            if isinstance(pd, Refusal):
                return DynamicRefusal("plan", f"the graph at {at} has no plan: {pd.reason}")
            sd, nd_ = _numbers(gd, pd)
            if sd != s0 or [x for x, _ in nd_] != labels:
                return DynamicRefusal("plan", f"the plan at {at} differs in structure from the one at the bucket's "
                                      "largest extents")
            corners[moved_dims] = dict(nd_)
            if len(moved_dims) == 1:
                others.append(gd)
        return corners[moved_dims]

    others: list[Graph] = []
    for d in symbolic:
        got = numbers_at(frozenset({d}))
        if isinstance(got, DynamicRefusal):
            return got
    why = shift_refusal(g0, others)
    if why is not None:
        return why
    # the check: every dim at an odd extent other than the fitted ones
    check = {d: (rep[d] + 1 if rep[d] % 2 == 0 else rep[d] + 2) for d in symbolic}
    gc = _at(dg, {**rep, **check})
    pc = plan_graph(gc)
    if isinstance(pc, Refusal):
        return DynamicRefusal("plan", f"the graph at {check} has no plan: {pc.reason}")
    sc, nc = _numbers(gc, pc)
    full = {**rep, **check}
    if sc != s0 or [x for x, _ in nc] != labels:
        return DynamicRefusal("plan", f"the plan at {check} does not follow the fitted extents")
    fitted: dict[str, SymInt] = {}
    for (label, v), (_, vc) in zip(n0, nc):
        f = _fit_number(label, v, symbolic, rep, b_of, numbers_at)
        if isinstance(f, DynamicRefusal):
            return f
        if f is None or f.value(full) != vc:
            return DynamicRefusal("index map", f"{label.split(':')[0]} of the plan is no polynomial of the extents "
                                  "(a monomial, or of degree 1 in each)")
        fitted[label] = f
    return _row_fit(fitted, dg, key, g0, p0)


def _row_fit(fitted: Mapping[str, SymInt], dg: DynamicGraph, key: BucketKey, g0: Graph,
             p0: StitchPlan) -> RowFit | DynamicRefusal:
    """The :class:`RowFit` of the fitted numbers, or what its symbols cannot serve (concat pieces that
    meet another concat's only here, an index op under a dynamic row length)."""
    rep = key.largest()
    sym = _row_symbols(fitted, dg, g0, p0)
    clash = piece_conflict(g0, domain_of(g0), sym)
    if clash is not None:
        return DynamicRefusal(f"index op {clash}", "a concat along an axis that follows the extents whose pieces "
                              "meet another concat's at the same bounds here but not at every extent")
    index = [nd.id for nd in g0.nodes if OPS[nd.op].kind in INDEX_KINDS]
    if index and sym.dynamic_rows_length:  # their offsets and conditions are columns of a static row
        return DynamicRefusal(f"index op {index[0]}", "an index op under a dynamic row length")
    sizes = tuple((label[5:], f) for label, f in fitted.items() if label.startswith("size:"))
    return RowFit(key, dg, tuple(sorted(rep.items())), g0, p0, sym, sizes)


def _plan_refusal(p0: StitchPlan) -> DynamicRefusal | None:
    """Why the representative plan ``p0`` has no generic kernel whatever its numbers, or None."""
    if p0.scatters:
        return DynamicRefusal(f"scatter {p0.scatters[0].node}", "a scatter_add's table is zeroed and added to for "
                                                                 "static shapes only")
    if p0.moved_rows:
        return DynamicRefusal("row move", "a slice/concat moves the rows of a row-local computation (Swin's roll "
                                          "after a LayerNorm); pushed below it for static shapes only")
    if p0.family == Family.COL:
        return DynamicRefusal("family col", "a column reduction reduces over the dynamic rows")
    if p0.cross:
        return DynamicRefusal("cross reduction", "a reduction over the rows combines across blocks by a static count")
    return None


def _row_symbols(fitted: Mapping[str, SymInt], dg: DynamicGraph, g0: Graph, p0: StitchPlan) -> RowSymbols:
    """The :class:`RowSymbols` of the fitted plan numbers (labels of :func:`_numbers`)."""
    rows: list[tuple[str, tuple[Factor[SymInt], ...]]] = []
    cols: list[tuple[str, tuple[Factor[SymInt], ...]]] = []
    for name, im in p0.index_maps:
        for axis, out, n in (("rows", rows, len(im.rows.factors)), ("cols", cols, len(im.cols.factors))):
            out.append((name, tuple(Factor(fitted[f"{axis}:{name}:{i}:dim"], fitted[f"{axis}:{name}:{i}:inner"],
                                              fitted[f"{axis}:{name}:{i}:stride"]) for i in range(n))))
    args = tuple((d, f"ext{i}") for i, d in enumerate(dg.dim_names))
    domain = tuple(f for label, f in fitted.items() if label.startswith("dom:"))
    iotas = tuple((nd.id, (fitted[f"iota:{nd.id}:dim"], fitted[f"iota:{nd.id}:inner"])) for nd in g0.nodes
                  if f"iota:{nd.id}:dim" in fitted)
    return RowSymbols(fitted["M"], tuple(rows), args, fitted["N"], tuple(cols), domain, _repeats(fitted, p0),
                      _pieces(fitted, g0, domain), _shapes(fitted, g0),
                      tuple((label[6:], f) for label, f in fitted.items() if label.startswith("start:") and not f.static),
                      iotas)


def _pieces(fitted: Mapping[str, SymInt], g: Graph,
            domain: tuple[SymInt, ...]) -> tuple[tuple[str, tuple[SymInt, ...]], ...]:
    """Each concat along a domain axis whose extent follows the extents: its pieces' fitted extents."""
    out = []
    for nd in g.nodes:
        if OPS[nd.op].kind == "concat" and not domain[len(domain) - len(nd.shape) + (nd.axis or 0)].static:
            out.append((nd.id, tuple(fitted[f"piece:{nd.id}:{k}"] for k in range(len(nd.tensor_args)))))
    return tuple(out)


def _chain_tensors(g: Graph) -> list[str]:
    """The tensors of the region's layout chains of inputs (:func:`~stitchtune.plan.chains.composed_chains`),
    each once, in chain order."""
    return list(dict.fromkeys(t for chain in composed_chains(g).values() for t in chain))


def _shapes(fitted: Mapping[str, SymInt], g: Graph) -> tuple[tuple[str, tuple[SymInt, ...]], ...]:
    """Each layout chain tensor whose shape follows the extents: its fitted dims."""
    out = []
    for t in _chain_tensors(g):
        dims = tuple(fitted[f"chain:{t}:{k}"] for k in range(len(g.spec(t).shape)))
        if not all(d.static for d in dims):
            out.append((t, dims))
    return tuple(out)


def _repeats(fitted: Mapping[str, SymInt],
             p0: StitchPlan) -> tuple[tuple[str, tuple[tuple[SymInt, SymInt], ...]], ...]:
    """Each store-once output's row repeats ``(dim, inner)`` as fitted over the bucket's extents."""
    return tuple((name, tuple((fitted[f"repeat:{name}:{i}:dim"], fitted[f"repeat:{name}:{i}:inner"])
                              for i in range(len(im.row_repeats))))
                 for name, im in p0.index_maps if im.store_once)


def check_schedule(fit: RowFit, schedule: Schedule) -> DynamicRefusal | None:
    """Whether ``schedule`` can run generically: every vector access aligned for every extent (the row
    strides of vector-loaded operands a multiple of ``vec`` whatever the extents), no tiled transpose (``schedule.transpose``: static shapes only)."""
    p, vec, sym = fit.plan, schedule.vec, fit.sym
    if tile_edge(schedule):
        return DynamicRefusal(f"transpose {tile_edge(schedule)}", "the tiled transpose is lowered for static shapes only")
    if sym.dynamic_rows_length:
        if schedule.split > 1:
            return DynamicRefusal(f"split {schedule.split}", "a split row's pieces and partial counts need a static "
                                  "row length")
        if schedule.option(SINGLE_PASS):
            return DynamicRefusal("single_pass", "Welford / online-softmax results need a static row length")
    if vec > 1 and sym.dynamic_rows_length and not sym.N.multiple_of(vec):  # a vector must not straddle a row's end
        return DynamicRefusal(f"vec {vec}", f"the row length ({sym.N}) is not a multiple of {vec} for every extent")
    for name, im in p.index_maps:
        mode = im.vector_mode(vec) if vec > 1 else "scalar"
        if mode == "scalar":
            continue
        # vector accesses stay aligned for every extent: the row strides, the innermost column run (a
        # vector load) or every column factor's step (a uniform load) multiples of vec whatever the extents
        cf = dict(sym.cols).get(name, ())
        need = [f.stride for f in sym.factors(name)]
        # (and in a vector access the outer column steps: a transpose's column stride that follows the extents)
        need += [cf[-1].dim, *(f.stride for f in cf[:-1])] if mode == "vector" and cf else [f.inner for f in cf]
        for v in need:
            if not v.static and not v.multiple_of(vec):
                return DynamicRefusal(f"vec {vec}", f"{ascii(name)[1:-1]}: a stride or run ({v}) is not a multiple "
                                      f"of {vec} for every extent")
    return None


def _runtime(e: kir.Expr) -> bool:
    """Whether ``e`` reads a value known only at launch (an extent argument or the grid size)."""
    return any(isinstance(x, kir.Extent) or (isinstance(x, kir.Special) and x.kind == "gdim") for x in kir.exprs(e))


def runtime_divs(kernel: kir.Kernel, rounds: int) -> int:
    """Integer divisions and remainders by a runtime value one thread of ``kernel`` executes per launch:
    each occurrence times the trip counts of the loops around it (a loop with runtime bounds, the round
    loop, counted ``rounds`` times)."""

    def count(stmts: tuple[kir.Stmt, ...], mult: int) -> int:
        n = 0
        for s in stmts:
            n += mult * sum(1 for e in kir.exprs(s) if isinstance(e, kir.Bin) and e.op in ("/", "%") and _runtime(e.b))
            match s:
                case kir.For():
                    trips = rounds  # runtime bounds: the round loop
                    if isinstance(s.start, kir.Const) and isinstance(s.stop, kir.Const):
                        trips = max(0, -(-(int(s.stop.value) - int(s.start.value)) // s.step))
                    n += count(s.body, mult * trips)
                case kir.If():
                    n += count(s.then, mult) + count(s.orelse, mult)
                case (kir.Assign() | kir.SetLocal() | kir.LoadVec() | kir.StoreVec() | kir.AtomicAdd() | kir.Barrier()
                      | kir.GridSync() | kir.ClusterSync() | kir.RemoteStore() | kir.Comment()):
                    pass  # no statements nested in it
                case _:
                    assert_never(s)
        return n

    return count(kernel.body, 1)


def generic_profile(fit: RowFit, schedule: Schedule, device: Device, program: kir.Program,
                    extents: Mapping[str, int]) -> kir.ProgramProfile | None:
    """The profile of generic ``program`` (``lower_dynamic(fit, schedule, ...)``) run at ``extents``: the
    specialised program's at those extents with the same schedule (same grid, bytes, rounds) and the
    generic kernels' ``runtime_divs`` (cost model item 8); None where the schedule is not a legal point
    of the plan at ``extents`` (or there is no plan there)."""
    from stitchtune.lower.entry import lower

    g = fit.dgraph.at_unchecked(extents)
    plan = plan_graph(g)
    if isinstance(plan, Refusal):   # no plan at this extent (a softmax over one key)
        return None
    try:  # the schedule is no point of the plan at this extent
        static = lower(g, plan, schedule, device, SearchSpace.for_plan(plan, device))
    except StitchtuneError:
        return None
    if len(static.profile.kernels) != len(program.profile.kernels):
        return None
    assert program.dynamic is not None, "a generic program"
    ext = dict(extents)
    kernels = []
    for i, (sp, ln) in enumerate(zip(static.profile.kernels, program.launches)):
        rule = program.dynamic.grids[i]
        rounds = -(-rule.tasks(ext) // rule.grid(ext))
        kernels.append(dataclasses.replace(sp, runtime_divs=runtime_divs(program.kernel(ln.kernel), rounds)))
    return dataclasses.replace(static.profile, kernels=tuple(kernels))


def lower_dynamic(fit: RowFit, schedule: Schedule, device: Device,
                  space: SearchSpace | None = None) -> kir.Program | DynamicRefusal:
    """The generic program of ``schedule`` (checked against the representative plan's space) for every
    extent of ``fit.key`` (checked by :func:`stitchtune.ir.verify.verify`); a refusal (data) where the schedule
    cannot run generically."""
    space = space or SearchSpace.for_plan(fit.plan, device)
    space.check(schedule)
    why = check_schedule(fit, schedule)
    if why is not None:
        return why
    low = RowLowerer(fit.graph, fit.plan, schedule, device, space.schemes, sym=fit.sym)
    prog = low.lower()
    rules, profiles = [], []
    for ln, prof in zip(prog.launches, prog.profile.kernels):
        k = prog.kernel(ln.kernel)
        rule = GridRule(fit.sym.M, low.rpb, schedule.split, schedule.tasks_per_block, schedule.persistent,
                        k.uses_grid_sync, schedule.split if schedule.split > 1 else 1,
                        max_resident_blocks(device, k.block, prof.est_registers, k.smem_bytes))
        assert rule.grid(dict(fit.extents)) == ln.grid, "the grid rule must give the lowered grid"
        rules.append(rule)
        rounds = -(-rule.tasks(dict(fit.extents)) // ln.grid)
        profiles.append(dataclasses.replace(prof, runtime_divs=runtime_divs(k, rounds)))
    prog = dataclasses.replace(prog, profile=dataclasses.replace(prog.profile, kernels=tuple(profiles)))
    tensors = dict(fit.sizes)
    sizes = tuple((b.name, tensors[b.tensor]) for b in prog.buffers if b.tensor in tensors and b.role in ("input", "output"))
    info = DynamicInfo(tuple(d for d, _ in fit.sym.args), fit.sym.arg_names(), sizes, tuple(rules), fit.extents)
    return verify(dataclasses.replace(prog, dynamic=info))
