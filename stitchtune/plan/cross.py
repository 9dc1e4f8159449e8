"""Cross reductions: reductions over the axis a row-family kernel's tasks walk (AStitch's global stitching).

In a row-family plan the tasks walk the rows of the ``[M, N]`` view. A reduction whose reduced axes
include every (live) row axis cannot finish inside one task: each block accumulates its tasks'
contributions (per thread in registers, then across the block's rows through shared memory), and the
blocks' partials are combined across the grid by the schedule's ``cross_combine`` choice (float
atomics, partials + grid barrier, or partials + a small second kernel; see
:mod:`stitchtune.lower.cross`). Two kinds:

* ``per_reduced``: the reduced axes are exactly the row axes of a full-size source (a column sum:
  ``dgamma = sum over rows of dy * xhat``, ``dbeta = sum(dy)``); one value per column (class
  ``PER_REDUCED``).
* ``scalar``: everything is reduced (a loss: ``mean((pred - target) ** 2)``), or the rows of a
  per-row source (the mean over rows of a per-row cross entropy); one value (class ``SCALAR``).

A cross reduction is a ``reduce_sum``, ``reduce_mean``, ``reduce_max`` or ``reduce_min`` (its
``combine`` op: ``+``, ``max``, ``min``). Its result is complete only after every block has finished,
so it may be read only by the *scalar epilogue* (:func:`epilogue_nodes`): element-wise nodes whose
arguments are scalar cross reductions, other epilogue nodes, constants and one-element inputs or
nodes of those only (:func:`scalar_inputs`: ``loss = sum(l) * -1/N``, a sum divided by a count that
is itself a cross reduction, or by a ``[1]`` input such as transformers' ``num_items_in_batch``),
computed once after the cross-block combine by the thread that holds the final values (it loads the
one-element inputs itself); a cross reduction read only there need not be an output.

Contract: :func:`split_cross` separates the graph's reductions into the row (or column) reductions the
planner handled before and the cross reductions, *before* the view is chosen; for a graph whose
reductions all reduce the same axes it returns them unchanged and no cross reduction, so plans of
such graphs are exactly what they were. :func:`check_cross` then checks each cross reduction against
the view's classes and returns the :class:`CrossReduction` values of the plan, or raises
:class:`UnsupportedGraphError` naming the node and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any, Mapping

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Graph, Node
from stitchtune.plan.family import Family
from stitchtune.plan.refusal import Refusal

#: ops a cross reduction may be (ordered combines exist for these; float atomics for the sums only)
CROSS_OPS = ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min")


@dataclass(frozen=True)
class CrossReduction:
    """One reduction over the rows of a row-family plan.

    ``node``: its node id (a graph output, read by no other node); ``source``: the tensor it reduces;
    ``kind``: ``per_reduced`` (one value per column) or ``scalar``; ``source_full``: whether the source
    is full-size (accumulated in the output sweep) or per-row (accumulated once per row);
    ``mean``: a mean (the sum is scaled by ``1 / count``); ``count``: elements reduced per result;
    ``combine``: the op table's ``combine_op`` (``+`` for sums and means, ``max``, ``min``);
    ``output``: whether the result is a graph output (else only the epilogue reads it).
    """

    node: str
    source: str
    kind: str
    source_full: bool
    mean: bool
    count: int
    combine: str = "+"
    output: bool = True


def _live_reduced(nd: Node, maps: Mapping[str, tuple[tuple[int, ...], ...]], live: set[int]) -> frozenset[int]:
    src = maps[str(nd.args[0])]
    return frozenset(a for i in nd.axes for a in src[i] if a in live)


def _keeps_a_dim(nd: Node, maps: Mapping[str, tuple[tuple[int, ...], ...]]) -> bool:
    """Whether reduction ``nd`` keeps a dim of its source: a row reduction, even where every dim it keeps
    has extent 1 (a layer norm of ``x [1, 1024]`` over ``axes=[-1]``: one row), never a reduction of
    everything (a loss), though both reduce every live axis there."""
    rank = len(maps[str(nd.args[0])])
    return bool(set(range(rank)) - {i % rank for i in nd.axes}) if rank else False


def split_cross(red_nodes: list[Node], maps: Mapping[str, tuple[tuple[int, ...], ...]],
                domain: tuple[int, ...]) -> tuple[list[Node], list[Node]] | Refusal:
    """``(row_or_col_reductions, cross_reductions)`` of ``red_nodes``; ``maps[name]``: for each dim of
    tensor ``name``, the positions in ``domain`` of the axes it spans (``()`` for a size-1 dim; a dim
    merged from several axes, a ``[B*H*W, C]`` gradient viewed as ``[B, H, W, C]``, spans several).

    A reduction over every live axis is a cross (scalar) reduction, unless it keeps a dim of its source
    (of extent 1, where it reduces every live axis: batch 1, one position) or the domain has one live
    axis only (a loss of ``[1, N]``): that is a row reduction of one row (``M = 1``), planned as any
    other extent and split over blocks where the row is long. Of the others, when they reduce
    two different axis sets, one the trailing live axes (row reductions) and the other exactly the
    live axes before them, the second set is cross (per-column or per-row-to-scalar). When they all
    reduce one set, nothing else changes: the planner's family rules apply as before (and a full
    reduction next to a column-family reduction is refused). Other mixes are left for the planner's
    own message (it names the first reduction over other axes).
    """
    live = {a for a in range(len(domain)) if domain[a] > 1}
    live_sorted = sorted(live)
    full = [nd for nd in red_nodes if _live_reduced(nd, maps, live) == frozenset(live)
            and len(live) > 1 and not _keeps_a_dim(nd, maps)]
    rest = [nd for nd in red_nodes if nd not in full]
    groups = list(dict.fromkeys(_live_reduced(nd, maps, live) for nd in rest))
    if not full and len(groups) <= 1:
        return red_nodes, []
    if len(groups) == 2:
        a, b = groups
        def suffix(g: frozenset[int]) -> bool:
            return sorted(g) == live_sorted[len(live_sorted) - len(g):]
        row, col = (a, b) if suffix(a) else (b, a)
        if not (suffix(row) and set(col) == live - set(row)):
            return red_nodes, []  # the planner names the reduction over other axes
        return ([nd for nd in rest if _live_reduced(nd, maps, live) == row],
                [nd for nd in red_nodes if nd in full or _live_reduced(nd, maps, live) == col])
    if len(groups) > 2:
        return red_nodes, []
    if groups and not sorted(groups[0]) == live_sorted[len(live_sorted) - len(groups[0]):]:
        nd = full[0]
        return Refusal(
            f"reduction '{nd.id}' reduces every axis in a column-reduction graph; cross reductions "
            "are supported in row-reduction graphs only")
    return rest, full


def epilogue_nodes(graph: Graph, cross_nodes: list[Node]) -> tuple[str, ...]:
    """The scalar epilogue of ``cross_nodes`` (graph order): every element-wise node (unary, binary,
    ternary, cast) of one element whose tensor arguments are all cross reductions, epilogue nodes or
    :func:`scalar_inputs` values, with at least one cross reduction or epilogue node (module docstring).
    Empty without cross reductions."""
    done = {nd.id for nd in cross_nodes}
    pre = set(scalar_inputs(graph))
    out: list[str] = []
    for nd in graph.nodes:
        targs = nd.tensor_args
        if (targs and all(a in done or a in pre for a in targs) and any(a in done for a in targs)
                and OPS[nd.op].kind in _ELEMENTWISE and prod(nd.shape) == 1):
            done.add(nd.id)
            out.append(nd.id)
    return tuple(out)


_ELEMENTWISE = ("unary", "binary", "ternary", "cast")


def scalar_inputs(graph: Graph) -> tuple[str, ...]:
    """The one-element graph inputs (a 0-d count or divisor of PyTorch's) and the element-wise nodes of
    one element that read only those (its cast to float), graph order: values the scalar epilogue
    loads or computes again itself (``loss = sum / num_items``)."""
    out = [n for n in graph.input_names if prod(graph.spec(n).shape) == 1]
    for nd in graph.nodes:
        targs = nd.tensor_args
        if targs and all(a in out for a in targs) and OPS[nd.op].kind in _ELEMENTWISE and prod(nd.shape) == 1:
            out.append(nd.id)
    return tuple(out)


def check_cross(graph: Graph, cross_nodes: list[Node], family: str, classes: Mapping[str, Any],
                mapped: Mapping[str, bool]) -> tuple[CrossReduction, ...] | Refusal:
    """The :class:`CrossReduction` of each node of ``cross_nodes`` (graph order), after the view's
    ``classes`` (tensor -> TensorClass) are known; ``mapped[name]``: the tensor broadcasts along part
    of the row axes. A :class:`~stitchtune.plan.refusal.Refusal` naming the node and why where one has no lowering."""
    if not cross_nodes:
        return ()
    epi = set(epilogue_nodes(graph, cross_nodes))
    readers = {a for nd in graph.nodes if nd.id not in epi for a in nd.args if isinstance(a, str)}
    epi_readers = {a for nd in graph.nodes if nd.id in epi for a in nd.args if isinstance(a, str)}
    out = []
    for nd in cross_nodes:
        src = str(nd.args[0])
        why = _refusal(graph, nd, src, family, classes, mapped, readers)
        kind = "per_reduced" if classes[nd.id].value == "K" else "scalar"
        if not why and kind != "scalar" and nd.id in epi_readers:
            why = "is read by another node; only scalar results may be read after the combine (the scalar epilogue)"
        if not why and nd.id not in graph.outputs and nd.id not in epi_readers:
            why = "is not a graph output"
        if why:
            return Refusal(f"reduction '{nd.id}' over the rows {why}")
        count = prod(graph.spec(src).shape[i] for i in nd.axes)
        comb = OPS[nd.op].combine_op
        assert comb is not None, f"{nd.op} is a reduction"
        out.append(CrossReduction(nd.id, src, kind, classes[src].value == "F", nd.op == "reduce_mean", count,
                                  comb, nd.id in graph.outputs))
    return tuple(out)


def _refusal(graph: Graph, nd: Node, src: str, family: str, classes: Mapping[str, Any],
             mapped: Mapping[str, bool], readers: set[str]) -> str:
    """Why cross reduction ``nd`` has no stitched lowering ('' when it has one)."""
    if family != Family.ROW:
        return "is supported in row-reduction graphs only"
    if nd.op not in CROSS_OPS:
        return f"is a {nd.op}; cross-block combines support reduce_sum, reduce_mean, reduce_max and reduce_min"
    if nd.id in readers:
        return ("is read by another node; its result is only complete after every block has finished (only "
                "element-wise scalar nodes of cross reductions and constants may read it: the scalar epilogue)")
    c_src, c_out = classes[src].value, classes[nd.id].value
    if c_src not in ("F", "P"):
        return f"reduces tensor '{src}', which varies along neither the rows nor the whole view"
    if mapped.get(src, False):
        return f"reduces tensor '{src}', which broadcasts along part of the row axes"
    if c_out not in ("K", "S") or (c_src == "P" and c_out != "S"):
        return "reduces part of the row axes; it must reduce every row axis (and optionally every column)"
    return ""
