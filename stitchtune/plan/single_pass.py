"""Single-pass statistics: dependent row reductions that one sweep can compute with a correction.

Two patterns of two consecutive stages (each a single reduction over the same row) are recognised:

* ``welford``: a mean (``reduce_mean(x)``, or ``reduce_sum(x)`` scaled by ``1/K`` / divided by ``K``)
  followed by a mean or sum of squared deviations from it (``d = x - m``; ``d * d``, ``square(d)`` or
  ``pow(d, 2)``; ``m - x`` also): layernorm, group norm and batchnorm variances. One sweep keeps, per
  thread, Welford's running ``(count, mean, M2)`` and merges them with the parallel-variance formula of
  Chan et al.; the variance is ``M2 / K`` (``M2`` for the sum form).
* ``online_softmax``: a ``reduce_max(x)`` followed by ``reduce_sum(exp(x - max))`` (softmax,
  log-softmax): one sweep keeps the running max ``m`` and the sum ``s`` of ``exp(x - m)``, rescaled
  by ``exp(m_old - m_new)`` whenever ``m`` grows, and merges ``(m, s)`` pairs the same way.

``mean(x * x) - mean(x) ** 2`` is *not* a candidate: its two reductions are already one stage, and
rewriting it as Welford would change what it computes (that formula cancels catastrophically when the
mean is large against the spread; the graph asks for it, the planner does not "fix" it).

Candidates are only recorded; whether a schedule merges them is its ``single_pass`` option
(:mod:`stitchtune.space.options`), lowered by :mod:`stitchtune.lower.single_pass`.
"""

from __future__ import annotations

from dataclasses import dataclass

from stitchtune.graph.parse import Graph, Node
from stitchtune.plan.family import Family

WELFORD = "welford"
ONLINE_SOFTMAX = "online_softmax"


@dataclass(frozen=True)
class SinglePassCandidate:
    """Stages ``stage`` and ``stage + 1`` (0-based) of a plan, mergeable into one sweep.

    ``first`` / ``second``: the reduction ids (mean or max; variance or sum of exponentials);
    ``source``: the full-size tensor both are computed from (``x``); ``first_is_sum`` /
    ``second_is_sum`` (``welford`` only): the reduction is a ``reduce_sum`` (its value is ``K x mean``
    / ``M2``) rather than a ``reduce_mean``.
    """

    kind: str
    stage: int
    first: str
    second: str
    source: str
    first_is_sum: bool = False
    second_is_sum: bool = False


def _is_const(a: str | float, value: float, rel: float = 1e-6) -> bool:
    return not isinstance(a, str) and abs(float(a) - value) <= rel * abs(value)


def _mean_names(r1: Node, nodes: list[Node], K: int) -> set[str]:
    """The tensors that hold the row mean: ``r1`` itself (a ``reduce_mean``), or the nodes that scale
    ``r1`` (a ``reduce_sum``) by ``1/K`` or divide it by ``K``."""
    if r1.op == "reduce_mean":
        return {r1.id}
    out = set()
    for nd in nodes:
        a = nd.args
        if nd.op == "mul" and len(a) == 2 and ((a[0] == r1.id and _is_const(a[1], 1.0 / K))
                                               or (a[1] == r1.id and _is_const(a[0], 1.0 / K))):
            out.add(nd.id)
        elif nd.op == "div" and len(a) == 2 and a[0] == r1.id and _is_const(a[1], float(K)):
            out.add(nd.id)
    return out


def _squared_arg(nd: Node) -> str | None:
    """``d`` where ``nd`` is ``d * d``, ``square(d)`` or ``pow(d, 2)``; else None."""
    a = nd.args
    if nd.op == "mul" and len(a) == 2 and isinstance(a[0], str) and a[0] == a[1]:
        return a[0]
    if nd.op == "square" and isinstance(a[0], str):
        return a[0]
    if nd.op == "pow" and len(a) == 2 and isinstance(a[0], str) and _is_const(a[1], 2.0, 0.0):
        return a[0]
    return None


def _welford(r1: Node, r2: Node, by_id: dict[str, Node], K: int, stage: int) -> SinglePassCandidate | None:
    if r1.op not in ("reduce_mean", "reduce_sum") or r2.op not in ("reduce_mean", "reduce_sum"):
        return None
    x = r1.args[0]
    sq = by_id.get(str(r2.args[0]))
    d_name = _squared_arg(sq) if sq is not None else None
    d = by_id.get(d_name) if d_name is not None else None
    if d is None or d.op != "sub" or len(d.args) != 2:
        return None
    means = _mean_names(r1, list(by_id.values()), K)
    if not ((d.args[0] == x and d.args[1] in means) or (d.args[1] == x and d.args[0] in means)):
        return None
    return SinglePassCandidate(WELFORD, stage, r1.id, r2.id, str(x), r1.op == "reduce_sum", r2.op == "reduce_sum")


def _online_softmax(r1: Node, r2: Node, by_id: dict[str, Node], stage: int) -> SinglePassCandidate | None:
    if r1.op != "reduce_max" or r2.op != "reduce_sum":
        return None
    e = by_id.get(str(r2.args[0]))
    d = by_id.get(str(e.args[0])) if e is not None and e.op == "exp" else None
    if d is None or d.op != "sub" or tuple(d.args) != (r1.args[0], r1.id):
        return None
    return SinglePassCandidate(ONLINE_SOFTMAX, stage, r1.id, r2.id, str(r1.args[0]))


def single_pass_candidates(graph: Graph, family: str, stages: tuple[tuple[str, ...], ...],
                           K: int) -> tuple[SinglePassCandidate, ...]:
    """The mergeable stage pairs of a plan (row family only; each stage a single reduction; pairs do
    not overlap: a stage merged with the one before it is not merged with the one after it)."""
    if family != Family.ROW:
        return ()
    by_id = {nd.id: nd for nd in graph.nodes}
    out: list[SinglePassCandidate] = []
    j = 0
    while j + 1 < len(stages):
        c = None
        if len(stages[j]) == 1 and len(stages[j + 1]) == 1:
            r1, r2 = by_id[stages[j][0]], by_id[stages[j + 1][0]]
            c = _welford(r1, r2, by_id, K, j) or _online_softmax(r1, r2, by_id, j)
        if c is not None:
            out.append(c)
            j += 2
        else:
            j += 1
    return tuple(out)
