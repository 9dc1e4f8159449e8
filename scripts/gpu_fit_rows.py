"""Cost-fit rows from the GPU round's per-region timings (issue 44 item 5), and the refit after the round.

    python scripts/gpu_fit_rows.py refit DIR [--dataset results/cost-fit-2026-12-07/dataset.json]

During the round (:func:`gpu_regions.regions_case` on a GPU) each stitched region's heuristic program
is profiled; :func:`per_launch_us` matches the profiler's ``st_*`` kernels of ``calls`` calls to the
program's launches in order and averages each launch's device time, and :func:`fit_rows` turns them
into rows of the cost fit's dataset format (:mod:`stitchtune.cost.fit_dataset`: ``group``, ``label``,
``measured_us``, ``before_us`` (the old model, :func:`stitchtune.cost.model.predict`), ``kernels``
(features), ``source_sha256``, ``features_commit``, ``timing`` = ``cupti``). A region whose kernels do
not match its program's launches gives no rows (another program ran than the one lowered here).

``refit DIR`` (after the round, on any machine with scipy): ``DIR/fit_rows.jsonl`` appended to the
stored dataset when the device keys agree (else a dataset of the round's rows alone), written to
``DIR/dataset.json``, then ``scripts/fit_cost_model.py --dataset DIR/dataset.json --out DIR/fit``
(the fit, leave-one-group-out: its ``fit.md`` holds each group's error before and after). Before
that, ``DIR/refit.md`` gets the error of the packaged fitted model (the ``regions`` rows' predicted
column) against each region measured in the round: that is the "before" of the new data.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATASET = "results/cost-fit-2026-12-07/dataset.json"


def per_launch_us(events: Sequence[tuple[str, float]], launch_names: Sequence[str], calls: int) -> list[float] | None:
    """Mean device us of each launch over ``calls`` calls from profiler rows ``(name, us)`` (pure).

    Only ``st_*`` rows count; None unless they are exactly ``calls`` repetitions of ``launch_names``
    in order (names compared on the profiler's first 48 characters)."""
    st = [(n, us) for n, us in events if n.startswith("st_")]
    n = len(launch_names)
    if n == 0 or calls < 1 or len(st) != n * calls:
        return None
    for i, (name, _) in enumerate(st):
        if not launch_names[i % n][:48].startswith(name[:48]):
            return None
    return [statistics.fmean(us for _, us in st[j::n]) for j in range(n)]


def fit_rows(group: str, region: str, workload: str, prog: Any, device: Any, measured: Sequence[float],
             commit: str = "") -> list[dict[str, Any]]:
    """One dataset row per launch of ``prog`` with its measured device us (CUPTI)."""
    from stitchtune.cost.features import program_features
    from stitchtune.cost.model import predict
    from stitchtune.gpu.render import program_fingerprint

    before = predict(prog.profile, device).per_kernel_us
    fp = program_fingerprint(prog)
    rows = []
    for i, (f, launch, us) in enumerate(zip(program_features(prog, device), prog.launches, measured)):
        d = f.to_dict()
        d.pop("per_access", None)
        rows.append({"group": group, "label": f"{region}/{launch.kernel}", "heuristic": True,
                     "workload": workload[:12], "measured_us": float(us), "before_us": float(before[i]),
                     "source_sha256": fp, "features_commit": commit, "timing": "cupti", "kernels": [d]})
    return rows


def _score(pairs: list[tuple[float, float]]) -> str:
    if not pairs:
        return "no rows"
    ratios = sorted(p / m for p, m in pairs if m > 0)
    within = sum(1 for r in ratios if 0.75 <= r <= 1.25) / max(len(ratios), 1)
    return f"n {len(ratios)}, within ±25% {within:.0%}, median predicted/measured {statistics.median(ratios):.2f}"


def refit(out: Path, dataset: str) -> int:
    """``refit DIR`` (module docstring). Returns the exit status."""
    from stitchtune.cost.fit_dataset import Dataset, DatasetError, load_dataset, save_dataset

    rows_path = out / "fit_rows.jsonl"
    if not rows_path.is_file():
        print(f"gpu_fit_rows: error: {rows_path} not found (the round's regions phase writes it)", file=sys.stderr)
        return 2
    new = [json.loads(x) for x in rows_path.read_text().splitlines() if x.strip()]
    from stitchtune.hardware.device import DeviceError, get_device

    try:   # the preset of the measured device (its key is what a dataset and the fit name)
        dev = get_device(new[0]["device"]).key if new else ""
    except DeviceError as exc:
        print(f"gpu_fit_rows: error: {exc}", file=sys.stderr)
        return 2
    lines = [f"# Refit with the GPU round's per-kernel rows ({len(new)} rows, device {dev or '?'})", ""]
    step = [json.loads(x) for x in (out / "gpu_step.jsonl").read_text().splitlines()
            if x.strip()] if (out / "gpu_step.jsonl").is_file() else []
    regs = [r for r in step if r.get("phase") == "regions" and r.get("ours_us") and r.get("predicted_us")]
    lines += ["Packaged fitted model (PREDICTED) vs each region's measured device time (CUPTI, copies included):",
              "", f"- all regions: {_score([(r['predicted_us'], r['ours_us']) for r in regs])}"]
    for d in sorted({r.get("dtype", "") for r in regs}):
        lines.append(f"- {d}: {_score([(r['predicted_us'], r['ours_us']) for r in regs if r.get('dtype', '') == d])}")
    if not new:   # a dry run, or the regions phase did not run / matched no kernels
        lines.append("- no per-kernel rows: nothing to refit")
        (out / "refit.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)
        return 0
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    try:
        stored = load_dataset(REPO / dataset, dev)
        rows, notes = [dict(r) for r in stored.rows], list(stored.notes)
        lines.append(f"- merged with {dataset} ({len(rows)} stored rows)")
    except DatasetError as exc:
        lines.append(f"- not merged with {dataset}: {exc}; the round's rows alone")
    for r in new:
        r.pop("device", None)
    save_dataset(out / "dataset.json", Dataset(dev, tuple(rows + new), tuple(notes), {"round": str(out)}))
    (out / "refit.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    cmd = [sys.executable, str(REPO / "scripts" / "fit_cost_model.py"), "--dataset", str((out / "dataset.json").resolve()),
           "--out", str((out / "fit").resolve()), "--device", dev]
    return subprocess.call(cmd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("verb", choices=("refit",))
    ap.add_argument("dir")
    ap.add_argument("--dataset", default=DATASET)
    try:
        a = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    import gpu_timing

    if gpu_timing.options_only():
        print("gpu_fit_rows: options ok")
        return 0
    return refit(Path(a.dir), a.dataset)


if __name__ == "__main__":
    sys.exit(main())
