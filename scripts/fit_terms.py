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

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from fit_ceiling import lomo  # noqa: E402  (the same held-out predictions, any callable fits)
from fit_cost_model import ir_only  # noqa: E402

from stitchtune.cost.fit_dataset import DatasetError, load_dataset, with_timing  # noqa: E402
from stitchtune.cost.fitted import Coefficients  # noqa: E402
from stitchtune.cost.fitting import FITTED, TOLERANCE, fit_coefficients, predict_rows, score  # noqa: E402
from stitchtune.hardware.device import get_device  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=DATASET)
    ap.add_argument("--out", default="results/cost-fit-2026-12-07-s14")
    ap.add_argument("--variants", default=",".join(str(i) for i in range(len(VARIANTS))))
    ap.add_argument("--no-nested", action="store_true")
    ap.add_argument("--name", default="terms", help="output file stem: <out>/<name>.md and .json")
    a = ap.parse_args(argv)
    dev = get_device("h200")
    try:
        vs = [int(x) for x in a.variants.split(",")]
        if not vs or not all(0 <= v < len(VARIANTS) for v in vs):
            raise ValueError
    except ValueError:
        print(f"fit_terms: error: --variants: comma-separated numbers of 0..{len(VARIANTS) - 1}", file=sys.stderr)
        return 2
    try:
        stored = load_dataset(REPO / a.dataset, dev.key)
    except DatasetError as exc:
        print(f"fit_terms: error: {exc}", file=sys.stderr)
        return 2
    rows = with_timing([dict(r) for r in stored.rows])
    pre = ir_only(rows)
    groups = sorted({r["group"] for r in rows})
    gs = np.array([r["group"] for r in rows])
    m = np.array([r["measured_us"] for r in rows])
    fits = Fits(pre, dev)
    cmd = " ".join(["python scripts/fit_terms.py", *(argv if argv is not None else sys.argv[1:])])
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
        per = {g: (float(np.mean(within(m[gs == g], ho[gs == g]))), float(np.mean(within(m[gs == g], hoc[gs == g]))))
               for g in groups}
        out["variants"][name] = {"pre": s, "post": sc, "per_group": per, "all_rows": full.to_dict(),
                                 "heldout_pre": ho.tolist(), "heldout_post": hoc.tolist()}
        lines.append(f"| {name} | {s['within25']:.1%} ({int(within(m, ho).sum())}) | {s['spearman']:.3f} | "
                     f"{sc['within25']:.1%} ({int(within(m, hoc).sum())}) | {sc['spearman']:.3f} | "
                     + " | ".join(f"{per[g][0]:.0%} / {per[g][1]:.0%}" for g in groups) + " | "
                     + ", ".join(f"{k} {x:.4g}" for k, x in shown.items()) + " |")
        print(lines[-1], flush=True)
    if not a.no_nested:
        nested, nested_post = np.full(len(rows), np.nan), np.full(len(rows), np.nan)
        chosen = {}
        for g in groups:
            others = [x for x in groups if x != g]
            sub = [i for i in range(len(rows)) if gs[i] != g]
            best = None
            for v in vs:
                p = lomo(fits, v, [pre[i] for i in sub], others, skip=frozenset({g}))
                sc_ = score(m[sub], p)
                key = (sc_["within25"], sc_["spearman"])
                if best is None or key > best[0]:
                    best = (key, v)
            assert best is not None
            chosen[g] = VARIANTS[best[1]][0]
            idx = gs == g
            nested[idx] = held[best[1]][0][idx]
            nested_post[idx] = held[best[1]][1][idx]
        s, sp = score(m, nested), score(m, nested_post)
        per = {g: (float(np.mean(within(m[gs == g], nested[gs == g]))),
                   float(np.mean(within(m[gs == g], nested_post[gs == g])))) for g in groups}
        out["nested"] = {"pre": s, "post": sp, "chosen": chosen, "per_group": per}
        lines += ["", f"## Nested choice among variants {', '.join(VARIANTS[v][0] for v in vs)}", "",
                  f"nested within ±25%: pre-build **{s['within25']:.1%} ({int(within(m, nested).sum())})**, ρ "
                  f"{s['spearman']:.3f}; post-build (the chosen variant's held-out coefficients, SASS bytes) "
                  f"{sp['within25']:.1%} ({int(within(m, nested_post).sum())})", "",
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
