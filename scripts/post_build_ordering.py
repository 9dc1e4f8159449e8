"""Does the search's after-build prediction order the committed database's schedules as measured?

    python scripts/post_build_ordering.py [--dataset results/cost-fit-2026-12-07-s13-walk/dataset.json] [--device h200]

The search records, per built candidate, the shipped fitted model's prediction with ptxas' registers and
the compiled facts of the cubin (:mod:`stitchtune.tune.pipeline`, ``predicted_from=compiled``), or from the
IR features alone where the cubin cannot be read (``predicted_from=ir``). This script makes both
predictions for every measured database row of the cost-fit dataset (the measured kernels' IR features
and compiled facts, rebuilt from their exact sources: results/cost-fit-2026-12-07-s12/README.md) with the
*shipped* coefficients (``stitchtune/cost/fitted_<device>.json``) and reports, per database workload, the
heuristic schedule against the best measured one (ordered as measured?) and the pairs of schedules
measured more than 10% apart that each prediction orders right.

Honest labels: measured = the committed H200 database (CUDA events); every other figure is PREDICTED.
The shipped coefficients were fitted on these rows among others (in-sample for them); the
leave-one-model-out figures are in the fit's own report (results/cost-fit-2026-12-07-s12/fit.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from fit_cost_model import DATASET, ir_only, ordering, pair_order  # noqa: E402

from stitchtune.cost.fit_dataset import DatasetError, load_dataset  # noqa: E402
from stitchtune.cost.fitted import coefficients_for  # noqa: E402
from stitchtune.cost.fitting import predict_rows  # noqa: E402
from stitchtune.hardware.device import get_device  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=DATASET)
    ap.add_argument("--device", default="h200")
    a = ap.parse_args(argv)
    dev = get_device(a.device)
    try:
        stored = load_dataset(REPO / a.dataset, dev.key)
    except DatasetError as exc:
        print(f"post_build_ordering: error: {exc}", file=sys.stderr)
        return 2
    rows = [dict(r) for r in stored.rows if str(r["group"]).startswith("db:")]
    for r in rows:
        r.setdefault("timing", "events")
    shipped = coefficients_for(dev)
    for r, ir, comp in zip(rows, predict_rows(ir_only(rows), dev, shipped), predict_rows(rows, dev, shipped)):
        r["ir_us"], r["compiled_us"] = float(ir), float(comp)
    print(f"# After-build ordering on the committed database ({len(rows)} measured rows, {a.dataset})\n")
    print("measured = H200, CUDA events; ir / compiled = PREDICTED by the shipped coefficients (in-sample for "
          "these rows) from the IR features / with the compiled facts of the measured kernels' cubins.\n")
    print("| workload | rows | heuristic measured us | best measured us | ir: heur / best | ordered | "
          "compiled: heur / best | ordered | pairs >10% apart | ordered (ir) | ordered (compiled) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ir_ord = {w: ok for w, _, ok in ordering(rows, "ir_us")}
    comp_ord = {w: ok for w, _, ok in ordering(rows, "compiled_us")}
    ir_pairs = {w: (n, ok) for w, n, ok in pair_order(rows, "ir_us")}
    comp_pairs = {w: (n, ok) for w, n, ok in pair_order(rows, "compiled_us")}
    tally = {"ir": 0, "compiled": 0, "n": 0}
    for wl in sorted(ir_ord):
        rs = [r for r in rows if r["workload"] == wl]
        heur = next((r for r in rs if r["heuristic"]), None)
        best = min(rs, key=lambda r: r["measured_us"])
        if heur is None or heur is best:
            hm = "-" if heur is None else f"{heur['measured_us']:.1f}"
            what = "no heuristic row" if heur is None else "heuristic is the best measured"
            print(f"| {wl} | {len(rs)} | {hm} | "
                  f"{best['measured_us']:.1f} | {what} | - | | - | "
                  f"{ir_pairs[wl][0]} | {ir_pairs[wl][1]} | {comp_pairs[wl][1]} |")
            continue
        tally["n"] += 1
        tally["ir"] += ir_ord[wl]
        tally["compiled"] += comp_ord[wl]
        print(f"| {wl} | {len(rs)} | {heur['measured_us']:.1f} | {best['measured_us']:.1f} | "
              f"{heur['ir_us']:.1f} / {best['ir_us']:.1f} | {'yes' if ir_ord[wl] else 'NO'} | "
              f"{heur['compiled_us']:.1f} / {best['compiled_us']:.1f} | {'yes' if comp_ord[wl] else 'NO'} | "
              f"{ir_pairs[wl][0]} | {ir_pairs[wl][1]} | {comp_pairs[wl][1]} |")
    n_pairs = sum(n for n, _ in ir_pairs.values())
    print(f"\nHeuristic vs best measured, where the heuristic is not the best: ordered right {tally['ir']} of "
          f"{tally['n']} from the IR features, {tally['compiled']} of {tally['n']} with the compiled facts. "
          f"Pairs measured > 10% apart ordered right: {sum(ok for _, ok in ir_pairs.values())} / "
          f"{sum(ok for _, ok in comp_pairs.values())} of {n_pairs} (ir / compiled).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
