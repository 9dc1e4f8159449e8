"""The L2 estimate checked on every committed in-model kernel time (H200), and its two parameters fitted held out.

    python scripts/check_l2_residency.py [--out results/l2-2026-12-07-s15] [--totals AUDIT_DIR]

Measured (results/h200-2026-12-04-models, nothing measured anew; every other time is PREDICTED):

A. **BERT inference, the same kernel twice** (``logs/tuned_run3.log``): each of the 8 workloads' tuned schedule
   timed standalone by the tuner (CUDA events, after an L2 flush: "best ... us (measured)") and inside the model step
   (the CUPTI trace of the tuned run, 18 occurrences, in graph order). Prediction of the in-model time:
   ``credited_us(standalone - event_us, ...)`` (event_us: the shipped coefficients' event start). No fitted cost
   model in between: the cleanest check of the L2 estimate alone.
B. **BERT training, ours** (the fit dataset's ``bert-train`` rows: 37 launches of ``gpu_models_run3.jsonl``): the
   fitted model's time with coefficients fitted **without** bert-train (pre-build: IR walk; post-build: SASS bytes in
   flight), as is and credited (the region's first launch, ``st_k0``, reads its inputs).
C. **BERT training, Inductor's kernels** matched to our regions (``fit_ceiling.TRACE_MATCH``, layer 0 forward,
   layer 1 backward): no prediction; our launch's bytes over Inductor's MEASURED time, and the estimate's DRAM bytes
   over it, against the copy bandwidth (a DRAM rate above it means the estimate leaves too much to DRAM). The
   fastest of them (all bytes over time) is the least ``stream_factor`` the grid offers: no kernel streams faster
   than the L2 lets it.

The estimate's parameters (policy, keep, stream_factor, accounting) are chosen on A, on B (pre-build) and on both by
the share within ±25% (then the median |log q|); each single-group choice is scored on the other group (held out).
``--totals AUDIT_DIR`` adds the model totals (the audit's fitted times of BERT, GPT-2 and Llama, inference and
train, credited under each choice) beside Inductor's MEASURED kernel time. ``--streaming mm,bmm`` tries a variant
(those ops' reads do not enter the cache).
The L2 state comes from our FX graph's order (Inductor's trace runs the same GEMMs in the same order around these
kernels). Writes ``<out>/check.md`` (also printed) and ``<out>/check.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from fit_ceiling import TRACE_MATCH  # noqa: E402
from fit_cost_model import _capture, ir_only  # noqa: E402

from stitchtune.analysis.l2_credit import L2Params, credited_us, l2_params, simulate_l2  # noqa: E402
from stitchtune.analysis.l2_residency import ACCOUNTINGS, POLICIES  # noqa: E402
from stitchtune.cost.fit_dataset import load_dataset, with_timing  # noqa: E402
from stitchtune.cost.fitted import Coefficients, package_coefficients  # noqa: E402
from stitchtune.cost.fitting import fit_coefficients, predict_rows  # noqa: E402
from stitchtune.hardware.device import get_device  # noqa: E402

DATASET = "results/cost-fit-2026-12-07-s13-walk/dataset.json"
RUN = REPO / "results/h200-2026-12-04-models"
KEEPS = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
STREAMS = (1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.5)


def gemm_models(tile: int) -> tuple[tuple[int, bool], ...]:
    """The GEMM traffic models tried (L2Params.gemm_tile, gemm_evict_first): one op / wave by wave of ``tile`` x
    ``tile`` output tiles, operands entering the L2 or read evict-first."""
    return ((0, False), (0, True), (tile, False), (tile, True))


def _trace(variant: str, mode: str) -> list[tuple[str, float]]:
    for line in open(RUN / ("logs/tuned_run3.log" if variant == "stitchtune-tuned" else "gpu_models_run3.jsonl")):
        if line.startswith("{") and '"trace"' in line:
            d = json.loads(line)
            if d.get("variant") == variant and d.get("mode") == mode and d.get("model") == "bert":
                return [(str(t[0]), float(t[1])) for t in d["trace"]]
    raise SystemExit(f"no {variant} {mode} trace in {RUN}")


def group_a(regions: list[Any]) -> list[dict[str, Any]]:
    """BERT inference: (region occurrence, standalone MEASURED us, in-model MEASURED us)."""
    log = (RUN / "logs/tuned_run3.log").read_text()
    best = {m[0]: float(m[1]) for m in re.findall(r"\] (region_\w+) x\d+ .*?-> best ([\d.]+) us \(measured\)", log)}
    ours = [t for t in _trace("stitchtune-tuned", "inference") if t[0].startswith("st_")]
    first: dict[str, str] = {}
    rows = []
    for r, (_, us) in zip(regions, ours, strict=True):
        name = first.setdefault(r.graph.workload_key(), r.name)
        rows.append({"region": r.name, "workload": name, "standalone_us": best[name], "in_model_us": us})
    return rows


def group_b(regions: list[Any], dev: Any) -> tuple[list[dict[str, Any]], Coefficients]:
    """BERT training, ours: per launch, MEASURED and the held-out fitted times (pre- and post-build)."""
    rows = list(with_timing([dict(r) for r in load_dataset(REPO / DATASET, dev.key).rows]))
    pre = ir_only(rows)
    held = fit_coefficients([r for r in pre if r["group"] != "bert-train"], dev, Coefficients.defaults(dev))
    names = {r.name for r in regions}
    out = []
    for r, p in zip(rows, pre):
        if r["group"] != "bert-train":
            continue
        region, kernel = r["label"].split("/")
        out.append({"region": region, "kernel": kernel, "in_model_us": r["measured_us"], "matched": region in names,
                    "bytes": float(r["kernels"][0]["unique_bytes"]),
                    "pre_us": float(predict_rows([p], dev, held)[0]), "post_us": float(predict_rows([r], dev, held)[0])})
    return out, held


def group_c(b: list[dict[str, Any]], train: dict[str, Any]) -> list[dict[str, Any]]:
    """BERT training, Inductor's kernels matched to our regions: MEASURED us and the bytes (our launch's unique
    bytes where the dataset has it, else the region's tensors: the softmax's 201 MB)."""
    ind = _trace("inductor", "train")
    mine = {r["region"]: r["bytes"] for r in b if r["kernel"] == "st_k0"}
    out = []
    for label, prefix, occ, _, ops in TRACE_MATCH:
        hits = [t for t in ind if t[0].startswith(prefix[:48])]
        region = label.split("/")[0]
        if len(hits) <= occ or region not in train:
            continue
        o = train[region]
        out.append({"region": region, "ops": ops, "us": hits[occ][1],
                    "bytes": mine.get(region, o.read_bytes + o.write_bytes)})
    return out


def _sim_key(mode: str, p: L2Params) -> tuple[Any, ...]:
    return (mode, p.policy, p.keep, p.gemm_tile, p.gemm_evict_first)


def totals(audit_dir: Path, sets: dict[str, L2Params], dev: Any, c: Coefficients,
           changes: tuple[str, str] | None = None) -> list[str]:
    """Per model and call, the audit's fitted and fitted-ideal sums credited under each parameter set (PREDICTED),
    beside Inductor's MEASURED kernel time: how much the verdict depends on the choice; with ``changes`` (two set
    labels), the regions whose credited time moves most from the first to the second."""
    from audit_models import inductor_measured

    lines = ["", f"## Model totals under each parameter set (PREDICTED; fitted times from {audit_dir}/<model>.json)", "",
             "| model | call | fitted us | " + " | ".join(f"fitted, L2: {k}" for k in sets) + " | Inductor MEASURED us |",
             "|---|---|---|" + "---|" * len(sets) + "---|"]
    notes: list[str] = []
    for model in ("bert", "gpt2", "llama"):
        path = audit_dir / f"{model}.json"
        if not path.exists():
            continue
        audits = {r["workload_key"]: r for r in json.loads(path.read_text())["regions"]}
        for call in ("inference", "train"):
            regions = _capture(model, call)
            fitted = sum(audits[r.graph.workload_key()]["fitted_us"] or 0.0 for r in regions
                         if r.graph.workload_key() in audits)
            cells = []
            per: dict[str, dict[str, tuple[float, float]]] = {}   # set -> region -> (saved MB, credited us)
            for label, p in sets.items():
                sim = simulate_l2(regions, dev, p)
                tot = 0.0
                for r in regions:
                    a = audits.get(r.graph.workload_key())
                    if a is None or r.name not in sim:
                        continue
                    saved = sim[r.name].saved(p.accounting)
                    t = credited_us(a["fitted_us"] or 0.0, a["unique_bytes"], [saved], dev, c, p)
                    per.setdefault(label, {})[r.name] = (saved / 1e6, t)
                    tot += t
                cells.append(f"{tot:.0f}")
            ind = inductor_measured(model, call)
            lines.append(f"| {model} | {call} | {fitted:.0f} | " + " | ".join(cells) + f" | {ind:.0f} |")
            if changes is not None and all(k in per for k in changes):
                old, new = (per[k] for k in changes)
                moved = sorted(old, key=lambda n: -abs(new[n][1] - old[n][1]))[:5]
                notes.append(f"- {model} {call}: " + "; ".join(
                    f"{n} {old[n][0]:.1f} -> {new[n][0]:.1f} MB, {old[n][1]:.1f} -> {new[n][1]:.1f} us"
                    for n in moved if abs(new[n][1] - old[n][1]) >= 0.05) + ".")
    if notes:
        lines += ["", f"Regions whose credit moves most from {changes[0]} to {changes[1]} (saved MB per occurrence, "
                  "credited us; PREDICTED):", "", *notes]
    return lines


def _q(pred: float, meas: float) -> float:
    return pred / meas


def _score(qs: list[float]) -> tuple[float, float]:
    """(share within ±25%, median |log q|)."""
    within = sum(0.75 <= q <= 1.25 for q in qs) / len(qs)
    logs = sorted(abs(math.log(q)) for q in qs)
    return within, logs[len(logs) // 2]


def predict(a: list[dict[str, Any]], b: list[dict[str, Any]], sims: dict[Any, Any], params: L2Params, dev: Any,
            c: Coefficients, held: Coefficients, col: str = "pre_us") -> tuple[list[float], list[float]]:
    """q per row of A and of B (``col``) with the L2 credit of ``params``."""
    inf, train = sims[_sim_key("inference", params)], sims[_sim_key("train", params)]
    qa = []
    for row in a:
        o = inf[row["region"]]
        t = credited_us(row["standalone_us"] - c.event_us, o.read_bytes + o.write_bytes, [o.saved(params.accounting)], dev, c, params)
        qa.append(_q(t, row["in_model_us"]))
    qb = []
    for row in b:
        o = train.get(row["region"]) if row["kernel"] == "st_k0" else None
        t = row[col] if o is None else credited_us(row[col], row["bytes"], [o.saved(params.accounting)], dev, held, params)
        qb.append(_q(t, row["in_model_us"]))
    return qa, qb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/l2-2026-12-07-s15")
    ap.add_argument("--totals", default="", help="an audit directory (scripts/audit_models.py --out) whose fitted "
                    "times to sum per model and call under each chosen parameter set")
    ap.add_argument("--gemm-tile", type=int, default=128, help="the output tile (square) of the wave-by-wave GEMM "
                    "models (default 128; the shipped one's); other sizes test how much the choice depends on it")
    args = ap.parse_args(argv)
    GEMMS = gemm_models(args.gemm_tile)
    dev = get_device("h200")
    c = package_coefficients(dev)
    captured = {m: _capture("bert", m) for m in ("inference", "train")}
    sims = {}
    for m, pol, k, (tile, ef) in itertools.product(captured, POLICIES, KEEPS, GEMMS):
        p = L2Params(pol, k, 1.0, gemm_tile=tile, gemm_evict_first=ef)
        sims[_sim_key(m, p)] = simulate_l2(captured[m], dev, p)
    a = group_a(captured["inference"])
    b, held = group_b(captured["train"], dev)
    copy = dev.effective_copy_bandwidth_gbs()
    ind = group_c(b, sims[("train", "lru", 1.0, 0, False)])
    floor = max(r["bytes"] / r["us"] / 1e3 for r in ind) / copy   # no kernel streams faster than the L2 lets it
    grid = [L2Params(pol, k, s, acc, gemm_tile=tile, gemm_evict_first=ef)
            for (tile, ef), pol, k, s, acc in itertools.product(GEMMS, POLICIES, KEEPS, STREAMS, ACCOUNTINGS)
            if s >= floor]
    scored = {p: predict(a, b, sims, p, dev, c, held) for p in grid}
    def choose(among: list[L2Params]) -> dict[str, L2Params]:
        return {
            "A": max(among, key=lambda p: (_score(scored[p][0])[0], -_score(scored[p][0])[1])),
            "B": max(among, key=lambda p: (_score(scored[p][1])[0], -_score(scored[p][1])[1])),
            "A+B": max(among, key=lambda p: (_score(scored[p][0] + scored[p][1])[0],
                                             -_score(scored[p][0] + scored[p][1])[1])),
        }

    pick = choose(grid)
    none_a = [_q(r["standalone_us"] - c.event_us, r["in_model_us"]) for r in a]
    none_b = [_q(r["pre_us"], r["in_model_us"]) for r in b]
    none_bp = [_q(r["post_us"], r["in_model_us"]) for r in b]
    given = sys.argv[1:] if argv is None else argv
    cmd = " ".join(["python scripts/check_l2_residency.py", *given])
    lines = ["# The L2 estimate against the committed in-model kernel times (H200)", "", f"    {cmd}", "",
             "MEASURED: results/h200-2026-12-04-models (CUPTI in the model step; the tuner's standalone event times "
             "after an L2 flush). Every other time is PREDICTED; q = predicted / measured in the model.", "",
             "## Scores: share within ±25% / median |log q|", "",
             "| estimate | A: BERT inference, standalone -> in model (18) | B: BERT train ours, fitted held out, "
             "pre-build (37) | B post-build |", "|---|---|---|---|"]

    def fmt(qs: list[float]) -> str:
        w, m = _score(qs)
        return f"{w:.0%} / {m:.3f}"

    lines.append(f"| no L2 credit | {fmt(none_a)} | {fmt(none_b)} | {fmt(none_bp)} |")
    for label, p in pick.items():
        qa, qb = scored[p]
        qbp = predict(a, b, sims, p, dev, c, held, "post_us")[1]
        lines.append(f"| chosen on {label}: {p.policy}, keep {p.keep}, stream x{p.stream_factor}, {p.accounting}, GEMMs "
                     f"{p.gemm} | {fmt(qa)} | {fmt(qb)} | {fmt(qbp)} |")
    ship = pick["A+B"]
    bound = L2Params("lru", 0.6, 100.0)   # s13's upper bound, roughly: LRU at 0.6 x L2, no L2 streaming limit
    qa_u, qb_u = predict(a, b, sims, bound, dev, c, held)
    lines.append(f"| s13-like upper bound: lru, keep 0.6, no L2 streaming limit | {fmt(qa_u)} | {fmt(qb_u)} | "
                 f"{fmt(predict(a, b, sims, bound, dev, c, held, 'post_us')[1])} |")
    lines += ["", "Held out: the choice on A scored on B, and the choice on B scored on A (rows above).", "",
              "## Per GEMM traffic model (stitchtune/analysis/gemm_traffic.py): its own choices, held out both ways", "",
              "C: Inductor's matched kernels (section C) whose DRAM bytes under the model's A+B choice stay within the "
              "copy bandwidth.", "",
              "| GEMMs | chosen on A | A / B held out | chosen on B | B / A held out | chosen on A+B | A / B | C |",
              "|---|---|---|---|---|---|---|---|"]

    def brief(p: L2Params) -> str:
        return f"{p.policy} {p.keep} x{p.stream_factor} {p.accounting}"

    for tile, ef in GEMMS:
        own = choose([p for p in grid if (p.gemm_tile, p.gemm_evict_first) == (tile, ef)])
        trained = sims[("train", own["A+B"].policy, own["A+B"].keep, tile, ef)]
        n_c = sum((r["bytes"] - trained[r["region"]].saved(own["A+B"].accounting)) / r["us"] / 1e3 <= copy for r in ind)
        (pa, pb, pab) = (own[k] for k in ("A", "B", "A+B"))
        lines.append(f"| {pab.gemm} | {brief(pa)} | {fmt(scored[pa][0])} / **{fmt(scored[pa][1])}** | {brief(pb)} | "
                     f"{fmt(scored[pb][1])} / **{fmt(scored[pb][0])}** | {brief(pab)} | {fmt(scored[pab][0])} / "
                     f"{fmt(scored[pab][1])} | {n_c}/{len(ind)} |")
    lines += ["", "For reference, every policy and accounting at its best keep / stream / GEMM model on A+B:", ""]
    for pol, acc in itertools.product(POLICIES, ACCOUNTINGS):
        best = max((p for p in grid if p.policy == pol and p.accounting == acc),
                   key=lambda p: (_score(scored[p][0] + scored[p][1])[0], -_score(scored[p][0] + scored[p][1])[1]))
        lines.append(f"- {pol}, {acc}: keep {best.keep}, stream x{best.stream_factor}, GEMMs {best.gemm}: A {fmt(scored[best][0])}, "
                     f"B {fmt(scored[best][1])}")
    shipped = l2_params(dev)
    same = dataclasses.replace(shipped, source="") == dataclasses.replace(ship, source="")
    lines += ["", f"Shipped (stitchtune/analysis/l2_credit.FITTED): {shipped.policy}, keep {shipped.keep}, stream "
              f"x{shipped.stream_factor}, {shipped.accounting}, GEMMs {shipped.gemm}: "
              f"{'the choice on A+B' if same else 'NOT the choice on A+B'}."]
    qa, qb = scored[ship]
    inf = sims[_sim_key("inference", ship)]
    lines += ["", f"## A. BERT inference: the same kernel standalone and in the model ({ship.policy}, keep {ship.keep}, "
              f"stream x{ship.stream_factor}, {ship.accounting}, GEMMs {ship.gemm})", "",
              "| region | workload | MB | resident MB | write-back MB | saved MB | standalone MEASURED us | "
              "less event start | credited (PREDICTED) | in model MEASURED us | q no credit | q credited |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row, q, q0 in zip(a, qa, none_a):
        o = inf[row["region"]]
        lines.append(f"| {row['region']} | {row['workload']} | {(o.read_bytes + o.write_bytes) / 1e6:.1f} | "
                     f"{o.resident / 1e6:.1f} | {o.writeback / 1e6:.1f} | {o.saved(ship.accounting) / 1e6:.1f} | "
                     f"{row['standalone_us']:.2f} | {row['standalone_us'] - c.event_us:.2f} | "
                     f"{q * row['in_model_us']:.2f} | {row['in_model_us']:.1f} | {q0:.2f} | {q:.2f} |")
    train = sims[_sim_key("train", ship)]
    lines += ["", "## B. BERT training, our kernels: fitted (held out) vs fitted with the L2 vs MEASURED", "",
              "| launch | MB | resident MB | write-back MB | saved MB | fitted pre-build us | credited | "
              "MEASURED us | q fitted | q credited |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row, q, q0 in zip(b, qb, none_b):
        o = train.get(row["region"]) if row["kernel"] == "st_k0" else None
        mb = ("" if o is None else f"{o.resident / 1e6:.1f} | {o.writeback / 1e6:.1f} | {o.saved(ship.accounting) / 1e6:.1f}")
        lines.append(f"| {row['region']}/{row['kernel']} | {row['bytes'] / 1e6:.1f} | {mb or ' | | '} | "
                     f"{row['pre_us']:.1f} | {q * row['in_model_us']:.1f} | {row['in_model_us']:.1f} | {q0:.2f} | "
                     f"{q:.2f} |")
    lines += ["", "## C. BERT training, Inductor's kernels (MEASURED) against the DRAM and L2 rates the estimate implies",
              "", f"Copy bandwidth {copy:.0f} GB/s; the L2 streaming rate of the estimate {ship.stream_factor} x copy = "
              f"{ship.stream_factor * copy:.0f} GB/s (the grid starts at the fastest kernel here: {floor:.3f} x copy). "
              "Bytes: our launch's unique bytes (Inductor's kernel of the same ops may save other tensors for the "
              "backward); estimated DRAM bytes: those less the estimate's saved bytes.", "",
              "| region | ops | MB | Inductor us | GB/s of all bytes | saved MB | estimated DRAM MB | GB/s of DRAM bytes | "
              "within the copy bandwidth |", "|---|---|---|---|---|---|---|---|---|"]
    c_rows = []
    for r in ind:
        saved = train[r["region"]].saved(ship.accounting)
        dram = r["bytes"] - saved
        ok = dram / r["us"] / 1e3 <= copy
        c_rows.append({**r, "saved": saved, "dram": dram, "ok": ok})
        lines.append(f"| {r['region']} | {r['ops']} | {r['bytes'] / 1e6:.1f} | {r['us']:.1f} | "
                     f"{r['bytes'] / r['us'] / 1e3:.0f} | {saved / 1e6:.1f} | {dram / 1e6:.1f} | "
                     f"{dram / r['us'] / 1e3:.0f} | {'yes' if ok else 'NO'} |")
    if args.totals:
        s14 = L2Params("random", 0.4, 1.1, "reads")   # shipped before the GEMM traffic model (results/l2-2026-12-07-s14)
        lines += totals(Path(args.totals), {**{f"chosen on {k}": p for k, p in pick.items()}, "s14 (GEMMs whole)": s14,
                                            "s13-like bound": bound},
                        dev, c, ("s14 (GEMMs whole)", "chosen on A+B"))
    text = "\n".join(lines) + "\n"
    print(text)
    out = REPO / args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "check.md").write_text(text)
    (out / "check.json").write_text(json.dumps({
        "chosen": {k: vars(p) for k, p in pick.items()}, "A": [dict(r, q=q) for r, q in zip(a, qa)],
        "B": [dict(r, q=q) for r, q in zip(b, qb)], "C": c_rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
