"""Check that a planner change plans and refuses every graph as before: record the graphs the tests
plan, then print the planner's answer for each, on both sides of the change, and diff.

    # 1. record (on the commit before the change): every graph planner._plan sees in those tests
    PYTHONPATH=$PWD:$PWD/scripts PLAN_CORPUS=/tmp/graphs.pkl \
        python -m pytest -n 0 -p plan_corpus tests/plan tests/importers
    # 2. answers, before and after (examples/*.json of the checkout are added to the recorded graphs)
    PYTHONPATH=$PWD python scripts/plan_corpus.py /tmp/graphs.pkl /tmp/before.txt [--sites]
    ... change, then the same into /tmp/after.txt; diff /tmp/before.txt /tmp/after.txt

One line per graph: its name, ``make_plan``'s answer (``PLAN`` and the sha1 of the plan's repr, or the
exception's type, message, ``apart`` and ``edges``) and ``plan_graph``'s (the plan's hash or the refusal's
fields), each planned afresh (the remembered answers cleared). ``--sites`` adds the function that
constructed the first ``UnsupportedGraphError`` while planning (``-`` when none did, ``make_plan`` when
only the public edge raised): where rules still raise. The pickles hold the graphs of *this* checkout's
``Graph`` class: record and answer with the same version of ``stitchtune/graph/parse.py``. Exit 2 with one
line for a missing or unreadable corpus.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import inspect
import os
import pickle
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- pytest plugin (-p plan_corpus)
_seen: dict[str, bytes] = {}


def pytest_configure(config: Any) -> None:
    """Wrap ``planner._plan`` to pickle each graph it plans (once per distinct pickle)."""
    from stitchtune.plan import planner

    plan = planner._plan

    def recording(graph: Any) -> Any:
        raw = pickle.dumps(graph)
        _seen.setdefault(hashlib.sha1(raw).hexdigest(), raw)
        return plan(graph)

    planner._plan = recording


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    out = os.environ.get("PLAN_CORPUS", "plan_corpus.pkl")
    with open(out, "wb") as f:
        pickle.dump(list(_seen.values()), f)
    print(f"\nplan_corpus: {len(_seen)} graphs -> {out}")


# ---------------------------------------------------------------------------- answers
def answers(graphs: list[Any], sites: bool) -> tuple[list[str], dict[str, int]]:
    """One line per graph (module docstring) and the counts of plans and refusals."""
    from stitchtune.errors import StitchtuneError, UnsupportedGraphError
    from stitchtune.plan import planner
    from stitchtune.plan.refusal import Refusal

    raised: list[str] = []
    init = StitchtuneError.__init__
    if sites:
        def constructed(self: StitchtuneError, *args: Any, **kwargs: Any) -> None:
            if isinstance(self, UnsupportedGraphError):
                raised.append(next(f.function for f in inspect.stack()[1:] if f.function not in ("__init__", "error")))
            init(self, *args, **kwargs)

        StitchtuneError.__init__ = constructed  # type: ignore[method-assign]
    lines, counts = [], {"plan": 0, "refusal": 0}
    for g in graphs:
        planner._remembered.cache_clear()
        raised.clear()
        try:
            made = "PLAN " + hashlib.sha1(repr(planner.make_plan(g)).encode()).hexdigest()
            counts["plan"] += 1
        except UnsupportedGraphError as exc:
            made = (f"{type(exc).__name__} {str(exc)!r} apart={getattr(exc, 'apart', None)} "
                    f"edges={getattr(exc, 'edges', None)}")
            counts["refusal"] += 1
        site = raised[0] if raised else "-"
        planner._remembered.cache_clear()
        got = planner.plan_graph(g)
        value = (f"R {(got.reason, got.apart, got.edges)!r}" if isinstance(got, Refusal)
                 else "P " + hashlib.sha1(repr(got).encode()).hexdigest())
        lines.append(f"{g.name}\t{made}\t{value}" + (f"\tSITE {site}" if sites else ""))
    StitchtuneError.__init__ = init  # type: ignore[method-assign]
    return lines, counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the planner's answer for every recorded graph and example")
    ap.add_argument("corpus", type=Path, help="the pickle written by the pytest plugin (-p plan_corpus)")
    ap.add_argument("out", type=Path, help="where to write one line per graph")
    ap.add_argument("--sites", action="store_true", help="name where planning constructed an UnsupportedGraphError")
    args = ap.parse_args(argv)
    try:
        graphs = [pickle.loads(raw) for raw in pickle.loads(args.corpus.read_bytes())]
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, TypeError) as exc:
        print(f"plan_corpus: error: cannot read {str(args.corpus)!a}: {exc}", file=sys.stderr)
        return 2
    from stitchtune.errors import StitchtuneError
    from stitchtune.graph.parse import load_graph

    for path in sorted(glob.glob(str(REPO / "examples" / "*.json"))):
        try:
            graphs.append(load_graph(path))
        except StitchtuneError:
            pass
    lines, counts = answers(graphs, args.sites)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"{len(graphs)} graphs: {counts['plan']} planned, {counts['refusal']} refused -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
