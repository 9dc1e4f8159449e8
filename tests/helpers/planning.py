"""Planning from a test: :func:`refusals_stay_values`, under which a planner rule that raises fails the test.

Every rule of the planner's pipeline (``stitchtune.plan.planner._plan`` and all it calls: rewrites,
layouts, the surrogate, views, checks) answers a :class:`~stitchtune.plan.refusal.Refusal` value; only
``make_plan`` raises, after the pipeline has answered. Under :func:`refusals_stay_values` the construction
of an :class:`~stitchtune.errors.UnsupportedGraphError` (a :class:`~stitchtune.errors.SeparateRegionsError`
too) while the pipeline runs fails the test with the message it carried: a rule that raised past the
pipeline would otherwise reach a region finder that asks ``plan_graph`` and catches nothing. The autouse
fixture ``refusals_are_values`` (tests/conftest.py) puts every test under it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from stitchtune.errors import StitchtuneError, UnsupportedGraphError
from stitchtune.graph.parse import Graph
from stitchtune.plan import planner

__all__ = ["refusals_stay_values"]


@contextlib.contextmanager
def refusals_stay_values() -> Iterator[None]:
    """Fail the test (``pytest.fail``) where planning constructs an ``UnsupportedGraphError``."""
    depth = threading.local()   # planning depth of each thread (a thread's error is its own)
    plan, init = planner._plan, StitchtuneError.__init__

    def planning(graph: Graph) -> Any:
        depth.n = getattr(depth, "n", 0) + 1
        try:
            return plan(graph)
        finally:
            depth.n -= 1

    def constructed(self: StitchtuneError, *args: Any, **kwargs: Any) -> None:
        if getattr(depth, "n", 0) and isinstance(self, UnsupportedGraphError):
            pytest.fail(f"a planner rule raised {type(self).__name__}({args[0] if args else ''!r}) inside the "
                        "pipeline: rules answer a Refusal value (stitchtune/plan/refusal.py)")
        init(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(planner, "_plan", planning)
        mp.setattr(StitchtuneError, "__init__", constructed)
        yield
