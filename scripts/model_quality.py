"""Out-of-sample quality of the cost model on measured rows of a tuning database.

    python scripts/model_quality.py [--db results/h200-2026-11-29] [--factor 3] [--profiles relower|stored]
                                    [--no-fit] [--csv PATH]

For every ``ok`` row measured on a GPU (``estimated`` False) it re-predicts the time from the row's
profile and compares the *ranking* with the measured times, per workload (graph name):

* ``stored``   -- Spearman of the ``predicted_us`` column as written by the search (the model and
  parameters in force at the time of the run);
* ``default``  -- Spearman of the current model with the default :class:`stitchtune.cost.model.CostParams`
  (no parameter has seen any measured row: every workload is out of sample for the *constants*; the
  model's *structure* was, however, chosen by looking at these data, see the final report);
* ``in-fit``   -- Spearman with parameters fitted by :func:`stitchtune.cost.calibrate.fit` on ALL rows
  (IN SAMPLE, shown only for comparison);
* ``LOWO``     -- leave-one-workload-out: parameters fitted on the other workloads' rows only, Spearman
  on the held-out workload (OUT OF SAMPLE; the figure that counts).

For each column the script also says whether the pruning rule ``predicted > factor x best measured``
would have pruned the measured winner in the worst order (``winner predicted > factor x best measured
time of the other rows``; with the default model the predicted times are on the model's own scale,
so the ``time_scale`` fitted on the training workloads is applied; see ``pruned`` below).

Profiles: with ``--profiles relower`` (default) each row's schedule (``schedule_json``) is lowered
again with the current :mod:`stitchtune.lower.entry` (so changes to what the profile contains are
evaluated), keeping the row's ptxas registers; the example graph ``examples/<graph_name>.json`` must
have the row's workload key, else the stored ``profile_json`` is used (counted in the output). With
``--profiles stored`` the stored ``profile_json`` is used as is.

Prints only; all times are measured (``measured_us``) or predicted (everything else), never made up.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from stitchtune.cost import calibrate

from stitchtune.cost import model as cost
from stitchtune.tune.database import read_db
from stitchtune.hardware.device import get_device

log = logging.getLogger("model_quality")


def relowered_profiles(rows: pd.DataFrame, device) -> tuple[list[str], int]:
    """``profile_json`` strings for ``rows`` from the current lowering (ptxas registers kept); also
    returns how many rows fell back to their stored profile."""
    from stitchtune.graph.parse import load_graph
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan

    graphs: dict[str, tuple | None] = {}
    out, fallback = [], 0
    for r in rows.itertuples(index=False):
        if r.graph_name not in graphs:
            path = REPO / "examples" / f"{r.graph_name}.json"
            graphs[r.graph_name] = None
            if path.exists():
                g = load_graph(path)
                if g.workload_key() == r.workload_key:
                    graphs[r.graph_name] = (g, make_plan(g))
        gp = graphs[r.graph_name]
        stored = json.loads(r.profile_json) if isinstance(r.profile_json, str) else None
        regs = (stored or {}).get("registers")   # None: per-kernel counts unknown, estimates stay
        if gp is None:
            if stored is None:
                raise SystemExit(f"row {r.graph_name} has neither a matching example nor a profile")
            out.append(json.dumps(stored))
            fallback += 1
            continue
        prog = lower(gp[0], gp[1], cost_schedule(r.schedule_json), device)
        out.append(json.dumps(cost.profile_to_dict(prog.profile, regs)))
        if regs is None:
            log.info("%s: no per-kernel ptxas registers stored; estimated registers used", r.graph_name)
    return out, fallback


def cost_schedule(schedule_json: str):
    from stitchtune.space import Schedule
    return Schedule.from_dict(json.loads(schedule_json))


def repredict(rows: pd.DataFrame, device, params: cost.CostParams) -> np.ndarray:
    out = []
    for s in rows["profile_json"]:
        prof, regs = cost.profile_from_dict(json.loads(s))
        out.append(cost.predict(prof, device, regs, params=params).time_us)
    return np.array(out, dtype=float)


def rank_quality(meas: np.ndarray, pred: np.ndarray, factor: float) -> tuple[float, bool, int]:
    """(Spearman of pred vs meas, whether the measured winner is pruned in the worst order, how many
    rows the rule would prune against the best measured time of the workload)."""
    rho = float(spearmanr(pred, meas).statistic) if len(meas) >= 3 else float("nan")
    w = int(np.argmin(meas))
    others = np.delete(meas, w)
    pruned = bool(others.size and not (pred[w] <= factor * others.min()))
    return rho, pruned, int(np.sum(~(pred <= factor * meas.min())))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=str(REPO / "results" / "h200-2026-11-29"))  # the committed H200 run
    ap.add_argument("--factor", type=float, default=cost.DEFAULT_PRUNE_FACTOR)
    ap.add_argument("--profiles", choices=("relower", "stored"), default="relower")
    ap.add_argument("--no-fit", action="store_true", help="skip the fitted columns (fast)")
    ap.add_argument("--fit", default="calibrated",
                    help="constants to fit: 'calibrated' (what `stitchtune calibrate` fits: "
                         "calibrate.CALIBRATED), 'all' (calibrate.FITTED) or a comma list; "
                         "time_scale is always fitted")
    ap.add_argument("--csv", help="also write the table here")
    ap.add_argument("-v", action="store_true")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.v else logging.WARNING, format="%(message)s")

    df = read_db(a.db)
    rows = calibrate.measured_rows(df)
    keys = sorted(rows["device_key"].unique())
    if len(keys) != 1:
        raise SystemExit(f"expected rows of one device, got {keys}")
    device = get_device(rows["device_name"].iloc[0])
    if device.key != keys[0]:
        raise SystemExit(f"no preset with key {keys[0]}")
    rows = rows.copy()
    fallback = 0
    if a.profiles == "relower":
        rows["profile_json"], fallback = relowered_profiles(rows, device)
    else:
        rows = rows[rows["profile_json"].notna()]
    rows = rows.reset_index(drop=True)
    workloads = sorted(rows["graph_name"].unique())
    meas = rows["measured_us"].astype(float).to_numpy()
    default = cost.default_params(device)
    names = {"calibrated": calibrate.CALIBRATED, "all": calibrate.FITTED}.get(
        a.fit, tuple(x for x in a.fit.split(",") if x))

    pred_default = repredict(rows, device, default)
    pred_all = fit_all = None
    lowo = np.full(len(rows), np.nan)
    lowo_params: dict[str, cost.CostParams] = {}
    if not a.no_fit:
        fit_all = calibrate.fit(rows, device, base=default, names=names)
        pred_all = repredict(rows, device, fit_all)
        for wl in workloads:
            train = rows[rows["graph_name"] != wl]
            p = calibrate.fit(train, device, base=default, names=names)
            lowo_params[wl] = p
            m = (rows["graph_name"] == wl).to_numpy()
            lowo[m] = repredict(rows[m], device, p)

    table = []
    for wl in workloads:
        m = (rows["graph_name"] == wl).to_numpy()
        mm = meas[m]
        rec = {"workload": wl, "n": int(m.sum())}
        rec["stored_rho"], rec["stored_pruned"], rec["stored_npr"] = rank_quality(mm, rows.loc[m, "predicted_us"].to_numpy(float), a.factor)
        # default params are on the model's own scale: give the rule the time scale fitted on the
        # other workloads when there is one (else 1)
        ts = lowo_params[wl].time_scale if wl in lowo_params else 1.0
        rec["default_rho"], rec["default_pruned"], rec["default_npr"] = rank_quality(mm, pred_default[m] * ts / default.time_scale, a.factor)
        if not a.no_fit:
            rec["infit_rho"], rec["infit_pruned"], rec["infit_npr"] = rank_quality(mm, pred_all[m], a.factor)
            rec["lowo_rho"], rec["lowo_pruned"], rec["lowo_npr"] = rank_quality(mm, lowo[m], a.factor)
        table.append(rec)
    t = pd.DataFrame(table)

    print(f"database {a.db}: {len(rows)} measured ok rows on {device.key}; profiles: {a.profiles}"
          + (f" ({fallback} rows fell back to the stored profile)" if fallback else ""))
    print("cell = Spearman(predicted, measured) / winner: PRUNE if the rule 'predicted > "
          f"{a.factor:g} x best measured' would drop the measured winner (worst order), else keep /"
          " pN: rows that rule would skip against the workload's best measured time")
    print("  stored  = predicted_us column written at search time")
    print("  default = current model, default constants (no constant fitted on any row; for pN the "
          "time_scale of the LOWO fit is applied)")
    if not a.no_fit:
        print(f"  fitted constants: {', '.join(names + ('time_scale',))}")
        print("  in-fit  = constants fitted on ALL rows (IN SAMPLE, for comparison only)")
        print("  LOWO    = constants fitted on the OTHER 4 workloads (HELD OUT)")
    hdr = f"{'workload':22s} {'n':>3s} {'stored':>15s} {'default':>15s}"
    if not a.no_fit:
        hdr += f" {'in-fit':>15s} {'LOWO(held)':>15s}"
    print(hdr)

    def cell(rho: float, pruned: bool, npr: int) -> str:
        return f"{rho:5.2f}/{'PRUNE' if pruned else 'keep'}/p{npr}"

    for r in t.itertuples(index=False):
        line = f"{r.workload:22s} {r.n:3d} {cell(r.stored_rho, r.stored_pruned, r.stored_npr):>15s} " \
               f"{cell(r.default_rho, r.default_pruned, r.default_npr):>15s}"
        if not a.no_fit:
            line += (f" {cell(r.infit_rho, r.infit_pruned, r.infit_npr):>15s}"
                     f" {cell(r.lowo_rho, r.lowo_pruned, r.lowo_npr):>15s}")
        print(line)
    cols = ["stored", "default"] + ([] if a.no_fit else ["infit", "lowo"])
    summ = "  ".join(f"{c}: min {t[c + '_rho'].min():.2f} mean {t[c + '_rho'].mean():.2f} "
                     f">=0.7 {int((t[c + '_rho'] >= 0.7).sum())}/{len(t)} winners pruned {int(t[c + '_pruned'].sum())}"
                     for c in cols)
    print(summ)
    def med_err(pred: np.ndarray) -> float:
        return float(np.median(np.abs(np.log(pred / meas))))

    errs = [("stored", rows["predicted_us"].to_numpy(float)), ("default", pred_default)]
    if not a.no_fit:
        errs += [("in-fit", pred_all), ("LOWO", lowo)]
    print("median |log(predicted / measured)| over all rows (absolute scale, not rank): "
          + "  ".join(f"{n}: {med_err(p):.3f} (x{math.exp(med_err(p)):.2f})" for n, p in errs))
    if not a.no_fit:
        print("fitted on all rows (in sample): " + ", ".join(
            f"{f}={getattr(fit_all, f):.4g}" for f in names + ("time_scale",)))
        for wl, p in lowo_params.items():
            print(f"  LOWO without {wl}: " + ", ".join(
                f"{f}={getattr(p, f):.4g}" for f in names + ("time_scale",)))
    if a.csv:
        t.to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
