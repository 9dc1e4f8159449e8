#!/usr/bin/env python3
"""How many schedules the space offers that the device cannot run (CPU only: lowering and the cost
model's legality, no GPU).

For every example graph (``examples/*.json``, or ``--graphs``) and each device (``--devices``), draw
``--seeds`` seeded samples (``sample(random.Random(seed))``) from the space as ``SearchSpace.for_plan``
builds it (``bare``, what space version 1 offered) and from the space searches use
(``legal``: ``lower.resources.legal_space``), lower each and ask the cost model
(``cost.model.predict``) why it cannot run: zero occupancy, a grid barrier over more blocks than can be
co-resident (and how many of those come from ``cross_combine=grid``), anything else.

    python scripts/space_legality.py [--devices h200 a100] [--seeds 12] [--graphs examples/x.json ...]
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def kind(reason: str) -> str:
    """The class of a prune reason."""
    if "zero occupancy" in reason:
        return "zero_occupancy"
    if "co-resident" in reason:
        return "not_coresident"
    return "other"


def probe(graphs: list[Path], devices: list[str], seeds: int) -> dict[str, collections.Counter[str]]:
    from stitchtune.cost.model import predict
    from stitchtune.graph.parse import load_graph
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace
    from stitchtune.space.options import CROSS_COMBINE

    out: dict[str, collections.Counter[str]] = {"bare": collections.Counter(), "legal": collections.Counter()}
    for name in devices:
        dev = get_device(name)
        for path in graphs:
            g = load_graph(str(path))
            plan = make_plan(g)
            bare = SearchSpace.for_plan(plan, dev)
            for label, space in (("bare", bare), ("legal", legal_space(g, plan, dev, bare))):
                c = out[label]
                for seed in range(seeds):
                    s = space.sample(random.Random(seed))
                    c["samples"] += 1
                    reason = predict(lower(g, plan, s, dev, bare).profile, dev).prune_reason
                    if reason:
                        c["unrunnable"] += 1
                        c[kind(reason)] += 1
                        if kind(reason) == "not_coresident" and s.option(CROSS_COMBINE) == "grid":
                            c["not_coresident_cross_grid"] += 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", nargs="+", default=["h200"])
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--graphs", nargs="+", type=Path, default=sorted((REPO / "examples").glob("*.json")))
    args = ap.parse_args()
    out = probe(args.graphs, args.devices, args.seeds)
    cols = ("samples", "unrunnable", "zero_occupancy", "not_coresident", "not_coresident_cross_grid", "other")
    print(f"{len(args.graphs)} graphs x {args.seeds} seeds on {', '.join(args.devices)} (CPU: lowering + cost model)")
    print("| space | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for label, c in out.items():
        print(f"| {label} | " + " | ".join(str(c[k]) for k in cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
