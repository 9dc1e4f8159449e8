"""Where the fitted cost model misses, held out: per group and per regime, from a fit's output.

    python scripts/fit_residuals.py [--fit results/cost-fit-2026-12-07-s11]

Reads ``<fit>/fit.json`` (written by ``scripts/fit_cost_model.py``: measured and held-out PREDICTED times
per row) and ``<fit>/dataset.json`` (the rows' features) and prints markdown: per group the rows
predicted too slow (> +25%) and too fast (< -25%), the same split by regime (waves below one, grid
barriers / scratch chains, more than one launch, rolled loops with one load in flight, idle lanes), and
the worst rows with the features that describe them. Nothing here is measured anew.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def regimes(kernels: list[dict[str, Any]]) -> list[str]:
    """The regimes a row's launches are in (a row may be in several)."""
    out = []
    if any(k["waves"] < 1.0 for k in kernels):
        out.append("waves < 1")
    if any(k["grid_barriers"] > 0 or k["scratch_loads"] > 0 for k in kernels):
        out.append("grid barrier / scratch chain")
    if len(kernels) > 1:
        out.append("several launches")
    if any(k["loads_in_flight"] <= 1.0 for k in kernels):
        out.append("one load in flight")
    if any(k["active_lanes"] < 0.75 for k in kernels):
        out.append("idle lanes > 25%")
    return out or ["plain streaming"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", default="results/cost-fit-2026-12-07-s12")
    ap.add_argument("--compiled", action="store_true",
                    help="the post-build prediction (heldout_compiled_us: with the SASS's bytes in flight)")
    a = ap.parse_args(argv)
    key = "heldout_compiled_us" if a.compiled else "heldout_us"
    fit = json.loads((REPO / a.fit / "fit.json").read_text())["rows"]
    data = json.loads((REPO / a.fit / "dataset.json").read_text())["rows"]
    if len(fit) != len(data):
        print("fit_residuals: error: fit.json and dataset.json have different rows", file=sys.stderr)
        return 2
    by: dict[str, dict[str, list[float]]] = {"group": defaultdict(list), "regime": defaultdict(list)}
    worst = []
    for r, d in zip(fit, data):
        q = r[key] / r["measured_us"]
        by["group"][r["group"]].append(q)
        for g in regimes(d["kernels"]):
            by["regime"][g].append(q)
        worst.append((abs(q - 1.0) if q >= 1 else 1.0 / q - 1.0, q, r, d))
    lines = [f"# Held-out residuals of the fitted cost model ({len(fit)} H200 rows)", "",
             f"    python scripts/fit_residuals.py --fit {a.fit}" + (" --compiled" if a.compiled else ""), "",
             "q = held-out PREDICTED / measured (H200)" + (", predicted with the compiled code's bytes in flight"
                                                           if a.compiled else "")
             + ". too slow: q > 1.25; too fast: q < 0.8.", ""]
    for name, groups in by.items():
        lines += [f"| {name} | n | within ±25% | too slow | too fast | median q |", "|---|---|---|---|---|---|"]
        for g, qs in sorted(groups.items()):
            qs = sorted(qs)
            ok = sum(0.75 <= q <= 1.25 for q in qs)
            lines.append(f"| {g} | {len(qs)} | {ok} | {sum(q > 1.25 for q in qs)} | {sum(q < 0.8 for q in qs)} | "
                         f"{qs[len(qs) // 2]:.2f} |")
        lines.append("")
    lines += ["## Worst rows", "", "| group | row | measured | held out | q | grid x block | waves | bytes in flight | "
              "compiled bytes in flight | loads in flight | load phases | serial rounds | scratch loads | spills | regimes |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, q, r, d in sorted(worst, key=lambda t: -t[0])[:20]:
        k = max(d["kernels"], key=lambda k: k["unique_bytes"])
        lines.append(f"| {r['group']} | {r['label']} | {r['measured_us']:.1f} | {r[key]:.1f} | {q:.2f} | "
                     f"{k['grid']} x {k['block']} | {k['waves']:.2f} | {k['bytes_in_flight_per_thread']:.0f} | "
                     f"{k.get('compiled_bytes_in_flight', 0):.0f} | "
                     f"{k['loads_in_flight']:.1f} | {k['load_phases']:.0f} | {k.get('serial_rounds', float('nan')):.0f} | "
                     f"{k['scratch_loads']:.0f} | {k.get('spill_instructions', 0):.0f} | "
                     f"{', '.join(regimes(d['kernels']))} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
