"""GPT-2 and Llama training, our regions against Inductor's kernels, group by group (issue 39).

    python scripts/train_gap_table.py --before results/audit-cpu-2026-12-07-s13 --after AUDIT_DIR \
        --inductor results/train-gap-2026-12-07-s14 [--out results/train-gap-2026-12-07-s14/table.md]

``--before`` / ``--after``: ``scripts/audit_models.py`` outputs (``<model>.json``) of two commits;
``--inductor``: ``scripts/inductor_kernels_cpu.py`` outputs (``inductor_<model>_train.json``). A group is
one function of the step (the attention softmax, a norm's backward with its weight gradients, the head
copies, ...): our regions in it (every occurrence in the training call) and Inductor's launches (by
position in its step). Boundaries are approximate where the two split a function differently (Inductor
finishes a norm's weight gradients in separate small kernels; we fold them into the row kernel).

Every time printed is PREDICTED (ours: the fitted cost model, the H200 description) or ESTIMATED
(Inductor: its bytes through a line fitted on BERT's measured kernels, see inductor_kernels_cpu.py);
the only measured figures are the step totals quoted from results/h200-2026-12-04-models.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: model -> [(group, our regions, Inductor launch positions in the step)]
GROUPS: dict[str, list[tuple[str, tuple[str, ...], tuple[int, ...]]]] = {
    "gpt2": [
        ("embedding + LayerNorm", ("region_embedding",), (0, 1)),
        ("q/k/v split, head merge (fw)", ("region_view_2", "region_view_11"), (2, 3, 5, 6, 10, 11, 13, 14)),
        ("masked softmax (fw)", ("region_view_8",), (4, 12)),
        ("residual + LayerNorm (fw)", ("region_view_14",), (7, 9, 15, 17)),
        ("tanh-GELU (fw)", ("region_view_16",), (8, 16)),
        ("LayerNorm bw + dgamma/dbeta, c_proj bias grads", ("region_view_38", "region_view_44"),
         (18, 19, 20, 21, 22, 23, 27, 28, 29, 30, 31, 32, 38, 39, 40, 41, 42, 43, 47, 48, 49, 50, 51, 52)),
        ("GELU bw + c_fc bias grad", ("region_view_41",), (24, 25, 26, 44, 45, 46)),
        ("head copies (bw), q/k/v concat", ("region_view_47", "region_view_50"), (33, 35, 53, 55)),
        ("softmax bw", ("region_view_51",), (34, 54)),
        ("c_attn bias grad", ("region_sum_13",), (36, 37, 56, 57)),
        ("first LayerNorm bw + wte / wpe grads", ("region_view_82", "region_full_2"), (58, 59, 60, 61, 62, 63, 64)),
    ],
    "llama": [
        ("embedding + RMSNorm", ("region_embedding",), (0,)),
        ("rotary q/k, head copies (fw)", ("region_view_2", "region_view_28", "region_view_8", "region_view_17"),
         (1, 3, 4, 8, 10, 11)),
        ("masked softmax (fw)", ("region_view_14",), (2, 9)),
        ("residual + RMSNorm (fw)", ("region_view_20",), (5, 7, 12, 14)),
        ("SiLU gate (fw)", ("region_view_22",), (6, 13)),
        ("RMSNorm bw + dgamma", ("region_mul_25", "region_view_57", "region_view_74", "region_view_85"),
         (15, 16, 17, 19, 20, 21, 28, 29, 30, 32, 39, 40, 41)),
        ("SiLU gate bw", ("region_view_55",), (18, 31)),
        ("head copies, rotary, GQA sums (bw)", ("region_view_62", "region_view_65", "region_view_68",
                                                "region_view_69"), (22, 24, 25, 26, 27, 33, 34, 36, 37, 38)),
        ("softmax bw", ("region_view_66",), (23, 35)),
        ("first RMSNorm bw + embedding grad", ("region_view_102",), (42, 43)),
    ],
}
MEASURED = {"gpt2": 908.0, "llama": 1038.0}


def _ours(audit: Path, model: str) -> dict[str, dict[str, float]]:
    """region -> {n, mb, floor, fitted, ideal}, each summed over the region's training occurrences."""
    out = {}
    for r in json.loads((audit / f"{model}.json").read_text())["regions"]:
        uses = dict(p.rsplit(" x", 1) for p in r["uses"].split(", ")) if r.get("uses") else {}
        n = int(uses.get("train", 0))
        if n:
            out[r["graph"]] = {"n": n, "mb": n * r["unique_bytes"] / 1e6, "floor": n * r["floor_us"],
                               "fitted": n * (r["fitted_us"] or 0.0), "ideal": n * (r["fitted_ideal_us"] or 0.0)}
    return out


def table(model: str, before: Path, after: Path, inductor: Path) -> list[str]:
    old, new = _ours(before, model), _ours(after, model)
    launches = json.loads((inductor / f"inductor_{model}_train.json").read_text())["launches"]
    seen_new: set[str] = set()
    seen_idx: set[int] = set()
    rows = [f"### {model} (training step)", "",
            "| group | our regions (x in the step) | MB before -> after | floor us after | fitted us before -> after"
            " (PREDICTED) | fitted ideal us after | Inductor launches | Inductor MB | Inductor us (ESTIMATED) |",
            "|---|---|---|---|---|---|---|---|---|"]
    tot = dict(mb0=0.0, mb1=0.0, floor=0.0, f0=0.0, f1=0.0, ideal=0.0, imb=0.0, ius=0.0)
    for name, regions, idx in GROUPS[model]:
        o = [old[r] for r in regions if r in old]
        n = [new[r] for r in regions if r in new]
        seen_new.update(r for r in regions if r in new)
        seen_idx.update(idx)
        ind = [launches[i] for i in idx]
        g = dict(mb0=sum(x["mb"] for x in o), mb1=sum(x["mb"] for x in n), floor=sum(x["floor"] for x in n),
                 f0=sum(x["fitted"] for x in o), f1=sum(x["fitted"] for x in n), ideal=sum(x["ideal"] for x in n),
                 imb=sum(a["bytes"] for a in ind) / 1e6, ius=sum(a["estimated_us"] for a in ind))
        for k in tot:
            tot[k] += g[k]
        names = ", ".join(f"{r.removeprefix('region_')} x{new[r]['n']}" for r in regions if r in new)
        kern = ", ".join(sorted({a["kernel"].removeprefix("triton_") for a in ind}))
        rows.append(f"| {name} | {names} | {g['mb0']:.0f} -> {g['mb1']:.0f} | {g['floor']:.1f} | {g['f0']:.1f} -> "
                    f"{g['f1']:.1f} | {g['ideal']:.1f} | {len(ind)}: {kern} | {g['imb']:.0f} | {g['ius']:.1f} |")
    rows.append(f"| **total** | | {tot['mb0']:.0f} -> {tot['mb1']:.0f} | {tot['floor']:.0f} | {tot['f0']:.0f} -> "
                f"{tot['f1']:.0f} | {tot['ideal']:.0f} | {len(seen_idx)} of {len(launches)} | {tot['imb']:.0f} | "
                f"{tot['ius']:.0f} (MEASURED step: {MEASURED[model]:.0f}) |")
    missing = sorted(set(new) - seen_new)
    left = sorted(set(range(len(launches))) - seen_idx)
    if missing or left:
        rows.append("")
        rows.append(f"Not grouped: our {missing or 'none'}; Inductor launches {left or 'none'}.")
    return rows + [""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, required=True)
    ap.add_argument("--inductor", type=Path, required=True)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    lines = [line for m in GROUPS for line in table(m, args.before, args.after, args.inductor)]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
