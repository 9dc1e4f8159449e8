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


def _uses(a: Any) -> dict[str, int]:
    """Regions of this workload per call pattern ("inference x2, train x4" -> {inference: 2, train: 4})."""
    parts = [p.rsplit(" x", 1) for p in a.uses.split(", ")] if a.uses else []
    return {c: int(n) for c, n in parts}


def inductor_measured(model: str, call: str) -> float | None:
    """Inductor's own (Triton) kernels' device time per step, MEASURED on the H200 (CUPTI, the committed
    results/h200-2026-12-04-models/gpu_models.jsonl, the same shapes), or None where not measured."""
    path = REPO / "results" / "h200-2026-12-04-models" / "gpu_models.jsonl"
    for line in path.read_text().splitlines() if path.exists() else ():
        d = json.loads(line)
        if (d.get("model"), d.get("mode"), d.get("variant")) == (model, call, "inductor") and "by_maker" in d:
            return float(d["by_maker"].get("inductor", [0, 0.0])[1])
    return None


def _l2_regions(audits: list[Any], calls: tuple[str, ...], device: Any) -> str:
    """Per region and call: its occurrences' saved DRAM bytes (the L2 estimate) and the fitted time summed over
    them, as is and credited (PREDICTED with the L2 estimate): the summary's `fitted, L2` region by region."""
    from stitchtune.analysis.l2_credit import credited_us, l2_params
    from stitchtune.cost.fitted import coefficients_for

    c, params = coefficients_for(device), l2_params(device)
    out = ["", "## Fitted times with the L2 estimate, per region (PREDICTED)", "",
           f"Each occurrence's input bytes still in the L2 when it starts (stitchtune/analysis/l2_residency.py: "
           f"{params.policy} replacement, keep {params.keep} x the L2, GEMMs: {params.gemm}, "
           "stitchtune/analysis/gemm_traffic.py) read from it (stitchtune/analysis/l2_credit.py; "
           "results/l2-2026-12-07-s15/).", "",
           "| region | call | occurs | saved MB per occurrence | fitted us (all occurrences) | fitted, L2 us |",
           "|---|---|---|---|---|---|"]
    for call in calls:
        for a in audits:
            n = _uses(a).get(call, 0)
            if not n:
                continue
            each = list(a.l2_resident.get(call, [])) or [0.0] * n
            fitted = (a.fitted_us or 0.0) * n
            l2 = credited_us(a.fitted_us or 0.0, a.unique_bytes, each, device, c, params)
            out.append(f"| {a.graph} | {call} | {n} | {', '.join(f'{b / 1e6:.1f}' for b in each)} | {fitted:.1f} | "
                       f"{l2:.1f} |")
    return "\n".join(out) + "\n"


def _summary_rows(name: str, audits: list[Any], calls: tuple[str, ...], device: Any = None) -> list[str]:
    """One row per call pattern: its workloads, their kernels, and floor / predicted times summed over
    every region occurrence (count x the region's figure); the fitted and fitted-ideal sums again with each
    occurrence's saved DRAM bytes read from the L2 (stitchtune/analysis/l2_credit.credited_us)."""
    from stitchtune.analysis.l2_credit import credited_us, l2_params
    from stitchtune.cost.fitted import coefficients_for
    from stitchtune.hardware.device import get_device

    device = device or get_device("h200")
    c, params = coefficients_for(device), l2_params(device)

    def credited(a: Any, call: str, value: float | None, n: int) -> float:
        each = list(a.l2_resident.get(call, [])) or [0.0] * n
        return credited_us(value or 0.0, a.unique_bytes, each, device, c, params)

    rows = []
    for call in calls:
        mine = [(a, _uses(a)[call]) for a in audits if call in _uses(a)]
        kernels = [k for a, _ in mine for k in a.kernels]
        floor = sum(a.floor_us * n for a, n in mine)
        pred = sum((a.predicted_us or 0.0) * n for a, n in mine)
        fitted = sum((a.fitted_us or 0.0) * n for a, n in mine)
        ideal = sum((a.fitted_ideal_us or 0.0) * n for a, n in mine)
        fitted_l2 = sum(credited(a, call, a.fitted_us, n) for a, n in mine)
        ideal_l2 = sum(credited(a, call, a.fitted_ideal_us, n) for a, n in mine)
        ready = sum(k.floor_ready for k in kernels)
        worst = max((k.worst_sector_ratio or 1.0 for k in kernels), default=1.0)
        dead = sum(bool(k.dead_shared) for k in kernels)
        slow = sum(bool(k.sass and k.sass.division_slow_path) for k in kernels)
        ind = inductor_measured(name, call)
        vs = "" if ind is None else f"{ind:.0f} ({'at most' if fitted_l2 <= ind else 'ABOVE'})"
        rows.append(f"| {name} | {call} | {len(mine)} | {sum(n for _, n in mine)} | {ready}/{len(kernels)} | "
                    f"{floor:.0f} | {pred:.0f} | {fitted:.0f} | {ideal:.0f} | {fitted_l2:.0f} | {ideal_l2:.0f} | {vs} | "
                    f"{worst:.2f}x | {dead} | {slow} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--calls", default="inference,train")
    ap.add_argument("--out", default=str(REPO / "results" / f"audit-cpu-{time.strftime('%Y-%m-%d', time.gmtime())}"))
    ap.add_argument("--slice-blocks", type=int, default=4)
    ap.add_argument("--regions", default="",
                    help="comma-separated region names (e.g. region_view_92): audit only these workloads")
    ap.add_argument("--no-sass", action="store_true")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--render-only", action="store_true",
                    help="write the Markdown again from OUT/<model>.json (no capture, no audit)")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if not set(models) <= set(MODELS):
        print(f"--models: a comma-separated list of {', '.join(MODELS)}", file=sys.stderr)
        return 2

    import torch

    from stitchtune.analysis.audit import RegionAudit, audit_model
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
               f"({device.dram_bandwidth_gbs:.0f} GB/s), `pred` the cost model's predictions, `fitted` the IR-feature "
               "model fitted to GPU data (device time, no launch term); nothing is measured. "
               "Models of scripts/gpu_models.py's time phase (2 layers, batch 8 x 512, fp32, random weights), "
               f"call patterns {', '.join(calls)}, heuristic schedules. Produced by `nice python "
               f"scripts/audit_models.py --models {','.join(models)} --calls {','.join(calls)}`.", "",
               "Per call pattern: its workloads (distinct regions), regions (occurrences), kernels of the "
               "workloads that are floor-ready, and floor, pred and fitted summed over every occurrence (count x the "
               "region's figure).", "",
               "`fitted ideal us`: the fitted model's time of the same launches with every inefficiency its features "
               "see taken away (stitchtune/analysis/fitted_ideal.py): the least any kernels moving these bytes in "
               "these grids are predicted at.", "",
               "`L2` (PREDICTED with the L2 estimate): the same two sums with each region occurrence's input bytes "
               "still in the L2 when it starts (an LRU / random-replacement simulation of the L2 over the FX graph, "
               "every op's reads and writes, a GEMM wave by wave of output tiles with its operands read evict-first, "
               "stitchtune/analysis/l2_residency.py, gemm_traffic.py) read from the L2 instead of DRAM: "
               "those bytes off at the fitted ceiling, never below the launch's bytes at the L2 streaming rate "
               "(stitchtune/analysis/l2_credit.py; parameters chosen and checked held out on BERT's in-model kernel "
               "times, results/l2-2026-12-07-s14/, s15/).", "",
               "| model | call | workloads | regions | floor-ready kernels | floor us | pred us | fitted us "
               "| fitted ideal us | fitted, L2 us | fitted ideal, L2 us | Inductor MEASURED us (fitted, L2 vs it) "
               "| worst sectors | kernels with dead smem | kernels with division slow path |",
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in models:
        t0 = time.perf_counter()
        if args.render_only:
            d = json.loads((out / f"{name}.json").read_text())
            audits, skipped = [RegionAudit.from_dict(r) for r in d["regions"]], d["skipped"]
        else:
            torch.manual_seed(0)
            model, inputs = gm._medium(name)
            only = {r for r in args.regions.split(",") if r} or None
            audits, skipped = audit_model(model, inputs, device, calls, regions=only, slice_blocks=args.slice_blocks,
                                          sass=not args.no_sass, peer=not args.no_peer)
        secs = time.perf_counter() - t0
        title = f"Kernel audit: {name} ({', '.join(calls)}; 2 layers, batch 8 x 512, fp32) - CPU static analysis"
        (out / f"{name}.md").write_text(audit_markdown(audits, title, skipped) + "\n" + _l2_regions(audits, calls, device))
        if not args.render_only:
            (out / f"{name}.json").write_text(json.dumps(audit_json(audits, skipped), indent=1) + "\n")
        summary += _summary_rows(name, audits, calls, device)
        print(f"{name}: {len(audits)} workloads, {len(skipped)} not audited, {secs:.0f} s", flush=True)
    summary += ["", "Per model: " + ", ".join(f"[{m}]({m}.md)" for m in models) + "; criteria: docs/audit.md.", ""]
    (out / "README.md").write_text("\n".join(summary))
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
