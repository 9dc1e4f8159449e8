"""Walk vs SASS of today's kernels that hold a guarded vector load in a rolled loop (issue 39, s15-small).

    PYTHONPATH=$PWD python results/walk-guarded-2026-12-07-s15/guarded_walk.py [--seeds 8] --out results/walk-guarded-2026-12-07-s15

Every example graph's heuristic schedule and ``--seeds`` seeded samples (the legal space) are lowered for the H200
and rendered by today's code generator; each kernel with a ``LoadVec`` with a guard inside a rolled ``For`` is walked
with nvcc's unrolling rule on (``walk_loops.UNROLL_ROLLED``) twice: ``GUARDED_LOADS_WAIT`` True (before.json: the rule
of code generator 4) and False (after.json: today's), and compiled (``nvcc -cubin -arch=sm_90 -O3``, the builder's
flags) and read with cuobjdump (``compiled_bytes_in_flight``: the most bytes one thread has pending). The two files
have the layout ``scripts/walk_vs_sass.py`` reads. Nothing is measured or predicted here.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from stitchtune.cost import walk_loops
from stitchtune.cost.features import kernel_walk
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.gpu.build import NvccBuilder
from stitchtune.gpu.render import render
from stitchtune.gpu.sass import compiled_facts, read_cubin
from stitchtune.graph.parse import load_graph
from stitchtune.hardware.device import get_device
from stitchtune.ir import kir
from stitchtune.lower.entry import lower
from stitchtune.lower.resources import legal_space
from stitchtune.plan.planner import make_plan

REPO = Path(__file__).resolve().parents[2]


def guarded_in_rolled_loop(stmts: tuple[kir.Stmt, ...], rolled: bool = False) -> bool:
    for s in stmts:
        if isinstance(s, kir.LoadVec) and s.pred is not None and rolled:
            return True
        if isinstance(s, kir.For) and guarded_in_rolled_loop(s.body, rolled or not s.unroll):
            return True
        if isinstance(s, kir.If) and (guarded_in_rolled_loop(s.then, rolled) or guarded_in_rolled_loop(s.orelse, rolled)):
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    dev = get_device("H200")
    builder = NvccBuilder()
    rows: dict[str, list] = {"before": [], "after": []}
    walk_loops.UNROLL_ROLLED = True
    for path in sorted((REPO / "examples").glob("*.json")):
        g = load_graph(path)
        plan = make_plan(g)
        space = legal_space(g, plan, dev)
        points = [("heuristic", heuristic_schedule(plan, dev, space))]
        points += [(f"seed {i}", space.sample(random.Random(i))) for i in range(a.seeds)]
        for label, s in points:
            prog = lower(g, plan, s, dev, space)
            launches = [ln for ln in prog.launches if guarded_in_rolled_loop(prog.kernel(ln.kernel).body)]
            if not launches:
                continue
            (res,) = builder.build([render(prog)])
            if res.cubin_path is None:
                print(f"{path.name} {label}: {res.status}", file=sys.stderr)
                continue
            facts = {k: compiled_facts(m) for k, m in read_cubin(res.cubin_path).items()}
            for tag, wait in (("before", True), ("after", False)):
                walk_loops.GUARDED_LOADS_WAIT = wait
                kernels = []
                for ln in launches:
                    f = kernel_walk(prog.kernel(ln.kernel), ln.grid).base
                    kernels.append({"name": ln.kernel, "grid": ln.grid, "block": ln.block,
                                    "bytes_in_flight_per_thread": f.bytes_in_flight_per_thread,
                                    "compiled_bytes_in_flight": facts[ln.kernel].bytes_in_flight,
                                    "compiled_registers": facts[ln.kernel].registers})
                rows[tag].append({"group": path.name, "label": label, "schedule": s.to_json(), "kernels": kernels})
    a.out.mkdir(parents=True, exist_ok=True)
    for tag, r in rows.items():
        (a.out / f"{tag}.json").write_text(json.dumps({"rows": r}, indent=1) + "\n")
    print(f"{len(rows['after'])} programs, {sum(len(r['kernels']) for r in rows['after'])} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
