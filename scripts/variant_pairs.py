"""Side-by-side pairs of schedules that differ only in ``order`` or ``prefetch``, from a tuning database.

    python scripts/variant_pairs.py [--db results/h200-2026-11-29] [--backend cuda]

Every search enqueues the variants of its best point (``SearchSpace.variants``), so a database from a
GPU search holds measured pairs: the same schedule with the sweep order forward/alternate, or with
prefetch off/on. This prints each pair with both times (measured medians, or the cost model's
predictions for emulate rows, labelled ``estimated``) and the ratio, then the geometric mean ratio per
option. Nothing here is a new measurement: it only reads the database.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def pairs(df, option: str) -> list[tuple[str, str, float, float, bool]]:
    """(workload, base schedule JSON, time with the option at its default, time switched, estimated)."""
    ok = df[(df["status"] == "ok") & df["measured_us"].notna() & df["schedule_json"].notna()]
    default = {"order": "forward", "prefetch": 0}[option]
    out = []
    for (wl, dev, be), grp in ok.groupby(["graph_name", "device_key", "backend"]):
        best: dict[str, tuple[float, bool, dict]] = {}
        for r in grp.itertuples():
            d = json.loads(r.schedule_json)
            key = json.dumps({k: v for k, v in d.items() if k != option}, sort_keys=True)
            val = d.get(option, default)
            t = float(r.measured_us)
            cur = best.get((key, val))
            if cur is None or t < cur[0]:
                best[(key, val)] = (t, bool(r.estimated), d)
        for (key, val), (t, est, _d) in best.items():
            if val != default:
                base = best.get((key, default))
                if base is not None:
                    out.append((wl, key, base[0], t, est or base[1]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=str(REPO / "results" / "h200-2026-11-29"))  # the committed H200 run
    ap.add_argument("--backend", default=None, help="only rows of this backend (cuda or emulate)")
    args = ap.parse_args(argv)
    from stitchtune.tune.database import TuningDB

    df = TuningDB(args.db).read()
    if args.backend:
        df = df[df["backend"] == args.backend]
    if df.empty:
        print(f"no rows in {args.db}")
        return 0
    for option, label in (("order", "alternate vs forward"), ("prefetch", "prefetch on vs off")):
        ps = pairs(df, option)
        print(f"\n{option}: {label} ({len(ps)} pairs)")
        if not ps:
            continue
        print(f"  {'workload':24s} {'default us':>11s} {'switched us':>12s} {'ratio':>7s}  schedule")
        for wl, key, a, b, est in sorted(ps):
            tag = " (estimated)" if est else ""
            print(f"  {wl:24s} {a:11.2f} {b:12.2f} {b / a:7.3f}  {key}{tag}")
        gm = math.exp(sum(math.log(b / a) for _, _, a, b, _ in ps) / len(ps))
        print(f"  geometric mean ratio switched/default: {gm:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
