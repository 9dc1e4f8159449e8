"""Stitch planning: AStitch's dominant-op analysis on a validated :class:`~stitchtune.graph.parse.Graph`.

The plan views the graph as a 2-D problem ``[M, N]`` (row-major, ``N`` contiguous) over the domain
axes found by :func:`~stitchtune.plan.axes.tensor_axes` (the largest tensor's layout; transpose and
reshape nodes are index maps, a reshape may split an axis, e.g. channels into groups):

* family ``row``: the reductions reduce the innermost domain axis (and maybe others): the reduced
  axes are the view's columns, the kept ones its rows (row reductions: layernorm, softmax, RMSNorm,
  group norm over (C/G, H, W)); ``P = M`` rows are independent, ``K = N`` is the reduced length.
* family ``col``: the reductions keep the innermost axis: the reduced axes are the view's rows and
  the kept ones its columns (column reductions, e.g. batchnorm statistics over the leading axes, or
  ``mean(x, axis=1)`` of ``[B, T, C]``: rows ``T``, columns ``B*C``, so the lanes of a warp still run
  along the contiguous ``C``); ``P = N`` columns are independent, ``K = M`` is the reduced length.
* family ``elementwise``: no reduction (bias + GELU); handled like ``row`` with zero stages.

Every tensor gets a :class:`TensorClass`: ``FULL`` (full ``[M, N]``), ``PER_KEPT`` (one value per
independent row/column, i.e. per index of the kept axis: reduction results and what is computed from
them), ``PER_REDUCED`` (one value per index of the reduced axis, e.g. gamma in a layernorm), ``SCALAR``.
Their values are the letters ``F``, ``P``, ``K``, ``S`` (``P`` and ``K`` as in :attr:`StitchPlan.P`
and :attr:`StitchPlan.K`). The reductions are the dominant ops; reductions of the same
*depth* (number of reductions on the longest path to them, counting themselves) form one stage and
share one stitching scheme. The result of a stage reaches its consumers one-to-many (a broadcast
along the reduced axis); which schemes are legal for that edge depends on the thread mapping and is
decided in :mod:`stitchtune.space`.

Every tensor also gets an :class:`~stitchtune.plan.index_map.IndexMap` (:attr:`StitchPlan.index_maps`):
where view element ``(r, c)`` lives in it. A tensor that broadcasts along some of the axes of a group
(a position embedding ``[1, S, H]`` against ``[B, S, H]``, a mask ``[B, 1, 1, S]`` against scores
``[B, H, S, S]``, rotary ``cos [1, 1, S, D]``, a per-channel ``[1, C, 1]``, group norm's gamma
``[1, C, 1, 1]``, which varies along the groups (rows) and the channels of a group (part of the
columns)) keeps the coarse class of what it varies along (``FULL``: it varies along rows and columns,
and is swept and cached like a full tensor, only reading fewer bytes; ``PER_KEPT``: one value per
row) and is addressed through its map (:meth:`StitchPlan.mapped`), with vector loads where the map
allows (:meth:`~stitchtune.plan.index_map.IndexMap.vector_mode`); every other tensor has the plain
map of its class, so its code is that of the 2-D family. An output is stored through its map when
that map is a bijection (a permuted full tensor, e.g. a transposed result), or when it is a full
tensor broadcast along part of the row axes (Llama's rotated ``k`` next to its grouped copy): then
only the rows at coordinate 0 of those axes store it (one writer per element).

Graphs that cannot be expressed in such a view (a partially broadcast output, reductions over
different axes, a reshape that is not a split/merge of the domain axes, a diagonal ``x + x.T``, ...)
are refused with a reason naming the tensor or node; they still run on the reference executor.

The planner is a pipeline of stages, each answering a value or a
:class:`~stitchtune.plan.refusal.Refusal` (no refusal is raised inside: :func:`plan_graph` returns it): **rewrites** (scatter
cores, unit reductions, then the graph as given, its row-move and its row-view rewrites, the first
that plans winning), **layouts** (the default domain tensor's, then the other largest tensors'),
**views** (:mod:`stitchtune.plan.views`: plain, through the graph's
:class:`~stitchtune.plan.views.Surrogate`, or mixed) and **checks** (:mod:`stitchtune.plan.checks`).
A refused graph keeps the first refusal (the graph's own, in its default layout). Only the public
edge raises: :func:`make_plan` raises the refusal's :class:`~stitchtune.errors.UnsupportedGraphError`
(a :class:`~stitchtune.errors.SeparateRegionsError` where it names nodes to keep apart).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.graph.parse import Graph, Node
from stitchtune.plan import checks
from stitchtune.plan.axes import domain_candidates, tensor_axes
from stitchtune.plan.classes import TensorClass
from stitchtune.plan.cross import CrossReduction, check_cross, epilogue_nodes
from stitchtune.plan.family import Family
from stitchtune.plan.index_map import IndexMap
from stitchtune.plan.ints import int_registers
from stitchtune.plan.refusal import Refusal, rewritten
from stitchtune.plan.row_moves import commute_row_moves
from stitchtune.plan.row_views import commute_row_views
from stitchtune.plan.scatter import Scatter, core_graph, split_scatters
from stitchtune.plan.single_pass import SinglePassCandidate, single_pass_candidates
from stitchtune.plan.adjacent import adjacent_rows, column_visits, vector_loads, vector_rows
from stitchtune.plan.transpose import TransposeTile, transpose_tile
from stitchtune.plan.unit_reductions import unit_reductions
from stitchtune.plan.views import Surrogate, Viewed, view_stage

__all__ = ["StitchPlan", "TensorClass", "Refusal", "make_plan", "plan_graph"]


@dataclass(frozen=True)
class StitchPlan:
    """The analysis result. All tuples are in graph (topological) order."""

    family: Family                           # row | col | elementwise
    M: int
    N: int
    classes: tuple[tuple[str, TensorClass], ...]  # tensor name -> its class
    reductions: tuple[str, ...]              # reduction node ids
    stages: tuple[tuple[str, ...], ...]      # reductions per stage, stage 1 first
    reuse_candidates: tuple[str, ...]        # FULL tensors needed by two or more sweeps
    input_names: tuple[str, ...]
    dtypes: tuple[tuple[str, str], ...]      # tensor name -> dtype
    index_maps: tuple[tuple[str, IndexMap], ...] = ()  # tensor name -> its map over [M, N]
    #: stage pairs one sweep can compute (Welford variance, online softmax; :mod:`stitchtune.plan.single_pass`)
    single_pass: tuple[SinglePassCandidate, ...] = ()
    #: reductions over the rows (column sums, losses): per-block accumulation + a cross-block combine
    #: (:mod:`stitchtune.plan.cross`); not in ``reductions`` / ``stages``. Empty for every graph whose
    #: reductions all reduce the same axes.
    cross: tuple[CrossReduction, ...] = ()
    #: the scalar epilogue of the cross reductions (:func:`~stitchtune.plan.cross.epilogue_nodes`):
    #: element-wise scalar nodes computed once after the cross-block combine, never by the rows' tasks
    epilogue: tuple[str, ...] = ()
    #: the graph this plan was made for when it is not the one given to :func:`make_plan`: its
    #: :func:`~stitchtune.plan.row_moves.commute_row_moves` rewrite (row moves pushed below their
    #: row-local computations; the same inputs and outputs), which the lowering lowers in place of the
    #: given graph (:meth:`planned_graph`). None for every other plan.
    moved_graph: Graph | None = None
    #: the region's ``scatter_add`` nodes (:mod:`stitchtune.plan.scatter`): the plan is its core graph's
    #: (scatters removed, their values outputs), the lowering adds each value's stores into its table
    scatters: tuple[Scatter, ...] = ()
    #: every node of the planned graph as (id, op, tensor arguments), in graph order: the element-wise
    #: chains the heuristic walks to choose reuse (which tensors a cache of a later one makes dead, which
    #: are cheap to recompute; :mod:`stitchtune.cost.heuristic`)
    dataflow: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    #: the planned graph's outputs (the last sweep's tensors, with the cross reductions' sources)
    output_names: tuple[str, ...] = ()
    #: the reductions over extents of 1 only (:mod:`stitchtune.plan.unit_reductions`: a softmax over one
    #: key) planned as the identities they are; :attr:`moved_graph` is then that rewrite of the graph
    unit_reductions: tuple[str, ...] = ()
    #: the row axis of the outputs stored through a shared-memory tile (:mod:`stitchtune.plan.transpose`:
    #: an element-wise region whose output's contiguous axis is a row axis of the view); None for
    #: every other plan
    transpose: TransposeTile | None = None
    #: the view rows a warp should span so that an input read along the view's rows (its stride-1 axis
    #: the view's innermost row axis) is loaded a whole sector at a time (:mod:`stitchtune.plan.adjacent`);
    #: 0 for every other plan
    adjacent_rows: int = 0
    #: the view rows a thread of such a plan takes so that its transposed inputs are loaded ``R`` rows per
    #: 128-bit access (option ``row_vectors``; :func:`stitchtune.plan.adjacent.vector_rows`); 0 where it
    #: cannot (and for every other plan)
    vector_rows: int = 0
    #: the loads of such chains a row element makes (a chain at each column shift it is read at): each holds
    #: ``vector_rows`` x ``vec`` floats in registers with row vectors (the registers the heuristic counts)
    vector_loads: int = 0
    #: those chain reads at a shift along the view's columns alone, ``(head, d, lo, hi)``
    #: (:func:`stitchtune.plan.adjacent.column_visits`): the ones a kernel can take from another lane
    #: (:mod:`stitchtune.plan.lane_shifts`)
    vector_visits: tuple[tuple[str, int, int, int], ...] = ()

    def cls(self, name: str) -> TensorClass:
        return dict(self.classes)[name]

    def imap(self, name: str) -> IndexMap:
        """The index map of tensor ``name`` (see :mod:`stitchtune.plan.index_map`)."""
        return dict(self.index_maps)[name]

    def mapped(self, name: str) -> bool:
        """Whether ``name`` is addressed through its index map (not one of the 2-D family's plain maps:
        it broadcasts along part of an axis group, or its axes are permuted)."""
        return not self.imap(name).plain

    def dtype(self, name: str) -> str:
        return dict(self.dtypes)[name]

    @property
    def moved_rows(self) -> bool:
        """Whether the plan was made for the row-move rewrite of its graph (:attr:`moved_graph`; not
        for its unit-reduction rewrite alone, :attr:`unit_reductions`)."""
        return self.moved_graph is not None and not self.unit_reductions

    def planned_graph(self, graph: Graph) -> Graph:
        """The graph this plan was made for, given the graph it was asked for: :attr:`moved_graph`
        where the planner rewrote ``graph``, else ``graph`` itself. :class:`ValueError` (a caller's
        bug) where ``graph`` has other inputs or outputs than the rewritten one (not its graph). With
        :attr:`scatters`: the graph planned is ``graph``'s scatter core (:func:`~stitchtune.plan.scatter.core_graph`)."""
        if self.scatters:
            graph = core_graph(graph)
        moved = self.moved_graph
        if moved is None:
            return graph
        if moved.inputs != graph.inputs or moved.outputs != graph.outputs:
            raise ValueError(f"plan of the row-move rewrite of graph '{moved.name}' used with graph '{graph.name}' "
                             "of other inputs or outputs")
        return moved

    @property
    def P(self) -> int:
        """Number of independent rows (row family) or columns (col family)."""
        return self.N if self.family == Family.COL else self.M

    @property
    def K(self) -> int:
        """Length of each reduction (row: N, col: M)."""
        return self.M if self.family == Family.COL else self.N

    @property
    def nstages(self) -> int:
        return len(self.stages)


def make_plan(graph: Graph) -> StitchPlan:
    """Analyse ``graph``; raise :class:`~stitchtune.errors.UnsupportedGraphError` when it has no
    stitched lowering (:func:`plan_graph`'s refusal, :meth:`Refusal.error`: the message of the rule that
    refused, a :class:`~stitchtune.errors.SeparateRegionsError` where it names nodes to keep apart)."""
    got = plan_graph(graph)
    if isinstance(got, Refusal):
        raise got.error()
    return got


def plan_graph(graph: Graph) -> StitchPlan | Refusal:
    """The plan of ``graph``, or the :class:`Refusal` saying why it has no stitched lowering (a value:
    what a region finder asks). The answers for the last 256 graphs are remembered (the planner is a
    function of the graph's value: equal graphs with the same constants get the same answer, e.g. a
    region the finder judged and the backend then compiles); a graph that cannot be hashed is planned
    each time.

    A graph with index ops (slice, concat, gather) is analysed through its surrogate
    (:class:`~stitchtune.plan.views.Surrogate`), over the right-aligned domain of its largest tensor;
    every other graph through :func:`~stitchtune.plan.axes.tensor_axes` (transpose / reshape as index
    maps). A *mixed* region (slice / concat and transpose / reshape, e.g. Llama's rotary: head split,
    then rotate-half) is mapped by :func:`tensor_axes` on its surrogate, whose layout part keeps its own
    shapes, and lowered with column shifts only (:func:`~stitchtune.plan.view_checks.check_mixed`).

    When the default domain tensor's layout is refused, the layouts of the other largest tensors
    (:func:`~stitchtune.plan.axes.domain_candidates`, outputs first) are tried in turn: a
    channels-last layer norm's backward reads its gradient in NCHW order, whose innermost axis is
    not the one its row reductions reduce, and plans over the layout of its NHWC output. A graph the
    default layout plans gets exactly the plan it always had; a refused one gets the default
    layout's refusal.

    A graph refused so whose row moves (slice / concat along outer axes) of a row-local computation
    with a reduction (Swin's LayerNorm right before its ``roll``) can be pushed below that computation
    (:func:`~stitchtune.plan.row_moves.commute_row_moves`) gets the plan of the rewritten graph, marked
    :attr:`StitchPlan.moved_graph` (the graph the lowering lowers); so does one whose rows are
    rearranged before a slice / concat and viewed again after it (Swin's roll back after attention:
    :func:`~stitchtune.plan.row_views.commute_row_views`); when those are refused too, the refusal of
    ``graph`` stands.

    A graph with reductions over extents of 1 only (a softmax over one key) is planned as the graph
    with those reductions as identities (:func:`~stitchtune.plan.unit_reductions.unit_reductions`,
    :attr:`StitchPlan.unit_reductions`, the lowering lowers that graph).

    A graph with ``scatter_add`` nodes is planned through its core graph, the plan listing the
    scatters (:func:`~stitchtune.plan.scatter.split_scatters`, which also names what it refuses)."""
    key = (graph, tuple(repr(a) for nd in graph.nodes for a in nd.args if not isinstance(a, str)))
    try:
        hash(key)
    except TypeError:   # (a Node built by hand with a list field)
        return _plan(graph)
    return _remembered(key)


def _plan(graph: Graph) -> StitchPlan | Refusal:
    """:func:`plan_graph`'s first stage, the rewrites: a scatter core, a unit-reduction rewrite, else
    the graph as given (with its transpose tile), then its row-move and row-view rewrites."""
    split = split_scatters(graph)
    if isinstance(split, Refusal):
        return split
    core, scatters = split
    if scatters:
        got = plan_graph(core)
        return got if isinstance(got, Refusal) else replace(got, scatters=scatters)
    unit_split = rewritten(unit_reductions, graph)
    if isinstance(unit_split, Refusal):
        return unit_split
    unit, units = unit_split
    if units:   # reductions over extents of 1: identities (a row-move rewrite of that graph: moved_rows)
        got = plan_graph(unit)
        if isinstance(got, Refusal) or got.moved_graph is not None:
            return got
        # (no transpose tile: that lowering is for plans of the graph given, not of a rewrite)
        return replace(got, moved_graph=unit, unit_reductions=units, transpose=None)
    plan = _plan_layouts(graph)
    if isinstance(plan, Refusal):
        return _plan_rewritten(graph, plan)
    tile = transpose_tile(graph, plan.family, dict(plan.index_maps), dict(plan.dtypes), not plan.cross)
    plain = not plan.cross and not plan.scatters
    rows = adjacent_rows(graph, plan.family, dict(plan.index_maps), plan.M, plain)
    vrows = vector_rows(graph, plan.family, dict(plan.index_maps), dict(plan.classes), plan.M, plain) if rows else 0
    loads = vector_loads(graph, dict(plan.classes), plan.M) if vrows else 0
    visits = column_visits(graph, dict(plan.classes), plan.M) if vrows else ()
    return (replace(plan, transpose=tile, adjacent_rows=rows, vector_rows=vrows, vector_loads=loads,
                    vector_visits=visits)
            if tile is not None or rows else plan)


@functools.lru_cache(maxsize=256)
def _remembered(key: tuple[Graph, tuple[str, ...]]) -> StitchPlan | Refusal:
    """:func:`_plan` of ``key[0]``, remembered by the graph and the spelling of its constants
    (``key[1]``: equal graphs may differ in them, ``0.0 == -0.0``, and a rewritten graph the plan
    carries, :attr:`StitchPlan.moved_graph`, keeps its own)."""
    return _plan(key[0])


def _plan_rewritten(graph: Graph, refusal: Refusal) -> StitchPlan | Refusal:
    """The plan of the first of ``graph``'s row-move and row-view rewrites that plans (marked
    :attr:`StitchPlan.moved_graph`), else ``refusal`` (``graph``'s own)."""
    for rewrite in (commute_row_moves, commute_row_views):
        moved = rewritten(rewrite, graph)
        if isinstance(moved, Refusal):
            return moved   # (the rewrite's graph is over the format's limits)
        if moved is graph:
            continue
        got = _plan_layouts(moved)
        if isinstance(got, StitchPlan):
            return replace(got, moved_graph=moved)
    return refusal


#: a column stride (elements) from which a warp's elements along the view's columns each take a 32-byte sector
_SECTOR_STRIDE = 8


def stored_across_rows(plan: StitchPlan) -> tuple[str, ...]:
    """The full-size outputs of a row-family ``plan`` with reductions whose elements along the view's
    columns (a warp's lanes) lie ``_SECTOR_STRIDE`` or more elements apart: each 4-byte store of a lane
    takes a sector of its own (8x the ideal for float32)."""
    if plan.family != Family.ROW or not plan.nstages:
        return ()
    maps, cls = dict(plan.index_maps), dict(plan.classes)
    out = []
    for o in plan.output_names:
        m = maps.get(o)
        if cls.get(o) is TensorClass.FULL and m is not None and m.cols.factors and \
                m.cols.factors[-1].inner == 1 and m.cols.factors[-1].stride >= _SECTOR_STRIDE:
            out.append(o)
    return tuple(out)


def _plan_layouts(graph: Graph) -> StitchPlan | Refusal:
    """The layouts stage: the plan in the default layout, else in the first other layout that plans
    (graphs without index ops only), else the default layout's refusal. A row plan that would store an
    output across its rows (:func:`stored_across_rows`: BERT's training ``view_59``, K's gradient
    ``[B*H, D, S]`` merged to ``[B*S, H*D]`` beside its bias gradient, 8x the ideal sectors per store)
    is planned in that output's layout instead where that is a column plan storing no output so: the
    input is then read across the rows, which a column tile of several rows per warp reads at a
    fraction of the sectors (``cost.heuristic`` rule 3), while every store moves whole sectors."""
    first = _plan_layout(graph, None)
    if isinstance(first, StitchPlan):
        across = stored_across_rows(first)
        if across and not any(OPS[nd.op].kind in INDEX_KINDS for nd in graph.nodes):
            for name in across:
                got = _plan_layout(graph, name)
                if isinstance(got, StitchPlan) and got.family == Family.COL and not _col_stored_across(got):
                    return got
        return first
    if any(OPS[nd.op].kind in INDEX_KINDS for nd in graph.nodes):
        return first
    axes = tensor_axes(graph)
    if isinstance(axes, Refusal):
        return first   # no axes at all: no other layout either
    tried, spans = {axes.order}, axes.of
    for name in domain_candidates(graph):   # one try per distinct layout spanning every axis
        order = tuple(a for g in spans[name] for a in g)
        if order in tried or set(order) != set(axes.order):
            continue
        tried.add(order)
        got = _plan_layout(graph, name)
        if isinstance(got, StitchPlan):
            return got
    return first


def _col_stored_across(plan: StitchPlan) -> bool:
    """Whether a column plan stores a full-size output at a column stride of ``_SECTOR_STRIDE`` or more."""
    maps, cls = dict(plan.index_maps), dict(plan.classes)
    return any(cls.get(o) is TensorClass.FULL and (m := maps.get(o)) is not None and m.cols.factors
               and m.cols.factors[-1].stride >= _SECTOR_STRIDE for o in plan.output_names)


def _plan_layout(graph: Graph, domain_tensor: str | None) -> StitchPlan | Refusal:
    """The plan of ``graph`` in the layout of tensor ``domain_tensor`` (None: the default domain
    tensor; only for graphs without index ops): the int rules, the surrogate, the view, the checks."""
    ints = int_registers(graph)
    refused = checks.int_refusal(graph, ints)
    if refused is not None:
        return refused
    sur = Surrogate.of(graph)
    if isinstance(sur, Refusal):
        return sur
    viewed = view_stage(graph, sur, domain_tensor)
    if isinstance(viewed, Refusal):
        return viewed
    refused = checks.int_family_refusal(graph, ints, viewed.view)
    if refused is not None:
        return refused
    return _checked_plan(sur, viewed, ints)


def _checked_plan(sur: Surrogate | None, viewed: Viewed, ints: frozenset[str]) -> StitchPlan | Refusal:
    """The checks stage over a view (:mod:`stitchtune.plan.checks`, in order, the first refusal
    standing), then the plan of the graph analysed (the surrogate's where there is one)."""
    view = viewed.view
    one_row = view.family == Family.ROW and not view.row_axes and not viewed.cross_nodes
    classes = checks.check_reductions(viewed.red_nodes, checks.classify(viewed.names, view, viewed.maps, one_row))
    if isinstance(classes, Refusal):
        return classes
    refused = (checks.check_reduction_sources(viewed.red_nodes, view, viewed.maps)
               or checks.remap_refusal(sur, viewed, classes))
    if refused is not None:
        return refused
    imaps = checks.index_maps(viewed)
    if not isinstance(imaps, Refusal):
        imaps = checks.surrogate_maps(sur, viewed, imaps)
    if isinstance(imaps, Refusal):
        return imaps
    cross = check_cross(viewed.graph, list(viewed.cross_nodes), view.family, classes,
                        {n: not m.plain for n, m in imaps.items()})
    if isinstance(cross, Refusal):
        return cross
    return _assemble(viewed, classes, imaps, cross, ints)


def _assemble(viewed: Viewed, classes: dict[str, TensorClass], imaps: dict[str, IndexMap],
              cross: tuple[CrossReduction, ...], ints: frozenset[str]) -> StitchPlan:
    """The :class:`StitchPlan` of a view that passed every check."""
    graph, view, names = viewed.graph, viewed.view, viewed.names
    stages = _stages(graph, viewed.red_nodes)
    return StitchPlan(
        family=view.family, M=view.M, N=view.N, classes=tuple(classes.items()),
        reductions=tuple(nd.id for nd in viewed.red_nodes), stages=stages,
        reuse_candidates=tuple(n for n in _reuse_candidates(graph, names, classes, stages, tuple(c.source for c in cross))
                               if n not in ints),  # int registers are reloaded / recomputed, never cached
        input_names=tuple(n for n, _ in graph.inputs), dtypes=tuple((n, graph.spec(n).dtype) for n in names),
        index_maps=tuple((n, imaps[n]) for n in names),
        single_pass=single_pass_candidates(graph, view.family, stages, view.N), cross=cross,
        epilogue=epilogue_nodes(graph, list(viewed.cross_nodes)) if cross else (),
        dataflow=tuple((nd.id, nd.op, tuple(a for a in nd.args if isinstance(a, str))) for nd in graph.nodes),
        output_names=tuple(graph.outputs))


def _stages(graph: Graph, red_nodes: tuple[Node, ...]) -> tuple[tuple[str, ...], ...]:
    """Reductions grouped by depth (reductions on the longest path to them, counting themselves)."""
    depth: dict[str, int] = {n: 0 for n, _ in graph.inputs}
    for nd in graph.nodes:
        d = max((depth[a] for a in nd.args if isinstance(a, str)), default=0)
        depth[nd.id] = d + 1 if OPS[nd.op].kind == "reduce" else d
    nst = max((depth[nd.id] for nd in red_nodes), default=0)
    return tuple(tuple(nd.id for nd in red_nodes if depth[nd.id] == s) for s in range(1, nst + 1))


def _reuse_candidates(graph: Graph, names: tuple[str, ...], classes: dict[str, TensorClass],
                      stages: tuple[tuple[str, ...], ...], cross_sources: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The full-size tensors that two or more sweeps need when nothing is cached: sweep ``s``
    (1..nstages) feeds the stage-``s`` reductions, sweep nstages + 1 writes the outputs and
    accumulates the cross reductions (of ``cross_sources``)."""
    needs: dict[str, set[int]] = {n: set() for n in classes}
    by_id = {nd.id: nd for nd in graph.nodes}

    def mark(name: str, sweep: int) -> None:
        if classes[name] is not TensorClass.FULL or sweep in needs[name]:
            return
        needs[name].add(sweep)
        nd = by_id.get(name)
        if nd is not None:
            for a in nd.args:
                if isinstance(a, str):
                    mark(a, sweep)

    for i, st in enumerate(stages):
        for r in st:
            mark(str(by_id[r].args[0]), i + 1)
    for o in graph.outputs + cross_sources:
        mark(o, len(stages) + 1)
    return tuple(n for n in names if classes[n] is TensorClass.FULL and len(needs[n]) >= 2)
