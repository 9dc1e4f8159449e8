"""Generic (one kernel per bucket) vs specialised (one kernel per extent) kernels of the dynamic examples.

    PYTHONPATH=$PWD python scripts/generic_vs_specialised.py [--examples layernorm_seq,...] [--device H200]
                                                             [--extents probes|1,17,300] [--measure] [--iters 100]

For each example of ``examples/dynamic/`` and each extent (default: every bucket's probes, its smallest,
an odd and its largest extent), one row:

* ``generic_us``: the *predicted* time (cost model, :mod:`stitchtune.cost.model` item 8) of the bucket's
  generic program (the generic heuristic of the bucket's representative plan, lowered by
  :func:`stitchtune.lower.dynamic.lower_dynamic`) run at that extent;
* ``specialised_us``: the predicted time of the heuristic schedule of the graph *at* that extent (what
  a per-shape compile builds);
* ``ratio`` = generic / specialised.

Every figure without ``--measure`` is a PREDICTION, labelled so in the output. ``--measure`` (a CUDA GPU
and cuda-python) also builds both programs with nvcc and times them on the GPU (CUDA events, median of
``--iters`` launches after a warm-up, the generic one with its extents as kernel arguments; both checked
once against the float64 reference): columns ``generic_meas_us`` / ``specialised_meas_us``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stitchtune.cost.heuristic import generic_heuristic, heuristic_schedule  # noqa: E402
from stitchtune.cost.model import predict  # noqa: E402
from stitchtune.errors import StitchtuneError  # noqa: E402
from stitchtune.graph.dynamic import DynamicRefusal, load_dynamic  # noqa: E402
from stitchtune.hardware.device import get_device  # noqa: E402
from stitchtune.lower.dynamic import RowFit, fit_rows, generic_profile, lower_dynamic  # noqa: E402
from stitchtune.lower.entry import lower  # noqa: E402
from stitchtune.plan.planner import make_plan  # noqa: E402

EXAMPLES = ("layernorm_seq", "softmax_seq", "bias_gelu_seq", "embed_add_layernorm_seq", "attention_softmax_seq")


def time_program(driver: Any, program: Any, cubin: bytes, inputs: dict[str, np.ndarray],
                 extents: dict[str, int] | None, iters: int, warmup: int = 5) -> tuple[float, dict[str, np.ndarray]]:
    """Median µs per launch sequence of ``program`` on ``driver`` (CUDA events around each call) and its
    outputs (flat, in the buffers' dtypes). Generic programs get ``extents``; inputs and outputs are
    sized by them (:class:`~stitchtune.ir.launches.DynamicInfo`)."""
    from stitchtune.emulate.memory import elem_dtype
    from stitchtune.gpu.launch import Launcher, launch_plan

    dyn = program.dynamic
    ptrs: dict[str, int] = {}
    outs: dict[str, np.ndarray] = {}
    allocated = []
    with driver.activate():
        launcher = Launcher(driver, launch_plan(program), cubin)
        try:
            for b in program.buffers:
                if b.role not in ("input", "output"):
                    continue
                size = b.size if dyn is None else dyn.size(b.name, b.size, extents or {})
                dt = elem_dtype(b.dtype, b.role)
                ptr = driver.mem_alloc(max(1, size * np.dtype(dt).itemsize))
                allocated.append(ptr)
                ptrs[b.tensor] = ptr
                if b.role == "input":
                    driver.memcpy_htod(ptr, np.ascontiguousarray(np.asarray(inputs[b.tensor]).ravel().astype(dt)))
                else:
                    outs[b.tensor] = np.empty(size, dt)
            bound = launcher.bind(ptrs, extents)
            times = []
            for i in range(warmup + iters):
                start, end = driver.event_create(), driver.event_create()
                driver.event_record(start, 0)
                launcher.launch(bound, 0)
                driver.event_record(end, 0)
                driver.event_synchronize(end)
                if i >= warmup:
                    times.append(1000.0 * driver.event_elapsed_ms(start, end))
            driver.synchronize()
            for t, host in outs.items():
                driver.memcpy_dtoh(host, ptrs[t])
        finally:
            for p in allocated:
                driver.mem_free(p)
            launcher.close()
    return statistics.median(times) if times else math.nan, outs


def _max_err(outs: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
    return max(float(np.max(np.abs(outs[o].astype(np.float64) - ref[o].ravel()))) for o in ref)


def rows_for(name: str, device: Any, extents_arg: str, measure: bool = False, iters: int = 100) -> list[dict[str, Any]]:
    """The rows of one example (module docstring)."""
    dg = load_dynamic(ROOT / "examples" / "dynamic" / f"{name}.json")
    (dim,) = dg.dims
    if extents_arg == "probes":
        extents = sorted({e for b in dim.buckets.buckets for e in b.probes()})
    else:
        extents = [int(x) for x in extents_arg.split(",")]
    fits: dict[str, RowFit | DynamicRefusal] = {}
    out = []
    for e in extents:
        ext = {dim.name: e}
        key = dg.key_of(ext)
        fit = fits.setdefault(key.label(), fit_rows(dg, key))
        row: dict[str, Any] = {"example": name, "bucket": key.label(), "extent": e}
        g = dg.at(ext)
        spec: Any = None
        try:
            plan = make_plan(g)
            spec = lower(g, plan, heuristic_schedule(plan, device), device)
            row["specialised_us"] = predict(spec.profile, device).time_us
        except StitchtuneError as exc:  # e.g. a softmax over one key: no plan at this extent
            row["specialised_us"] = math.nan
            row["spec_note"] = f"no specialised kernel: {exc.problems[0]}"
        gen: Any = None
        if isinstance(fit, DynamicRefusal):
            row["generic_us"], row["note"] = math.nan, f"refused: {fit}"
        else:
            s_gen = generic_heuristic(fit, device)
            gen = lower_dynamic(fit, s_gen, device)
            prof = None if isinstance(gen, DynamicRefusal) else generic_profile(fit, s_gen, device, gen, ext)
            row["generic_us"] = math.nan if prof is None else predict(prof, device).time_us
            row["note"] = ("refused: " + str(gen)) if isinstance(gen, DynamicRefusal) else (
                "" if prof is not None else "no specialised profile with this schedule at this extent")
        row["note"] = "; ".join(x for x in (row.pop("spec_note", ""), row["note"]) if x)
        row["ratio"] = row["generic_us"] / row["specialised_us"]
        if measure and spec is not None and gen is not None and not isinstance(gen, DynamicRefusal):
            row.update(_measure(g, spec, gen, ext, iters, device.arch))
        out.append(row)
    return out


def _measure(g: Any, spec: Any, gen: Any, ext: dict[str, int], iters: int, arch: str) -> dict[str, Any]:
    from stitchtune.deploy.compiled import _build
    from stitchtune.gpu.driver import open_driver
    from stitchtune.gpu.render import render
    from stitchtune.graph.reference import random_inputs, run_reference

    drv = open_driver()
    ins = random_inputs(g, 0)
    ref = run_reference(g, ins)
    t_spec, o_spec = time_program(drv, spec, _build(render(spec), arch)[1], ins, None, iters)
    t_gen, o_gen = time_program(drv, gen, _build(render(gen), arch)[1], ins, ext, iters)
    return {"specialised_meas_us": t_spec, "generic_meas_us": t_gen,
            "max_abs_err": max(_max_err(o_spec, ref), _max_err(o_gen, ref))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", default=",".join(EXAMPLES))
    ap.add_argument("--device", default="H200")
    ap.add_argument("--extents", default="probes", help="'probes' (every bucket's) or a comma-separated list")
    ap.add_argument("--measure", action="store_true", help="also build and time both on the GPU (cuda-python)")
    ap.add_argument("--iters", type=int, default=100)
    args = ap.parse_args(argv)
    device = get_device(args.device)
    rows = [r for n in args.examples.split(",") for r in rows_for(n, device, args.extents, args.measure, args.iters)]
    print(f"generic vs specialised kernels on {device.name}: *_us columns are PREDICTED by the cost model"
          + ("; *_meas_us MEASURED on the GPU (median of CUDA-event times)" if args.measure else ""))
    cols = ["example", "bucket", "extent", "specialised_us", "generic_us", "ratio"]
    if args.measure:
        cols += ["specialised_meas_us", "generic_meas_us", "max_abs_err"]
    print("  ".join(f"{c:>16}" for c in cols) + "  note")
    for r in rows:
        cells = [f"{r.get(c, math.nan):>16.3f}" if isinstance(r.get(c), float) else f"{r.get(c)!s:>16}" for c in cols]
        print("  ".join(cells) + ("  " + r["note"] if r.get("note") else ""))
    ratios = [r["ratio"] for r in rows if not math.isnan(r["ratio"])]
    if ratios:
        print(f"predicted generic/specialised: median {statistics.median(ratios):.3f}, max {max(ratios):.3f} "
              f"over {len(ratios)} extents")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
