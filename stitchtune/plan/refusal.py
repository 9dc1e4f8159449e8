"""The planner's answer "no": a :class:`Refusal` value, and the one seam where a raising rule becomes one.

The planner's stages (:mod:`stitchtune.plan.planner`: rewrites -> layouts -> views -> checks) pass
refusals along as values: a stage returns its result or a :class:`Refusal`, the pipeline tries the next
layout or rewrite on a refusal, and only the public edge (:func:`~stitchtune.plan.planner.make_plan`)
raises, with :meth:`Refusal.error`: the same :class:`~stitchtune.errors.UnsupportedGraphError` (or
:class:`~stitchtune.errors.SeparateRegionsError` where the refusal names nodes to keep apart) with the
same message as the rule that refused. A region finder asks
:func:`~stitchtune.plan.planner.plan_graph` and reads the value, catching nothing.

The checks of :mod:`~stitchtune.plan.checks`, :mod:`~stitchtune.plan.views`, :func:`~stitchtune.plan.axes.tensor_axes`, :mod:`~stitchtune.plan.cross`
(``split_cross``, ``check_cross``), :mod:`~stitchtune.plan.scatter` (``split_scatters``),
:mod:`~stitchtune.plan.col_remap`, :mod:`~stitchtune.plan.pick` (``check_picks``, ``pick_refusal``,
``check_pick_indices``) and :mod:`~stitchtune.plan.view_checks` (``check_gathers``, ``check_mixed``),
:func:`~stitchtune.plan.remap.check_remaps` and the bounds proofs of :mod:`~stitchtune.plan.shift`
(``offset_of``, ``column_offset``, ``size1_slice_refusal``) return refusals. Still raising, deep in their
walks: :func:`~stitchtune.plan.remap.surrogate` (with ``index_ops.surrogate_shape`` and ``pick.pick_leaves``,
which also serve the lowering), the layout rules of :mod:`~stitchtune.plan.chains` and
:func:`~stitchtune.plan.remap.int_index_op`: :func:`ask` is where the pipeline calls them (``Surrogate.of``
asks the surrogate and the chain facts once; the later stages read those facts) and turns such an exception into a value
(only :class:`~stitchtune.errors.UnsupportedGraphError`: any other exception is a bug and passes);
:func:`rewritten` is where a rewrite whose graph the format refuses (over its limits) becomes one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from stitchtune.errors import GraphError, SeparateRegionsError, UnsupportedGraphError
from stitchtune.graph.parse import Graph

__all__ = ["Refusal", "ask", "rewritten"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


@dataclass(frozen=True)
class Refusal:
    """Why a graph (or a region of one) has no stitched lowering: ``reason`` (one line, naming the
    tensor or node), and the graph nodes that must be in separate regions (``apart``, the first to cut
    off from the others; empty when the refusal names none)."""

    reason: str
    apart: tuple[str, ...] = ()
    edges: tuple[tuple[str, str], ...] = ()   # (reader, source) reads to cut all together (SeparateRegionsError)

    def error(self) -> UnsupportedGraphError:
        """The exception the public edge raises for this refusal: a
        :class:`~stitchtune.errors.SeparateRegionsError` when ``apart`` names nodes, else an
        :class:`~stitchtune.errors.UnsupportedGraphError`; its message is ``reason``."""
        if self.apart:
            return SeparateRegionsError(self.reason, self.apart, self.edges)
        return UnsupportedGraphError(self.reason)

    @staticmethod
    def of(exc: UnsupportedGraphError) -> Refusal:
        """The refusal an :class:`~stitchtune.errors.UnsupportedGraphError` states (its message, and
        the nodes of a :class:`~stitchtune.errors.SeparateRegionsError`)."""
        if isinstance(exc, SeparateRegionsError):
            return Refusal(str(exc), exc.apart, exc.edges)
        return Refusal(str(exc))


def ask(rule: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T | Refusal:
    """``rule(*args, **kwargs)``, or the :class:`Refusal` it raised (an
    :class:`~stitchtune.errors.UnsupportedGraphError`); any other exception passes."""
    try:
        return rule(*args, **kwargs)
    except UnsupportedGraphError as exc:
        return Refusal.of(exc)


def rewritten(rewrite: Callable[[Graph], _T], graph: Graph) -> _T | Refusal:
    """``rewrite(graph)`` (a planner rewrite: its graph validated again by
    :func:`~stitchtune.graph.parse.parse_graph`), or the :class:`Refusal` of the
    :class:`~stitchtune.errors.GraphError` that validation raised (a rewritten graph over the format's
    limits: the graph is refused with that message)."""
    try:
        return rewrite(graph)
    except GraphError as exc:
        return Refusal(str(exc))
