"""BERT training's measured kernels and the L2: would their producers' outputs, still in the L2, explain them?

    python scripts/fit_producer_l2.py [--dataset results/cost-fit-2026-12-07-s13-walk/dataset.json] [--out DIR]

The fitted cost model counts every unique byte of a launch as a DRAM byte; the database rows were measured after an
L2 flush, so that holds there. In a model, a region's input was often written by the launch just before it (a GEMM
or bmm), and part of it may still be in the 60 MiB L2. This script captures BERT's training regions again on the
CPU (``scripts/gpu_models._medium``, the GPU run's shapes; torch and transformers needed), and for each input of a
region written by an FX node (not a parameter) estimates the bytes still resident when the region starts, as an LRU
cache would keep them (:mod:`stitchtune.analysis.l2_residency`): ``max(0, min(S, C - D))``, S the input's bytes, D
the bytes the FX nodes in between (views free) read or write other than that input, C the L2 (``l2_keep`` x L2 and
the whole L2). It then predicts the
dataset's ``bert-train`` rows (the CUPTI trace of the training step) with the coefficients fitted **without** that
group (held out), once as stored and once with the resident bytes taken off the first kernel's unique and sector
bytes. Nothing is fitted to these bytes: a check of a hypothesis, not a term. Every time but ``measured`` is
PREDICTED. A region whose workload key differs from the row's (another graph than the one measured) is left as
stored.

With ``--audit`` (an audit's ``bert.json``, scripts/audit_models.py), it also sums that audit's BERT training
regions (each occurrence as captured) as the audit does, and again with each occurrence's resident bytes at the
fitted ceiling taken off its fitted and fitted-ideal times (``R / (bw_efficiency x copy)``, at most the time less the
ramp): what the audit's model-level figures would read if the producers' outputs were read from the L2 (an upper
bound of the saving: a kernel below the ceiling saves less). PREDICTED, beside Inductor's MEASURED training step.

Writes ``<out>/producer_l2.md`` (also printed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from fit_cost_model import _capture, ir_only  # noqa: E402

from stitchtune.analysis.l2_residency import credited_us, producer_inputs  # noqa: E402
from stitchtune.cost.fit_dataset import load_dataset, with_timing  # noqa: E402
from stitchtune.cost.fitted import Coefficients, package_coefficients  # noqa: E402
from stitchtune.cost.fitting import fit_coefficients, predict_rows, score  # noqa: E402
from stitchtune.hardware.device import get_device  # noqa: E402

DATASET = "results/cost-fit-2026-12-07-s13-walk/dataset.json"
def audit_lines(path: Path, captured: list[Any], c: Coefficients, dev: Any) -> list[str]:
    """The audit's BERT training sums (fitted, fitted ideal; PREDICTED) as stored and with the producers' resident
    bytes at the ceiling of ``c`` (the shipped coefficients, as the audit's) taken off (module docstring)."""
    import json

    audit = {r["workload_key"]: r for r in json.loads(path.read_text())["regions"] if "train" in str(r.get("uses"))}
    out = [f"## The audit's BERT training sums ({path.relative_to(REPO)}), PREDICTED", "",
           "| L2 capacity | regions | resident MB | fitted us | fitted, producers from L2 | fitted ideal us | "
           "fitted ideal, producers from L2 |", "|---|---|---|---|---|---|---|"]
    for keep in (c.l2_keep, 1.0):
        n = 0
        res = fit = fit2 = ideal = ideal2 = 0.0
        for r in captured:
            row = audit.get(r.graph.workload_key())
            if row is None or row.get("fitted_us") is None or row.get("fitted_ideal_us") is None:
                continue
            n += 1
            resident = sum(max(0.0, min(p.nbytes, keep * dev.l2_bytes - p.moved_since)) for p in producer_inputs(r))
            res += resident
            fit += row["fitted_us"]
            ideal += row["fitted_ideal_us"]
            fit2 += credited_us(row["fitted_us"], [resident], dev, c)
            ideal2 += credited_us(row["fitted_ideal_us"], [resident], dev, c)
        out.append(f"| {keep:.1f} x 60 MiB | {n} of {len(captured)} | {res / 1e6:.0f} | {fit:.0f} | {fit2:.0f} | "
                   f"{ideal:.0f} | {ideal2:.0f} |")
    out += ["", "Inductor's training step, MEASURED (CUPTI, the same shapes): its own (Triton) kernels 76 launches, 887 us "
            "(results/h200-2026-12-04-models/gpu_models.md, per-maker breakdown)."]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=DATASET)
    ap.add_argument("--out", default="results/cost-fit-2026-12-07-s13")
    ap.add_argument("--audit", default="results/audit-cpu-2026-12-07-s12/bert.json",
                    help="an audit's bert.json whose training sums to restate ('' to skip)")
    a = ap.parse_args(argv)
    dev = get_device("h200")
    captured = _capture("bert", "train")
    found = {(r.name, r.graph.workload_key()[:12]): producer_inputs(r) for r in captured}
    rows = [r for r in with_timing([dict(r) for r in load_dataset(REPO / a.dataset, dev.key).rows])]
    pre = ir_only(rows)
    held = fit_coefficients([r for r in pre if r["group"] != "bert-train"], dev, Coefficients.defaults(dev))
    mine = [(r, p) for r, p in zip(rows, pre) if r["group"] == "bert-train"]
    cmd = " ".join(["python scripts/fit_producer_l2.py", *(argv if argv is not None else sys.argv[1:])])
    lines = ["# BERT training: producers' outputs in the L2 (a check, nothing fitted)", "", f"    {cmd}", "",
             "measured = H200 CUPTI trace (results/h200-2026-12-04-models); q = PREDICTED (coefficients fitted without "
             "bert-train) / measured.", ""]
    table: list[str] = []
    for keep in (held.l2_keep, 1.0):
        cap = keep * dev.l2_bytes
        for post in (False, True):
            stored, credited, meas = [], [], []
            for r, p in mine:
                p = r if post else p        # post-build: the SASS's bytes in flight (the same coefficients)
                det = found.get((r["label"].split("/")[0], r["workload"]))
                first = r["label"].endswith("/st_k0")     # a row is one launch: the region's first reads the inputs
                resident = sum(max(0.0, min(p.nbytes, cap - p.moved_since)) for p in det) if det and first else 0.0
                k = dict(p["kernels"][0])
                if resident:
                    k["unique_bytes"] = max(1, int(k["unique_bytes"] - resident))
                    k["sector_bytes"] = max(1.0, float(k["sector_bytes"]) - resident)
                before = float(predict_rows([p], dev, held)[0])
                after = float(predict_rows([{**p, "kernels": [k, *p["kernels"][1:]]}], dev, held)[0])
                stored.append(before)
                credited.append(after)
                meas.append(r["measured_us"])
                if keep == 1.0:
                    if not post:
                        table.append(f"| {r['label']} | {r['measured_us']:.1f} | {resident / 1e6:.1f} | "
                                     f"{'' if det is not None else 'no match '}{before / r['measured_us']:.2f} | "
                                     f"{after / r['measured_us']:.2f} |")
                    else:
                        table[len(stored) - 1] += f" {before / r['measured_us']:.2f} | {after / r['measured_us']:.2f} |"
            s0, s1 = score(meas, stored), score(meas, credited)
            lines.append(f"- {'post-build' if post else 'pre-build'}, L2 capacity {keep:.1f} x 60 MiB: bert-train held "
                         f"out within ±25% {s0['within25']:.0%} -> {s1['within25']:.0%}, Spearman {s0['spearman']:.3f} -> "
                         f"{s1['spearman']:.3f}")
    lines += ["", "Per row (capacity = the whole L2):", "",
              "| row | measured us | resident MB | pre-build q as stored | q producer bytes from the L2 | post-build q as "
              "stored | q producer bytes from the L2 |", "|---|---|---|---|---|---|---|"]
    tail = audit_lines(REPO / a.audit, captured, package_coefficients(dev), dev) if a.audit else []
    text = "\n".join(lines + table + [""] + tail) + "\n"
    print(text)
    out = REPO / a.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "producer_l2.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
