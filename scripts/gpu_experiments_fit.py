"""The fits from scripts/gpu_experiments.py's rows (issue 44 prep): L2 ``keep`` and the streaming rate, the DRAM
latency against per-SM parallelism, and the verdicts of the schedule rules taken without timing.

    python scripts/gpu_experiments_fit.py DIR          # DIR/experiments.jsonl -> DIR/fits.md, DIR/fits.json

Every input time is a GPU measurement of that run (CUPTI); every output is a FIT of them (labelled so), never a new
measurement. Pure functions (tested on synthetic rows in tests/scripts/test_gpu_experiments.py):

* :func:`l2_fit(rows)`: per kernel and size, the input bytes the L2 served under each protocol, implied as
  ``(t_flushed - t_p) x unique_bytes / t_flushed`` (the saving at the kernel's own flushed rate: the accounting
  ``reads`` of stitchtune/analysis/l2_credit.py), clipped to ``[0, input bytes]``; ``keep`` fitted per policy
  (``lru``: resident = min(S, keep x L2); ``random``: keep x L2 x (1 - exp(-S / (keep x L2)))) on the
  ``after_gemm`` points (a GEMM's output, dirty, as in a model step) by least squares over a 0.05 grid;
  ``stream_factor`` = the fastest protocol's unique bytes per us over the copy bandwidth; and ``evict_first``:
  the bytes still served after a GEMM whose operand is 2x the L2 over those served right after the first GEMM
  (near 1: GEMM operands do not evict, ``L2Params.gemm_evict_first``, shipped on BERT's in-model times in
  results/l2-2026-12-07-s15; near 0: they do). The suggested :class:`~stitchtune.analysis.l2_credit.L2Params` line for ``FITTED``.
* :func:`latency_fit(rows)`: per sweep point the achieved bandwidth and the latency Little's law implies from the
  IR's bytes in flight (``bytes_in_flight_per_thread x block x resident blocks``), and a least-squares fit of
  ``t = t0 + bytes / min(bw_max, inflight / L)`` (and with a per-SM cap: ``min(inflight, SMs used x cap)``) over
  both sweeps: the DRAM latency ``L`` the cost fit pins at its 200 ns bound, and ``sm_inflight_kib``'s cap.
* :func:`ab_verdicts(rows)`: per region its variants' measured time (flushed), the fitted model's prediction, the
  fastest, the heuristic's ratio to it, and whether the model orders the variants as measured.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

POLICIES = ("lru", "random")


def _total(r: dict[str, Any], protocol: str) -> float | None:
    m = r.get("measured_us", {}).get(protocol)
    return float(sum(m.values())) if m else None


def _unique(r: dict[str, Any]) -> float:
    return float(sum(la["unique_bytes"] for la in r.get("launches", [])))


def resident_model(policy: str, size: float, cap: float) -> float:
    """Resident bytes of a tensor of ``size`` bytes just written through a cache of ``cap`` bytes."""
    if cap <= 0:
        return 0.0
    return min(size, cap) if policy == "lru" else cap * (1.0 - math.exp(-size / cap))


def l2_fit(rows: list[dict[str, Any]]) -> dict[str, Any]:
    pts = []
    for r in rows:
        if r.get("experiment") != "l2" or "measured_us" not in r:
            continue
        tf = _total(r, "flushed")
        if not tf:
            continue
        u, s = _unique(r), float(r["params"]["input_bytes"])
        p: dict[str, Any] = {"case": r["case"], "kind": r["params"]["kind"], "input_bytes": s, "unique_bytes": u,
                             "l2_bytes": r["l2_bytes"], "copy_gbs": r["copy_gbs"], "t_us": {}, "served": {}}
        for proto in r["measured_us"]:
            t = _total(r, proto)
            if t:
                p["t_us"][proto] = t
                p["served"][proto] = min(s, max(0.0, (tf - t) * u / tf))
        pts.append(p)
    out: dict[str, Any] = {"points": pts}
    if not pts:
        return out
    cap = float(pts[0]["l2_bytes"])
    copy_per_us = float(pts[0]["copy_gbs"]) * 1e3
    out["stream_factor"] = max(p["unique_bytes"] / t for p in pts for t in p["t_us"].values()) / copy_per_us
    fits = {}
    for proto in ("after_gemm", "clean_read"):
        data = [(p["input_bytes"], p["served"][proto]) for p in pts if proto in p["served"]]
        if not data:
            continue
        for policy in POLICIES:
            best = min((sum(((r - resident_model(policy, s, k / 20 * cap)) / cap) ** 2 for s, r in data), k / 20)
                       for k in range(1, 21))
            fits[f"{proto}/{policy}"] = {"keep": best[1], "sse": best[0]}
    out["keep_fits"] = fits
    ratios = [p["served"]["after_big_gemm"] / p["served"]["after_gemm"] for p in pts
              if p["served"].get("after_gemm", 0) > 0.05 * p["input_bytes"] and "after_big_gemm" in p["served"]]
    out["evict_first"] = statistics.median(ratios) if ratios else None
    gem = {k: v for k, v in fits.items() if k.startswith("after_gemm/")}
    if gem:
        name, best_fit = min(gem.items(), key=lambda kv: kv[1]["sse"])
        evict_first = out["evict_first"] is not None and out["evict_first"] > 0.5
        out["suggested"] = (f'L2Params("{name.split("/")[1]}", {best_fit["keep"]:.2f}, '
                            f'{out["stream_factor"]:.2f}, "reads", "<results dir> (scripts/gpu_experiments_fit.py)", '
                            f'gemm_tile=128, gemm_evict_first={evict_first})')
    return out


def _latency_points(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    pts = []
    for r in rows:
        if r.get("experiment") != "latency" or not _total(r, "flushed"):
            continue
        la = r["launches"][0]
        sms = int(r["sm_count"])
        active = min(la["grid"], max(1, la["blocks_per_sm"]) * sms)
        sass = float(la.get("sass", {}).get("bytes_in_flight", 0.0))       # per thread, read from the cubin
        inflight = (sass or la["bytes_in_flight_per_thread"]) * la["block"] * active
        t = float(_total(r, "flushed") or 0.0)
        bw = _unique(r) / t                                    # bytes per us
        pts.append({"case": r["case"], "sweep": r["params"]["sweep"], "grid": la["grid"], "bytes": _unique(r),
                    "t_us": t, "fitted_us": la["fitted_us"], "bw_gbs": bw / 1e3, "inflight_bytes": inflight,
                    "sms_used": min(la["grid"], sms), "implied_latency_ns": inflight / bw * 1e3,
                    "inflight_from": "sass" if sass else "ir",
                    "copy_gbs": r["copy_gbs"]})
    return pts


def latency_fit(rows: list[dict[str, Any]]) -> dict[str, Any]:
    pts = _latency_points(rows)
    out: dict[str, Any] = {"points": pts}
    if len(pts) < 4:
        return out
    import numpy as np

    try:
        from scipy.optimize import least_squares
    except ImportError:
        out["note"] = "scipy not installed: no least-squares fit (rerun this script where it is)"
        return out

    b = np.array([p["bytes"] for p in pts])
    f = np.array([p["inflight_bytes"] for p in pts])
    used = np.array([p["sms_used"] for p in pts])
    t = np.array([p["t_us"] for p in pts])
    copy = pts[0]["copy_gbs"] * 1e3                           # bytes per us

    def model(x: Any, cap: bool) -> Any:
        t0, lat_us, bwmax = x[0], x[1] / 1e3, x[2] * copy
        fl = np.minimum(f, used * x[3] * 1024) if cap else f
        return t0 + b / np.minimum(bwmax, fl / lat_us)

    for name, cap, x0, lo, hi in (("latency", False, [2.0, 600.0, 0.9], [0, 50, 0.2], [20, 5000, 1.5]),
                                  ("latency+sm_cap", True, [2.0, 600.0, 0.9, 32.0], [0, 50, 0.2, 1], [20, 5000, 1.5, 1024])):
        res = least_squares(lambda x, cap=cap: np.log(model(x, cap)) - np.log(t), x0, bounds=(lo, hi))
        q = model(res.x, cap) / t
        out[name] = {"t0_us": float(res.x[0]), "latency_ns": float(res.x[1]), "bw_max_x_copy": float(res.x[2]),
                     **({"sm_inflight_kib": float(res.x[3])} if cap else {}),
                     "max_abs_log_q": float(np.abs(np.log(q)).max())}
    return out


def ab_verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_case = {r["case"]: r for r in rows if r.get("experiment") == "ab"}
    regions: dict[str, list[dict[str, Any]]] = {}
    for name, r in by_case.items():
        src = by_case.get(r["same_as"], r) if "same_as" in r else r
        t = _total(src, "flushed")
        if t is None or "launches" not in src:
            continue
        regions.setdefault(r["params"]["region"], []).append(
            {"variant": name.split("/", 1)[1], "question": r["params"]["question"], "measured_us": t,
             "fitted_us": sum(la["fitted_us"] for la in src["launches"]), "same_as": r.get("same_as")})
    out = []
    for region, vs in regions.items():
        fastest = min(vs, key=lambda v: v["measured_us"])
        heur = next((v for v in vs if v["variant"] == "heuristic"), None)
        pairs = [(a, c) for i, a in enumerate(vs) for c in vs[i + 1:] if a["same_as"] is None and c["same_as"] is None]
        agree = sum((a["measured_us"] < c["measured_us"]) == (a["fitted_us"] < c["fitted_us"]) for a, c in pairs)
        out.append({"region": region, "question": vs[0]["question"], "variants": vs, "fastest": fastest["variant"],
                    "heuristic_over_fastest": heur["measured_us"] / fastest["measured_us"] if heur else None,
                    "model_order_agrees": f"{agree}/{len(pairs)}"})
    return out


def report(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    l2, lat, ab = l2_fit(rows), latency_fit(rows), ab_verdicts(rows)
    md = ["# Fits from the GPU experiments (scripts/gpu_experiments_fit.py)", "",
          "Inputs: CUPTI device times MEASURED on the GPU named in experiments.jsonl; everything below is FITTED "
          "from them or PREDICTED by the cost model (columns say which).", "", "## L2 residency", ""]
    if l2["points"]:
        md += ["| case | input MB | t flushed | t clean read | t after GEMM | t after big GEMM | served MB (after GEMM, "
               "FITTED) | served MB (after big GEMM) |", "|---|---|---|---|---|---|---|---|"]
        for p in l2["points"]:
            t, sv = p["t_us"], p["served"]
            md.append(f"| {p['case']} | {p['input_bytes'] / 1e6:.1f} | " + " | ".join(
                f"{t[k]:.1f}" if k in t else "-" for k in ("flushed", "clean_read", "after_gemm", "after_big_gemm"))
                + f" | {sv.get('after_gemm', 0) / 1e6:.1f} | {sv.get('after_big_gemm', 0) / 1e6:.1f} |")
        md += ["", f"stream_factor (fastest unique bytes / copy bandwidth): {l2['stream_factor']:.2f}; evict_first "
               f"(served after the big GEMM / after the first): {l2['evict_first']}", "",
               "| protocol / policy | keep (FITTED) | sse |", "|---|---|---|"]
        md += [f"| {k} | {v['keep']:.2f} | {v['sse']:.4f} |" for k, v in l2.get("keep_fits", {}).items()]
        md += ["", f"Suggested for `stitchtune/analysis/l2_credit.FITTED`: `{l2.get('suggested')}`"]
    else:
        md.append("no l2 rows")
    md += ["", "## Latency vs per-SM parallelism", ""]
    if lat["points"]:
        md += ["| case | grid | MB | measured us | fitted model us (PREDICTED) | GB/s | bytes in flight (from) "
               "| implied latency ns (Little) |", "|---|---|---|---|---|---|---|---|"]
        md += [f"| {p['case']} | {p['grid']} | {p['bytes'] / 1e6:.1f} | {p['t_us']:.1f} | {p['fitted_us']:.1f} | "
               f"{p['bw_gbs']:.0f} | {p['inflight_bytes'] / 1024:.0f} KiB ({p['inflight_from']}) | "
               f"{p['implied_latency_ns']:.0f} |" for p in lat["points"]]
        if "note" in lat:
            md.append(f"\n{lat['note']}")
        for name in ("latency", "latency+sm_cap"):
            if name in lat:
                md.append(f"\n{name} (FITTED): " + ", ".join(f"{k} {v:.3g}" for k, v in lat[name].items()))
    else:
        md.append("no latency rows")
    md += ["", "Into the cost model: the flushed timings are cost-fit rows (groups exp-l2, exp-latency, exp-ab) in the "
           "round's fit_rows.jsonl; `python scripts/gpu_fit_rows.py refit <round dir>` refits the shipped model with "
           "them (<round dir>/dataset.json), then `python scripts/fit_terms.py --dataset <round dir>/dataset.json --out "
           "<round dir>/fit-terms` scores the optional terms (`sm_inflight_kib`, `loaded_latency`) with the sweep as a "
           "group of its own; the least-squares latency above is the check on `dram_latency_ns` (bound 200 ns in "
           "`cost/fitted.FIT_BOUNDS`)."]
    md += ["", "## Schedule rules A/B (flushed)", "",
           "| region | question | variant | measured us | fitted us (PREDICTED) | note |", "|---|---|---|---|---|---|"]
    for a in ab:
        for v in a["variants"]:
            md.append(f"| {a['region']} | {a['question']} | {v['variant']} | {v['measured_us']:.1f} | {v['fitted_us']:.1f} "
                      f"| {'same as ' + v['same_as'] if v['same_as'] else ''}{' fastest' if v['variant'] == a['fastest'] else ''} |")
        ratio = a["heuristic_over_fastest"]
        md.append(f"| {a['region']} | verdict | heuristic / fastest {'-' if ratio is None else f'{ratio:.3f}'} | | "
                  f"model order {a['model_order_agrees']} | |")
    return {"l2": l2, "latency": lat, "ab": ab}, md


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_experiments_fit", description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a folder with gpu_experiments.py's experiments.jsonl")
    args = ap.parse_args(argv)
    src = Path(args.dir) / "experiments.jsonl"
    if not src.is_file():
        print(f"gpu_experiments_fit: error: no {src}", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    data, md = report(rows)
    (Path(args.dir) / "fits.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    (Path(args.dir) / "fits.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
