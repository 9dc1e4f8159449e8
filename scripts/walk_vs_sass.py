"""The IR walk's bytes in flight per thread against the SASS's, on the cost fit's measured kernels.

    python scripts/walk_vs_sass.py --before results/cost-fit-2026-12-07-s13-walk/dataset.json \\
        --after results/cost-fit-2026-12-07-s14-unroll/dataset.json

Per kernel that has both (the dataset's ``bytes_in_flight_per_thread``, the walk's bytes-weighted mean load group,
and ``compiled_bytes_in_flight``, the most bytes one thread has pending in the sm_90 SASS: scripts/sass_dataset.py),
the ratio walk / SASS; per dataset how many kernels lie within 1.25x and 2x and the mean |log ratio|; then the kernels
whose walk figure moved between the two datasets, closer to the SASS or further. Nothing is measured or predicted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

Key = tuple[int, int]


def pairs(dataset: dict[str, Any]) -> dict[Key, dict[str, Any]]:
    """(row, kernel) -> the kernel's walk and SASS bytes in flight and its names, for kernels with SASS facts."""
    out = {}
    for i, r in enumerate(dataset["rows"]):
        for j, k in enumerate(r["kernels"]):
            if float(k.get("compiled_bytes_in_flight", 0.0)) > 0:
                out[(i, j)] = {"walk": float(k["bytes_in_flight_per_thread"]), "sass": float(k["compiled_bytes_in_flight"]),
                               "row": f"{r['group']} {r['label']}", "kernel": k["name"], "launch": f"{k['grid']} x {k['block']}"}
    return out


def summary(p: dict[Key, dict[str, Any]]) -> dict[str, float]:
    """Kernels, within 1.25x, within 2x, mean |log(walk / SASS)|."""
    q = [max(x["walk"], 1e-9) / x["sass"] for x in p.values()]
    return {"kernels": len(q), "within_1.25x": sum(0.8 <= x <= 1.25 for x in q), "within_2x": sum(0.5 <= x <= 2.0 for x in q),
            "mean_abs_log": sum(abs(math.log(x)) for x in q) / len(q) if q else math.nan}


def report(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The Markdown lines comparing the two datasets' walks with the SASS."""
    a, b = pairs(before), pairs(after)
    lines = ["| walk | kernels | within 1.25x | within 2x | mean abs log ratio |", "|---|---|---|---|---|"]
    for name, p in (("before", a), ("after", b)):
        s = summary(p)
        lines.append(f"| {name} | {s['kernels']} | {s['within_1.25x']} | {s['within_2x']} | {s['mean_abs_log']:.3f} |")
    moved = [(k, a[k], b[k]) for k in a if k in b and abs(a[k]["walk"] - b[k]["walk"]) > 1e-9]
    closer = sum(abs(math.log(y["walk"] / y["sass"])) < abs(math.log(x["walk"] / x["sass"])) for _, x, y in moved)
    lines += ["", f"kernels moved: {len(moved)} ({closer} closer to the SASS, {len(moved) - closer} further)", ""]
    if moved:
        lines += ["| row | kernel | grid x block | walk before | walk after | SASS |", "|---|---|---|---|---|---|"]
        lines += [f"| {x['row']} | {x['kernel']} | {x['launch']} | {x['walk']:.0f} | {y['walk']:.0f} | {x['sass']:.0f} |"
                  for _, x, y in moved]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=Path)
    ap.add_argument("--after", required=True, type=Path)
    a = ap.parse_args(argv)
    try:
        before, after = (json.loads(p.read_text()) for p in (a.before, a.after))
    except (OSError, ValueError) as exc:
        print(f"walk_vs_sass: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report(before, after)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
