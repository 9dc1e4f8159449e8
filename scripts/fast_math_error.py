"""The error of fast arithmetic against the float64 reference, per example, in the emulator.

    python scripts/fast_math_error.py [--samples 3] [--only softmax_small.json ...]

For every small example (``examples/*_small.json``): its heuristic schedule and ``--samples`` seeded samples
of its space, each emulated twice on the same seeded inputs, with ``exact_math`` 0 (fast forms, the default)
and 1 (accurate ``expf``, IEEE division); prints per example the largest relative L2 error per output
(``|out - ref|_2 / |ref|_2``) of each, as the tests measure it. The emulator models what the GPU computes
(:mod:`stitchtune.graph.fast_ops`): these are emulated errors, not measured on a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stitchtune.cost.heuristic import heuristic_schedule  # noqa: E402
from stitchtune.emulate.emulator import emulate_program  # noqa: E402
from stitchtune.graph.parse import load_graph  # noqa: E402
from stitchtune.graph.reference import random_inputs, run_reference  # noqa: E402
from stitchtune.hardware.device import get_device  # noqa: E402
from stitchtune.lower.entry import lower  # noqa: E402
from stitchtune.plan.planner import make_plan  # noqa: E402
from stitchtune.space import SearchSpace  # noqa: E402


def rel_l2(a, b) -> float:
    import numpy as np

    b = np.asarray(b, np.float64)
    a = np.asarray(a, np.float64).reshape(b.shape)
    den = float(np.linalg.norm(b.ravel()))
    return float(np.linalg.norm((a - b).ravel())) / (den if den > 0 else 1.0)


def errors(name: str, samples: int) -> tuple[float, float]:
    """(fast, exact): the largest relative L2 error over outputs and schedules of example ``name``."""
    dev = get_device("H200")
    g = load_graph(REPO / "examples" / name)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, dev)
    inputs = random_inputs(g, 4)
    ref = run_reference(g, inputs)
    worst = [0.0, 0.0]
    for s in [heuristic_schedule(plan, dev, space)] + [space.sample(random.Random(i)) for i in range(samples)]:
        for k, exact in enumerate((0, 1)):
            sx = dataclasses.replace(s, exact_math=exact)  # type: ignore[call-arg]  # an option (Schedule docs)
            out = emulate_program(lower(g, plan, sx, dev, space), inputs, coresident_limit=lambda k: 1 << 30)
            for o in g.outputs:
                if str(g.spec(o).dtype) in ("float32", "float16", "bfloat16"):
                    worst[k] = max(worst[k], rel_l2(out[o], ref[o]))
    return worst[0], worst[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--only", nargs="+")
    a = ap.parse_args()
    names = a.only or sorted(p.name for p in (REPO / "examples").glob("*_small.json"))
    print("| example | fast (emulated) | exact (emulated) |\n|---|---|---|")
    for n in names:
        f, e = errors(n, a.samples)
        print(f"| {n} | {f:.2e} | {e:.2e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
