"""Make a tuning database for the report and the notebooks.

Two modes:

* default: emulated searches (what ``stitchtune search --backend emulate --device h200`` runs) of the
  small example graphs, TPE and random sampling; every row is ``estimated`` (cost-model times), e.g.
  ``python scripts/make_demo_db.py --db demo-db/ --trials 24`` (default ``--db``: ``$STITCHTUNE_DB``, else
  ``tuning-db/`` at the repository root, which git ignores; ``--if-empty``: only when the directory holds no
  database yet);
* ``--synthetic``: write made-up rows (no search, a few milliseconds) for tests. Synthetic rows say
  so: graph names start with ``synthetic_``, the device is ``synthetic``, the study ``synthetic-*``.
  ``--fake-measured`` adds rows that look like a GPU run (backend ``cuda``, not estimated) so that
  the predicted-vs-measured figure has data to draw, and a made-up ``bench_synthetic.csv``; they are
  test data, never a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SCHEMES = ("local", "regional", "global", "independent")
REUSE = ("register", "shared", "global", "recompute")


def synthetic_rows(seed: int = 0, trials: int = 24, fake_measured: bool = False) -> list[dict]:
    """Made-up tuning rows in the database schema (see module docstring)."""
    from stitchtune.tune.database import utc_now

    rng = np.random.default_rng(seed)
    workloads = [("synthetic_layernorm", [256, 1024], 1.0e6), ("synthetic_softmax", [512, 512], 1.05e6),
                 ("synthetic_colsum", [1024, 256], 1.04e6)]
    runs = [("emulate", True, "synthetic")]
    if fake_measured:
        runs.append(("cuda", False, "synthetic-fake-gpu"))
    rows = []
    now = utc_now()
    for name, shape, nbytes in workloads:
        wkey = f"{abs(hash((name, seed))) % 16**12:012x}{name}"
        for backend, est, device in runs:
            for sampler in ("tpe", "random"):
                for t in range(trials):
                    heur = t == 0
                    p = {"scheme_0": "regional" if heur else str(rng.choice(SCHEMES)),
                         "tpr": 32 if heur else int(rng.choice([4, 8, 16, 32, 128, 256])),
                         "block": 128 if heur else int(rng.choice([64, 128, 256, 512])),
                         "split": 1 if heur else int(rng.choice([1, 2, 4])),
                         "vec": 4 if heur else int(rng.choice([1, 2, 4])),
                         "tasks_per_block": 1 if heur else int(rng.choice([0, 1, 2, 4])),
                         "min_blocks": 0 if heur else int(rng.choice([0, 1, 2])),
                         "reuse_0": "register" if heur else str(rng.choice(REUSE))}
                    occ = float(rng.uniform(0.125, 1.0))
                    base = nbytes / 3.0e6 + 1.0  # synthetic: µs at 3000 GB/s plus 1 µs
                    slow = (1 + 0.6 * SCHEMES.index(p["scheme_0"]) + 0.3 / p["vec"]
                            + 0.4 * (1 - occ) + 0.2 * REUSE.index(p["reuse_0"]))
                    pred = base * slow
                    status = str(rng.choice(["ok"] * 8 + ["pruned", "compile_error"])) if not heur else "ok"
                    meas = pred if est else pred * float(rng.lognormal(0.0, 0.15))
                    rows.append({
                        "workload_key": wkey, "structure_key": name, "graph_name": name,
                        "shapes": json.dumps({"x": shape}), "dtypes": json.dumps({"x": "float32"}),
                        "device_key": device, "device_name": device, "device_cc": "9.0",
                        "backend": backend, "estimated": est, "space_version": "synthetic",
                        "codegen_version": "synthetic", "schedule_json": json.dumps(p, sort_keys=True),
                        "schedule_key": json.dumps(p, sort_keys=True), "heuristic": heur,
                        "status": status, "prune_reason": "synthetic" if status == "pruned" else None,
                        "predicted_us": pred, "measured_us": meas if status == "ok" else None,
                        "occupancy": occ if status != "compile_error" else None,
                        "error": "synthetic error" if status == "compile_error" else "",
                        "study": f"synthetic-{name}-{sampler}-{backend}", "trial_number": t,
                        "sampler": sampler, "worker": "synthetic", "timestamp": now,
                        "min_bytes": int(nbytes), "copy_bandwidth_gbs": 3000.0,
                        **{f"p_{k}": v for k, v in p.items()},
                    })
    return rows


def write_synthetic(db: Path, seed: int = 0, trials: int = 24, fake_measured: bool = False) -> None:
    """Append synthetic rows to the database at ``db``."""
    from stitchtune.tune.database import TuningDB

    TuningDB(db).append(synthetic_rows(seed, trials, fake_measured))


def write_synthetic_bench(db: Path) -> Path:
    """A made-up ``bench_synthetic.csv`` next to a synthetic database (test data, not a measurement)."""
    import pandas as pd

    from stitchtune.tune.database import read_db

    rows = []
    for i, w in enumerate(sorted(read_db(db)["graph_name"].unique())):
        for system, t in (("stitchtune", 10.0), ("torch_eager", 30.0 + i), ("torch_compile_default", 15.0),
                          ("jax_jit", 12.0)):
            rows.append({"workload": w, "system": system, "median_us": t, "floor_us": 8.0,
                         "fraction_of_floor": 8.0 / t, "speedup_vs_this": t / 10.0, "checked": True,
                         "note": "synthetic"})
    path = Path(db) / "bench_synthetic.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def run_searches(db: Path, trials: int, graphs: list[Path], seed: int = 0, build: bool = False) -> None:
    """Emulated searches (``stitchtune.tune.search.run_search``, the API behind ``stitchtune search``) of
    each graph into ``db``, once with TPE and once with random sampling (two studies per workload)."""
    from stitchtune.tune.search import SearchConfig, format_summary, run_search

    for g in graphs:
        for i, sampler in enumerate(("tpe", "random")):
            cfg = SearchConfig(graph_path=str(g), trials=trials, backend="emulate", device="h200", db=str(db),
                               study=f"demo-{g.stem}-{sampler}", sampler=sampler, seed=seed + i, jobs=1,
                               build=build, progress=False)
            print(format_summary(run_search(cfg)), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, default=Path(os.environ.get("STITCHTUNE_DB") or REPO / "tuning-db"))
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--synthetic", action="store_true", help="write made-up rows instead of searching")
    ap.add_argument("--fake-measured", action="store_true",
                    help="with --synthetic: add fake GPU rows and a fake bench_synthetic.csv")
    ap.add_argument("--build", action="store_true", help="compile each candidate with nvcc (slower)")
    ap.add_argument("graphs", nargs="*", type=Path, help="graph.json files (default: examples/*small*.json)")
    ap.add_argument("--if-empty", action="store_true",
                    help="do nothing when the database already holds parts")
    a = ap.parse_args(argv)
    if a.if_empty and any(Path(a.db).glob("part-*.parquet")):
        print(f"{a.db} already holds a database; nothing to do")
        return 0
    if a.synthetic:
        write_synthetic(a.db, a.seed, a.trials, a.fake_measured)
        if a.fake_measured:
            write_synthetic_bench(a.db)
        print(f"wrote synthetic rows to {a.db}")
        return 0
    graphs = a.graphs or sorted((REPO / "examples").glob("*small*.json"))
    if not graphs:
        print("no graphs given and none matching examples/*small*.json", file=sys.stderr)
        return 2
    run_searches(a.db, a.trials, graphs, a.seed, a.build)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
