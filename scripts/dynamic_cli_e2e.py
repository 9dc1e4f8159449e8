"""Every ``examples/dynamic`` graph end to end through the CLI, at its full declared range.

    python scripts/dynamic_cli_e2e.py [--trials 8] [--extents 1,1023,2048] [--keep DIR] [NAME ...]

For each graph (default: all of ``examples/dynamic``): ``stitchtune search GRAPH --dynamic seq=LO..HI``
(the graph's own bounds; ``--trials`` split over the buckets, emulate backend, estimated times, no nvcc),
``stitchtune compile GRAPH --no-cubin`` from that database, then ``stitchtune run GRAPH --backend emulate
--dynamic seq=N --random-inputs N`` at each extent, compared with ``stitchtune run`` on the float64
reference backend (same inputs). Prints one line per graph: buckets tuned at compile time, and per
extent the bucket, the schedule's origin and the largest absolute difference from the reference; exit 1
when a run fails or differs (rtol 1e-4, atol 1e-5). Each command is a process of its own, as a user
types it. Emulated runs check correctness only: no time here is a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def st(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "stitchtune", *argv], capture_output=True, text=True, env=env,
                          timeout=1800)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="example names (default: every examples/dynamic graph)")
    ap.add_argument("--trials", type=int, default=8, help="search trials per graph (default 8)")
    ap.add_argument("--extents", default="1,1023,2048", help="seq extents to run at (default 1,1023,2048)")
    ap.add_argument("--keep", default=None, help="keep the databases and outputs in this folder")
    args = ap.parse_args()
    names = args.names or sorted(p.stem for p in (REPO / "examples" / "dynamic").glob("*.json"))
    extents = [int(e) for e in args.extents.split(",")]
    work = Path(args.keep or tempfile.mkdtemp(prefix="dyn-e2e-"))
    bad = 0
    for name in names:
        g = str(REPO / "examples" / "dynamic" / f"{name}.json")
        dims = json.loads(Path(g).read_text())["dynamic"]
        rng = " ".join(f"{d}={v['min']}..{v['max']}" for d, v in dims.items())
        db, out = str(work / name / "db"), str(work / name / "compiled")
        t0 = time.time()
        r = st("search", g, *sum((["--dynamic", f"{d}={v['min']}..{v['max']}"] for d, v in dims.items()), []),
               "--trials", str(args.trials), "--db", db, "--backend", "emulate", "--no-build", "--jobs", "1",
               "--no-progress", "--device", "h200", "--seed", "0")
        if r.returncode:
            print(f"{name}: search failed: {r.stderr.strip()[-300:]}")
            bad += 1
            continue
        c = st("compile", g, "--no-cubin", "-o", out, "--db", db, "--device", "h200")
        if c.returncode:
            print(f"{name}: compile failed: {c.stderr.strip()[-300:]}")
            bad += 1
            continue
        m = json.loads((Path(out) / "manifest.json").read_text())
        tuned = sum(b.get("choice", {}).get("source") == "tuned" for b in m["buckets"])
        cells = []
        for e in extents:
            y, ref = str(work / name / f"y{e}.npz"), str(work / name / f"r{e}.npz")
            common = ["--random-inputs", str(e), *sum((["--dynamic", f"{d}={e}"] for d in dims), [])]
            a = st("run", g, "--backend", "emulate", *common, "-o", y, "--db", db, "--device", "h200")
            b = st("run", g, *common, "-o", ref)
            if a.returncode or b.returncode:
                cells.append(f"{e}: FAILED ({(a.stderr or b.stderr).strip().splitlines()[-1][:160]})")
                bad += 1
                continue
            line = next(ln for ln in a.stdout.splitlines() if ln.startswith("bucket "))
            origin = line.split("(", 1)[1].split(":", 1)[0].split(")", 1)[0]
            with np.load(y) as zy, np.load(ref) as zr:
                diff = max(float(np.max(np.abs(zy[k].astype(np.float64) - zr[k].astype(np.float64))))
                           for k in zr.files)
                ok = all(np.allclose(zy[k].astype(np.float64), zr[k].astype(np.float64), rtol=1e-4, atol=1e-5)
                         for k in zr.files)
            bad += not ok
            cells.append(f"{e}: {line.split()[1].rstrip(':')} {origin} max|diff| {diff:.1e}{'' if ok else ' WRONG'}")
        print(f"{name} ({rng}): {tuned}/{len(m['buckets'])} buckets tuned; " + "; ".join(cells)
              + f"  [{time.time() - t0:.0f} s]", flush=True)
    print(f"outputs in {work}" if args.keep else "", end="")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
