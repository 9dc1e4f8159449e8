"""Physical terms for what the fitted cost model's residuals show, judged by the nested leave-one-model-out score.

    python scripts/fit_terms.py [--dataset results/cost-fit-2026-12-07-s13-walk/dataset.json] [--out DIR]
                                [--variants 0,1,2] [--no-nested] [--name terms]

Everything here is a PREDICTION from the committed H200 measurements (nothing is measured anew). The terms
(:class:`stitchtune.cost.fitted.Coefficients`; 0 turns each off):

Both are optional (``OPTIONAL_BOUNDS``), off in the shipped fit (the verdict: results/cost-fit-2026-12-07-s14/README.md).

* ``sm_inflight_kib``: the bytes one SM's memory pipeline keeps in flight are bounded (miss queues); Little's
  law over ``min(grid, SMs)`` busy SMs, each at most this. A grid that does not fill the machine reaches the
  bandwidth of the SMs it runs on, however many bytes its threads hold: the memory parallelism the fitted register
  share (``inflight_reg_share``) stood in for on layernorm_wide's small grids.
* ``loaded_latency``: the DRAM latency rises with the bandwidth drawn, ``L0 x (1 + a x bw / copy)`` (queueing);
  Little's law solved for ``bw`` with it, so the ceiling ``bw_efficiency`` need not stand in for the latency of
  kernels with many bytes in flight.

Per variant (the shipped coefficients' names fitted but for the variant's fixed values):
leave-one-model-out within ±25% pre-build (IR walk) and post-build (the same held-out coefficients, SASS bytes in
flight), per group; then the **nested** score: per held-out group, the variant with the best leave-one-model-out
score (pre-build within ±25%, then ρ) on the other groups only, its held-out prediction of the group (no held-out
score enters a choice), as ``scripts/fit_ceiling.py``.

Writes ``<out>/<name>.md`` (also printed) and ``<out>/<name>.json`` (``--name``, default ``terms``).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from fit_study import (command, lomo, nested_choice, nested_predictions, open_study, per_group,  # noqa: E402
                       within_text, write_report)

from stitchtune.cost.fitted import Coefficients  # noqa: E402
from stitchtune.cost.fitting import FITTED, fit_coefficients, score  # noqa: E402

DATASET = "results/cost-fit-2026-12-07-s13-walk/dataset.json"

#: (name, optional terms fitted beyond FITTED (stitchtune.cost.fitted.OPTIONAL_BOUNDS; each starts at FIT_START's
#: value: sm_inflight_kib 32, loaded_latency 1.0), coefficients fixed (not fitted)). The shipped model is variant 0.
VARIANTS: tuple[tuple[str, tuple[str, ...], dict[str, float]], ...] = (
    ("shipped (both terms off)", (), {}),
    ("+ SM in flight", ("sm_inflight_kib",), {}),
    ("+ SM in flight, reg share 1", ("sm_inflight_kib",), {"inflight_reg_share": 1.0}),
    ("+ loaded latency", ("loaded_latency",), {}),
    ("+ SM in flight + loaded latency", ("sm_inflight_kib", "loaded_latency"), {}),
    ("+ both, reg share 1", ("sm_inflight_kib", "loaded_latency"), {"inflight_reg_share": 1.0}),
)


def fit_variant(rows: list[dict[str, Any]], dev: Any, v: int) -> Coefficients:
    """The variant ``v``'s coefficients fitted to ``rows`` (pre-build features)."""
    _, extra, fixed = VARIANTS[v]
    base = dataclasses.replace(Coefficients.defaults(dev), **fixed)
    return fit_coefficients(rows, dev, base, names=[n for n in FITTED if n not in fixed] + list(extra))


def main(argv: list[str] | None = None) -> int:
    """Run the study (module docstring); 0, or 2 after one ``fit_terms: error: ...`` line."""
    study = open_study("fit_terms", __doc__, argv, fit_variant, dataset=DATASET, out="results/cost-fit-2026-12-07-s14",
                       variants=len(VARIANTS), name="terms")
    if study is None:
        return 2
    a, vs, fits = study.args, study.vs, study.fits
    rows, pre, groups, gs, m = study.data.rows, study.data.pre, study.data.groups, study.data.gs, study.data.m
    cmd = command("fit_terms", argv)
    lines = [f"# Physical terms for the residuals, nested leave-one-model-out ({len(rows)} measured H200 rows)", "",
             f"    {cmd}", "", "Measured: the committed H200 times. Every other figure is PREDICTED, held out.", "",
             "| variant | pre-build ±25% | ρ | post-build ±25% | ρ | " + " | ".join(g.replace("db:", "") + " pre / post"
                                                                          for g in groups) + " | coefficients (all rows) |",
             "|---|---|---|---|---|" + "---|" * len(groups) + "---|"]
    out: dict[str, Any] = {"variants": {}}
    held: dict[int, Any] = {}
    for v in vs:
        name, _, fixed = VARIANTS[v]
        ho, hoc = lomo(fits, v, pre, groups), lomo(fits, v, rows, groups)
        held[v] = (ho, hoc)
        s, sc = score(m, ho), score(m, hoc)
        full = fits(v, frozenset())
        shown = {n: getattr(full, n) for n in ("bw_efficiency", "dram_latency_ns", "inflight_reg_share",
                                                  "sm_inflight_kib", "loaded_latency")}
        per = per_group(m, gs, groups, ho, hoc)
        out["variants"][name] = {"pre": s, "post": sc, "per_group": per, "all_rows": full.to_dict(),
                                 "heldout_pre": ho.tolist(), "heldout_post": hoc.tolist()}
        lines.append(f"| {name} | {within_text(m, ho, s)} | {s['spearman']:.3f} | "
                     f"{within_text(m, hoc, sc)} | {sc['spearman']:.3f} | "
                     + " | ".join(f"{per[g][0]:.0%} / {per[g][1]:.0%}" for g in groups) + " | "
                     + ", ".join(f"{k} {x:.4g}" for k, x in shown.items()) + " |")
        print(lines[-1], flush=True)
    if not a.no_nested:
        picked = nested_choice(fits, pre, groups, m, vs)
        nested, nested_post = nested_predictions(picked, held, gs)
        chosen = {g: VARIANTS[v][0] for g, v in picked.items()}
        s, sp = score(m, nested), score(m, nested_post)
        per = per_group(m, gs, groups, nested, nested_post)
        out["nested"] = {"pre": s, "post": sp, "chosen": chosen, "per_group": per}
        lines += ["", f"## Nested choice among variants {', '.join(VARIANTS[v][0] for v in vs)}", "",
                  f"nested within ±25%: pre-build **{within_text(m, nested, s)}**, ρ "
                  f"{s['spearman']:.3f}; post-build (the chosen variant's held-out coefficients, SASS bytes) "
                  f"{within_text(m, nested_post, sp)}", "",
                  "| group | chosen | pre | post |", "|---|---|---|---|"]
        lines += [f"| {g} | {chosen[g]} | {per[g][0]:.0%} | {per[g][1]:.0%} |" for g in groups]
    write_report(a.out, a.name, "\n".join(lines) + "\n", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
