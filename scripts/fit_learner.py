"""How far the cost model's features can go: a flexible learner fitted leave-one-model-out on the same rows.

    python scripts/fit_learner.py [--dataset results/cost-fit-2026-12-07-s13-walk/dataset.json] [--out DIR]
                                  [--terms] [--name learner]

Analysis only (scikit-learn, the ``fit`` extra; never imported by the package). Everything here is a PREDICTION
from the committed H200 measurements (nothing is measured anew). Per row (one measured time, 1-3 launches) the
features are those :mod:`stitchtune.cost.fitted` sees (:class:`~stitchtune.cost.features.KernelFeatures`): the
launches' extensive counts summed (bytes, sectors, threads x ops, blocks), the intensive ones of the row's
largest launch (by unique bytes), the number of launches and the timing (events or CUPTI). Pre-build: the
compiled facts zeroed (as the shipped fit); post-build: with the SASS bytes in flight and spills.

Learners (fixed hyperparameters, never tuned on a held-out score), each fitted without the held-out group:

* ``gbr time``: ``GradientBoostingRegressor`` on log(measured us);
* ``gbr floor``: the same on log(measured / floor), floor = unique bytes at the copy bandwidth (trees cannot
  extrapolate a time, a ratio to the floor they may);
* ``hybrid``: the shipped model fitted without the held-out group (its coefficients), times
  exp(``GradientBoostingRegressor`` on log(measured / that model's prediction) of the other groups' rows): the
  residual the physical terms leave, learned.

For contrast (not a quality figure: every group is seen), the same learners in a random 5-fold split of the rows.
If a learner reaches ~90% within ±25% held out, the model's form is the limit; if not, the features are.
Also writes the shipped model's residual table: rows outside ±25% held out, tagged by what they share.

``--terms``: the physical model with the optional ``sm_inflight_kib`` and ``loaded_latency`` fitted too
(scripts/fit_terms.py's variant 4; default: the shipped model, both off). Writes ``<out>/<name>.md`` (also printed) and ``<out>/<name>.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from fit_study import command, load_rows, write_report  # noqa: E402

from stitchtune.cost.features import KernelFeatures  # noqa: E402
from stitchtune.cost.fitted import Coefficients, kernel_terms_us  # noqa: E402
from stitchtune.cost.fitting import FITTED, TOLERANCE, fit_coefficients, predict_rows, score  # noqa: E402
from stitchtune.hardware.device import get_device  # noqa: E402

DATASET = "results/cost-fit-2026-12-07-s13-walk/dataset.json"

FIELDS = {f.name for f in dataclasses.fields(KernelFeatures)}
#: summed over a row's launches (extensive); ``threads`` = grid x block
SUMMED = ("unique_bytes", "sector_bytes", "excess_sector_bytes", "grid")
#: per thread x threads, summed
PER_THREAD = ("float_ops", "divisions", "transcendentals", "atomics", "scratch_loads")
#: of the row's largest launch (intensive)
OWN = ("block", "registers", "blocks_per_sm", "occupancy", "waves", "active_lanes", "sector_factor",
       "bytes_in_flight_per_thread", "loads_in_flight", "chained_loads", "load_rounds", "serial_rounds", "barriers",
       "shuffles", "load_phases", "bank_conflict", "smem_bytes", "grid_barriers", "l2_requests",
       "compiled_bytes_in_flight", "spill_instructions")


def row_features(r: dict[str, Any]) -> list[float]:
    """The learner's feature vector of one row (see the module docstring)."""
    ks = r["kernels"]
    big = max(ks, key=lambda k: k["unique_bytes"])
    v = [np.log1p(sum(float(k[n]) for k in ks)) for n in SUMMED]
    v += [np.log1p(sum(float(k[n]) * k["grid"] * k["block"] for k in ks)) for n in PER_THREAD]
    v += [np.log1p(sum(float(k["smem_wavefronts"]) * k["grid"] for k in ks))]
    v += [float(big.get(n, 0.0)) for n in OWN]   # a field an older dataset lacks: its default, 0
    v += [float(len(ks)), 1.0 if r.get("timing") == "events" else 0.0]
    return v


def floor_us(r: dict[str, Any], dev: Any) -> float:
    return sum(float(k["unique_bytes"]) for k in r["kernels"]) / dev.effective_copy_bandwidth_gbs() / 1000.0


def _gbr() -> Any:
    from sklearn.ensemble import GradientBoostingRegressor

    return GradientBoostingRegressor(n_estimators=300, max_depth=3, learning_rate=0.05, subsample=0.8,
                                     min_samples_leaf=3, loss="huber", random_state=0)


def lomo_learner(X: Any, y: Any, groups: list[str], offset: Callable[[str], Any]) -> Any:
    """Held-out log predictions: per group g, a learner fitted on the other groups' ``y - offset(g)`` and added
    to ``offset(g)`` on g's rows (``offset(g)``: one log value per row)."""
    pred = np.full(len(y), np.nan)
    gs = np.array(groups)
    for g in sorted(set(groups)):
        off = offset(g)
        tr, te = gs != g, gs == g
        model = _gbr().fit(X[tr], y[tr] - off[tr])
        pred[te] = model.predict(X[te]) + off[te]
    return pred


def kfold_learner(X: Any, y: Any, offset: Any, folds: int = 5) -> Any:
    """Log predictions in a random ``folds``-fold split of the rows (groups seen: not leave-one-model-out)."""
    pred = np.full(len(y), np.nan)
    order = np.random.default_rng(0).permutation(len(y))
    for k in range(folds):
        te = np.zeros(len(y), bool)
        te[order[k::folds]] = True
        model = _gbr().fit(X[~te], y[~te] - offset[~te])
        pred[te] = model.predict(X[te]) + offset[te]
    return pred


def tags(r: dict[str, Any], dev: Any) -> list[str]:
    """What a row shares with others (for grouping its residual)."""
    k = max(r["kernels"], key=lambda k: k["unique_bytes"])
    out = []
    if k["grid"] < dev.sm_count * max(k["blocks_per_sm"], 1):
        out.append("under one wave")
    if k["grid"] < dev.sm_count:
        out.append("grid < SMs")
    if any(x["name"] == "st_xsum" for x in r["kernels"]) or r["label"].endswith("st_xsum"):
        out.append("st_xsum")
    if k["scratch_loads"] > 0 or k["grid_barriers"] > 0:
        out.append("partials / grid barrier")
    if r["group"].startswith("db:"):
        out.append(r["group"][3:])
    if k["excess_sector_bytes"] > 0:
        out.append("strided sectors")
    if r["measured_us"] < 5:
        out.append("under 5 us")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=DATASET)
    ap.add_argument("--out", default="results/cost-fit-2026-12-07-s14")
    ap.add_argument("--terms", action="store_true", help="fit the optional memory-parallelism terms too")
    ap.add_argument("--name", default="learner")
    a = ap.parse_args(argv)
    dev = get_device("h200")
    data = load_rows("fit_learner", a.dataset, dev)
    if data is None:
        return 2
    rows, pre, gnames, gs, m = data.rows, data.pre, data.groups, data.gs, data.m
    groups = [r["group"] for r in rows]
    y = np.log(m)
    floor = np.log(np.array([floor_us(r, dev) for r in rows]))
    names = [*FITTED, "sm_inflight_kib", "loaded_latency"] if a.terms else list(FITTED)
    base = Coefficients.defaults(dev)
    held = {g: fit_coefficients([r for r in pre if r["group"] != g], dev, base, names=names) for g in gnames}
    # the shipped model held out: each group's rows predicted by the fit without it; per fold, every row's
    # prediction by that fold's coefficients (the hybrid's offset)
    phys_pre = {g: np.log(predict_rows(pre, dev, held[g])) for g in gnames}
    phys_post = {g: np.log(predict_rows(rows, dev, held[g])) for g in gnames}
    ship_pre = np.exp(sum(np.where(gs == g, phys_pre[g], 0.0) for g in gnames))
    ship_post = np.exp(sum(np.where(gs == g, phys_post[g], 0.0) for g in gnames))
    zero = np.zeros(len(rows))
    res: dict[str, dict[str, Any]] = {("physical + terms" if a.terms else "physical (shipped)"): {"pre": ship_pre, "post": ship_post}}
    Xpre = np.array([row_features(r) for r in pre])
    Xpost = np.array([row_features(r) for r in rows])
    res["gbr time"] = {"pre": np.exp(lomo_learner(Xpre, y, groups, lambda g: zero)),
                       "post": np.exp(lomo_learner(Xpost, y, groups, lambda g: zero))}
    res["gbr floor"] = {"pre": np.exp(lomo_learner(Xpre, y, groups, lambda g: floor)),
                        "post": np.exp(lomo_learner(Xpost, y, groups, lambda g: floor))}
    res["hybrid"] = {"pre": np.exp(lomo_learner(Xpre, y, groups, lambda g: phys_pre[g])),
                     "post": np.exp(lomo_learner(Xpost, y, groups, lambda g: phys_post[g]))}

    kfold = {"gbr time, random 5-fold": np.exp(kfold_learner(Xpre, y, zero)),
             "gbr floor, random 5-fold": np.exp(kfold_learner(Xpre, y, floor))}
    cmd = command("fit_learner", argv)
    lines = [f"# How far the features go: learners leave-one-model-out ({len(rows)} measured H200 rows)", "",
             f"    {cmd}", "", "Measured: the committed H200 times. Every other time is PREDICTED, held out "
             "(leave-one-model-out: each group predicted by a fit that did not see it). Within ±25%, per group "
             "and all rows; pre-build (IR walk) / post-build (SASS bytes in flight).", "",
             "| learner | all pre | all post | ρ pre | " + " | ".join(g.replace("db:", "") for g in gnames) + " |",
             "|---|---|---|---|" + "---|" * len(gnames)]
    out: dict[str, Any] = {"learners": {}}
    for name, p in res.items():
        s, sp = score(m, p["pre"]), score(m, p["post"])
        per = {g: (float(np.mean(np.abs(p["pre"][gs == g] / m[gs == g] - 1) <= TOLERANCE)),
                   float(np.mean(np.abs(p["post"][gs == g] / m[gs == g] - 1) <= TOLERANCE))) for g in gnames}
        out["learners"][name] = {"pre": s, "post": sp, "per_group": per}
        lines.append(f"| {name} | {s['within25']:.1%} ({round(s['within25'] * len(m))}) | {sp['within25']:.1%} "
                     f"({round(sp['within25'] * len(m))}) | {s['spearman']:.3f} | "
                     + " | ".join(f"{per[g][0]:.0%} / {per[g][1]:.0%}" for g in gnames) + " |")

    lines += ["", "Random 5-fold (groups seen; not a quality figure), pre-build: " + "; ".join(
        f"{k} {score(m, p)['within25']:.1%} ({int((np.abs(p / m - 1) <= TOLERANCE).sum())})" for k, p in kfold.items())]
    lines += ["", "## The shipped model's residuals: rows outside ±25% held out (pre-build q / post-build q)", "",
              "q = PREDICTED / measured. Terms: the shipped coefficients fitted without the row's group, pre-build "
              "features, largest launch; 'gbr' = the hybrid learner's held-out q (pre-build).", "",
              "| group | row | tags | measured us | q pre | q post | q hybrid | grid x block | bps | waves | B/thr walk "
              "| B/thr SASS | rounds | serial | regs | limiting term |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    bad = [i for i in range(len(rows)) if abs(ship_pre[i] / m[i] - 1) > TOLERANCE or abs(ship_post[i] / m[i] - 1) > TOLERANCE]
    bad.sort(key=lambda i: (groups[i], -abs(np.log(ship_pre[i] / m[i]))))
    table, tally = [], {}
    for i in bad:
        r = rows[i]
        k = max(r["kernels"], key=lambda k: k["unique_bytes"])
        kp = next(x for x in pre[i]["kernels"] if x["unique_bytes"] == k["unique_bytes"])
        t = kernel_terms_us(KernelFeatures(**{n: v for n, v in kp.items() if n in FIELDS}), dev, held[groups[i]])
        lim = max(("memory", "issue", "blocks", "chain", "l2_requests"), key=lambda n: float(t[n]))
        tg = tags(r, dev)
        for x in tg:
            tally.setdefault(x, [0, 0])[0] += 1
        table.append({"label": r["label"], "group": r["group"], "tags": tg, "measured_us": m[i], "q_pre": ship_pre[i] / m[i],
                      "q_post": ship_post[i] / m[i], "q_hybrid": res["hybrid"]["pre"][i] / m[i], "limit": lim})
        lines.append(f"| {r['group'].replace('db:', '')} | {r['label'][-28:]} | {', '.join(tg)} | {m[i]:.1f} | "
                     f"{ship_pre[i] / m[i]:.2f} | {ship_post[i] / m[i]:.2f} | {res['hybrid']['pre'][i] / m[i]:.2f} | "
                     f"{k['grid']} x {k['block']}{' (+%d)' % (len(r['kernels']) - 1) if len(r['kernels']) > 1 else ''} | "
                     f"{k['blocks_per_sm']} | {k['waves']:.2f} | {k['bytes_in_flight_per_thread']:.0f} | "
                     f"{k.get('compiled_bytes_in_flight', 0):.0f} | {k.get('load_rounds', 0):.0f} | {k.get('serial_rounds', 0):.0f} | "
                     f"{k['registers']} | {lim} |")
    for i in range(len(rows)):
        for x in tags(rows[i], dev):
            tally.setdefault(x, [0, 0])[1] += 1
    lines += ["", "Tags: rows outside ±25% (pre or post) / all rows with the tag", "",
              "| tag | outside | all |", "|---|---|---|"]
    lines += [f"| {x} | {a_} | {b_} |" for x, (a_, b_) in sorted(tally.items(), key=lambda kv: -kv[1][0])]
    out["residuals"] = table
    write_report(a.out, a.name, "\n".join(lines) + "\n", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
