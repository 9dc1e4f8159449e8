"""The planner's check stage: each check returns a :class:`~stitchtune.plan.refusal.Refusal` (or None,
or the value it builds) instead of raising.

Run by :mod:`stitchtune.plan.planner` in this order, the first refusal standing: the int-register
rules (:func:`int_refusal` before the view, :func:`int_family_refusal` after it), the tensor classes
(:func:`classify`) and the reductions (:func:`check_reductions`, :func:`check_reduction_sources`), a
surrogate's remapped reads (:func:`remap_refusal`), every tensor's index map (:func:`index_maps`) and
a surrogate's own maps (:func:`surrogate_maps`).
"""

from __future__ import annotations

from stitchtune.graph.parse import Graph, Node
from stitchtune.plan import chains, pick, pieces, remap
from stitchtune.plan.axes import Groups
from stitchtune.plan.classes import TensorClass
from stitchtune.plan.family import Family
from stitchtune.plan.index_map import IndexMap, index_map
from stitchtune.plan.refusal import Refusal
from stitchtune.plan.views import Surrogate, View, Viewed

__all__ = ["int_refusal", "int_family_refusal", "classify", "check_reductions", "check_reduction_sources",
           "remap_refusal", "index_maps", "surrogate_maps"]


def int_refusal(graph: Graph, ints: frozenset[str]) -> Refusal | None:
    """An index op that reads, makes or is made from int values (:func:`~stitchtune.plan.remap.int_index_op`,
    named so that an importer can leave it out and keep the rest), or a pick index the rules of
    :func:`~stitchtune.plan.pick.check_pick_indices` refuse; None when neither."""
    index_op = remap.int_index_op(graph, ints)
    if isinstance(index_op, Refusal):
        return index_op
    if index_op is not None:
        return Refusal(
            f"{index_op.op} '{index_op.id}' is in a region that computes with int values (graph '{graph.name}'); "
            "stitched kernels evaluate slice, concat and gather in float registers: int values may sit beside "
            "them, but not be read through them, be their result or be computed from it")
    return pick.check_pick_indices(graph, ints)


def int_family_refusal(graph: Graph, ints: frozenset[str], view: View) -> Refusal | None:
    """Int values in a column-reduction view (int arithmetic is lowered in element-wise and row kernels)."""
    if ints and view.family == Family.COL:
        return Refusal(
            f"graph '{graph.name}' computes with int values in a column-reduction region; stitched kernels lower "
            "int arithmetic in element-wise and row-reduction regions only")
    return None


def classify(names: tuple[str, ...], view: View, maps: dict[str, Groups], one_row: bool = False) -> dict[str, TensorClass]:
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


def check_reductions(red_nodes: tuple[Node, ...], classes: dict[str, TensorClass]) -> dict[str, TensorClass] | Refusal:
    """Every reduction reduces a full-size tensor to one value per row/column: ``classes`` with a
    scalar result (the full reduction of a single row/column) made ``PER_KEPT``, or the refusal."""
    out = dict(classes)
    for nd in red_nodes:
        if out[str(nd.args[0])] is not TensorClass.FULL:
            return Refusal(f"reduction '{nd.id}' reduces a tensor that is not full-size")
        if out[nd.id] not in (TensorClass.PER_KEPT, TensorClass.SCALAR):
            return Refusal(f"reduction '{nd.id}' leaves a full-size result")
        if out[nd.id] is TensorClass.SCALAR:
            out[nd.id] = TensorClass.PER_KEPT
    return out


def check_reduction_sources(red_nodes: tuple[Node, ...], view: View, maps: dict[str, Groups]) -> Refusal | None:
    """A kernel reduces over every reduced axis of the view: a reduction's source must vary along
    all of them (a source broadcast along one would be summed once per repeat)."""
    red_side = set(view.col_axes if view.family == Family.ROW else view.row_axes)
    for nd in red_nodes:
        varies = {a for g in maps[str(nd.args[0])] for a in g}
        if not red_side <= varies:
            return Refusal(f"reduction '{nd.id}' reduces a tensor that broadcasts along part of the reduced axes")
    return None


def remap_refusal(sur: Surrogate | None, viewed: Viewed, classes: dict[str, TensorClass]) -> Refusal | None:
    """A surrogate's remapped reads (:func:`~stitchtune.plan.remap.check_remaps`: over the rows of the
    view, or every axis but the innermost in a mixed region); None without a surrogate."""
    if sur is None:
        return None
    view = viewed.view
    rows = tuple(range(len(viewed.domain) - 1)) if sur.mixed else view.row_axes
    cols = {n: c.varies_along_cols(view.family) for n, c in classes.items()}
    return remap.check_remaps(sur.real, viewed.domain, rows, cols, sur.mixed)


def index_maps(viewed: Viewed) -> dict[str, IndexMap] | Refusal:
    """Every tensor's :class:`IndexMap` over the view; an output must be stored through a bijective
    map (one view element per element of it, or one row / column: a plain map, or a permuted one) or
    be a full tensor broadcast along part of the row axes only (:attr:`IndexMap.store_once`: stored
    by the rows at coordinate 0 of those axes); any other partially broadcast output is refused."""
    graph, view = viewed.graph, viewed.view
    out = {n: index_map(graph.spec(n).shape, m, view.sizes, view.row_axes, view.col_axes)
           for n, m in viewed.maps.items()}
    for o in graph.outputs:
        if not (out[o].bijective or out[o].store_once):
            return Refusal(
                f"output '{o}' {list(graph.spec(o).shape)} broadcasts along part of the axes of the iteration "
                f"domain {view.shape} (of the columns, or of the rows of a per-row value); stitched kernels store "
                "full, per-row, per-column and scalar outputs, and full ones broadcast along row axes only")
    return out


def surrogate_maps(sur: Surrogate | None, viewed: Viewed, imaps: dict[str, IndexMap]) -> dict[str, IndexMap] | Refusal:
    """``imaps`` with a surrogate's own maps: outside a mixed region (checked by :func:`_index_op_map_refusal`)
    the inputs addressed with their own strides (:func:`~stitchtune.plan.remap.real_index_maps`); in a
    mixed one the inputs wider than the domain along its innermost axis (their own row strides; a
    shifted load maps view element ``(r, c + d)``, :mod:`stitchtune.lower.remap`) and the concat pieces
    (:func:`~stitchtune.plan.pieces.concat_pieces`: a decode step's cache, its own strides)."""
    if sur is None:
        return imaps
    view, out = viewed.view, dict(imaps)
    if sur.mixed:
        # (wide_inputs reads the region facts Surrogate.of computed: it refuses nothing here)
        own = chains.wide_inputs(sur.real) | pieces.concat_pieces(sur.real, tuple(viewed.domain))   # (a cache piece: its own strides)
        out.update({n: index_map(sur.real.spec(n).shape, viewed.maps[n], view.sizes, view.row_axes, view.col_axes)
                    for n in own})
        return out
    refused = _index_op_map_refusal(imaps, view.family)
    if refused is not None:
        return refused
    # (real_index_maps reads the gather tables and chains the surrogate was made with: it refuses nothing)
    out.update(remap.real_index_maps(sur.real, sur.graph, viewed.aligned, viewed.domain, view.row_axes, view.col_axes))
    return out


def _index_op_map_refusal(imaps: dict[str, IndexMap], family: Family) -> Refusal | None:
    """The remapped lowering (slice, concat, gather) addresses operands that broadcast along part of
    the row axes of row-family kernels only (as before general index maps)."""
    for name, im in imaps.items():
        if im.partial_cols or (family == Family.COL and not im.plain):
            return Refusal(
                f"tensor '{name}' varies along only part of an axis group in a region with slice, concat "
                "or gather; index maps there support broadcasting along the row axes of row kernels only")
    return None
