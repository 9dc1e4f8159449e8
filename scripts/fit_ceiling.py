"""The fitted cost model's bandwidth ceiling: which measured rows pin ``bw_efficiency``, and what the device streams.

    python scripts/fit_ceiling.py [--dataset results/cost-fit-2026-12-07-s13-walk/dataset.json] [--out DIR] [--no-nested]

Everything here is a PREDICTION from the committed H200 measurements (nothing is measured anew):

1. **Variants** of the shipped fit (fitted on the IR walk, ``scripts/fit_cost_model.py``): ``bw_efficiency`` free or
   fixed at 0.85 / 0.92 / 1.0 (the other coefficients refitted), with or without the **flush write-back** term
   (``Coefficients.flush_writeback``: the GPU worker's L2 flush, a memset of twice the L2 before each event-timed
   run, leaves dirty lines that are written back while the timed kernels run; event-timed rows only, never device
   time). Per variant: leave-one-model-out within ±25% and Spearman ρ, pre-build (IR walk) and post-build (the
   same coefficients with the SASS bytes in flight), and the coefficients fitted on all rows.
2. **Which rows pin the ceiling**: in-sample |log(predicted / measured)| refitted at ``bw_efficiency`` 1.0 against
   the free fit, per row, with the row's regime (timing, launch shape, compiled bytes in flight per SM, the
   bandwidth its measurement implies over its unique bytes).
3. **Nested choice** among the variants: per held-out group, the variant with the best leave-one-model-out score
   on the other groups only (within ±25%, then ρ); no held-out score enters a choice.
4. **BERT training, Inductor vs ours**: the CUPTI traces of both backends (``gpu_models_run3.jsonl``), kernels
   matched by order and op names to our regions; bandwidth = our region's unique bytes / the MEASURED time, and
   the same with the producer's output (the kernel just before, still in the 60 MiB L2) taken off.

Writes ``<out>/ceiling.md`` (also printed) and ``<out>/ceiling.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from fit_cost_model import ir_only, parse_base  # noqa: E402
from fit_study import Fits, command, lomo, nested_choice, write_report  # noqa: E402

from stitchtune.cost.fit_dataset import load_dataset, with_timing  # noqa: E402
from stitchtune.cost.fitted import Coefficients  # noqa: E402
from stitchtune.cost.fitting import FITTED, TOLERANCE, fit_coefficients, predict_rows, score  # noqa: E402
from stitchtune.hardware.device import get_device  # noqa: E402

DATASET = "results/cost-fit-2026-12-07-s13-walk/dataset.json"
MODELS = "results/h200-2026-12-04-models/gpu_models_run3.jsonl"
MiB = 1 << 20

#: (name, fixed bw_efficiency or None for fitted, flush write-back term fitted)
VARIANTS: tuple[tuple[str, float | None, bool], ...] = (
    ("shipped: bw fitted", None, False),
    ("bw 0.85", 0.85, False),
    ("bw 0.92", 0.92, False),
    ("bw 1.0", 1.0, False),
    ("bw fitted + flush", None, True),
    ("bw 0.92 + flush", 0.92, True),
    ("bw 1.0 + flush", 1.0, True),
)

#: BERT training (layer 0 forward, layer 1 backward): our region's kernel (dataset label, or a trace-only region
#: with its bytes), the Inductor kernel (name prefix, occurrence) of the same ops, and the producer's output bytes
#: (the launch just before: a GEMM / bmm whose output this kernel reads)
TRACE_MATCH: tuple[tuple[str, str, int, float, str], ...] = (
    ("region_expand_1/st_k0", "triton_per_fused_add_embedding_expand_native_lay", 0, 0.0, "embeddings + LayerNorm"),
    ("region_view_1/st_k0", "triton_poi_fused_addmm_clone_transpose_view_2", 0, 12.58e6, "Q bias + head transpose"),
    ("region_view_4/st_k0", "triton_poi_fused_addmm_clone_transpose_view_3", 0, 12.58e6, "K bias + head transpose"),
    ("region_view_7/st_k0", "triton_poi_fused_addmm_clone_transpose_view_2", 1, 12.58e6, "V bias + head transpose"),
    ("region_view_11/st_k0", "triton_per_fused__softmax_add_arange_exp_expand_", 0, 100.66e6, "scale, mask, softmax"),
    ("region_view_14/st_k0", "triton_poi_fused_clone_transpose_view_5", 0, 12.58e6, "context head transpose"),
    ("region_view_17/st_k0", "triton_per_fused_add_addmm_native_layer_norm_nat", 0, 12.58e6, "bias + residual + LN"),
    ("region_view_19/st_k0", "triton_poi_fused_gelu_view_7", 0, 50.33e6, "GELU"),
    ("region_view_21/st_k0", "triton_per_fused_add_addmm_native_layer_norm_nat", 1, 12.58e6, "bias + residual + LN"),
    ("region_view_47/st_k0", "triton_poi_fused_gelu_gelu_backward_view_4", 0, 50.33e6, "GELU backward"),
    ("region_view_57/st_k0", "triton_per_fused__softmax_backward_data_mul_view", 0, 100.66e6, "softmax backward"),
)
#: regions of TRACE_MATCH not in the dataset (built from another graph on the GPU, fit_cost_model's notes): the
#: trace position of our kernel (index among the ``st_*`` / ``zfill`` launches) and its bytes (fp32 8 x 12 x 512 x
#: 512 scores read, probabilities written; the mask is 16 KiB)
TRACE_ONLY: dict[str, tuple[int, float]] = {"region_view_11/st_k0": (4, 2 * 8 * 12 * 512 * 512 * 4.0)}


#: coefficients fixed in every variant's base (``--base NAME=VALUE``: a model variant, e.g. ``reuse_tasks=1``)
BASE: dict[str, float] = {}


def _fit(rows: list[dict[str, Any]], dev: Any, variant: tuple[str, float | None, bool]) -> Coefficients:
    _, bw, flush = variant
    base = dataclasses.replace(Coefficients.defaults(dev), **BASE)
    if bw is not None:
        base = dataclasses.replace(base, bw_efficiency=bw)
    if flush:
        base = dataclasses.replace(base, flush_writeback=0.3)
    names = [n for n in FITTED if not (bw is not None and n == "bw_efficiency")] + (["flush_writeback"] if flush else [])
    return fit_coefficients(rows, dev, base, names=names)


def fit_variant(rows: list[dict[str, Any]], dev: Any, v: int) -> Coefficients:
    """Variant ``v``'s (:data:`VARIANTS`) coefficients fitted to ``rows``: the fit :class:`fit_study.Fits` caches."""
    return _fit(rows, dev, VARIANTS[v])


def _pct(x: float) -> str:
    return f"{x:.0%}" if x == x else "-"


def _variants(fits: Fits, pre: list[dict[str, Any]], rows: list[dict[str, Any]], groups: list[str], m: Any, dev: Any,
              lines: list[str], out: dict[str, Any]) -> dict[int, Any]:
    """Section 1 (each variant's held-out scores and its coefficients fitted on all rows); returns the held-out
    pre-build predictions per variant."""
    held: dict[int, Any] = {}
    for v, (name, _, _) in enumerate(VARIANTS):
        ho = lomo(fits, v, pre, groups)
        hoc = lomo(fits, v, rows, groups)
        held[v] = ho
        s, sc = score(m, ho), score(m, hoc)
        full = fits(v, frozenset())
        per = [float(np.mean(np.abs(ho[i] / m[i] - 1) <= TOLERANCE)) for i in
               ([j for j, r in enumerate(rows) if r["group"] == g] for g in groups)]
        out["variants"][name] = {"pre": s, "post": sc, "per_group_pre": dict(zip(groups, per)), "all_rows": full.to_dict()}
        lines.append(f"| {name} | {_pct(s['within25'])} | {s['spearman']:.3f} | {_pct(sc['within25'])} | "
                     f"{sc['spearman']:.3f} | " + " | ".join(_pct(x) for x in per)
                     + f" | {full.bw_efficiency:.3f} | {full.dram_latency_ns:.0f} | {full.inflight_reg_share:.3f} | "
                     f"{full.event_us:.2f} | {full.ramp_us:.2f} | {full.flush_writeback * dev.l2_bytes / MiB:.1f} |")

    return held


def _pin(fits: Fits, pre: list[dict[str, Any]], rows: list[dict[str, Any]], groups: list[str], m: Any, dev: Any,
         lines: list[str], out: dict[str, Any]) -> None:
    """Section 2: the rows that pin the ceiling, and each group's loss at each fixed ceiling."""
    lines += ["", "## 2. Rows that pin the ceiling: in-sample q = PREDICTED / measured, bw fitted vs fixed at 1.0", "",
              "GB/s = the row's unique bytes / its measured time (events rows include the event start and the flush "
              "write-back). KiB/SM = compiled bytes in flight per thread x threads resident per SM (SASS). "
              "Sorted by how much worse |log q| gets at bw 1.0 (no flush term); the last rows get better.", "",
              "| group | row | timing | grid x block | blocks/SM | waves | compiled B/thread | KiB/SM | measured us | GB/s "
              "| q fitted | q bw 1.0 | q fitted + flush | q bw 1.0 + flush |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ins = {v: predict_rows(pre, dev, fits(v, frozenset())) for v in (0, 3, 4, 6)}
    worse = np.abs(np.log(ins[3] / m)) - np.abs(np.log(ins[0] / m))
    order = list(np.argsort(-worse))
    show = order[:16] + order[-10:]
    pin = []
    for i in show:
        r = rows[i]
        k = max(r["kernels"], key=lambda k: k["unique_bytes"])
        threads = min(k["grid"], k["blocks_per_sm"] * dev.sm_count) * k["block"] / dev.sm_count
        kib = threads * k["compiled_bytes_in_flight"] / 1024
        gbs = sum(x["unique_bytes"] for x in r["kernels"]) / m[i] / 1e3
        pin.append({"label": r["label"], "q": {str(v): float(ins[v][i] / m[i]) for v in ins}})
        lines.append(f"| {r['group'].replace('db:', '')} | {r['label'][-30:]} | {r['timing']} | {k['grid']} x {k['block']}"
                     f"{' (+%d)' % (len(r['kernels']) - 1) if len(r['kernels']) > 1 else ''} | {k['blocks_per_sm']} | "
                     f"{k['waves']:.2f} | {k['compiled_bytes_in_flight']:.0f} | {kib:.0f} | {m[i]:.1f} | {gbs:.0f} | "
                     + " | ".join(f"{ins[v][i] / m[i]:.2f}" for v in (0, 3, 4, 6)) + " |")
    out["pin"] = pin
    lines += ["", "Group loss at each fixed ceiling (mean soft-L1 of log q as the fit weighs it, in-sample; lower is "
              "better), no flush term:", "", "| bw | " + " | ".join(g.replace("db:", "") for g in groups) + " |",
              "|---|" + "---|" * len(groups)]
    for v in (0, 1, 2, 3):
        z = np.log(predict_rows(pre, dev, fits(v, frozenset())) / m)
        loss = 2 * (np.sqrt(1 + (z / 0.2) ** 2) - 1) * 0.04
        lines.append(f"| {fits(v, frozenset()).bw_efficiency:.3f} | "
                     + " | ".join(f"{np.mean(loss[[r['group'] == g for r in rows]]):.4f}" for g in groups) + " |")



def _nested(fits: Fits, pre: list[dict[str, Any]], rows: list[dict[str, Any]], groups: list[str], m: Any,
            held: dict[int, Any], lines: list[str], out: dict[str, Any]) -> None:
    """Section 3: the variant chosen per held-out group on the other groups only (42 fits per variant)."""
    nested = np.full(len(rows), np.nan)
    chosen = {}
    for g, v in nested_choice(fits, pre, groups, m, range(len(VARIANTS))).items():
        chosen[g] = VARIANTS[v][0]
        idx = [i for i, r in enumerate(rows) if r["group"] == g]
        nested[idx] = held[v][idx]
    s = score(m, nested)
    out["nested"] = {"score": s, "chosen": chosen}
    lines += ["", "## 3. Nested: the variant chosen per held-out group on the other groups only", "",
              f"nested pre-build within ±25% **{_pct(s['within25'])}**, ρ {s['spearman']:.3f} (shipped variant "
              f"alone: {_pct(out['variants'][VARIANTS[0][0]]['pre']['within25'])}, "
              f"{out['variants'][VARIANTS[0][0]]['pre']['spearman']:.3f})", "",
              "Chosen: " + "; ".join(f"{g}: {c}" for g, c in chosen.items())]



def _trace(rows: list[dict[str, Any]], dev: Any, lines: list[str], out: dict[str, Any]) -> None:
    """Section 4: BERT training's Inductor kernels beside ours (MEASURED, CUPTI)."""
    trace_rows = [json.loads(x) for x in open(REPO / MODELS)]

    def trace(variant: str) -> list[tuple[str, float]]:
        return [(str(t[0]), float(t[1])) for r in trace_rows if r.get("variant") == variant and r.get("mode") == "train"
                and r.get("model") == "bert" and "trace" in r for t in r["trace"]]

    ind, ours = trace("inductor"), [t for t in trace("stitchtune") if t[0].startswith("st_") or t[0] == "zfill"]
    by_label = {r["label"]: (r["measured_us"], sum(k["unique_bytes"] for k in r["kernels"])) for r in rows
                if r["group"] == "bert-train"}
    l2 = float(dev.l2_bytes)
    lines += ["", "## 4. BERT training (batch 8 x 512, fp32): Inductor's kernels beside ours, MEASURED (CUPTI, H200)", "",
              "Bytes: our region's unique bytes (the same for Inductor's kernel of the same ops: an assumption, its "
              "saved-for-backward outputs may differ). 'less producer': the bytes less the producer's output up to the "
              "L2's 60 MiB (the GEMM / bmm just before wrote it; the reads that may hit the L2).", "",
              "| region | ops | bytes MB | ours us | ours GB/s | Inductor kernel | Inductor us | Inductor GB/s | "
              "Inductor GB/s less producer |", "|---|---|---|---|---|---|---|---|---|"]
    table = []
    for label, prefix, occ, producer, ops in TRACE_MATCH:
        hits = [t for t in ind if t[0].startswith(prefix[:48])]
        if len(hits) <= occ:
            continue
        ius = hits[occ][1]
        if label in by_label:
            ous, byts = by_label[label]
        elif label in TRACE_ONLY:
            pos, byts = TRACE_ONLY[label]
            ous = ours[pos][1]
        else:
            continue
        dram = max(byts - min(producer, l2), 1.0)
        table.append({"region": label, "ops": ops, "bytes": byts, "ours_us": ous, "inductor": hits[occ][0], "inductor_us": ius,
                      "inductor_gbs": byts / ius / 1e3, "inductor_dram_gbs": dram / ius / 1e3, "ours_gbs": byts / ous / 1e3})
        lines.append(f"| {label.split('/')[0]} | {ops} | {byts / 1e6:.1f} | {ous:.1f} | {byts / ous / 1e3:.0f} | "
                     f"{hits[occ][0][:40]} | {ius:.1f} | {byts / ius / 1e3:.0f} | {dram / ius / 1e3:.0f} |")
    out["trace"] = table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=DATASET)
    ap.add_argument("--out", default="results/cost-fit-2026-12-07-s13")
    ap.add_argument("--no-nested", action="store_true", help="skip the nested choice (42 fits per variant)")
    ap.add_argument("--base", action="append", default=[], metavar="NAME=VALUE",
                    help="a coefficient fixed in every variant's base (not fitted unless a variant fits it)")
    a = ap.parse_args(argv)
    try:
        BASE.update(parse_base(a.base))
    except ValueError as exc:
        print(f"fit_ceiling: error: {exc}", file=sys.stderr)
        return 2
    dev = get_device("h200")
    rows = with_timing([dict(r) for r in load_dataset(REPO / a.dataset, dev.key).rows])
    pre = ir_only(rows)
    groups = sorted({r["group"] for r in rows})
    m = np.array([r["measured_us"] for r in rows])
    fits = Fits(pre, dev, fit_variant)
    cmd = command("fit_ceiling", argv)
    out: dict[str, Any] = {"variants": {}}
    lines = [f"# The bandwidth ceiling of the fitted cost model ({len(rows)} measured H200 rows)", "", f"    {cmd}", "",
             "Measured: the committed H200 times. Every other time is PREDICTED. LOMO = leave-one-model-out (held out).",
             "", "## 1. Variants: LOMO within ±25% and Spearman ρ (choosing among these rows by them is optimistic)", "",
             "| variant | pre-build ±25% | ρ | post-build ±25% | ρ | " + " | ".join(g.replace("db:", "") for g in groups)
             + " | bw_efficiency | dram_latency_ns | inflight_reg_share | event_us | ramp_us | flush_writeback (MiB) |",
             "|---|---|---|---|---|" + "---|" * len(groups) + "---|---|---|---|---|---|"]
    held = _variants(fits, pre, rows, groups, m, dev, lines, out)
    _pin(fits, pre, rows, groups, m, dev, lines, out)
    if not a.no_nested:
        _nested(fits, pre, rows, groups, m, held, lines, out)
    _trace(rows, dev, lines, out)
    write_report(a.out, "ceiling", "\n".join(lines) + "\n", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
