"""CPU time the fitted cost model spends per search candidate, as the evaluation pipeline calls it.

    python scripts/predict_cost_per_candidate.py [--graphs layernorm,layernorm_wide,...] [--n 12] [--seed 0]
                                                 [--sass]

Per candidate the search predicts up to three times (:mod:`stitchtune.tune.pipeline` before the build
with lowering's register estimate, after the build with ptxas' registers and the cubin's compiled facts,
and the emulate runner's time with the same registers and facts): this script lowers ``--n`` sampled
schedules of each example graph once, then times exactly those three calls of
:func:`stitchtune.cost.fitted.predict_program` per candidate on the *same* program object (CPU time,
``time.process_time``; lowering is not timed). Without ``--sass`` the registers "after the build" are
lowering's estimate + 8 and the compiled facts made up (16 bytes in flight, no spills; no nvcc needed:
the calls take the same path). With ``--sass`` every candidate is built with nvcc for the device (into a
temporary cache; not timed) and its cubin read by :class:`stitchtune.gpu.build_facts.SassFactsReader`,
the search's reader: the read is timed (wall clock, and the CPU time of the cuobjdump processes it
runs, ``RUSAGE_CHILDREN``, beside the build's nvcc CPU time), and a second ask for the same cubin (the
emulate runner's) is timed as the memory-cache hit it is, and a fresh reader's ask (another process) as
the disk-cache hit. The predictions then use ptxas' registers and the real facts. Run it with another checkout first on ``PYTHONPATH`` for a before/after
comparison (``stitchtune`` is imported from ``PYTHONPATH``, the line printed first says which);
it uses only ``predict_program``. CPU figures on a shared machine: compare runs made
back to back, and quote the medians.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

GRAPHS = "layernorm,layernorm_wide,colsum_sigmoid_scale,softmax_tiny_rows,bias_gelu"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default=GRAPHS)
    ap.add_argument("--n", type=int, default=12, help="sampled schedules per graph (the heuristic's included)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="h200")
    ap.add_argument("--sass", action="store_true", help="build every candidate and time the SASS read (nvcc, cuobjdump)")
    a = ap.parse_args(argv)

    import stitchtune
    from stitchtune.cost.compiled import CompiledFacts
    from stitchtune.cost.fitted import predict_program
    from stitchtune.deploy.selection import heuristic_schedule
    from stitchtune.errors import ScheduleError
    from stitchtune.graph.parse import load_graph
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan

    dev = get_device(a.device)
    print(f"stitchtune from {Path(stitchtune.__file__).resolve().parent}")
    print("| graph | candidates | 1st predict ms | 2nd (after build) ms | 3rd (runner) ms | per candidate ms |"
          + (" SASS read wall ms | cuobjdump CPU ms | cache hit ms |" if a.sass else ""))
    print("|---|---|---|---|---|---|" + ("---|---|---|" if a.sass else ""))
    every: list[float] = []
    reads: list[tuple[float, ...]] = []
    for name in a.graphs.split(","):
        graph = load_graph(REPO / "examples" / f"{name}.json")
        plan = make_plan(graph)
        space = legal_space(graph, plan, dev)
        rng = random.Random(a.seed)
        schedules = [heuristic_schedule(plan, dev, space)] + [space.sample(rng) for _ in range(a.n - 1)]
        progs = []
        for s in schedules:
            try:
                progs.append(lower(graph, plan, s, dev, space))
            except ScheduleError:
                continue
        t: list[list[float]] = [[], [], []]
        mine: list[tuple[float, ...]] = []
        for p in progs:
            if a.sass:
                regs, facts, read = _built_facts(p, dev)
                mine.append(read)
            else:
                regs = {k.name: k.est_registers + 8 for k in p.profile.kernels}
                facts = {k: CompiledFacts(r, 16.0, 4.0, 0) for k, r in regs.items()}
            for i, kw in enumerate(({}, {"registers": regs, "compiled": facts},
                                    {"registers": dict(regs), "compiled": dict(facts)})):
                t0 = time.process_time()
                predict_program(p, dev, **kw)
                t[i].append((time.process_time() - t0) * 1000.0)
        per = [x + y + z for x, y, z in zip(*t)]
        every += per
        reads += mine
        extra = (f" {statistics.median(r[0] for r in mine):.1f} | {statistics.median(r[1] for r in mine):.1f} | "
                 f"{statistics.median(r[2] for r in mine):.3f} |") if mine else ""
        print(f"| {name} | {len(progs)} | {statistics.median(t[0]):.1f} | {statistics.median(t[1]):.1f} | "
              f"{statistics.median(t[2]):.1f} | {statistics.median(per):.1f} |" + extra)
    print(f"\nall {len(every)} candidates: median {statistics.median(every):.1f} ms, "
          f"mean {statistics.mean(every):.1f} ms of CPU time per candidate (three predictions)")
    if reads:
        print(f"SASS read per built candidate ({len(reads)}): wall median {statistics.median(r[0] for r in reads):.1f} ms, "
              f"mean {statistics.mean(r[0] for r in reads):.1f} ms; cuobjdump CPU median "
              f"{statistics.median(r[1] for r in reads):.1f} ms (the build's nvcc CPU median "
              f"{statistics.median(r[4] for r in reads):.0f} ms); the runner's second ask (memory cache) median "
              f"{statistics.median(r[2] for r in reads):.3f} ms, another process's (disk cache) median "
              f"{statistics.median(r[3] for r in reads):.2f} ms")
    return 0


def _built_facts(program, dev):  # type: ignore[no-untyped-def]
    """(ptxas registers, compiled facts, (read wall ms, cuobjdump CPU ms, memory-hit wall ms, disk-hit wall ms,
    nvcc CPU ms of the build)) of ``program``
    built with nvcc for ``dev`` into a temporary cache (the build is not timed)."""
    import resource
    import tempfile

    from stitchtune.gpu.build import NvccBuilder
    from stitchtune.gpu.build_facts import SassFactsReader
    from stitchtune.gpu.render import render

    with tempfile.TemporaryDirectory(prefix="stitchtune-cost-") as tmp:
        b0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        (build,) = NvccBuilder(jobs=1, cache_dir=tmp).build([render(program)], dev.arch)
        if build.status != "ok":
            raise SystemExit(f"predict_cost_per_candidate: a candidate did not build: {build.error[:300]}")
        reader = SassFactsReader(cache_dir=tmp)          # its own disk cache: every first ask reads the SASS
        reader.tool()                                    # the tool lookup is once per process, not per read
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        facts = reader(build)
        t1 = time.perf_counter()
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        reader(build)
        t2 = time.perf_counter()
        SassFactsReader(cache_dir=tmp)(build)            # another process's first ask: the disk cache
        t3 = time.perf_counter()
    if facts is None:
        raise SystemExit("predict_cost_per_candidate: --sass needs cuobjdump (pip install nvidia-cuda-cuobjdump)")
    child = (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime) * 1000.0
    nvcc = (c0.ru_utime + c0.ru_stime - b0.ru_utime - b0.ru_stime) * 1000.0
    return dict(build.registers), facts, ((t1 - t0) * 1000.0, child, (t2 - t1) * 1000.0, (t3 - t2) * 1000.0, nvcc)


if __name__ == "__main__":
    sys.exit(main())
