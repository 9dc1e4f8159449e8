"""CPU time the fitted cost model spends per search candidate, as the evaluation pipeline calls it.

    python scripts/predict_cost_per_candidate.py [--graphs layernorm,layernorm_wide,...] [--n 12] [--seed 0]

Per candidate the search predicts up to three times (:mod:`stitchtune.tune.pipeline` before the build
with lowering's register estimate, after the build with ptxas' registers, and the emulate runner's time
with the same registers): this script lowers ``--n`` sampled schedules of each example graph once, then
times exactly those three calls of :func:`stitchtune.cost.fitted.predict_program` per candidate on the
*same* program object (CPU time, ``time.process_time``; lowering is not timed). The registers "after
the build" are lowering's estimate + 8 (no nvcc needed: any change of registers makes the call redo the
register-dependent part). Run it with another checkout first on ``PYTHONPATH`` for a before/after
comparison (``stitchtune`` is imported from ``PYTHONPATH``, the line printed first says which);
it uses only ``predict_program``. CPU figures on a shared machine: compare runs made
back to back, and quote the medians.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

GRAPHS = "layernorm,layernorm_wide,colsum_sigmoid_scale,softmax_tiny_rows,bias_gelu"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default=GRAPHS)
    ap.add_argument("--n", type=int, default=12, help="sampled schedules per graph (the heuristic's included)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="h200")
    a = ap.parse_args(argv)

    import stitchtune
    from stitchtune.cost.fitted import predict_program
    from stitchtune.deploy.selection import heuristic_schedule
    from stitchtune.errors import ScheduleError
    from stitchtune.graph.parse import load_graph
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan

    dev = get_device(a.device)
    print(f"stitchtune from {Path(stitchtune.__file__).resolve().parent}")
    print("| graph | candidates | 1st predict ms | 2nd (registers) ms | 3rd (runner) ms | per candidate ms |")
    print("|---|---|---|---|---|---|")
    every: list[float] = []
    for name in a.graphs.split(","):
        graph = load_graph(REPO / "examples" / f"{name}.json")
        plan = make_plan(graph)
        space = legal_space(graph, plan, dev)
        rng = random.Random(a.seed)
        schedules = [heuristic_schedule(plan, dev, space)] + [space.sample(rng) for _ in range(a.n - 1)]
        progs = []
        for s in schedules:
            try:
                progs.append(lower(graph, plan, s, dev, space))
            except ScheduleError:
                continue
        t = [[], [], []]
        for p in progs:
            regs = {k.name: k.est_registers + 8 for k in p.profile.kernels}
            for i, kw in enumerate(({}, {"registers": regs}, {"registers": dict(regs)})):
                t0 = time.process_time()
                predict_program(p, dev, **kw)
                t[i].append((time.process_time() - t0) * 1000.0)
        per = [x + y + z for x, y, z in zip(*t)]
        every += per
        print(f"| {name} | {len(progs)} | {statistics.median(t[0]):.1f} | {statistics.median(t[1]):.1f} | "
              f"{statistics.median(t[2]):.1f} | {statistics.median(per):.1f} |")
    print(f"\nall {len(every)} candidates: median {statistics.median(every):.1f} ms, "
          f"mean {statistics.mean(every):.1f} ms of CPU time per candidate (three predictions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
