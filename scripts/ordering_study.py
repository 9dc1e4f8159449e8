"""Does the fitted cost model order each database workload's heuristic and tuned schedules as measured, held out?

    python scripts/ordering_study.py [--dataset results/cost-fit-2026-12-07-s13-walk/dataset.json] [--out FILE]

Data: the measured rows of the cost fit's dataset (results/cost-fit-2026-12-07-s12: the committed H200 database
results/h200-2026-11-29 and BERT's traces, the features of the very kernels measured) and, for each database row,
its 20 timed samples from the database (``samples_us``: whether a measured gap is more than noise, a one-sided
Mann-Whitney U test). Protocol: leave-one-model-out (7 groups), fitted on the IR features as the shipped model is
(``scripts/fit_cost_model.py``); "pre-build" predicts from the IR features, "post-build" with the measured
kernels' compiled facts (what the search's after-build prediction reads).

Variants (the model's form is cost/fitted.py's; these are patched in here only, to ask whether a cheap physical
term orders the pairs the shipped form gets wrong; choosing among them on these same held-out figures would make
them optimistic):

* ``shipped``: the model as it is.
* ``event/program``: a program timed with CUDA events pays the event term once, not once per launch (the launches
  after the first are queued while the first runs, so their start is hidden).
* ``smooth body``: the launch's body is a smooth maximum (p = 4) of its memory, issue, blocks, chain and L2-request
  limits instead of the hard maximum (two limits close to each other do not overlap perfectly).
* ``both``.
* ``shipped, fitted on compiled facts``: the shipped form fitted on the measured kernels' compiled facts (what
  ``stitchtune calibrate`` now does when every row of a database has them), judged the same way.

Measured = H200 (committed data); every other figure is PREDICTED.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import numpy as np  # noqa: E402

from fit_cost_model import DATASET, DB, ir_only  # noqa: E402

from stitchtune.cost import fitted, fitting  # noqa: E402
from stitchtune.cost.fit_dataset import DatasetError, load_dataset, with_timing  # noqa: E402
from stitchtune.cost.fitted import Coefficients  # noqa: E402
from stitchtune.hardware.device import get_device  # noqa: E402

SMOOTH_P = 4.0
_TERMS = fitted.kernel_terms_us
_STACK_INIT = fitting._Stack.__init__


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """The model patched as ``name`` says (module docstring) while the block runs."""
    smooth = name in ("smooth body", "both")
    per_program = name in ("event/program", "both")

    def terms(f: Any, device: Any, c: Any) -> dict[str, Any]:
        t = _TERMS(f, device, c)
        if smooth:
            parts = [np.maximum(np.asarray(t[k], dtype=float), 1e-9)
                     for k in ("memory", "issue", "blocks", "chain", "l2_requests")]
            t["body"] = sum(p ** SMOOTH_P for p in parts) ** (1.0 / SMOOTH_P)
        return t

    def init(self: Any, rows: Any) -> None:
        _STACK_INIT(self, rows)
        if per_program:
            self.event_launches = np.minimum(self.event_launches, 1.0)

    fitted.kernel_terms_us = terms  # type: ignore[assignment]
    fitting._Stack.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        fitted.kernel_terms_us = _TERMS  # type: ignore[assignment]
        fitting._Stack.__init__ = _STACK_INIT  # type: ignore[method-assign]


def samples_by_label() -> dict[str, list[float]]:
    """``"<graph> <schedule key[:16]>"`` (the dataset's db label) -> the row's timed samples (us)."""
    from stitchtune.tune.database import read_db

    df = read_db(str(REPO / DB))
    out = {}
    for r in df[df["status"] == "ok"].to_dict("records"):
        if isinstance(r.get("samples_us"), str):
            out[f"{r['graph_name']} {str(r['schedule_key'])[:16]}"] = json.loads(r["samples_us"])
    return out


def held_out(rows: list[dict[str, Any]], dev: Any, on_compiled: bool = False) -> None:
    """Set ``pre`` / ``post`` (held-out predictions, IR / compiled) on every row, fitted leave-one-model-out on the IR
    features (as shipped) or, ``on_compiled``, on the compiled facts (``stitchtune calibrate --fit-on compiled``)."""
    fit_rows = ir_only(rows)
    base = Coefficients.defaults(dev)
    for g, c in fitting.leave_one_group_out(rows if on_compiled else fit_rows, dev, base).items():
        idx = [i for i, r in enumerate(rows) if r["group"] == g]
        pre = fitting.predict_rows([fit_rows[i] for i in idx], dev, c)
        post = fitting.predict_rows([rows[i] for i in idx], dev, c)
        for i, a, b in zip(idx, pre, post):
            rows[i]["pre"], rows[i]["post"] = float(a), float(b)


def significant(a: list[float], b: list[float], alpha: float = 0.01) -> bool:
    """Is ``a`` slower than ``b`` beyond noise (one-sided Mann-Whitney U, ``p < alpha``)?"""
    from scipy.stats import mannwhitneyu

    return bool(len(a) >= 5 and len(b) >= 5 and mannwhitneyu(a, b, alternative="greater").pvalue < alpha)


def _p(a: list[float], b: list[float]) -> float:
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(a, b, alternative="greater").pvalue) if len(a) >= 5 and len(b) >= 5 else float("nan")


def heuristic_pairs(rows: list[dict[str, Any]], samples: dict[str, list[float]], key: str) -> dict[str, Any]:
    """Per database workload with a measured heuristic: the heuristic against every other schedule whose measured
    time differs from it beyond noise (:func:`significant`), and how many of those ``key`` orders right."""
    out: dict[str, Any] = {}
    for wl in sorted({r["workload"] for r in rows if r["group"].startswith("db:")}):
        rs = [r for r in rows if r["workload"] == wl and r["group"].startswith("db:")]
        heur = [r for r in rs if r["heuristic"]]
        if not heur:
            out[wl] = None
            continue
        h, n, ok, near, near_ok = heur[0], 0, 0, 0, 0
        hs = samples.get(h["label"], [])
        for r in rs:
            if r is h:
                continue
            s = samples.get(r["label"], [])
            slower, faster = significant(hs, s), significant(s, hs)
            if not (slower or faster):
                continue
            right = (h[key] > r[key]) == slower
            n, ok = n + 1, ok + right
            if abs(h["measured_us"] / r["measured_us"] - 1) <= 0.10:
                near, near_ok = near + 1, near_ok + right
        best = min(rs, key=lambda r: r["measured_us"])
        bs = samples.get(best["label"], [])
        verdict = ("ok (the heuristic is the best)" if best is h
                   else f"tie (p = {_p(hs, bs):.3f})" if not significant(hs, bs)
                   else "ok" if h[key] > best[key] else "WRONG")
        out[wl] = {"pairs": n, "right": ok, "near": near, "near_right": near_ok, "heuristic": h, "best": best,
                   "verdict": verdict, "p": _p(hs, bs)}
    return out


def all_pairs(rows: list[dict[str, Any]], samples: dict[str, list[float]], key: str) -> tuple[int, int]:
    """Every pair of schedules of one database workload whose samples say which is faster (:func:`significant`):
    (pairs, ordered right by ``key``)."""
    n = ok = 0
    db = [r for r in rows if r["group"].startswith("db:")]
    for wl in {r["workload"] for r in db}:
        rs = [r for r in db if r["workload"] == wl]
        for i, a in enumerate(rs):
            for b in rs[i + 1:]:
                sa, sb = samples.get(a["label"], []), samples.get(b["label"], [])
                if significant(sa, sb):
                    n, ok = n + 1, ok + (a[key] > b[key])
                elif significant(sb, sa):
                    n, ok = n + 1, ok + (b[key] > a[key])
    return n, ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=DATASET)
    ap.add_argument("--device", default="h200")
    ap.add_argument("--out", default=None, help="also write the report there (markdown)")
    a = ap.parse_args(argv)
    dev = get_device(a.device)
    try:
        stored = load_dataset(REPO / a.dataset, dev.key)
    except DatasetError as exc:
        print(f"ordering_study: error: {exc}", file=sys.stderr)
        return 2
    samples = samples_by_label()
    cmd = " ".join(["python scripts/ordering_study.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [f"# Heuristic vs tuned schedules, held out ({len(stored.rows)} measured rows)", "", f"    {cmd}", "",
             "measured = H200 (committed database, CUDA events, 20 samples per row); every other figure is PREDICTED, "
             "leave-one-model-out. A pair counts when the samples say which is faster (one-sided Mann-Whitney U, "
             "p < 0.01).", "",
             "| variant | within ±25% pre / post | ρ pre / post | all pairs apart, right pre / post | "
             "heuristic vs significant others, right (pre) | "
             "within 10% of the heuristic (pre) | heuristic vs best: " + " / ".join(
                 ("layernorm", "layernorm_bf16", "layernorm_wide")) + " (pre; post) |",
             "|---|---|---|---|---|---|---|"]
    detail: list[str] = []
    for name in ("shipped", "event/program", "smooth body", "both", "shipped, fitted on compiled facts"):
        rows = with_timing([dict(r) for r in stored.rows])
        with variant(name):
            held_out(rows, dev, on_compiled=name.endswith("compiled facts"))
        m = [r["measured_us"] for r in rows]
        pre, post = (fitting.score(m, [r[k] for r in rows]) for k in ("pre", "post"))
        hp, hq = heuristic_pairs(rows, samples, "pre"), heuristic_pairs(rows, samples, "post")
        got = [v for v in hp.values() if v]
        pairs, right = sum(v["pairs"] for v in got), sum(v["right"] for v in got)
        near, near_ok = sum(v["near"] for v in got), sum(v["near_right"] for v in got)
        hb = " / ".join(f"{hp[w]['verdict']}; {hq[w]['verdict']}" for w in ("layernorm", "layernorm_bf16", "layernorm_wide"))
        (ap, ar), (_, aq) = all_pairs(rows, samples, "pre"), all_pairs(rows, samples, "post")
        lines.append(f"| {name} | {pre['within25']:.0%} / {post['within25']:.0%} | {pre['spearman']:.2f} / "
                     f"{post['spearman']:.2f} | {ar}/{ap} ({ar / max(ap, 1):.0%}) / {aq}/{ap} ({aq / max(ap, 1):.0%}) | {right}/{pairs} ({right / max(pairs, 1):.0%}) | {near_ok}/{near} | {hb} |")
        detail += [f"## {name}", ""]
        for wl, v in hp.items():
            if v is None:
                detail.append(f"- {wl}: no measured heuristic row (its trial 0 was pruned after the build)")
                continue
            h, b = v["heuristic"], v["best"]
            gap = "" if b is h else f" (heuristic slower: p = {v['p']:.2g})"
            detail.append(f"- {wl}: heuristic {h['measured_us']:.2f} measured, predicted {h['pre']:.2f} / "
                          f"{h['post']:.2f}; best {b['measured_us']:.2f} measured, predicted {b['pre']:.2f} / "
                          f"{b['post']:.2f}{gap}; significant pairs with the heuristic ordered right "
                          f"{v['right']}/{v['pairs']}")
        detail.append("")
    text = "\n".join(lines + [""] + detail)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
