"""The kernel audit of every stitched region of BERT, GPT-2 and Llama, on the CPU (no GPU, nothing timed).

    python scripts/audit_models.py [--models bert,gpt2,llama] [--calls inference,train]
                                   [--out results/audit-cpu-DATE] [--slice-blocks 4] [--no-sass] [--no-peer]

The models are those of ``scripts/gpu_models.py``'s ``time`` phase (transformers configs, random weights,
2 layers; BERT/GPT-2 hidden 768, Llama hidden 1024 with GQA 16/4 heads; batch 8 x 512; fp32; dropout 0),
captured as the torch.compile backend captures them in each call pattern (``inference``: eval under
no_grad; ``train``: forward and backward of one step), every region audited once per workload with its
heuristic schedule on the H200 description (``stitchtune.analysis.audit.audit_model``). Writes
``OUT/<model>.md`` and ``OUT/<model>.json`` per model and ``OUT/README.md`` (a summary of every model),
all labelled CPU static analysis: floors are bytes at the datasheet bandwidth, the other times the cost
model's predictions. The capture runs each model eagerly on the CPU (minutes at this size: use ``nice``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MODELS = ("bert", "gpt2", "llama")


def _gpu_models() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_models", REPO / "scripts" / "gpu_models.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _summary_rows(name: str, audits: list[Any]) -> list[str]:
    rows = []
    floor = sum(a.floor_us * _count(a) for a in audits)
    pred = sum((a.predicted_us or 0.0) * _count(a) for a in audits)
    kernels = [k for a in audits for k in a.kernels]
    ready = sum(k.floor_ready for k in kernels)
    worst = max((k.worst_sector_ratio or 1.0 for k in kernels), default=1.0)
    dead = sum(bool(k.dead_shared) for k in kernels)
    slow = sum(bool(k.sass and k.sass.division_slow_path) for k in kernels)
    rows.append(f"| {name} | {len(audits)} | {len(kernels)} | {ready}/{len(kernels)} | {floor:.0f} | {pred:.0f} | "
                f"{worst:.2f}x | {dead} | {slow} |")
    return rows


def _count(a: Any) -> int:
    """Regions of this workload over the audited call patterns ("inference x2, train x4" -> 6)."""
    return sum(int(part.rsplit("x", 1)[1]) for part in a.uses.split(", ")) if a.uses else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--calls", default="inference,train")
    ap.add_argument("--out", default=str(REPO / "results" / f"audit-cpu-{time.strftime('%Y-%m-%d', time.gmtime())}"))
    ap.add_argument("--slice-blocks", type=int, default=4)
    ap.add_argument("--no-sass", action="store_true")
    ap.add_argument("--no-peer", action="store_true")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if not set(models) <= set(MODELS):
        print(f"--models: a comma-separated list of {', '.join(MODELS)}", file=sys.stderr)
        return 2

    import torch

    from stitchtune.analysis.audit import audit_model
    from stitchtune.analysis.audit_report import audit_json, audit_markdown
    from stitchtune.deploy.model_tuning import parse_calls
    from stitchtune.hardware.device import get_device

    calls = parse_calls(args.calls)
    device = get_device("h200")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gm = _gpu_models()
    summary = ["# Kernel audit of BERT, GPT-2 and Llama (CPU static analysis)", "",
               "CPU static analysis, no GPU: floors are unique bytes at the H200's datasheet bandwidth "
               f"({device.dram_bandwidth_gbs:.0f} GB/s), `pred` the cost model's predictions; nothing is measured. "
               "Models of scripts/gpu_models.py's time phase (2 layers, batch 8 x 512, fp32, random weights), "
               f"call patterns {', '.join(calls)}, heuristic schedules. Produced by `nice python "
               f"scripts/audit_models.py --models {','.join(models)} --calls {','.join(calls)}`.", "",
               "Floor and pred sum every region occurrence (count x per-region figure) of the call patterns.", "",
               "| model | workloads | kernels | floor-ready | floor us | pred us | worst sectors | kernels with dead smem "
               "| kernels with division slow path |", "|---|---|---|---|---|---|---|---|---|"]
    for name in models:
        t0 = time.perf_counter()
        torch.manual_seed(0)
        model, inputs = gm._medium(name)
        audits, skipped = audit_model(model, inputs, device, calls, slice_blocks=args.slice_blocks,
                                      sass=not args.no_sass, peer=not args.no_peer)
        secs = time.perf_counter() - t0
        title = f"Kernel audit: {name} ({', '.join(calls)}; 2 layers, batch 8 x 512, fp32) - CPU static analysis"
        (out / f"{name}.md").write_text(audit_markdown(audits, title, skipped) + "\n")
        (out / f"{name}.json").write_text(json.dumps(audit_json(audits, skipped), indent=1) + "\n")
        summary += _summary_rows(name, audits)
        print(f"{name}: {len(audits)} workloads, {len(skipped)} not audited, {secs:.0f} s", flush=True)
    summary += ["", "Per model: " + ", ".join(f"[{m}]({m}.md)" for m in models) + "; criteria: docs/audit.md.", ""]
    (out / "README.md").write_text("\n".join(summary))
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
