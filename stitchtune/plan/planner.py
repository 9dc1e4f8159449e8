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
raise :class:`UnsupportedGraphError` naming the tensor or node; they still run on the reference
executor.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from math import prod

from stitchtune.errors import UnsupportedGraphError
from stitchtune.graph.parse import Graph, Node
from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.plan import chains, pick, pieces, remap
from stitchtune.plan.family import Family
from stitchtune.plan.axes import Groups, TensorAxes, domain_candidates, tensor_axes
from stitchtune.plan.col_remap import check_col_index_ops
from stitchtune.plan.cross import CrossReduction, check_cross, epilogue_nodes, split_cross
from stitchtune.plan.index_map import IndexMap, index_map
from stitchtune.plan.ints import int_registers
from stitchtune.plan.row_moves import commute_row_moves
from stitchtune.plan.row_views import commute_row_views
from stitchtune.plan.scatter import Scatter, core_graph, split_scatters
from stitchtune.plan.single_pass import SinglePassCandidate, single_pass_candidates
from stitchtune.plan.unit_reductions import unit_reductions
from stitchtune.plan.transpose import TransposeTile, transpose_tile


class TensorClass(Enum):
    """How a tensor varies over the plan's ``[M, N]`` view (the value is the letter used in docs)."""

    FULL = "F"         # full [M, N]
    PER_KEPT = "P"     # one value per independent row (row family) / column (col family)
    PER_REDUCED = "K"  # one value per position along the reduced axis (gamma of a layernorm)
    SCALAR = "S"       # one value

    @property
    def varies_along_reduced(self) -> bool:
        """``FULL`` and ``PER_REDUCED``: produced element by element by a sweep along the reduced
        axis. ``PER_KEPT`` and ``SCALAR`` are one value per reduction (row/column), broadcast along it."""
        return self in (TensorClass.FULL, TensorClass.PER_REDUCED)

    def varies_along_cols(self, family: Family) -> bool:
        """Whether a tensor of this class varies along the view's columns in a plan of ``family``: the
        reduced axis of the row family (and element-wise), the kept one of the column family."""
        return self is TensorClass.FULL or self is (TensorClass.PER_KEPT if family == Family.COL
                                                     else TensorClass.PER_REDUCED)


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


def _axes_maps(graph: Graph, domain: tuple[int, ...]) -> dict[str, tuple[int | None, ...]]:
    """For each tensor of a *surrogate* graph (:mod:`stitchtune.plan.remap`): which axis of the
    right-aligned ``domain`` each of its dims indexes (None for a size-1 dim). Graphs without index
    ops use :func:`~stitchtune.plan.axes.tensor_axes` instead."""
    D = len(domain)

    def aligned(name: str, shape: tuple[int, ...], what: str) -> tuple[int | None, ...]:
        if len(shape) > D:
            raise UnsupportedGraphError(f"{what} '{name}' has a higher rank than the largest tensor")
        m: list[int | None] = []
        for k, s in enumerate(shape):
            dax = D - len(shape) + k
            if s == 1:
                m.append(None)
            elif s == domain[dax]:
                m.append(dax)
            else:
                raise UnsupportedGraphError(
                    f"{what} '{name}' shape {list(shape)} does not align with the iteration domain {list(domain)}")
        return tuple(m)

    maps: dict[str, tuple[int | None, ...]] = {name: aligned(name, spec.shape, "input") for name, spec in graph.inputs}
    for node in graph.nodes:
        info = OPS[node.op]
        targs = [a for a in node.args if isinstance(a, str)]
        if info.kind == "iota":   # no argument: its dims index the domain's axes as an input's do
            maps[node.id] = aligned(node.id, tuple(node.shape), "iota")
            continue
        if info.kind == "reduce":
            src = maps[targs[0]]
            if node.keepdims:
                maps[node.id] = tuple(None if i in node.axes else a for i, a in enumerate(src))
            else:
                maps[node.id] = tuple(a for i, a in enumerate(src) if i not in node.axes)
            continue
        rank = len(node.shape)
        out: list[int | None] = [None] * rank
        for a in targs:
            am = maps[a]
            off = rank - len(am)
            for k, ax in enumerate(am):
                pos = off + k
                if ax is None or node.shape[pos] == 1:  # a size-1 result dim (a size-1 slice) broadcasts
                    continue
                if out[pos] is None:
                    out[pos] = ax
                elif out[pos] != ax:
                    raise UnsupportedGraphError(
                        f"node '{node.id}' broadcasts values of different axes against each other "
                        "(a reduction without keepdims used along another axis?)")
        maps[node.id] = tuple(out)
    return maps


@dataclass(frozen=True)
class _View:
    """The 2-D view of the iteration domain: which domain axes are rows (``M``) and which columns
    (``N``), each group in domain (row-major) order; ``sizes[a]`` is the extent of axis ``a``."""

    family: Family
    sizes: dict[int, int]
    row_axes: tuple[int, ...]
    col_axes: tuple[int, ...]

    @property
    def M(self) -> int:
        return prod(self.sizes[a] for a in self.row_axes)

    @property
    def N(self) -> int:
        return prod(self.sizes[a] for a in self.col_axes)

    @property
    def shape(self) -> list[int]:
        """The domain's extents in order (for messages)."""
        return list(self.sizes.values())


def _reduced_axes(red_nodes: list[Node], maps: dict[str, Groups]) -> set[int]:
    """The domain axes every reduction reduces (the same for all of them, never mixed with kept ones)."""
    red_axes: set[int] | None = None
    for nd in red_nodes:
        src = maps[str(nd.args[0])]
        axes = {a for i in nd.axes for a in src[i]}
        kept = {a for i, g in enumerate(src) if i not in nd.axes for a in g}
        if red_axes is None:
            red_axes = axes
        elif axes and axes != red_axes:
            raise UnsupportedGraphError(
                f"reduction '{nd.id}' reduces other axes than the first reduction; stitched kernels "
                "need every reduction over the same axes")
        if kept & (red_axes or set()):
            raise UnsupportedGraphError(f"reduction '{nd.id}' mixes reduced and kept axes")
    return red_axes or set()


def _view(order: tuple[int, ...], sizes: dict[int, int], has_reductions: bool, red_axes: set[int]) -> _View:
    """The family and the row / column axes of the domain axes ``order`` (row-major). Reducing the
    innermost axis: family ``row``, the reduced axes are the columns (contiguous when they are the
    trailing axes; strided otherwise), the kept ones the rows. Keeping it: family ``col``, the reduced
    axes are the rows and the kept ones the columns, so that the lanes of a warp run along the
    contiguous innermost axis (leading reductions; a middle-axis reduction of ``[B, T, C]`` over ``T``
    has rows ``T`` and columns ``B*C``). Without a reduced axis: rows of the innermost axis."""
    red = [a for a in order if a in red_axes]
    if not has_reductions or not red or not order:
        family = Family.ROW if has_reductions else Family.ELEMENTWISE
        return _View(family, sizes, tuple(order[:-1]), tuple(order[-1:]))
    kept = tuple(a for a in order if a not in red_axes)
    if order[-1] in red_axes:
        return _View(Family.ROW, sizes, kept, tuple(red))
    return _View(Family.COL, sizes, tuple(red), kept)


def _classify(names: list[str], view: _View, maps: dict[str, Groups], one_row: bool = False) -> dict[str, TensorClass]:
    """The class of each tensor: which axis groups (rows, columns) it varies along (all of a group's
    axes or only some of them: a partial variation is expressed by the tensor's index map).

    ``one_row``: a row-family view whose rows are all of extent 1 (no row axis: a layer norm of
    ``[1, 1024]``, a decode step's RMSNorm of ``[1, 1, H]``): every tensor varies along the one row,
    so a tensor varying along the columns is ``FULL`` and one that does not (a reduction's result, a
    0-d input) ``PER_KEPT``, exactly the classes of the same graph with more rows."""
    rows_live, cols_live = set(view.row_axes), set(view.col_axes)
    per_row = TensorClass.PER_KEPT if view.family != Family.COL else TensorClass.PER_REDUCED
    per_col = TensorClass.PER_KEPT if view.family == Family.COL else TensorClass.PER_REDUCED
    classes: dict[str, TensorClass] = {}
    for name in names:
        varies = {a for g in maps[name] for a in g}
        in_rows, in_cols = one_row or bool(varies & rows_live), varies & cols_live
        if in_rows and in_cols:
            classes[name] = TensorClass.FULL
        elif in_rows:
            classes[name] = per_row
        elif in_cols:
            classes[name] = per_col
        else:
            classes[name] = TensorClass.SCALAR
    return classes


def _index_maps(graph: Graph, view: _View, maps: dict[str, Groups]) -> dict[str, IndexMap]:
    """Every tensor's :class:`IndexMap` over the view; an output must be stored through a bijective
    map (one view element per element of it, or one row / column: a plain map, or a permuted one) or
    be a full tensor broadcast along part of the row axes only (:attr:`IndexMap.store_once`: stored
    by the rows at coordinate 0 of those axes); any other partially broadcast output is refused."""
    out = {n: index_map(graph.spec(n).shape, maps[n], view.sizes, view.row_axes, view.col_axes) for n in maps}
    for o in graph.outputs:
        if not (out[o].bijective or out[o].store_once):
            raise UnsupportedGraphError(
                f"output '{o}' {list(graph.spec(o).shape)} broadcasts along part of the axes of the iteration "
                f"domain {view.shape} (of the columns, or of the rows of a per-row value); stitched kernels store "
                "full, per-row, per-column and scalar outputs, and full ones broadcast along row axes only")
    return out


def _check_reduction_sources(red_nodes: list[Node], view: _View, maps: dict[str, Groups]) -> None:
    """A kernel reduces over every reduced axis of the view: a reduction's source must vary along
    all of them (a source broadcast along one would be summed once per repeat)."""
    red_side = set(view.col_axes if view.family == Family.ROW else view.row_axes)
    for nd in red_nodes:
        varies = {a for g in maps[str(nd.args[0])] for a in g}
        if not red_side <= varies:
            raise UnsupportedGraphError(
                f"reduction '{nd.id}' reduces a tensor that broadcasts along part of the reduced axes")


def _check_reductions(red_nodes: list[Node], classes: dict[str, TensorClass]) -> None:
    """Every reduction reduces a full-size tensor to one value per row/column (a scalar result, the
    full reduction of a single row/column, becomes ``PER_KEPT`` in ``classes``)."""
    for nd in red_nodes:
        if classes[str(nd.args[0])] is not TensorClass.FULL:
            raise UnsupportedGraphError(f"reduction '{nd.id}' reduces a tensor that is not full-size")
        if classes[nd.id] not in (TensorClass.PER_KEPT, TensorClass.SCALAR):
            raise UnsupportedGraphError(f"reduction '{nd.id}' leaves a full-size result")
        if classes[nd.id] is TensorClass.SCALAR:
            classes[nd.id] = TensorClass.PER_KEPT


def _stages(graph: Graph, red_nodes: list[Node]) -> tuple[tuple[str, ...], ...]:
    """Reductions grouped by depth (reductions on the longest path to them, counting themselves)."""
    depth: dict[str, int] = {n: 0 for n, _ in graph.inputs}
    for nd in graph.nodes:
        d = max((depth[a] for a in nd.args if isinstance(a, str)), default=0)
        depth[nd.id] = d + 1 if OPS[nd.op].kind == "reduce" else d
    nst = max((depth[nd.id] for nd in red_nodes), default=0)
    return tuple(tuple(nd.id for nd in red_nodes if depth[nd.id] == s) for s in range(1, nst + 1))


def _reuse_candidates(graph: Graph, names: list[str], classes: dict[str, TensorClass],
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


def _check_index_op_maps(imaps: dict[str, IndexMap], family: str) -> None:
    """The remapped lowering (slice, concat, gather) addresses operands that broadcast along part of
    the row axes of row-family kernels only (as before general index maps)."""
    for name, im in imaps.items():
        if im.partial_cols or (family == Family.COL and not im.plain):
            raise UnsupportedGraphError(
                f"tensor '{name}' varies along only part of an axis group in a region with slice, concat "
                "or gather; index maps there support broadcasting along the row axes of row kernels only")


def _split_cross(all_red: list[Node], axes: TensorAxes) -> tuple[list[Node], list[Node]]:
    """:func:`~stitchtune.plan.cross.split_cross` over the axes of :func:`tensor_axes` (each tensor
    dim as the positions in the domain order of the axes it spans: several for a merged dim, the
    ``[B*H*W, C]`` gradient of a channels-last layer norm's backward viewed as ``[B, H, W, C]``)."""
    pos = {a: i for i, a in enumerate(axes.order)}
    spans = {n: tuple(tuple(pos[a] for a in g) for g in gs) for n, gs in axes.groups}
    sizes = axes.size_of
    return split_cross(all_red, spans, tuple(sizes[a] for a in axes.order))


def _mixed_view(real: Graph, sur: Graph, names: list[str], all_red: list[Node]
                ) -> tuple[tuple[int, ...], dict[str, Groups], list[Node], list[Node], _View]:
    """Domain, axis groups, (row-side, cross) reductions and view of a mixed region (slice / concat
    with transpose / reshape): :func:`tensor_axes` of the surrogate ``sur``, checked by
    :func:`~stitchtune.plan.remap.check_mixed` (the view's columns are the domain's innermost axis)."""
    domain = chains.domain_of(real)
    axes = tensor_axes(sur)
    maps = axes.of
    red_nodes, cross_nodes = _split_cross(all_red, axes)
    view = _view(axes.order, axes.size_of, bool(all_red), _reduced_axes(red_nodes, maps))
    keep = chains.layout_part(real)
    dom_t = next((n for n in names if n not in keep and tuple(sur.spec(n).shape) == tuple(domain)), None)
    if dom_t is None:   # the domain-sized tensors all keep their own layout (a reduction of a reshaped input)
        culprit = next((f"reduction '{nd.id}' reads" for nd in all_red), "the region has")
        raise UnsupportedGraphError(
            f"{culprit} a tensor of the iteration domain {list(domain)} that a transpose / reshape makes, in a "
            f"region with slice or concat (graph '{real.name}'); such regions iterate a domain-shaped tensor "
            "computed after the layout ops")
    out_cols = maps[dom_t][-1]
    chained = chains.chain_members(real)
    if (view.family == Family.ELEMENTWISE and set(view.col_axes) < set(out_cols)
            and not all(n in chained for n in real.input_names)):
        # the innermost domain dim spans several axes (rotary angles ``cat(freqs, freqs)`` made by an
        # expand): all of them are the columns, so that a column shift moves along the whole dim
        view = _View(view.family, view.sizes, tuple(a for a in axes.order if a not in out_cols), tuple(out_cols))
    remap.check_mixed(real, sur, domain, out_cols, view.col_axes, view.family)
    return domain, maps, red_nodes, cross_nodes, view


def make_plan(graph: Graph) -> StitchPlan:
    """Analyse ``graph``; raise :class:`UnsupportedGraphError` when it has no stitched lowering.
    A graph with index ops (slice, concat, gather) is analysed through its surrogate
    (:mod:`stitchtune.plan.remap`), over the right-aligned domain of its largest tensor; every other
    graph through :func:`~stitchtune.plan.axes.tensor_axes` (transpose / reshape as index maps). A
    *mixed* region (slice / concat and transpose / reshape, e.g. Llama's rotary: head split, then
    rotate-half) is mapped by :func:`tensor_axes` on its surrogate, whose layout part keeps its own
    shapes, and lowered with column shifts only (:func:`~stitchtune.plan.remap.check_mixed`).

    When the default domain tensor's layout is refused, the layouts of the other largest tensors
    (:func:`~stitchtune.plan.axes.domain_candidates`, outputs first) are tried in turn: a
    channels-last layer norm's backward reads its gradient in NCHW order, whose innermost axis is
    not the one its row reductions reduce, and plans over the layout of its NHWC output. A graph the
    default layout plans gets exactly the plan it always had; a refused one raises the default
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
    core, scatters = split_scatters(graph)
    if scatters:
        return replace(make_plan(core), scatters=scatters)
    unit, units = unit_reductions(graph)
    if units:   # reductions over extents of 1: identities (a row-move rewrite of that graph: moved_rows)
        p = make_plan(unit)
        # (no transpose tile: that lowering is for plans of the graph given, not of a rewrite)
        return p if p.moved_graph is not None else replace(p, moved_graph=unit, unit_reductions=units, transpose=None)
    try:
        plan = _plan_layouts(graph)
    except UnsupportedGraphError as refusal:
        for rewrite in (commute_row_moves, commute_row_views):
            moved = rewrite(graph)
            if moved is graph:
                continue
            try:
                return replace(_plan_layouts(moved), moved_graph=moved)
            except UnsupportedGraphError:
                continue
        raise refusal from None
    tile = transpose_tile(graph, plan.family, dict(plan.index_maps), dict(plan.dtypes), not plan.cross)
    return replace(plan, transpose=tile) if tile is not None else plan


def _plan_layouts(graph: Graph) -> StitchPlan:
    """:func:`make_plan` without the row-move rewrite: the default layout, then the other layouts."""
    try:
        return _make_plan(graph)
    except UnsupportedGraphError as refusal:
        if any(OPS[nd.op].kind in INDEX_KINDS for nd in graph.nodes):
            raise
        try:
            axes = tensor_axes(graph)
        except UnsupportedGraphError:
            raise refusal from None   # no axes at all: no other layout either
        tried, spans = {axes.order}, axes.of
        for name in domain_candidates(graph):   # one try per distinct layout spanning every axis
            order = tuple(a for g in spans[name] for a in g)
            if order in tried or set(order) != set(axes.order):
                continue
            tried.add(order)
            try:
                return _make_plan(graph, name)
            except UnsupportedGraphError:
                continue
        raise refusal


def _make_plan(graph: Graph, domain_tensor: str | None = None) -> StitchPlan:
    """:func:`make_plan` over the layout of tensor ``domain_tensor`` (None: the default domain tensor;
    only for graphs without index ops)."""
    ints = int_registers(graph)
    index_op = remap.int_index_op(graph, ints)
    if index_op is not None:  # (naming the index op: an importer can leave it out and keep the rest)
        raise UnsupportedGraphError(
            f"{index_op.op} '{index_op.id}' is in a region that computes with int values (graph '{graph.name}'); "
            "stitched kernels evaluate slice, concat and gather in float registers: int values may sit beside "
            "them, but not be read through them, be their result or be computed from it")
    pick.check_pick_indices(graph, ints)
    real, graph = graph, remap.surrogate(graph)
    names = [n for n, _ in graph.inputs] + [nd.id for nd in graph.nodes]
    all_red = [nd for nd in graph.nodes if OPS[nd.op].kind == "reduce"]
    mixed = real is not graph and chains.mixed_layout(real)
    if mixed:  # slice / concat with transpose / reshape: general maps, column shifts
        domain, maps, red_nodes, cross_nodes, view = _mixed_view(real, graph, names, all_red)
    elif real is not graph:
        domain = max((graph.spec(n).shape for n in names), key=lambda s: (prod(s), len(s)))
        old = _axes_maps(graph, domain)
        maps = {n: tuple((a,) if a is not None else () for a in m) for n, m in old.items()}
        order = tuple(a for a in range(len(domain)) if domain[a] > 1)
        red_nodes, cross_nodes = split_cross(all_red, maps, domain)
        view = _view(order, dict(enumerate(domain)), bool(all_red), _reduced_axes(red_nodes, maps))
        if view.family == Family.COL:   # slice / concat along the columns only (plan.col_remap)
            check_col_index_ops(real, domain, view.row_axes, view.col_axes, maps)
        else:
            remap.check_gathers(real, domain, view.col_axes, view.family)
    else:
        axes = tensor_axes(graph, domain_tensor)
        maps = axes.of
        red_nodes, cross_nodes = _split_cross(all_red, axes)
        view = _view(axes.order, axes.size_of, bool(all_red), _reduced_axes(red_nodes, maps))
    if ints and view.family == Family.COL:
        raise UnsupportedGraphError(
            f"graph '{real.name}' computes with int values in a column-reduction region; stitched kernels lower "
            "int arithmetic in element-wise and row-reduction regions only")
    one_row = view.family == Family.ROW and not view.row_axes and not cross_nodes
    classes = _classify(names, view, maps, one_row)
    _check_reductions(red_nodes, classes)
    _check_reduction_sources(red_nodes, view, maps)
    if real is not graph:
        rows = tuple(range(len(domain) - 1)) if mixed else view.row_axes
        remap.check_remaps(real, domain, rows, {n: c.varies_along_cols(view.family) for n, c in classes.items()}, mixed)
    imaps = _index_maps(graph, view, maps)
    if real is not graph and not mixed:  # mixed: a shifted load maps view element (r, c + d) (lower.remap)
        _check_index_op_maps(imaps, view.family)
    if real is not graph and not mixed:
        imaps.update(remap.real_index_maps(real, graph, old, domain, view.row_axes, view.col_axes))
    if mixed:  # an input wider than the domain along its innermost axis, a concat piece: its own strides
        imaps.update({n: index_map(real.spec(n).shape, maps[n], view.sizes, view.row_axes, view.col_axes)
                      for n in chains.wide_inputs(real) | pieces.concat_pieces(real, domain)})
    cross = check_cross(graph, cross_nodes, view.family, classes, {n: not m.plain for n, m in imaps.items()})
    stages = _stages(graph, red_nodes)
    return StitchPlan(
        family=view.family, M=view.M, N=view.N, classes=tuple(classes.items()),
        reductions=tuple(nd.id for nd in red_nodes), stages=stages,
        reuse_candidates=tuple(n for n in _reuse_candidates(graph, names, classes, stages, tuple(c.source for c in cross))
                               if n not in ints),  # int registers are reloaded / recomputed, never cached
        input_names=tuple(n for n, _ in graph.inputs), dtypes=tuple((n, graph.spec(n).dtype) for n in names),
        index_maps=tuple((n, imaps[n]) for n in names),
        single_pass=single_pass_candidates(graph, view.family, stages, view.N), cross=cross,
        epilogue=epilogue_nodes(graph, [nd for nd in cross_nodes]) if cross else (),
        dataflow=tuple((nd.id, nd.op, tuple(a for a in nd.args if isinstance(a, str))) for nd in graph.nodes),
        output_names=tuple(graph.outputs))
