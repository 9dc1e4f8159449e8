"""Predicted time of a schedule and of each of its variants (one option switched), by the cost model.

    python scripts/predict_variants.py GRAPH.json 'SCHEDULE JSON' [--device h200]
    python scripts/predict_variants.py --examples      # the session-1 best schedules of four examples

Every time printed is a *prediction* of :func:`stitchtune.cost.model.predict` with the active cost constants
(defaults unless ``stitchtune calibrate`` wrote some), never a measurement: use it to see what the
model expects from ``order`` / ``prefetch`` / ``combine`` before the GPU measures the same pairs
(``scripts/variant_pairs.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: best measured schedules of session 1 on the H200 (results/h200-2026-11-29/), and a split-16 layernorm_wide point
EXAMPLES = {
    "layernorm_wide": {"block": 1024, "min_blocks": 0, "reuse": ["global", "recompute"],
                       "schemes": ["independent", "global"], "split": 2, "tasks_per_block": 0, "tpr": 1024,
                       "vec": 4},
    "layernorm_wide ": {"block": 1024, "min_blocks": 0, "reuse": ["global", "recompute"],
                        "schemes": ["independent", "global"], "split": 16, "tasks_per_block": 0, "tpr": 1024,
                        "vec": 4},
    "colsum_sigmoid_scale": {"block": 1024, "min_blocks": 0, "reuse": ["global"], "schemes": ["independent"],
                             "split": 16, "tasks_per_block": 0, "tpr": 32, "vec": 4},
    "layernorm": {"block": 512, "min_blocks": 0, "reuse": ["register", "recompute"],
                  "schemes": ["regional", "regional"], "split": 1, "tasks_per_block": 4, "tpr": 256, "vec": 2},
}


def predictions(graph_path: str, schedule: dict, device_name: str) -> list[tuple[str, float]]:
    """[(label, predicted us)] for the schedule and each of its variants."""
    from stitchtune.cost.model import predict
    from stitchtune.hardware.device import get_device
    from stitchtune.graph.parse import load_graph
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import Schedule, SearchSpace
    from stitchtune.space.options import COMBINE, ORDER, PREFETCH

    dev = get_device(device_name)
    g = load_graph(graph_path)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, dev)
    base = space.check(Schedule.from_dict(schedule))
    out = [("as given", predict(lower(g, plan, base, dev, space).profile, dev).time_us)]
    for v in space.variants(base):
        label = f"order={v.option(ORDER)} prefetch={int(v.option(PREFETCH))} combine={v.option(COMBINE)}"
        out.append((label, predict(lower(g, plan, v, dev, space).profile, dev).time_us))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graph", nargs="?")
    ap.add_argument("schedule", nargs="?", help="schedule JSON")
    ap.add_argument("--device", default="h200")
    ap.add_argument("--examples", action="store_true", help="the built-in schedules of four examples")
    args = ap.parse_args(argv)
    if args.examples:
        cases = [(str(REPO / "examples" / f"{k.strip()}.json"), v) for k, v in EXAMPLES.items()]
    elif args.graph and args.schedule:
        cases = [(args.graph, json.loads(args.schedule))]
    else:
        ap.error("give GRAPH and SCHEDULE, or --examples")
    for path, sched in cases:
        print(f"{Path(path).stem} {json.dumps(sched, sort_keys=True)}")
        for label, t in predictions(path, sched, args.device):
            print(f"  {t:9.1f} us (predicted)  {label}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
