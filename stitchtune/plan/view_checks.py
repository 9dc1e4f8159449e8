"""The index-op checks of a view, each a :class:`~stitchtune.plan.refusal.Refusal` value or None:
:func:`check_gathers` (a surrogate view that is not mixed: gathers whole table rows, picks, no index op
in a column reduction) and :func:`check_mixed` (a mixed region: slice / concat with transpose / reshape,
column shifts only). Called by :mod:`stitchtune.plan.views`; the remapped loads themselves are proven
by :func:`stitchtune.plan.remap.check_remaps`."""

from __future__ import annotations

from math import prod

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Graph
from stitchtune.plan.chains import chain_members, wide_inputs
from stitchtune.plan.family import Family
from stitchtune.plan.pick import check_picks
from stitchtune.plan.pieces import concat_pieces
from stitchtune.plan.refusal import Refusal

__all__ = ["check_gathers", "check_mixed"]


def check_mixed(graph: Graph, sur: Graph, domain: tuple[int, ...], out_cols: tuple[int, ...],
                col_axes: tuple[int, ...], family: str) -> Refusal | None:
    """A mixed region (slice / concat with transpose / reshape) is lowered with column shifts only
    (:func:`~stitchtune.plan.shift.column_shift`): no gather, a row-family (or element-wise) view whose columns are exactly
    the innermost dim of the domain (``out_cols``: the axes of an output's last dim; any view when
    every input is loaded through a :func:`~stitchtune.plan.chains.composed_chains` chain: GPT-2's q/k/v split), and every input
    outside :func:`~stitchtune.plan.chains.layout_part` of its surrogate shape (no sliced input larger than the domain);
    else the :class:`Refusal` naming the first node or input that breaks a rule. Called on a region whose
    chains and layout part the planner has computed (:func:`~stitchtune.plan.views.mixed_view`: their
    refusals come first), so the chain rules it reads refuse nothing here."""
    for n in graph.nodes:
        if n.op in ("gather", "gather_elements"):
            return Refusal(f"{n.op} '{n.id}' is in a region with transpose / reshape; stitched "
                           "kernels do not combine the two yet")
    if family == Family.COL:
        return Refusal(f"{_column_reductions(graph)}slice / concat with transpose / reshape are supported "
                       "in row-reduction and element-wise kernels only, not in column reductions")
    chained = chain_members(graph)
    every_chained = all(n in chained for n in graph.input_names)  # loads by chain arithmetic only
    if (tuple(out_cols) != tuple(col_axes) and not every_chained) or domain[-1] < 2:
        return Refusal(
            f"the columns of the kernel are not the innermost axis of the iteration domain {list(domain)}; "
            "slice / concat with transpose / reshape need the innermost axis as the kernel's columns")
    wide = wide_inputs(graph) | concat_pieces(graph, domain)
    for name, spec in graph.inputs:
        if tuple(spec.shape) != tuple(sur.spec(name).shape) and name not in chained and name not in wide:
            return Refusal(
                f"input '{name}' {list(spec.shape)} is sliced beyond the iteration domain {list(domain)} in a "
                "region with transpose / reshape, along an outer axis or read through a transpose / reshape; "
                "there an input may be wider than the domain along its innermost axis only")
    return None


def _column_reductions(graph: Graph) -> str:
    """The refusal's head naming a column-family graph's reductions first (``"column reduction
    'sum_13' next to "``): a region finder that declines the node a refusal names first then keeps
    the index ops (a concat of the q/k/v gradients) and leaves the column sum out, not the reverse."""
    reds = [nd.id for nd in graph.nodes if OPS[nd.op].kind == "reduce"]
    return f"column reduction {', '.join(repr(r) for r in reds)} next to " if reds else ""


def check_gathers(graph: Graph, domain: tuple[int, ...], col_axes: tuple[int, ...], family: str) -> Refusal | None:
    """A gather's table rows must be the view's columns: ``table.shape[1:]`` spans exactly the column
    axes (so element ``(r, c)`` is ``table[idx[r], c]``), in a row-family view, every ``gather_elements`` a
    pick (:func:`~stitchtune.plan.pick.check_picks`); else the :class:`Refusal` naming the first index op that does not."""
    for n in graph.nodes:
        if n.op not in ("gather", "gather_elements", "slice", "concat"):
            continue
        if family == Family.COL:
            return Refusal(f"{_column_reductions(graph)}{n.op} '{n.id}': index ops are supported in "
                           "row-reduction and element-wise kernels only, not in column reductions")
        if n.op == "gather_elements":
            refused = check_picks(graph, domain, col_axes)
            if refused is not None:
                return refused
        if n.op != "gather":
            continue
        trail = graph.spec(str(n.args[0])).shape[1:]
        cols = tuple(domain[a] for a in col_axes)
        live = tuple(d for d in cols if d > 1)
        if prod(trail) != prod(cols) or tuple(d for d in trail if d > 1) != live or (
                col_axes and col_axes[0] < len(domain) - len(trail)):
            return Refusal(
                f"gather '{n.id}': the table's rows {list(trail)} are not the contiguous axes {list(cols)} "
                "of the kernel (gather whole rows of a table whose rows are the innermost axes)")
    return None
