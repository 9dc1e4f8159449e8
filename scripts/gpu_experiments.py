"""Issue 44 prep: the GPU experiments that settle what the CPU could not (one short call, ~4 minutes of device time).

    python scripts/gpu_experiments.py --out DIR [--only l2,latency,ab,scatter] [--skip ...] [--iters 20]
                                      [--budget-s 240]                       # on a CUDA GPU
    python scripts/gpu_experiments.py --check --out DIR                      # on any machine with nvcc
    python scripts/gpu_experiments_fit.py DIR                                # the fits, anywhere

Experiments (the kernels: scripts/gpu_experiment_cases.py; each skippable, each time-boxed):

``l2``       an element-wise kernel and a layer norm over ``x [rows, 768]`` (3-101 MB) timed four ways: L2 flushed,
             after a clean read of its inputs, right after a GEMM that writes ``x``, and after that GEMM and a
             second one whose operand is 2x the L2 (results/l2-2026-12-07-s14: ``keep``, the streaming rate, and
             whether GEMM operands are read evict-first).
``latency``  a row sum, one 256-thread block per row, swept over the grid (a few blocks to many waves) at a fixed
             64 KiB per block and at a fixed 32 MiB in all (results/cost-fit-2026-12-07-s14: the DRAM latency the
             fit pins at 200 ns, st_xsum's ~670).
``ab``       schedule rules taken without timing: tasks_per_block 1 vs 2 (rule 5e) on GPT-2 ``view_82`` and BERT
             ``view_92``, BERT ``view_50``'s column sums combined by ``st_xsum`` / a grid barrier / atomics, BERT
             ``view_59`` with row vectors on / off.
``scatter``  scripts/gpu_scatter_variants.py (the embedding backward's atomics variants) into ``DIR/scatter``.

On a GPU every kernel is built first (nvcc, in parallel), then each experiment gets its share of what is left of
``--budget-s`` (l2 40%, latency 25%, ab 25%, scatter 10%; time an experiment leaves goes to the next) and stops
starting cases when its share is spent (those cases are rows with ``"skipped": "budget spent"``). Each kernel's
launches are timed by the torch profiler (CUPTI device time, the median of ``--iters`` calls, MEASURED), beside
the fitted cost model's time (PREDICTED). Rows: ``DIR/experiments.jsonl`` (written as measured), tables:
``DIR/experiments.md``; the flushed timings are also cost-fit rows in ``DIR/fit_rows.jsonl`` (groups
``exp-latency``, ``exp-ab``, ``exp-l2``), which the round's ``refit`` phase reads.

``--check`` (or ``GPU_ROUND_CHECK=1``, as ``CHECK=1 bash scripts/gpu_round.sh`` sets): nothing is timed; every case
is lowered at the GPU's shape for ``--device`` (default the H200 preset) and its source built for sm_90 by nvcc
(registers and spills recorded), and run at a small shape in the emulator against the float64 reference; the
scatter experiment's own ``--cpu`` dry run too. Rows say ``check`` ok or why not; exit 1 when any fails.
Bad options: one ``gpu_experiments: error:`` line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from gpu_experiment_cases import EXPERIMENTS, Case, cases, schedule_for  # noqa: E402

SHARES = {"l2": 0.40, "latency": 0.25, "ab": 0.25, "scatter": 0.10}
CHECK_TOL = 1e-4


class OptionError(ValueError):
    """A bad option (exit 2)."""


def _names(text: str, what: str) -> list[str]:
    names = [n for n in (text or "").split(",") if n]
    bad = [n for n in names if n not in EXPERIMENTS]
    if bad:
        raise OptionError(f"unknown {what} {', '.join(bad)} (choose from {', '.join(EXPERIMENTS)})")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu_experiments", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/gpu_experiments")
    ap.add_argument("--only", default=",".join(EXPERIMENTS), help="experiments to run (comma list)")
    ap.add_argument("--skip", default="", help="experiments not to run (comma list)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--check", action="store_true", help="build and emulate every kernel, time nothing (no GPU)")
    ap.add_argument("--device", default="h200", help="--check: the device description the kernels are lowered for")
    ap.add_argument("--fit-rows", default=None, help="where the flushed timings go as cost-fit rows "
                    "(default OUT/fit_rows.jsonl; the round: its results folder's, which its refit reads)")
    args = ap.parse_args(argv)
    skip = set(_names(args.skip, "--skip experiment"))
    args.experiments = [e for e in _names(args.only, "--only experiment") if e not in skip]
    if not args.experiments:
        raise OptionError("no experiment left to run (--only minus --skip is empty)")
    if args.iters < 1 or args.budget_s <= 0:
        raise OptionError(f"--iters must be >= 1 and --budget-s > 0 (got {args.iters}, {args.budget_s})")
    args.check = args.check or os.environ.get("GPU_ROUND_CHECK") == "1"
    if args.check:
        from stitchtune.hardware.device import DeviceError, get_device

        try:
            args.device_desc = get_device(args.device)
        except DeviceError as e:
            raise OptionError(str(e)) from None
    return args


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def _compile(case: Case, device: Any, small: bool) -> tuple[Any, Any]:
    """(graph, CompiledGraph without a cubin) of ``case``; a schedule the space refuses is an error."""
    import contextlib

    import stitchtune
    from stitchtune.gpu.render_atomics import returning_adds

    g = case.graph(small)
    s, bad = schedule_for(case, g, device, small)
    if bad:
        raise ValueError(f"schedule {s.to_json()} refused: {'; '.join(bad)}")
    # the source is rendered here, once: ``render="atom"`` writes atomic adds as atomicAdd (the A/B's other arm)
    with returning_adds() if case.render == "atom" else contextlib.nullcontext():
        return g, stitchtune.compile(g, db=None, device=device, schedule=s, build=False)


def _base_row(case: Case, cg: Any, device: Any) -> dict[str, Any]:
    from stitchtune.cost.features import program_features
    from stitchtune.cost.fitted import predict_program

    pred = predict_program(cg.program, device)
    feats = program_features(cg.program, device)
    return {"experiment": case.experiment, "case": case.name, "params": case.params, "render": case.render,
            "device": device.name,
            "sm_count": device.sm_count, "l2_bytes": device.l2_bytes, "copy_gbs": device.effective_copy_bandwidth_gbs(),
            "schedule": cg.schedule.to_dict(), "workload": cg.graph.workload_key(),
            "launches": [{"kernel": la.kernel, "grid": la.grid, "block": la.block, "smem": la.smem_bytes,
                          "fitted_us": round(t, 3), "unique_bytes": f.unique_bytes, "blocks_per_sm": f.blocks_per_sm,
                          "bytes_in_flight_per_thread": f.bytes_in_flight_per_thread, "waves": f.waves}
                         for la, t, f in zip(cg.program.launches, pred.per_kernel_us, feats)]}


def build_all(sources: list[str], arch: str) -> list[Any]:
    """nvcc on every source in one parallel, cached batch (:class:`stitchtune.gpu.build.NvccBuilder`)."""
    from stitchtune.gpu.build import NvccBuilder

    return list(NvccBuilder().build(sources, arch))


def sass_facts(res: Any) -> dict[str, dict[str, float]]:
    """Per kernel of a build result's cubin, what its SASS says (:func:`stitchtune.gpu.sass.compiled_facts`: bytes
    and loads in flight per thread, spills, registers); empty without cuobjdump or a cubin."""
    from stitchtune.gpu.sass import compiled_facts, find_cuobjdump, read_cubin

    if not getattr(res, "cubin_path", None) or find_cuobjdump() is None:
        return {}
    try:
        return {k: {"bytes_in_flight": f.bytes_in_flight, "loads_in_flight": f.loads_in_flight,
                    "spill_instructions": float(f.spill_instructions), "registers": float(f.registers)}
                for k, f in ((k, compiled_facts(m)) for k, m in read_cubin(res.cubin_path).items())}
    except Exception:  # an unreadable cubin: the IR's figures stand alone
        return {}


def _add_sass(row: dict[str, Any], facts: dict[str, dict[str, float]]) -> None:
    for la in row.get("launches", []):
        if la["kernel"] in facts:
            la["sass"] = facts[la["kernel"]]


# ---------------------------------------------------------------- check mode (no GPU)

def check_case(case: Case, device: Any) -> tuple[dict[str, Any], str | None]:
    """(row, source at the GPU's shape or None): the small shape emulated against the reference."""
    import numpy as np

    from stitchtune.graph.reference import random_inputs, run_reference

    try:
        _, cg = _compile(case, device, small=False)
        row = _base_row(case, cg, device)
        g, small = _compile(case, device, small=True)
        x = random_inputs(g, 0)
        ref = run_reference(g, x)
        out = small.emulate(**x)
        err = max(float(np.abs(out[o] - ref[o]).max() / max(1e-30, float(np.abs(ref[o]).max()))) for o in g.outputs)
        row.update({"small_schedule": small.schedule.to_dict(), "max_rel_err": err,
                    "check": "ok" if err <= CHECK_TOL else f"FAIL: emulated error {err:.2e} > {CHECK_TOL}"})
        return row, cg.sources
    except Exception as e:  # a failure is a row
        return {"experiment": case.experiment, "case": case.name, "check": f"FAIL: {_err(e)}",
                "trace_tail": traceback.format_exc().splitlines()[-4:]}, None


def run_check(args: argparse.Namespace, out: Path) -> int:
    device = args.device_desc
    todo = [c for c in cases(device.sm_count) if c.experiment in args.experiments]
    rows, sources = [], []
    for c in todo:
        row, src = check_case(c, device)
        rows.append(row)
        sources.append(src)
        print(f"{c.name}: emulated {row.get('check')}", flush=True)
    from stitchtune.errors import ToolchainError
    from stitchtune.gpu.build import nvcc_found

    if not nvcc_found():
        print("gpu_experiments --check: nvcc not found: emulated only, nothing built", flush=True)
        sources = [None] * len(sources)
    try:
        built = build_all([s for s in sources if s is not None], device.arch)
    except ToolchainError as e:
        print(f"gpu_experiments --check: nvcc unusable ({_err(e)}): emulated only", flush=True)
        built, sources = [], [None] * len(sources)
    it = iter(built)
    for row, src in zip(rows, sources):
        if src is None:
            continue
        res = next(it)
        row.update({"nvcc": str(res.status), "registers": res.registers, "spill_bytes": res.spill_bytes})
        _add_sass(row, sass_facts(res))
        if row["nvcc"] != "ok" and row["check"] == "ok":
            row["check"] = f"FAIL: nvcc {row['nvcc']}: {(res.error or '')[:300]}"
    if "scatter" in args.experiments:
        rows.append(_scatter(out, cpu=True, timeout=max(30.0, args.budget_s / 2)))
    _write(out, rows, mode="w")
    failed = [r["case"] for r in rows if r.get("check") != "ok"]
    print(f"gpu_experiments --check: {len(rows) - len(failed)} of {len(rows)} ok"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


# ---------------------------------------------------------------- GPU mode

def _scatter(out: Path, cpu: bool, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, str(REPO / "scripts" / "gpu_scatter_variants.py"), "--out", str(out / "scatter")]
    cmd += ["--cpu"] if cpu else []
    row: dict[str, Any] = {"experiment": "scatter", "case": "scatter", "command": " ".join(cmd[1:])}
    rows_file = out / "scatter" / "scatter_variants.jsonl"
    if cpu and rows_file.exists():
        rows_file.unlink()   # the script appends: a check reads only its own rows
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "GPU_ROUND_CHECK": "0"})
        row.update({"rc": p.returncode, "tail": (p.stdout + p.stderr).splitlines()[-6:]})
        ok = p.returncode == 0
    except subprocess.TimeoutExpired:
        row.update({"rc": 124, "tail": [f"timed out after {timeout:.0f} s"]})
        ok = False
    if cpu:   # the dry run's variants emulated at a small shape against the reference
        errs = [json.loads(x).get("max_rel_err") for x in rows_file.read_text().splitlines()] if rows_file.exists() else []
        row["max_rel_err"] = max((e for e in errs if e is not None), default=None)
        row["check"] = ("ok" if ok and errs and row["max_rel_err"] is not None and row["max_rel_err"] <= CHECK_TOL
                        else f"FAIL: rc {row['rc']}, {len(errs)} variants, max error {row['max_rel_err']}")
    return row


class Timer:
    """CUPTI device time of a compiled graph's launches after a protocol's prelude (module docstring)."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch = torch
        self.flush = torch.empty(4 * device.l2_bytes, dtype=torch.uint8, device="cuda")
        rows = max(1, 2 * device.l2_bytes // (1024 * 4))          # the big GEMM's operand: 2x the L2
        self.big = (torch.randn(rows, 1024, device="cuda"), torch.randn(1024, 64, device="cuda"),
                    torch.empty(rows, 64, device="cuda"))
        self.w = torch.randn(768, 768, device="cuda") / 32

    def prelude(self, protocol: str, args: dict[str, Any], gemm_input: str | None, a: Any) -> None:
        torch = self.torch
        self.flush.zero_()
        if protocol == "clean_read":
            for t in args.values():
                t.sum()
        elif protocol in ("after_gemm", "after_big_gemm") and gemm_input is not None:
            x = args[gemm_input]
            torch.matmul(a, self.w[: a.shape[1], : x.shape[-1]], out=x.view(-1, x.shape[-1]))
            if protocol == "after_big_gemm":
                torch.matmul(self.big[0], self.big[1], out=self.big[2])

    def time(self, cg: Any, args: dict[str, Any], protocol: str, gemm_input: str | None, iters: int) -> dict[str, float]:
        """Median device us per launch name over ``iters`` calls, each after the protocol's prelude."""
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile

        a = None
        if gemm_input is not None:
            x = args[gemm_input]
            a = torch.randn(x.numel() // x.shape[-1], min(768, x.shape[-1]), device="cuda")
        self.prelude(protocol, args, gemm_input, a)
        cg(**args)
        torch.cuda.synchronize()
        names = {la.kernel for la in cg.program.launches}
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                self.prelude(protocol, args, gemm_input, a)
                cg(**args)
            torch.cuda.synchronize()
        per: dict[str, list[float]] = {}
        for e in prof.events():
            if str(getattr(e, "device_type", "")).endswith("CUDA") and e.name in names:
                per.setdefault(e.name, []).append(float(e.time_range.elapsed_us()))
        return {k: round(statistics.median(v), 3) for k, v in per.items()}


def _gpu_inputs(torch: Any, g: Any) -> dict[str, Any]:
    """The graph's inputs on the GPU: :func:`random_inputs` (valid indices) under 64 MB in all, else (the sweeps'
    large float-only inputs) ``torch.randn`` made on the device (numpy would take seconds of host time)."""
    from stitchtune.graph.reference import random_inputs

    specs = list(g.inputs)
    big = sum(int(s.nbytes) for _, s in specs) > 64 * 2**20
    if big and all(str(s.dtype) == "float32" for _, s in specs):
        return {k: torch.randn(*s.shape, device="cuda") for k, s in specs}
    return {k: torch.from_numpy(v).cuda() for k, v in random_inputs(g, 0).items()}


def run_case(case: Case, cg: Any, device: Any, timer: Timer, iters: int, commit: str, fit_out: Path) -> dict[str, Any]:
    from gpu_fit_rows import fit_rows

    row = _base_row(case, cg, device)
    args = _gpu_inputs(timer.torch, cg.graph)
    row["timing"] = "CUPTI device time (torch profiler), median per launch: MEASURED"
    row["measured_us"] = {}
    for p in case.protocols:
        row["measured_us"][p] = timer.time(cg, args, p, case.gemm_input, iters)
    flushed = row["measured_us"].get("flushed", {})
    per_launch = [flushed.get(la.kernel) for la in cg.program.launches]
    # the IR's features do not see how atomic adds are rendered: only the shipped rendering gives fit rows
    if all(t is not None for t in per_launch) and case.render == "red":
        rows = fit_rows(f"exp-{case.experiment}", case.name, row["workload"], cg.program, device,
                        [float(t) for t in per_launch if t is not None], commit)
        for r in rows:   # fit_rows says heuristic; a changed or fixed schedule is not
            r["heuristic"] = case.schedule is None and not case.changes
        with open(fit_out, "a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    return row


def _cuda_torch() -> Any:
    """torch when it sees a CUDA GPU, else None (a seam for the tests' fakes)."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _gpu_device() -> Any:
    from stitchtune.gpu.device_query import default_device

    return default_device()


def run_gpu(args: argparse.Namespace, out: Path) -> int:
    torch = _cuda_torch()
    if torch is None:
        print("gpu_experiments: error: no CUDA GPU here (use --check on a CPU machine)", file=sys.stderr)
        return 2
    t_end = time.monotonic() + args.budget_s
    device = _gpu_device()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    todo = [c for c in cases(device.sm_count) if c.experiment in args.experiments]
    compiled: dict[str, Any] = {}
    for c in todo:
        try:
            compiled[c.name] = _compile(c, device, small=False)[1]
        except Exception as e:  # a failure is a row
            _write(out, [{"experiment": c.experiment, "case": c.name, "error": _err(e)}])
    t0 = time.monotonic()
    built = build_all([cg.sources for cg in compiled.values()], device.arch)
    facts = {name: sass_facts(res) for name, res in zip(compiled, built)}
    print(f"built {len(compiled)} programs in {time.monotonic() - t0:.1f} s", flush=True)
    timer = Timer(torch, device)
    seen: dict[str, str] = {}
    left = [e for e in EXPERIMENTS if e in args.experiments]
    while left:
        exp = left.pop(0)
        share = SHARES[exp] / (SHARES[exp] + sum(SHARES[e] for e in left))
        deadline = time.monotonic() + max(0.0, t_end - time.monotonic()) * share
        if exp == "scatter":
            _write(out, [_scatter(out, cpu=False, timeout=max(5.0, deadline - time.monotonic()))])
            continue
        for c in (c for c in todo if c.experiment == exp and c.name in compiled):
            cg = compiled[c.name]
            key = f"{cg.graph.workload_key()}|{cg.schedule.to_json()}|{c.render}"
            if key in seen:
                _write(out, [{"experiment": exp, "case": c.name, "same_as": seen[key], "params": c.params}])
                continue
            if time.monotonic() > deadline:
                _write(out, [{"experiment": exp, "case": c.name, "skipped": "budget spent"}])
                continue
            seen[key] = c.name
            t1 = time.monotonic()
            try:
                row = run_case(c, cg, device, timer, args.iters, commit,
                               Path(args.fit_rows) if args.fit_rows else out / "fit_rows.jsonl")
                _add_sass(row, facts.get(c.name, {}))
            except Exception as e:  # a failure is a row
                row = {"experiment": exp, "case": c.name, "error": _err(e),
                       "trace_tail": traceback.format_exc().splitlines()[-4:]}
            row["wall_s"] = round(time.monotonic() - t1, 1)
            _write(out, [row])
            print(c.name, json.dumps(row.get("measured_us", row.get("error"))), flush=True)
    _tables(out)
    return 0


# ---------------------------------------------------------------- output

def _write(out: Path, rows: list[dict[str, Any]], mode: str = "a") -> None:
    with open(out / "experiments.jsonl", mode, encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    if mode == "w":
        _tables(out)


def _tables(out: Path) -> None:
    rows = [json.loads(line) for line in (out / "experiments.jsonl").read_text(encoding="utf-8").splitlines() if line]
    lines = ["# GPU experiments (scripts/gpu_experiments.py)", "",
             "measured: CUPTI device time on the GPU (median per launch); fitted: the cost model's PREDICTION. "
             "A --check run measures nothing.", "",
             "| experiment | case | schedule | launches (grid x block) | fitted us (PREDICTED) | measured us by protocol "
             "| check / note |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        launches = r.get("launches", [])
        meas = "; ".join(f"{p}: {sum(v.values()):.1f}" for p, v in r.get("measured_us", {}).items())
        note = r.get("check") or r.get("error") or r.get("skipped") or (f"same as {r['same_as']}" if "same_as" in r else "")
        lines.append(f"| {r.get('experiment')} | {r.get('case')} | `{json.dumps(r.get('schedule', ''))[:90]}` | "
                     f"{', '.join(str(la['grid']) + 'x' + str(la['block']) for la in launches)} | "
                     f"{sum(la['fitted_us'] for la in launches):.1f} | {meas or '-'} | {note} |")
    (out / "experiments.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except OptionError as e:
        print(f"gpu_experiments: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.fit_rows:   # appended to per timed case: its folder made before anything is timed
        Path(args.fit_rows).parent.mkdir(parents=True, exist_ok=True)
    return run_check(args, out) if args.check else run_gpu(args, out)


if __name__ == "__main__":
    sys.exit(main())
