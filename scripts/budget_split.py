"""How ``stitchtune tune`` splits a trial budget over a model's regions: by predicted time (before s13) and by
predicted gain (:func:`stitchtune.tune.budget.gain_weight`, now), on the GPU script's BERT / GPT-2 / Llama.

    nice python scripts/budget_split.py [--models bert] [--calls inference,train] [--trials 40] [--out FILE]
    nice python scripts/budget_split.py --examples layernorm,logsoftmax,... [--trials 40]   # graphs as one model's regions

Per workload (de-duplicated as ``deploy.model_tuning.model_workloads`` does): its region count, the fitted model's
predicted device time of the heuristic schedule, the least predicted over the heuristic, its variants and 24 seeded
samples (:func:`stitchtune.tune.budget.predicted_gain`), the floor (unique bytes over the device's copy bandwidth)
and the trials each rule gives. Every time here is PREDICTED (the fitted model, CPU); nothing is measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert")
    ap.add_argument("--calls", default="inference,train")
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--device", default="h200")
    ap.add_argument("--out", default=None)
    ap.add_argument("--examples", default=None, help="examples/<name>.json graphs, each one workload of count 1")
    a = ap.parse_args(argv)

    from stitchtune.deploy.model_tuning import model_workloads, parse_calls, split_budget
    from stitchtune.hardware.device import get_device
    from stitchtune.tune.budget import split_by_share

    dev = get_device(a.device)
    bw = dev.effective_copy_bandwidth_gbs()
    cmd = " ".join(["nice python scripts/budget_split.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [f"# Budget split by predicted time vs predicted gain ({dev.key}, {a.trials} trials per model and call)",
             "", f"    {cmd}", "", "All times PREDICTED (fitted model, device time, us); floor = unique bytes / copy "
             "bandwidth. gain = heuristic - best tried (heuristic, its variants, 24 seeded samples).", ""]
    sets = []
    if a.examples:
        from stitchtune.deploy.model_tuning import Workload, predicted_gain
        from stitchtune.graph.parse import load_graph
        from stitchtune.tune.budget import gain_weight

        ws = []
        for n in a.examples.split(","):
            g = load_graph(REPO / "examples" / f"{n}.json")
            pg = predicted_gain(g, dev)
            ws.append(Workload(g, (n,), (), 1, pg.heuristic_us, gain_weight(pg, 1), best_predicted_us=pg.best_us))
        sets.append(("examples", "", sorted(ws, key=lambda w: -w.share)))
    else:
        import gpu_models

        for name in a.models.split(","):
            model, inputs = gpu_models._medium(name)
            for call in parse_calls(a.calls):
                sets.append((name, call, model_workloads(model, inputs, dev, (call,))))
    for name, call, ws in sets:
        new = split_budget(ws, a.trials)
        old = split_by_share([w.count * w.predicted_us for w in ws], a.trials)
        lines += [f"## {name} {call}", "", "| workload | x | floor | heuristic | best tried | gain | heur / floor | "
                  "trials by time | trials by gain |", "|---|---|---|---|---|---|---|---|---|"]
        for w, o, n in zip(ws, old, new):
            floor = float(w.graph.min_bytes()) / (float(bw) * 1e3)
            lines.append(f"| {w.regions[0]} | {w.count} | {floor:.1f} | {w.predicted_us:.1f} | "
                         f"{w.gain.best_us:.1f} | {w.gain.gain_us:.1f} | {w.predicted_us / floor:.2f} | {o} | {n} |")
        tot_gain = sum(w.count * w.gain.gain_us for w in ws)
        flat = [w.gain.gain_us < 0.01 * w.predicted_us for w in ws]
        t_old = sum(o for o, f in zip(old, flat) if f)
        t_new = sum(n for n, f in zip(new, flat) if f)
        lines += ["", f"predicted gain summed over the workloads (x count): {tot_gain:.1f} us. Trials to the {sum(flat)} "
                  f"workloads predicted at their best point tried (gain < 1%): by time {t_old}, by gain {t_new} "
                  f"(of {a.trials})", ""]
        print("\n".join(lines[-(len(ws) + 6):]), flush=True)
    text = "\n".join(lines) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
