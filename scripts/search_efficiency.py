#!/usr/bin/env python3
"""Search efficiency on emulated workloads: how many trials TPE, GP and random search need to come
within 5% of the best point, with the cost model's predicted time as the objective (ESTIMATED times:
no GPU is involved; the figures rank samplers on the cost model's landscape, not on real kernels).

The reference "best" comes from a sweep: every legal point when the space is small enough
(``--exhaustive-limit``), otherwise a large uniform random sample of legal points (``--sample``),
which the table then labels ``sampled``; a point found by a sampler that beats the sweep becomes the
reference instead. Each sampler runs ``--repeats`` seeds of ``--trials`` trials through optuna's
ask/tell with the same define-by-run space and the same treatment of illegal points (told PRUNED)
as ``stitchtune search``. GP needs PyTorch and is skipped (said so in the table) without it.

    python scripts/search_efficiency.py [--graphs examples/layernorm.json ...] [--trials 60]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_GRAPHS = ["examples/layernorm.json", "examples/softmax.json", "examples/rmsnorm.json",
                  "examples/colsum_sigmoid_scale.json"]


class Objective:
    """Predicted time (µs, estimated) of a schedule; inf for illegal points. Cached by schedule key."""

    def __init__(self, graph, plan, space, device) -> None:
        from stitchtune.cost import model as cost
        from stitchtune.lower import entry as lower

        self.graph, self.plan, self.space, self.device = graph, plan, space, device
        self._lower, self._predict = lower.lower, cost.predict
        self.cache: dict[str, float] = {}

    def __call__(self, s) -> float:
        from stitchtune.errors import ScheduleError

        k = s.key()
        if k not in self.cache:
            try:
                prog = self._lower(self.graph, self.plan, s, self.device, self.space)
                pred = self._predict(prog.profile, self.device)
                self.cache[k] = math.inf if pred.prune_reason else float(pred.time_us)
            except ScheduleError:
                self.cache[k] = math.inf
        return self.cache[k]


def sweep(space, obj: Objective, exhaustive_limit: int, sample: int, seed: int) -> tuple[float, int, str]:
    """(best value, points evaluated, 'exhaustive' | 'sampled')."""
    from stitchtune.errors import ScheduleError
    from stitchtune.tune.search import grid_points

    try:
        points = grid_points(space, seed)
        kind = "exhaustive"
        if len(points) > exhaustive_limit:
            raise ScheduleError("too many")
    except ScheduleError:
        rng = random.Random(seed)
        points = [space.sample(rng) for _ in range(sample)]
        kind = "sampled"
    best = min(obj(s) for s in points)
    return best, len(points), kind


def run_sampler(name: str, seed: int, trials: int, space, obj: Objective) -> list[float]:
    """Best-so-far value after each trial."""
    import optuna

    from stitchtune.tune.search import make_sampler

    if name in ("gp", "cmaes"):  # as `stitchtune search` does: plain parameter names for these samplers
        space = space.flat_mode()
    study = optuna.create_study(direction="minimize", sampler=make_sampler(name, seed, space))
    best, trace = math.inf, []
    for _ in range(trials):
        t = study.ask()
        s = space.suggest(t)
        v = obj(s)
        if math.isfinite(v):
            study.tell(t, v)
            best = min(best, v)
        else:
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
        trace.append(best)
    return trace


def trials_to(trace: list[float], target: float) -> int | None:
    for i, v in enumerate(trace):
        if v <= target:
            return i + 1
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", nargs="+", default=DEFAULT_GRAPHS)
    ap.add_argument("--device", default="h200")
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--samplers", default="tpe,gp,random")
    ap.add_argument("--sample", type=int, default=3000, help="random legal points when the space is too big")
    ap.add_argument("--exhaustive-limit", type=int, default=20000)
    ap.add_argument("--within", type=float, default=0.05, help="target: within this fraction of the best")
    args = ap.parse_args(argv)

    import optuna

    from stitchtune.hardware.device import get_device
    from stitchtune.graph.parse import load_graph
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    device = get_device(args.device)
    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
    have_torch = importlib.util.find_spec("torch") is not None
    rows = []
    for gpath in args.graphs:
        t0 = time.time()
        graph = load_graph(gpath)
        plan = make_plan(graph)
        space = SearchSpace.for_plan(plan, device)
        obj = Objective(graph, plan, space, device)
        ref, npts, kind = sweep(space, obj, args.exhaustive_limit, args.sample, seed=12345)
        traces: dict[str, list[list[float]]] = {}
        for name in samplers:
            if name == "gp" and not have_torch:
                continue
            traces[name] = [run_sampler(name, seed, args.trials, space, obj) for seed in range(args.repeats)]
        found = [tr[-1] for trs in traces.values() for tr in trs]
        best = min([ref, *found])
        heur = obj(heuristic_schedule(plan, device))
        target = best * (1 + args.within)
        for name in samplers:
            if name not in traces:
                rows.append((graph.name, kind, npts, best, heur / best, name, "skipped (needs torch)", "", ""))
                continue
            hits = [trials_to(tr, target) for tr in traces[name]]
            got = [h for h in hits if h is not None]
            med = f"{statistics.median(got):.0f}" if len(got) == len(hits) else (
                f">{args.trials}" if not got else f"{statistics.median(got):.0f} ({len(got)}/{len(hits)} runs)")
            final = statistics.median(tr[-1] for tr in traces[name]) / best
            rows.append((graph.name, kind, npts, best, heur / best, name, med, f"{len(got)}/{len(hits)}",
                         f"{final:.3f}"))
        print(f"# {graph.name}: sweep {kind} ({npts} points), {time.time() - t0:.0f} s", file=sys.stderr, flush=True)

    print(f"Search efficiency, device {device.key}, objective = cost-model prediction (ESTIMATED, not measured); "
          f"target = within {100 * args.within:.0f}% of the best; {args.trials} trials x {args.repeats} seeds")
    hdr = ("workload", "sweep", "points", "best us (est.)", "heuristic/best", "sampler",
           f"median trials to <={1 + args.within:.2f}x best", "runs reaching it", "final/best (median)")
    table = [hdr] + [(r[0], r[1], str(r[2]), f"{r[3]:.2f}", f"{r[4]:.2f}", r[5], r[6], r[7], r[8]) for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(hdr))]
    for j, row in enumerate(table):
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)))
        if j == 0:
            print("-+-".join("-" * w for w in widths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
