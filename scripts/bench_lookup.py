"""Time compile-time schedule selection on a synthetic 100,000-row tuning database.

    python scripts/bench_lookup.py [--rows 100000] [--parts 100] [--db DIR] [--repeat 5]

Writes made-up rows (``study`` = ``synthetic-lookup``; never a measurement) for many workloads and
devices (the layernorm_small example's own workload and shapes of its structure among them), in
``--parts`` part files, then times :func:`stitchtune.deploy.selection.choose_schedule` for:

* an exact hit (tuned), a new shape of a tuned structure (nearest-shape) and an unknown structure
  (heuristic), each cold (first read of the database: pyarrow scan) and warm (cached frame);

nvcc is not involved. Prints one line per case with the median time over ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def make_db(path: Path, rows: int, parts: int, seed: int = 0) -> None:
    """``rows`` synthetic rows over ``parts`` part files (see module docstring)."""
    import numpy as np

    from stitchtune.tune.database import TuningDB
    from stitchtune.hardware.device import get_device
    from stitchtune.graph.parse import Graph, load_graph
    from stitchtune.lower.entry import CODEGEN_VERSION
    from stitchtune.tune.pipeline import context_row, schedule_columns
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    rng = np.random.default_rng(seed)
    ln = load_graph(REPO / "examples" / "layernorm_small.json")
    devices = [get_device(n) for n in ("h200", "h100", "a100", "l4")]
    space = SearchSpace.for_plan(make_plan(ln), devices[0])
    pyrng = random.Random(seed)
    scheds = [space.sample(pyrng) for _ in range(32)]
    sched_cols = [schedule_columns(s) for s in scheds]
    # workloads: layernorm_small itself, its structure at other row counts, and foreign keys
    graphs = [ln]
    for r in (128, 512, 2048, 4096):
        d = ln.to_dict()
        d["inputs"]["x"]["shape"][0] = r
        d["name"] = f"layernorm_{r}"
        graphs.append(Graph.from_dict(d))
    ctx = [{**context_row(g, dev), "space_version": space.version, "codegen_version": CODEGEN_VERSION}
           for g in graphs for dev in devices]
    for i in range(200):  # unrelated workloads
        c = dict(ctx[i % len(ctx)])
        c.update(workload_key=f"{i:064x}", structure_key=f"{i % 50:064x}", graph_name=f"synthetic_{i}")
        ctx.append(c)
    per_part = rows // parts
    db = TuningDB(path)
    statuses = np.array(["ok"] * 7 + ["pruned", "compile_error", "wrong_result"])
    for p in range(parts):
        batch = []
        for j in range(per_part):
            c = ctx[int(rng.integers(len(ctx)))]
            st = str(statuses[int(rng.integers(len(statuses)))])
            batch.append({**c, **sched_cols[int(rng.integers(len(sched_cols)))],
                          "backend": "cuda", "estimated": False, "status": st,
                          "measured_us": float(rng.uniform(5, 50)) if st == "ok" else None,
                          "predicted_us": float(rng.uniform(5, 50)), "samples_us": "[]", "error": "",
                          "study": "synthetic-lookup", "trial_number": p * per_part + j})
        db.append(batch)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--parts", type=int, default=100)
    ap.add_argument("--db", default=None, help="where to write the synthetic database (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)

    from stitchtune.hardware.device import get_device
    from stitchtune.graph.parse import Graph, load_graph
    from stitchtune.deploy.selection import choose_schedule, clear_cache

    tmp = None
    if args.db is None:
        tmp = tempfile.mkdtemp(prefix="stitchtune-lookup-")
        db = Path(tmp) / "db"
    else:
        db = Path(args.db)
    try:
        t0 = time.perf_counter()
        make_db(db, args.rows, args.parts)
        print(f"synthetic database: {args.rows} rows in {args.parts} parts at {db} "
              f"(written in {time.perf_counter() - t0:.1f} s)")
        ln = load_graph(REPO / "examples" / "layernorm_small.json")
        d = ln.to_dict()
        d["inputs"]["x"]["shape"][0] = 1024
        d["name"] = "layernorm_1024"
        cases = [("exact hit", ln), ("new shape", Graph.from_dict(d)),
                 ("unknown structure", load_graph(REPO / "examples" / "softmax_small.json"))]
        dev = get_device("h200")
        choose_schedule(ln, db, dev)  # imports and first-use costs out of the way
        for label, g in cases:
            cold, warm, source = [], [], ""
            for _ in range(args.repeat):
                clear_cache()
                t = time.perf_counter()
                source = choose_schedule(g, db, dev).source
                cold.append(time.perf_counter() - t)
                t = time.perf_counter()
                choose_schedule(g, db, dev)
                warm.append(time.perf_counter() - t)
            print(f"{label:18s} -> {source:13s} cold {statistics.median(cold) * 1e3:7.1f} ms   "
                  f"warm {statistics.median(warm) * 1e3:7.1f} ms   (median of {args.repeat}, nvcc excluded)")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
