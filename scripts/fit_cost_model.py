"""Fit the IR-feature cost model (stitchtune.cost.fitted) to the committed H200 data, leave-one-model-out.

    python scripts/fit_cost_model.py [--dataset results/cost-fit-2026-12-07-s11/dataset.json] [--out DIR] [--write-package]
    python scripts/fit_cost_model.py --rebuild [...]   # features again from today's programs (torch, transformers)

By default the fit reads the stored dataset (``--dataset``): the features of the kernels that were
measured, each row keyed by its program's fingerprint (:mod:`stitchtune.cost.fit_dataset`). ``--rebuild``
lowers every row's program again with today's code; a rebuilt program whose fingerprint differs from the
stored one is a different kernel than the one measured, so its features are never paired with the old
time (the stored row is kept, and the dataset's notes say so); the merged dataset is written to
``<out>/dataset.json``.

Data (all measured on an NVIDIA H200; nothing here is measured anew):

* ``db:<graph>``: the ``ok`` rows of the tuning database ``results/h200-2026-11-29`` (``measured_us``
  per program, CUDA events); each row's schedule is lowered again from ``examples/<graph>.json`` (the
  workload key is checked), with the row's ptxas registers.
* ``bert-train``: the per-kernel CUPTI trace of BERT's training step (heuristic schedules, run 3,
  ``results/h200-2026-12-04-models/gpu_models_run3.jsonl``); the regions are captured again on the CPU
  at the GPU script's shapes (``scripts/gpu_models.py``'s ``_medium``) and matched to the trace's
  ``st_*`` kernels in order; a region whose workload key is not in the GPU log
  (``logs/time_run3.log``) was built from a different graph there and is left out (counted).
* ``bert-inference``: the heuristic schedule's measured time per workload in the tuning log of BERT
  inference (``logs/tuned_run3.log``), for the regions whose rebuilt program predicts (old model) the
  logged prediction within 1% (the same program).

Each row is one measured time and its launches' :class:`~stitchtune.cost.features.KernelFeatures`;
with ``--rebuild`` the script also writes ``<out>/budget.md``: BERT inference's 40-trial budget split by
the old and the fitted model (torch and transformers needed). The fit: ``scipy.optimize.least_squares`` on log(predicted / measured), soft-L1
loss, with a weak pull of each coefficient towards its default. The groups ("models") are the five
database graphs and the two BERT sets; every figure labelled "held out" comes from a fit that did
not see that group (leave-one-model-out). "before" is the old model (stitchtune.cost.model.predict,
launch term included, the parameters in force when the rows were written: the defaults).

Writes ``<out>/fit.md`` (the table, also printed), ``<out>/fit.json`` (per row: measured, before,
held-out and in-sample predictions) and, with ``--write-package``, the coefficients fitted on all rows
to ``stitchtune/cost/fitted_<device key>.json`` with their provenance.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from stitchtune.cost.features import KernelFeatures, program_features  # noqa: E402
from stitchtune.cost.fitted import Coefficients  # noqa: E402
from stitchtune.cost.fitted_store import data_name  # noqa: E402
from stitchtune.cost.fit_dataset import (Dataset, DatasetError, load_dataset, pair_rebuilt, save_dataset,  # noqa: E402
                                         with_timing)
from stitchtune.cost.fitting import FITTED, fit_coefficients, leave_one_group_out, predict_rows, score  # noqa: E402
from stitchtune.hardware.device import get_device  # noqa: E402

DB = "results/h200-2026-11-29"
DATASET = "results/cost-fit-2026-12-07-s13-walk/dataset.json"
MODELS = "results/h200-2026-12-04-models"


# ------------------------------------------------------------------------------------------ dataset
def _lower(graph: Any, schedule: Any, dev: Any) -> Any:
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan

    plan = make_plan(graph)
    return lower(graph, plan, schedule, dev, legal_space(graph, plan, dev))


def _heuristic(graph: Any, dev: Any) -> Any:
    from stitchtune.deploy.selection import heuristic_schedule
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan

    plan = make_plan(graph)
    space = legal_space(graph, plan, dev)
    return lower(graph, plan, heuristic_schedule(plan, dev, space), dev, space)


def _fp(prog: Any) -> str:
    from stitchtune.gpu.render import program_fingerprint

    return program_fingerprint(prog)


def _fdict(f: KernelFeatures) -> dict[str, Any]:
    d = f.to_dict()
    d.pop("per_access")
    return d


def db_rows(dev: Any) -> list[dict[str, Any]]:
    import pandas as pd

    from stitchtune.cost.model import predict
    from stitchtune.graph.parse import load_graph
    from stitchtune.space.schedule import Schedule

    df = pd.concat([pd.read_parquet(p) for p in sorted(glob.glob(f"{REPO / DB}/*.parquet"))])
    df = df[(df["status"] == "ok") & ~df["estimated"].fillna(False).astype(bool)]
    out = []
    for name, g in df.groupby("graph_name"):
        graph = load_graph(REPO / "examples" / f"{name}.json")
        if graph.workload_key() != g["workload_key"].iloc[0]:
            print(f"db: {name}: example's workload key differs; left out", file=sys.stderr)
            continue
        for _, r in g.iterrows():
            prog = _lower(graph, Schedule.from_json(r["schedule_json"]), dev)
            regs = {k.name: int(r["registers"]) for k in prog.kernels} if r["registers"] == r["registers"] else None
            feats = program_features(prog, dev, regs)
            out.append({"group": f"db:{name}", "label": f"{name} {r['schedule_key']}", "heuristic": bool(r["heuristic"]),
                        "workload": str(name), "measured_us": float(r["measured_us"]),
                        "before_us": float(predict(prog.profile, dev, regs).time_us),
                        "source_sha256": _fp(prog), "kernels": [_fdict(f) for f in feats]})
    return out


def _as_on_the_gpu(gm: Any, kind: str) -> tuple[Any, Any]:
    """A graph's regions as the backend of the GPU runs (results/h200-2026-12-04-models) cut them: dropout's
    draws seeded and splits as slices only; the later pre-passes (transposed matmul operands as views, bias
    adds: deploy/torch_prepare.py) would give workloads the GPU logs do not name."""
    from stitchtune.importers.torch_fx_util import splits_as_slices
    from stitchtune.importers.torch_random import seed_rands
    from stitchtune.importers.torch_regions import find_regions

    seeded = seed_rands(gm) or gm
    work = splits_as_slices(seeded) or seeded
    return work, find_regions(work)


def _capture(name: str, mode: str) -> list[Any]:
    import gpu_models

    from stitchtune.deploy.model_tuning import capture_regions

    model, args = gpu_models._medium(name)
    return capture_regions(model, args, "inference" if mode == "inference" else "train", prepare=_as_on_the_gpu)


def bert_train_rows(dev: Any) -> tuple[list[dict[str, Any]], list[str]]:
    from stitchtune.cost.model import predict

    rows = [json.loads(line) for line in open(REPO / MODELS / "gpu_models_run3.jsonl")]
    trace = [t for r in rows if r.get("variant") == "stitchtune" and r.get("mode") == "train" and "trace" in r
             for t in r["trace"] if t[0].startswith("st_") or t[0] == "zfill"]
    log = (REPO / MODELS / "logs" / "time_run3.log").read_text()
    gpu_keys = {k for _, k in re.findall(r"^(region_\w+): heuristic schedule for workload (\w+)", log, re.M)}
    launches = []
    for reg in _capture("bert", "train"):
        prog = _heuristic(reg.graph, dev)
        pred = predict(prog.profile, dev)
        fp = _fp(prog)
        for i, (f, l) in enumerate(zip(program_features(prog, dev), prog.launches)):
            launches.append((reg.name, reg.graph.workload_key()[:12], l.kernel, f, pred.per_kernel_us[i], fp))
    notes = []
    if [x[2] for x in launches] != [t[0] for t in trace]:
        notes.append(f"bert-train: rebuilt launches ({len(launches)}) do not match the trace ({len(trace)}); left out")
        return [], notes
    out = []
    for (region, key, kname, f, before, fp), (_, us) in zip(launches, trace):
        if key not in gpu_keys:
            notes.append(f"bert-train: {region} {kname} ({key}) not in the GPU log's workloads; left out")
            continue
        out.append({"group": "bert-train", "label": f"{region}/{kname}", "heuristic": True, "workload": key,
                    "measured_us": float(us), "before_us": float(before), "source_sha256": fp,
                    "kernels": [_fdict(f)]})
    return out, notes


def bert_inference_rows(dev: Any) -> tuple[list[dict[str, Any]], list[str]]:
    from stitchtune.cost.model import predict

    text = (REPO / MODELS / "logs" / "tuned_run3.log").read_text()
    logged = {m[0]: (float(m[1]), float(m[2])) for m in re.findall(
        r"\] (region_\w+) x\d+ .*?predicted ([\d.]+) us.*?heuristic ([\d.]+) us", text)}
    out, notes = [], []
    seen = set()
    for reg in _capture("bert", "inference"):
        if reg.name not in logged or reg.name in seen:
            continue
        seen.add(reg.name)
        prog = _heuristic(reg.graph, dev)
        before = float(predict(prog.profile, dev).time_us)
        want, measured = logged[reg.name]
        if abs(before - want) > 0.01 * want:
            notes.append(f"bert-inference: {reg.name} rebuilt predicts {before:.2f} us, the GPU log {want:.2f}: "
                         "another program; left out")
            continue
        out.append({"group": "bert-inference", "label": reg.name, "heuristic": True,
                    "workload": reg.graph.workload_key()[:12], "measured_us": measured, "before_us": before,
                    "source_sha256": _fp(prog), "kernels": [_fdict(f) for f in program_features(prog, dev)]})
    return out, notes


def budget_lines(dev: Any, trials: int = 40) -> list[str]:
    """BERT inference's whole-model budget split (deploy.model_tuning's rule) by the old and the fitted model."""
    from stitchtune.cost.fitted import predict_program
    from stitchtune.cost.model import predict
    from stitchtune.tune.budget import split_by_share

    groups: dict[str, list[Any]] = {}
    for reg in _capture("bert", "inference"):
        groups.setdefault(reg.graph.workload_key(), []).append(reg)
    rows = []
    for regs in groups.values():
        prog = _heuristic(regs[0].graph, dev)
        rows.append((regs[0].name, len(regs), predict(prog.profile, dev).time_us, predict_program(prog, dev).time_us))
    old = split_by_share([n * o for _, n, o, _ in rows], trials)
    new = split_by_share([n * f for _, n, _, f in rows], trials)
    out = [f"## BERT inference: {trials} trials split by predicted share (deploy.model_tuning), PREDICTED times", "",
           "| region | x | old model us | trials | fitted model us | trials |", "|---|---|---|---|---|---|"]
    out += [f"| {name} | {n} | {o:.1f} | {a} | {f:.1f} | {b} |" for (name, n, o, f), a, b in zip(rows, old, new)]
    return out


# ------------------------------------------------------------------------------------------ the fit
def ordering(rows: list[dict[str, Any]], key: str) -> list[tuple[str, str, bool | None]]:
    """Per database workload: is the heuristic vs the best measured schedule ordered as measured? (None: nothing
    to order, the heuristic is the best measured or was never measured)"""
    out = []
    for wl in sorted({r["workload"] for r in rows if r["group"].startswith("db:")}):
        rs = [r for r in rows if r["workload"] == wl and r["group"].startswith("db:")]
        heur = [r for r in rs if r["heuristic"]]
        best = min(rs, key=lambda r: r["measured_us"])
        if not heur:   # colsum's trial 0 was pruned after its build: nothing to order (was reported "ok")
            out.append((wl, "no measured heuristic row", None))
            continue
        if heur[0] is best:
            out.append((wl, "heuristic is the best measured", None))
            continue
        h = heur[0]
        ok = (h[key] > best[key]) == (h["measured_us"] > best["measured_us"])
        out.append((wl, f"heuristic {h['measured_us']:.1f} vs best {best['measured_us']:.1f} measured; "
                         f"predicted {h[key]:.1f} vs {best[key]:.1f}", ok))
    return out


def pair_order(rows: list[dict[str, Any]], key: str, gap: float = 0.10) -> list[tuple[str, int, int]]:
    """Per database workload: (workload, pairs of schedules whose measured times differ by more than ``gap``,
    of them ordered as measured by ``key``)."""
    out = []
    for wl in sorted({r["workload"] for r in rows if r["group"].startswith("db:")}):
        rs = [r for r in rows if r["workload"] == wl and r["group"].startswith("db:")]
        n = ok = 0
        for i, a in enumerate(rs):
            for b in rs[i + 1:]:
                lo, hi = sorted((a["measured_us"], b["measured_us"]))
                if hi <= (1 + gap) * lo:
                    continue
                n += 1
                ok += (a[key] < b[key]) == (a["measured_us"] < b["measured_us"])
        out.append((wl, n, ok))
    return out


def parse_base(items: list[str]) -> dict[str, float]:
    """``NAME=VALUE`` items (``--base``) as coefficient values; a ValueError names an unknown or bad one."""
    names = {f.name for f in dataclasses.fields(Coefficients)} - {"device_key", "source", "provenance"}
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in names:
            raise ValueError(f"--base {item!r}: expected NAME=VALUE with NAME a cost coefficient")
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"--base {item!r}: {value!r} is not a number") from None
    return out


def ir_only(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (copied) with the compiled-code fields 0: what a prediction before the build sees."""
    return [{**r, "kernels": [{**k, "compiled_bytes_in_flight": 0.0, "spill_instructions": 0.0} for k in r["kernels"]]}
            for r in rows]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/cost-fit-2026-12-07-s12")
    ap.add_argument("--dataset", default=DATASET, help="the stored dataset: measured rows keyed by kernel fingerprint")
    ap.add_argument("--rebuild", action="store_true",
                    help="features again from today's programs, paired with --dataset's rows by fingerprint")
    ap.add_argument("--device", default="h200")
    ap.add_argument("--write-package", action="store_true", help="write stitchtune/cost/fitted_<device>.json")
    ap.add_argument("--base", action="append", default=[], metavar="NAME=VALUE",
                    help="a coefficient fixed in the fit's base (a model variant, e.g. reuse_tasks=1; not fitted)")
    a = ap.parse_args(argv)
    try:
        fixed = parse_base(a.base)
    except ValueError as exc:
        print(f"fit_cost_model: error: {exc}", file=sys.stderr)
        return 2
    dev = get_device(a.device)
    out = REPO / a.out
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    budget: list[str] = []
    try:
        stored = load_dataset(REPO / a.dataset, dev.key)
    except DatasetError as exc:
        print(f"fit_cost_model: error: {exc}", file=sys.stderr)
        return 2
    rows, notes = [dict(r) for r in stored.rows], list(stored.notes)
    if a.rebuild:
        budget = budget_lines(dev)
        (out / "budget.md").write_text("\n".join(budget) + "\n")
        head = _git("rev-parse", "--short", "HEAD")
        r2, n2 = bert_train_rows(dev)
        r3, n3 = bert_inference_rows(dev)
        rebuilt = [{**r, "features_commit": head} for r in db_rows(dev) + r2 + r3]
        paired, n4 = pair_rebuilt(stored.rows, rebuilt)
        rows, notes = [dict(r) for r in paired], n2 + n3 + n4
        save_dataset(out / "dataset.json", Dataset(dev.key, tuple(rows), tuple(notes),
                                                   {**stored.provenance, "rebuilt_at": head}))
    rows = with_timing(rows)   # the database and BERT inference's tuning log: CUDA events; BERT training: CUPTI
    groups = sorted({r["group"] for r in rows})
    base = dataclasses.replace(Coefficients.defaults(dev), **fixed)
    for r, t in zip(rows, predict_rows(rows, dev, base)):
        r["default_us"] = float(t)
    # the fit sees the IR walk only (what `stitchtune calibrate` fits from a user's database, and what the search's
    # pre-build ranking predicts from); the compiled facts of the measured kernels (scripts/sass_dataset.py) enter
    # the post-build prediction ("held out, compiled"): the same coefficients, the SASS's bytes in flight
    fit_rows = ir_only(rows)
    held = leave_one_group_out(fit_rows, dev, base)
    for g, c in held.items():
        mine = [r for r in fit_rows if r["group"] == g]
        for r, t in zip(mine, predict_rows(mine, dev, c)):
            r["heldout_us"] = float(t)
        mine = [r for r in rows if r["group"] == g]
        for r, t in zip(mine, predict_rows(mine, dev, c)):
            r["heldout_compiled_us"] = float(t)
    for r, f in zip(rows, fit_rows):
        r["heldout_us"] = f["heldout_us"]
    full = fit_coefficients(fit_rows, dev, base)
    for r, t in zip(rows, predict_rows(rows, dev, full)):
        r["insample_us"] = float(t)

    cmd = " ".join(["python scripts/fit_cost_model.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [f"# Cost-model fit on {dev.key} ({len(rows)} measured rows)", "", f"    {cmd}  # at {_git('rev-parse', '--short', 'HEAD')}", "",
             "All times in us. measured = H200 (committed data); every other column is PREDICTED.",
             "before = old model (cost.model.predict, launch term included); default = feature model, default "
             "coefficients; held out = feature model fitted without the row's group (leave-one-model-out); "
             "held out, compiled = the same held-out coefficients, predicted with the compiled code's bytes in flight "
             "(SASS of the measured kernels: a post-build prediction); in-sample = fitted on all rows (for comparison "
             "only). The feature model's columns are device time plus, "
             "for rows timed with CUDA events (the database, BERT inference's log), the fitted event_us per launch "
             "(the launch start such timing includes; never part of the predicted device time).", "",
             "| group | n | before ±25% | before ρ | default ±25% | default ρ | held out ±25% | held out ρ | held out median pred/meas "
             "| held out, compiled ±25% | held out, compiled ρ |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    summary: dict[str, Any] = {}
    for g in groups + ["all"]:
        rs = [r for r in rows if g == "all" or r["group"] == g]
        ms = [r["measured_us"] for r in rs]
        b, d, h, hc = (score(ms, [r[k] for r in rs]) for k in ("before_us", "default_us", "heldout_us",
                                                                 "heldout_compiled_us"))
        summary[g] = {"before": b, "default": d, "heldout": h, "heldout_compiled": hc}
        lines.append(f"| {g} | {len(rs)} | {b['within25']:.0%} | {b['spearman']:.2f} | {d['within25']:.0%} | "
                     f"{d['spearman']:.2f} | {h['within25']:.0%} | {h['spearman']:.2f} | {h['median_ratio']:.2f} | "
                     f"{hc['within25']:.0%} | {hc['spearman']:.2f} |")
    ins = score([r["measured_us"] for r in rows], [r["insample_us"] for r in rows])
    lines += ["", f"in-sample (all rows, not a quality figure): ±25% {ins['within25']:.0%}, ρ {ins['spearman']:.2f}", "",
              "## Heuristic vs best measured schedule, per database workload (ordered as measured?)", ""]
    for key, name in (("before_us", "before"), ("heldout_us", "held out"), ("heldout_compiled_us", "held out, compiled")):
        for wl, text, ok in ordering(rows, key):
            lines.append(f"- {name}: {wl}: {'-' if ok is None else 'ok' if ok else 'WRONG'} ({text})")
    lines += ["", "## Pairs of schedules of one database workload measured more than 10% apart: ordered as measured", "",
              "| workload | pairs | before | held out | held out, compiled |", "|---|---|---|---|---|"]
    for (wl, n, b), (_, _, h), (_, _, hc) in zip(pair_order(rows, "before_us"), pair_order(rows, "heldout_us"),
                                                 pair_order(rows, "heldout_compiled_us")):
        lines.append(f"| {wl} | {n} | {b} ({b / max(n, 1):.0%}) | {h} ({h / max(n, 1):.0%}) | {hc} ({hc / max(n, 1):.0%}) |")
    lines += ["", "## Per row (BERT)", "", "| group | row | measured | before | held out | held out, compiled |",
              "|---|---|---|---|---|---|"]
    for r in rows:
        if r["group"].startswith("bert"):
            lines.append(f"| {r['group']} | {r['label']} | {r['measured_us']:.1f} | {r['before_us']:.1f} | "
                         f"{r['heldout_us']:.1f} | {r['heldout_compiled_us']:.1f} |")
    lines += ["", "## Coefficients", "", "| coefficient | default | all rows | " + " | ".join(f"without {g}" for g in groups)
              + " |", "|---|---|---|" + "---|" * len(groups)]
    for n in FITTED:
        lines.append(f"| {n} | {getattr(base, n):.4g} | {getattr(full, n):.4g} | "
                     + " | ".join(f"{getattr(held[g], n):.4g}" for g in groups) + " |")
    if notes:
        lines += ["", "## Left out", ""] + [f"- {n}" for n in notes]
    text = "\n".join(lines) + "\n"
    print(text)
    (out / "fit.md").write_text(text)
    slim = [{k: v for k, v in r.items() if k != "kernels"} for r in rows]
    (out / "fit.json").write_text(json.dumps({"summary": summary, "rows": slim}, indent=1))
    if a.write_package:
        prov = {"commit": _git("rev-parse", "HEAD"), "date": datetime.date.today().isoformat(),
                "script": "scripts/fit_cost_model.py", "data": [DB, f"{MODELS}/gpu_models_run3.jsonl",
                                                                f"{MODELS}/logs/time_run3.log",
                                                                f"{MODELS}/logs/tuned_run3.log"],
                "rows": len(rows), "groups": groups,
                "heldout_within25": summary["all"]["heldout"]["within25"],
                "heldout_spearman": summary["all"]["heldout"]["spearman"],
                "heldout_compiled_within25": summary["all"]["heldout_compiled"]["within25"],
                "heldout_compiled_spearman": summary["all"]["heldout_compiled"]["spearman"],
                "dataset": a.dataset, "fitted_on": "IR features (compiled facts zeroed)"}
        c = dataclasses.replace(full, source="fitted", provenance=prov)
        path = REPO / "stitchtune" / "cost" / data_name(dev)
        path.write_text(json.dumps(c.to_dict(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
