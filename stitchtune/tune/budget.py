"""One trial budget split over several searches (the buckets of ``search --dynamic``, the regions of
``tune``): :func:`split_by_share`; what the regions of ``tune`` are weighed by: :func:`predicted_gain`,
:func:`gain_weight`.

Contract: ``split_by_share(shares, total)`` returns one non-negative integer per share whose sum is
exactly ``total`` (for ``total >= 0``; nothing for no shares):

* each gets ``floor(share / sum(shares) x total)``, and the trials left over go one each to the largest
  remainders (ties: the earlier one), the largest-remainder rule;
* when ``total >= len(shares)``, each one left with 0 then gets 1 trial, taken from the one holding the
  most (ties: the earlier one): every search runs at least its trial 0, the heuristic schedule;
* when ``total < len(shares)``, the smallest shares keep 0 (the caller records them as skipped).

Shares are weights (any non-negative finite numbers; all zero: equal weights).

What a region's search may gain, as the fitted cost model sees it (all times PREDICTED, device time):

* :func:`predicted_gain(graph, device, heuristic=None, samples=SAMPLES, seed=0) -> PredictedGain`: the
  heuristic schedule's predicted time (``heuristic(plan, device, space)``, default
  :func:`stitchtune.cost.heuristic.heuristic_schedule`, in :func:`~stitchtune.lower.resources.legal_space`) and the
  least predicted time over it, its :meth:`~stitchtune.space.SearchSpace.variants` and ``samples`` points drawn with
  ``random.Random(seed)`` (deterministic; the pre-build prediction a search ranks with,
  :func:`stitchtune.cost.fitted.predict_program`; points that do not lower or that the model finds illegal are
  skipped). A :class:`~stitchtune.errors.ScheduleError` when the heuristic does not lower (any other exception, a
  lowering bug, propagates from any point, as in a search). Each point is one lowering and
  prediction: 0.2-4.6 s per full-size example at the defaults (wall time on a shared 2-core machine,
  results/ordering-budget-2026-12-07-s13/README.md).
* :func:`gain_weight(gain, count, uncertainty=UNCERTAINTY) -> float`: ``count x (gain_us + uncertainty x
  heuristic_us)``: the region's predicted gain over all its instances, plus a share of its time for the gain the
  model cannot see (it orders schedules measured less than ~10% apart no better than a coin:
  ``scripts/ordering_study.py``). A region predicted at its best sampled schedule (its floor, as the model sees
  it) weighs ``uncertainty`` of its time; one with a predicted gain of half its time weighs 6x that at 0.1.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["SAMPLES", "UNCERTAINTY", "PredictedGain", "gain_weight", "predicted_gain", "split_by_share"]

log = logging.getLogger(__name__)

#: points drawn per region besides the heuristic and its variants (:func:`predicted_gain`)
SAMPLES = 24
#: the share of a region's predicted time counted as gain the model cannot see (:func:`gain_weight`)
UNCERTAINTY = 0.1


def split_by_share(shares: Sequence[float], total: int) -> list[int]:
    """Trials per share, summing to exactly ``total`` (module docstring)."""
    n = len(shares)
    if n == 0 or total <= 0:
        return [0] * n
    if any(not math.isfinite(s) or s < 0 for s in shares):
        raise ValueError(f"shares must be finite and >= 0: {list(shares)}")
    weight = sum(shares)
    exact = [(s / weight if weight > 0 else 1 / n) * total for s in shares]
    got = [math.floor(x) for x in exact]
    order = sorted(range(n), key=lambda i: (-(exact[i] - got[i]), i))
    for i in order[: total - sum(got)]:
        got[i] += 1
    if total >= n:
        for i in [i for i, k in enumerate(got) if k == 0]:
            got[max(range(n), key=lambda j: (got[j], -j))] -= 1
            got[i] = 1
    return got


@dataclass(frozen=True)
class PredictedGain:
    """The heuristic's predicted device time (µs), the least predicted over the points tried, and how many
    points were predicted (module docstring). PREDICTED, never measured."""

    heuristic_us: float
    best_us: float
    points: int

    @property
    def gain_us(self) -> float:
        """What the best point tried is predicted to save over the heuristic (>= 0)."""
        return max(0.0, self.heuristic_us - self.best_us)


def predicted_gain(graph: Any, device: Any, heuristic: Callable[..., Any] | None = None, samples: int = SAMPLES,
                   seed: int = 0) -> PredictedGain:
    """The heuristic's predicted time and the best predicted over ``samples`` more points (module docstring)."""
    from stitchtune.cost.fitted import predict_program
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.errors import ScheduleError
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan

    plan = make_plan(graph)
    space = legal_space(graph, plan, device)
    h = (heuristic or heuristic_schedule)(plan, device, space)
    heur = float(predict_program(lower(graph, plan, h, device, space), device).time_us)
    rng = random.Random(seed)
    seen, best, points = {h.key()}, heur, 1
    for s in [*space.variants(h), *(space.sample(rng) for _ in range(samples))]:
        if s.key() in seen:
            continue
        seen.add(s.key())
        try:
            p = predict_program(lower(graph, plan, s, device, space), device)
        except ScheduleError:
            continue
        if p.prune_reason is None and math.isfinite(p.time_us):
            best, points = min(best, float(p.time_us)), points + 1
    if not math.isfinite(heur):   # the heuristic illegal after all (deploy.selection then draws another)
        heur = best
    log.debug("%s: heuristic %.2f us, best of %d points %.2f us (predicted)", getattr(graph, "name", "?"), heur,
              points, best)
    return PredictedGain(heur, best, points)


def gain_weight(gain: PredictedGain, count: int, uncertainty: float = UNCERTAINTY) -> float:
    """``count x (gain_us + uncertainty x heuristic_us)``: a region's weight in the budget (module docstring);
    0 when nothing about it is finite."""
    w = count * (gain.gain_us + uncertainty * gain.heuristic_us)
    return w if math.isfinite(w) else 0.0
