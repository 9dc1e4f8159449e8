"""What an embedding backward's atomic adds cost on a GPU: one region, its scatter variants, timed per kernel.

    python scripts/gpu_scatter_variants.py [--out /tmp/scatter_variants] [--iters 20]   # a CUDA GPU
    python scripts/gpu_scatter_variants.py --cpu --out /tmp/sv                           # CPU dry run

The region is BERT's embedding layer-norm backward at the GPU script's shape (4096 tokens x 768, fp32)
written as graph.json (the same ops as the captured ``region_view_92``: ``dx`` of the layer norm, scattered
into a word table of 32000 rows by ``ids`` and into a token-type table of 2 rows by ``tt``), in variants
that separate what the fitted cost model cannot tell apart (its atomics coefficient is not fitted: no
committed GPU row has atomics):

* ``tables``: ``none`` (``dx`` stored, no scatter: the layer norm's own time), ``word`` (the word table
  only: 786K ``float4`` adds into distinct rows), ``word+type`` (both, as BERT);
* ``tt``: token types all 0 (every token adds into row 0: 4096 adds per element) or random 0/1;
* ``lowering``: ``private`` (the small table through a block-private shared copy,
  ``lower/scatter_private.py``), ``direct`` (``PRIVATE_TABLE_BYTES`` set to 0 in this process: every add
  global), ``scalar`` (direct, and a device description without vector atomics: one 32-bit add per
  element, as Inductor's ``tl.atomic_add``).

Per variant: each kernel's device time from the torch profiler (median over ``iters`` calls, MEASURED),
beside the fitted model's PREDICTED time of the same launch and the atomic instructions per thread it
counts; rows as JSON lines and a Markdown table in ``--out``. ``--cpu`` runs the same variants at a small
shape in the emulator (wall clock of the emulator, never a GPU figure) to test the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GPU_SHAPE = {"tokens": 4096, "width": 768, "vocab": 32000, "types": 2}
CPU_SHAPE = {"tokens": 64, "width": 64, "vocab": 300, "types": 2}
VARIANTS = [("none", "zero", "private"), ("word", "zero", "private"), ("word", "zero", "scalar"),
            ("word+type", "zero", "private"), ("word+type", "zero", "direct"), ("word+type", "zero", "scalar"),
            ("word+type", "random", "private"), ("word+type", "random", "direct")]


def region_graph(tables: str, tokens: int, width: int, vocab: int, types: int) -> Any:
    """The layer-norm backward of an embedding, ``dx`` scattered into ``tables`` (module docstring)."""
    from stitchtune.graph.node_lists import layernorm_backward_rows
    from stitchtune.graph.parse import parse_graph

    nodes = layernorm_backward_rows()
    inputs: dict[str, Any] = {"dy": {"shape": [tokens, width], "dtype": "float32"},
                              "xn": {"shape": [tokens, width], "dtype": "float32"},
                              "gamma": {"shape": [width], "dtype": "float32"},
                              "rstd": {"shape": [tokens, 1], "dtype": "float32"}}
    outputs = ["dx"] if tables == "none" else []
    if tables != "none":
        inputs["ids"] = {"shape": [tokens], "dtype": "int64"}
        nodes.append({"id": "dw", "op": "scatter_add", "args": ["dx", "ids"], "shape": [vocab, width]})
        outputs.append("dw")
    if tables == "word+type":
        inputs["tt"] = {"shape": [tokens], "dtype": "int64"}
        nodes.append({"id": "dt", "op": "scatter_add", "args": ["dx", "tt"], "shape": [types, width]})
        outputs.append("dt")
    return parse_graph({"name": f"emb_bwd_{tables.replace('+', '_')}", "inputs": inputs, "nodes": nodes,
                        "outputs": outputs})


def region_inputs(graph: Any, tt: str, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x: dict[str, np.ndarray] = {}
    for name, spec in graph.inputs:
        if name == "ids":
            x[name] = rng.integers(1, vocab, spec.shape).astype(np.int64)
        elif name == "tt":
            x[name] = (np.zeros(spec.shape, np.int64) if tt == "zero"
                       else rng.integers(0, 2, spec.shape).astype(np.int64))
        else:
            x[name] = rng.standard_normal(spec.shape).astype(np.float32)
    return x


def compiled(graph: Any, lowering: str, device: Any) -> Any:
    """``stitchtune.compile`` of ``graph`` (heuristic schedule) with the ``lowering`` variant."""
    import stitchtune
    from stitchtune.lower import scatter_private

    saved = scatter_private.PRIVATE_TABLE_BYTES
    dev = dataclasses.replace(device, atomic_vector_width=1) if lowering == "scalar" else device
    try:
        if lowering != "private":
            scatter_private.PRIVATE_TABLE_BYTES = 0
        return stitchtune.compile(graph, db=None, device=dev, build=None)
    finally:
        scatter_private.PRIVATE_TABLE_BYTES = saved


def _gpu_kernel_us(cg: Any, x: dict[str, np.ndarray], iters: int) -> dict[str, float]:
    """Median device microseconds of each kernel of ``cg`` per call (torch profiler, MEASURED)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    args = {k: torch.from_numpy(v).cuda() for k, v in x.items()}
    cg(**args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            cg(**args)
        torch.cuda.synchronize()
    names = {la.kernel for la in cg.program.launches}
    per: dict[str, list[float]] = {}
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA") and e.name in names:
            per.setdefault(e.name, []).append(float(e.time_range.elapsed_us()))
    return {k: statistics.median(v) for k, v in per.items()}


def _cpu_kernel_us(cg: Any, x: dict[str, np.ndarray], iters: int) -> dict[str, float]:
    """Wall-clock microseconds of the whole program in the emulator (a dry run: not a GPU figure)."""
    import time

    times = []
    for _ in range(max(1, min(iters, 2))):
        t0 = time.perf_counter()
        cg.emulate(**x)
        times.append((time.perf_counter() - t0) * 1e6)
    return {"(emulator, whole program)": statistics.median(times)}


def variant_row(tables: str, tt: str, lowering: str, shape: dict[str, int], device: Any, cpu: bool,
                iters: int) -> dict[str, Any]:
    from stitchtune.cost.features import program_features
    from stitchtune.cost.fitted import predict_program

    g = region_graph(tables, **shape)
    x = region_inputs(g, tt, shape["vocab"])
    cg = compiled(g, lowering, device)
    if cpu:
        ref_err = _check_cpu(g, cg, x)
        measured = _cpu_kernel_us(cg, x, iters)
    else:
        ref_err = None
        measured = _gpu_kernel_us(cg, x, iters)
    pred = predict_program(cg.program, device)
    feats = {f.name: f for f in program_features(cg.program, device)}
    kernels = [{"kernel": la.kernel, "grid": la.grid, "block": la.block, "smem": la.smem_bytes,
                "fitted_us": t, "atomics_per_thread": feats[la.kernel].atomics}
               for la, t in zip(cg.program.launches, pred.per_kernel_us)]
    return {"tables": tables, "tt": tt, "lowering": lowering, "shape": shape, "schedule": cg.schedule.to_dict(),
            "kernels": kernels, "measured_us": measured,
            "measured_kind": "emulator wall clock (CPU dry run)" if cpu else "GPU device time (torch profiler)",
            "max_rel_err": ref_err}


def _check_cpu(g: Any, cg: Any, x: dict[str, np.ndarray]) -> float:
    from stitchtune.graph.reference import run_reference

    ref = run_reference(g, x)
    out = cg.emulate(**x)
    return max(float(np.abs(out[o] - ref[o]).max() / max(1e-30, float(np.abs(ref[o]).max()))) for o in g.outputs)


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| tables | token types | lowering | kernel | grid x block | smem B | atomics/thread | fitted us (PREDICTED) "
           "| measured us |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for k in r["kernels"]:
            m = r["measured_us"].get(k["kernel"])
            out.append(f"| {r['tables']} | {r['tt']} | {r['lowering']} | `{k['kernel']}` | {k['grid']} x {k['block']} | "
                       f"{k['smem']} | {k['atomics_per_thread']:.2f} | {k['fitted_us']:.1f} | "
                       f"{'-' if m is None else f'{m:.1f}'} |")
        for name, m in r["measured_us"].items():
            if name not in {k["kernel"] for k in r["kernels"]}:
                out.append(f"| {r['tables']} | {r['tt']} | {r['lowering']} | {name} | | | | | {m:.0f} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/scatter_variants")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--cpu", action="store_true", help="dry run: a small shape in the emulator")
    args = ap.parse_args(argv)
    from stitchtune.hardware.device import get_device

    device = get_device("h200")
    if not args.cpu:
        from stitchtune.gpu.device_query import default_device   # the GPU this runs on, as its description

        device = default_device()
    shape = CPU_SHAPE if args.cpu else GPU_SHAPE
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(out / "scatter_variants.jsonl", "a", encoding="utf-8") as fh:
        for tables, tt, lowering in VARIANTS:
            if tables != "word+type" and tt == "random":
                continue
            row = variant_row(tables, tt, lowering, shape, device, args.cpu, args.iters)
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            rows.append(row)
            print(tables, tt, lowering, row["measured_us"], flush=True)
    head = [f"# Scatter variants on {device.name} ({'CPU dry run: emulator wall clock' if args.cpu else 'GPU'})", "",
            f"Shape {shape}; `python scripts/gpu_scatter_variants.py{' --cpu' if args.cpu else ''}`. Fitted times are "
            "the cost model's PREDICTIONS; measured times are " + rows[0]["measured_kind"] + ".", ""]
    (out / "scatter_variants.md").write_text("\n".join(head + table(rows)) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
