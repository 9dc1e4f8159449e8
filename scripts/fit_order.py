"""Does the fitted cost model order each database workload's heuristic and best measured schedules? Variants judged
by the nested leave-one-model-out score.

    python scripts/fit_order.py [--dataset results/cost-fit-2026-12-07-s14-unroll/dataset-tasks.json] [--out DIR]
                                [--variants 0,1,2] [--no-nested] [--name order]

Everything here is a PREDICTION from the committed H200 measurements (nothing is measured anew). Per variant
(:data:`VARIANTS`: coefficients fixed, optional terms fitted, bounds changed; the shipped model is variant 0):

* leave-one-model-out (LOMO) within ±25% pre-build (IR walk) and post-build (the same held-out coefficients with the
  SASS bytes in flight), per group;
* **heuristic vs best**: per database workload, the heuristic (trial 0) and the best measured schedule, held out,
  pre- and post-build: ordered as measured? (a workload whose heuristic row was never measured says so: colsum's
  trial 0 was pruned after its build);
* pairs of one workload's schedules measured more than 10% apart, ordered as measured (held out, pre-build);
* the rows that cross the ±25% edge against variant 0 (held out, pre-build), with their q = predicted / measured;
* the **nested** score: per held-out group, the variant with the best LOMO score (pre-build within ±25%, then ρ)
  on the other groups only, its held-out prediction of the group (as ``scripts/fit_terms.py``); with ``--variants
  0,N`` the choice between the shipped model and N alone.

The dataset default is s14-unroll's ``dataset-tasks.json``: the s13-walk rows (the shipped fit's) with the walk's
``task_trips`` added, which only ``reuse_tasks`` reads (variant 0 scores as shipped: 112 / 110).

Writes ``<out>/<name>.md`` (also printed) and ``<out>/<name>.json``.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from fit_cost_model import pair_order  # noqa: E402
from fit_study import (command, lomo, nested_choice, nested_predictions, open_study, per_group,  # noqa: E402
                       within, within_text, write_report)

from stitchtune.cost import fitted  # noqa: E402
from stitchtune.cost.fitted import Coefficients  # noqa: E402
from stitchtune.cost.fitting import FITTED, fit_coefficients, score  # noqa: E402

DATASET = "results/cost-fit-2026-12-07-s14-unroll/dataset-tasks.json"


@dataclasses.dataclass(frozen=True)
class Variant:
    """A model variant: coefficients fixed (not fitted), optional terms fitted beyond FITTED (each starts at
    ``FIT_START``'s value), and bounds that replace :data:`~stitchtune.cost.fitted.FIT_BOUNDS`' for some names."""

    name: str
    fixed: Mapping[str, float] = dataclasses.field(default_factory=dict)
    extra: tuple[str, ...] = ()
    bounds: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    exposed_of: str = "issue"   # stitchtune.cost.fitted.EXPOSED_OF while this variant is fitted and predicted


#: the variants (results/cost-fit-2026-12-07-s15-order/README.md says why each)
VARIANTS: tuple[Variant, ...] = (
    Variant("shipped"),
    Variant("+ exposed issue / tasks (overlap_warps)", extra=("overlap_warps",)),
    Variant("+ exposed issue, tasks not counted", fixed={"overlap_tasks": 0.0}, extra=("overlap_warps",)),
    Variant("+ exposed chain / tasks", extra=("overlap_warps",), exposed_of="chain"),
    Variant("+ exposed chain, tasks not counted", fixed={"overlap_tasks": 0.0}, extra=("overlap_warps",),
            exposed_of="chain"),
    Variant("+ exposed issue + chain / tasks", extra=("overlap_warps",), exposed_of="issue+chain"),
    Variant("+ exposed issue + chain, tasks not counted", fixed={"overlap_tasks": 0.0}, extra=("overlap_warps",),
            exposed_of="issue+chain"),
    Variant("+ exposed issue / tasks, phases / tasks", fixed={"phase_tasks": 1.0}, extra=("overlap_warps",)),
    Variant("phases / tasks", fixed={"phase_tasks": 1.0}),
    Variant("window in tasks (reuse_tasks 1)", fixed={"reuse_tasks": 1.0}),
    Variant("window in tasks + SM in flight", fixed={"reuse_tasks": 1.0}, extra=("sm_inflight_kib",)),
    Variant("window in tasks + L2 latency", fixed={"reuse_tasks": 1.0}, extra=("l2_latency_ns",)),
    Variant("window in tasks + L2 latency + SM in flight", fixed={"reuse_tasks": 1.0},
            extra=("l2_latency_ns", "sm_inflight_kib")),
    Variant("+ L2 latency (window of blocks)", extra=("l2_latency_ns",)),
    Variant("s14 variant 4 (SM in flight + loaded latency)", extra=("sm_inflight_kib", "loaded_latency")),
    Variant("s14 variant 4, latency free (>= 10 ns)", extra=("sm_inflight_kib", "loaded_latency"),
            bounds={"dram_latency_ns": (10.0, 5000.0)}),
    Variant("s14 variant 4, latency 670 ns (st_xsum's)", fixed={"dram_latency_ns": 670.0},
            extra=("sm_inflight_kib", "loaded_latency")),
    Variant("shipped, latency free (>= 10 ns)", bounds={"dram_latency_ns": (10.0, 5000.0)}),
    Variant("s14 variant 4, latency >= 400 ns", extra=("sm_inflight_kib", "loaded_latency"),
            bounds={"dram_latency_ns": (400.0, 5000.0)}),
    Variant("shipped, latency >= 400 ns", bounds={"dram_latency_ns": (400.0, 5000.0)}),
    Variant("+ exposed issue / tasks, latency >= 400 ns", extra=("overlap_warps",),
            bounds={"dram_latency_ns": (400.0, 5000.0)}),
    Variant("s14 variant 4 + exposed issue / tasks + phases / tasks", fixed={"phase_tasks": 1.0},
            extra=("sm_inflight_kib", "loaded_latency", "overlap_warps")),
)


def use(v: int) -> None:
    """Variant ``v``'s form of the exposed term (:data:`stitchtune.cost.fitted.EXPOSED_OF`), for the fits and
    predictions that follow; call before each variant's."""
    fitted.EXPOSED_OF = VARIANTS[v].exposed_of


def fit_variant(rows: list[dict[str, Any]], dev: Any, v: int) -> Coefficients:
    """Variant ``v``'s coefficients fitted to ``rows`` (pre-build features)."""
    var = VARIANTS[v]
    base = dataclasses.replace(Coefficients.defaults(dev), **dict(var.fixed))
    return fit_coefficients(rows, dev, base, names=[n for n in FITTED if n not in var.fixed] + list(var.extra),
                            bounds=dict(var.bounds))


def heuristic_vs_best(rows: list[dict[str, Any]], pred: Any) -> list[dict[str, Any]]:
    """Per database workload: the heuristic's and the best measured schedule's measured and predicted times,
    ``ordered`` (None where the heuristic was never measured or is the best)."""
    out = []
    for wl in sorted({r["workload"] for r in rows if r["group"].startswith("db:")}):
        idx = [i for i, r in enumerate(rows) if r["workload"] == wl and r["group"].startswith("db:")]
        heur = [i for i in idx if rows[i]["heuristic"]]
        best = min(idx, key=lambda i: rows[i]["measured_us"])
        item: dict[str, Any] = {"workload": wl, "ordered": None}
        if not heur:
            item["note"] = "no measured heuristic row"
        elif heur[0] == best:
            item["note"] = "heuristic is the best measured"
        else:
            h = heur[0]
            item.update(heuristic=[rows[h]["measured_us"], float(pred[h])], best=[rows[best]["measured_us"],
                                                                                 float(pred[best])],
                        ordered=bool((pred[h] > pred[best]) == (rows[h]["measured_us"] > rows[best]["measured_us"])))
        out.append(item)
    return out


def _order_cell(items: list[dict[str, Any]], wl: str) -> str:
    it = next(x for x in items if x["workload"] == wl)
    if it["ordered"] is None:
        return it["note"]
    (hm, hp), (bm, bp) = it["heuristic"], it["best"]
    return f"{'ok' if it['ordered'] else 'WRONG'} ({hp:.1f} vs {bp:.1f})"


def main(argv: list[str] | None = None) -> int:
    """Run the study (module docstring); :data:`stitchtune.cost.fitted.EXPOSED_OF` is as before afterwards."""
    before = fitted.EXPOSED_OF
    try:
        return _main(argv)
    finally:
        fitted.EXPOSED_OF = before


def _main(argv: list[str] | None) -> int:
    study = open_study("fit_order", __doc__, argv, fit_variant, dataset=DATASET, out="results/cost-fit-2026-12-07-s15-order",
                       variants=len(VARIANTS), name="order")
    if study is None:
        return 2
    a, vs, fits = study.args, study.vs, study.fits
    rows, pre, groups, gs, m = study.data.rows, study.data.pre, study.data.groups, study.data.gs, study.data.m
    cmd = command("fit_order", argv)
    wls = sorted({r["workload"] for r in rows if r["group"].startswith("db:")})
    lines = [f"# Heuristic vs best, and model variants, nested leave-one-model-out ({len(rows)} measured H200 rows)",
             "", f"    {cmd}", "", "Measured: the committed H200 times. Every other figure is PREDICTED, held out "
             "(each group by a fit without it).", "",
             "| # | variant | pre-build ±25% | ρ | post-build ±25% | ρ | " + " | ".join(g.replace("db:", "")
                                                                                  + " pre / post" for g in groups)
             + " | coefficients (all rows) |", "|---|---|---|---|---|---|" + "---|" * len(groups) + "---|"]
    order_lines = ["", "## Heuristic vs best measured schedule, held out (pre-build; post-build): predicted heuristic "
                   "vs best, us", "", "| # | " + " | ".join(wls) + " |", "|---|" + "---|" * len(wls)]
    pair_lines = ["", "## Pairs of one workload's schedules measured more than 10% apart, ordered right (held out, "
                  "pre-build)", "", "| # | " + " | ".join(wls) + " |", "|---|" + "---|" * len(wls)]
    out: dict[str, Any] = {"dataset": a.dataset, "variants": {}}
    held: dict[int, Any] = {}
    for v in vs:
        var = VARIANTS[v]
        use(v)
        ho, hoc = lomo(fits, v, pre, groups), lomo(fits, v, rows, groups)
        held[v] = (ho, hoc)
        s, sc = score(m, ho), score(m, hoc)
        full = fits(v, frozenset())
        shown = {n: getattr(full, n) for n in ("bw_efficiency", "dram_latency_ns", "inflight_reg_share", "round_ns",
                                                "phase_us", *var.extra)}
        per = per_group(m, gs, groups, ho, hoc)
        hb_pre, hb_post = heuristic_vs_best(rows, ho), heuristic_vs_best(rows, hoc)
        keyed = [{**r, "p": float(ho[i])} for i, r in enumerate(rows)]
        pairs = pair_order(keyed, "p")
        out["variants"][var.name] = {"pre": s, "post": sc, "per_group": per, "all_rows": full.to_dict(),
                                     "heldout_pre": ho.tolist(), "heldout_post": hoc.tolist(),
                                     "heuristic_vs_best_pre": hb_pre, "heuristic_vs_best_post": hb_post,
                                     "pairs_pre": pairs}
        lines.append(f"| {v} | {var.name} | {within_text(m, ho, s)} | {s['spearman']:.3f} | "
                     f"{within_text(m, hoc, sc)} | {sc['spearman']:.3f} | "
                     + " | ".join(f"{per[g][0]:.0%} / {per[g][1]:.0%}" for g in groups) + " | "
                     + ", ".join(f"{k} {x:.4g}" for k, x in shown.items()) + " |")
        order_lines.append(f"| {v} | " + " | ".join(f"{_order_cell(hb_pre, w)}; {_order_cell(hb_post, w)}"
                                                     for w in wls) + " |")
        pair_lines.append(f"| {v} | " + " | ".join(f"{ok}/{n}" for _, n, ok in pairs) + " |")
        print(lines[-1], flush=True)
    moved = ["", "## Rows that cross the ±25% edge against variant 0 (held out, pre-build; q = predicted / measured)",
             "", "| # | gained | lost |", "|---|---|---|"]
    if 0 in held:
        base = within(m, held[0][0])
        for v in vs:
            if v == 0:
                continue
            now = within(m, held[v][0])

            def cell(idx: Any, v: int = v) -> str:
                return "; ".join(f"{rows[i]['label'][:34]} {held[0][0][i] / m[i]:.2f} -> {held[v][0][i] / m[i]:.2f}"
                                 for i in np.flatnonzero(idx)) or "-"
            moved.append(f"| {v} | {cell(now & ~base)} | {cell(base & ~now)} |")
    lines += order_lines + pair_lines + (moved if 0 in held and len(vs) > 1 else [])
    if not a.no_nested:
        chosen = nested_choice(fits, pre, groups, m, vs, prepare=use)
        nested, nested_post = nested_predictions(chosen, held, gs)
        s, sp = score(m, nested), score(m, nested_post)
        per = per_group(m, gs, groups, nested, nested_post)
        hb = heuristic_vs_best(rows, nested)
        out["nested"] = {"pre": s, "post": sp, "chosen": {g: VARIANTS[v].name for g, v in chosen.items()},
                         "per_group": per, "heuristic_vs_best_pre": hb}
        lines += ["", f"## Nested choice among variants {', '.join(str(v) for v in vs)}", "",
                  f"nested within ±25%: pre-build **{within_text(m, nested, s)}**, ρ "
                  f"{s['spearman']:.3f}; post-build (the chosen variant's held-out coefficients, SASS bytes) "
                  f"{within_text(m, nested_post, sp)}; heuristic vs best (pre-build): "
                  + ", ".join(f"{w} {_order_cell(hb, w)}" for w in wls), "",
                  "| group | chosen | pre | post |", "|---|---|---|---|"]
        lines += [f"| {g} | {chosen[g]} | {per[g][0]:.0%} | {per[g][1]:.0%} |" for g in groups]
    write_report(a.out, a.name, "\n".join(lines) + "\n", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
