"""Our regions against Inductor's kernels, group by group, in a training step or an inference call (issue 39).

    python scripts/train_gap_table.py --before results/audit-cpu-2026-12-07-s13 --after AUDIT_DIR \
        --inductor results/train-gap-2026-12-07-s14 [--out results/train-gap-2026-12-07-s14/table.md]
    python scripts/train_gap_table.py --call inference --models bert,gpt2,llama --before AUDIT_DIR \
        --after AUDIT_DIR --inductor results/inference-gap-2026-12-07-s15 [--out .../table.md]

``--before`` / ``--after``: ``scripts/audit_models.py`` outputs (``<model>.json``) of two commits;
``--inductor``: ``scripts/inductor_kernels_cpu.py`` outputs (``inductor_<model>_<call>.json``). A group is
one function of the call (the attention softmax, a norm's backward with its weight gradients, the head
copies, ...): our regions in it (every occurrence in the call, matched by name in either audit, so a group
may name a region of each) and Inductor's launches (by position in its call). Boundaries are approximate where
the two split a function differently (Inductor finishes a norm's weight gradients in separate small kernels;
we fold them into the row kernel).

Every time printed is PREDICTED (ours: the fitted cost model, the H200 description; `fitted, L2`: with each
occurrence's L2-resident input bytes credited, stitchtune/analysis/l2_credit.py) or ESTIMATED (Inductor: its
bytes through a line fitted on BERT's measured kernels, see inductor_kernels_cpu.py), except, in BERT's
inference table, Inductor kernels MEASURED in the training step's forward (the same kernel: kind, ops, bytes);
the only other measured figures are the call totals quoted from results/h200-2026-12-04-models.
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
#: inference: model -> [(group, our regions (names in the before or after audit), Inductor launch positions)]
INFERENCE_GROUPS: dict[str, list[tuple[str, tuple[str, ...], tuple[int, ...]]]] = {
    "bert": [
        ("embeddings + LayerNorm", ("region_expand_1",), (0,)),
        ("q / k / v head splits (+ bias)", ("region_view_1", "region_view_4", "region_add_tensor"),
         (1, 2, 4, 9, 10, 12)),
        ("masked softmax", ("region_view_11",), (3, 11)),
        ("head merge", ("region_view_14",), (5, 13)),
        ("residual + LayerNorm (+ bias)", ("region_view_17", "region_add_tensor_3"), (6, 8, 14, 16)),
        ("GELU (+ bias)", ("region_view_19", "region_add_tensor_4"), (7, 15)),
        ("pooler tanh (+ bias)", ("region_tanh", "region_add_tensor_12"), (17,)),
    ],
    "gpt2": [
        ("embeddings + LayerNorm", ("region_embedding",), (0,)),
        ("q / k / v split + head splits", ("region_view_2",), (1, 2, 3, 9, 10, 11)),
        ("masked softmax", ("region_view_8",), (4, 12)),
        ("head merge", ("region_view_11",), (5, 13)),
        ("residual + LayerNorm (+ bias)", ("region_view_14", "region_view_36", "region_add_tensor",
                                           "region_add_tensor_5"), (6, 8, 14, 16)),
        ("tanh-GELU (+ bias)", ("region_view_16", "region_add_tensor_1"), (7, 15)),
    ],
    "llama": [
        ("embeddings + RMSNorm", ("region_embedding",), (0,)),
        ("rotary q / k + head splits", ("region_view_2",), (1, 8)),
        ("masked softmax", ("region_view_14",), (2, 9)),
        ("GQA v expand", ("region_view_8",), (3, 10)),
        ("head merge", ("region_view_17",), (4, 11)),
        ("residual + RMSNorm", ("region_view_20", "region_view_52"), (5, 7, 12, 14)),
        ("SiLU gate", ("region_view_22",), (6, 13)),
    ],
}
#: Inductor's Triton kernels of the call on the H200, MEASURED in all (results/h200-2026-12-04-models)
MEASURED = {"train": {"bert": 887.1, "gpt2": 908.0, "llama": 1038.0},
            "inference": {"bert": 243.4, "gpt2": 344.0, "llama": 412.0}}


def _ours(audit: Path, model: str, call: str = "train") -> dict[str, dict[str, float]]:
    """region -> {n, launches, mb, floor, fitted, ideal, l2}, each summed over the region's occurrences in
    ``call`` (``l2``: the fitted time with the L2 estimate's credit, the fitted time where the audit has none);
    two workloads of one name in the call (the forward's and the backward's graph each name a region_view_2)
    are summed under it."""
    out: dict[str, dict[str, float]] = {}
    for r in json.loads((audit / f"{model}.json").read_text())["regions"]:
        uses = dict(p.rsplit(" x", 1) for p in r["uses"].split(", ")) if r.get("uses") else {}
        n = int(uses.get(call, 0))
        if n:
            fitted = r["fitted_us"] or 0.0
            row = {"n": n, "launches": n * len(r.get("kernels") or [None]),
                   "mb": n * r["unique_bytes"] / 1e6, "floor": n * r["floor_us"],
                   "fitted": n * fitted, "ideal": n * (r["fitted_ideal_us"] or 0.0),
                   "l2": _credited(r, call, fitted, n)}
            have = out.get(r["graph"])
            out[r["graph"]] = row if have is None else {k: have[k] + row[k] for k in row}
    return out


def _credited(r: dict[str, Any], call: str, fitted: float, n: int) -> float:
    """The region's fitted time over its ``n`` occurrences with the L2 estimate's credit (PREDICTED;
    stitchtune.analysis.l2_credit), or ``n`` x ``fitted`` where the audit recorded no residency."""
    each = (r.get("l2_resident") or {}).get(call)
    if not each:
        return n * fitted
    from stitchtune.analysis.l2_credit import credited_us, l2_params
    from stitchtune.cost.fitted import coefficients_for
    from stitchtune.hardware.device import get_device

    device = get_device("h200")
    return credited_us(fitted, r["unique_bytes"], list(each), device, coefficients_for(device), l2_params(device))


def _inductor_us(a: dict[str, Any]) -> tuple[float, bool]:
    """(time, measured): a launch's MEASURED time in the training forward where known, else its ESTIMATE."""
    m = a.get("measured_fw_us")
    return (float(m), True) if m is not None else (float(a["estimated_us"]), False)


def table(model: str, before: Path, after: Path, inductor: Path, call: str = "train") -> list[str]:
    old, new = _ours(before, model, call), _ours(after, model, call)
    launches = json.loads((inductor / f"inductor_{model}_{call}.json").read_text())["launches"]
    groups = GROUPS if call == "train" else INFERENCE_GROUPS
    seen_new: set[str] = set()
    seen_idx: set[int] = set()
    what = "training step" if call == "train" else "inference call"
    ind_head = "Inductor us (ESTIMATED)" if call == "train" else "Inductor us (M: MEASURED in the training forward, E: ESTIMATED)"
    rows = [f"### {model} ({what})", "",
            "| group | our regions after (x in the call) | launches before -> after | MB before -> after | floor us after "
            "| fitted us before -> after (PREDICTED) | fitted ideal us after | fitted, L2 us before -> after (PREDICTED) "
            f"| Inductor launches | Inductor MB | {ind_head} |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = ("n0", "n1", "mb0", "mb1", "floor", "f0", "f1", "ideal", "l0", "l1", "imb", "ius")
    tot = dict.fromkeys(keys, 0.0)
    any_measured = False
    for name, regions, idx in groups[model]:
        o = [old[r] for r in regions if r in old]
        n = [new[r] for r in regions if r in new]
        seen_new.update(r for r in regions if r in new)
        seen_idx.update(idx)
        ind = [launches[i] for i in idx]
        times = [_inductor_us(a) for a in ind]
        any_measured = any_measured or any(m for _, m in times)
        g = dict(n0=sum(x["launches"] for x in o), n1=sum(x["launches"] for x in n),
                 mb0=sum(x["mb"] for x in o), mb1=sum(x["mb"] for x in n), floor=sum(x["floor"] for x in n),
                 f0=sum(x["fitted"] for x in o), f1=sum(x["fitted"] for x in n), ideal=sum(x["ideal"] for x in n),
                 l0=sum(x["l2"] for x in o), l1=sum(x["l2"] for x in n),
                 imb=sum(a["bytes"] for a in ind) / 1e6, ius=sum(t for t, _ in times))
        for k in tot:
            tot[k] += g[k]
        names = ", ".join(f"{r.removeprefix('region_')} x{new[r]['n']}" for r in regions if r in new)
        kern = ", ".join(sorted({a["kernel"].removeprefix("triton_") for a in ind}))
        label = "" if call == "train" else " " + "".join(sorted({"M" if m else "E" for _, m in times}))
        rows.append(f"| {name} | {names} | {g['n0']:.0f} -> {g['n1']:.0f} | {g['mb0']:.0f} -> {g['mb1']:.0f} | "
                    f"{g['floor']:.1f} | {g['f0']:.1f} -> {g['f1']:.1f} | {g['ideal']:.1f} | {g['l0']:.1f} -> "
                    f"{g['l1']:.1f} | {len(ind)}: {kern} | {g['imb']:.0f} | {g['ius']:.1f}{label} |")
    total_label = "mixed M / E" if any_measured else "ESTIMATED"
    rows.append(f"| **total** | | {tot['n0']:.0f} -> {tot['n1']:.0f} | {tot['mb0']:.0f} -> {tot['mb1']:.0f} | "
                f"{tot['floor']:.0f} | {tot['f0']:.0f} -> {tot['f1']:.0f} | {tot['ideal']:.0f} | {tot['l0']:.0f} -> "
                f"{tot['l1']:.0f} | {len(seen_idx)} of {len(launches)} | {tot['imb']:.0f} | {tot['ius']:.0f} "
                f"({total_label}; MEASURED in all: {MEASURED[call][model]:.0f}) |")
    missing = sorted(set(new) - seen_new)
    left = sorted(set(range(len(launches))) - seen_idx)
    if missing or left:
        rows.append("")
        rows.append(f"Not grouped: our {missing or 'none'}; Inductor launches {left or 'none'}.")
    return rows + [""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--call", choices=("train", "inference"), default="train")
    ap.add_argument("--models", default="", help="comma-separated (default: every model with groups for the call)")
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, required=True)
    ap.add_argument("--inductor", type=Path, required=True)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    groups = GROUPS if args.call == "train" else INFERENCE_GROUPS
    models = [m for m in args.models.split(",") if m] or list(groups)
    lines = [line for m in models for line in table(m, args.before, args.after, args.inductor, args.call)]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
