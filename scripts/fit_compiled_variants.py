"""Compiled-code facts in the fitted cost model: variants compared leave-one-model-out, and chosen by a nested protocol.

    python scripts/fit_compiled_variants.py [--dataset results/cost-fit-2026-12-07-s13-walk/dataset.json] [--out FILE]

Variants (rows of the dataset written by ``scripts/sass_dataset.py``):

* ``IR walk only``: the compiled fields set to 0 (what the search's pre-build ranking sees);
* ``compiled, spills``: the SASS's bytes in flight per thread in place of the IR walk's, ``spill_ns`` fitted;
* ``compiled, no spill term``: the same, ``spill_instructions`` ignored (``spill_ns`` 0);
* ``... L2 requests``: the term of scratch-load requests at the L2's rate (``l2_request_ns`` fitted), else off;
* ``fitted on the IR walk ..., predicted with compiled bytes in flight``: the coefficients fitted without
  compiled facts (what ``stitchtune calibrate`` can fit from a user's database), the predictions made with
  them (what a post-build prediction from the cubin adds).

Two tables. **Per variant**: the held-out (leave-one-model-out) share within ±25% and Spearman's ρ;
choosing the best row of that table uses the held-out scores (optimistic). **Nested**: for each held-out
group, the variant is chosen by a leave-one-model-out run over the *other* groups only (share within
±25%, then ρ), fitted on those groups and used on the held-out one: no held-out score enters any choice.
Every predicted time is a PREDICTION; the measured times are the committed H200 data. Also printed, for
each variant that reads compiled facts: its held-out coefficients applied to the rows without them (the
pre-build prediction the search ranks with).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stitchtune.cost import fitting  # noqa: E402
from stitchtune.cost.fit_dataset import with_timing  # noqa: E402
from stitchtune.cost.fitted import FIT_BOUNDS, Coefficients  # noqa: E402
from stitchtune.hardware.device import get_device  # noqa: E402

COMPILED = ("compiled_bytes_in_flight", "spill_instructions")


def _zeroed(rows: list[dict[str, Any]], names: tuple[str, ...]) -> list[dict[str, Any]]:
    """``rows`` (a deep copy) with each kernel's fields ``names`` set to 0."""
    out = copy.deepcopy(rows)
    for r in out:
        for k in r["kernels"]:
            for f in names:
                k[f] = 0.0
    return out


def ir_only(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with the compiled fields set to 0 (what a prediction before the build sees)."""
    return _zeroed(rows, COMPILED)


def no_spills(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return _zeroed(rows, ("spill_instructions",))


def no_l2(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return _zeroed(rows, ("l2_requests",))


#: (label, rows transform for the fit, rows transform for the prediction, coefficients fixed (not fitted))
VARIANTS: list[tuple[str, Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
                     Callable[[list[dict[str, Any]]], list[dict[str, Any]]], dict[str, float]]] = [
    ("IR walk only (the s11 model)", lambda rows: no_l2(ir_only(rows)), lambda rows: no_l2(ir_only(rows)),
     {"spill_ns": 0.0, "l2_request_ns": 0.0}),
    ("IR walk + L2 requests", ir_only, ir_only, {"spill_ns": 0.0}),
    ("compiled, spills, L2 requests", lambda rows: rows, lambda rows: rows, {}),
    ("compiled, no spill term, L2 requests", no_spills, no_spills, {"spill_ns": 0.0}),
    ("compiled, spills, no L2 requests", no_l2, no_l2, {"l2_request_ns": 0.0}),
    ("fitted on the IR walk + L2 requests, predicted with compiled bytes in flight", ir_only, no_spills,
     {"spill_ns": 0.0}),
]
#: the variant whose coefficients the package ships (index into VARIANTS): fitted without compiled facts, so
#: ``stitchtune calibrate`` (IR features only) fits the same model; post-build predictions add the facts
SHIPPED = 5


def _fit(rows: list[dict[str, Any]], dev: Any, fixed: dict[str, float]) -> Coefficients:
    base = dataclasses.replace(Coefficients.defaults(dev), **fixed)
    # the shipped names and the spill term only: later optional terms (flush write-back, the s14 / s15 study terms)
    # are scored by their own scripts (each added to OPTIONAL_BOUNDS changed this script's fits silently before)
    names = tuple(n for n in (*FIT_BOUNDS, "spill_ns") if n not in fixed)
    return fitting.fit_coefficients(rows, dev, base, names=names)


def lomo(rows: list[dict[str, Any]], dev: Any, fixed: dict[str, float],
         predict_rows: list[dict[str, Any]] | None = None) -> tuple[list[float], dict[str, Coefficients]]:
    """Held-out predictions (in order) and the coefficients of each held-out group: fitted on ``rows``,
    predicting ``predict_rows`` (the same rows transformed for the prediction; default ``rows``)."""
    target = rows if predict_rows is None else predict_rows
    pred = [0.0] * len(rows)
    held = {}
    for g in sorted({r["group"] for r in rows}):
        held[g] = _fit([r for r in rows if r["group"] != g], dev, fixed)
        idx = [i for i, r in enumerate(rows) if r["group"] == g]
        for i, p in zip(idx, fitting.predict_rows([target[i] for i in idx], dev, held[g])):
            pred[i] = float(p)
    return pred, held


def _key(rows: list[dict[str, Any]], pred: list[float]) -> tuple[float, float]:
    s = fitting.score([r["measured_us"] for r in rows], pred)
    return s["within25"], s["spearman"]


def nested(rows: list[dict[str, Any]], dev: Any) -> tuple[list[float], dict[str, str]]:
    """Held-out predictions with the variant chosen on the other groups only (module docstring)."""
    pred = [0.0] * len(rows)
    chosen = {}
    for g in sorted({r["group"] for r in rows}):
        rest = [r for r in rows if r["group"] != g]
        best = max(range(len(VARIANTS)), key=lambda v: _key(rest, lomo(VARIANTS[v][1](rest), dev, VARIANTS[v][3],
                                                                       VARIANTS[v][2](rest))[0]))
        label, fit_tf, pred_tf, fixed = VARIANTS[best]
        chosen[g] = label
        c = _fit(fit_tf(rest), dev, fixed)
        idx = [i for i, r in enumerate(rows) if r["group"] == g]
        for i, p in zip(idx, fitting.predict_rows(pred_tf([rows[i] for i in idx]), dev, c)):
            pred[i] = float(p)
    return pred, chosen


def _row(label: str, rows: list[dict[str, Any]], pred: list[float], groups: list[str]) -> str:
    s = fitting.score([r["measured_us"] for r in rows], pred)
    per = []
    for g in groups:
        idx = [i for i, r in enumerate(rows) if r["group"] == g]
        per.append(fitting.score([rows[i]["measured_us"] for i in idx], [pred[i] for i in idx])["within25"])
    return f"| {label} | {s['within25']:.0%} | {s['spearman']:.3f} | " + " | ".join(f"{p:.0%}" for p in per) + " |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="results/cost-fit-2026-12-07-s13-walk/dataset.json")
    ap.add_argument("--device", default="h200")
    ap.add_argument("--out", help="also write the tables here (markdown)")
    a = ap.parse_args(argv)
    dev = get_device(a.device)
    rows = with_timing(json.loads((REPO / a.dataset).read_text())["rows"])
    groups = sorted({r["group"] for r in rows})
    head = "| variant | all ±25% | ρ | " + " | ".join(g.replace("db:", "") for g in groups) + " |"
    rule = "|---|---|---|" + "---|" * len(groups)
    lines = [f"# Compiled-code facts in the fitted model: leave-one-model-out ({len(rows)} H200 rows)", "",
             f"    python scripts/fit_compiled_variants.py --dataset {a.dataset}", "",
             "Share of rows whose held-out PREDICTED time is within ±25% of the measured one, and Spearman's ρ.", "",
             "## Per variant (choosing among these rows uses held-out scores: optimistic)", "", head, rule]
    pre = ir_only(rows)
    for i, (label, fit_tf, pred_tf, fixed) in enumerate(VARIANTS):
        pred, held = lomo(fit_tf(rows), dev, fixed, pred_tf(rows))
        lines.append(_row(("**shipped**: " if i == SHIPPED else "") + label, rows, pred, groups))
        print(lines[-1], file=sys.stderr, flush=True)
        if any(k.get("compiled_bytes_in_flight") for r in pred_tf(rows) for k in r["kernels"]):
            pp = [0.0] * len(rows)
            for g, c in held.items():
                idx = [j for j, r in enumerate(pre) if r["group"] == g]
                for j, p in zip(idx, fitting.predict_rows([pre[j] for j in idx], dev, c)):
                    pp[j] = float(p)
            lines.append(_row(f"{label}: the same coefficients, rows without compiled facts (pre-build)", pre, pp,
                              groups))
    lines += ["", "## Nested: the variant chosen per held-out group on the other groups only", "", head, rule]
    pred, chosen = nested(rows, dev)
    lines.append(_row("nested choice", rows, pred, groups))
    lines += ["", "Chosen per held-out group: " + "; ".join(f"{g}: {v}" for g, v in chosen.items())]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        (REPO / a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
