"""The planner's view stage: which domain axes are the rows and which the columns of a graph's 2-D view.

A graph is viewed one of three ways (:func:`view_stage`), each answering a :class:`Viewed` or a
:class:`~stitchtune.plan.refusal.Refusal`:

* a graph without index ops: over the axes of :func:`~stitchtune.plan.axes.tensor_axes` (transpose /
  reshape as index maps), in the layout of a chosen domain tensor (:func:`plain_view`);
* a graph with index ops (slice, concat, gather): through its :class:`Surrogate` (the graph the
  planner analyses in its place, :func:`~stitchtune.plan.remap.surrogate`), over the right-aligned
  domain of its largest tensor (:func:`surrogate_view`);
* a *mixed* region (index ops and transpose / reshape, Llama's rotary): :func:`tensor_axes` of its
  surrogate, whose layout part keeps its own shapes, checked by
  :func:`~stitchtune.plan.view_checks.check_mixed` (:func:`mixed_view`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Graph, Node
from stitchtune.plan import chains, remap
from stitchtune.plan.axes import Groups, TensorAxes, tensor_axes
from stitchtune.plan.col_remap import check_col_index_ops
from stitchtune.plan.cross import split_cross
from stitchtune.plan.family import Family
from stitchtune.plan.refusal import Refusal
from stitchtune.plan.view_checks import check_gathers, check_mixed

__all__ = ["View", "Surrogate", "Viewed", "view_stage", "plain_view", "surrogate_view", "mixed_view", "make_view"]


@dataclass(frozen=True)
class View:
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


@dataclass(frozen=True)
class Surrogate:
    """A graph with index ops (``real``: slice, concat, gather) and the graph the planner analyses in
    its place (``graph``: :func:`~stitchtune.plan.remap.surrogate`: index ops as element-wise nodes
    over domain-shaped tensors); ``mixed``: ``real`` also has transpose / reshape outside its chains
    of views (:func:`~stitchtune.plan.chains.mixed_layout`). The region facts of ``real`` that
    :func:`~stitchtune.plan.remap.surrogate` decided (so they refuse nothing once it has made the
    surrogate): its iteration ``domain`` (:func:`~stitchtune.plan.chains.domain_of`), the tensors
    that keep their own shapes (``keep``, :func:`~stitchtune.plan.chains.layout_part`) and those of
    its chains (``chained``, :func:`~stitchtune.plan.chains.chain_members`)."""

    real: Graph
    graph: Graph
    mixed: bool
    domain: tuple[int, ...] = ()
    keep: frozenset[str] = frozenset()
    chained: frozenset[str] = frozenset()

    @staticmethod
    def of(graph: Graph) -> Surrogate | Refusal | None:
        """The surrogate of ``graph``; None for a graph without index ops (analysed as it is)."""
        sur = remap.surrogate(graph)
        if isinstance(sur, Refusal):
            return sur
        if sur is graph:
            return None
        return Surrogate._made(graph, sur)

    @staticmethod
    def _made(real: Graph, graph: Graph) -> Surrogate:
        """The record of ``real`` and its surrogate ``graph``, with the region facts (decided, with their
        rules, by :func:`~stitchtune.plan.remap.surrogate`)."""
        return Surrogate(real, graph, chains.mixed_layout(real), chains.domain_of(real),
                         frozenset(chains.layout_part(real)), frozenset(chains.chain_members(real)))


@dataclass(frozen=True)
class Viewed:
    """The view stage's result: the graph analysed (``graph``: the surrogate's where there is one) and
    its tensors in graph order (``names``), each tensor's axis groups (``maps``), its reductions split
    into the view's (``red_nodes``) and those over the rows (``cross_nodes``,
    :mod:`stitchtune.plan.cross`), and the ``view``. A surrogate's view also has its iteration
    ``domain`` and, outside a mixed region, each tensor's per-dim axis of it (``aligned``)."""

    graph: Graph
    names: tuple[str, ...]
    maps: dict[str, Groups]
    red_nodes: tuple[Node, ...]
    cross_nodes: tuple[Node, ...]
    view: View
    domain: tuple[int, ...] = ()
    aligned: dict[str, tuple[int | None, ...]] = field(default_factory=dict)


def view_stage(graph: Graph, sur: Surrogate | None, domain_tensor: str | None) -> Viewed | Refusal:
    """``graph``'s view: :func:`plain_view` (in the layout of ``domain_tensor``, None: the default
    one) without a surrogate, else :func:`mixed_view` or :func:`surrogate_view`."""
    if sur is None:
        return plain_view(graph, domain_tensor)
    return mixed_view(sur) if sur.mixed else surrogate_view(sur)


def _names(graph: Graph) -> tuple[str, ...]:
    return tuple([n for n, _ in graph.inputs] + [nd.id for nd in graph.nodes])


def _reductions(graph: Graph) -> list[Node]:
    return [nd for nd in graph.nodes if OPS[nd.op].kind == "reduce"]


def plain_view(graph: Graph, domain_tensor: str | None) -> Viewed | Refusal:
    """The view of a graph without index ops over :func:`tensor_axes` in ``domain_tensor``'s layout."""
    axes = tensor_axes(graph, domain_tensor)
    if isinstance(axes, Refusal):
        return axes
    all_red = _reductions(graph)
    split = _split_cross(all_red, axes)
    if isinstance(split, Refusal):
        return split
    red_axes = reduced_axes(split[0], axes.of)
    if isinstance(red_axes, Refusal):
        return red_axes
    view = make_view(axes.order, axes.size_of, bool(all_red), red_axes)
    return Viewed(graph, _names(graph), axes.of, tuple(split[0]), tuple(split[1]), view)


def surrogate_view(sur: Surrogate) -> Viewed | Refusal:
    """The view of a surrogate (not mixed) over the right-aligned domain of its largest tensor, with
    the checks of its index ops (:func:`~stitchtune.plan.col_remap.check_col_index_ops` in a column
    family, else :func:`~stitchtune.plan.view_checks.check_gathers`)."""
    graph, real = sur.graph, sur.real
    names = _names(graph)
    all_red = _reductions(graph)
    domain = max((graph.spec(n).shape for n in names), key=lambda s: (prod(s), len(s)))
    aligned = aligned_axes(graph, domain)
    if isinstance(aligned, Refusal):
        return aligned
    maps: dict[str, Groups] = {n: tuple((a,) if a is not None else () for a in m) for n, m in aligned.items()}
    order = tuple(a for a in range(len(domain)) if domain[a] > 1)
    split = split_cross(all_red, maps, domain)
    if isinstance(split, Refusal):
        return split
    red_axes = reduced_axes(split[0], maps)
    if isinstance(red_axes, Refusal):
        return red_axes
    view = make_view(order, dict(enumerate(domain)), bool(all_red), red_axes)
    if view.family == Family.COL:   # slice / concat along the columns only (plan.col_remap)
        refused = check_col_index_ops(real, domain, view.row_axes, view.col_axes, maps)
    else:
        refused = check_gathers(real, domain, view.col_axes, view.family)
    if refused is not None:
        return refused
    return Viewed(graph, names, maps, tuple(split[0]), tuple(split[1]), view, tuple(domain), aligned)


def mixed_view(sur: Surrogate) -> Viewed | Refusal:
    """The view of a mixed region (slice / concat with transpose / reshape): :func:`tensor_axes` of
    the surrogate, checked by :func:`~stitchtune.plan.view_checks.check_mixed` (the view's columns are the
    domain's innermost axis)."""
    real, sur_graph = sur.real, sur.graph
    names = _names(sur_graph)
    all_red = _reductions(sur_graph)
    domain = sur.domain
    axes = tensor_axes(sur_graph)
    if isinstance(axes, Refusal):
        return axes
    maps = axes.of
    split = _split_cross(all_red, axes)
    if isinstance(split, Refusal):
        return split
    red_nodes, cross_nodes = split
    red_axes = reduced_axes(red_nodes, maps)
    if isinstance(red_axes, Refusal):
        return red_axes
    view = make_view(axes.order, axes.size_of, bool(all_red), red_axes)
    keep = sur.keep
    dom_t = next((n for n in names if n not in keep and tuple(sur_graph.spec(n).shape) == tuple(domain)), None)
    if dom_t is None:   # the domain-sized tensors all keep their own layout (a reduction of a reshaped input)
        culprit = next((f"reduction '{nd.id}' reads" for nd in all_red), "the region has")
        return Refusal(
            f"{culprit} a tensor of the iteration domain {list(domain)} that a transpose / reshape makes, in a "
            f"region with slice or concat (graph '{real.name}'); such regions iterate a domain-shaped tensor "
            "computed after the layout ops")
    out_cols = maps[dom_t][-1]
    chained = sur.chained
    if (view.family == Family.ELEMENTWISE and set(view.col_axes) < set(out_cols)
            and not all(n in chained for n in real.input_names)):
        # the innermost domain dim spans several axes (rotary angles ``cat(freqs, freqs)`` made by an
        # expand): all of them are the columns, so that a column shift moves along the whole dim
        view = View(view.family, view.sizes, tuple(a for a in axes.order if a not in out_cols), tuple(out_cols))
    refused = check_mixed(real, sur_graph, domain, out_cols, view.col_axes, view.family)
    if refused is not None:
        return refused
    return Viewed(sur_graph, names, maps, tuple(red_nodes), tuple(cross_nodes), view, tuple(domain))


def _split_cross(all_red: list[Node], axes: TensorAxes) -> tuple[list[Node], list[Node]] | Refusal:
    """:func:`~stitchtune.plan.cross.split_cross` over the axes of :func:`tensor_axes` (each tensor
    dim as the positions in the domain order of the axes it spans: several for a merged dim, the
    ``[B*H*W, C]`` gradient of a channels-last layer norm's backward viewed as ``[B, H, W, C]``)."""
    pos = {a: i for i, a in enumerate(axes.order)}
    spans = {n: tuple(tuple(pos[a] for a in g) for g in gs) for n, gs in axes.groups}
    sizes = axes.size_of
    return split_cross(all_red, spans, tuple(sizes[a] for a in axes.order))


def reduced_axes(red_nodes: list[Node], maps: dict[str, Groups]) -> set[int] | Refusal:
    """The domain axes every reduction reduces (the same for all of them, never mixed with kept ones)."""
    red_axes: set[int] | None = None
    for nd in red_nodes:
        src = maps[str(nd.args[0])]
        axes = {a for i in nd.axes for a in src[i]}
        kept = {a for i, g in enumerate(src) if i not in nd.axes for a in g}
        if red_axes is None:
            red_axes = axes
        elif axes and axes != red_axes:
            return Refusal(
                f"reduction '{nd.id}' reduces other axes than the first reduction; stitched kernels "
                "need every reduction over the same axes")
        if kept & (red_axes or set()):
            return Refusal(f"reduction '{nd.id}' mixes reduced and kept axes")
    return red_axes or set()


def make_view(order: tuple[int, ...], sizes: dict[int, int], has_reductions: bool, red_axes: set[int]) -> View:
    """The family and the row / column axes of the domain axes ``order`` (row-major). Reducing the
    innermost axis: family ``row``, the reduced axes are the columns (contiguous when they are the
    trailing axes; strided otherwise), the kept ones the rows. Keeping it: family ``col``, the reduced
    axes are the rows and the kept ones the columns, so that the lanes of a warp run along the
    contiguous innermost axis (leading reductions; a middle-axis reduction of ``[B, T, C]`` over ``T``
    has rows ``T`` and columns ``B*C``). Without a reduced axis: rows of the innermost axis."""
    red = [a for a in order if a in red_axes]
    if not has_reductions or not red or not order:
        family = Family.ROW if has_reductions else Family.ELEMENTWISE
        return View(family, sizes, tuple(order[:-1]), tuple(order[-1:]))
    kept = tuple(a for a in order if a not in red_axes)
    if order[-1] in red_axes:
        return View(Family.ROW, sizes, kept, tuple(red))
    return View(Family.COL, sizes, tuple(red), kept)


def aligned_axes(graph: Graph, domain: tuple[int, ...]) -> dict[str, tuple[int | None, ...]] | Refusal:
    """For each tensor of a *surrogate* graph (:mod:`stitchtune.plan.remap`): which axis of the
    right-aligned ``domain`` each of its dims indexes (None for a size-1 dim). Graphs without index
    ops use :func:`~stitchtune.plan.axes.tensor_axes` instead."""
    D = len(domain)

    def aligned(name: str, shape: tuple[int, ...], what: str) -> tuple[int | None, ...] | Refusal:
        if len(shape) > D:
            return Refusal(f"{what} '{name}' has a higher rank than the largest tensor")
        m: list[int | None] = []
        for k, s in enumerate(shape):
            dax = D - len(shape) + k
            if s == 1:
                m.append(None)
            elif s == domain[dax]:
                m.append(dax)
            else:
                return Refusal(
                    f"{what} '{name}' shape {list(shape)} does not align with the iteration domain {list(domain)}")
        return tuple(m)

    maps: dict[str, tuple[int | None, ...]] = {}
    for name, spec in graph.inputs:
        got = aligned(name, spec.shape, "input")
        if isinstance(got, Refusal):
            return got
        maps[name] = got
    for node in graph.nodes:
        info = OPS[node.op]
        targs = [a for a in node.args if isinstance(a, str)]
        if info.kind == "iota":   # no argument: its dims index the domain's axes as an input's do
            got = aligned(node.id, tuple(node.shape), "iota")
            if isinstance(got, Refusal):
                return got
            maps[node.id] = got
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
                    return Refusal(
                        f"node '{node.id}' broadcasts values of different axes against each other "
                        "(a reduction without keepdims used along another axis?)")
        maps[node.id] = tuple(out)
    return maps
