"""Picks: ``gather_elements`` planned as one element per row along the kernel's column axis (cross
entropy's target logit), the subtree a pick evaluates at its row's index, and the rules on its index.

Used by :mod:`stitchtune.plan.remap` (the surrogate graph and the remap checks), the planner
(:func:`check_pick_indices`) and :mod:`stitchtune.lower.gather` (:func:`pick_leaves`)."""

from __future__ import annotations

from stitchtune.errors import UnsupportedGraphError
from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Graph, Node
from stitchtune.plan.refusal import Refusal

__all__ = ["node_axis", "pick_leaves", "pick_walk", "pick_refusal", "check_picks", "check_pick_indices"]


def node_axis(nd: Node) -> int:
    """The axis of a slice / concat / gather / gather_elements node (set, normalised, by the graph's
    validation)."""
    assert nd.axis is not None, f"{nd.op} '{nd.id}' has no axis"
    return nd.axis


_PICK_ONLY = ("gather_elements '{0}': stitched kernels pick one element per row along the kernel's column axis "
              "(an index of size 1 along axis {1} and of the source's size elsewhere, that axis the one reduced by "
              "the region's row reductions); other gathers along an axis are not supported yet")


def pick_leaves(graph: Graph, nd: Node, domain: tuple[int, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(constant, loaded)`` tensors of the subtree a pick ``gather_elements`` node ``nd`` evaluates at
    its row's index: ``constant`` are those constant along the gather axis (size 1 there: per-row
    values such as a row max or log-sum-exp, where the walk stops), ``loaded`` the inputs that vary
    along it (loaded at the picked position). For callers after planning (the surrogate graph,
    :mod:`stitchtune.lower.gather`), where :func:`check_picks` has accepted the node:
    :class:`UnsupportedGraphError` naming the node for a subtree :func:`pick_refusal` refuses."""
    leaves = pick_walk(graph, nd, domain)
    if isinstance(leaves, Refusal):
        raise leaves.error()
    return leaves


def pick_refusal(graph: Graph, nd: Node, domain: tuple[int, ...]) -> Refusal | None:
    """The :class:`~stitchtune.plan.refusal.Refusal` naming pick ``nd`` where :func:`pick_leaves`
    cannot walk its subtree (an index not of a pick's shape, a gather axis that is not the innermost
    live axis of ``domain``, a subtree node that is not element-wise); None where it can."""
    leaves = pick_walk(graph, nd, domain)
    return leaves if isinstance(leaves, Refusal) else None


def pick_walk(graph: Graph, nd: Node, domain: tuple[int, ...]) -> tuple[tuple[str, ...], tuple[str, ...]] | Refusal:
    """:func:`pick_leaves` as a value for the planner (:func:`~stitchtune.plan.remap.surrogate`), or the
    :class:`~stitchtune.plan.refusal.Refusal` of :func:`pick_refusal`."""
    x, idx = (graph.spec(str(t)) for t in nd.args)
    if idx.shape[node_axis(nd)] != 1 or any(i != d for k, (i, d) in enumerate(zip(idx.shape, x.shape)) if k != node_axis(nd)):
        return Refusal(_PICK_ONLY.format(nd.id, node_axis(nd)))
    nodes = {n.id: n for n in graph.nodes}
    a = len(domain) - len(nd.shape) + node_axis(nd)
    if a != max((k for k, d in enumerate(domain) if d > 1), default=a):  # not the innermost live axis
        return Refusal(_PICK_ONLY.format(nd.id, node_axis(nd)))
    const: list[str] = []
    loaded: list[str] = []
    stack, seen = [str(nd.args[0])], set()
    while stack:
        cur = stack.pop()
        if cur in seen:
            continue
        seen.add(cur)
        shape = graph.spec(cur).shape
        k = a - (len(domain) - len(shape))
        if k < 0 or shape[k] == 1:
            const.append(cur)
            continue
        m = nodes.get(cur)
        if m is None:
            loaded.append(cur)
            continue
        if OPS[m.op].kind not in ("unary", "binary", "ternary", "cast"):
            return Refusal(
                f"gather_elements '{nd.id}' picks from '{cur}' ({m.op}); stitched kernels pick from element-wise "
                "expressions of inputs and per-row values only")
        stack.extend(m.tensor_args)
    return tuple(sorted(const)), tuple(sorted(loaded))


def check_picks(graph: Graph, domain: tuple[int, ...], col_axes: tuple[int, ...]) -> Refusal | None:
    """Every ``gather_elements`` is a *pick*: one element per row along the kernel's column axis
    (``idx`` of size 1 along the gather axis and of the source's dims elsewhere, the gather axis the
    view's only column axis: cross entropy's target logit), whose source is an element-wise expression
    (:func:`pick_refusal`); else the :class:`~stitchtune.plan.refusal.Refusal` naming the first node
    that is not; None when every one is."""
    for n in graph.nodes:
        if n.op != "gather_elements":
            continue
        refused = pick_refusal(graph, n, domain)
        if refused is not None:
            return refused
        live = tuple(c for c in col_axes if domain[c] > 1)
        if live != (len(domain) - len(n.shape) + node_axis(n),):
            return Refusal(_PICK_ONLY.format(n.id, node_axis(n)))
    return None


def check_pick_indices(graph: Graph, ints: frozenset[str]) -> Refusal | None:
    """A pick's index is a graph input or a per-row value the region computes in int registers (``ints``,
    :func:`~stitchtune.plan.ints.int_registers`: cross entropy's ``where(t != ignore, t, 0)``), which the
    kernel range-checks as it checks a loaded index; a computed index that is not an int register (a
    reshape of an int input only) is refused naming the node (the :class:`~stitchtune.plan.refusal.Refusal`)."""
    inputs = set(graph.input_names)
    for n in graph.nodes:
        idx = str(n.args[1]) if n.op == "gather_elements" else ""
        if idx and idx not in inputs and idx not in ints:
            return Refusal(
                f"gather_elements '{n.id}' reads index '{idx}', which the region computes without int arithmetic "
                "(a view of an int input); index with the input itself")
    return None
