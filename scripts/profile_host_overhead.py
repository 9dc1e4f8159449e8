#!/usr/bin/env python3
"""Where the host time of a ``--backend cuda`` search goes, measured on a CPU with the fake GPU.

CudaRunner's fake backend (``backend="fake"``, a cubin ``b"FAKE:ok"`` writes the reference) runs the
same parent/worker protocol as pycuda with numpy standing in for the GPU, so everything except the
kernels themselves (and nvcc, see ``--nvcc``) costs here what it costs on the GPU host, give or take
the CPU. Per example it prints seconds per phase:

  inputs        random_inputs(graph, 0)
  reference     the float64 reference outputs (runners.reference_outputs)
  runner_init   CudaRunner(graph, device, backend="fake") as a whole (inputs + reference + handing
                the problem to the worker's files, if any)
  worker_start  spawn the worker, import, receive the problem, allocate (runner._start())
  run_ok        one correct program through the worker, end to end (check, warmup, repeats, re-check)
  fake_launch   what the fake spends per launch (numpy writing the outputs), and
  fake_poison   per poisoning of the outputs (a device memset on the GPU); the GPU host does neither:
  ok_host       run_ok minus (1 + warmup + repeats) fake launches and (1 + repeats) fake poisonings =
                the host cost per measured program
  run_wrong     one wrong program (check fails, inputs restored)
  restart       kill the worker and start it again (what a timeout / launch error costs on top)
  check         runners.check_outputs of one full output set against the reference (in process)
  pipeline      lower + predict + render + launch_plan per candidate (mean over sampled schedules)
  search        a whole `search` of --trials trials, --jobs per batch, fake GPU, fake (or --nvcc) builds
  search_host   search minus the fake's launches and poisonings of its ok trials
  per_trial     search_host / trials

Numbers on a VM: the first touch of guest memory that was never used can be ~10x slower than later
touches (0.4 GB/s on the 2-core CPU VM this was written on), so the script first touches
``--prefault-gib`` GiB once (0 to skip) to measure the steady state.

  python scripts/profile_host_overhead.py                     # bias_gelu softmax layernorm
  python scripts/profile_host_overhead.py --rounds 2          # the least of two runs per phase
  python scripts/profile_host_overhead.py --examples rmsnorm --trials 32 --nvcc
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PHASES = ("inputs", "reference", "runner_init", "worker_start", "run_ok", "fake_launch", "fake_poison", "ok_host",
          "run_wrong",
          "restart", "check", "pipeline", "search", "search_host", "per_trial")


class _FakeCubinBuilder:
    """Builds nothing (or with nvcc, then throws the cubin away) and hands out ``FAKE:ok:<us>`` cubins
    with a time between 1.3x and 1.8x the graph's bandwidth floor, so that pruning behaves roughly as
    on a GPU."""

    def __init__(self, floor_us: float, out_dir: Path, nvcc: Any = None) -> None:
        from stitchtune.gpu.build import FakeBuilder

        self.fake = FakeBuilder()
        self.nvcc = nvcc
        self.floor_us = floor_us
        self.out_dir = out_dir
        self.build_s = 0.0

    def build(self, sources: list[str], arch: str) -> list[Any]:
        import dataclasses

        t0 = time.perf_counter()
        results = self.nvcc.build(sources, arch) if self.nvcc is not None else self.fake.build(sources, arch)
        self.build_s += time.perf_counter() - t0
        out = []
        for src, r in zip(sources, results, strict=True):
            if r.status != "ok":
                out.append(r)
                continue
            h = hashlib.sha256(src.encode()).hexdigest()
            us = self.floor_us * (1.3 + int(h[:4], 16) % 50 / 100)
            p = self.out_dir / f"{h[:16]}.cubin"
            p.write_bytes(f"FAKE:ok:{us:.3f}".encode())
            out.append(dataclasses.replace(r, cubin_path=str(p)))
        return out


def _prefault(gib: float) -> None:
    if gib > 0:
        t0 = time.perf_counter()
        a = np.ones(int(gib * 2**30), dtype=np.uint8)
        del a
        dt = time.perf_counter() - t0
        print(f"touched {gib:g} GiB of fresh memory in {dt:.1f} s ({gib * 2**30 / dt / 1e9:.1f} GB/s)", flush=True)


def _timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def _fake_build(tmp: Path, mode: str) -> Any:
    from stitchtune.gpu.build import BuildResult

    p = tmp / f"{mode.replace(':', '_')}.cubin"
    p.write_bytes(f"FAKE:{mode}".encode())
    return BuildResult("ok", "h", str(p), "sm_90")


def _data_phases(g: Any, res: dict[str, float]) -> None:
    """inputs, reference, check, fake_launch, fake_poison (in this process; the arrays die on return)."""
    from stitchtune.gpu import worker as cuda_worker
    from stitchtune.gpu.problem import Problem, _travel
    from stitchtune.graph.reference import random_inputs
    from stitchtune.gpu.runners import check_outputs, output_dtypes, reference_outputs

    t0 = time.perf_counter()
    inputs = random_inputs(g, 0)
    res["inputs"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    expected = reference_outputs(g, inputs)
    res["reference"] = time.perf_counter() - t0
    dts = output_dtypes(g)
    if all(d != "bfloat16" for d in dts.values()):
        outs = {k: v.astype(dts[k]) for k, v in expected.items()}
        t0 = time.perf_counter()
        chk = check_outputs(outs, expected, dts)
        res["check"] = time.perf_counter() - t0
        assert chk.ok, chk.error
    problem = Problem({k: _travel(v) for k, v in inputs.items()}, {n: s.dtype for n, s in g.inputs}, expected, dts)
    fake = cuda_worker._FakeBackend(problem)
    fake.load(b"FAKE:ok", None)  # type: ignore[arg-type]
    fake.launch_all()  # first launch may allocate
    res["fake_launch"], _ = _timed(fake.launch_all)
    res["fake_poison"], _ = _timed(fake.poison_outputs)


def profile_example(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    from stitchtune.cost.model import predict
    from stitchtune.gpu.launch import launch_plan
    from stitchtune.gpu.runner import CudaRunner
    from stitchtune.hardware.device import get_device
    from stitchtune.errors import ScheduleError
    from stitchtune.graph.parse import load_graph
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.gpu.render import render
    from stitchtune.space import SearchSpace

    path = ROOT / "examples" / f"{name}.json"
    dev = get_device("h200")
    g = load_graph(path)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, dev)
    res: dict[str, float] = {}

    _data_phases(g, res)

    heur = heuristic_schedule(plan, dev, space)
    progs = [lower(g, plan, heur, dev)]
    rng = random.Random(0)
    t_pipe = 0.0
    n_pipe = 0
    while n_pipe < args.pipeline_samples:
        s = space.sample(rng)
        t0 = time.perf_counter()
        try:
            p = lower(g, plan, s, dev)
        except ScheduleError:
            continue
        predict(p.profile, dev)
        render(p)
        launch_plan(p)
        t_pipe += time.perf_counter() - t0
        n_pipe += 1
        progs.append(p)
    res["pipeline"] = t_pipe / max(n_pipe, 1)

    ok_b = _fake_build(tmp, "ok")
    wrong_b = _fake_build(tmp, "wrong")
    launches = 1 + args.warmup + args.repeats
    res["runner_init"], r = _timed(lambda: CudaRunner(g, dev, repeats=args.repeats, warmup=args.warmup,
                                                      backend="fake"))
    try:
        res["worker_start"], _ = _timed(r._start)
        n = args.programs
        t, ms = _timed(lambda: r.run([(progs[i % len(progs)], ok_b) for i in range(n)]))
        assert all(m.status == "ok" for m in ms), [m.error for m in ms]
        res["run_ok"] = t / n
        res["ok_host"] = max(0.0, res["run_ok"] - launches * res["fake_launch"]
                             - (1 + args.repeats) * res["fake_poison"])
        t, ms = _timed(lambda: r.run([(progs[0], wrong_b)]))
        assert ms[0].status == "wrong_result"
        res["run_wrong"] = t

        def restart() -> None:
            r._kill()
            r._start()

        res["restart"], _ = _timed(restart)
        t, ms = _timed(lambda: r.run([(progs[0], ok_b)]))
        assert ms[0].status == "ok", ms[0].error
    finally:
        r.close()

    if args.trials > 0:
        res["search"], n_trials, n_ok = _search(path, g, dev, args, tmp)
        # the search's runner has CudaRunner's default repeats (20) and warmup (3)
        res["search_host"] = max(0.0, res["search"] - n_ok * (24 * res["fake_launch"] + 21 * res["fake_poison"]))
        res["per_trial"] = res["search_host"] / max(n_trials, 1)
    return res


def _search(path: Path, g: Any, dev: Any, args: argparse.Namespace, tmp: Path) -> tuple[float, int, int]:
    import dataclasses

    from stitchtune.gpu.runner import CudaRunner
    from stitchtune.tune.search import SearchConfig, default_components, run_search

    floor_us = g.min_bytes() / (dev.effective_copy_bandwidth_gbs() * 1e9) * 1e6
    nvcc = None
    if args.nvcc:
        from stitchtune.gpu.build import NvccBuilder

        nvcc = NvccBuilder(jobs=args.jobs, cache_dir=tmp / f"cubin-{g.name}")
    cubins = tmp / f"fake-{g.name}"
    cubins.mkdir()
    builder = _FakeCubinBuilder(floor_us, cubins, nvcc)
    comp = dataclasses.replace(
        default_components(), cuda_available=lambda: True, get_device=lambda name: dev,
        make_builder=lambda cfg, d, b: builder,
        make_runner=lambda b, graph, d: CudaRunner(graph, d, backend="fake"))
    cfg = SearchConfig(graph_path=str(path), trials=args.trials, backend="cuda", db=str(tmp / f"db-{g.name}"),
                       seed=0, jobs=args.jobs, progress=False)
    t0 = time.perf_counter()
    result = run_search(cfg, comp)
    dt = time.perf_counter() - t0
    print(f"  {g.name}: search {result.trials_run} trials in {dt:.1f} s (builds {builder.build_s:.1f} s), "
          f"statuses {dict(result.status_counts)}", flush=True)
    return dt, result.trials_run, int(result.status_counts.get("ok", 0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", nargs="+", default=["bias_gelu", "softmax", "layernorm"])
    ap.add_argument("--programs", type=int, default=4, help="correct programs timed per example")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--pipeline-samples", type=int, default=8)
    ap.add_argument("--trials", type=int, default=64, help="trials of the fake-GPU search (0: skip it)")
    ap.add_argument("--jobs", type=int, default=8, help="candidates per batch (gpu_check.sh uses 8)")
    ap.add_argument("--nvcc", action="store_true", help="compile the search's candidates with nvcc too")
    ap.add_argument("--prefault-gib", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=1, help="profile each example this often; the least time per "
                    "phase is printed (other load on a small VM only ever adds time)")
    args = ap.parse_args()
    _prefault(args.prefault_gib)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="stitchtune_profile_") as d:
        for name in args.examples:
            for i in range(args.rounds):
                sub = Path(d) / f"{name}-{i}"
                sub.mkdir()
                print(f"profiling {name} (round {i + 1} of {args.rounds}) ...", flush=True)
                res = profile_example(name, args, sub)
                rows[name] = {k: min(v, rows.get(name, {}).get(k, v)) for k, v in res.items()}
    print()
    print(f"seconds per phase, the least of {args.rounds} round(s) (cpus {os.cpu_count()}, repeats {args.repeats}, "
          f"warmup {args.warmup}, jobs {args.jobs}, builds {'nvcc' if args.nvcc else 'fake'})")
    w = {n: max(10, len(n) + 2) for n in rows}
    print(f"{'phase':14s}" + "".join(f"{n:>{w[n]}s}" for n in rows))
    for ph in PHASES:
        if any(ph in r for r in rows.values()):
            print(f"{ph:14s}" + "".join(f"{r[ph]:{w[n]}.3f}" if ph in r else f"{'-':>{w[n]}s}"
                                        for n, r in rows.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
