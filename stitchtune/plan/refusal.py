"""The planner's answer "no": a :class:`Refusal` value, and the one seam where an exception becomes one.

The planner's stages (:mod:`stitchtune.plan.planner`: rewrites -> layouts -> views -> checks) pass
refusals along as values: a stage returns its result or a :class:`Refusal`, the pipeline tries the next
layout or rewrite on a refusal, and only the public edge (:func:`~stitchtune.plan.planner.make_plan`)
raises, with :meth:`Refusal.error`: the same :class:`~stitchtune.errors.UnsupportedGraphError` (or
:class:`~stitchtune.errors.SeparateRegionsError` where the refusal names nodes to keep apart) with the
same message as the rule that refused. A region finder asks
:func:`~stitchtune.plan.planner.plan_graph` and reads the value, catching nothing.

Every rule of the pipeline returns a refusal (or None, or the value it builds); none raises: the checks of
:mod:`~stitchtune.plan.checks` and :mod:`~stitchtune.plan.views`, :func:`~stitchtune.plan.axes.tensor_axes`,
:mod:`~stitchtune.plan.cross`, :mod:`~stitchtune.plan.scatter`, :mod:`~stitchtune.plan.col_remap`,
:mod:`~stitchtune.plan.pick`, :mod:`~stitchtune.plan.view_checks`, the surrogate
(:func:`~stitchtune.plan.remap.surrogate`, :func:`~stitchtune.plan.remap.int_index_op`,
:func:`~stitchtune.plan.remap.check_remaps`), the layout rules of :mod:`~stitchtune.plan.chains`
(``tails_refusal``, ``layout_part_refusal``, ``domain_refusal``: the region facts ``layout_tails``,
``layout_part``, ``domain_of`` themselves refuse nothing), ``index_ops.aligned_shape`` and the bounds proofs of
:mod:`~stitchtune.plan.shift`. Their raising forms (``pick.pick_leaves``, ``index_ops.surrogate_shape``,
``shift.shift_offset`` ...) serve the lowering, which lowers what the planner accepted: a refusal there is a
bug. Every test runs under ``tests/helpers/planning.refusals_stay_values`` (autouse in ``tests/conftest.py``),
which fails a test in which planning constructs an :class:`~stitchtune.errors.UnsupportedGraphError`.
:func:`rewritten` is where a rewrite whose graph the format refuses (over its limits, a
:class:`~stitchtune.errors.GraphError` of the graph's validation) becomes one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from stitchtune.errors import GraphError, SeparateRegionsError, UnsupportedGraphError
from stitchtune.graph.parse import Graph

__all__ = ["Refusal", "rewritten"]

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


def rewritten(rewrite: Callable[[Graph], _T], graph: Graph) -> _T | Refusal:
    """``rewrite(graph)`` (a planner rewrite: its graph validated again by
    :func:`~stitchtune.graph.parse.parse_graph`), or the :class:`Refusal` of the
    :class:`~stitchtune.errors.GraphError` that validation raised (a rewritten graph over the format's
    limits: the graph is refused with that message)."""
    try:
        return rewrite(graph)
    except GraphError as exc:
        return Refusal(str(exc))
