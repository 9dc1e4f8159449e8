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

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from fit_ceiling import lomo  # noqa: E402  (the same held-out predictions, any callable fits)
from fit_cost_model import ir_only, pair_order  # noqa: E402

from stitchtune.cost.fit_dataset import DatasetError, load_dataset, with_timing  # noqa: E402
from stitchtune.cost import fitted  # noqa: E402
from stitchtune.cost.fitted import Coefficients  # noqa: E402
from stitchtune.cost.fitting import FITTED, TOLERANCE, fit_coefficients, score  # noqa: E402
from stitchtune.hardware.device import get_device  # noqa: E402

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


class Fits:
    """Fits cached by (variant, groups left out)."""

    def __init__(self, rows: list[dict[str, Any]], dev: Any) -> None:
        self.rows, self.dev, self.cache = rows, dev, {}

    def __call__(self, v: int, out: frozenset[str]) -> Coefficients:
        key = (v, out)
        if key not in self.cache:
            self.cache[key] = fit_variant([r for r in self.rows if r["group"] not in out], self.dev, v)
        return self.cache[key]


def within(m: Any, p: Any) -> Any:
    return np.abs(p / m - 1) <= TOLERANCE


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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=DATASET)
    ap.add_argument("--out", default="results/cost-fit-2026-12-07-s15-order")
    ap.add_argument("--variants", default=",".join(str(i) for i in range(len(VARIANTS))))
    ap.add_argument("--no-nested", action="store_true")
    ap.add_argument("--name", default="order", help="output file stem: <out>/<name>.md and .json")
    a = ap.parse_args(argv)
    dev = get_device("h200")
    try:
        vs = [int(x) for x in a.variants.split(",")]
        if not vs or not all(0 <= v < len(VARIANTS) for v in vs):
            raise ValueError
    except ValueError:
        print(f"fit_order: error: --variants: comma-separated numbers of 0..{len(VARIANTS) - 1}", file=sys.stderr)
        return 2
    try:
        stored = load_dataset(REPO / a.dataset, dev.key)
    except DatasetError as exc:
        print(f"fit_order: error: {exc}", file=sys.stderr)
        return 2
    rows = with_timing([dict(r) for r in stored.rows])
    pre = ir_only(rows)
    groups = sorted({r["group"] for r in rows})
    gs = np.array([r["group"] for r in rows])
    m = np.array([r["measured_us"] for r in rows])
    fits = Fits(pre, dev)
    cmd = " ".join(["python scripts/fit_order.py", *(argv if argv is not None else sys.argv[1:])])
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
        per = {g: (float(np.mean(within(m[gs == g], ho[gs == g]))), float(np.mean(within(m[gs == g], hoc[gs == g]))))
               for g in groups}
        hb_pre, hb_post = heuristic_vs_best(rows, ho), heuristic_vs_best(rows, hoc)
        keyed = [{**r, "p": float(ho[i])} for i, r in enumerate(rows)]
        pairs = pair_order(keyed, "p")
        out["variants"][var.name] = {"pre": s, "post": sc, "per_group": per, "all_rows": full.to_dict(),
                                     "heldout_pre": ho.tolist(), "heldout_post": hoc.tolist(),
                                     "heuristic_vs_best_pre": hb_pre, "heuristic_vs_best_post": hb_post,
                                     "pairs_pre": pairs}
        lines.append(f"| {v} | {var.name} | {s['within25']:.1%} ({int(within(m, ho).sum())}) | {s['spearman']:.3f} | "
                     f"{sc['within25']:.1%} ({int(within(m, hoc).sum())}) | {sc['spearman']:.3f} | "
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
        nested, nested_post = np.full(len(rows), np.nan), np.full(len(rows), np.nan)
        chosen = {}
        for g in groups:
            others = [x for x in groups if x != g]
            sub = [i for i in range(len(rows)) if gs[i] != g]
            best = None
            for v in vs:
                use(v)
                p = lomo(fits, v, [pre[i] for i in sub], others, skip=frozenset({g}))
                sc_ = score(m[sub], p)
                key = (sc_["within25"], sc_["spearman"])
                if best is None or key > best[0]:
                    best = (key, v)
            assert best is not None
            chosen[g] = best[1]
            idx = gs == g
            nested[idx] = held[best[1]][0][idx]
            nested_post[idx] = held[best[1]][1][idx]
        s, sp = score(m, nested), score(m, nested_post)
        per = {g: (float(np.mean(within(m[gs == g], nested[gs == g]))),
                   float(np.mean(within(m[gs == g], nested_post[gs == g])))) for g in groups}
        hb = heuristic_vs_best(rows, nested)
        out["nested"] = {"pre": s, "post": sp, "chosen": {g: VARIANTS[v].name for g, v in chosen.items()},
                         "per_group": per, "heuristic_vs_best_pre": hb}
        lines += ["", f"## Nested choice among variants {', '.join(str(v) for v in vs)}", "",
                  f"nested within ±25%: pre-build **{s['within25']:.1%} ({int(within(m, nested).sum())})**, ρ "
                  f"{s['spearman']:.3f}; post-build (the chosen variant's held-out coefficients, SASS bytes) "
                  f"{sp['within25']:.1%} ({int(within(m, nested_post).sum())}); heuristic vs best (pre-build): "
                  + ", ".join(f"{w} {_order_cell(hb, w)}" for w in wls), "",
                  "| group | chosen | pre | post |", "|---|---|---|---|"]
        lines += [f"| {g} | {chosen[g]} | {per[g][0]:.0%} | {per[g][1]:.0%} |" for g in groups]
    text = "\n".join(lines) + "\n"
    print(text)
    o = REPO / a.out
    o.mkdir(parents=True, exist_ok=True)
    (o / f"{a.name}.md").write_text(text)
    (o / f"{a.name}.json").write_text(json.dumps(out, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
