"""Column remaps: ``slice`` / ``concat`` along the columns of a column-reduction region.

A column-family kernel (:mod:`stitchtune.lower.col`) gives each thread ``vec`` adjacent columns of
the view and sweeps the rows; a column reduction (a bias gradient: the sum over the tokens) reduces
along them. GPT-2's training step concatenates the q, k and v gradients along the innermost axis
(the backward of c_attn's split, each gradient read through its head merge, a layout chain of the
input: :func:`~stitchtune.plan.chains.composed_chains`) and sums the result over the tokens: one
region whose concat moves elements along the view's columns only. Such a region is planned like a
row-family one with index ops (:mod:`stitchtune.plan.remap`: the surrogate graph, the bounds walk of
:func:`~stitchtune.plan.remap.check_remaps`) when :func:`check_col_index_ops` accepts it, and lowered
by :mod:`stitchtune.lower.col_remap` (the values of a remapped tensor at a column index).

Contract of :func:`check_col_index_ops` (a region that is not mixed: its layout nodes are chains of
inputs, if any): every index op is a slice or concat along the domain's innermost axis, which is the
view's innermost column axis (no gather: a gather's table rows are a row kernel's columns); and no
value that varies along the columns only (a column reduction's result, what is computed from it, a
per-column input) is evaluated at a moved column, because a thread holds those values for its own
columns only. Refused with a :class:`~stitchtune.plan.refusal.Refusal` naming the column
reductions first (a region finder then leaves the reduction out and keeps the index ops, as before).
"""

from __future__ import annotations

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Graph
from stitchtune.plan.chains import composed_chains
from stitchtune.plan.pick import node_axis
from stitchtune.plan.refusal import Refusal
from stitchtune.plan.shift import Shift

__all__ = ["check_col_index_ops"]

Groups = tuple[tuple[int, ...], ...]


def _reductions_first(graph: Graph) -> str:
    """``"column reduction 'sum_13' next to "`` (the refusal's head naming the reductions first)."""
    reds = [nd.id for nd in graph.nodes if OPS[nd.op].kind == "reduce"]
    return f"column reduction {', '.join(repr(r) for r in reds)} next to " if reds else ""


def check_col_index_ops(graph: Graph, domain: tuple[int, ...], row_axes: tuple[int, ...],
                        col_axes: tuple[int, ...], maps: dict[str, Groups]) -> Refusal | None:
    """Whether a column-family kernel can evaluate the index ops of ``graph`` (module docstring).
    ``domain``: the iteration domain (right-aligned); ``row_axes`` / ``col_axes``: the view's axes
    (the reduced and the kept domain axes); ``maps``: tensor -> the domain axes of each of its dims."""
    last = len(domain) - 1
    head = _reductions_first(graph)
    for nd in graph.nodes:
        kind = OPS[nd.op].kind
        if nd.op in ("gather", "gather_elements"):
            return Refusal(f"{head}{nd.op} '{nd.id}': index ops are supported in row-reduction and "
                                        "element-wise kernels only, not in column reductions (but slice and concat "
                                        "along the columns)")
        if kind in ("slice", "concat") and (len(domain) - len(nd.shape) + node_axis(nd) != last
                                             or col_axes[-1:] != (last,)):
            return Refusal(
                f"{head}{nd.op} '{nd.id}' along axis {nd.axis}: in a column reduction, slice and concat may act "
                "along the innermost axis (the kernel's columns) only")
    rows = set(row_axes)
    nodes = {nd.id: nd for nd in graph.nodes}
    chains = composed_chains(graph)
    seen: set[tuple[str, Shift]] = set()
    stack = [(o, Shift()) for o in graph.outputs] + [(str(nd.args[0]), Shift()) for nd in graph.reductions()]
    while stack:
        name, sh = stack.pop()
        if (name, sh) in seen:
            continue
        seen.add((name, sh))
        varies = {a for g in maps[name] for a in g}
        if not sh.identity and varies and not varies & rows:
            return Refusal(
                f"{head}{'node' if name in nodes else 'input'} '{name}' varies along the columns only (one value "
                "per column) and is read at a moved column through a slice / concat; a column-reduction kernel "
                "holds such values for its own columns only")
        node = nodes.get(name)
        if node is None or name in chains:
            continue
        kind = OPS[node.op].kind
        if kind == "reduce":   # its source is walked from the reduction itself (no shift)
            continue
        if kind == "slice":
            stack.append((str(node.args[0]), sh.moved(last, node.start)))
        elif kind == "concat":
            o = 0
            for arg in node.tensor_args:
                ln = graph.spec(arg).shape[node_axis(node)]
                psh = sh.limited(last, o - sh.d(last), o + ln - sh.d(last), domain[last])
                if psh is not None:
                    stack.append((arg, psh.moved(last, -o)))
                o += ln
        else:
            stack.extend((a, sh) for a in node.tensor_args)
    return None
